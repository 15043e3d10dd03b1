"""``Collector``: the training shards' chunks of each iteration, collected ahead of the learner.

    collector = Collector(backend, config, roles, plan, ranks=2)
    collector.reset()                                  # the shards' states as they are; nothing in flight
    collected = collector.collect(weights, version, plan)  # futures: the driver reads receipts only
    learner.update(collected.parts, collected.stale_chunks)
    collected = collector.recollect(collected, lost)   # after ChunksLost: those chunks collected again
    collector.grow()                                   # elastic: shards for the room the cluster has now

The invariant. Let ``L`` be ``algo.max_policy_lag``, ``R`` the learner ranks, ``v`` the version given to
``collect``. A shard runs its collections in order, and after ``collect`` tops it up it has ``L + 1``
queued, each acting with the weights that were current when it was queued (version ``u``). A chunk is
*within the bound* when ``v - u <= L``, else *stale*. Shard ``i`` (its index in ``roles.shards`` when
``collect`` is called) belongs to rank ``i % R``, and ``collect`` takes from its queue:

- into ``parts[i % R]`` (shards in ascending order): its oldest chunk within the bound, once it arrived.
  Every shard's, when ``shards.wait_fraction`` is 1; below 1, only those of the first
  ``ceil(wait_fraction * n)`` (at least one) to arrive of the rank's ``n`` shards that have one queued;
- into ``stale_chunks[i % R]``: the chunks queued before that one (stale; arrived, as they ran first),
  and, with ``wait_fraction`` below 1, the stale chunks at the head of its queue that arrived already;
- nothing else: its other chunks stay queued, in order, for later batches.

So every chunk is taken once, trained on or reported stale. A shard that dies is replaced, and the
replacement collects the shard's queued chunks within the bound again, each with the weights it was
queued with (in fresh episodes: the shard's state died with it); its stale chunks are lost with it.
Elastic, with no room for a replacement, the shard is removed, with its chunks, when the call returns:
the shards after it move down one index, each keeping its identity (``Roles.ids``: its seed, its policy server),
which a replacement takes too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from raysim.actors import Backend, InputLost, cause, describe
from raysim.config import Config, shards_awaited
from raysim.coordinator.roles import Roles, create_shard, shard_request, start_shard
from raysim.learner.inputs import ChunksLost
from raysim.rollout import Collection, EnvShard
from raysim.rollout.server import PolicyServer, ServerLost


@dataclass(eq=False)
class Launch:
    """One collection queued on a shard: the weights it acts with (policy ``version``) and its futures (none
    before it is launched)."""

    weights: Any
    version: int
    plan: Collection
    chunk: Any = None
    receipt: Any = None
    state: Any = None  # the shard's state right after this chunk
    key: Any = None  # policy servers: the key of the weights its shard's server loaded for it (a future)


@dataclass(eq=False)
class Lane:
    """One training shard's collections, oldest first, and its state after the last chunk taken (a future).
    ``removed``: the shard is gone and is not replaced (elastic, no room); it leaves when the call returns."""

    queue: deque[Launch]
    state: Any = None
    removed: bool = False

    def take(self) -> Launch:
        """The oldest collection, out of the queue; the shard's state is now the one after it."""
        launch = self.queue.popleft()
        self.state = launch.state
        return launch

    def futures(self) -> list[Any]:
        """The futures of every queued collection."""
        return [f for launch in self.queue for f in (launch.chunk, launch.receipt, launch.state) if f is not None]


@dataclass(frozen=True)
class Collected:
    """An iteration's chunks, per learner rank ``r``: ``trained[r]``, the collections to train on with the lane
    of the shard of each, in shard order; ``stale_chunks[r]``, chunks past the lag bound (futures), reported
    (env steps, episodes), not trained on."""

    trained: list[list[tuple[Lane, Launch]]]
    stale_chunks: list[list[Any]]

    @property
    def parts(self) -> list[list[Any]]:
        """Each rank's chunks to train on (futures)."""
        return [[launch.chunk for _, launch in rank] for rank in self.trained]

    @property
    def versions(self) -> list[int]:
        """The policy version that acted each chunk to train on."""
        return [launch.version for rank in self.trained for _, launch in rank]


