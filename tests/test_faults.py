"""Fault tolerance: a shard or a learner that dies mid-run is replaced; batches stay exact."""

from __future__ import annotations

import pytest
import torch

import raysim
from raysim.checkpoint import Checkpoints
from raysim.coordinator import Trainer
from raysim.metrics import ParquetSink
from raysim.records import read_metrics
from raysim.storage import LocalStorage, open_storage
from tests.support.crashing import lost_object

SMALL = [
    "backend=ray",
    "shards.count=2",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=1536",
    "train.log_every=1",
    "eval.episodes=0",
    "train.sinks=[parquet]",
]


def rows(run_dir) -> list[dict]:
    return read_metrics(open_storage(run_dir))


@pytest.mark.slow
@pytest.mark.parametrize("lag", [0, 1])  # lag 1: the shard dies with its next chunk queued too
def test_a_shard_killed_during_its_rollout_is_replaced_and_the_iteration_batch_is_exact(
    ray_session, tmp_path, capsys, lag
):
    marker = tmp_path / "crashed"
    config = raysim.load_config(
        None,
        [
            *SMALL,
            f"algo.max_policy_lag={lag}",
            "env.id=tests.support.crashing:CrashOnce",
            f"env.kwargs={{crash_at: 40, marker: '{marker}'}}",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    summary = Trainer(config).train()
    assert marker.exists(), "the shard never crashed"
    assert "fault: shard" in capsys.readouterr().out
    per_iteration = 2 * 4 * 32
    assert summary.iterations == 6 and summary.env_steps == 6 * per_iteration
    steps = [r["env_steps"] for r in rows(summary.run_dir)]
    assert steps == [per_iteration * (i + 1) for i in range(6)]  # each iteration: exactly one chunk per shard


class KillLearnerAt:
    """A sink that kills learner rank 0 once, after the log step of ``iteration``.

    ``lose_ready``: also make the last completed iteration's state unreadable, as when the learner's
    node is lost with the objects it held.
    """

    def __init__(self, trainer: Trainer, iteration: int, lose_ready: bool = False):
        self.trainer, self.iteration, self.lose_ready, self.done = trainer, iteration, lose_ready, False
        self.iterations: list[int] = []

    def write(self, record: dict) -> None:
        self.iterations.append(int(record["iteration"]))
        if not self.done and record["iteration"] == self.iteration:
            import ray

            ray.kill(self.trainer.session.roles.learner.handles[0].actor)
            if self.lose_ready:  # the snapshot this iteration will leave ready cannot be read
                self.trainer.session.roles.learner.snapshots = [ray.remote(lost_object).remote()]
            self.done = True

    def close(self) -> None:
        pass


def run_with_fault(tmp_path, name: str, lose_ready: bool, *overrides: str) -> tuple[KillLearnerAt, object]:
    run_dir = tmp_path / name
    config = raysim.load_config(None, [*SMALL, *overrides, f"run_dir={run_dir}"])
    trainer = Trainer(config)
    sink = KillLearnerAt(trainer, 3, lose_ready)
    trainer.sinks = [sink, ParquetSink(open_storage(run_dir))]
    summary = trainer.train()
    sink.trainer = None  # the run's actors go with their last handle
    return sink, summary


def final_weights(run_dir) -> dict:
    return Checkpoints(LocalStorage(run_dir)).newest_intact()[1]["model"]


@pytest.mark.slow
def test_a_learner_that_dies_is_restarted_from_the_last_completed_iteration_and_nothing_is_lost(
    ray_session, tmp_path, capsys
):
    sink, summary = run_with_fault(tmp_path, "run", False, "checkpoint.every=0", "checkpoint.every_seconds=0")
    out = capsys.readouterr().out
    assert "fault: the learner died" in out and "restarted it from the last completed iteration 3;" in out
    assert summary.iterations == 6 and summary.env_steps == 6 * 2 * 4 * 32
    assert sink.iterations == [1, 2, 3, 4, 5, 6]  # nothing redone, nothing logged twice
    assert [r["iteration"] for r in rows(summary.run_dir)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_an_overlapped_run_whose_learner_dies_drops_the_chunks_in_flight_and_loses_nothing(
    ray_session, tmp_path, capsys
):
    sink, summary = run_with_fault(tmp_path, "run", False, "checkpoint.every=0", "algo.max_policy_lag=1")
    assert "restarted it from the last completed iteration 3;" in capsys.readouterr().out
    assert summary.iterations == 6 and summary.env_steps == 6 * 2 * 4 * 32
    assert [r["iteration"] for r in rows(summary.run_dir)] == [1, 2, 3, 4, 5, 6]
    assert [r["policy_lag"] for r in rows(summary.run_dir)] == [0, 1, 1, 0, 1, 1]  # collected anew at the restart


@pytest.mark.slow
def test_when_the_last_state_is_lost_too_the_learner_restarts_from_the_newest_checkpoint_and_the_rows_are_replaced(
    ray_session, tmp_path, capsys
):
    # the uninterrupted run in-process: a Ray run equals its local run, rows and weights (tests/test_train.py)
    straight = ["backend=local", "checkpoint.every=2", f"run_dir={tmp_path / 'straight'}"]
    assert Trainer(raysim.load_config(None, [*SMALL, *straight])).train().env_steps == 6 * 2 * 4 * 32
    sink, summary = run_with_fault(tmp_path, "run", True, "checkpoint.every=2")
    out = capsys.readouterr().out
    assert "restarted it from checkpoint" in out and "checkpoints/2 (iteration 2)" in out
    assert sink.iterations == [1, 2, 3, 3, 4, 5, 6]  # iteration 3 is redone...
    assert [r["iteration"] for r in rows(summary.run_dir)] == [1, 2, 3, 4, 5, 6]  # ...and logged once in the file
    assert summary.env_steps == 6 * 2 * 4 * 32
    a, b = final_weights(tmp_path / "straight"), final_weights(summary.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)  # shards restored with the learner: the same run, bitwise
    keep = lambda r: {k: v for k, v in r.items() if not k.startswith("time") and k != "steps_per_s"}  # noqa: E731
    assert [keep(r) for r in rows(summary.run_dir)] == [keep(r) for r in rows(tmp_path / "straight")]


@pytest.mark.slow
def test_with_nothing_surviving_the_restart_from_scratch_says_how_many_iterations_were_lost(
    ray_session, tmp_path, capsys
):
    _, summary = run_with_fault(tmp_path, "run", True, "checkpoint.every=0", "checkpoint.every_seconds=0")
    out = capsys.readouterr().out
    assert "no state of it survived: restarted it from scratch; 3 iteration(s) are lost" in out
    assert summary.iterations == 6 and summary.env_steps == 6 * 2 * 4 * 32
    assert [r["iteration"] for r in rows(summary.run_dir)] == [1, 2, 3, 4, 5, 6]
