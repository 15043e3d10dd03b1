"""``LearnerGroup``: R learner ranks (data-parallel) that the coordinator calls as one learner.

    group = LearnerGroup(backend, 2, model=..., algo=...)  # ranks join one torch.distributed group
    metrics = group.update(parts)                          # rank r trains on parts[r] (chunk refs)
    weights = group.get_weights()                          # rank 0's weights, an object ref

Each rank reads only its own subset of the shards' chunks, so data ingress grows with the ranks;
gradients and metrics are all-reduced inside the ranks. Loading a state ends with an agreement:
every rank raises the same error.
"""

from __future__ import annotations

import math
from typing import Any

from raysim.actors import Backend, Handle
from raysim.learner.learner import Learner


class LearnerGroup:
    """One or more ``Learner`` ranks behind the interface of a single learner."""

    def __init__(
        self, backend: Backend, ranks: int, options: dict | None = None, start_timeout: float = math.inf, **learner: Any
    ):
        """``ranks`` ``Learner`` actors (Ray actor ``options``), started (a line every few seconds while the
        cluster has no room for them; ``TimeoutError`` after ``start_timeout`` seconds; a rank that dies before
        it starts is replaced meanwhile); ``learner``: ``Learner``'s keyword arguments."""
        if ranks < 1:
            raise ValueError(f"learner.ranks must be >= 1, got {ranks}")
        if ranks > 1 and backend.name == "local":
            raise ValueError("learner.ranks > 1 needs the Ray backend (each rank is its own process)")
        self.backend = backend
        self.snapshots: list[Any] = []  # the last update's snapshot of every rank (futures / object refs)
        self.appended: list[Any] = []  # what the last update appended to every rank's replay buffer (futures)

        def rank(r: int) -> Handle:
            return backend.create(Learner, rank=r, world_size=ranks, options=options, **learner)

        self.handles = [rank(r) for r in range(ranks)]
        try:
            backend.wait_started(self.handles, Learner.policy_version, "learner ranks", start_timeout, replace=rank)
        except TimeoutError:  # none of them is left waiting for room
            for handle in self.handles:
                backend.kill(handle)
            raise
        if ranks > 1:
            host, port = backend.get(self.handles[0].call(Learner.rendezvous_address))
            backend.get([h.call(Learner.join, host, port) for h in self.handles])

    @property
    def ranks(self) -> int:
        return len(self.handles)

    def update(
        self, parts: list[list[Any]], stale_chunks: list[list[Any]] | None = None, log: bool = True, env_steps: int = 0
    ) -> dict[str, float]:
        """One update on all ranks: rank ``r`` trains on ``parts[r]`` (and reports ``stale_chunks[r]``, chunks past
        the lag bound); ``env_steps``: consumed before it (the schedule's clock).

        Returns rank 0's counters (``env_steps`` and ``stale_steps`` summed over the ranks) and, with
        ``log``, the metrics since the last log step, already reduced across the ranks (``Learner.metrics``).
        """
        stale_chunks = stale_chunks or [[] for _ in parts]
        calls = [
            h.call_split(
                Learner.update_and_snapshot,
                [*parts[r], *stale_chunks[r]],  # in a list: each rank reads its chunks itself (raysim.learner.inputs)
                num_stale=len(stale_chunks[r]),
                log=log,
                env_steps=env_steps,
                returns=3,
            )
            for r, h in enumerate(self.handles)
        ]
        try:
            results = self.backend.get([call[0] for call in calls])
        except Exception:  # an error agreed on reaches every rank at once: all are taken here, none logged later
            futures = [future for call in calls for future in call]
            self.backend.wait(futures, len(futures), timeout=1.0)
            self.backend.discard(futures)
            raise
        self.snapshots = [call[1] for call in calls]
        self.appended = [call[2] for call in calls]
        summed = {k: sum(r[k] for r in results) for k in ("env_steps", "stale_steps")}
        return {**results[0], **summed}

    def metrics(self) -> dict[str, float]:
        """The metrics since the last log step, reduced across the ranks (one collective). The ranks' windows
        are empty then: their snapshots are taken again, so a checkpoint never carries a window twice."""
        metrics = self.backend.get([h.call(Learner.metrics) for h in self.handles])[0]
        self.snapshots = [h.call(Learner.snapshot) for h in self.handles]
        return metrics

    def alive(self) -> bool:
        """Whether every rank's process still answers."""
        return all(self.backend.alive(h, Learner.policy_version) for h in self.handles)

    def get_weights(self) -> Any:
        """Rank 0's versioned actor weights (a future / object ref; every rank holds the same)."""
        return self.handles[0].call(Learner.get_weights)

    def restore_replay(self, segments: list[list[Any]]) -> None:
        """Every rank refills its replay buffer from its own saved segments (``segments[r]``, in order)."""
        self.backend.get([h.call(Learner.restore_replay, segments[r]) for r, h in enumerate(self.handles)])

    def load_state(self, state: dict[str, Any]) -> None:
        """Every rank restores ``state`` (moved to the cluster once); a failure on any rank is raised by all."""
        shared = self.backend.put(state)
        self.backend.get([h.call(Learner.load_state, shared) for h in self.handles])


def combined(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """One checkpoint state from every rank's ``Learner.snapshot`` (rank 0 first)."""
    return {**snapshots[0], "ranks": snapshots[1:]}
