"""The ``Collector``'s invariant, driven in-process with fake shards on a simulated clock.

Each fake shard runs its collections in order, each taking ``delay`` time units; a chunk is named by its
shard, the shard's generation (replacements count up) and its place in that actor's queue, and carries
the policy version of the weights it acted with. So a test sees exactly which chunk of which shard went
to which batch and rank, and checks the module's invariant: shard ``i``'s oldest chunk within the lag
bound trains on rank ``i % R``, in shard order; the chunks before it are reported stale; each chunk is
taken once; a shard that dies is replaced and the replacement collects the same chunks with the same
weights; a shard lost without room (elastic) is removed and the shards after it move down.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

import raysim
from raysim.actors import Backend, Handle, method_name
from raysim.coordinator.collector import Collected, Collector
from raysim.coordinator.roles import Roles, create_shard
from raysim.learner.inputs import ChunksLost


class Died(RuntimeError):
    """A fake shard's process died before the result was ready."""


@dataclass(frozen=True)
class Chunk:
    shard: int  # the index it was created with
    generation: int  # 0: the first actor of that index; n: its n-th replacement
    seq: int  # its place in that actor's queue
    version: int  # the policy version of the weights it acted with


@dataclass(eq=False)
class Future:
    value: Any
    shard: FakeShard
    done_at: float


@dataclass(eq=False)
class FakeShard(Handle):
    backend: FakeBackend
    index: int
    generation: int
    delay: float = 1.0
    died_at: float = math.inf
    busy_until: float = 0.0
    seed: int = 0  # what the shard's envs were seeded with
    seq: itertools.count = field(default_factory=itertools.count)

    def call(self, method: Any, *args: Any, **kwargs: Any) -> Future:
        done = self.backend.now if self.backend.now < self.died_at else math.inf  # a dead actor never answers
        return Future(method_name(method), self, done)

    def call_split(self, method: Any, weights: Any, plan: Any, returns: int) -> tuple[Future, ...]:
        assert method_name(method) == "collect" and returns == 3
        self.busy_until = max(self.busy_until, self.backend.now) + self.delay  # an actor runs its calls in order
        chunk = Chunk(self.index, self.generation, next(self.seq), weights)
        self.backend.launched.append(chunk)
        return tuple(Future(value, self, self.busy_until) for value in (chunk, "receipt", ("state", chunk)))


class FakeBackend(Backend):
    """Fake shards on a clock: a wait advances it to when the awaited results are done."""

    name = "fake"

    def __init__(self, room: int = 0):
        self.now, self.room = 0.0, room
        self.created: dict[int, int] = {}
        self.launched: list[Chunk] = []
        self.delays: dict[int, float] = {}  # per shard index, for every actor of it

    def create(self, cls: type, *args: Any, options: dict | None = None, **kwargs: Any) -> FakeShard:
        index = kwargs["shard_index"]
        generation = self.created[index] = self.created.get(index, -1) + 1
        return FakeShard(self, index, generation, self.delays.get(index, 1.0), seed=kwargs["seed"])

    def get(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.get(v) for v in value]
        self.now = max(self.now, min(value.done_at, value.shard.died_at))
        if value.done_at > value.shard.died_at:
            raise Died(f"shard {value.shard.index} died")
        return value.value

    def wait(self, futures: list[Any], count: int, timeout: float | None = None) -> list[int]:
        ends = [min(f.done_at, f.shard.died_at) for f in futures]
        if timeout is not None:
            return [j for j, end in enumerate(ends) if end <= self.now + timeout][:count]
        first = sorted(range(len(futures)), key=lambda j: (ends[j], j))[:count]
        self.now = max([self.now, *(ends[j] for j in first)])
        return sorted(first)

    def kill(self, handle: Any) -> None:
        handle.died_at = min(handle.died_at, self.now)

    def is_actor_failure(self, error: BaseException) -> bool:
        return isinstance(error, Died)

    def room_for(self, request: dict[str, float]) -> int:
        return self.room


