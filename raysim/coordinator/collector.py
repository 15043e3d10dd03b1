"""``Collector``: the shards' chunks of each iteration, collected ahead of the learner (overlap), with dead
shards replaced, elastic growth and, optionally, batches of the first chunks to arrive.

collector = Collector(backend, config, roles.shards, plan, ranks=2)
batch = collector.collect(weights, version)   # futures the learner resolves; the driver reads receipts only
learner.update(batch.parts, stale=batch.stale)
collector.grow()                               # elastic shards: add what the cluster has room for

Each shard keeps ``algo.max_policy_lag + 1`` collections queued (a Ray actor runs its calls in order):
with lag 0 a shard collects only after the update it waits for (lockstep); with lag L it collects the
next L chunks with the weights it has while the learner updates, so a chunk reaches an update at most
L policy versions after the weights that acted. With ``shards.first_arrived`` below 1, each learner
rank's batch is the first chunks to arrive from its own shards; a late chunk joins a later batch, or,
past the lag bound, only its env steps and episodes are reported (``stale``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from raysim.actors import Backend, Handle, InputLost
from raysim.config import Config
from raysim.coordinator.roles import create_shard, shard_request, start_shard
from raysim.learner.inputs import ChunksLost
from raysim.rollout import Collection, EnvShard


@dataclass
class Launch:
    """One collection in flight on a shard: its futures and the policy version of the weights it acts with."""

    weights: Any
    version: int
    chunk: Any = None
    receipt: Any = None
    state: Any = None  # the shard's state right after this chunk


@dataclass
class Batch:
    """An iteration's chunks: ``parts[r]`` learner rank r's (futures), ``stale[r]`` its chunks past the lag
    bound (reported, not trained), the policy version each trained chunk was collected with, and for each
    of ``parts[r]`` the index of its shard and its collection (``origins[r]``)."""

    parts: list[list[Any]]
    stale: list[list[Any]]
    versions: list[int] = field(default_factory=list)
    origins: list[list[tuple[int, Launch]]] = field(default_factory=list)


class Collector:
    """Drives the training shards (``shards`` is the roles' list, changed in place)."""

    def __init__(self, backend: Backend, config: Config, shards: list[Handle], plan: Collection, ranks: int = 1):
        self.backend, self.config, self.shards, self.plan, self.ranks = backend, config, shards, plan, ranks
        self.lag = config.algo.max_policy_lag
        self.first_arrived = config.shards.first_arrived
        self.faults = 0  # shards replaced after their process died
        self.next_index = config.shards.count  # elastic: the index (and seed) of the next new shard
        self.queues: list[deque[Launch]] = [deque() for _ in shards]
        self.version = 0  # the learner's version at the batch being formed
        self.states: list[Any] = [None] * len(shards)  # each shard's state after its last chunk taken (futures)

    def collect(self, weights: Any, version: int) -> Batch:
        """The next batch: every shard's oldest queued chunk (or, with ``shards.first_arrived``, the first to
        arrive), after topping every queue up with collections that act with ``weights`` (``version``).

        A shard whose process died (killed, node lost) is replaced and its queued chunks collected again,
        so the batch has its configured size and nothing is counted twice.
        """
        self.version = version
        ranks = range(self.ranks)
        batch = Batch([[] for _ in ranks], [[] for _ in ranks], origins=[[] for _ in ranks])
        self._take_stale(batch)
        for i, queue in enumerate(self.queues):
            while len(queue) <= self.lag:
                queue.append(self._launch(i, Launch(weights, version)))
        taken = self._wait_all() if self.first_arrived >= 1 else self._wait_first()
        for i in taken:
            rank, target = i % self.ranks, self._target(i)
            for _ in range(target):  # finished before the target (an actor runs its calls in order)
                self._pop(i, batch.stale[rank])
            launch = self._pop(i, batch.parts[rank])
            batch.origins[rank].append((i, launch))
            batch.versions.append(launch.version)
        return batch

    def recollect(self, batch: Batch, error: ChunksLost) -> None:
        """Chunks of ``batch`` lost with their node before the learner read them (``error.positions[r]``: their
        positions in rank r's trained, then stale chunks). Each trained one is collected again, with the weights
        it was collected with, by its shard's replacement (fresh episodes: the shard's state is lost too), so
        the batch keeps its size; a lost stale chunk is dropped (it was to be reported only)."""
        again = []
        for rank, positions in enumerate(error.positions):
            trained = len(batch.parts[rank])
            for p in sorted(positions, reverse=True):
                if p >= trained:
                    del batch.stale[rank][p - trained]
                else:
                    again.append((batch.origins[rank][p][0], rank, p))
        for i, rank, p in sorted(again, reverse=True):  # the highest shard first: a shard dropped moves none of them
            launch = batch.origins[rank][p][1]
            self.backend.kill(self.shards[i])  # what it collected is gone with its node: it is replaced
            self.queues[i].appendleft(Launch(launch.weights, launch.version))
            if self._restart(i, error, "lost its chunk with its node before the learner read it"):
                if self._received(i, 0) is not None:
                    batch.parts[rank][p] = self._pop(i, []).chunk
                    batch.origins[rank][p] = (i, launch)
                    continue
            del batch.parts[rank][p], batch.origins[rank][p]  # elastic, no room: the batch is smaller

    def _pop(self, i: int, into: list[Any]) -> Launch:
        """Shard ``i``'s oldest chunk, taken into ``into``; the shard's state is now the one after it."""
        launch = self.queues[i].popleft()
        self.states[i] = launch.state
        into.append(launch.chunk)
        return launch

    def _take_stale(self, batch: Batch) -> None:
        """Finished chunks of a late shard that are past the lag bound now: reported, not trained (first-arrived
        batches only; the shard collects within the bound again)."""
        i = 0
        while self.first_arrived < 1 and i < len(self.shards):
            queue = self.queues[i]
            if queue and self.version - queue[0].version > self.lag and self.backend.wait([queue[0].receipt], 1, 0):
                if self._received(i, 0) is not None and self.queues[i] is queue:  # neither dropped nor replaced
                    self._pop(i, batch.stale[i % self.ranks])
                continue  # the same index again: its next chunk, its replacement, or the next shard
            i += 1

    def reset(self) -> None:
        """Drop every collection in flight (the shards start now or were set to an earlier state: they collect
        anew) and take every shard's state as it is (a checkpoint's, until a chunk of it is taken)."""
        self.backend.discard([f for q in self.queues for launch in q for f in (launch.chunk, launch.receipt)])
        self.queues = [deque() for _ in self.shards]
        self.states = [s.call(EnvShard.get_state) for s in self.shards]

    def grow(self) -> None:
        """Elastic shards: at an iteration boundary, add shards for the room the cluster has now.

        The iteration's batch is then (current shards) x ``env.num_envs`` x ``algo.num_steps``: it
        grows and shrinks with the cluster, and the run stops once ``train.total_steps`` env steps
        were collected.
        """
        config = self.config
        add = min(self.backend.room_for(shard_request(config)), config.shards.max - len(self.shards))
        for _ in range(add):
            shard = create_shard(self.backend, config, self.next_index)
            self.shards.append(shard)
            self.queues.append(deque())
            self.states.append(shard.call(EnvShard.get_state))
            self.next_index += 1
        if add > 0:
            print(f"raysim: elastic: added {add} shard(s) for new capacity; {len(self.shards)} shards now", flush=True)

    # -- waiting for chunks --------------------------------------------------------------------

    def _target(self, i: int) -> int | None:
        """The index of shard ``i``'s oldest queued chunk within the lag bound (None: none is)."""
        fresh = (j for j, launch in enumerate(self.queues[i]) if self.version - launch.version <= self.lag)
        return next(fresh, None)

    def _wait_all(self) -> list[int]:
        """Every shard, once its chunk to train on arrived, in shard order (dead shards replaced)."""
        i = 0
        while i < len(self.shards):
            if self._received(i, self._target(i)) is None:  # dropped: the same index is the next shard now
                continue
            i += 1
        return list(range(len(self.shards)))

    def _wait_first(self) -> list[int]:
        """Per learner rank, the first ``shards.first_arrived`` of its shards whose chunk to train on arrived."""
        while True:
            taken: list[int] = []
            for rank in range(self.ranks):
                mine = [i for i in range(len(self.shards)) if i % self.ranks == rank and self._target(i) is not None]
                if not mine:
                    raise RuntimeError(f"learner rank {rank} has no shard collecting within algo.max_policy_lag")
                need = min(len(mine), max(1, math.ceil(self.first_arrived * len(mine))))
                receipts = [self.queues[i][self._target(i)].receipt for i in mine]
                ready = [mine[j] for j in self.backend.wait(receipts, need)]
                if any(self._received(i, self._target(i)) is None for i in ready):
                    break  # a shard was dropped: the indices moved, choose again
                taken += ready
            else:
                return sorted(taken)

    def _received(self, i: int, j: int) -> bool | None:
        """Wait for the receipt of shard ``i``'s queued chunk ``j``: True; the shard died and was replaced: its
        chunks within the lag bound relaunched, True once received; dropped (elastic, no room): None."""
        while True:
            try:
                self.backend.get(self.queues[i][j].receipt)
                return True
            except Exception as error:
                if not self.backend.is_actor_failure(error):
                    self.backend.discard([f for launch in self.queues[i] for f in (launch.chunk, launch.receipt)])
                    raise
                if not self._restart(i, error):
                    return None
                if not self.queues[i]:
                    return True
                j = 0  # every relaunched chunk is within the bound

    def _restart(self, i: int, error: Exception, why: str = "died during its rollout") -> bool:
        """Shard ``i`` is gone (``why``): its replacement collects its queued chunks within the lag bound again
        (True), or, elastic without room for one, it is dropped (False)."""
        queue = self.queues[i]
        self.backend.discard([f for launch in queue for f in (launch.chunk, launch.receipt) if f is not None])
        try:
            replaced = self._replace(i, error, why)
        except InputLost:  # the weights are lost with the learner: every chunk in flight too
            self.reset()
            raise
        if not replaced:
            del self.queues[i], self.states[i]
            return False
        self.states[i] = self.shards[i].call(EnvShard.get_state)  # before its first chunk
        fresh = [old for old in queue if self.version - old.version <= self.lag]
        self.queues[i] = deque(self._launch(i, Launch(old.weights, old.version)) for old in fresh)
        return True

    def _launch(self, i: int, launch: Launch) -> Launch:
        launch.chunk, launch.receipt, launch.state = self.shards[i].call_split(
            EnvShard.collect, launch.weights, self.plan, returns=3
        )
        return launch

    def _replace(self, i: int, error: Exception, why: str) -> bool:
        """Shard ``i`` died (``why``): replace it (True), or drop it when elastic and there is no room (False)."""
        config = self.config
        if self.backend.alive(self.shards[i], EnvShard.spaces):  # the shard is fine: its input, the weights, is lost
            raise InputLost(f"shard {i} could not read the learner's weights: {error}") from error
        if (
            config.shards.max
            and len(self.shards) > config.shards.count
            and self.backend.room_for(shard_request(config)) < 1
        ):
            print(
                f"raysim: elastic: shard {i} was lost with its node and there is no room for a "
                f"replacement; continuing with {len(self.shards) - 1} shards",
                flush=True,
            )
            del self.shards[i]
            return False
        self.faults += 1
        if self.faults > config.shards.max_restarts:
            raise RuntimeError(
                f"shard {i} died and {config.shards.max_restarts} shard restarts are used up "
                f"(shards.max_restarts): {error}"
            ) from error
        print(
            f"raysim: fault: shard {i} {why} ({type(error).__name__}); "
            f"replaced it, collecting its part of the iteration again",
            flush=True,
        )
        self.shards[i] = start_shard(self.backend, config, i, generation=self.faults)
        return True
