"""``RolloutChunk``: what one EnvShard hands the learner for one iteration.

All tensors were allocated for this chunk (owned, no views into buffers the shard reuses).
Shapes: T steps, N rows, K finished rows, E completed episodes.

Through Ray a chunk travels as NumPy arrays (``__reduce__``, ``raysim.rollout.arrays``): pickle
protocol 5 hands their memory to Ray's object store out of band and the receiver maps it without a
copy, where torch's own pickling copies every tensor through a bytes object. The received tensors
are then read-only views of the object store: copy what you keep before writing to it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from raysim.rollout.arrays import from_arrays, to_arrays


@dataclass
class RolloutChunk:
    obs: dict[str, torch.Tensor]  # [T+1, N, ...]; obs[T] is where the next chunk starts
    actions: torch.Tensor  # [T, N, ...] as sampled (before the env's clip or squash)
    logp: torch.Tensor  # [T, N] log-probability of the actions under the acting policy
    reward: torch.Tensor  # [T, N] float32, as the env gave it
    terminated: torch.Tensor  # [T, N] bool
    truncated: torch.Tensor  # [T, N] bool
    mask: torch.Tensor  # [T, N] bool, False for transitions never to train on
    final_obs: dict[str, torch.Tensor]  # [K, ...] pre-reset observations of finished rows
    final_t: torch.Tensor  # [K] int64, the step of each final_obs
    final_row: torch.Tensor  # [K] int64, the row of each final_obs
    episodes: dict[str, torch.Tensor]  # [E] columns: env-owned reports plus "row" and "t"
    policy_version: int
    shard: int = 0
    nonfinite: int = 0  # rows masked because the env returned a non-finite value
    fresh: bool = False  # fresh episodes: every row starts a new one here, none continued (a new or replaced shard)
    # a recurrent actor's (model.recurrent), so the learner replays the rows' sequences; None otherwise:
    state0: torch.Tensor | None = None  # [N, S] each row's state before obs[0] (zeroed where starts[0])
    starts: torch.Tensor | None = None  # [T+1, N] bool, obs[t] starts an episode of the row: its state is zeroed first
    # the core's output at each observation as the acting shard computed it, and the state of each final_obs's row
    # after its episode's last observation: the learner's values read them instead of replaying (``sequence_values``)
    memory: torch.Tensor | None = None  # [T+1, N, size]
    final_state: torch.Tensor | None = None  # [K, S]
    # GRPO's dynamic sampling (``raysim.rollout.dynamic_sampling``; all 0 without it): the groups played for this
    # chunk, those left out of it, the uninformative ones kept because the rounds ran out, and the valid transitions
    # of those left out (their episodes are in ``episodes``, with ``row`` -1)
    # distillation: the teacher's output at every step, [T, N, A] (its Gaussian mean before the action transform, or
    # its logits), computed on the shard from the teacher's observation groups (``raysim.rollout.teacher``); None
    labels: torch.Tensor | None = None
    groups_played: int = 0
    groups_dropped: int = 0
    groups_filled: int = 0
    dropped_steps: int = 0

    @property
    def num_steps(self) -> int:
        return self.reward.shape[0]

    @property
    def num_envs(self) -> int:
        return self.reward.shape[1]

    @property
    def env_steps(self) -> int:
        """Valid transitions played for the chunk: those it holds and those of the groups dynamic sampling left out
        (the run's budget and schedule count every step played)."""
        return self.transitions + self.dropped_steps

    @property
    def transitions(self) -> int:
        """Valid transitions in the chunk: what an update trains on."""
        return int(self.mask.sum())

    def __reduce__(self):
        """Pickle CPU tensors as NumPy arrays (zero-copy out of band with protocol 5, as Ray uses: ``arrays``)."""
        return _rebuild_chunk, (to_arrays({f.name: getattr(self, f.name) for f in fields(self)}),)


def _rebuild_chunk(state: dict) -> RolloutChunk:
    return RolloutChunk(**from_arrays(state))


def join_reports(reports: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Episode reports (at least one) joined in order, with the columns every one of them has: a column some lack
    (``success``) is left out, so a rate is never taken over part of the episodes (``learner.window``)."""
    keys = set.intersection(*(set(report) for report in reports))
    return {k: torch.cat([report[k] for report in reports]) for k in sorted(keys)}


def concat_rows(chunks: list[RolloutChunk]) -> RolloutChunk:
    """One chunk of the rows of several chunks of the same steps, in order (a pipelined worker's groups of rows:
    ``raysim.rollout.pipelined``): per-step tensors joined along the rows, the finished rows' and the episodes' row
    indices moved by the rows before them, the counts summed. The episodes keep the columns an unpipelined chunk of
    the same rows keeps (``join_reports`` of those that ended one)."""
    first, offsets = chunks[0], [0]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + chunk.num_envs)

    def rows(name: str, dim: int = 1) -> torch.Tensor | None:
        values = [getattr(c, name) for c in chunks]
        return None if values[0] is None else torch.cat(values, dim)

    moved = [{**c.episodes, "row": c.episodes["row"] + o} for c, o in zip(chunks, offsets, strict=True)]
    ended = [e for e in moved if e["row"].numel()]  # a chunk that ended no episode has no say in the columns
    episodes = join_reports(ended) if ended else moved[0]
    return RolloutChunk(
        obs={g: torch.cat([c.obs[g] for c in chunks], 1) for g in first.obs},
        actions=rows("actions"),
        logp=rows("logp"),
        reward=rows("reward"),
        terminated=rows("terminated"),
        truncated=rows("truncated"),
        mask=rows("mask"),
        final_obs={g: torch.cat([c.final_obs[g] for c in chunks]) for g in first.final_obs},
        final_t=rows("final_t", 0),
        final_row=torch.cat([c.final_row + o for c, o in zip(chunks, offsets, strict=True)]),
        episodes=episodes,
        policy_version=first.policy_version,
        shard=first.shard,
        nonfinite=sum(c.nonfinite for c in chunks),
        fresh=all(c.fresh for c in chunks),
        state0=rows("state0", 0),
        starts=rows("starts"),
        memory=rows("memory"),
        final_state=rows("final_state", 0),
        labels=rows("labels"),
    )
