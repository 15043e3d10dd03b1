"""Observation terms and groups: composition by config, noise only where configured, owned final_obs."""

from __future__ import annotations

import pytest
import torch

from raysim.envs import make
from raysim.envs.observations import TERMS, ObservationGroups, ee_pos, goal, goal_rel, joint_pos, joint_vel, last_action

CONFIG = {
    "policy": [{"term": "joint_pos", "noise": 0.1}, "goal_rel", {"term": "joint_vel", "scale": 0.5}, "last_action"],
    "critic": ["goal", "ee_pos", "joint_pos", {"term": "joint_vel", "scale": 0.5}, "goal_rel", "last_action"],
}


def reach(num_envs=4, seed=0, **kwargs):
    return make("raysim/Reach", num_envs, seed=seed, **kwargs)


def storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


def env_state(env) -> list[torch.Tensor]:
    return [env.joint_pos, env.joint_vel, env.ee_pos, env.goal, env.last_action, env.distance, env.action_term.target]


def test_the_terms_are_importable_from_the_documented_module_and_named_in_terms():
    assert TERMS == {
        "joint_pos": joint_pos,
        "joint_vel": joint_vel,
        "ee_pos": ee_pos,
        "goal": goal,
        "goal_rel": goal_rel,
        "last_action": last_action,
    }


