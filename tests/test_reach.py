"""``raysim/Reach``: kinematics, joint model, success / failure / timeout, reports, rewards, seeding, shards."""

from __future__ import annotations

import math

import pytest
import torch

import raysim.envs as envs
from raysim.config import load_config
from raysim.envs import Reach, make
from raysim.envs.reach import forward_kinematics
from raysim.rollout import EnvShard, GroupEpisodes


def reach(num_envs=4, seed=0, **kwargs) -> Reach:
    return make("raysim/Reach", num_envs, seed=seed, **kwargs)


def put_goal_at_end_effector(env: Reach, rows) -> None:
    env.goal[rows] = env.ee_pos[rows]


def move_goal_away(env: Reach, rows) -> None:
    env.goal[rows] = -env.ee_pos[rows]  # the point opposite the end effector, far from it
    assert bool(((env.goal[rows] - env.ee_pos[rows]).norm(dim=-1) > 10 * env.tolerance).all())


# -- kinematics and joint model ----------------------------------------------------------------


def test_two_link_kinematics_match_a_hand_computation():
    lengths = torch.tensor([1.0, 0.5])
    q = torch.tensor([[math.pi / 2, -math.pi / 2], [0.0, 0.0], [math.pi, 0.0], [0.0, math.pi / 2]])
    expected = torch.tensor([[0.5, 1.0], [1.5, 0.0], [-1.5, 0.0], [1.0, 0.5]])
    torch.testing.assert_close(forward_kinematics(q, lengths), expected, atol=1e-6, rtol=0)


def test_three_link_kinematics_accumulate_the_joint_angles():
    lengths = torch.tensor([1.0, 1.0, 1.0])
    q = torch.tensor([[math.pi / 2, -math.pi / 2, -math.pi / 2]])  # up, right, down
    torch.testing.assert_close(forward_kinematics(q, lengths), torch.tensor([[1.0, 0.0]]), atol=1e-6, rtol=0)


def test_the_env_end_effector_follows_its_joints_and_link_lengths():
    env = reach(1, link_lengths=[1.0, 0.5], joint_limits=[-3.0, 3.0])
    env.joint_pos[0] = torch.tensor([math.pi / 2, -math.pi / 2])
    env.step(torch.zeros(1, 2))  # a zero relative action holds the joints
    torch.testing.assert_close(env.ee_pos[0], torch.tensor([0.5, 1.0]), atol=1e-6, rtol=0)


def test_the_first_order_joint_model_moves_toward_the_target_by_the_exact_decay_per_substep():
    env = reach(
        1, dt=0.01, decimation=3, time_constant=0.05, max_joint_vel=100.0, actions={"type": "absolute", "scale": 1.0}
    )
    env.joint_pos[0] = torch.tensor([0.0, 0.0])
    env.step(torch.tensor([[1.0, -0.5]]))
    remaining = math.exp(-0.03 / 0.05)  # the error left after 3 sub-steps of the exact solution
    torch.testing.assert_close(env.joint_pos[0], torch.tensor([1.0, -0.5]) * (1 - remaining), atol=1e-5, rtol=0)
    last_move = torch.tensor([1.0, -0.5]) * (math.exp(-0.02 / 0.05) - remaining)
    torch.testing.assert_close(env.joint_vel[0], last_move / 0.01, atol=1e-3, rtol=0)


def test_joint_velocity_is_capped_and_soft_limits_stop_the_joints():
    env = reach(
        1, dt=0.01, decimation=4, max_joint_vel=2.0, actions={"type": "absolute", "scale": 2.5, "offset": [0.0, 1.0]}
    )
    env.joint_pos[0] = torch.tensor([0.0, 2.75])
    env.step(torch.tensor([[1.0, 1.0]]))  # targets 2.5 rad away / 3.5, beyond the 2.8 limit
    torch.testing.assert_close(env.joint_pos[0], torch.tensor([0.08, 2.8]), atol=1e-6, rtol=0)
    torch.testing.assert_close(env.joint_vel[0], torch.tensor([2.0, 0.0]), atol=1e-4, rtol=0)


# -- success, failure, timeout -----------------------------------------------------------------


