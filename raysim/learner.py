"""``Learner``: the model, the optimizer, value inference, advantages and the update.

The coordinator's loop calls it once per iteration (in-process or as a Ray actor, same class)::

    weights = learner.get_weights()            # remote: an object ref, handed to the shards
    chunks = [shard.rollout(weights, T) for shard in shards]
    metrics = learner.update(*chunks)          # remote: the shards' chunk refs, resolved by Ray

Chunks reach the learner as object refs resolved by Ray, never through the driver; the weights
leave it as one object ref that every shard reads.
"""

from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
import torch.distributed as dist

from raysim.algos.guard import GuardedStep
from raysim.algos.grpo import GRPOConfig, chunk_advantages, grpo_update
from raysim.algos.models import ActorCritic, ModelConfig
from raysim.algos.normalizer import combine, moments
from raysim.algos.ppo import PPOConfig, ppo_update
from raysim.algos.reward_scale import RewardScale
from raysim.checkpoint import load_checkpoint
from raysim.envs.registry import export_resources
from raysim.rollout.advantages import chunk_values, gae
from raysim.rollout.chunk import RolloutChunk
from raysim.seeding import derive_seed


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU Ray assigned to this process when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"learner.device is {device!r} but no GPU is visible here (learner.num_gpus > 0?)")
    return torch.device(device)


