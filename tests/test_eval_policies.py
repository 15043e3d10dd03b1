"""Scripted policies through the evaluation path: ``raysim eval --config CONFIG --policy expert | random``.

The Meta-World tests need ``raysim[metaworld]`` (skipped without it) and build few rows of short episodes.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import imageio.v3 as iio
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raysim.cli import main
from raysim.rollout.policies import RandomPolicy

TWO_TASKS = ["--set", "env.kwargs.benchmark=null", "--set", "env.kwargs.tasks=[reach-v3,push-v3]"]


def scripted_eval(tmp_path: Path, config: str, policy: str, *args: str) -> list[dict]:
    """The records of ``raysim eval --config config --policy policy --local`` with ``args``, by episode."""
    out = tmp_path / f"{policy}-{len(list(tmp_path.iterdir()))}.parquet"
    assert main(["eval", "--config", config, "--policy", policy, "--local", "--out", str(out), *args]) == 0
    return sorted(pq.read_table(out).to_pylist(), key=lambda record: record["episode"])


def played(records: list[dict]) -> list[dict]:
    """The records without the two facts of the layout (the row that played an episode, the step it ended at)."""
    return [{k: v for k, v in record.items() if k not in ("row", "step")} for record in records]


def test_the_reach_expert_succeeds_in_most_episodes_where_random_actions_do_not(tmp_path):
    pytest.importorskip("metaworld")
    args = ["--episodes", "6", "--shards", "1", "--envs-per-shard", "2", "--seed", "3"]
    args += ["--set", "env.kwargs.max_episode_steps=60"]  # the expert succeeds within ~45 steps
    expert = scripted_eval(tmp_path, "metaworld_reach_ppo", "expert", *args)
    random = scripted_eval(tmp_path, "metaworld_reach_ppo", "random", *args)
    assert len(expert) == len(random) == 6
    assert [r["seed"] for r in expert] == [r["seed"] for r in random]  # the same episodes
    assert sum(r["success"] for r in expert) >= 5
    assert sum(r["success"] for r in random) <= 1


@pytest.mark.parametrize("policy", ["expert", "random"])
def test_a_scripted_policy_plays_the_same_episodes_over_two_tasks_on_any_layout(tmp_path, policy):
    pytest.importorskip("metaworld")
    args = ["--episodes", "6", "--seed", "5", "--set", "env.kwargs.max_episode_steps=12", *TWO_TASKS]
    one = scripted_eval(tmp_path, "metaworld_reach_ppo", policy, *args, "--shards", "1", "--envs-per-shard", "2")
    two = scripted_eval(tmp_path, "metaworld_reach_ppo", policy, *args, "--shards", "2", "--envs-per-shard", "2")
    assert [r["episode"] for r in one] == list(range(6))
    assert played(two) == played(one)
    assert {r["row"] for r in two} == {0, 1, 2, 3}  # really another layout
    assert len({r["return"] for r in one}) == 6  # distinct episodes


def test_random_actions_depend_on_the_eval_seed_the_episode_and_the_step_alone(tmp_path):
    args = ["--episodes", "6", "--set", "env.kwargs.max_episode_steps=20", "--set", "env.num_envs=4"]
    one = scripted_eval(tmp_path, "reach_ppo", "random", *args, "--seed", "7", "--shards", "1", "--envs-per-shard", "4")
    two = scripted_eval(tmp_path, "reach_ppo", "random", *args, "--seed", "7", "--shards", "3", "--envs-per-shard", "1")
    other = scripted_eval(tmp_path, "reach_ppo", "random", *args, "--seed", "8", "--shards", "1")
    assert played(two) == played(one)
    assert {r["return"] for r in other}.isdisjoint({r["return"] for r in one})


def test_random_actions_fill_the_action_space_and_a_row_draws_the_same_in_any_batch():
    box = RandomPolicy("test", gym.spaces.Box(np.float32([-2, -2]), np.float32([1, 3])))
    keys, steps = torch.tensor([11, 12, 13, 11]), torch.tensor([0, 0, 0, 5])
    actions = box.act({}, (keys, steps))
    assert actions.shape == (4, 2) and actions.dtype == torch.float32
    assert bool((actions >= -2).all()) and bool((actions[:, 0] <= 1).all()) and bool((actions[:, 1] <= 3).all())
    assert torch.equal(box.act({}, (keys[1:2], steps[1:2])), actions[1:2])
    assert not torch.equal(actions[0], actions[3])  # another step, another draw
    choice = RandomPolicy("test", gym.spaces.Discrete(3, start=1))
    drawn = choice.act({}, (torch.arange(300), torch.zeros(300, dtype=torch.int64)))
    assert drawn.dtype == torch.int64 and set(drawn.tolist()) == {1, 2, 3}
    with pytest.raises(ValueError, match="test: random actions need a bounded Box"):
        RandomPolicy("test", gym.spaces.Box(low=-float("inf"), high=1.0, shape=(2,)))


def test_a_random_policy_is_filmed_with_the_records_of_an_evaluation_without_a_video(tmp_path):
    args = ["--episodes", "4", "--shards", "1", "--envs-per-shard", "2", "--set", "env.kwargs.max_episode_steps=10"]
    plain = scripted_eval(tmp_path, "reach_ppo", "random", *args)
    video = tmp_path / "random.gif"
    filmed = scripted_eval(tmp_path, "reach_ppo", "random", *args, "--video", str(video), "--video-size", "16")
    assert filmed == plain
    steps = [sum(r["length"] for r in plain if r["row"] == row) for row in (0, 1)]
    assert iio.imread(video).shape[0] == max(steps)  # one frame per step of a row's episodes


def refused(argv: list[str], capsys, expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["eval", "runs/x", "--policy", "random"], "--policy goes with no RUN_DIR_OR_CHECKPOINT"),
        (["eval", "runs/x", "--config", "reach_ppo"], "--config goes with no RUN_DIR_OR_CHECKPOINT"),
        (["eval", "--policy", "expert"], "raysim eval: give --config CONFIG"),
        (["eval", "--config", "reach_ppo"], "raysim eval: give --policy"),
        (["eval"], "raysim eval: give RUN_DIR_OR_CHECKPOINT"),
        (["eval", "--config", "reach_ppo", "--policy", "random", "--stochastic"], "leave --stochastic out"),
        (["eval", "runs/x", "--set", "eval.seed=3"], "--set changes the config of --config"),
        (["eval", "--config", "reach_ppo", "--policy", "best"], "argument --policy: invalid choice: 'best'"),
        (
            ["eval", "--config", "reach_ppo", "--policy", "expert", "--local"],
            "--policy expert: raysim/Reach has no scripted expert: only envs with one (raysim/MetaWorld) play",
        ),
        (
            ["eval", "--config", "reach_ppo", "--policy", "random", "--local", "--set", "env.kwargs.nope=1"],
            "env.kwargs.nope",
        ),
    ],
)
def test_a_misused_scripted_evaluation_is_one_line_and_exit_2(argv, expected, capsys):
    refused(argv, capsys, expected)