def test_success_terminates_with_success_true():
    env = reach(3)
    put_goal_at_end_effector(env, 1)
    step = env.step(torch.zeros(3, 2))
    assert step.terminated.tolist() == [False, True, False]
    assert not bool(step.truncated.any())
    assert step.done_rows.tolist() == [1]
    assert step.episodes["success"].tolist() == [True] and step.episodes["failure"].tolist() == [False]
    assert step.episodes["success"].dtype == torch.bool
    assert float(step.episodes["final_distance"][0]) < 1e-6
    assert float(step.reward[1]) == pytest.approx(10.0, abs=1e-4)  # the success bonus, no distance to pay


def test_success_within_the_tolerance_but_not_outside_it():
    env = reach(2, tolerance=0.05)
    direction = torch.tensor([1.0, 0.0])
    env.goal[0] = env.ee_pos[0] + 0.049 * direction
    env.goal[1] = env.ee_pos[1] + 0.051 * direction
    step = env.step(torch.zeros(2, 2))
    assert step.terminated.tolist() == [True, False]


def test_with_hold_steps_success_needs_that_many_consecutive_steps_at_the_goal():
    env = reach(1, hold_steps=3)
    put_goal_at_end_effector(env, 0)
    assert not bool(env.step(torch.zeros(1, 2)).terminated[0])
    assert not bool(env.step(torch.zeros(1, 2)).terminated[0])
    move_goal_away(env, 0)  # leaving the goal restarts the count
    assert not bool(env.step(torch.zeros(1, 2)).terminated[0])
    put_goal_at_end_effector(env, 0)
    assert [bool(env.step(torch.zeros(1, 2)).terminated[0]) for _ in range(3)] == [False, False, True]


