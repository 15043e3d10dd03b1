"""``EnvShard``: N rows of one batched env and how they act; produces rollout chunks and evaluation episodes.

A shard is two objects and one loop: its rows (``raysim.rollout.rows``: the env, observations, recurrent state,
generator, counters, non-finite checks, checkpoint state), its acting (``raysim.rollout.acting``: its own copy of
the actor, or a policy server), and the acting loop ``act`` that an ending (``raysim.rollout.endings``: a training
chunk, a GRPO round, an evaluation) drives. The shard acts actor-side in inference mode and returns one
``RolloutChunk`` of owned tensors. Training episodes continue across chunks: the next chunk starts from
``chunk.obs[T]`` with the rows' running episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from raysim.envs import FrameStackConfig
from raysim.envs.contract import Obs
from raysim.models import ActionSampling, Actor, ModelConfig, RowMemory
from raysim.rollout.acting import OwnActor, Served
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
from raysim.rollout.recording import Part, RecordedEval
from raysim.rollout.rows import Rows
from raysim.rollout.server import ActReply, ActRequest, ServerLost
from raysim.rollout.teacher import Teacher, TeacherWeights


class OfRows:
    """An attribute of the shard's rows, read and set through the shard (``shard.env``, ``shard.steps_done``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, shard: EnvShard | None, owner: type | None = None) -> Any:
        return self if shard is None else getattr(shard.rows, self.name)

    def __set__(self, shard: EnvShard, value: Any) -> None:
        setattr(shard.rows, self.name, value)