def test_policy_and_critic_hold_exactly_the_configured_terms_in_order_with_the_right_shapes():
    env = reach(5, num_links=3, observations=CONFIG)
    env.step(torch.rand(5, 3) * 2 - 1)  # non-zero velocities and last actions
    assert env.observations.names("policy") == ["joint_pos", "goal_rel", "joint_vel", "last_action"]
    assert env.observations.names("critic") == ["goal", "ee_pos", "joint_pos", "joint_vel", "goal_rel", "last_action"]
    assert env.observation_spaces["policy"].shape == (3 + 2 + 3 + 3,)
    assert env.observation_spaces["critic"].shape == (2 + 2 + 3 + 3 + 2 + 3,)
    obs = env._observe()
    assert set(obs) == {"policy", "critic"}
    assert obs["policy"].shape == (5, 11) and obs["critic"].shape == (5, 15)
    assert obs["policy"].dtype == obs["critic"].dtype == torch.float32
    expected_critic = torch.cat(
        [env.goal, env.ee_pos, env.joint_pos, env.joint_vel * 0.5, env.goal - env.ee_pos, env.last_action], 1
    )
    torch.testing.assert_close(obs["critic"], expected_critic, rtol=0, atol=0)
    # the policy's noise-free terms are exact, in their configured places
    torch.testing.assert_close(obs["policy"][:, 3:5], env.goal - env.ee_pos, rtol=0, atol=0)
    torch.testing.assert_close(obs["policy"][:, 5:8], env.joint_vel * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(obs["policy"][:, 8:11], env.last_action, rtol=0, atol=0)
    assert bool((env.last_action != 0).any()) and bool((env.joint_vel != 0).any())


def test_noise_applies_only_to_the_entries_that_configure_it():
    env = reach(256, observations=CONFIG)
    obs = env._observe()
    noise = obs["policy"][:, :2] - env.joint_pos
    assert bool((noise != 0).all())
    assert 0.08 < float(noise.std()) < 0.12 and abs(float(noise.mean())) < 0.03  # std 0.1
    torch.testing.assert_close(obs["critic"][:, 4:6], env.joint_pos, rtol=0, atol=0)  # the same term, noise-free
    again = env._observe()  # the same step of the same episodes: the same noise
    torch.testing.assert_close(again, obs, rtol=0, atol=0)
    env.step(torch.zeros(256, 2))
    later = env._observe()
    assert not bool((later["policy"][:, :2] - env.joint_pos == noise).any())  # fresh noise at every step


def test_equal_reset_seeds_give_equal_noisy_observations_at_every_step_whatever_the_batch():
    a, b = (reach(n, seed=s, observations=CONFIG, tolerance=1e-6) for n, s in ((3, 7), (5, 1)))  # no episode ends
    a.reset_rows(torch.tensor([0, 1, 2]), [11, 12, 13])
    b.reset_rows(torch.tensor([4, 0]), [12, 11])  # the same episodes in other rows of another batch
    torch.manual_seed(0)
    for _ in range(5):
        actions = torch.rand(2, 2) * 2 - 1
        obs_a = a.step(torch.cat([actions, torch.zeros(1, 2)])).obs
        obs_b = b.step(torch.cat([actions[:1], torch.zeros(3, 2), actions[1:]])).obs
        torch.testing.assert_close(obs_a["policy"][[0, 1]], obs_b["policy"][[0, 4]], rtol=0, atol=0)
    assert a.seeded_reset is True  # noise is the episode's: equal seeds, equal noisy observations (GRPO works)


def test_scale_is_applied_after_the_noise_to_the_entry_alone():
    groups = ObservationGroups({"policy": [{"term": "goal", "scale": [2.0, -1.0]}, "goal"]})
    env = reach(2)
    obs = groups.compute(env)
    torch.testing.assert_close(obs["policy"], torch.cat([env.goal * torch.tensor([2.0, -1.0]), env.goal], 1))


def test_observations_are_new_tensors_not_views_of_the_env_state():
    env = reach(3, observations={"policy": ["joint_pos"], "critic": ["goal"]})
    obs = env._observe()
    assert not storages(obs.values()) & storages(env_state(env))


def test_final_obs_carries_every_group_is_owned_and_unchanged_by_later_steps():
    env = reach(4, seed=5, observations=CONFIG, max_episode_steps=10)
    twin = reach(4, seed=5, observations=CONFIG, max_episode_steps=10)  # the same rows, none finishing
    env.episode_length[torch.tensor([1, 3])] = 9  # rows 1 and 3 reach the step limit on the next step
    actions = torch.full((4, 2), 0.5)
    step = env.step(actions)
    twin.step(actions)
    assert step.done_rows.tolist() == [1, 3]
    assert bool(step.truncated[1]) and bool(step.truncated[3]) and not bool(step.terminated.any())
    assert set(step.final_obs) == {"policy", "critic"}
    assert step.final_obs["policy"].shape == (2, 8) and step.final_obs["critic"].shape == (2, 12)
    # the noise-free critic group is the rows' observation before their reset (the twin's state)
    torch.testing.assert_close(step.final_obs["critic"], twin._observe()["critic"][[1, 3]], rtol=0, atol=0)
    torch.testing.assert_close(step.final_obs["policy"][:, 2:], twin._observe()["policy"][[1, 3], 2:], rtol=0, atol=0)
    assert not torch.equal(step.final_obs["critic"][:, 4:6], env.joint_pos[step.done_rows])  # they were reset
    kept = {k: v.clone() for k, v in step.final_obs.items()}
    assert not storages(step.final_obs.values()) & storages([*env_state(env), *step.obs.values()])
    for _ in range(12):  # later steps (and resets) of the env leave them alone
        env.step(torch.rand(4, 2) * 2 - 1)
    env.reset(seed=3)
    env.joint_pos.fill_(0.0)
    for name in kept:
        torch.testing.assert_close(step.final_obs[name], kept[name], rtol=0, atol=0)


def test_final_obs_equals_the_observation_of_the_terminal_state():
    env = reach(2, observations={"policy": ["joint_pos", "goal_rel"], "critic": ["ee_pos", "goal"]})
    env.goal[0] = env.ee_pos[0]  # row 0 succeeds with a zero action (the arm holds still)
    step = env.step(torch.zeros(2, 2))
    assert step.done_rows.tolist() == [0] and bool(step.terminated[0])
    # the terminal state: still at the start (zero relative action), the goal at the end effector
    critic = step.final_obs["critic"][0]
    torch.testing.assert_close(critic[:2], critic[2:], rtol=0, atol=1e-6)


def test_bad_observation_configs_name_the_problem():
    with pytest.raises(ValueError, match="unknown observation term 'joint_position'"):
        ObservationGroups({"policy": ["joint_position"]})
    with pytest.raises(ValueError, match="include 'policy'"):
        ObservationGroups({"critic": ["goal"]})
    with pytest.raises(ValueError, match="non-empty list"):
        ObservationGroups({"policy": "goal"})
    with pytest.raises(ValueError, match="unknown keys"):
        ObservationGroups({"policy": [{"term": "goal", "std": 0.1}]})
    with pytest.raises(ValueError, match="noise must be >= 0"):
        ObservationGroups({"policy": [{"term": "goal", "noise": -1}]})
