"""raysim tasks as Gymnasium envs: ``gymnasium.make_vec("raysim/CartPole-v0", num_envs=N)``."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.utils.passive_env_checker import check_obs
from gymnasium.vector import AutoresetMode, VectorEnv

import raysim
from raysim.envs import RaysimVectorEnv

IDS = [("raysim/CartPole-v0", "raysim/CartPole"), ("raysim/Reach-v0", "raysim/Reach")]


@pytest.mark.parametrize("gym_id,task", IDS)
def test_make_vec_is_a_same_step_vector_env(gym_id, task):
    env = gym.make_vec(gym_id, num_envs=5)
    assert isinstance(env, VectorEnv) and isinstance(env.unwrapped, RaysimVectorEnv)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert env.num_envs == 5
    native = raysim.envs.make(task, 1)
    assert env.single_observation_space == native.observation_spaces["policy"]
    assert env.single_action_space == native.action_space
    assert env.observation_space == gym.vector.utils.batch_space(env.single_observation_space, 5)
    assert env.action_space == gym.vector.utils.batch_space(env.single_action_space, 5)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.dtype == np.float32 and obs in env.observation_space
    assert info == {}
    env.action_space.seed(0)
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        check_obs(obs, env.observation_space, "step")
        assert reward.shape == (5,) and reward.dtype == np.float64
        assert terminated.dtype == truncated.dtype == np.bool_ and terminated.shape == truncated.shape == (5,)
    env.close()


@pytest.mark.parametrize("gym_id,task", IDS)
def test_same_seed_same_rows_as_raysim(gym_id, task):
    """reset(seed) and steps give exactly the native env's rows, rewards, flags and final observations."""
    N, seed = 6, 17
    env = gym.make_vec(gym_id, num_envs=N, max_episode_steps=15)
    native = raysim.envs.make(task, N, seed=seed, max_episode_steps=15)
    obs, _ = env.reset(seed=seed)
    np.testing.assert_array_equal(obs, native.reset(seed)["policy"].numpy())
    env.single_action_space.seed(0)
    finished = 0
    for _ in range(40):
        actions = np.stack([env.single_action_space.sample() for _ in range(N)])
        obs, reward, terminated, truncated, info = env.step(actions)
        step = native.step(torch.as_tensor(actions))
        np.testing.assert_array_equal(obs, step.obs["policy"].numpy())
        np.testing.assert_array_equal(reward, step.reward.numpy().astype(np.float64))
        np.testing.assert_array_equal(terminated, step.terminated.numpy())
        np.testing.assert_array_equal(truncated, step.truncated.numpy())
        done = terminated | truncated
        if not done.any():
            assert info == {}
            continue
        finished += int(done.sum())
        np.testing.assert_array_equal(info["_final_obs"], done)
        np.testing.assert_array_equal(info["_final_info"], done)
        for i, row in enumerate(step.done_rows.tolist()):
            np.testing.assert_array_equal(info["final_obs"][row], step.final_obs["policy"][i].numpy())
            assert info["final_info"]["episode"]["r"][row] == pytest.approx(float(step.episodes["return"][i]))
            assert info["final_info"]["length"][row] == int(step.episodes["length"][i])
        assert all(info["final_obs"][row] is None for row in np.flatnonzero(~done))
    assert finished > 0  # the step limit of 15 forces episode ends


def test_layout_matches_gymnasium_sync_vector_env():
    """info keys, masks and types as Gymnasium's own SyncVectorEnv gives them in SAME_STEP mode."""
    ours = gym.make_vec("raysim/CartPole-v0", num_envs=3, max_episode_steps=5)
    theirs = gym.make_vec(
        "CartPole-v1",
        num_envs=3,
        vectorization_mode="sync",
        max_episode_steps=5,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )
    ours.reset(seed=0)
    theirs.reset(seed=0)
    for _ in range(5):
        a = np.zeros(3, dtype=np.int64)
        *_, info_ours = ours.step(a)
        *_, info_theirs = theirs.step(a)
    assert {"final_obs", "_final_obs", "final_info", "_final_info"} <= set(info_ours)
    for key in ("final_obs", "_final_obs", "_final_info"):
        assert type(info_ours[key]) is type(info_theirs[key])
        assert info_ours[key].dtype == info_theirs[key].dtype and info_ours[key].shape == info_theirs[key].shape
    assert isinstance(info_ours["final_info"], dict) and isinstance(info_theirs["final_info"], dict)
    assert info_ours["final_obs"][0].shape == info_theirs["final_obs"][0].shape == (4,)


def test_seeding_is_reproducible_and_final_obs_are_owned():
    env = gym.make_vec("raysim/Reach-v0", num_envs=4, max_episode_steps=3)

    def run(seed):
        out = [env.reset(seed=seed)[0]]
        for _ in range(7):
            obs, reward, term, trunc, info = env.step(np.full((4, 2), 0.5, dtype=np.float32))
            out += [obs, reward, term, trunc]
            if info:
                out.append(copy.deepcopy(info["final_obs"]))
                kept = info["final_obs"][0].copy()
                held = info["final_obs"][0]
        env.step(np.zeros((4, 2), dtype=np.float32))
        np.testing.assert_array_equal(held, kept)  # later steps do not write into handed-out final_obs
        return out

    a, b, c = run(3), run(3), run(4)
    assert data_equivalence(a, b, exact=True)
    assert not data_equivalence(a, c)
    # per-row seeds and a reset mask: only the masked rows start anew, each from its seed
    first, _ = env.reset(seed=[5, 6, 7, 8])
    again, _ = env.reset(seed=[5, 0, 7, 0], options={"reset_mask": np.array([True, False, True, False])})
    np.testing.assert_array_equal(again[[0, 2]], first[[0, 2]])


@pytest.mark.filterwarnings("ignore:.*A Box observation space (minimum|maximum) value is")  # unbounded velocities
@pytest.mark.parametrize("gym_id", [i for i, _ in IDS])
def test_single_env_passes_gymnasium_check_env(gym_id):
    env = gym.make(gym_id)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    vec_obs, _ = gym.make_vec(gym_id, num_envs=1).reset(seed=1)
    np.testing.assert_array_equal(obs, vec_obs[0])
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        assert obs in env.observation_space
        if terminated or truncated:
            assert info["episode"]["l"] == steps
            break


def test_cleanrl_style_loop():
    """A plain Gymnasium loop: random actions, 200 steps, episode returns from final_info."""
    envs = gym.make_vec("raysim/CartPole-v0", num_envs=8)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # a stock Gymnasium wrapper works on top
    envs.action_space.seed(1)
    obs, _ = envs.reset(seed=1)
    returns, wrapper_returns = [], []
    for _ in range(200):
        obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        if "final_info" in infos:
            for i in np.flatnonzero(infos["_final_info"]):
                returns.append(float(infos["final_info"]["episode"]["r"][i]))
        if "episode" in infos:
            wrapper_returns += infos["episode"]["r"][infos["_episode"]].tolist()
    assert len(returns) > 20  # random CartPole episodes last ~20 steps
    assert 8 < np.mean(returns) < 40
    assert returns == pytest.approx(wrapper_returns)  # same episodes, same returns as Gymnasium's own counter