class Learner:
    """Trains an ``ActorCritic`` with PPO or GRPO on rollout chunks; publishes versioned actor weights.

    Dispatches on ``algo.name``: ``ppo`` (values, GAE, actor and critic losses) or ``grpo``
    (group-relative episode returns, no critic and no value inference at all; with ``kl_coef > 0``
    a frozen copy of the initial actor is kept as the KL reference).
    """

    def __init__(
        self,
        observation_spaces: dict[str, gym.Space],
        action_space: gym.Space,
        model: ModelConfig,
        algo: PPOConfig | GRPOConfig,
        iterations: int,
        seed: int = 0,
        device: str = "cpu",
        rank: int = 0,
        world_size: int = 1,
    ):
        self.algo = algo
        self.rank, self.world_size = rank, world_size
        self.device = resolve_device(device)
        if algo.name not in ("ppo", "grpo"):
            raise ValueError(f"algo.name must be 'ppo' or 'grpo', got {algo.name!r}")
        self.needs_values = getattr(algo, "needs_values", True)
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank; the caller's RNG untouched
            torch.manual_seed(derive_seed(seed, 3))
            self.model = ActorCritic(observation_spaces, action_space, model).to(self.device)
        if self.needs_values and self.model.critic is None:
            raise ValueError(f"algo {algo.name!r} needs a critic, but model.critic is false")
        self.reference = None  # GRPO's KL reference: the initial actor, frozen
        self.reward_scale = RewardScale(algo.gamma) if getattr(algo, "reward_scale", False) else None
        if algo.name == "grpo" and algo.kl_coef > 0:
            self.reference = copy.deepcopy(self.model.actor).requires_grad_(False).eval()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=algo.lr, eps=1e-5)
        if algo.lr_schedule not in ("constant", "linear"):
            raise ValueError(f"algo.lr_schedule must be 'constant' or 'linear', got {algo.lr_schedule!r}")
        linear = algo.lr_schedule == "linear"
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda i: max(0.0, 1.0 - i / max(1, iterations)) if linear else 1.0
        )
        self.step = GuardedStep(self.optimizer, algo.max_grad_norm, algo.max_nonfinite_updates, world_size)
        self.generator = torch.Generator()
        self.generator.manual_seed(derive_seed(seed, 4, rank))
        self.version = 0
        self.window = MetricWindow()  # metrics since the last log step, tensors on the device

    # -- a group of ranks (data-parallel) -----------------------------------------------------

    def master_address(self) -> tuple[str, int]:
        """Rank 0: an address and a free port for the group's rendezvous."""
        import socket

        host = socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind(("", 0))
            return host, probe.getsockname()[1]

    def join(self, host: str, port: int) -> None:
        """Join the torch.distributed group of ``world_size`` ranks (gloo on CPU, NCCL on GPU)."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size)

    def agree(self, what: str, error: BaseException | None) -> None:
        """Agreement on errors after a step that can fail on one rank only.

        Every rank calls it with its own outcome; if any rank failed, all raise the same
        ``RankError`` naming the failing ranks and causes, so none waits in a later collective.
        """
        if self.world_size == 1:
            if error is not None:
                raise error
            return
        outcomes: list[str | None] = [None] * self.world_size
        dist.all_gather_object(outcomes, None if error is None else f"{type(error).__name__}: {error}")
        failed = [f"rank {r}: {cause}" for r, cause in enumerate(outcomes) if cause is not None]
        if failed:
            raise RankError(f"{what} failed on " + "; ".join(failed))

    def gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``local`` (same shape on all ranks), in rank order: one all-gather."""
        if self.world_size == 1:
            return [local]
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return parts

    # -- run snapshots and checkpoints --------------------------------------------------------

    def export_env(self, env: dict[str, Any], resources: str) -> dict[str, Any]:
        """The env config with its task resources exported (the task's hook), errors agreed on.

        Rank 0 writes into ``resources``; the other ranks export into a scratch folder, which
        checks that they materialize the same resources.
        """
        error, exported = None, {}
        try:
            with tempfile.TemporaryDirectory() as scratch:
                folder = Path(resources) if self.rank == 0 else Path(scratch)
                exported = {**env, "kwargs": export_resources(env["id"], env.get("kwargs") or {}, folder)}
        except Exception as caught:  # noqa: BLE001 - every failure is agreed on, then raised
            error = caught
        self.agree("exporting the env snapshot", error)
        return exported

    def load(self, checkpoint: str) -> int:
        """Load a checkpoint directory on every rank (errors agreed on); returns its policy version."""
        error = None
        try:
            state, _ = load_checkpoint(checkpoint)
            self.load_state_dict(state)
        except Exception as caught:  # noqa: BLE001 - every failure is agreed on, then raised
            error = caught
        self.agree(f"loading checkpoint {checkpoint}", error)
        return self.version

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` result (model, optimizer, schedule, RNG, version)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.version = int(state["version"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])
        if self.reward_scale is not None and "reward_scale" in state:
            self.reward_scale.load_state_dict(state["reward_scale"])

    def get_weights(self) -> dict[str, Any]:
        """The actor's weights for the shards: ``{"version": v, "actor": state_dict on CPU}``."""
        actor = {k: v.detach().to("cpu", copy=True) for k, v in self.model.actor.state_dict().items()}
        return {"version": self.version, "actor": actor}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training: model, optimizer, schedule, RNG, version."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            "version": self.version,
            **({"reference": self.reference.state_dict()} if self.reference is not None else {}),
            **({"reward_scale": self.reward_scale.state_dict()} if self.reward_scale is not None else {}),
        }

    def update(self, *chunks: RolloutChunk, log: bool = True) -> dict[str, float]:
        """One PPO or GRPO update on the chunks; returns counters, and at a log step the metrics.

        Always returned (host data, no device copy): this rank's ``env_steps`` (the group sums
        them), ``policy_version``, ``skipped_updates`` and ``lr``. The update's metrics and the
        episode statistics stay tensors on the device, accumulated over the iterations since the
        last log step; with ``log`` (or a later ``metrics()`` call) they are reduced across ranks
        and copied to the host once (see ``metrics``).
        """
        self.update_normalizers(chunks)  # before the values and advantages (model.obs_norm)
        self.update_reward_scale(chunks)  # likewise (algo.reward_scale)
        batch = self.batch(chunks)
        if self.algo.name == "grpo":
            metrics = grpo_update(self.model.actor, self.step, batch, self.algo, self.generator, self.reference)
        else:
            metrics = ppo_update(self.model, self.step, batch, self.algo, self.generator)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.version += 1
        self.window.add(metrics, episode_sums(chunks))
        result = {"env_steps": sum(int(c.env_steps) for c in chunks), "policy_version": self.version,
                  "skipped_updates": self.step.skipped, "lr": lr}
        if log:
            result.update(self.metrics())
        return result

    def update_reward_scale(self, chunks: tuple[RolloutChunk, ...]) -> None:
        """Merge the chunks' discounted returns into the running return statistics (``algo.reward_scale``).

        Every rank's batch moments are gathered and combined in rank order, as for the observations.
        """
        if self.reward_scale is None:
            return
        batch = (torch.zeros((), dtype=torch.float64), torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
        for chunk in chunks:
            batch = combine(batch, self.reward_scale.batch_moments(chunk))
        local = torch.cat([batch[0].reshape(1), batch[1], batch[2]]).to(self.device)
        for part in self.gather(local):  # in rank order: the same statistics on every rank
            self.reward_scale.norm.merge((part[0].cpu(), part[1:2].cpu(), part[2:3].cpu()))

    def update_normalizers(self, chunks: tuple[RolloutChunk, ...]) -> None:
        """Merge the chunks' valid observations into the running observation statistics (``model.obs_norm``).

        The only place the statistics change: from training chunks (``obs[g][:-1][mask]``; never
        final_obs, evaluation or the shards). The actor's normalizer takes group ``policy``, the
        critic's its own group. With several ranks, every rank's batch statistics (count, mean,
        var; float64) are gathered (one all-gather) and combined in rank order on every rank, so
        all ranks hold identical statistics, those of one pass over the union of their batches.
        """
        norms = [(m.obs_norm, "policy" if m is self.model.actor else m.group)
                 for m in (self.model.actor, self.model.critic) if m is not None and m.obs_norm is not None]
        if not norms:
            return
        batches = []
        for norm, group in norms:
            rows = [d.obs[group][:-1][d.mask].flatten(1) for d in (to_device(c, self.device) for c in chunks)]
            count, mean, var = moments(torch.cat(rows))
            batches.append(torch.cat([count.reshape(1), mean, var]))
        parts = self.gather(torch.cat(batches))
        offset = 0
        for norm, _ in norms:
            dim = norm.mean.numel()
            merged = None
            for part in parts:  # in rank order, in float64: the union's statistics, the same on every rank
                stats = (part[offset], part[offset + 1 : offset + 1 + dim], part[offset + 1 + dim : offset + 1 + 2 * dim])
                merged = stats if merged is None else combine(merged, stats)
            norm.merge(merged)
            offset += 1 + 2 * dim

    def metrics(self) -> dict[str, float]:
        """The metrics of the iterations since the last log step, reduced across ranks; resets them.

        Every rank calls it (one collective: an all-gather of one stacked vector per rank); the
        reduction (means of the update's metrics, sums of the episode counts, min / max of the
        returns) happens on the device, and rank 0 copies the result to the host once
        (``to_host``) and returns it; the other ranks return ``{}``.
        """
        names, vector = self.window.vector(self.device)
        self.window = MetricWindow()
        gathered = torch.stack(self.gather(vector))
        if self.rank != 0:
            return {}
        reduced = torch.cat([
            gathered[:, : len(names.means)].mean(0),
            gathered[:, len(names.means) : len(names.means) + len(names.sums)].sum(0),
            gathered[:, -2:-1].amin(0),
            gathered[:, -1:].amax(0),
        ])
        values = to_host(reduced)
        result = dict(zip(names.means, values))
        sums = dict(zip(names.sums, values[len(names.means) :]))
        result.update(episode_stats(sums, values[-2], values[-1]))
        return result

    def batch(self, chunks: tuple[RolloutChunk, ...]) -> dict:
        """Advantages (PPO: also values and returns) of every valid transition, flattened into one batch."""
        parts = []
        for chunk in chunks:
            chunk = to_device(chunk, self.device)
            valid = chunk.mask
            part = {
                "obs": {k: v[:-1][valid] for k, v in chunk.obs.items()},
                "actions": chunk.actions[valid],
                "logprobs": chunk.logp[valid],
            }
            if self.needs_values:
                values, next_values = chunk_values(self.model.critic, chunk)
                done = chunk.terminated | chunk.truncated
                reward = chunk.reward if self.reward_scale is None else self.reward_scale.scale(chunk.reward)
                advantages = gae(reward, values, next_values, done, valid, self.algo.gamma, self.algo.gae_lambda)
                part.update(returns=(advantages + values)[valid], values=values[valid])
            else:  # GRPO: group-relative returns, no critic anywhere
                advantages = chunk_advantages(chunk, self.algo)
            part["advantages"] = advantages[valid]
            parts.append(part)
        return concat(parts)


class RankError(RuntimeError):
    """A step failed on at least one learner rank; every rank raises this same error."""


def to_device(chunk: RolloutChunk, device: torch.device) -> RolloutChunk:
    """The chunk's tensors on ``device`` (the same object when already there)."""
    if device.type == "cpu":
        return chunk
    fields = {
        k: ({g: t.to(device) for g, t in v.items()} if isinstance(v, dict) else v.to(device) if torch.is_tensor(v) else v)
        for k, v in vars(chunk).items()
    }
    return RolloutChunk(**fields)


def concat(parts: list[dict]) -> dict:
    """Concatenate a list of (nested) batches along the first dimension."""
    return {
        k: concat([p[k] for p in parts]) if isinstance(parts[0][k], dict) else torch.cat([p[k] for p in parts])
        for k in parts[0]
    }


def to_host(vector: torch.Tensor) -> list[float]:
    """The one device-to-host copy of a log step's reduced metrics (a test counts its calls)."""
    return vector.tolist()


class MetricNames:
    def __init__(self, means: list[str], sums: list[str]):
        self.means, self.sums = means, sums


class MetricWindow:
    """The update metrics and episode sums of the iterations since the last log step (tensors).

    Adding an iteration's metrics only queues device additions: nothing is copied to the host
    until ``Learner.metrics`` reduces the window.
    """

    SUMS = ("episodes", "return_sum", "length_sum", "success_sum")

    def __init__(self):
        self.totals: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.sums: dict[str, torch.Tensor] = {}
        self.low = torch.tensor(math.inf)
        self.high = torch.tensor(-math.inf)

    def add(self, metrics: dict[str, torch.Tensor], sums: dict[str, torch.Tensor]) -> None:
        for name, value in metrics.items():
            value = value.detach().float()
            self.totals[name] = self.totals[name] + value if name in self.totals else value
            self.counts[name] = self.counts.get(name, 0) + 1
        extremes = sums.pop("extremes")
        for name, value in sums.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.low = torch.minimum(self.low, extremes[0])
        self.high = torch.maximum(self.high, extremes[1])

    def vector(self, device: torch.device) -> tuple[MetricNames, torch.Tensor]:
        """``[means..., sums..., min return, max return]`` stacked on ``device``."""
        means = sorted(self.totals)
        zero = torch.tensor(0.0)
        parts = [(self.totals[n] / self.counts[n]).to(device) for n in means]
        parts += [self.sums.get(n, zero).to(device) for n in self.SUMS]
        parts += [self.low.to(device), self.high.to(device)]
        return MetricNames(means, list(self.SUMS)), torch.stack([p.reshape(()) for p in parts])


def episode_sums(chunks: tuple[RolloutChunk, ...]) -> dict[str, torch.Tensor]:
    """Sums over the episodes completed in these chunks (to reduce across ranks).

    ``extremes``: the lowest and highest episode return (+inf, -inf when none ended).
    """
    columns = {
        k: torch.cat([c.episodes[k].float().cpu() for c in chunks if k in c.episodes] or [torch.zeros(0)])
        for k in ("return", "length", "success")
    }
    count = columns["return"].numel()
    has_success = columns["success"].numel() == count  # also when no episode ended here
    returns = columns["return"]
    return {
        "episodes": torch.tensor(float(count)),
        "return_sum": returns.sum(),
        "length_sum": columns["length"].sum(),
        "success_sum": columns["success"].sum() if has_success else torch.tensor(float("nan")),
        "extremes": torch.stack([returns.min(), returns.max()]) if count else torch.tensor([math.inf, -math.inf]),
    }


def episode_stats(sums: dict[str, float], low: float = math.nan, high: float = math.nan) -> dict[str, float]:
    """Mean return, length (and success rate) from ``episode_sums`` (after the reduction).

    ``episodes``: the episodes that ended since the last log step (over all ranks); their lowest
    and highest return as ``episode_return_min`` / ``episode_return_max``.
    """
    count = sums["episodes"]
    stats = {"episodes": count}
    if count:
        stats["episode_return"] = sums["return_sum"] / count
        stats["episode_length"] = sums["length_sum"] / count
        stats["episode_return_min"], stats["episode_return_max"] = low, high
        if sums["success_sum"] == sums["success_sum"]:  # not NaN: every episode reported success
            stats["success_rate"] = sums["success_sum"] / count
    return stats
