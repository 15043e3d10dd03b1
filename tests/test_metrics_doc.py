"""The metrics page explains every column a run logs: tiny PPO, GRPO and SAC runs, their columns looked up in it."""

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

# SAC on Reach: 6 iterations of 1 row x 16 steps, updates from the third
SAC = [
    "env.id=raysim/Reach",
    "algo.num_steps=16",
    "algo.learning_starts=32",
    "algo.batch_size=16",
    "train.total_steps=96",
]


def logged_columns(config: str, overrides: list[str], run_dir: Path) -> set[str]:
    summary = raysim.Trainer(raysim.load_config(config, [*EVERY_ITERATION, *overrides, f"run_dir={run_dir}"])).train()
    return {name for row in read_metrics(open_storage(summary.run_dir)) for name in row}


def explained() -> set[str]:
    """The names the page writes as code (`name`) in its tables' first column."""
    first_cells = re.findall(r"^\| ([^|]+) \|", PAGE.read_text(), re.M)
    return {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}


def test_every_column_a_ppo_a_grpo_and_a_sac_run_log_is_explained_on_the_metrics_page(tmp_path):
    ppo = logged_columns("reach_ppo", PPO, tmp_path / "ppo")
    grpo = logged_columns("cartpole_grpo", GRPO, tmp_path / "grpo")
    sac = logged_columns("hopper_sac", [*SAC, "model.hidden_sizes=[16]", "eval.num_envs=2"], tmp_path / "sac")
    assert {"pg_loss", "v_loss", "success_rate", "eval_success_rate"} <= ppo  # the runs log what they should
    assert {"kl", "groups_dropped", "env_steps_trained", "eval_return"} <= grpo
    assert {"qf_loss", "alpha", "replay_ratio", "buffer_size"} <= sac
    missing = sorted((ppo | grpo | sac) - explained())
    assert not missing, f"docs/metrics.md does not explain {missing}: add a row to its tables"