def test_a_joint_past_its_limit_with_hard_limits_terminates_as_a_failure():
    env = reach(2, hard_limits=True, actions={"type": "relative", "scale": 0.5, "limit": None})
    env.joint_pos[0] = torch.tensor([0.0, 2.79])
    env.joint_pos[1] = torch.tensor([0.0, 0.0])
    step = env.step(torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
    assert step.terminated.tolist() == [True, False] and not bool(step.truncated.any())
    assert step.episodes["success"].tolist() == [False] and step.episodes["failure"].tolist() == [True]
    assert float(step.reward[0]) < -10.0  # the failure penalty plus the distance


def test_failure_wins_over_a_success_in_the_same_step():
    env = reach(1, hard_limits=True, actions={"type": "relative", "scale": 0.5, "limit": None}, tolerance=0.5)
    env.joint_pos[0] = torch.tensor([0.0, 2.79])
    put_goal_at_end_effector(env, 0)
    step = env.step(torch.tensor([[0.0, 1.0]]))  # still within 0.5 of the goal, but past the limit
    assert bool(step.terminated[0])
    assert step.episodes["success"].tolist() == [False] and step.episodes["failure"].tolist() == [True]


def test_without_hard_limits_the_joint_stops_at_its_limit_and_nothing_fails():
    env = reach(1, actions={"type": "relative", "scale": 0.5, "limit": None})
    env.joint_pos[0] = torch.tensor([0.0, 2.79])
    move_goal_away(env, 0)
    step = env.step(torch.tensor([[0.0, 1.0]]))
    assert not bool(step.terminated[0])
    assert float(env.joint_pos[0, 1]) == pytest.approx(2.8)


def test_the_step_limit_truncates_only():
    env = reach(2, max_episode_steps=20)
    move_goal_away(env, [0, 1])
    env.episode_length[0] = 19
    step = env.step(torch.zeros(2, 2))
    assert step.truncated.tolist() == [True, False] and step.terminated.tolist() == [False, False]
    assert step.episodes["success"].tolist() == [False] and step.episodes["failure"].tolist() == [False]
    assert step.episodes["length"].tolist() == [20]


def test_success_on_the_last_step_is_terminated_and_truncated_with_success_true():
    env = reach(2, max_episode_steps=20)
    put_goal_at_end_effector(env, 0)
    move_goal_away(env, 1)
    env.episode_length[:] = 19
    step = env.step(torch.zeros(2, 2))
    assert step.terminated.tolist() == [True, False]
    assert step.truncated.tolist() == [True, True]
    assert step.done_rows.tolist() == [0, 1]
    assert step.episodes["success"].tolist() == [True, False]


def test_actions_outside_the_action_space_are_clipped():
    a, b = reach(1, seed=3), reach(1, seed=3)
    a.step(torch.tensor([[5.0, -7.0]]))
    b.step(torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(a.joint_pos, b.joint_pos, rtol=0, atol=0)
    torch.testing.assert_close(a.last_action, torch.tensor([[1.0, -1.0]]))


# -- episode report and rewards ----------------------------------------------------------------


def test_the_episode_report_holds_success_final_distance_and_each_weighted_reward_term_mean():
    weights = {"distance": -2.0, "success": 5.0, "action_rate": -0.5, "failure": -1.0}
    env = reach(1, rewards=weights, max_episode_steps=3)
    move_goal_away(env, 0)
    actions = [torch.tensor([[0.5, 0.0]]), torch.tensor([[-0.5, 1.0]]), torch.tensor([[0.0, 0.0]])]
    rewards, distances, rates, previous = [], [], [], torch.zeros(1, 2)
    for action in actions:
        step = env.step(action)
        rewards.append(float(step.reward[0]))
        if step.done_rows.numel() == 0:
            distances.append(float(env.distance[0]))
        rates.append(float((action - previous).square().sum()))
        previous = action
    report = {k: v.tolist() for k, v in step.episodes.items()}
    assert set(report) == {
        "return",
        "length",
        "success",
        "failure",
        "final_distance",
        "reward_distance",
        "reward_success",
        "reward_action_rate",
        "reward_failure",
    }
    assert report["length"] == [3] and report["success"] == [False]
    final = report["final_distance"][0]
    assert report["reward_distance"][0] == pytest.approx(-2.0 * (sum(distances) + final) / 3, rel=1e-5)
    assert report["reward_action_rate"][0] == pytest.approx(-0.5 * sum(rates) / 3, rel=1e-5)
    assert report["reward_success"] == [0.0] and report["reward_failure"] == [0.0]
    # the weighted sum of the terms is the reward: the terms' means add up to the return per step
    terms = sum(report[f"reward_{k}"][0] for k in weights)
    assert report["return"][0] == pytest.approx(sum(rewards), rel=1e-5)
    assert terms * 3 == pytest.approx(sum(rewards), rel=1e-5)


def test_a_reward_term_left_out_is_off_and_absent_from_the_report():
    env = reach(1, rewards={"distance": -1.0})
    put_goal_at_end_effector(env, 0)
    step = env.step(torch.ones(1, 2) * 0.0)
    assert float(step.reward[0]) == pytest.approx(0.0, abs=1e-6)
    assert "reward_success" not in step.episodes and "reward_distance" in step.episodes
    with pytest.raises(ValueError, match="unknown reward terms"):
        reach(1, rewards={"distanse": -1.0})


def test_reports_are_per_episode_the_sums_restart_after_a_reset():
    env = reach(1, max_episode_steps=2)
    move_goal_away(env, 0)
    env.step(torch.ones(1, 2))
    first = env.step(torch.ones(1, 2)).episodes
    move_goal_away(env, 0)
    env.step(torch.zeros(1, 2))
    second = env.step(torch.zeros(1, 2)).episodes
    assert float(first["reward_action_rate"][0]) < 0
    assert float(second["reward_action_rate"][0]) == 0.0  # zero actions, nothing carried over


# -- resets --------------------------------------------------------------------------------------


def test_reset_rows_with_equal_seeds_gives_equal_starts_and_goals():
    env = reach(4)
    env.reset_rows(torch.tensor([0, 1, 2, 3]), [11, 11, 12, 11])
    for name in ("joint_pos", "goal", "ee_pos"):
        value = getattr(env, name)
        assert torch.equal(value[0], value[1]) and torch.equal(value[0], value[3])
        assert not torch.equal(value[0], value[2])
    obs = env._observe()
    assert torch.equal(obs["policy"][0], obs["policy"][1]) and torch.equal(obs["critic"][0], obs["critic"][3])
    assert torch.equal(env.joint_vel, torch.zeros(4, 2)) and torch.equal(env.last_action, torch.zeros(4, 2))
    torch.testing.assert_close(env.action_term.target, env.joint_pos, rtol=0, atol=0)


def test_reset_with_a_seed_is_reproducible():
    a, b = reach(8, seed=1), reach(8, seed=2)
    b.reset(seed=1)
    assert torch.equal(a.joint_pos, b.joint_pos) and torch.equal(a.goal, b.goal)


@pytest.mark.parametrize("num_links", [2, 3, 5, 7])
def test_goals_are_reachable_starts_within_the_limits_and_no_episode_starts_solved(num_links):
    env = reach(2000, num_links=num_links, link_lengths=[0.3] * num_links, joint_limits=[-2.0, 2.0])
    lo, hi = env.joint_limits
    assert bool(((env.joint_pos >= lo / 2) & (env.joint_pos <= hi / 2)).all())  # init_joint_range 0.5
    assert bool((env.goal.norm(dim=1) <= 0.3 * num_links + 1e-5).all())
    assert bool((env.distance >= env.min_goal_distance).all())
    assert env.tolerance == pytest.approx(0.05 * 0.3 * num_links)
    assert env.observation_spaces["policy"].shape == (3 * num_links + 2,)
    assert env.action_space.shape == (num_links,)
    # every goal is the end effector of some joints within the limits: a 2-link check by inverse kinematics
    if num_links == 2:
        r = env.goal.norm(dim=1)
        elbow = torch.acos(((r**2 - 0.18) / 0.18).clamp(-1, 1))
        assert bool((elbow <= 2.0 + 1e-4).all())


def test_bad_task_options_are_refused():
    for kwargs, message in [
        ({"num_links": 1}, "num_links must be an integer in 2..7"),
        ({"num_links": 8}, "num_links must be an integer in 2..7"),
        ({"link_lengths": [1.0]}, "link_lengths must be 2 positive"),
        ({"joint_limits": [1.0, -1.0]}, "joint_limits must be"),
        ({"hold_steps": 0}, "hold_steps must be"),
        ({"decimation": 0}, "decimation must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            reach(1, **kwargs)


def test_a_saved_env_state_continues_every_episode_exactly():
    kwargs = dict(
        max_episode_steps=15,
        actions={"type": "relative", "scale": 0.3, "reference": "target"},
        observations={"policy": [{"term": "joint_pos", "noise": 0.01}, "goal_rel"], "critic": ["goal"]},
    )
    env = reach(6, seed=4, **kwargs)
    generator = torch.Generator().manual_seed(0)
    actions = [torch.rand(6, 2, generator=generator) * 2 - 1 for _ in range(40)]
    for a in actions[:7]:
        env.step(a)
    saved = env.get_state()
    assert saved["action_target"].shape == (6, 2) and saved["reward_sums"].shape == (6, 4)
    later = [env.step(a) for a in actions[7:]]
    restored = reach(6, seed=99, **kwargs)
    restored.set_state(saved)
    for a, expected in zip(actions[7:], later, strict=True):
        step = restored.step(a)
        torch.testing.assert_close(step.obs, expected.obs, rtol=0, atol=0)
        torch.testing.assert_close(step.reward, expected.reward, rtol=0, atol=0)
        assert torch.equal(step.done_rows, expected.done_rows)
        torch.testing.assert_close(step.episodes, expected.episodes, rtol=0, atol=0)
    assert sum(s.done_rows.numel() for s in later) >= 6  # episodes ended (and reset) after the restore


# -- registration, shards, config -----------------------------------------------------------------


def test_reach_is_registered_and_a_bad_option_names_the_env():
    assert "raysim/Reach" in envs.registered()
    env = make("raysim/Reach", 3, seed=0, num_links=4, max_episode_steps=9)
    assert isinstance(env, Reach) and env.num_links == 4 and env.max_episode_steps == 9
    with pytest.raises(ValueError, match="raysim/Reach has no option 'no_such_option'; its options: "):
        make("raysim/Reach", 2, no_such_option=1)


def test_an_env_shard_on_reach_produces_chunks_with_both_groups_and_episode_reports():
    kwargs = {
        "max_episode_steps": 10,
        "num_links": 3,
        "observations": {
            "policy": [{"term": "joint_pos", "noise": 0.01}, "goal_rel"],
            "critic": ["joint_pos", "joint_vel", "ee_pos", "goal"],
        },
    }
    shard = EnvShard("raysim/Reach", 6, seed=0, env_kwargs=kwargs)
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    chunk = shard.rollout(weights, 25)
    assert set(chunk.obs) == {"policy", "critic"}
    assert chunk.obs["policy"].shape == (26, 6, 5) and chunk.obs["critic"].shape == (26, 6, 10)
    assert chunk.actions.shape == (25, 6, 3)
    assert set(chunk.final_obs) == {"policy", "critic"}
    K = chunk.final_t.numel()
    assert K >= 12  # every row hits the 10-step limit at least twice in 25 steps
    assert chunk.final_obs["policy"].shape == (K, 5) and chunk.final_obs["critic"].shape == (K, 10)
    assert {"success", "final_distance", "reward_distance"} <= set(chunk.episodes)
    assert chunk.episodes["success"].dtype == torch.bool
    done = chunk.terminated | chunk.truncated
    assert int(done.sum()) == K


def test_grpo_groups_share_their_start_and_their_observation_noise_on_a_noisy_reach():
    kwargs = {"observations": {"policy": [{"term": "joint_pos", "noise": 0.05}, "goal_rel"], "critic": ["goal"]}}
    shard = EnvShard("raysim/Reach", 8, seed=2, env_kwargs=kwargs)
    assert shard.env.seeded_reset is True
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, GroupEpisodes(4, 5))
    first = chunk.obs["policy"][0].reshape(2, 4, -1)
    assert torch.equal(first, first[:, :1].expand_as(first))  # noisy, and equal within each group
    assert not torch.equal(first[0, 0], first[1, 0])
    plain = {"observations": {"policy": ["joint_pos", "goal_rel"], "critic": ["goal"]}}
    twin = EnvShard("raysim/Reach", 8, seed=2, env_kwargs=plain)  # the same starts, without noise
    exact = twin.rollout({"version": 0, "actor": twin.actor.state_dict()}, GroupEpisodes(4, 5)).obs["policy"][0]
    assert torch.equal(exact.reshape(2, 4, -1)[..., 2:], first[..., 2:])
    assert bool((exact.reshape(2, 4, -1)[..., :2] != first[..., :2]).all())  # the noise is there


def test_left_out_options_resolve_to_the_defaults_so_the_env_identity_does_not_depend_on_spelling_them_out():
    from raysim.envs.reach import DEFAULT_ACTIONS, DEFAULT_OBSERVATIONS, DEFAULT_REWARDS
    from raysim.identity import env_identity

    implicit = {"id": "raysim/Reach", "kwargs": {"num_links": 4}}
    explicit = {
        "id": "raysim/Reach",
        "kwargs": {
            "num_links": 4,
            "link_lengths": [0.25] * 4,
            "tolerance": 0.05,
            "actions": DEFAULT_ACTIONS,
            "observations": DEFAULT_OBSERVATIONS,
            "rewards": DEFAULT_REWARDS,
        },
    }
    assert env_identity(implicit)[0] == env_identity(explicit)[0]
    assert (
        env_identity(implicit)[0]
        != env_identity({"id": "raysim/Reach", "kwargs": {"num_links": 4, "tolerance": 0.02}})[0]
    )
    env = make("raysim/Reach", 2, **implicit["kwargs"])
    assert env.tolerance == pytest.approx(0.05) and env.link_lengths.tolist() == [0.25] * 4


def test_the_packaged_reach_config_loads_and_builds_its_env():
    config = load_config("reach_ppo")
    assert config.env.id == "raysim/Reach" and config.eval.episodes == 400
    env = make(config.env.id, 2, seed=0, **config.env.kwargs)
    assert set(env.observation_spaces) == {"policy", "critic"}
    assert env.tolerance == pytest.approx(0.05 * env.reach)
