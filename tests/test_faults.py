"""Fault tolerance: a shard or a learner that dies mid-run is replaced; batches stay exact."""

from __future__ import annotations

import pyarrow.parquet as pq

import raysim
from raysim.coordinator import Trainer

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
    return pq.read_table(f"{run_dir}/metrics.parquet").to_pylist()


def test_a_shard_killed_during_its_rollout_is_replaced_and_the_iteration_batch_is_exact(ray_session, tmp_path, capsys):
    marker = tmp_path / "crashed"
    config = raysim.load_config(
        None,
        [
            *SMALL,
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
    """A sink that kills learner rank 0 once, after the log step of ``iteration``."""

    def __init__(self, trainer: Trainer, iteration: int):
        self.trainer, self.iteration, self.done = trainer, iteration, False
        self.iterations: list[int] = []

    def write(self, record: dict) -> None:
        self.iterations.append(int(record["iteration"]))
        if not self.done and record["iteration"] == self.iteration:
            import ray

            ray.kill(self.trainer.roles.learner.handles[0].actor)
            self.done = True

    def close(self) -> None:
        pass


def test_a_learner_that_dies_is_restarted_from_the_newest_checkpoint(ray_session, tmp_path, capsys):
    config = raysim.load_config(None, [*SMALL, "checkpoint.every=2", f"run_dir={tmp_path / 'run'}"])
    trainer = Trainer(config)
    sink = KillLearnerAt(trainer, 3)
    trainer.sinks = [sink]
    summary = trainer.train()
    out = capsys.readouterr().out
    assert "fault: the learner died" in out and "checkpoints/2" in out
    assert summary.iterations == 6 and summary.env_steps == 6 * 2 * 4 * 32
    # iterations 3 is redone after the restart from checkpoint 2
    assert sink.iterations == [1, 2, 3, 3, 4, 5, 6]