class Collector:
    """Drives the training shards of ``roles``: it queues their collections, takes their chunks into batches
    (the module's invariant) and replaces, adds or removes shards through ``roles``."""

    def __init__(self, backend: Backend, config: Config, roles: Roles, plan: Collection, ranks: int = 1):
        self.backend, self.config, self.roles, self.plan, self.ranks = backend, config, roles, plan, ranks
        self.lag = config.algo.max_policy_lag
        self.wait_fraction = config.shards.wait_fraction
        self.faults = 0  # shards replaced after their process died, in this process (``shards.max_restarts``)
        self.generation = 0  # shards started after the first ones (the run state's ``shards_started``, then ours)
        self.next_index = config.shards.count  # elastic: the index (and seed) of the next new shard
        self.version = 0  # the learner's version at the batch being formed
        self.lanes = [Lane(deque()) for _ in roles.shards]  # lanes[i]: roles.shards[i]'s
        self._served: tuple[Any, dict] = (None, {})  # policy servers: the newest weights, each server's key of them

    @property
    def states(self) -> list[Any]:
        """Each shard's state after its last chunk taken (futures), in shard order."""
        return [lane.state for lane in self.lanes]

    def collect(self, weights: Any, version: int, plan: Collection | None = None) -> Collected:
        """The next batch (the module's invariant) at learner ``version``: stale chunks that arrived are reported
        (``wait_fraction`` below 1), every queue is topped up with collections acting with ``weights`` as ``plan``
        says (default: the collector's), then the chunks to train on are awaited and taken. A shard that dies
        meanwhile is replaced or removed."""
        self.version = version
        plan = self.plan if plan is None else plan
        trained: list[list[tuple[Lane, Launch]]] = [[] for _ in range(self.ranks)]
        stale: list[list[Any]] = [[] for _ in range(self.ranks)]
        if self.wait_fraction < 1:
            self._take_arrived_stale(stale)
        self._top_up(weights, version, plan)
        for i in self._wait_all() if self.wait_fraction >= 1 else self._wait_first():
            rank, lane = i % self.ranks, self.lanes[i]
            for _ in range(self._target(lane)):  # queued before the chunk to train on: stale, and arrived
                stale[rank].append(lane.take().chunk)
            trained[rank].append((lane, lane.take()))
        self._remove_gone()
        return Collected(trained, stale)

    def recollect(self, collected: Collected, error: ChunksLost) -> Collected:
        """``collected`` without the chunks lost with their node before the learner read them
        (``error.positions[r]``: positions in rank r's trained, then stale chunks): each lost chunk to train on
        is collected again by a replacement of its shard, with the weights it was collected with (in fresh
        episodes), or left out when the shard is removed (elastic, no room); a lost stale chunk is left out."""
        trained, stale = [], []
        for rank, positions in enumerate(error.positions):
            lost, count = set(positions), len(collected.trained[rank])
            stale.append([c for p, c in enumerate(collected.stale_chunks[rank]) if count + p not in lost])
            kept = []
            for p, (lane, launch) in enumerate(collected.trained[rank]):
                again = self._collect_again(lane, launch, error) if p in lost else launch
                if again is not None:
                    kept.append((lane, again))
            trained.append(kept)
        self._remove_gone()
        return Collected(trained, stale)

    def reset(self) -> None:
        """Drop every collection in flight (the shards start now, or were set to an earlier state: they collect
        anew) and take every shard's state as it is (a checkpoint's, until a chunk of it is taken)."""
        self.backend.discard([f for lane in self.lanes for f in lane.futures()])
        self._remove_gone()
        self.lanes = [Lane(deque(), shard.call(EnvShard.get_state)) for shard in self.roles.shards]

    def grow(self) -> None:
        """Elastic shards: at an iteration boundary, add shards for the room the cluster has now.

        The iteration's batch is then (current shards) x ``env.num_envs`` x ``algo.num_steps``: it
        grows and shrinks with the cluster, and the run stops once ``train.total_steps`` env steps
        were collected.
        """
        config = self.config
        add = min(self.backend.room_for(shard_request(config)), config.shards.max - len(self.lanes))
        new = [
            create_shard(
                self.backend,
                config,
                self.next_index + k,
                generation=self.generation + 1 + k,
                teacher=self.roles.teacher,
                servers=self.roles.servers,
            )
            for k in range(add)
        ]
        if not new:
            return
        self.generation += len(new)  # after a resume, shards added again play episodes none before them played
        self.roles.add_shards(new, list(range(self.next_index, self.next_index + len(new))))
        self.next_index += len(new)
        self.lanes = [*self.lanes, *(Lane(deque(), shard.call(EnvShard.get_state)) for shard in new)]
        print(f"raysim: elastic: added {len(new)} shard(s) for new capacity; {len(self.lanes)} shards now", flush=True)

    # -- the steps of a batch ------------------------------------------------------------------

    def _take_arrived_stale(self, stale: list[list[Any]]) -> None:
        """Report the stale chunks at the head of each shard's queue that arrived already: a late shard catches
        up to the bound (``wait_fraction`` below 1)."""
        for i, lane in enumerate(self.lanes):
            while lane.queue and not self._within_bound(lane.queue[0]) and self._ready(lane.queue[0]):
                if self._arrived(i, 0):  # else the shard died: a replacement queues only chunks within the bound
                    stale[i % self.ranks].append(lane.take().chunk)

    def _top_up(self, weights: Any, version: int, plan: Collection) -> None:
        """Queue collections acting with ``weights`` (``version``) as ``plan`` says until every shard has ``L + 1``."""
        for i, lane in enumerate(self.lanes):
            while not lane.removed and len(lane.queue) <= self.lag:
                lane.queue.append(self._launch(i, Launch(weights, version, plan)))

    def _wait_all(self) -> list[int]:
        """Every shard, in order, once its chunk to train on arrived."""
        for i in range(len(self.lanes)):
            self._await_target(i)
        return [i for i, lane in enumerate(self.lanes) if not lane.removed]

    def _wait_first(self) -> list[int]:
        """Per rank, the shards that were first to deliver their chunk to train on (``_first_ready``), in order;
        when one of them died (replaced or removed), the rank chooses again."""
        chosen = []
        for rank in range(self.ranks):
            ready = self._first_ready(rank)
            while not all(self._arrived(i, self._target(self.lanes[i])) for i in ready):
                ready = self._first_ready(rank)
            chosen += ready
        return sorted(chosen)

    def _first_ready(self, rank: int) -> list[int]:
        """The first ``ceil(wait_fraction * n)`` (at least one) of the ``n`` shards of ``rank`` with a chunk within
        the bound whose chunk is ready (arrived, or failed: its shard died)."""
        mine = [i for i, lane in enumerate(self.lanes) if i % self.ranks == rank and not lane.removed]
        mine = [i for i in mine if self._target(self.lanes[i]) is not None]
        if not mine:
            raise RuntimeError(f"learner rank {rank} has no shard collecting within algo.max_policy_lag")
        need = shards_awaited(len(mine), self.wait_fraction)
        receipts = [self.lanes[i].queue[self._target(self.lanes[i])].receipt for i in mine]
        return [mine[j] for j in self.backend.wait(receipts, need)]

    def _collect_again(self, lane: Lane, launch: Launch, error: Exception) -> Launch | None:
        """``launch``'s chunk, lost with its shard's node, collected again first by the shard's replacement;
        None when the shard is removed instead (elastic, no room)."""
        i = self.lanes.index(lane)
        self.backend.kill(self.roles.shards[i])  # what it collected is gone with its node
        lane.queue.appendleft(Launch(launch.weights, launch.version, launch.plan))
        self._recover(i, error, "lost its chunk with its node before the learner read it")
        self._await_target(i)  # the chunk again: the oldest within the bound
        return None if lane.removed else lane.take()

    # -- one shard ---------------------------------------------------------------------------------

    def _target(self, lane: Lane) -> int | None:
        """The position in ``lane``'s queue of its oldest chunk within the bound (None: it has none)."""
        return next((j for j, launch in enumerate(lane.queue) if self._within_bound(launch)), None)

    def _within_bound(self, launch: Launch) -> bool:
        return self.version - launch.version <= self.lag

    def _ready(self, launch: Launch) -> bool:
        """Whether ``launch``'s receipt is ready now (arrived, or failed), without waiting."""
        return bool(self.backend.wait([launch.receipt], 1, 0))

    def _launch(self, i: int, launch: Launch) -> Launch:
        """``launch`` (its weights and plan) queued on shard ``i``'s actor: a new ``Launch`` with its futures. With
        policy servers the shard's server loads the weights first and the shard receives their key."""
        servers, key, weights = self.roles.servers, None, launch.weights
        if servers is not None:  # the server the shard asks: by its identity, which elastic removals do not move
            key = weights = self._key(servers.of(self.roles.ids[i]), weights)
        futures = self.roles.shards[i].call_split(EnvShard.collect, weights, launch.plan, returns=3)
        return Launch(launch.weights, launch.version, launch.plan, *futures, key)

    def _await_target(self, i: int) -> None:
        """Wait until shard ``i``'s chunk to train on arrived, from a replacement when the shard dies (as often as
        it does), or the shard is removed."""
        lane = self.lanes[i]
        while not lane.removed and not self._arrived(i, self._target(lane)):
            pass  # the shard died and was replaced: the replacement collects the chunk again

    def _arrived(self, i: int, position: int) -> bool:
        """Wait for the receipt of the chunk at ``position`` in shard ``i``'s queue: whether it arrived. False:
        the shard died meanwhile and was recovered (``_recover``: replaced, or marked removed)."""
        lane = self.lanes[i]
        try:
            self.backend.get(lane.queue[position].receipt)
            return True
        except Exception as error:
            if isinstance(cause(error), ServerLost):
                self._server_lost(i, error)
                return False
            if not self.backend.is_actor_failure(error):
                self.backend.discard(lane.futures())
                raise
            if self._key_lost(lane.queue[position]):  # the shard never began: its server died before loading
                self._server_lost(i, error)
                return False
            self._recover(i, error)
            return False

    def _key(self, server: int, weights: Any) -> Any:
        """The key of ``weights`` on policy server ``server`` (a future): loaded once per server and version, the
        shards of the server share it (a server's replacement loads them again)."""
        handle = self.roles.servers.handles[server]
        if self._served[0] is not weights:
            self._served = (weights, {})
        keys = self._served[1]
        if server not in keys or keys[server][0] is not handle:
            keys[server] = (handle, handle.call(PolicyServer.load, weights))
        return keys[server][1]

    def _key_lost(self, launch: Launch) -> bool:
        """Whether ``launch``'s policy server died before it loaded the weights (then its shard could not begin)."""
        if launch.key is None:
            return False
        try:
            self.backend.get(launch.key)
            return False
        except Exception as error:
            if self.backend.is_actor_failure(error):
                return True
            raise

    def _server_lost(self, i: int, error: Exception) -> None:
        """Shard ``i``'s policy server died while it collected (or before, its key never came): a new server in its
        place (unless another shard's loss replaced it already), its shards told (evaluation shards too), and shard
        ``i``'s collections queued again with their weights (a shard that was collecting dropped the chunk in flight
        and started fresh episodes: ``EnvShard.collect``)."""
        lane = self.lanes[i]
        self.backend.discard(lane.futures())
        self.roles.servers.recover(self.roles.served(), describe(error))
        kept = [launch for launch in lane.queue if self._within_bound(launch)]
        lane.queue = deque(self._launch(i, launch) for launch in kept)

    def _recover(self, i: int, error: Exception, why: str = "died during its rollout") -> None:
        """Shard ``i`` is gone (``why``): a replacement queues its chunks within the bound again, each with the
        weights it was queued with; elastic without room for one, the shard is marked removed.

        Raises ``InputLost`` when the shard still answers (it could not read the learner's weights, lost with
        the learner: every collection in flight is dropped), ``RuntimeError`` once ``shards.max_restarts`` are
        used up.
        """
        lane, config = self.lanes[i], self.config
        self.backend.discard(lane.futures())
        if self.backend.alive(self.roles.shards[i], EnvShard.spaces):
            self.reset()
            raise InputLost(f"shard {i} could not read the learner's weights: {error}") from error
        if self._no_room_for_replacement():
            live = sum(not other.removed for other in self.lanes)
            print(
                f"raysim: elastic: shard {i} was lost with its node and there is no room for a "
                f"replacement; continuing with {live - 1} shards",
                flush=True,
            )
            lane.removed, lane.queue = True, deque()
            return
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
        self.generation += 1
        replacement = start_shard(  # of the lost shard's identity: its server (``Servers.of``)
            self.backend,
            config,
            self.roles.ids[i],
            generation=self.generation,
            teacher=self.roles.teacher,
            servers=self.roles.servers,
        )
        self.roles.replace_shard(i, replacement)
        lane.state = self.roles.shards[i].call(EnvShard.get_state)  # before its first chunk
        kept = [launch for launch in lane.queue if self._within_bound(launch)]
        lane.queue = deque(self._launch(i, launch) for launch in kept)

    def _no_room_for_replacement(self) -> bool:
        """Elastic, above ``shards.count`` shards, and the cluster has no room for another shard now."""
        config, live = self.config, sum(not lane.removed for lane in self.lanes)
        return (
            bool(config.shards.max) and live > config.shards.count and self.backend.room_for(shard_request(config)) < 1
        )

    def _remove_gone(self) -> None:
        """The shards marked removed leave ``roles`` and the lanes; the shards after them move down."""
        gone = {i for i, lane in enumerate(self.lanes) if lane.removed}
        if gone:
            self.roles.remove_shards(gone)
            self.lanes = [lane for lane in self.lanes if not lane.removed]