def collector_of(*overrides: str, room: int = 0, delays: dict[int, float] | None = None) -> Collector:
    config = raysim.load_config(None, ["backend=local", "env.num_envs=2", *overrides])
    backend = FakeBackend(room)
    backend.delays = delays or {}
    shards = tuple(create_shard(backend, config, i) for i in range(config.shards.count))
    roles = Roles(shards, [], learner=None, max_episode_steps=None, spaces=())
    collector = Collector(backend, config, roles, plan=None, ranks=config.learner.ranks)
    collector.reset()
    return collector


def chunks(parts: list[list[Future]]) -> list[list[Chunk]]:
    return [[future.value for future in rank] for rank in parts]


def check_invariant(collector: Collector, collected: Collected, version: int, shards: tuple) -> None:
    """The module's invariant for one batch: ``shards`` were ``roles.shards`` when ``collect`` was called."""
    lag, ranks = collector.lag, collector.ranks
    for rank, part in enumerate(chunks(collected.parts)):
        owners = [index_of(shards, c) for c in part]
        assert owners == sorted(owners) and all(i % ranks == rank for i in owners)  # shard order, rank i % R
        assert all(version - c.version <= lag for c in part)  # within the bound
    for rank, stale in enumerate(chunks(collected.stale_chunks)):
        assert all(version - c.version > lag for c in stale)  # past the bound
        assert all(index_of(shards, c) % ranks == rank for c in stale)


def index_of(shards: tuple, chunk: Chunk) -> int:
    """The index in ``shards`` of the shard that collected ``chunk``."""
    return next(i for i, s in enumerate(shards) if (s.index, s.generation) == (chunk.shard, chunk.generation))


def test_lockstep_batches_take_every_shards_next_chunk_in_shard_order_shard_i_on_rank_i_mod_r():
    collector = collector_of("shards.count=4", "learner.ranks=2")
    for version in range(3):
        collected = collector.collect(version, version)
        assert chunks(collected.parts) == [
            [Chunk(0, 0, version, version), Chunk(2, 0, version, version)],
            [Chunk(1, 0, version, version), Chunk(3, 0, version, version)],
        ]
        assert collected.stale_chunks == [[], []] and collected.versions == [version] * 4
        assert [state.value for state in collector.states] == [
            ("state", Chunk(i, 0, version, version)) for i in range(4)
        ]


def test_with_lag_l_a_shard_keeps_l_plus_1_collections_queued_and_trains_each_chunk_at_most_l_versions_late():
    collector = collector_of("shards.count=2", "algo.max_policy_lag=2")
    taken = []
    for version in range(6):
        collected = collector.collect(version, version)
        assert [len(lane.queue) for lane in collector.lanes] == [2, 2]  # L + 1 queued, one taken
        taken += chunks(collected.parts)[0]
    assert [c.seq for c in taken if c.shard == 0] == list(range(6))  # in order, each once
    assert [c.version for c in taken if c.shard == 0] == [0, 0, 0, 1, 2, 3]  # the first L act with version 0


@pytest.mark.parametrize("seed", range(6))
def test_first_to_arrive_batches_hold_the_invariant_and_take_every_chunk_once(seed):
    rng = random.Random(seed)
    delays = {i: rng.choice([1.0, 1.0, 2.5, 7.0]) for i in range(4)}
    collector = collector_of(
        "shards.count=4", "learner.ranks=2", "shards.wait_fraction=0.5", "algo.max_policy_lag=1", delays=delays
    )
    taken: list[Chunk] = []
    for version in range(12):
        shards = collector.roles.shards
        collected = collector.collect(version, version)
        check_invariant(collector, collected, version, shards)
        parts, stale = chunks(collected.parts), chunks(collected.stale_chunks)
        assert [len(part) for part in parts] == [1, 1]  # ceil(0.5 x 2) shards of each rank
        taken += [c for rank in stale + parts for c in rank]  # a shard's stale chunks ran before its trained one
    queued = [launch.chunk.value for lane in collector.lanes for launch in lane.queue]
    assert sorted(taken + queued, key=str) == sorted(collector.backend.launched, key=str)  # each chunk once
    for shard in range(4):  # a shard's chunks are taken in the order it collected them
        seqs = [c.seq for c in taken if c.shard == shard]
        assert seqs == sorted(seqs)


