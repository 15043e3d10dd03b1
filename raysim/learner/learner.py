"""``Learner``: the model, the optimizer and its schedule, the observation statistics, the algorithm's update.

The coordinator's loop calls it once per iteration (in-process or as a Ray actor, same class)::

    weights = learner.get_weights()            # remote: an object ref, handed to the shards
    chunks = [shard.collect(weights, plan) for shard in shards]
    metrics = learner.update(*chunks)          # remote: the shards' chunk refs, resolved by Ray

Chunks reach the learner as object refs (each rank reads its own: ``inputs.read_chunks``), never
through the driver; the weights leave it as one object ref that every shard reads. What the update
computes is the algorithm's (``raysim.algos``): the learner never names one. It reads and writes no
files: a checkpoint's state comes in and goes out as plain data (the coordinator owns run storage).
"""

from __future__ import annotations

import secrets
from typing import Any

import gymnasium as gym
import torch

from raysim.algos import algorithm_class
from raysim.algos.guard import GuardedStep
from raysim.algos.optimizer import OptimizerConfig
from raysim.algos.replay import ReplayBuffer, size_of
from raysim.learner.inputs import read_chunks
from raysim.learner.ranks import RankGroup
from raysim.learner.window import (
    MetricWindow,
    episode_stats,
    episode_sums,
    reduce_gathered,
    sampling_stats,
    sampling_sums,
    to_host,
)
from raysim.models import ActorCritic, ModelConfig, load_pretrained, resolve_device
from raysim.models.normalizer import merge_across_ranks, moments
from raysim.rollout import RolloutChunk
from raysim.rollout.arrays import ArrayDict
from raysim.seeding import derive_seed

LR_SCHEDULES = ("constant", "linear")


