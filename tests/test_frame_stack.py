"""Frame stacking on the shard (``env.frame_stack``): each row's last k observations, restarted at its episode
start, the finished row's final observation being its whole last stack."""

from __future__ import annotations

import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import raysim
from raysim.checkpoint import locate_checkpoint
from raysim.composition import ConfigError
from raysim.coordinator.preflight import check_env_and_model
from raysim.envs import BatchedEnv, FrameStack, FrameStackConfig, Step, stacked
from raysim.envs.contract import take_rows
from raysim.export import load_policy
from raysim.rollout import EnvShard, GroupEpisodes
from tests.support import multi_input  # noqa: F401  (registers RaysimTest/Spot-v0)

K = 3
STACKED = ["image", "hwc", "vector"]


class Tally(BatchedEnv):
    """Row r's episodes last r + 2 steps; its observation at step t of its e-th episode is 10 e + t: an image
    [1, 5, 5] and one [5, 5, 1] full of it (uint8), a vector (v, -v) and a ``plain`` group (v)."""

    env_id = "test/Tally"
    max_episode_steps = None

    def __init__(self, num_envs: int = 3):
        self.num_envs = num_envs
        self.observation_spaces = {
            "image": gym.spaces.Box(0, 255, (1, 5, 5), np.uint8),
            "hwc": gym.spaces.Box(0, 255, (5, 5, 1), np.uint8),
            "vector": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "plain": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
        }
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.t = torch.zeros(num_envs, dtype=torch.int64)
        self.e = torch.zeros(num_envs, dtype=torch.int64)

    def observe(self) -> dict[str, torch.Tensor]:
        v, n = 10 * self.e + self.t, self.num_envs
        return {
            "image": v.to(torch.uint8).view(n, 1, 1, 1).expand(n, 1, 5, 5).clone(),
            "hwc": v.to(torch.uint8).view(n, 1, 1, 1).expand(n, 5, 5, 1).clone(),
            "vector": torch.stack([v, -v], 1).float(),
            "plain": v.float().unsqueeze(1),
        }

    def reset(self, seed=None):
        self.t.zero_(), self.e.zero_()
        return self.observe()

    def reset_rows(self, rows, seeds):
        self.t[rows], self.e[rows] = 0, self.e[rows] + 1
        return self.observe()

    def step(self, actions):
        self.t += 1
        done = self.t >= torch.arange(self.num_envs) + 2
        rows = done.nonzero().squeeze(1)
        final = take_rows(self.observe(), rows) if rows.numel() else {}
        self.t[done], self.e[done] = 0, self.e[done] + 1
        episodes = {"return": torch.zeros(rows.numel()), "length": torch.ones(rows.numel(), dtype=torch.int64)}
        zeros = torch.zeros(self.num_envs, dtype=torch.bool)
        return Step(self.observe(), torch.zeros(self.num_envs), done, zeros, rows, final, episodes if final else {})

    def get_state(self):
        return {"t": self.t.clone(), "e": self.e.clone()}

    def set_state(self, state):
        self.t, self.e = state["t"].clone(), state["e"].clone()


def tally(k: int = K) -> FrameStack:
    return FrameStack(Tally(), FrameStackConfig(k=k, groups=STACKED))


def values(obs: dict[str, torch.Tensor], row: int) -> dict[str, list[float]]:
    """The stacked values of ``row``, oldest first, per group (one per stacked observation)."""
    return {
        "image": obs["image"][row, :, 0, 0].tolist(),
        "hwc": obs["hwc"][row, 0, 0, :].tolist(),
        "vector": obs["vector"][row, 0::2].tolist(),
    }


def same(*values_of_groups: list) -> dict[str, list]:
    return dict.fromkeys(("image", "hwc", "vector"), list(values_of_groups))


def test_stacks_hold_the_last_k_observations_oldest_first_along_channels_and_features():
    env = tally()
    spaces = env.observation_spaces
    assert spaces["image"].shape == (3, 5, 5) and spaces["hwc"].shape == (5, 5, 3) and spaces["vector"].shape == (6,)
    assert spaces["plain"].shape == (1,) and spaces["image"].dtype == np.uint8
    obs = env.reset(0)
    assert values(obs, 2) == same(0, 0, 0)  # a fresh stack: k copies of the first observation
    for _ in range(2):
        obs = env.step(torch.zeros(3, 1)).obs
    assert values(obs, 2) == same(0, 1, 2)
    assert obs["vector"][2].tolist() == [0, 0, 1, -1, 2, -2]  # whole observations, oldest first
    assert obs["plain"][2].tolist() == [2]  # a group not stacked is the env's own
    obs = env.step(torch.zeros(3, 1)).obs
    assert values(obs, 2) == same(1, 2, 3)
    for group in ("image", "hwc", "vector"):
        assert obs[group].shape == (3, *spaces[group].shape)


