"""What one acting run of a shard is for, and what ends it: the plans the coordinator sends, and their endings.

``EnvShard`` has one acting loop (``EnvShard.act``); what differs between a training chunk, a round of
GRPO groups and an evaluation is how the run starts, what it records and what ends it. A *plan* is
the small, picklable request (``FixedSteps``, ``GroupEpisodes``, ``EvalEpisodes``); the shard turns it
into an *ending*, the object its loop consults::

    obs = ending.begin()
    while ending.running(t):
        ending.observe(t, obs)                     # the chunk keeps obs[t]
        step = env.step(env_action(ending.act(t, obs)))
        ...                                        # non-finite rows found and discarded (Rows)
        ending.after_step(t, step, bad)            # masks, episode ends, row resets
        obs = step.obs

- ``FixedSteps(T)``: a chunk of ``T`` steps that continues the rows' running episodes (PPO);
- ``GroupEpisodes(G, max_steps)``: every row plays one episode from its group's shared start (GRPO); with
  ``keep_groups``, rounds of them until that many groups are informative (``raysim.rollout.dynamic_sampling``);
- ``EvalEpisodes(...)``: evaluation episodes by global index, per-row quotas; returns records, not a chunk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from raysim.envs.contract import BatchedEnv, Obs, Step
from raysim.rollout.acting import Acting, UniformWarmUp
from raysim.rollout.chunk import RolloutChunk, join_reports
from raysim.rollout.policies import EvalPolicy, scripted_policy
from raysim.rollout.rows import Rows
from raysim.rollout.teacher import Teacher
from raysim.rollout.trajectories import Trajectories
from raysim.seeding import EVAL_ACTION_NOISE, EVAL_BATCH, EVAL_EPISODE, derive_seed


@dataclass(frozen=True)
class FixedSteps:
    """A training chunk of ``num_steps`` steps; the rows' episodes continue across chunks. ``teacher_share``: with
    a teacher on the shard (distillation), each row's action at each step is the teacher's instead of the
    student's with this probability (DAgger's beta), drawn from the shard's generator. ``random_actions``: every
    action drawn uniformly in the action space from the shard's generator (an off-policy warm-up,
    ``ActionSampling.uniform``), the policy not consulted."""

    num_steps: int
    teacher_share: float = 0.0
    random_actions: bool = False

    @property
    def steps_per_row(self) -> int:
        return self.num_steps


@dataclass(frozen=True)
class GroupEpisodes:
    """One episode per row; the chunk's rows ``[gG, (g+1)G)`` start from one shared reset seed (GRPO groups; on an
    env of several tasks, rows of one task: ``group_order``).

    The round stops when every row finished, or after ``max_steps`` steps (running episodes are cut).
    ``keep_groups`` (dynamic sampling, ``raysim.rollout.dynamic_sampling``): play rounds until that many groups
    have returns that are not all equal, at most ``max_rounds``; None: one round, every group.
    """

    group_size: int
    max_steps: int
    keep_groups: int | None = None
    max_rounds: int = 1

    @property
    def steps_per_row(self) -> None:
        """Varies: a round lasts until every row finished its episode."""
        return None


@dataclass(frozen=True)
class EvalEpisodes:
    """Evaluation episodes on a shard's rows: its row ``r`` plays ``quotas[r]`` of them, in index order.

    Episodes have global indices: row ``r`` is global row ``g = row_offset + r`` of ``rows`` over all
    shards (default: this shard's, the only one) and plays episodes ``j = g, g + rows, g + 2 rows, ...``
    (static assignment: which row plays an episode never depends on timing). Episode ``j`` starts
    from ``derive_seed(seed, EVAL_EPISODE, j)``, a stochastic one (``deterministic`` False) samples
    its actions from counter-based noise keyed by ``derive_seed(seed, EVAL_ACTION_NOISE, j)`` and the
    episode's step, and the actor computes each row alone (``Actor.forward(by_row=True)``), so episode
    ``j`` is the same on any layout (with image inputs up to the last bits: CNN features are computed
    batched, see ``Actor.forward``). ``max_steps``: the steps an episode may take; one still running
    then is cut and not counted. ``stop_after`` ends the run once that many episodes were counted
    ("first n to finish", the biased count kept for comparison; which episodes those are depends on
    the layout). ``policy``: what acts (``raysim.rollout.policies``): None, the shard's actor with the
    weights ``EnvShard.evaluate`` loads; ``random`` (uniform actions from the same keyed noise, whatever
    ``deterministic`` says) or ``expert`` (the env's scripted expert), which need no weights. ``trajectories``:
    each counted episode's record also carries its steps (``raysim.rollout.trajectories``: demonstrations).
    """

    quotas: Sequence[int]
    row_offset: int
    seed: int
    max_steps: int
    deterministic: bool = True
    stop_after: int | None = None
    rows: int | None = None
    policy: str | None = None
    trajectories: bool = False


@dataclass(frozen=True)
class Scoring:
    """What counting an evaluation needs of the task: whether it defines success, and its tasks by index
    (``BatchedEnv.task_names``; row ``r`` plays task ``r mod K``, so episode ``j`` plays task ``j mod K``)."""

    defines_success: bool | None
    task_names: tuple[str, ...] = ()

    @classmethod
    def of(cls, env: BatchedEnv) -> Scoring:
        return cls(env.defines_success, tuple(env.task_names))


Collection = FixedSteps | GroupEpisodes  # what an algorithm asks the shards to collect


class ShardView(Protocol):
    """What an ending sees of the shard that drives it (``raysim.rollout.shard.EnvShard``)."""

    rows: Rows  # the env, observations, recurrent state, generator, counters
    acting: Acting  # its actor's, here or on a policy server (``raysim.rollout.acting``)
    teacher: Teacher | None  # labels every training step (distillation), or None


class Ending:
    """The parts of the acting loop that depend on what the run is for (see the module docstring)."""

    shard: ShardView

    #: False: finiteness may be checked once over the recorded chunk afterwards (``on_nonfinite: raise``).
    checks_each_step = True

    def begin(self) -> Obs:
        raise NotImplementedError

    def running(self, t: int) -> bool:
        raise NotImplementedError

    def observe(self, t: int, obs: Obs) -> None:
        """Before acting at step ``t``."""

    def act(self, t: int, obs: Obs) -> torch.Tensor:
        raise NotImplementedError

    @property
    def env_action(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """How the env receives ``act``'s actions (read once per run): the actor's, mapped into the action space."""
        return self.shard.acting.sampling.env_action

    def after_step(self, t: int, step: Step, bad: torch.Tensor | None) -> None:
        """After the env stepped; ``bad`` marks rows whose non-finite values were discarded (or None)."""


class ChunkBuffer:
    """The tensors of one chunk, allocated for it (owned) and written in place step by step.

    ``capacity`` steps are allocated; ``build(T)`` keeps the first ``T`` (copied when ``T`` is less,
    so a chunk never holds the unused tail). With a teacher on the shard every step is labelled (``labels``) and
    ``teacher_share`` of the rows' actions are the teacher's (``FixedSteps``).
    """

    def __init__(
        self, shard: ShardView, obs: Obs, capacity: int, teacher_share: float = 0.0, random_actions: bool = False
    ):
        self.rows = rows = shard.rows
        T, N = capacity, rows.env.num_envs
        self.capacity = T
        self.obs = {k: torch.empty((T + 1, *v.shape), dtype=v.dtype) for k, v in obs.items()}
        self.logp = torch.empty(T, N)
        self.reward = torch.empty(T, N)
        self.terminated = torch.empty(T, N, dtype=torch.bool)
        self.truncated = torch.empty(T, N, dtype=torch.bool)
        self.mask = torch.ones(T, N, dtype=torch.bool)
        # actions are sampled straight into the buffers
        self.acting = UniformWarmUp(shard.acting, rows.generator) if random_actions else shard.acting
        self.sample, sampling = self.acting.sample, self.acting.sampling
        self.actions = torch.empty(T, N, dtype=torch.int64) if sampling.discrete else torch.empty(T, N, sampling.width)
        self.finals: list[tuple[int, Step]] = []
        self.nonfinite = 0
        # per-step views made once per chunk (one unbind each instead of an indexing call per step)
        self.obs_t = {k: v.unbind(0) for k, v in self.obs.items()}
        self.reward_t, self.logp_t = self.reward.unbind(0), self.logp.unbind(0)
        self.terminated_t, self.truncated_t = self.terminated.unbind(0), self.truncated.unbind(0)
        self.actions_t = self.actions.unbind(0)
        self.teacher, self.teacher_share = shard.teacher, float(teacher_share)
        self.labels = None if self.teacher is None else torch.empty(T, N, self.teacher.width)
        memory = rows.memory  # a recurrent actor's: the rows' state before obs[0], and where episodes start
        self.state0 = None if memory is None else memory.state.clone()
        self.starts = None if memory is None else torch.empty(T + 1, N, dtype=torch.bool)
        # and its core's output at every observation, the state of every final_obs's row (the learner's values)
        self.memory = None if memory is None else torch.empty(T + 1, N, memory.size)
        self.memory_t = None if memory is None else self.memory.unbind(0)
        self.final_states: list[torch.Tensor] = []

    def observe(self, t: int, obs: Obs) -> None:
        for k, v in obs.items():
            self.obs_t[k][t].copy_(v)
        if self.starts is not None:
            self.starts[t] = self.rows.memory.starting

    def act(self, t: int, obs: Obs) -> torch.Tensor:
        """A sampled action for every row, written with its log-probability into step ``t``; with a teacher, its
        label too, and the teacher's action in the rows it acts for (the log-probability stays the student's
        sample's: distillation does not read it)."""
        action = self.sample(obs, self.actions_t[t], self.logp_t[t])
        if self.memory is not None:
            self.memory_t[t].copy_(self.rows.memory.output)
        if self.teacher is None:
            return action
        label = self.labels[t]
        self.teacher.label(obs, out=label)
        if self.teacher_share > 0:
            taken = torch.rand(label.shape[0], generator=self.rows.generator) < self.teacher_share
            action[taken] = self.teacher.action(label)[taken]
        return action

    def record(self, t: int, step: Step) -> None:
        if step.valid is not None:
            self.mask[t] = step.valid
        self.reward_t[t].copy_(step.reward)
        self.terminated_t[t].copy_(step.terminated)
        self.truncated_t[t].copy_(step.truncated)
        if step.done_rows.numel():
            self.finals.append((t, step))
            if self.memory is not None:  # the state after the rows' last observation of the episode
                self.final_states.append(self.rows.memory.state[step.done_rows])

    def build(self, steps: int, last_obs: Obs, episodes: dict[str, torch.Tensor] | None = None) -> RolloutChunk:
        """The chunk of the first ``steps`` steps; ``episodes`` default to the finished rows' reports."""
        for k, v in last_obs.items():
            self.obs[k][steps].copy_(v)
        if self.starts is not None:
            self.starts[steps] = self.rows.memory.starting
            self.memory[steps] = self.acting.peek(last_obs)
        finals = self.finals
        final_obs = (
            {k: torch.cat([s.final_obs[k] for _, s in finals]) for k in self.obs}
            if finals
            else {k: v.new_empty((0, *v.shape[2:])) for k, v in self.obs.items()}
        )
        final_t = (
            torch.cat([torch.full_like(s.done_rows, t) for t, s in finals])
            if finals
            else torch.empty(0, dtype=torch.int64)
        )
        final_row = torch.cat([s.done_rows for _, s in finals]) if finals else torch.empty(0, dtype=torch.int64)
        if episodes is None:
            episodes = finished_episodes(finals)

        def kept(x: torch.Tensor, extra: int = 0) -> torch.Tensor:
            return x if steps == self.capacity else x[: steps + extra].clone()

        return RolloutChunk(
            obs={k: kept(v, 1) for k, v in self.obs.items()},
            actions=kept(self.actions),
            logp=kept(self.logp),
            reward=kept(self.reward),
            terminated=kept(self.terminated),
            truncated=kept(self.truncated),
            mask=kept(self.mask),
            final_obs=final_obs,
            final_t=final_t,
            final_row=final_row,
            episodes=episodes,
            policy_version=self.acting.version,
            shard=self.rows.shard_index,
            nonfinite=self.nonfinite,
            fresh=self.rows.take_fresh(),
            state0=self.state0,
            starts=None if self.starts is None else kept(self.starts, 1),
            memory=None if self.memory is None else kept(self.memory, 1),
            final_state=None if self.memory is None else torch.cat([self.state0[:0], *self.final_states]),  # [K, S]
            labels=None if self.labels is None else kept(self.labels),
        )


def finished_episodes(finals: list[tuple[int, Step]]) -> dict[str, torch.Tensor]:
    """The env-owned reports of the episodes that ended (the columns every report has), concatenated, with the
    ``row`` and step ``t`` of each; a done that ended no episode (``Step.episode_rows``) has none."""
    ended = [(t, s) for t, s in finals if s.ended_rows().numel()]
    if not ended:
        empty = torch.empty(0, dtype=torch.int64)
        return {"length": empty, "return": torch.empty(0), "row": empty.clone(), "t": empty.clone()}
    episodes = join_reports([s.episodes for _, s in ended])
    episodes["row"] = torch.cat([s.ended_rows() for _, s in ended])
    episodes["t"] = torch.cat([torch.full_like(s.ended_rows(), t) for t, s in ended])
    return episodes


class ChunkEnding(Ending):
    """``FixedSteps``: ``T`` steps from where the rows are; the episodes run on into the next chunk."""

    def __init__(self, shard: ShardView, plan: FixedSteps):
        self.shard, self.rows, self.steps, self.plan = shard, shard.rows, int(plan.num_steps), plan
        self.checks_each_step = False
        self.start = shard.rows.steps_done

    def begin(self) -> Obs:
        plan = self.plan
        self.chunk = ChunkBuffer(self.shard, self.rows.obs, self.steps, plan.teacher_share, plan.random_actions)
        return self.rows.obs

    def running(self, t: int) -> bool:
        self.rows.steps_done = self.start + t
        return t < self.steps

    def observe(self, t: int, obs: Obs) -> None:
        self.chunk.observe(t, obs)

    def act(self, t: int, obs: Obs) -> torch.Tensor:
        return self.chunk.act(t, obs)

    def after_step(self, t: int, step: Step, bad: torch.Tensor | None) -> None:
        if bad is not None:
            self.chunk.nonfinite += self.rows.restart_rows(step, bad)
        self.chunk.record(t, step)

    def result(self, steps: int, obs: Obs) -> RolloutChunk:
        return self.chunk.build(steps, obs)


class GroupEnding(Ending):
    """``GroupEpisodes``: a round of one episode per row from shared group starts.

    A row that finished early keeps being stepped by the batched env (its auto-reset episode is
    ignored) but is masked (``chunk.mask`` False, zero reward, no flags), so it contributes no
    transitions. With ``on_nonfinite: mask`` a row whose env returns a non-finite value is dropped
    from the round: all of its transitions are masked and its record has ``finished`` False; its
    return so far still enters its group's statistics. ``chunk.episodes`` holds one record per row
    (in row order): ``return``, ``length``, ``row``, ``group``, ``t`` (the step it finished at, or
    ``T-1`` when cut), ``finished`` and, where the env reports it, ``success`` (the env's report of the
    row's episode; False for a row whose episode did not end in the round: no report came).

    Group g is the chunk's rows ``[gG, (g+1)G)``. On an env of K > 1 tasks (row r plays task ``r mod K``) the
    chunk holds the env's rows in group order (``group_order``: each task's rows in turn), so that a group's
    members play one task and can start from one state; with one task the chunk's rows are the env's.
    """

    def __init__(self, shard: ShardView, plan: GroupEpisodes):
        if int(plan.max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {plan.max_steps}")
        self.shard, self.rows = shard, shard.rows
        self.group_size, self.max_steps = int(plan.group_size), int(plan.max_steps)
        N = shard.rows.env.num_envs
        groups = N // self.group_size
        if (plan.keep_groups is not None and not 1 <= plan.keep_groups <= groups) or plan.max_rounds < 1:
            raise ValueError(
                f"keep_groups must be in 1..{groups} (the groups of a round) and max_rounds >= 1, "
                f"got {plan.keep_groups} and {plan.max_rounds}"
            )
        self.order = group_order(N, self.group_size, len(self.rows.env.task_names))
        self.active = torch.ones(N, dtype=torch.bool)
        self.episode_return = torch.zeros(N)
        self.episode_length = torch.zeros(N, dtype=torch.int64)
        self.finished_at = torch.full((N,), -1, dtype=torch.int64)
        self.success = torch.zeros(N, dtype=torch.bool)
        self.reports_success = self.rows.env.defines_success is True  # else: once a report carries it

    def begin(self) -> Obs:
        obs = group_reset(self.rows, self.group_size, self.rows.group_rounds, self.order)
        self.rows.group_rounds += 1
        self.chunk = ChunkBuffer(self.shard, obs, self.max_steps)
        return obs

    def running(self, t: int) -> bool:
        return t < self.max_steps and bool(self.active.any())

    def observe(self, t: int, obs: Obs) -> None:
        self.chunk.observe(t, obs)

    def act(self, t: int, obs: Obs) -> torch.Tensor:
        return self.chunk.act(t, obs)

    def after_step(self, t: int, step: Step, bad: torch.Tensor | None) -> None:
        active = self.active
        if bad is not None:
            self.chunk.nonfinite += self.rows.restart_rows(step, bad)
            dropped = active & bad
            if bool(dropped.any()):  # the row's whole episode leaves the round
                self.chunk.mask[:t, dropped] = False
                active &= ~dropped
        mask_t = active.clone() if step.valid is None else active & step.valid
        step.valid = mask_t
        step.reward = torch.where(mask_t, step.reward, 0.0)
        step.terminated, step.truncated = step.terminated & mask_t, step.truncated & mask_t
        if "success" in step.episodes:  # the env's reports of the episodes of this round that ended here
            ended = step.ended_rows()
            mine = mask_t[ended]
            self.success[ended[mine]] = step.episodes["success"][mine].bool()
            self.reports_success = True
        if step.done_rows.numel():  # only the episodes of this round end here; the rows' next ones are ignored
            keep = mask_t[step.done_rows]
            step.done_rows = step.done_rows[keep]
            step.final_obs = {k: v[keep] for k, v in step.final_obs.items()}
        ending = torch.zeros_like(active)
        ending[step.done_rows] = True
        self.episode_return += step.reward
        self.episode_length += mask_t.long()
        self.finished_at[ending] = t
        active &= ~ending
        self.chunk.record(t, step)
        self.rows.steps_done += 1

    def result(self, steps: int, obs: Obs) -> RolloutChunk:
        N, finished = self.active.numel(), self.finished_at >= 0
        columns = {"return": self.episode_return, "length": self.episode_length}
        columns.update(t=torch.where(finished, self.finished_at, steps - 1), finished=finished)
        if self.reports_success:
            columns["success"] = self.success
        if self.order is not None:  # the chunk's rows are the env's in group order
            columns = {k: v[self.order] for k, v in columns.items()}
        episodes = {"return": columns.pop("return"), "length": columns.pop("length"), "row": torch.arange(N)}
        episodes.update(group=torch.arange(N) // self.group_size, **columns)
        chunk = self.chunk.build(steps, obs, episodes)
        return chunk if self.order is None else in_group_order(chunk, self.order)


def in_group_order(chunk: RolloutChunk, order: torch.Tensor) -> RolloutChunk:
    """A round's ``chunk`` (rows in the env's order) with its rows in group ``order`` (``group_order``): row i is the
    env's row ``order[i]``; its ``episodes`` are left as they are (``GroupEnding`` writes them in group order)."""
    place = torch.argsort(order)  # each env row's row in the chunk
    final_row = place[chunk.final_row]
    finals = torch.argsort(chunk.final_t * chunk.num_envs + final_row)  # by step, then row, as a chunk lists them

    def rows(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[:, order]

    return dataclasses.replace(
        chunk,
        obs={k: v[:, order] for k, v in chunk.obs.items()},
        actions=rows(chunk.actions),
        logp=rows(chunk.logp),
        reward=rows(chunk.reward),
        terminated=rows(chunk.terminated),
        truncated=rows(chunk.truncated),
        mask=rows(chunk.mask),
        final_obs={k: v[finals] for k, v in chunk.final_obs.items()},
        final_t=chunk.final_t[finals],
        final_row=final_row[finals],
        state0=None if chunk.state0 is None else chunk.state0[order],
        starts=rows(chunk.starts),
        memory=rows(chunk.memory),
        final_state=None if chunk.final_state is None else chunk.final_state[finals],
        labels=rows(chunk.labels),
    )


class GroupResetError(RuntimeError):
    """The env cannot start the members of a group from the same state."""


def group_order(num_envs: int, group_size: int, tasks: int) -> torch.Tensor | None:
    """The env's rows in group order (group g: the ``group_size`` rows from place ``gG``) on an env of ``tasks`` > 1
    tasks, where row r plays task ``r mod K``: each task's rows in turn, so that a group's members play one task;
    None with one task (group g: rows ``[gG, (g+1)G)``, the rows' own order)."""
    if tasks <= 1:
        return None
    if (num_envs // tasks) % group_size:
        raise ValueError(
            f"group_size {group_size} does not divide the {num_envs // tasks} rows of each of {tasks} tasks"
        )
    return torch.arange(num_envs).reshape(-1, tasks).T.reshape(-1)


def group_reset(rows: Rows, group_size: int, round_index: int, order: torch.Tensor | None = None) -> Obs:
    """Reset every row, group members from one shared seed; check their observations are equal.

    Group ``g`` of round ``k`` resets from ``derive_seed(rows.seed, 6, g, k)``; its members are the rows
    ``order[gG:(g+1)G]`` (``group_order``; None: rows ``[gG, (g+1)G)``).
    """
    env, N, G = rows.env, rows.env.num_envs, int(group_size)
    if G < 2 or N % G:
        raise ValueError(f"group_size must be >= 2 and divide num_envs ({N}), got {G}")
    if not getattr(env, "seeded_reset", True):
        raise GroupResetError(
            f"{rows.env_id} does not guarantee equal initial states for equal reset seeds "
            "(seeded_reset is False), so GRPO groups cannot share a start; use PPO for this env."
        )
    order = torch.arange(N) if order is None else order
    place = torch.argsort(order).tolist()  # each row's place in group order
    seeds = [derive_seed(rows.seed, 6, place[row] // G, round_index) for row in range(N)]
    obs = env.reset_rows(torch.arange(N), seeds)
    if rows.memory is not None:
        rows.memory.restart(torch.arange(N))
    for name, value in obs.items():
        grouped = value[order].reshape(N // G, G, -1)
        same = (grouped == grouped[:, :1]).all(-1).all(-1)
        if not bool(same.all()):
            g = int((~same).nonzero()[0])
            raise GroupResetError(
                f"{rows.env_id}: the members of group {g} (rows {order[g * G : g * G + G].tolist()}) reset with the "
                f"same seed but got different '{name}' observations; the env does not honour reset seeds, so "
                "GRPO cannot be used with it."
            )
    return {k: v.clone() for k, v in obs.items()}


class EvalEnding(Ending):
    """``EvalEpisodes``: each row's episodes by index; yields ``(record, report)`` per counted episode.

    ``record`` holds scalars: the episode index ``episode`` (j), its reset ``seed``, ``terminated``,
    ``truncated``, the env's report fields (``task`` by name where the env has several:
    ``BatchedEnv.task_names``), and two facts of the layout, the global ``row`` that played it and the
    batched ``step`` it finished at (and, with ``EvalEpisodes.trajectories``, ``trajectory``: the episode's steps,
    ``Trajectories.take``); ``report`` is the env-owned episode report as the env gave it. An
    episode with a non-finite value (``on_nonfinite: mask``) is not counted: ``excluded`` counts it. A
    row that played its quota idles (its episodes are ignored).

    An env that cannot reset single rows (``BatchedEnv.resets_rows`` False: a Gymnasium vector env
    vectorized ``native``) keeps per-row keys: the shard's rows start from one batch seed,
    ``derive_seed(seed, EVAL_BATCH, row_offset)``, and play the episodes the env's own resets give
    them (``seed`` None in their records), so they depend on the layout; a cut episode is discarded
    when the env ends it.
    """

    def __init__(self, shard: ShardView, plan: EvalEpisodes):
        env = shard.rows.env
        N = env.num_envs
        if len(plan.quotas) != N:
            raise ValueError(f"{len(plan.quotas)} quotas for {N} rows")
        self.shard, self.plan = shard, plan
        self.by_index = getattr(env, "resets_rows", True)  # False: per-row keys (see the class docstring)
        self.rows = N if plan.rows is None else int(plan.rows)
        self.first = torch.arange(N) + plan.row_offset  # each row's first episode index: its global row
        self.played = torch.zeros(N, dtype=torch.int64)  # each row's episodes ended or cut: it plays the next
        self.quota = torch.as_tensor(list(plan.quotas), dtype=torch.int64)
        self.noise_key = torch.zeros(N, dtype=torch.int64)  # of each row's running episode: its action noise
        self.episode_step = torch.zeros(N, dtype=torch.int64)  # steps of it: its noise counter, its budget
        self.discarding = torch.zeros(N, dtype=torch.bool)  # running a cut episode the env has yet to end
        self.results: list[tuple[dict, dict]] = []
        self.excluded = 0
        self.policy: EvalPolicy = (
            shard.acting.policy(plan.deterministic) if plan.policy is None else scripted_policy(plan.policy, env)
        )
        self.trajectories = Trajectories(env) if plan.trajectories else None
        if self.trajectories is not None and not self.by_index:
            raise ValueError(f"{self.shard.rows.env_id}: recording episodes needs an env that resets single rows")

    def episode(self, row: int) -> int:
        """The index j of ``row``'s running episode."""
        return int(self.first[row]) + int(self.played[row]) * self.rows

    def seed_of(self, episode: int) -> int | None:
        return derive_seed(self.plan.seed, EVAL_EPISODE, episode) if self.by_index else None

    def start(self, rows: list[int]) -> Obs | None:
        """Start the next episode of ``rows`` from its seed; the obs of all rows (None: the env starts them)."""
        episodes = [self.episode(r) for r in rows]
        if not self.plan.deterministic or self.plan.policy is not None:
            keys = [derive_seed(self.plan.seed, EVAL_ACTION_NOISE, j) for j in episodes]
            self.noise_key[rows] = torch.tensor(keys, dtype=torch.int64)
        self.episode_step[rows] = 0
        if self.trajectories is not None:
            self.trajectories.restart(rows)
        if self.shard.rows.memory is not None:
            self.shard.rows.memory.restart(torch.tensor(rows, dtype=torch.int64))
        if not self.by_index:
            return None
        seeds = [self.seed_of(j) for j in episodes]
        return self.shard.rows.env.reset_rows(torch.tensor(rows, dtype=torch.int64), seeds)

    def begin(self) -> Obs:
        env = self.shard.rows.env
        obs = self.start(list(range(env.num_envs)))
        return env.reset(derive_seed(self.plan.seed, EVAL_BATCH, self.plan.row_offset)) if obs is None else obs

    def running(self, t: int) -> bool:
        stop_after = self.plan.stop_after
        return bool((self.played < self.quota).any()) and not (
            stop_after is not None and len(self.results) >= stop_after
        )

    def observe(self, t: int, obs: Obs) -> None:
        if self.trajectories is not None:
            self.trajectories.observe(obs)

    def act(self, t: int, obs: Obs) -> torch.Tensor:
        actions = self.policy.act(obs, (self.noise_key, self.episode_step))
        if self.trajectories is not None:
            self.trajectories.act(actions)
        return actions

    @property
    def env_action(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.policy.env_action

    def after_step(self, t: int, step: Step, bad: torch.Tensor | None) -> None:
        self.episode_step += 1 if step.valid is None else step.valid  # an env's own reset transition is none
        if self.trajectories is not None:
            self.trajectories.record(step)
        playing = self.played < self.quota
        ended = torch.zeros_like(playing)
        ended[step.ended_rows()] = True  # whole episodes: a done whose episode goes on is not one
        if bad is not None:
            ended |= bad
        over = playing & ~ended & ~self.discarding & (self.episode_step >= self.plan.max_steps)
        if bad is None and not bool(((playing & ended) | over).any()):
            return
        counted = playing & ended & ~self.discarding
        columns = {k: v.tolist() for k, v in step.episodes.items()}
        for i, r in enumerate(step.ended_rows().tolist()):
            if counted[r]:
                self.results.append(self._record(r, t, step, {name: values[i] for name, values in columns.items()}))
        if bad is not None:
            self.excluded += int((bad & counted).sum())
        starts = counted | (ended & self.discarding)  # the row's next episode starts
        self.discarding &= ~ended
        if self.by_index:
            starts |= over  # cut now
        else:
            self.discarding |= over  # cut when the env ends it
        self.played += counted | over
        again = starts & (self.played < self.quota)
        if bad is not None and self.by_index:
            again |= bad  # a row is never left idling in a non-finite state
        if bool(again.any()):
            obs = self.start(again.nonzero().squeeze(1).tolist())
            step.obs = step.obs if obs is None else obs
        if self.trajectories is not None:
            self.trajectories.forget(self.played < self.quota)

    def result(self) -> tuple[list[tuple[dict, dict]], int, Scoring]:
        """The counted ``(record, report)`` pairs, the episodes left out, and how to count them."""
        return self.results, self.excluded, Scoring.of(self.shard.rows.env)

    def _record(self, row: int, t: int, step: Step, report: dict) -> tuple[dict, dict]:
        episode = self.episode(row)
        record = {
            "row": self.plan.row_offset + row,
            "episode": episode,
            "seed": self.seed_of(episode),
            "step": t,
            "terminated": bool(step.terminated[row]),
            "truncated": bool(step.truncated[row]),
            **report,
        }
        if "task" in report and self.shard.rows.env.task_names:  # the env's tensors hold an index, the records a name
            record["task"] = self.shard.rows.env.task_names[int(report["task"])]
        if self.trajectories is not None:
            record["trajectory"] = self.trajectories.take(row, step)
        return record, report