class Learner:
    """Trains an ``ActorCritic`` with the algorithm ``algo.name`` on rollout chunks; publishes versioned weights.

    ``horizon``: the env steps the run plans to consume; a ``linear`` learning rate falls from
    ``algo.lr`` to 0 over them, on the env steps consumed (variable GRPO rounds and elastic shards too).
    """

    def __init__(
        self,
        observation_spaces: dict[str, gym.Space],
        action_space: gym.Space,
        model: ModelConfig,
        algo: OptimizerConfig,
        horizon: int,
        seed: int = 0,
        device: str = "cpu",
        rank: int = 0,
        world_size: int = 1,
        pretrained: dict[str, torch.Tensor] | None = None,
        demonstrations: Any = None,
        replay_capacity: int = 0,
    ):
        self.device = resolve_device(device)
        self.ranks = RankGroup(rank, world_size, self.device)
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank; the caller's RNG untouched
            torch.manual_seed(derive_seed(seed, 3))
            self.model = ActorCritic(observation_spaces, action_space, model).to(self.device)
        if pretrained is not None:  # before the algorithm, which may copy the actor (a KL reference)
            load_pretrained(self.model, pretrained, model.init_log_std)
        with torch.random.fork_rng(devices=[]):  # an algorithm's own networks (SAC's critics): the same on every rank
            torch.manual_seed(derive_seed(seed, 3, 1))
            self.algorithm = algorithm_class(algo.name)(algo, self.model, self.ranks)
        if self.algorithm.off_policy:
            self.algorithm.use_replay(ReplayBuffer(replay_capacity))
        if demonstrations is not None:
            self.algorithm.attach(demonstrations)
        # fused: one kernel for every parameter's update (CPU and CUDA), a quarter of the for-loop Adam's time
        # at these network sizes; the same arithmetic and state_dict
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=algo.lr, eps=1e-5, fused=True)
        if algo.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"algo.lr_schedule must be one of {LR_SCHEDULES}, got {algo.lr_schedule!r}")
        self.lr, self.linear, self.horizon = algo.lr, algo.lr_schedule == "linear", max(1, int(horizon))
        self.step = GuardedStep(self.optimizer, algo.max_grad_norm, algo.max_nonfinite_updates, self.ranks)
        self.generator = torch.Generator()
        self.generator.manual_seed(derive_seed(seed, 4, rank))
        self.version = 0
        self.timeline = new_timeline()  # with the version, names the weights: a rewind makes versions come again
        self.window = MetricWindow()  # metrics since the last log step, tensors on the device

    # -- the rank group ------------------------------------------------------------------------

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0: where the other ranks meet it."""
        return self.ranks.rendezvous_address()

    def join(self, host: str, port: int) -> None:
        """Join the torch.distributed group of every rank."""
        self.ranks.join(host, port)

    # -- state ---------------------------------------------------------------------------------

    def policy_version(self) -> int:
        """The version of the weights (the number of updates applied)."""
        return self.version

    def get_weights(self) -> dict[str, Any]:
        """The actor's weights for the shards: ``{"version": v, "timeline": t, "actor": state_dict on CPU}``.

        ``timeline`` changes whenever a state is loaded (a resume, a restart, a rewind to an older
        checkpoint), so the same version number from another timeline is never taken for these weights. An
        ``ArrayDict``: the tensors cross the object store as NumPy arrays.
        """
        actor = {k: v.detach().to("cpu", copy=True) for k, v in self.model.actor.state_dict().items()}
        return ArrayDict({"version": self.version, "timeline": self.timeline, "actor": actor})

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training: model, optimizer, RNG, version, the algorithm's (the
        schedule follows the run's env steps), the metric window since the last log step, the skipped updates."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "version": self.version,
            "window": self.window.state_dict(),
            "skipped_updates": [self.step.skipped, self.step.consecutive],
            **self.algorithm.state_dict(),
        }

    def rank_state(self) -> dict[str, Any]:
        """What this rank holds alone (its sampling generator, its metric window, the algorithm's per-rank state)."""
        return {
            "generator": self.generator.get_state(),
            "window": self.window.state_dict(),
            **self.algorithm.state_dict(),
        }

    def snapshot(self) -> dict[str, Any]:
        """A copy on the CPU of what a checkpoint keeps of this rank: rank 0 its ``state_dict``, the others
        their ``rank_state``. Taken right after each update, so the last completed iteration's state is
        ready (in the object store) when a signal stops the run or the learner dies in a later phase. An
        ``ArrayDict``: the tensors cross the object store as NumPy arrays."""
        return ArrayDict(cpu_copy(self.state_dict() if self.ranks.rank == 0 else self.rank_state()))

    def update_and_snapshot(
        self, chunks: list[Any], num_stale: int = 0, log: bool = True, env_steps: int = 0
    ) -> tuple[dict[str, float], dict[str, Any], Any]:
        """``update``, then ``snapshot`` and what the update appended to the replay buffer (``appended``): the
        coordinator receives the three as separate objects. ``chunks``: refs in a list, read here (a chunk lost with
        its node: ``ChunksLost`` on every rank, see ``read_chunks``)."""
        result = self.update(*read_chunks(self.ranks, chunks), num_stale=num_stale, log=log, env_steps=env_steps)
        return result, self.snapshot(), self.appended()

    def appended(self) -> Any:
        """The transitions the last update appended to this rank's replay buffer, with the index of the first
        (``{"first": i, "transitions": ...}``, an ``ArrayDict``): a segment the coordinator saves; None without a
        replay buffer or new transitions."""
        new = self.algorithm.appended()
        if new is None:
            return None
        first = self.algorithm.replay.added - size_of(new)
        return ArrayDict({"first": first, "transitions": cpu_copy(new)})

    def restore_replay(self, segments: list[dict[str, Any]]) -> int:
        """Refill this rank's replay buffer from saved segments (``appended``'s), in order; returns its size."""
        self.algorithm.restore([(int(s["first"]), s["transitions"]) for s in segments])
        return self.algorithm.replay.size if self.algorithm.off_policy else 0

    def load_state(self, state: dict[str, Any]) -> int:
        """Restore a checkpoint's learner state on every rank (errors agreed on); returns the policy version.

        ``state`` is rank 0's ``state_dict`` with ``ranks``: the other ranks' ``rank_state``; a rank the
        checkpoint has no part for keeps its own generator and window (a run resumed with more ranks); a
        checkpoint without windows (saved before they were kept) starts empty ones.
        """
        error = None
        rank, parts = self.ranks.rank, state.get("ranks") or []
        if rank > 0:
            state = {**state, **parts[rank - 1]} if len(parts) >= rank else {**state, **self.rank_state()}
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["generator"])
            self.version, self.timeline = int(state["version"]), new_timeline()
            self.window = MetricWindow.from_state(state.get("window"), self.device)
            self.step.skipped, self.step.consecutive = (int(n) for n in state.get("skipped_updates", (0, 0)))
            self.algorithm.load_state_dict(state)
        except Exception as caught:  # noqa: BLE001 - every failure is agreed on, then raised
            error = caught
        self.ranks.agree("loading the checkpoint's state", error)
        return self.version

    # -- training ------------------------------------------------------------------------------

    def learning_rate(self, env_steps: int) -> float:
        """The rate of an update after ``env_steps`` consumed env steps: ``algo.lr``, or linear to 0 at ``horizon``."""
        return self.lr * max(0.0, 1.0 - env_steps / self.horizon) if self.linear else self.lr

    def update(
        self, *chunks: RolloutChunk, num_stale: int = 0, log: bool = True, env_steps: int = 0
    ) -> dict[str, float]:
        """One update on the chunks; returns counters, and at a log step the metrics.

        The last ``num_stale`` chunks arrived past the policy-lag bound: their env steps and episodes are
        counted and reported, they are not trained on.

        ``env_steps``: the env steps the run consumed before this update (the run state's, summed over
        shards and ranks), the schedule's clock. Always returned (host data, no device copy): this
        rank's ``env_steps`` (the group sums them), ``policy_version``, ``skipped_updates`` and ``lr``
        (the rate of this update). The update's metrics and the
        episode statistics stay tensors on the device, accumulated over the iterations since the
        last log step; with ``log`` (or a later ``metrics()`` call) they are reduced across ranks
        and copied to the host once (see ``metrics``).
        """
        trained = chunks if self.algorithm.off_policy else chunks[: len(chunks) - num_stale]  # off-policy: any age
        chunks_here = [to_device(c, self.device) for c in trained]
        lr = self.learning_rate(env_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.algorithm.version = self.version  # chunks of a lower policy_version were collected by an older policy
        self.algorithm.env_steps = env_steps
        metrics = self.algorithm.update(chunks_here, self.step, self.generator)
        if chunks_here and not self.algorithm.freezes_normalizer():
            self.update_normalizers(chunks_here)  # after: the update reads the statistics the actors acted with
        self.version += 1
        weight = sum(c.transitions for c in trained) if trained else 1  # an algorithm without shards: per update
        self.window.add(metrics, {**episode_sums(chunks), **sampling_sums(chunks, len(trained))}, weight=weight)
        result = {
            "env_steps": sum(int(c.env_steps) for c in chunks),
            "stale_steps": sum(int(c.env_steps) for c in chunks[len(trained) :]),
            "policy_version": self.version,
            "skipped_updates": self.step.skipped,
            "lr": lr,
        }
        if log:
            result.update(self.metrics())
        return result

    def update_normalizers(self, chunks: list[RolloutChunk]) -> None:
        """Merge the chunks' valid observations into the running observation statistics (``model.obs_norm``).

        The only place the statistics change: from training chunks (``obs[g][:-1][mask]``; never
        final_obs, evaluation or the shards), after the algorithm's update, whose values, advantages and
        ratios use the statistics the chunks were acted with (lockstep is plain PPO: the first ratio is 1).
        Each network's normalizer takes the vector groups it reads (``GroupInputs.vector_input``); all ranks
        end with the statistics of the union of their batches.
        """
        networks = [m for m in (self.model.actor, self.model.critic) if m is not None and m.obs_norm is not None]
        if not networks:
            return

        def valid(network, chunk: RolloutChunk) -> torch.Tensor:
            return network.vector_input({g: chunk.obs[g][:-1][chunk.mask] for g in network.vector_groups})

        batches = [(m.obs_norm, moments(torch.cat([valid(m, c) for c in chunks]))) for m in networks]
        merge_across_ranks(batches, self.ranks.gather, self.device)

    def metrics(self) -> dict[str, float]:
        """The metrics of the iterations since the last log step, reduced across ranks; resets them.

        Every rank calls it (one collective: an all-gather of one stacked vector per rank); the
        reduction (means of the update's metrics, sums of the episode counts, min / max of the
        returns) happens on the device, and rank 0 copies the result to the host once
        (``to_host``) and returns it; the other ranks return ``{}``.
        """
        names, vector = self.window.vector(self.device)
        self.window = MetricWindow()
        gathered = torch.stack(self.ranks.gather(vector))
        if self.ranks.rank != 0:
            return {}
        values = to_host(reduce_gathered(names, gathered))
        result = dict(zip(names.means, values, strict=False))
        sums = dict(zip(names.sums, values[len(names.means) :], strict=False))
        result.update(episode_stats(sums, values[-2], values[-1]))
        result.update(sampling_stats(sums))
        return result


def new_timeline() -> str:
    """A name for the weights a learner continues from (random: processes and restarts never share one)."""
    return secrets.token_hex(8)


def cpu_copy(value: Any) -> Any:
    """``value`` with every tensor copied to the CPU (dicts, lists and tuples followed)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v) for v in value)
    return value


def to_device(chunk: RolloutChunk, device: torch.device) -> RolloutChunk:
    """The chunk's tensors on ``device`` (the same object when already there)."""
    if device.type == "cpu":
        return chunk
    fields = {
        k: (
            {g: t.to(device) for g, t in v.items()}
            if isinstance(v, dict)
            else v.to(device)
            if torch.is_tensor(v)
            else v
        )
        for k, v in vars(chunk).items()
    }
    return RolloutChunk(**fields)