def test_a_finished_rows_final_obs_is_its_last_stack_owned_and_its_next_obs_k_copies_of_the_new_first():
    env = tally()
    env.reset(0)
    env.step(torch.zeros(3, 1))
    step = env.step(torch.zeros(3, 1))  # row 0's episode (2 steps) ends: obs 0, 1, 2
    assert step.done_rows.tolist() == [0]
    final = {g: v.clone() for g, v in step.final_obs.items()}
    assert values(step.final_obs, 0) == same(0, 1, 2)
    assert step.final_obs["plain"].tolist() == [[2]]
    assert values(step.obs, 0) == same(10, 10, 10)  # episode 1, step 0
    assert values(step.obs, 1) == same(0, 1, 2) and values(step.obs, 2) == same(0, 1, 2)  # other rows go on
    later = [env.step(torch.zeros(3, 1)) for _ in range(3)]
    assert all(torch.equal(final[g], step.final_obs[g]) for g in final)  # owned: later steps change nothing
    assert values(later[0].obs, 0) == same(10, 10, 11)
    assert later[0].done_rows.tolist() == [1]
    assert values(later[0].final_obs, 0) == same(1, 2, 3)  # row 1 (3 steps) ends next: its last stack


def test_reset_rows_restarts_only_those_rows_and_leaves_earlier_observations_as_they_were():
    env = tally()
    env.reset(0)
    before = env.step(torch.zeros(3, 1)).obs
    kept = {g: v.clone() for g, v in before.items()}
    obs = env.reset_rows(torch.tensor([1]), [7])
    assert values(obs, 1) == same(10, 10, 10)
    assert values(obs, 0) == same(0, 0, 1) and values(obs, 2) == same(0, 0, 1)
    assert all(torch.equal(kept[g], before[g]) for g in kept)


def test_images_stay_uint8_and_vectors_float32_in_obs_final_obs_and_state():
    env = tally()
    env.reset(0)
    env.step(torch.zeros(3, 1))
    step = env.step(torch.zeros(3, 1))
    for obs in (step.obs, step.final_obs, env.get_state()["stacks"]):
        assert obs["image"].dtype == torch.uint8 and obs["hwc"].dtype == torch.uint8
        assert obs["vector"].dtype == torch.float32


def test_a_stack_of_one_is_the_env_itself_and_a_bad_stack_is_refused_naming_the_key():
    env = Tally()
    assert stacked(env, FrameStackConfig(k=1)) is env and stacked(env, None) is env
    for config, words in [
        (FrameStackConfig(k=2), "name the groups"),
        (FrameStackConfig(k=2, groups=["nope"]), "'nope' is not a Box group"),
        (FrameStackConfig(k=6, groups=["image"]), "another channel order"),
    ]:
        with pytest.raises(ValueError, match=words):
            stacked(env, config)
    config = raysim.load_config("reach_camera_ppo", ["env.frame_stack.k=2", "env.frame_stack.groups=[cam]"])
    with pytest.raises(ConfigError, match=r"^env.frame_stack.groups: 'cam' is not a Box group"):
        check_env_and_model(config)


CAMERA = {"max_episode_steps": 5, "camera": {"size": 32}}
STACK = {"k": 2, "groups": ["camera"]}
ACTOR = {"actor_inputs": ["camera", "joints"], "critic_inputs": ["critic"], "hidden_sizes": [16]}


def camera_shard(k: int = 2) -> EnvShard:
    stack = {**STACK, "k": k}
    return EnvShard("raysim/ReachCamera", 3, seed=5, model=ACTOR, env_kwargs=CAMERA, frame_stack=stack)


def test_a_shard_state_with_stacks_continues_bitwise_identically():
    shard = camera_shard()
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    first = shard.rollout(weights, 4)
    assert first.obs["camera"].shape == (5, 3, 6, 32, 32) and first.obs["camera"].dtype == torch.uint8
    state = pickle.loads(pickle.dumps(shard.get_state(), protocol=5))  # as a checkpoint keeps it
    assert state["env"]["stacks"]["camera"].dtype == torch.uint8
    expected = shard.rollout(weights, 8)
    resumed = camera_shard()
    assert resumed.set_state(state) == "exact"
    got = resumed.rollout(weights, 8)
    assert got.final_obs["camera"].shape[0] > 0  # episodes of 5 steps ended in the chunk
    for name in ("obs", "final_obs"):
        for group, value in getattr(expected, name).items():
            assert torch.equal(value, getattr(got, name)[group]), (name, group)
    assert torch.equal(expected.actions, got.actions) and torch.equal(expected.reward, got.reward)


def test_a_shard_state_saved_with_another_stack_depth_starts_fresh_episodes_instead():
    shard = camera_shard(k=2)
    shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 3)
    deeper = camera_shard(k=3)
    assert deeper.set_state(shard.get_state()).startswith("fresh episodes (the saved observations have other shapes")
    assert deeper.rollout({"version": 0, "actor": deeper.actor.state_dict()}, 3).obs["camera"].shape[2] == 9


