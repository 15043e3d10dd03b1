"""``eval.every_steps`` and ``eval.stop_return``: evaluate on an env-step schedule, stop once solved."""

from __future__ import annotations

import raysim
from raysim.coordinator.trainer import eval_due

BASE = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.update_epochs=1",
    "algo.num_minibatches=1",
    "shards.count=1",
    "train.total_steps=1280",
    "train.log_every=100",
    "eval.episodes=2",
    "eval.num_envs=2",
]
# 128 env steps per iteration, 10 iterations


def test_eval_due_on_iterations_and_on_crossing_step_multiples():
    config = raysim.load_config(None, overrides=["eval.every_steps=300"])
    assert [eval_due(config, i, (i - 1) * 128, i * 128) for i in range(1, 9)] == [
        False,
        False,
        True,
        False,
        True,
        False,
        False,
        True,
    ]
    config = raysim.load_config(None, overrides=["eval.every=2"])
    assert [eval_due(config, i, 0, 10) for i in range(1, 5)] == [False, True, False, True]


def test_a_run_stops_at_the_first_evaluation_that_reaches_stop_return(tmp_path):
    config = raysim.load_config(
        None, overrides=[*BASE, "eval.every_steps=300", "eval.stop_return=0", f"run_dir={tmp_path / 'run'}"]
    )
    summary = raysim.Trainer(config, sinks=[]).train()
    assert summary.iterations == 3 and summary.env_steps == 384  # 384 is the first count past 300
    assert not summary.interrupted and summary.evaluation is not None and summary.evaluation.completed == 2


def test_without_stop_return_the_run_goes_to_the_end(tmp_path):
    config = raysim.load_config(None, overrides=[*BASE, "eval.every_steps=300", f"run_dir={tmp_path / 'run'}"])
    summary = raysim.Trainer(config, sinks=[]).train()
    assert summary.iterations == 10 and summary.env_steps == 1280 and not summary.interrupted
