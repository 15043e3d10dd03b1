"""The metrics page explains every column a run logs: tiny PPO and GRPO runs, their columns looked up in it."""

from __future__ import annotations

import re
from pathlib import Path

import raysim
from raysim.records import read_metrics
from raysim.storage import open_storage

PAGE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
EVERY_ITERATION = ["backend=local", "train.log_every=1", "train.sinks=[parquet]", "eval.every=1", "eval.episodes=2"]
# PPO on Reach (a task with success): 2 iterations of 1 shard x 4 rows x 16 steps, evaluated after each
PPO = ["env.num_envs=4", "algo.num_steps=16", "algo.num_minibatches=2", "algo.update_epochs=1", "train.total_steps=128"]
# GRPO with dynamic sampling (its own columns) on CartPole: groups of 2 rows, 2 informative groups per shard
GRPO = [
    "env.num_envs=8",
    "algo.group_size=2",
    "algo.groups_per_shard=2",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=300",
    "eval.num_envs=2",
]


def logged_columns(config: str, overrides: list[str], run_dir: Path) -> set[str]:
    summary = raysim.Trainer(raysim.load_config(config, [*EVERY_ITERATION, *overrides, f"run_dir={run_dir}"])).train()
    return {name for row in read_metrics(open_storage(summary.run_dir)) for name in row}


def explained() -> set[str]:
    """The names the page writes as code (`name`) in its tables' first column."""
    first_cells = re.findall(r"^\| ([^|]+) \|", PAGE.read_text(), re.M)
    return {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}


def test_every_column_a_ppo_and_a_grpo_run_log_is_explained_on_the_metrics_page(tmp_path):
    ppo = logged_columns("reach_ppo", PPO, tmp_path / "ppo")
    grpo = logged_columns("cartpole_grpo", GRPO, tmp_path / "grpo")
    assert {"pg_loss", "v_loss", "success_rate", "eval_success_rate"} <= ppo  # the runs log what they should
    assert {"kl", "groups_dropped", "env_steps_trained", "eval_return"} <= grpo
    missing = sorted((ppo | grpo) - explained())
    assert not missing, f"docs/metrics.md does not explain {missing}: add a row to its tables"
