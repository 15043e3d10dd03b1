"""``raysim/ReachCamera`` and its renderer: the arm seen from above as uint8 RGB; the target in the image only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import raysim.envs as envs
from raysim.envs import ReachCamera, make
from raysim.envs.camera import Camera, Disks, Segments
from raysim.envs.errors import EnvOptionError
from raysim.identity import env_identity


def camera_reach(num_envs=4, seed=0, **kwargs) -> ReachCamera:
    return make("raysim/ReachCamera", num_envs, seed=seed, **kwargs)


def redness(image: torch.Tensor) -> torch.Tensor:
    """How much target colour each pixel holds: red above the other two channels ([N, H, W])."""
    rgb = image.float()
    return (rgb[:, 0] - rgb[:, 1:].amax(1)).clamp_min(0)


def greenness(image: torch.Tensor) -> torch.Tensor:
    """How much end-effector colour each pixel holds: green above the other two channels ([N, H, W])."""
    rgb = image.float()
    return (rgb[:, 1] - torch.maximum(rgb[:, 0], rgb[:, 2])).clamp_min(0)


def centroid(weights: torch.Tensor) -> torch.Tensor:
    """The weighted centroid [N, 2] (column, row) of [N, H, W] weights, pixel j spanning [j, j + 1)."""
    n, h, w = weights.shape
    columns = torch.arange(w, dtype=torch.float32) + 0.5
    rows = torch.arange(h, dtype=torch.float32) + 0.5
    total = weights.sum((1, 2))
    return torch.stack(((weights.sum(1) * columns).sum(1) / total, (weights.sum(2) * rows).sum(1) / total), 1)


def spread_out(env: ReachCamera) -> None:
    """Every row: the goal away from the arm (the point opposite the end effector), so nothing covers it."""
    env.goal.copy_(-env.ee_pos * 0.9)


# -- the image ---------------------------------------------------------------------------------------


def test_the_camera_group_is_uint8_channels_first_in_its_declared_space_and_the_others_are_vectors():
    env = camera_reach(3, camera={"size": 24})
    space = env.observation_spaces["camera"]
    assert space.dtype == np.uint8 and space.shape == (3, 24, 24) and space.low.min() == 0 and space.high.max() == 255
    obs = env.reset(seed=1)
    assert set(obs) == {"camera", "joints", "critic"} == set(env.observation_spaces)
    assert obs["camera"].dtype == torch.uint8 and obs["camera"].shape == (3, 3, 24, 24)
    assert space.contains(obs["camera"][0].numpy())
    for group in ("joints", "critic"):
        assert obs[group].dtype == torch.float32 and obs[group].shape == (3, *env.observation_spaces[group].shape)
    assert make("raysim/ReachCamera", 1).observation_spaces["camera"].shape == (3, 32, 32)  # 32 px by default


def test_the_target_and_the_end_effector_appear_where_the_state_puts_them():
    env = camera_reach(16, seed=3)
    spread_out(env)
    image = env._observe()["camera"]
    expected_target = env.camera.pixel_position(env.goal)
    expected_ee = env.camera.pixel_position(env.ee_pos)
    torch.testing.assert_close(centroid(redness(image)), expected_target, atol=0.25, rtol=0)
    torch.testing.assert_close(centroid(greenness(image)), expected_ee, atol=0.25, rtol=0)


def test_the_policy_groups_do_not_carry_the_target_and_the_critic_does():
    env = camera_reach(8, seed=2)
    before = env._observe()
    env.goal.copy_(-env.goal)  # another target, the arm unchanged
    after = env._observe()
    assert torch.equal(before["joints"], after["joints"])  # no target in the joint vector
    assert not torch.equal(before["camera"], after["camera"])  # the image shows it
    assert not torch.equal(before["critic"], after["critic"])  # the privileged critic sees it
    assert "goal" in env.observations.names("critic") and "goal_rel" in env.observations.names("critic")


def test_sub_pixel_moves_of_the_target_change_the_image_through_intermediate_edge_values():
    env = camera_reach(1, seed=0)
    spread_out(env)
    first = env._observe()["camera"]
    env.goal += torch.tensor([[0.2, 0.1]]) * env.camera.pixel  # a fifth of a pixel across, a tenth down
    moved = env._observe()["camera"]
    assert not torch.equal(first, moved)
    target = redness(first)[0]
    edge = (target > 0) & (target < target.max())
    assert int(edge.sum()) >= 4  # partly covered pixels around the disk, not a hard 0/1 mask
    distinct = torch.unique(first[0].reshape(3, -1), dim=1).shape[1]
    assert distinct > 10  # blends of every colour with the background, not a handful of flat colours


def test_the_renderer_draws_a_segment_and_a_disk_with_smooth_edges_where_they_are():
    camera = Camera(16, half_width=1.0, background=(0, 0, 0))
    line = Segments(torch.tensor([[[-0.5, 0.0]]]), torch.tensor([[[0.5, 0.0]]]), radius=0.125, colour=(255, 255, 255))
    disk = Disks(torch.tensor([[[0.0, 0.5]]]), radius=0.2, colour=(255, 0, 0))
    image = camera.render([line, disk], num_scenes=1)[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 16, 16)
    # a line 2 px wide through the middle: rows 7 and 8 (centres half a pixel from it) lit along x in [-0.5, 0.5]
    assert int(image[1, 7, 8]) == 255 and int(image[1, 8, 4]) == 255 and int(image[1, 7, 14]) == 0
    assert int(image[1, 6, 8]) == 0 and 0 < int(image[1, 7, 3]) < 255  # nothing above; a soft rounded end
    # the disk: red, centred at column 8 (x = 0), row 4 (y = 0.5): its centroid is there
    red = (image[0].float() - image[1].float()).clamp_min(0)[None]
    torch.testing.assert_close(centroid(red), camera.pixel_position(torch.tensor([[0.0, 0.5]])), atol=0.05, rtol=0)


# -- the step contract ---------------------------------------------------------------------------------


def test_a_finished_rows_final_obs_is_its_last_image_owned_and_unchanged_by_later_steps():
    env = camera_reach(4, seed=5, max_episode_steps=10)
    twin = camera_reach(4, seed=5, max_episode_steps=10)  # the same rows, none finishing
    env.episode_length[torch.tensor([1, 3])] = 9  # rows 1 and 3 reach the step limit on the next step
    actions = torch.full((4, 2), 0.5)
    step = env.step(actions)
    twin_obs = twin.step(actions).obs
    assert step.done_rows.tolist() == [1, 3] and set(step.final_obs) == {"camera", "joints", "critic"}
    assert step.final_obs["camera"].dtype == torch.uint8 and step.final_obs["camera"].shape == (2, 3, 32, 32)
    for group in step.final_obs:
        assert torch.equal(step.final_obs[group], twin_obs[group][[1, 3]])  # the episode's last observation
    assert not torch.equal(step.final_obs["camera"], step.obs["camera"][[1, 3]])  # not the new episode's first
    kept = {k: v.clone() for k, v in step.final_obs.items()}
    for _ in range(12):
        env.step(torch.rand(4, 2) * 2 - 1)
    env.reset(seed=3)
    env.joint_pos.fill_(0.0)
    for group in kept:
        assert torch.equal(step.final_obs[group], kept[group])


def test_episodes_rewards_and_success_are_those_of_reach_for_the_same_seed_and_actions():
    options = dict(max_episode_steps=12, tolerance=0.3, min_goal_distance=0.31)  # some random arms succeed
    camera, plain = camera_reach(6, seed=7, **options), make("raysim/Reach", 6, seed=7, **options)
    generator = torch.Generator().manual_seed(0)
    finished = successes = 0
    for _ in range(40):
        actions = torch.rand(6, 2, generator=generator) * 2 - 1
        a, b = camera.step(actions), plain.step(actions)
        torch.testing.assert_close(a.reward, b.reward, rtol=0, atol=0)
        assert torch.equal(a.terminated, b.terminated) and torch.equal(a.truncated, b.truncated)
        torch.testing.assert_close(a.episodes, b.episodes, rtol=0, atol=0)
        torch.testing.assert_close(a.obs["critic"], b.obs["critic"], rtol=0, atol=0)
        finished += a.done_rows.numel()
        successes += int(a.episodes["success"].sum()) if a.done_rows.numel() else 0
    assert finished >= 6 and successes >= 1 and torch.equal(camera.goal, plain.goal)


def test_reset_rows_with_equal_seeds_give_equal_images():
    env = camera_reach(4, seed=0)
    obs = env.reset_rows(torch.tensor([0, 2]), [11, 11])
    assert torch.equal(obs["camera"][0], obs["camera"][2]) and not torch.equal(obs["camera"][0], obs["camera"][1])


def test_a_saved_env_state_continues_with_the_same_images():
    env = camera_reach(3, seed=4, max_episode_steps=6)
    generator = torch.Generator().manual_seed(1)
    actions = [torch.rand(3, 2, generator=generator) * 2 - 1 for _ in range(12)]
    for a in actions[:4]:
        env.step(a)
    restored = camera_reach(3, seed=99, max_episode_steps=6)
    restored.set_state(env.get_state())
    for a in actions[4:]:
        expected, step = env.step(a), restored.step(a)
        assert torch.equal(step.obs["camera"], expected.obs["camera"]) and torch.equal(
            step.done_rows, expected.done_rows
        )
        for group in expected.final_obs:
            assert torch.equal(step.final_obs[group], expected.final_obs[group])


# -- options, registration ------------------------------------------------------------------------------


def test_camera_reach_is_registered_with_reachs_options_and_refuses_bad_ones():
    assert "raysim/ReachCamera" in envs.registered()
    env = make("raysim/ReachCamera", 2, num_links=3, camera={"size": 20})
    assert env.num_links == 3 and env.observation_spaces["camera"].shape == (3, 20, 20)
    with pytest.raises(EnvOptionError, match="raysim/ReachCamera has no option 'camra'; did you mean 'camera'"):
        make("raysim/ReachCamera", 2, camra={"size": 20})
    with pytest.raises(ValueError, match="camera size must be an integer"):
        make("raysim/ReachCamera", 2, camera={"size": 0})
    with pytest.raises(ValueError, match="camera must be a mapping like \\{size: 32\\}, got 32"):
        make("raysim/ReachCamera", 2, camera=32)
    with pytest.raises(ValueError, match="camera: unknown keys \\['fov'\\]"):
        make("raysim/ReachCamera", 2, camera={"size": 32, "fov": 1})
    with pytest.raises(ValueError, match="'camera' is the image"):
        make("raysim/ReachCamera", 2, observations={"camera": ["joint_pos"], "critic": ["goal"]})


def test_left_out_camera_options_resolve_to_the_defaults_in_the_env_identity():
    implicit = {"id": "raysim/ReachCamera", "kwargs": {}}
    explicit = {"id": "raysim/ReachCamera", "kwargs": {"camera": {"size": 32}}}
    assert env_identity(implicit)[0] == env_identity(explicit)[0]
    larger = {"id": "raysim/ReachCamera", "kwargs": {"camera": {"size": 48}}}
    assert env_identity(implicit)[0] != env_identity(larger)[0]


def test_pixel_positions_follow_the_image_axes():
    camera = Camera(10, half_width=1.0)
    corners = camera.pixel_position(torch.tensor([[-1.0, 1.0], [1.0, -1.0], [0.0, 0.0]]))
    torch.testing.assert_close(corners, torch.tensor([[0.0, 0.0], [10.0, 10.0], [5.0, 5.0]]))
    assert math.isclose(camera.pixel, 0.2)


def test_shapes_across_the_image_edge_are_cut_there_and_never_wrap_to_the_other_side():
    camera = Camera(8, half_width=1.0)
    centres = torch.tensor([[[1.0, 0.0]], [[-1.0, 1.0]], [[5.0, 5.0]]])  # the right edge, the top left corner, far out
    image = camera.render([Disks(centres, radius=0.3, colour=(255, 255, 255))], num_scenes=3)[:, 0].float()
    assert image[0, 3:5, 6:].min() > 0 and image[0, :, :4].max() == 0  # half a disk at the right edge only
    assert image[1, 0, 0] > 0 and image[1, 4:, :].max() == 0 and image[1, :, 4:].max() == 0
    assert image[2].max() == 0
    long = Segments(torch.tensor([[[-50.0, 0.0]]]), torch.tensor([[[50.0, 0.0]]]), radius=0.25, colour=(255, 255, 255))
    line = camera.render([long], num_scenes=1)[0, 0]  # far longer than the image: cut at its sides
    assert line[3:5].min() == 255 and line[:2].max() == 0 and line[6:].max() == 0
    assert camera.render([Disks(centres[:0], radius=0.3, colour=(255, 255, 255))], num_scenes=0).shape == (0, 3, 8, 8)