def test_a_gymnasium_env_gets_the_same_stacks_through_the_shard_channels_last():
    spot = {"actor_inputs": ["camera", "joints"], "critic_inputs": ["critic"], "hidden_sizes": [16]}
    stack = {"k": 2, "groups": ["camera", "joints"]}
    shard = EnvShard("gym:RaysimTest/Spot-v0", 2, seed=1, model=spot, frame_stack=stack)
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 9)  # episodes last 8 steps
    camera, joints = chunk.obs["camera"], chunk.obs["joints"]
    assert camera.shape == (10, 2, 16, 16, 6) and camera.dtype == torch.uint8 and joints.shape == (10, 2, 4)
    assert shard.actor.encoders["camera"].shape == (6, 16, 16)  # the CNN reads k x RGB
    assert torch.equal(camera[1:8, :, :, :, :3], camera[:7, :, :, :, 3:])  # each step pushes one image
    assert torch.equal(camera[8, :, :, :, :3], camera[8, :, :, :, 3:])  # a new episode: k copies of its first
    final = chunk.final_obs["camera"]
    assert final.shape == (2, 16, 16, 6) and torch.equal(final[:, :, :, :3], camera[7, :, :, :, 3:])


def test_every_grpo_round_starts_every_row_with_k_copies_of_its_first_observation():
    shard = camera_shard()
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    for _ in range(2):
        first = shard.rollout(weights, GroupEpisodes(group_size=3, max_steps=4)).obs["camera"][0]
        assert torch.equal(first[:, :3], first[:, 3:])
        assert torch.equal(first[0], first[1])  # the group shares its start


def test_ppo_trains_on_camera_reach_with_a_stack_of_two_and_the_cnn_reads_six_channels(tmp_path: Path):
    overrides = [
        "backend=local",
        "env.num_envs=4",
        "env.kwargs.max_episode_steps=6",
        "env.frame_stack.k=2",
        "env.frame_stack.groups=[camera]",
        "algo.num_steps=8",
        "algo.update_epochs=1",
        "algo.num_minibatches=1",
        "train.total_steps=64",
        "eval.episodes=4",
        "eval.num_envs=2",
        "model.hidden_sizes=[16]",
        f"run_dir={tmp_path / 'run'}",
    ]
    trainer = raysim.Trainer(raysim.load_config("reach_camera_ppo", overrides)).train()
    _, _, state, _ = locate_checkpoint(Path(trainer.run_dir))
    convolutions = [v for k, v in state["model"].items() if k.startswith("actor.encoders.camera.") and v.dim() == 4]
    assert convolutions[0].shape[1] == 6  # k x RGB
    assert state["shards"][0]["env"]["stacks"]["camera"].shape == (4, 6, 32, 32)
    _, info = load_policy(trainer.run_dir)  # an exported policy takes the stacked observations
    assert info["observation_shapes"]["camera"] == [6, 32, 32] and info["frame_stack"]["k"] == 2
    with pytest.raises(ConfigError, match=r"frame_stack.k: checkpoint has 2, this config has 3"):
        raysim.Trainer.from_run_dir(trainer.run_dir, overrides=["env.frame_stack.k=3"])
    resumed = raysim.Trainer.from_run_dir(trainer.run_dir, overrides=["train.total_steps=96"]).train()
    assert locate_checkpoint(Path(resumed.run_dir))[3]["iteration"] > 2


def test_a_native_vector_envs_stack_restarts_at_the_new_episodes_first_observation_not_the_old_final_one():
    """A native Gymnasium vector env (NEXT_STEP) shows a finished row's final observation once more and resets it
    in its next step (a reset transition, masked): the stack restarts there, k copies of the new episode's first
    observation, where it held [old final, old final, new first] before."""
    stack = {"k": K, "groups": ["policy"]}
    shard = EnvShard("gym:CartPole-v1", 8, seed=2, env_kwargs={"vectorize": "native"}, frame_stack=stack)
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 60)
    frames = chunk.obs["policy"].reshape(61, 8, K, 4)  # [t, row, frame (oldest first), features]
    finals = {
        (t, row): i for i, (t, row) in enumerate(zip(chunk.final_t.tolist(), chunk.final_row.tolist(), strict=True))
    }
    restarts = (~chunk.mask).nonzero().tolist()  # step t resets the row: obs[t + 1] is its new episode's first
    assert len(restarts) >= 4, "random actions end many CartPole episodes"
    for t, row in restarts:
        first = frames[t + 1, row, -1]
        assert (first.abs() <= 0.05).all(), "not a CartPole start"
        assert all(torch.equal(frames[t + 1, row, i], first) for i in range(K)), (t, row)
        # the done step before it shows the old episode's final observation, last in the old stack
        final = chunk.final_obs["policy"][finals[(t - 1, row)]].reshape(K, 4)
        assert torch.equal(frames[t, row], final) and not torch.equal(final[-1], first)
    shard.env.close()
