"""MuJoCo tasks through the Gymnasium adapter: ``gym:HalfCheetah-v5`` and friends (``raysim[mujoco]``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco", reason='MuJoCo is not installed (pip install "raysim[mujoco]")')

import raysim  # noqa: E402


@pytest.fixture(autouse=True)
def _mujoco_log_in_tmp(tmp_path, monkeypatch):
    """MuJoCo appends its warnings to MUJOCO_LOG.TXT in the working directory: keep it out of the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("gym_id", ["HalfCheetah-v5", "Hopper-v5", "Ant-v5"])
def test_mujoco_ids_follow_the_step_contract(gym_id):
    env = raysim.envs.make(f"gym:{gym_id}", 3, seed=0, max_episode_steps=40)
    obs = env.reset(0)
    space = env.observation_spaces["policy"]
    assert obs["policy"].dtype == torch.float32 and obs["policy"].shape == (3, *space.shape)  # float64 -> float32
    assert env.max_episode_steps == 40
    generator = torch.Generator().manual_seed(0)
    ends = 0
    for _ in range(45):
        step = env.step(torch.rand(3, *env.action_space.shape, generator=generator) * 2 - 1)
        assert step.obs["policy"].dtype == torch.float32 and torch.isfinite(step.obs["policy"]).all()
        if step.done_rows.numel():
            ends += step.done_rows.numel()
            assert step.final_obs["policy"].dtype == torch.float32
            assert step.final_obs["policy"].shape == (step.done_rows.numel(), *space.shape)
            assert (step.episodes["length"] <= 40).all()
    assert ends >= 3  # every row reached the step limit (or terminated) at least once
    again = raysim.envs.make(f"gym:{gym_id}", 3, seed=0, max_episode_steps=40).reset(0)
    torch.testing.assert_close(again["policy"], obs["policy"], rtol=0, atol=0)  # seeded resets reproduce
    env.close()


def test_halfcheetah_config_trains_a_few_iterations(tmp_path):
    config = raysim.load_config(
        "halfcheetah_ppo",
        [
            "backend=local",
            "train.total_steps=1024",
            "algo.num_steps=512",
            "algo.num_minibatches=4",
            "eval.episodes=2",
            "eval.num_envs=2",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    assert config.env.id == "gym:HalfCheetah-v5" and config.algo.update_epochs == 10
    summary = raysim.Trainer(config).train()
    assert summary.env_steps == 1024
    assert summary.evaluation.completed == 2 and np.isfinite(summary.evaluation.mean_return)
