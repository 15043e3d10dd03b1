"""``EnvShard``: N rows of one batched env and a CPU copy of the policy's actor.

The coordinator's loop calls it once per iteration (in-process or as a Ray actor, same class)::

    weights = learner.get_weights()                           # {"version": v, "actor": state_dict}
    chunk, receipt = shard.collect(weights, FixedSteps(T))    # or GroupEpisodes(G, max_steps) for GRPO
    learner.update(chunk, ...)
    records = eval_shard.evaluate(weights, EvalEpisodes(...))  # episodes by global index

The shard acts actor-side in inference mode and returns one ``RolloutChunk`` of owned tensors.
Training episodes continue across chunks: the next chunk starts from ``chunk.obs[T]`` with the
rows' running episodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from raysim.envs import FrameStackConfig, make, stacked
from raysim.envs.contract import Obs, Step
from raysim.envs.messages import captured
from raysim.models import ActionSampling, Actor, MLPInference, ModelConfig, RowMemory, sample_categorical
from raysim.rollout.arrays import ArrayDict
from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.dynamic_sampling import sample_groups
from raysim.rollout.endings import (
    ChunkEnding,
    Collection,
    Ending,
    EvalEnding,
    EvalEpisodes,
    FixedSteps,
    GroupEnding,
    GroupEpisodes,
    Scoring,
)
from raysim.rollout.inference import inference
from raysim.rollout.policies import EvalPolicy, LearnedPolicy, ServedPolicy
from raysim.rollout.recording import Part, RecordedEval
from raysim.rollout.server import ActReply, ActRequest, ServerLost
from raysim.rollout.teacher import Teacher, TeacherWeights
from raysim.seeding import SERVER_LOST, derive_seed

ON_NONFINITE = ("raise", "mask")


class NonFiniteError(RuntimeError):
    """An env returned NaN or inf in an observation or a reward."""


class EnvShard:
    """One batched env of ``num_envs`` rows plus the acting policy; produces rollout chunks.

    ``frame_stack`` (``FrameStackConfig``): the rows' last k observations of some groups, stacked around the env.
    ``evaluation``: the env as evaluation plays it (``raysim.envs.make``): an evaluation shard's.
    ``teacher`` (``TeacherWeights``, distillation): another run's actor that labels every training step
    (``RolloutChunk.labels``); sent once, here, never with the student's weights.
    ``server`` (``shards.placement: servers``): its policy server's ``act`` (``raysim.rollout.server``); the shard
    then holds no weights: it draws its rows' noise, sends it with their observations and recurrent state, and
    builds the same chunk from the replies (its "weights" are the key of the version its server holds).
    ``on_nonfinite``: ``raise`` (default) stops with the env id, row and step of a non-finite
    observation or reward; ``mask`` drops that row's transition from the chunk (``mask`` False),
    restarts the row's episode and counts it in ``chunk.nonfinite``.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        model: ModelConfig | dict | None = None,
        env_kwargs: dict[str, Any] | None = None,
        shard_index: int = 0,
        on_nonfinite: str = "raise",
        frame_stack: FrameStackConfig | dict | None = None,
        evaluation: bool = False,
        success: str | None = None,
        teacher: TeacherWeights | None = None,
        server: Callable[[ActRequest], ActReply] | None = None,
    ):
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
        torch.set_num_threads(1)
        self.env_id = env_id
        self.shard_index = shard_index
        self.on_nonfinite = on_nonfinite
        self.seed = seed
        with captured() as self.messages:  # said once by the driver, not once per shard (envs.messages)
            env = make(env_id, num_envs, seed=seed, evaluation=evaluation, success=success, **dict(env_kwargs or {}))
            self.env = stacked(env, frame_stack)
        model = model if isinstance(model, ModelConfig) else ModelConfig(**(model or {}))
        self.server, self.inputs = server, list(model.actor_inputs)
        self.actor = None if server else Actor(self.env.observation_spaces, self.env.action_space, model)
        self.sampling = (
            self.actor.sampling if self.actor else ActionSampling(self.env.action_space, model.action_transform)
        )
        # a recurrent actor's state per row (model.recurrent), zeroed where a row's episode starts
        self.memory = None
        if model.recurrent != "none":
            rows = self.env.num_envs
            self.memory = (
                RowMemory.served(model.recurrent, model.recurrent_size, rows)
                if server
                else RowMemory(self.actor.core, rows, fused=True)
            )
        self.teacher = None if teacher is None else Teacher(teacher, self.env.observation_spaces, self.sampling)
        self.generator = torch.Generator()
        self.generator.manual_seed(derive_seed(seed, 1))
        self.obs = self.env.reset(seed)
        self.version = -1
        self.timeline: str | None = None  # the loaded weights' timeline (``Learner.get_weights``): with the version
        self.steps_done = 0  # training env steps taken by this shard, across chunks
        self.resets = 0  # restarts of rows after a non-finite value (part of their reset seeds)
        self.group_rounds = 0  # GRPO rounds played (part of the group reset seeds)
        self.fresh = True  # the rows start fresh episodes: the next chunk says so (``RolloutChunk.fresh``)
        self.server_losses = 0  # times its policy server died while it collected (a key of its fresh episodes)
        self._acting: FusedActing | None = None  # the actor as this acting run samples it (``act`` resets it)
        self._recording: RecordedEval | None = None  # the evaluation ``record`` films, part by part

    def spaces(self) -> tuple[dict, Any, int | None]:
        """The env's observation spaces (per group), action space and episode step limit."""
        return self.env.observation_spaces, self.env.action_space, self.env.max_episode_steps

    # -- what the coordinator calls ---------------------------------------------------------

    def collect(self, weights: dict, plan: Collection) -> tuple[RolloutChunk, dict[str, int], dict[str, Any]]:
        """``rollout``, a small receipt, and the shard's state right after the chunk (``get_state``).

        The coordinator reads only the receipt: it learns that the shard is alive and the chunk
        exists without pulling the chunk itself through the driver. The state stays in the object
        store, ready for a checkpoint of this iteration.
        """
        steps, rounds = self.steps_done, self.group_rounds
        try:
            chunk = self.rollout(weights, plan)
        except ServerLost:  # the steps in flight are lost: fresh episodes, the same collection asked again
            self.abandon(steps, rounds)
            raise
        return chunk, {"shard": self.shard_index, "env_steps": chunk.env_steps}, self.get_state()

    def abandon(self, steps: int, rounds: int) -> None:
        """Drop the collection that began with ``steps`` taken and ``rounds`` played (its policy server died): the
        counters go back, the rows start fresh episodes; the coordinator asks for the collection again."""
        self.steps_done, self.group_rounds = steps, rounds
        self.server_losses += 1
        self.start_fresh(derive_seed(SERVER_LOST, self.server_losses, steps))

    def rollout(self, weights: dict, plan: Collection | int) -> RolloutChunk:
        """Act with ``weights`` as ``plan`` says (an int: ``FixedSteps`` of that many steps); the chunk. A
        ``GroupEpisodes`` plan with ``keep_groups`` plays rounds until it holds them (``dynamic_sampling``)."""
        self.set_weights(weights)
        plan = FixedSteps(plan) if isinstance(plan, int) else plan
        if isinstance(plan, FixedSteps):
            return self._play(ChunkEnding(self, plan))
        if not isinstance(plan, GroupEpisodes):
            raise TypeError(f"rollout: a FixedSteps or GroupEpisodes plan, got {plan!r}")
        if plan.keep_groups is None:
            return self._play(GroupEnding(self, plan))
        return sample_groups(lambda: self._play(GroupEnding(self, plan)), plan)

    def _play(self, ending: ChunkEnding | GroupEnding) -> RolloutChunk:
        """One acting run of a training ``ending``: its chunk, checked for non-finite values if it was not checked
        at each step."""
        steps, obs = self.act(ending)
        chunk = ending.result(steps, obs)
        if not ending.checks_each_step:
            self._raise_if_nonfinite(chunk, steps)
        return chunk

    def evaluate(self, weights: dict, plan: EvalEpisodes) -> tuple[list[tuple[dict, dict]], int, Scoring]:
        """Play the rows' evaluation episodes by global index (``EvalEpisodes``): ``(record, report)`` per counted
        episode, how many counted episodes were left out for a non-finite value (``on_nonfinite: mask``), and
        how the task counts them (``Scoring``: whether it defines success, its tasks). A scripted ``plan.policy``
        needs no ``weights`` (None)."""
        if plan.policy is None:
            self.set_weights(weights)
        ending = EvalEnding(self, plan)
        self.act(ending)
        return ending.result()

    def record(self, weights: dict | None, plan: EvalEpisodes | None, steps: int | None, size: int | None) -> Part:
        """The next part of a filmed evaluation (``raysim.rollout.recording``): a ``plan`` starts one with
        ``weights`` (None continues it, with the weights it started with: they are sent once) and the part plays
        up to ``steps`` steps (None: to the end) with each row's picture ``size`` pixels wide (None: no pictures)
        before each step; its ``result`` is ``evaluate``'s once the evaluation ended. A scripted ``plan.policy``
        needs no ``weights`` (None)."""
        if weights is not None:
            self.set_weights(weights)
        if plan is not None:
            self._recording = RecordedEval(self, plan)
        recording = self._recording
        if recording is None:
            raise RuntimeError("record: no evaluation is being filmed; start one with a plan")
        recording.next_part(steps, size)
        played = 0 if recording.ended else self.act(recording)[0]
        return recording.take_part(played)

    def get_state(self) -> dict[str, Any]:
        """The shard's state for a checkpoint: env state (None if the env cannot save it), RNG, counters; an
        ``ArrayDict``, so its tensors (image observations too) cross the object store as NumPy arrays."""
        state = {
            "env": self.env.get_state(),
            "obs": {k: v.clone() for k, v in self.obs.items()},
            "generator": self.generator.get_state(),
            "steps_done": self.steps_done,
            "resets": self.resets,
            "group_rounds": self.group_rounds,
        }
        if self.memory is not None:
            state["memory"] = self.memory.get_state()
        return ArrayDict(state)

    def set_state(self, state: dict[str, Any]) -> str:
        """Continue from a ``get_state`` result; returns how (exactly, or with fresh episodes). What it keeps it
        copies (the env's ``set_state`` too): the tensors may be read-only views of the object store. A pipelined
        worker's state (``servers.pipeline``: its groups' envs, not one of all the rows): fresh episodes."""
        groups = state.get("groups")
        if groups is not None:
            self.steps_done, self.resets = (sum(int(group[k]) for group in groups) for k in ("steps_done", "resets"))
            self.start_fresh(self.steps_done)
            return f"fresh episodes (the saved state is that of {len(groups)} groups: servers.pipeline)"
        self.generator.set_state(state["generator"])
        self.steps_done, self.resets, self.group_rounds = state["steps_done"], state["resets"], state["group_rounds"]
        rows = next(iter(state["obs"].values())).shape[0]
        saved_shapes = {g: v.shape[1:] for g, v in state["obs"].items()}
        other_shapes = saved_shapes != {g: v.shape[1:] for g, v in self.obs.items()}
        no_memory = self.memory is not None and "memory" not in state
        if (
            state["env"] is None
            or self.env.get_state() is None
            or rows != self.env.num_envs
            or other_shapes
            or no_memory
        ):
            self.obs = self.env.reset(derive_seed(self.seed, 6, self.steps_done))
            self.fresh = True
            if self.memory is not None:
                self.memory.restart(torch.arange(self.env.num_envs))
            if rows != self.env.num_envs:
                return f"fresh episodes ({rows} rows saved per shard, {self.env.num_envs} now)"
            if other_shapes:
                return "fresh episodes (the saved observations have other shapes: another env.frame_stack?)"
            if no_memory:
                return "fresh episodes (the saved shard state has no recurrent state: model.recurrent was none)"
            return "fresh episodes (this env cannot save its state)"
        self.env.set_state(state["env"])
        self.obs = {k: v.clone() for k, v in state["obs"].items()}
        if self.memory is not None:
            self.memory.set_state(state["memory"])
        self.fresh = False
        return "exact"

    def start_fresh(self, key: int) -> None:
        """Start new episodes in every row, as a replacement shard does: the rows reset and the sampling
        generator reseeded from ``key`` (where the run continues), none an episode this shard's seed began."""
        self.generator.manual_seed(derive_seed(self.seed, 1, key))
        self.obs = self.env.reset(derive_seed(self.seed, 6, key))
        self.fresh = True
        if self.memory is not None:
            self.memory.restart(torch.arange(self.env.num_envs))

    def set_weights(self, weights: dict | tuple) -> None:
        """Load the actor weights ``{"version": v, "timeline": t, "actor": state_dict}`` unless already loaded; on a
        worker of policy servers, take the key ``(timeline, version)`` of the weights its server holds.

        Weights are known by (timeline, version): after a rewind to an older checkpoint a version number comes
        round again with other weights (``timeline`` is optional: None for weights that name no timeline).
        """
        if self.server is not None:
            self.timeline, self.version = weights
            return
        if (weights.get("timeline"), weights["version"]) != (self.timeline, self.version):
            self.actor.load_state_dict(weights["actor"])
            self.version, self.timeline = weights["version"], weights.get("timeline")

    # -- the one acting loop ------------------------------------------------------------------

    def act(self, ending: Ending) -> tuple[int, Obs]:
        """Act until ``ending`` says stop; returns the steps taken and the observations reached.

        The hot loop of collection; it computes exactly what a plain per-step loop does
        (``Actor.sample`` on the actor's groups, ``env.step``, copy into the chunk; see
        tests/test_fast_path.py) with little overhead per step: the chunk's tensors are allocated
        once and written in place, an MLP actor acts through ``sample_discrete`` / ``sample_gaussian``, and with
        ``on_nonfinite: raise`` a training chunk is checked for non-finite values once, afterwards
        (``mask`` must restart rows at once, so it checks every step).
        """
        each_step = self.on_nonfinite == "mask" or ending.checks_each_step
        obs, t = ending.begin(), 0
        self._acting = None  # built again at this run's first step, with the weights it acts with
        env_action = ending.env_action  # the actor's mapping into the action space; a scripted policy's own
        try:
            with inference(self.actor) if self.actor is not None else torch.no_grad():
                while ending.running(t):
                    ending.observe(t, obs)
                    step = self.env.step(env_action(ending.act(t, obs)))
                    bad = self._nonfinite_rows(step, t) if each_step else None
                    ending.after_step(t, step, bad)
                    if self.memory is not None:  # a row's next trajectory starts with a zero state
                        self.memory.restart(step.started_rows())
                    obs = step.obs
                    t += 1
        except Exception as error:
            if not each_step and isinstance(ending, ChunkEnding):
                # an env may fail on the non-finite values it produced: say so first
                try:
                    partial = ending.result(t, obs)
                except Exception:  # noqa: BLE001 - nothing to add to the env's own error
                    raise error from None
                self._raise_if_nonfinite(partial, t)
            raise
        self.obs = obs
        return t, obs

    def sample_discrete(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` for a discrete actor, bitwise, written into ``action`` [N] and ``logp`` [N]."""
        if self.server is not None:
            return self._sample_served(obs, action, logp)
        acting = self._fused_acting()
        if acting is None:
            return self._sample_into(obs, action, logp)
        log_probs = acting.output(obs).log_softmax(-1)
        torch.exp(log_probs, out=acting.first)
        sample_categorical(acting.first, self.generator, noise=acting.second, out=action)
        torch.gather(log_probs, 1, action.unsqueeze(1), out=logp.unsqueeze(1))
        return action

    def sample_gaussian(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` for a continuous actor, bitwise, written into ``action`` [N, D] and ``logp`` [N]: the same
        normal draws from the generator, then ``mean + noise * std`` and ``-0.5 * sum(noise^2) - sum(log_std)
        - D log(2 pi) / 2``, each operation as ``Actor.sample`` does it, in place. With a log-std per state
        (``model.log_std: state``) the fused net's output goes through ``Actor.act_with`` itself: the std is new at
        every step, so there is nothing to compute once."""
        if self.server is not None:
            return self._sample_served(obs, action, logp)
        acting = self._fused_acting()
        if acting is None:
            return self._sample_into(obs, action, logp)
        out, noise = acting.output(obs), acting.first
        noise.normal_(generator=self.generator)  # what torch.randn(noise.shape, generator=...) draws
        if acting.std is None:
            return self._write(action, logp, *self.actor.act_with(out, noise))
        torch.mul(noise, acting.std, out=action)
        torch.add(out, action, out=action)  # the net's output is the mean
        torch.sum(torch.square(noise, out=acting.second), -1, out=logp)
        logp.mul_(-0.5).sub_(acting.log_std_sum).sub_(0.5 * math.log(2 * math.pi) * noise.shape[-1])
        return action

    def _sample_served(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` on the policy server: the draws made here from the generator, as the collocated shard
        makes them; the action and its log-probability written into ``action`` and ``logp``."""
        reply = self.ask(obs, self.sampling.draws(action.shape[0], self.generator))
        return self._write(action, logp, reply.action, reply.logp)

    def ask(self, obs: Obs, draws: torch.Tensor | None, by_row: bool = False, peek: bool = False) -> ActReply:
        """The policy server's reply for the rows (``ActRequest``); their recurrent state moves on, unless ``peek``
        (the core's output at ``obs``, the state left as it is)."""
        memory = self.memory
        request = ActRequest(
            (self.timeline, self.version),
            {g: obs[g] for g in self.inputs},
            draws,
            None if memory is None else memory.state,
            None if memory is None else memory.starting,
            by_row,
            peek,
        )
        reply = self.server(request)
        if memory is not None and not peek:
            memory.state, memory.output = reply.state, reply.output
            memory.starting.fill_(False)
        return reply

    def peek(self, obs: Obs) -> torch.Tensor:
        """A recurrent actor's core output at ``obs``, its rows' state left as it is (a chunk's last observation)."""
        if self.server is not None:
            return self.ask(obs, None, peek=True).output
        actor = self.actor
        with inference(actor):
            return self.memory.peek(actor.core, actor.features(obs))

    def learned_policy(self, deterministic: bool) -> EvalPolicy:
        """The learned actor as evaluation plays it: each row alone, here or on the policy server."""
        if self.server is not None:
            return ServedPolicy(
                lambda obs, draws, by_row: self.ask(obs, draws, by_row).action, self.sampling, deterministic
            )
        return LearnedPolicy(self.actor, self.memory, deterministic)

    def use_server(self, server: Callable[[ActRequest], ActReply]) -> None:
        """Ask ``server`` from now on (a replacement of the one that died)."""
        self.server = server

    def _sample_into(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` through the actor's own forward (a CNN's), copied into ``action`` and ``logp``."""
        return self._write(action, logp, *self.actor.sample(obs, self.generator, memory=self.memory))

    @staticmethod
    def _write(action: torch.Tensor, logp: torch.Tensor, sampled: torch.Tensor, logp_now: torch.Tensor) -> torch.Tensor:
        """A sample and its log-probability copied into the chunk's ``action`` and ``logp``."""
        action.copy_(sampled)
        logp.copy_(logp_now)
        return action

    def _fused_acting(self) -> FusedActing | None:
        """This run's ``FusedActing``, built at its first step; None for an actor of image groups."""
        if self._acting is None:
            actor = self.actor
            if not (actor.fusable and MLPInference.supports(actor.net)):
                return None
            self._acting = FusedActing(actor, self.memory, self.env.num_envs)
        return self._acting

    def take_fresh(self) -> bool:
        """Whether this chunk starts fresh episodes (only the first after the shard was created or started them
        anew: ``start_fresh``, or ``set_state`` without the saved episodes)."""
        fresh, self.fresh = self.fresh, False
        return fresh

    def restart_rows(self, step: Step, rows: torch.Tensor) -> int:
        """Start new training episodes in ``rows`` (a bool mask) after a non-finite value; returns their count."""
        index = rows.nonzero().squeeze(1)
        seeds = [derive_seed(self.seed, 2, self.resets, int(r)) for r in index]
        self.resets += 1
        step.obs = self.env.reset_rows(index, seeds)
        if self.memory is not None:
            self.memory.restart(index)
        return int(index.numel())

    # -- non-finite values ----------------------------------------------------------------------

    def _nonfinite_rows(self, step: Step, t: int) -> torch.Tensor | None:
        """Rows with a non-finite reward or observation in ``step``: raise, or discard them (``mask``).

        A discarded row's transition is marked invalid and its episode is dropped, not finished: no
        flags, final_obs or report for it (a NaN reward on a row's last step would otherwise put a
        NaN return in the chunk). The ending restarts the row.
        """
        if all_finite(step.reward) and all(
            all_finite(v) for group in (step.obs, step.final_obs) for v in group.values()
        ):
            return None
        bad = ~torch.isfinite(step.reward)
        for value in step.obs.values():
            bad |= ~torch.isfinite(value.flatten(1)).all(1)
        for value in step.final_obs.values():
            bad[step.done_rows] |= ~torch.isfinite(value.flatten(1)).all(1)
        if self.on_nonfinite == "raise":
            raise NonFiniteError(self._nonfinite_message(bad.nonzero().squeeze(1), t))
        step.valid = ~bad if step.valid is None else step.valid & ~bad
        step.reward = step.reward.masked_fill(bad, 0.0)
        step.terminated = step.terminated & ~bad
        step.truncated = step.truncated & ~bad
        keep, kept_episodes = ~bad[step.done_rows], ~bad[step.ended_rows()]
        if step.episode_rows is not None:
            step.episode_rows = step.episode_rows[kept_episodes]
        step.done_rows = step.done_rows[keep]
        step.final_obs = {k: v[keep] for k, v in step.final_obs.items()} if step.done_rows.numel() else {}
        step.episodes = {k: v[kept_episodes] for k, v in step.episodes.items()} if kept_episodes.any() else {}
        return bad

    def _raise_if_nonfinite(self, chunk: RolloutChunk, steps: int) -> None:
        """Raise ``NonFiniteError`` for the first of the chunk's first ``steps`` steps with a non-finite value.

        One check over the whole chunk (the common case: all finite); only when it fails are the
        step and rows located, as the per-step check would have reported them.
        """
        reward, obs, final_obs = chunk.reward[:steps], chunk.obs, chunk.final_obs
        if (
            all_finite(reward)
            and all(all_finite(v[1 : steps + 1]) for v in obs.values())
            and all(all_finite(v) for v in final_obs.values())
        ):
            return
        bad = ~torch.isfinite(reward)
        for value in obs.values():
            bad |= ~torch.isfinite(value[1 : steps + 1].flatten(2)).all(2)
        for value in final_obs.values():
            bad_final = ~torch.isfinite(value.flatten(1)).all(1) & (chunk.final_t < steps)
            bad[chunk.final_t[bad_final], chunk.final_row[bad_final]] = True
        t = int(bad.any(1).nonzero()[0, 0])
        self.steps_done -= steps - t
        raise NonFiniteError(self._nonfinite_message(bad[t].nonzero().squeeze(1), t))

    def _nonfinite_message(self, rows: torch.Tensor, t: int) -> str:
        return (
            f"{self.env_id} returned a non-finite observation or reward in row {int(rows[0])} of shard "
            f"{self.shard_index} at step {self.steps_done} (step {t} of this chunk); rows affected: "
            f"{rows.tolist()}. Fix the env, or set env.on_nonfinite: mask to drop such rows and count them."
        )


class FusedActing:
    """An MLP actor for one acting run: its net through ``MLPInference``, after its recurrent core where it has one,
    and two scratch buffers of the draws' shape; for a Gaussian actor with a log-std parameter ``exp(log_std)`` and
    ``sum(log_std)`` (None with a log-std per state).

    The weights do not change within a run, so what depends on them alone (those two and the input normalizer's
    divisor) is computed once, as ``Actor.sample`` computes it at every step.
    """

    def __init__(self, actor: Actor, memory: RowMemory | None, rows: int):
        self.actor, self.memory = actor, memory
        self.net = MLPInference(actor.net, actor.obs_norm if actor.core is None else None, fixed=True)
        width = actor.sampling.width  # the net's output is twice as wide with a log-std per state
        self.first, self.second = torch.empty(rows, width), torch.empty(rows, width)
        self.std = self.log_std_sum = None
        if actor.log_std is not None:
            self.std, self.log_std_sum = actor.log_std.exp(), actor.log_std.sum()

    def output(self, obs: Obs) -> torch.Tensor:
        """The net's output for ``obs`` (logits or the Gaussian's parameters): a buffer that the next step
        overwrites."""
        actor = self.actor
        if actor.core is None:
            return self.net(actor.vector_input(obs))
        return self.net(self.memory.advance(actor.core, actor.features(obs)))  # the core reads normalized features


def all_finite(value: torch.Tensor) -> bool:
    """Whether every value is finite; integer tensors (uint8 images) always are and are not scanned (an Atari
    chunk's frames took ~5 ms a check)."""
    return not value.is_floating_point() or bool(torch.isfinite(value).all())