class EnvShard:
    """One batched env of ``num_envs`` rows plus how they act; produces rollout chunks. The coordinator's loop calls
    it once per iteration (in-process or as a Ray actor, same class)::

        weights = learner.get_weights()                           # {"version": v, "actor": state_dict}
        chunk, receipt = shard.collect(weights, FixedSteps(T))    # or GroupEpisodes(G, max_steps) for GRPO
        learner.update(chunk, ...)
        records = eval_shard.evaluate(weights, EvalEpisodes(...))  # episodes by global index

    ``rows`` (``Rows``) hold the env and all that acting leaves of it between runs; ``acting`` chooses the actions:
    ``OwnActor`` (its own CPU copy of the actor) or, with ``server``, ``Served``. A plan may act otherwise for one
    run: ``FixedSteps.random_actions`` (uniform warm-up), ``EvalEpisodes.policy`` (a scripted policy).

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

    env, obs, memory, generator = OfRows(), OfRows(), OfRows(), OfRows()
    steps_done, group_rounds, messages = OfRows(), OfRows(), OfRows()

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
        torch.set_num_threads(1)
        rows = Rows(env_id, num_envs, seed, env_kwargs, shard_index, on_nonfinite, frame_stack, evaluation, success)
        spaces, action_space = rows.env.observation_spaces, rows.env.action_space
        model = model if isinstance(model, ModelConfig) else ModelConfig(**(model or {}))
        self.acting: OwnActor | Served
        if server is None:
            self.acting = OwnActor(Actor(spaces, action_space, model), rows)
        else:
            sampling = ActionSampling(action_space, model.action_transform)
            self.acting = Served(server, sampling, list(model.actor_inputs), rows)
        if model.recurrent != "none":  # a recurrent actor's state per row, zeroed where a row's episode starts
            rows.memory = (
                RowMemory.served(model.recurrent, model.recurrent_size, rows.env.num_envs)
                if server
                else RowMemory(self.acting.actor.core, rows.env.num_envs, fused=True)
            )
        self.rows = rows
        self.teacher = None if teacher is None else Teacher(teacher, spaces, self.acting.sampling)
        self._recording: RecordedEval | None = None  # the evaluation ``record`` films, part by part

    @property
    def actor(self) -> Actor | None:
        """The actor whose weights this shard holds (None on a worker of policy servers)."""
        return self.acting.actor

    def spaces(self) -> tuple[dict, Any, int | None]:
        """The env's observation spaces (per group), action space and episode step limit."""
        env = self.rows.env
        return env.observation_spaces, env.action_space, env.max_episode_steps

    # -- what the coordinator calls ---------------------------------------------------------

    def collect(self, weights: dict, plan: Collection) -> tuple[RolloutChunk, dict[str, int], dict[str, Any]]:
        """``rollout``, a small receipt, and the shard's state right after the chunk (``get_state``).

        The coordinator reads only the receipt: it learns that the shard is alive and the chunk
        exists without pulling the chunk itself through the driver. The state stays in the object
        store, ready for a checkpoint of this iteration.
        """
        steps, rounds = self.rows.steps_done, self.rows.group_rounds
        try:
            chunk = self.rollout(weights, plan)
        except ServerLost:  # the steps in flight are lost: fresh episodes, the same collection asked again
            self.abandon(steps, rounds)
            raise
        return chunk, {"shard": self.rows.shard_index, "env_steps": chunk.env_steps}, self.get_state()

    def abandon(self, steps: int, rounds: int) -> None:
        """Drop the collection that began with ``steps`` taken and ``rounds`` played (its policy server died): the
        counters go back, the rows start fresh episodes; the coordinator asks for the collection again."""
        self.rows.abandon(steps, rounds)

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
            self.rows.raise_if_nonfinite(chunk, steps)
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
        """The shard's state for a checkpoint (``Rows.get_state``): env state, observations, RNG, counters."""
        return self.rows.get_state()

    def set_state(self, state: dict[str, Any]) -> str:
        """Continue from a ``get_state`` result (``Rows.set_state``); returns how (exactly, or with fresh episodes)."""
        return self.rows.set_state(state)

    def start_fresh(self, key: int) -> None:
        """Start new episodes in every row, as a replacement shard does (``Rows.start_fresh``)."""
        self.rows.start_fresh(key)

    def set_weights(self, weights: dict | tuple) -> None:
        """Load the actor weights ``{"version": v, "timeline": t, "actor": state_dict}`` unless already loaded; on a
        worker of policy servers, take the key ``(timeline, version)`` of the weights its server holds."""
        self.acting.set_weights(weights)

    def use_server(self, server: Callable[[ActRequest], ActReply]) -> None:
        """Ask ``server`` from now on (a replacement of the one that died)."""
        self.acting.server = server

    # -- the one acting loop ------------------------------------------------------------------

    def act(self, ending: Ending) -> tuple[int, Obs]:
        """Act until ``ending`` says stop; returns the steps taken and the observations reached.

        The hot loop of collection; it computes exactly what a plain per-step loop does
        (``Actor.sample`` on the actor's groups, ``env.step``, copy into the chunk; see
        tests/test_fast_path.py) with little overhead per step: the chunk's tensors are allocated
        once and written in place, an MLP actor acts through ``OwnActor``'s fused path, and with
        ``on_nonfinite: raise`` a training chunk is checked for non-finite values once, afterwards
        (``mask`` must restart rows at once, so it checks every step).
        """
        rows = self.rows
        each_step = rows.on_nonfinite == "mask" or ending.checks_each_step
        obs, t = ending.begin(), 0
        env_action = ending.env_action  # the actor's mapping into the action space; a scripted policy's own
        try:
            with self.acting.run():
                while ending.running(t):
                    ending.observe(t, obs)
                    step = rows.env.step(env_action(ending.act(t, obs)))
                    bad = rows.nonfinite_rows(step, t) if each_step else None
                    ending.after_step(t, step, bad)
                    if rows.memory is not None:  # a row's next trajectory starts with a zero state
                        rows.memory.restart(step.started_rows())
                    obs = step.obs
                    t += 1
        except Exception as error:
            if not each_step and isinstance(ending, ChunkEnding):
                # an env may fail on the non-finite values it produced: say so first
                try:
                    partial = ending.result(t, obs)
                except Exception:  # noqa: BLE001 - nothing to add to the env's own error
                    raise error from None
                rows.raise_if_nonfinite(partial, t)
            raise
        rows.obs = obs
        return t, obs
