"""``Session``: the live state of one ``Trainer.train`` call; ``Ready``: its last completed iteration.

A session is opened once the run's roles stand and its starting point is known (a new run's, or a
checkpoint's), and it is the one object the trainer's steps change: the loop (``trainer.py``),
saving (``saving.py``), evaluations (``training_eval.py``) and learner restarts and rewinds
(``recovery.py``). Between iterations: ``ready`` is the last completed iteration, ``first.iteration <=
ready.state.iteration``, and ``weights`` are the learner's weights of ``ready``'s policy version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from raysim.actors import Backend, cause
from raysim.algos import algorithm_class
from raysim.checkpoint import Checkpoint, Checkpoints
from raysim.config import Config, to_dict
from raysim.coordinator.collector import Collector
from raysim.coordinator.phases import PhaseClock
from raysim.coordinator.replay import ReplayLog
from raysim.coordinator.roles import Roles
from raysim.coordinator.run_state import RunState
from raysim.coordinator.schedule import planned_iterations
from raysim.coordinator.signals import StopSignals
from raysim.evaluation import EvalReport
from raysim.learner.group import combined
from raysim.metrics import SinkSet, make_sinks
from raysim.storage import RunStorage


@dataclass
class Ready:
    """The last completed iteration: its run state and the learner's and shards' states, not fetched yet.

    They were taken right after the iteration's update and collection and wait in the object store, so a
    checkpoint of this iteration needs no learner (it may be busy, or dead) and takes one fetch.
    """

    state: RunState
    learner: list[Any] = field(default_factory=list)  # every rank's ``Learner.snapshot`` (futures)
    shards: list[Any] = field(default_factory=list)  # every shard's ``EnvShard.get_state`` (futures)
    loaded: dict[str, Any] | None = None  # or: a checkpoint's whole state, as loaded
    saved: Checkpoint | None = None  # its checkpoint, once written

    def fetch(self, backend: Backend) -> dict[str, Any]:
        """The checkpoint state of this iteration: every learner rank's part and every shard's state.

        A shard's state lost with its node (as a chunk can be) is None, said in a line: the checkpoint goes on
        without it, and that shard continues from it with fresh episodes (``recovery.load_roles``).
        """
        if self.loaded is not None:
            return self.loaded
        state = combined(backend.get(self.learner)) if self.learner else {}
        state["shards"] = shard_states(backend, self.shards, self.state.iteration)
        return state


def shard_states(backend: Backend, futures: list[Any], iteration: int) -> list[Any]:
    """The shards' states (``futures``) of ``iteration``; one lost with its node (or with its shard) is None."""
    try:
        return backend.get(futures)
    except Exception as error:
        if not backend.is_lost(error):
            raise
    states = []
    for i, future in enumerate(futures):
        try:
            states.append(backend.get(future))
        except Exception as error:
            if not backend.is_lost(error):
                raise
            print(
                f"raysim: fault: shard {i}'s state of iteration {iteration} was lost with its node "
                f"({type(cause(error)).__name__}): saved without it; it continues from there with fresh episodes",
                flush=True,
            )
            states.append(None)
    return states


@dataclass
class Session:
    """One ``Trainer.train`` call: the run it trains, its roles, where it stands, the loop's bookkeeping."""

    config: Config
    run_dir: str
    checkpoints: Checkpoints  # the run directory's (its storage: ``storage``)
    meta: dict[str, Any]  # what every checkpoint's meta.json records beside the run state
    horizon: int  # the learner's schedule, in env steps (to build a learner again)
    backend: Backend
    roles: Roles
    collector: Collector
    signals: StopSignals
    sinks: SinkSet
    ready: Ready  # the last completed iteration
    first: RunState  # where this process started (a rewind past it moves it back)
    weights: Any  # the learner's current weights (a future, or the weights themselves)
    clock: PhaseClock = field(default_factory=PhaseClock)  # training seconds, and per phase
    record: dict[str, float] = field(default_factory=dict)  # the last log step's record
    solved: EvalReport | None = None  # the evaluation that reached ``eval.stop_return``
    reporter_stop: bool = False  # the reporter asked the run to end
    last_save: float = field(default_factory=time.monotonic)  # when the last checkpoint was written
    learner_restarts: int = 0  # learners lost and started again (at most ``learner.max_restarts``)
    replay: ReplayLog = field(default_factory=ReplayLog)  # an off-policy learner's transitions: listed, pending

    @property
    def storage(self) -> RunStorage:
        """The run directory."""
        return self.checkpoints.storage

    def write_row(self, state: RunState, result: dict[str, float]) -> None:
        """One record to every sink: the learner's metrics, the evaluations since the last row, counters and
        timings (``time``: the run's training seconds, continued across resumes)."""
        elapsed = self.clock.training_seconds()
        record = {k: v for k, v in result.items() if k != "env_steps"}
        record.update(state.unlogged)
        record.update(self.clock.per_iteration())
        record.update(
            {
                "iteration": state.iteration,
                "env_steps": state.env_steps,
                "time": state.seconds,
                "steps_per_s": (state.env_steps - self.first.env_steps) / max(elapsed, 1e-9),
            }
        )
        self.sinks.write(record)
        self.record = record

    def release(self) -> None:
        """End the run's actors (their CPUs go back to the cluster at once)."""
        end_roles(self.backend, self.roles)


def end_roles(backend: Backend, roles: Roles) -> None:
    """End every actor of ``roles``: training and evaluation shards, learner ranks, policy servers."""
    servers = roles.servers.handles if roles.servers is not None else []
    for handle in [*roles.shards, *roles.eval_shards, *roles.learner.handles, *servers]:
        backend.kill(handle)


def open_sinks(config: Config, storage: RunStorage, state: RunState, resumed: bool) -> SinkSet:
    """The sinks of ``train.sinks`` for a run at ``state`` (rows after its iteration are dropped on a resume); a run
    without shards (BC) shows its progress in iterations."""
    shardless = algorithm_class(config.algo.name).collection(config.algo) is None
    return make_sinks(
        config.train.sinks,
        storage,
        planned_iterations(config) if shardless else config.train.total_steps,
        keep_until=state.iteration,
        env_steps=state.env_steps if resumed else 0,
        by_iteration=shardless,
        config=to_dict(config),
    )