def test_a_late_shards_chunks_past_the_bound_are_reported_stale_once_they_arrived():
    collector = collector_of(
        "shards.count=2", "shards.wait_fraction=0.5", "algo.max_policy_lag=1", delays={0: 1.0, 1: 3.0}
    )
    batches = [collector.collect(v, v) for v in range(6)]
    assert [[c.shard for c in chunks(b.parts)[0]] for b in batches] == [[0]] * 6  # shard 1 is slow
    stale = [c for b in batches for c in chunks(b.stale_chunks)[0]]
    assert stale and all(c.shard == 1 for c in stale)
    assert [c.seq for c in stale] == list(range(len(stale)))  # in order, each once


def test_a_shard_that_dies_is_replaced_and_the_replacement_collects_its_chunks_again_with_the_same_weights(capsys):
    collector = collector_of("shards.count=2", "algo.max_policy_lag=1")
    collector.collect("w0", 0)
    before = collector.roles.shards
    collector.backend.kill(before[1])  # dies with its two queued collections
    collected = collector.collect("w1", 1)
    assert chunks(collected.parts) == [[Chunk(0, 0, 1, "w0"), Chunk(1, 1, 0, "w0")]]  # the same weights
    assert collector.roles.shards[1].generation == 1 and collector.roles.shards[0] is before[0]
    assert before[1].generation == 0  # the tuple read before is unchanged: a new one replaced it
    assert [launch.chunk.value for launch in collector.lanes[1].queue] == [Chunk(1, 1, 1, "w1")]
    assert collector.faults == 1 and "fault: shard 1 died during its rollout" in capsys.readouterr().out


def test_an_elastic_shard_lost_without_room_is_removed_and_the_shards_after_it_move_down(capsys):
    collector = collector_of("shards.count=2", "shards.max=4", "learner.ranks=2", room=1)
    collector.grow()
    assert len(collector.roles.shards) == 3 and collector.next_index == 3
    collector.collect("w0", 0)
    collector.backend.room = 0
    collector.backend.kill(collector.roles.shards[1])
    collected = collector.collect("w1", 1)  # shard 1 is gone: shards 0 and 2 of this batch
    assert chunks(collected.parts) == [[Chunk(0, 0, 1, "w1"), Chunk(2, 0, 1, "w1")], []]
    assert [s.index for s in collector.roles.shards] == [0, 2] and len(collector.lanes) == 2
    assert "continuing with 2 shards" in capsys.readouterr().out
    collected = collector.collect("w2", 2)  # the shard created as 2 is index 1 now: rank 1's
    assert chunks(collected.parts) == [[Chunk(0, 0, 2, "w2")], [Chunk(2, 0, 2, "w2")]]


def test_shards_added_after_a_resume_play_episodes_no_shard_added_before_them_played():
    """An elastic shard's seed takes the run's count of shards started (``RunState.shards_started``), as a
    replacement's does: the shard added as index 2 after a resume is not the one added as index 2 before."""
    first = collector_of("shards.count=2", "shards.max=3", room=1)
    first.grow()
    resumed = collector_of("shards.count=2", "shards.max=3", room=1)
    resumed.generation = first.generation  # what Trainer restores from the checkpoint's run state
    resumed.grow()
    before, after = first.roles.shards[2], resumed.roles.shards[2]
    assert before.index == after.index == 2 and before.seed != after.seed
    assert len({s.seed for s in [*first.roles.shards, after]}) == 4


def test_recollect_collects_lost_chunks_again_and_leaves_out_lost_stale_ones():
    collector = collector_of(
        "shards.count=2", "shards.wait_fraction=0.5", "algo.max_policy_lag=1", delays={0: 1.0, 1: 3.0}
    )
    collected = next(c for v in range(6) if (c := collector.collect(v, v)).stale_chunks[0])
    trained, stale = chunks(collected.parts)[0], chunks(collected.stale_chunks)[0]
    again = collector.recollect(collected, ChunksLost([[0, 1]]))  # the trained chunk and the first stale one
    assert chunks(again.stale_chunks)[0] == stale[1:]
    [chunk] = chunks(again.parts)[0]
    assert (chunk.shard, chunk.generation, chunk.version) == (trained[0].shard, 1, trained[0].version)
    assert chunks(collected.parts)[0] == trained  # the batch given is unchanged
