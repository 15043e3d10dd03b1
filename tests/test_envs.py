"""The batched env contract on the native CartPole: physics, flags, final_obs, reports, registry."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import raysim.envs as envs
from raysim.envs import CartPole, make
from raysim.envs.cartpole import THETA_THRESHOLD, X_THRESHOLD

EDGE = [X_THRESHOLD - 0.01, 10.0, 0.0, 0.0]  # x passes the threshold on the next step, whatever the action
CALM = [0.0, 0.0, 0.0, 0.0]


def random_actions(env, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (env.num_envs,), generator=generator)


def storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


# -- registry and bad input ---------------------------------------------------------------------


def test_make_builds_native_and_gymnasium_envs_by_name():
    native = make("raysim/CartPole", 3, seed=1)
    assert isinstance(native, CartPole) and native.num_envs == 3
    assert "raysim/CartPole" in envs.registered()
    adapted = make("gym:CartPole-v1", 2, seed=1)
    try:
        assert adapted.env_id == "gym:CartPole-v1" and adapted.num_envs == 2
        assert adapted.max_episode_steps == 500
        assert set(adapted.observation_spaces) == {"policy"}
        obs = adapted.reset(seed=1)
        assert obs["policy"].shape == (2, 4) and obs["policy"].dtype == torch.float32
    finally:
        adapted.close()


def test_native_env_options_reach_the_task_and_a_bad_option_names_the_env():
    assert make("raysim/CartPole", 2, max_episode_steps=7).max_episode_steps == 7
    with pytest.raises(ValueError, match="raysim/CartPole has no option 'no_such_option'; its options: "):
        make("raysim/CartPole", 2, no_such_option=1)


def test_unknown_native_env_id_is_named_and_the_closest_id_suggested():
    with pytest.raises(ValueError, match=r"unknown env id 'raysim/Cartpole'; did you mean 'raysim/CartPole'\?"):
        make("raysim/Cartpole", 2)
    with pytest.raises(ValueError, match=r"unknown env id 'NoSuchEnv'.*gym:<ID>"):
        make("NoSuchEnv", 2)


def test_unknown_gymnasium_id_is_named_and_similar_ids_suggested():
    with pytest.raises(ValueError, match=r"unknown Gymnasium id 'CartPol-v1'; similar ids: \[.*'CartPole-v1'"):
        make("gym:CartPol-v1", 2)


def test_registering_under_the_gym_prefix_is_refused():
    with pytest.raises(ValueError, match="reserved"):
        envs.register("gym:Mine-v0", CartPole)


@pytest.mark.parametrize("num_envs", [0, -1, 1.5, True, "4", None])
@pytest.mark.parametrize("env_id", ["raysim/CartPole", "gym:CartPole-v1"])
def test_num_envs_that_is_not_a_positive_integer_is_refused_with_the_value(env_id, num_envs):
    with pytest.raises(ValueError, match=rf"num_envs must be an integer >= 1, got {num_envs!r}"):
        make(env_id, num_envs)


def test_num_envs_given_as_a_numpy_integer_is_accepted():
    env = make("raysim/CartPole", np.int64(3))
    assert env.num_envs == 3 and type(env.num_envs) is int
    assert env.reset(seed=0)["policy"].shape == (3, 4)


@pytest.mark.parametrize("shape", [(4, 1), (3,), (5,), (4, 2)])
def test_actions_of_the_wrong_shape_are_refused_with_the_expected_shape(shape):
    env = CartPole(4, seed=0)
    with pytest.raises(ValueError, match=r"raysim/CartPole: actions must have shape \(4,\).*got " + rf"\({shape[0]},"):
        env.step(torch.zeros(shape, dtype=torch.int64))


def test_max_episode_steps_below_one_is_refused():
    with pytest.raises(ValueError, match="max_episode_steps must be an integer >= 1, got 0"):
        CartPole(2, max_episode_steps=0)


# -- resets -------------------------------------------------------------------------------------


def test_initial_states_are_uniform_in_plus_minus_0_05():
    env = CartPole(4096, seed=3)
    state = env.reset(seed=3)["policy"]
    assert state.min() >= -0.05 and state.max() <= 0.05
    assert state.min() < -0.049 and state.max() > 0.049  # the whole interval, not a corner of it
    assert state.mean().abs() < 0.003
    rows = torch.arange(0, 4096, 2)
    fresh = env.reset_rows(rows, list(range(rows.numel())))["policy"][rows]
    assert fresh.min() >= -0.05 and fresh.max() <= 0.05 and fresh.std() > 0.025


def test_reset_with_the_same_seed_reproduces_the_trajectory():
    a, b = CartPole(16, seed=11), CartPole(16, seed=99)
    b.reset(seed=11)
    ga, gb = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for _ in range(60):
        sa, sb = a.step(random_actions(a, ga)), b.step(random_actions(b, gb))
        assert torch.equal(sa.obs["policy"], sb.obs["policy"])
        assert torch.equal(sa.done_rows, sb.done_rows)
    assert not torch.equal(CartPole(16, seed=12).state, CartPole(16, seed=11).state)


def test_reset_rows_with_equal_seeds_gives_equal_initial_observations():
    env = CartPole(6, seed=0)
    env.episode_length.fill_(5)
    env.episode_return.fill_(5.0)
    obs = env.reset_rows(torch.tensor([0, 1, 3, 4]), [7, 7, 8, 8])["policy"]
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[3], obs[4])
    assert not torch.equal(obs[0], obs[3])
    other = CartPole(2, seed=123).reset_rows(torch.tensor([1]), [7])["policy"]
    assert torch.equal(other[1], obs[0])  # the seed alone decides, not the env or the row
    assert env.episode_length.tolist() == [0, 0, 5, 0, 0, 5]  # the reset rows' episodes restart
    assert env.episode_return.tolist() == [0, 0, 5, 0, 0, 5]
    with pytest.raises(ValueError, match="2 rows but 1 seeds"):
        env.reset_rows(torch.tensor([0, 1]), [3])


# -- physics parity -----------------------------------------------------------------------------


def test_cartpole_steps_match_gymnasium_cartpole_v1_row_by_row():
    rows, steps = 64, 300
    env = CartPole(rows, seed=5)
    reference = gym.make("CartPole-v1").unwrapped
    reference.reset(seed=0)
    generator = torch.Generator().manual_seed(1)
    terminations = 0
    for _ in range(steps):
        before = env.state.clone()
        actions = random_actions(env, generator)
        step = env.step(actions)
        after = step.obs["policy"].clone()
        if step.done_rows.numel():
            after[step.done_rows] = step.final_obs["policy"]  # the pre-reset state of finished rows
        expected_obs, expected_reward, expected_terminated = [], [], []
        for state, action in zip(before.double().numpy(), actions.tolist(), strict=True):
            reference.state = state
            reference.steps_beyond_terminated = None
            obs, reward, terminated, _, _ = reference.step(action)
            expected_obs.append(obs)
            expected_reward.append(reward)
            expected_terminated.append(terminated)
        np.testing.assert_allclose(after.numpy(), np.stack(expected_obs), rtol=0, atol=1e-5)
        assert step.terminated.tolist() == expected_terminated
        assert step.reward.tolist() == expected_reward
        terminations += int(step.terminated.sum())
    assert terminations > 300  # the thresholds were exercised many times
    assert step.reward.dtype == torch.float32 and step.terminated.dtype == torch.bool


def test_termination_thresholds_are_strict_inequalities_on_x_and_theta():
    env = CartPole(4, seed=0, max_episode_steps=100)
    assert X_THRESHOLD == 2.4 and THETA_THRESHOLD == pytest.approx(12 * 2 * np.pi / 360)
    env.state = torch.tensor([EDGE, [-X_THRESHOLD + 0.01, -10.0, 0, 0], [0, 0, THETA_THRESHOLD - 1e-3, 1.0], CALM])
    step = env.step(torch.tensor([1, 0, 1, 0]))
    assert step.terminated.tolist() == [True, True, True, False]


# -- flags, final_obs, episode reports ----------------------------------------------------------


def test_row_terminated_and_truncated_in_the_same_step_reports_both_flags():
    env = CartPole(4, seed=0, max_episode_steps=10)
    env.state = torch.tensor([EDGE, CALM, CALM, EDGE])
    env.episode_length[:] = torch.tensor([9, 9, 3, 3])
    env.episode_return[:] = env.episode_length.float()
    step = env.step(torch.tensor([1, 1, 1, 1]))
    assert step.terminated.tolist() == [True, False, False, True]
    assert step.truncated.tolist() == [True, True, False, False]  # row 1: the step limit only
    assert step.done_rows.tolist() == [0, 1, 3]
    assert step.episodes["length"].tolist() == [10, 10, 4]
    assert step.episodes["return"].tolist() == [10.0, 10.0, 4.0]


def test_row_at_max_episode_steps_is_truncated_only():
    env = CartPole(8, seed=0, max_episode_steps=5)
    env.state = torch.zeros(8, 4)  # balanced: no termination within 5 steps
    for t in range(5):
        step = env.step(torch.tensor([0, 1] * 4))
        assert not step.terminated.any()
        assert step.truncated.all() == (t == 4) and step.truncated.any() == (t == 4)
    assert step.done_rows.tolist() == list(range(8))
    assert step.episodes["length"].tolist() == [5] * 8
    assert env.episode_length.tolist() == [0] * 8


def test_final_obs_is_the_pre_reset_state_and_differs_from_the_reset_obs():
    env = CartPole(4, seed=0, max_episode_steps=10)
    env.state = torch.tensor([EDGE, CALM, CALM, EDGE])
    env.episode_length[:] = torch.tensor([9, 9, 3, 3])
    twin = copy.deepcopy(env)
    twin.max_episode_steps = 10**6
    twin._reset_state = lambda rows, generator: None  # the same physics, never reset
    actions = torch.tensor([1, 0, 1, 0])
    step = env.step(actions)
    twin.step(actions)
    final = step.final_obs["policy"]
    assert torch.equal(final, twin.state[step.done_rows])
    assert final[0, 0] > X_THRESHOLD  # really the state past the edge
    reset_obs = step.obs["policy"][step.done_rows]
    assert (reset_obs.abs() <= 0.05).all()
    assert not torch.isclose(final, reset_obs).all(1).any()
    assert set(step.final_obs) == {"policy"}


def test_final_obs_is_an_owned_copy_unchanged_by_later_steps_and_in_place_writes():
    env = CartPole(32, seed=2)
    generator = torch.Generator().manual_seed(0)
    finals = []
    for _ in range(80):
        step = env.step(random_actions(env, generator))
        if step.done_rows.numel():
            finals.append((step.final_obs["policy"], step.final_obs["policy"].clone()))
            env_storage = storages([env.state, env.episode_length, env.episode_return])
            assert not storages(step.final_obs.values()) & env_storage
            assert not storages(step.episodes.values()) & env_storage
            assert (
                step.final_obs["policy"].untyped_storage().data_ptr() != step.obs["policy"].untyped_storage().data_ptr()
            )
    assert len(finals) > 10
    env.state.fill_(123.0)
    env.state[:, 0].zero_()
    env.reset(seed=1)
    for final, saved in finals:
        assert torch.equal(final, saved)


def test_no_final_obs_or_reports_when_no_row_finished():
    env = CartPole(4, seed=0)
    step = env.step(torch.zeros(4, dtype=torch.int64))
    assert step.done_rows.numel() == 0 and step.done_rows.dtype == torch.int64
    assert step.final_obs == {} and step.episodes == {}
    assert step.valid is None


def test_episode_reports_have_right_return_and_length_and_align_with_ascending_done_rows():
    env = CartPole(16, seed=4, max_episode_steps=30)
    generator = torch.Generator().manual_seed(3)
    length = torch.zeros(16, dtype=torch.int64)
    reports = 0
    for _ in range(200):
        step = env.step(random_actions(env, generator))
        length += 1
        done = step.terminated | step.truncated
        assert torch.equal(step.done_rows, done.nonzero().squeeze(1))
        if step.done_rows.numel():
            assert (step.done_rows.diff() > 0).all()
            assert step.episodes["length"].dtype == torch.int64 and step.episodes["return"].dtype == torch.float32
            for column in step.episodes.values():
                assert column.shape == step.done_rows.shape
            assert torch.equal(step.episodes["length"], length[step.done_rows])
            assert torch.equal(step.episodes["return"], step.episodes["length"].float())  # reward 1 per step
            assert (step.episodes["length"] <= 30).all()
            length[step.done_rows] = 0
            reports += step.done_rows.numel()
    assert reports > 100
