"""``PipelinedShard``: a training env worker of the ``servers`` placement whose rows act in groups that overlap.

A worker's step waits for its server's reply (a round trip through Ray, a few milliseconds) and then steps its env;
one after the other, neither overlaps the other. With ``servers.pipeline: k`` the worker's rows are ``k`` groups,
each its own batched env and its own ``EnvShard`` (its seed derived from the worker's and the group), each acting in
a thread of its own: while one group waits for its actions (the wait releases the interpreter), another steps its
env. The chunks of the groups' same steps are joined along the rows into the worker's chunk (``concat_rows``), so
the learner sees one shard of ``env.num_envs`` rows. The rows' episodes are not those of an unpipelined worker
(other seeds, the noise drawn per group); each group is as deterministic as any shard, and a server that serves
one request at a time answers each group as it would alone.

It answers what the coordinator asks a training shard (``collect``, ``rollout``, ``get_state``, ``set_state``,
``start_fresh``, ``spaces``, ``use_server``); evaluation shards are not pipelined.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raysim.rollout.arrays import ArrayDict
from raysim.rollout.chunk import RolloutChunk, concat_rows
from raysim.rollout.endings import Collection, FixedSteps
from raysim.rollout.server import ActReply, ActRequest, ServerLost
from raysim.rollout.shard import EnvShard
from raysim.seeding import PIPELINE_GROUP, derive_seed


class PipelinedShard:
    """``groups`` ``EnvShard``s of ``num_envs / groups`` rows each, acting at once in threads; one chunk of all."""

    def __init__(self, env_id: str, num_envs: int, *, groups: int, seed: int = 0, **options: Any):
        if groups < 2 or num_envs % groups:
            raise ValueError(f"servers.pipeline {groups} must be >= 2 and divide env.num_envs ({num_envs})")
        rows = num_envs // groups
        self.groups = [
            EnvShard(env_id, rows, seed=derive_seed(seed, PIPELINE_GROUP, g), **options) for g in range(groups)
        ]
        self.threads = ThreadPoolExecutor(max_workers=groups)

    def spaces(self) -> tuple[dict, Any, int | None]:
        return self.groups[0].spaces()

    def collect(self, weights: Any, plan: Collection) -> tuple[RolloutChunk, dict[str, int], dict[str, Any]]:
        """``EnvShard.collect`` of every group at once: one chunk of every row, a receipt, the groups' states. A lost
        server: every group drops its collection (those that finished too) and ``ServerLost`` is raised."""
        if not isinstance(plan, FixedSteps):
            raise TypeError(f"a pipelined worker collects FixedSteps chunks (PPO, distill), got {plan!r}")
        before = [(group.steps_done, group.group_rounds) for group in self.groups]
        futures = [self.threads.submit(group.collect, weights, plan) for group in self.groups]
        errors = [future.exception() for future in futures]  # every group done
        lost = next((e for e in errors if isinstance(e, ServerLost)), None)
        if lost is not None:
            for group, error, (steps, rounds) in zip(self.groups, errors, before, strict=True):
                if error is None:  # its chunk goes with the others' (a lost group abandoned its own)
                    group.abandon(steps, rounds)
            raise lost
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            raise failed
        chunk = concat_rows([future.result()[0] for future in futures])
        return chunk, {"shard": chunk.shard, "env_steps": chunk.env_steps}, self.get_state()

    def rollout(self, weights: Any, plan: Collection | int) -> RolloutChunk:
        """``EnvShard.rollout`` of every group at once, joined along the rows."""
        plan = FixedSteps(plan) if isinstance(plan, int) else plan
        futures = [self.threads.submit(group.rollout, weights, plan) for group in self.groups]
        return concat_rows([future.result() for future in futures])

    def get_state(self) -> dict[str, Any]:
        return ArrayDict({"groups": [group.get_state() for group in self.groups]})

    def set_state(self, state: dict[str, Any]) -> str:
        """Each group from its saved state (``EnvShard.set_state``); fresh episodes in every group when the state is
        not a pipelined worker's of as many groups."""
        saved = state.get("groups") or []
        if len(saved) != len(self.groups):
            key = int(state.get("steps_done", 0))
            self.start_fresh(key)
            return f"fresh episodes (the saved state is not that of {len(self.groups)} groups: servers.pipeline)"
        modes = [group.set_state(part) for group, part in zip(self.groups, saved, strict=True)]
        return "exact" if all(m == "exact" for m in modes) else "; ".join(sorted(set(modes)))

    def start_fresh(self, key: int) -> None:
        for group in self.groups:
            group.start_fresh(key)

    def set_weights(self, weights: Any) -> None:
        for group in self.groups:
            group.set_weights(weights)

    def use_server(self, server: Callable[[ActRequest], ActReply]) -> None:
        for group in self.groups:
            group.use_server(server)
