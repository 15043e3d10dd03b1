"""Image observations end to end: uint8 from the env through chunks, final observations and shard state
to a CNN encoder (x / 255 inside the model); several named inputs per network."""

from __future__ import annotations

import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import raysim
from raysim.checkpoint import locate_checkpoint
from raysim.envs import make
from raysim.envs.spaces import channels_first, image_shape, is_image_space
from raysim.models import ActorCritic, ModelConfig
from raysim.rollout import EnvShard
from raysim.rollout.inference import inference
from tests.support import multi_input  # noqa: F401  (registers RaysimTest/Spot-v0)
from tests.support.multi_input import tiny_spot_run

SPOT = "tests.support.multi_input:Spot"
INPUTS = {"actor_inputs": ["camera", "joints"], "critic_inputs": ["critic"]}


def test_image_spaces_are_told_as_sb3_does_with_the_channel_order_from_the_smallest_dimension():
    hwc, chw = gym.spaces.Box(0, 255, (32, 32, 3), np.uint8), gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert is_image_space(hwc) and is_image_space(chw)
    assert not channels_first(hwc) and channels_first(chw)
    assert image_shape(hwc) == (3, 32, 32) and image_shape(chw) == (4, 84, 84)
    assert not is_image_space(gym.spaces.Box(0, 255, (32, 32, 3), np.float32))  # a float box is a vector
    assert not is_image_space(gym.spaces.Box(0, 255, (12,), np.uint8))


def test_the_gymnasium_adapter_keeps_an_image_group_uint8_and_vector_groups_float32():
    env = make("gym:RaysimTest/Spot-v0", 2, seed=0)
    step = None
    for _ in range(8):  # episodes last 8 steps: the last step has final observations
        step = env.step(torch.zeros(2, dtype=torch.int64))
    assert step.obs["camera"].dtype == torch.uint8 and step.obs["joints"].dtype == torch.float32
    assert step.final_obs["camera"].dtype == torch.uint8 and step.final_obs["camera"].shape == (2, 16, 16, 3)
    env.close()


def shard_chunk(image_dtype: str, steps: int = 8) -> tuple[EnvShard, object]:
    model = ModelConfig(**INPUTS, hidden_sizes=[16])
    shard = EnvShard(SPOT, 4, seed=3, model=model, env_kwargs={"image_dtype": image_dtype})
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    return shard, shard.rollout(weights, steps)


def test_a_chunk_of_uint8_images_has_a_quarter_of_the_float32_bytes_and_the_same_values_in_the_model():
    shard, chunk = shard_chunk("uint8")
    _, floats = shard_chunk("float32")
    chunk = pickle.loads(pickle.dumps(chunk, protocol=5))  # as it travels through Ray's object store
    camera = chunk.obs["camera"]
    assert camera.dtype == torch.uint8 and chunk.final_obs["camera"].dtype == torch.uint8
    assert chunk.final_obs["camera"].shape[0] > 0  # the 8-step episodes ended in the chunk
    assert camera.nbytes * 4 == floats.obs["camera"].nbytes
    assert chunk.final_obs["camera"].nbytes * 4 == floats.final_obs["camera"].nbytes
    assert chunk.obs["joints"].dtype == torch.float32
    encoder = shard.actor.encoders["camera"]
    as_floats = floats.obs["camera"].flatten(0, 1).permute(0, 3, 1, 2) / 255  # the model's x / 255, channels first
    assert torch.equal(encoder.scale(camera.flatten(0, 1)), as_floats)
    state = pickle.loads(pickle.dumps(shard.get_state(), protocol=5))  # shard state: checkpoints
    assert state["obs"]["camera"].dtype == torch.uint8


def test_a_shard_actor_hands_the_learner_uint8_images_through_the_object_store(ray_session):
    model = ModelConfig(**INPUTS, hidden_sizes=[16])
    shard = ray_session.remote(num_cpus=1)(EnvShard).remote(SPOT, 4, 3, model)
    try:
        local = EnvShard(SPOT, 4, seed=3, model=model)
        weights = {"version": 0, "actor": local.actor.state_dict()}
        chunk = ray_session.get(shard.rollout.remote(weights, 8))
        assert chunk.obs["camera"].dtype == torch.uint8 and chunk.final_obs["camera"].dtype == torch.uint8
        assert torch.equal(chunk.obs["camera"], local.rollout(weights, 8).obs["camera"])  # same seed, same rows
    finally:
        ray_session.kill(shard)


def test_the_actor_reads_its_named_inputs_through_a_cnn_and_the_critic_its_own():
    env = make(SPOT, 2, seed=0, size=40, layout="chw")
    model = ActorCritic(env.observation_spaces, env.action_space, ModelConfig(**INPUTS, obs_norm=True))
    assert list(model.actor.encoders) == ["camera"] and model.actor.inputs == ["camera", "joints"]
    assert type(model.actor.encoders["camera"]).__name__ == "NatureCNN"  # 40 px: the Nature CNN fits
    assert model.critic.inputs == ["critic"] and len(model.critic.encoders) == 0
    assert model.actor.obs_norm.mean.numel() == 2  # the vector group only: images are not normalized
    small = ActorCritic(make(SPOT, 1, size=16).observation_spaces, env.action_space, ModelConfig(**INPUTS))
    assert type(small.actor.encoders["camera"]).__name__ == "SmallCNN"  # under 36 px
    impala = ActorCritic(env.observation_spaces, env.action_space, ModelConfig(**INPUTS, cnn="impala"))
    keypoints = ActorCritic(
        env.observation_spaces, env.action_space, ModelConfig(**INPUTS, cnn="keypoints", cnn_features=8)
    )
    assert keypoints.actor.in_dim == 2 + 8  # the joints and four keypoints' x and y
    obs = env.reset(0)
    with inference(model), inference(impala), inference(keypoints):
        assert model.actor(obs).shape == (2, 2) and model.critic(obs).shape == (2,)
        assert impala.actor(obs).shape == (2, 2) and keypoints.actor(obs).shape == (2, 2)


class Fixed(torch.nn.Module):
    """A body that gives the same feature maps whatever the image."""

    def __init__(self, maps: torch.Tensor):
        super().__init__()
        self.maps = maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.maps


def test_the_keypoint_encoder_gives_each_maps_expected_position_with_x_along_columns_and_y_down_rows():
    from raysim.models.encoders import KeypointCNN

    space = gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)
    encoder = KeypointCNN(space, 4)  # two keypoints
    images = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    assert encoder(images).shape == (1, 4)  # x and y of each keypoint
    maps = torch.zeros(1, 2, 16, 16)  # what a stride-2 body gives at 32 px
    maps[0, 0, 3, 12] = maps[0, 1, 15, 0] = 50.0  # a sharp peak: row 3 column 12, row 15 column 0
    encoder.net = Fixed(maps)
    x0, y0, x1, y1 = encoder(images)[0].tolist()
    assert (x0, y0) == pytest.approx((-1 + 2 * 12 / 15, -1 + 2 * 3 / 15), abs=1e-6)
    assert (x1, y1) == pytest.approx((-1.0, 1.0), abs=1e-6)
    maps[0, 0, 3, 13] = 50.0  # two equal peaks: the keypoint halfway, a sub-pixel position
    assert encoder(images)[0, 0].item() == pytest.approx(-1 + 2 * 12.5 / 15, abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        KeypointCNN(space, 3)


def test_the_critic_falls_back_to_the_actors_inputs_when_the_env_has_no_critic_group():
    env = make("raysim/CartPole", 2, seed=0)
    model = ActorCritic(env.observation_spaces, env.action_space, ModelConfig())
    assert model.critic.inputs == ["policy"]


def test_a_network_naming_a_group_the_env_lacks_says_which_groups_there_are():
    env = make(SPOT, 2, seed=0)
    with pytest.raises(ValueError, match=r"model.actor_inputs.*'policy'.*camera"):
        ActorCritic(env.observation_spaces, env.action_space, ModelConfig())


def test_the_default_model_keeps_todays_weight_names():
    env = make("raysim/Reach", 2, seed=0)
    keys = list(ActorCritic(env.observation_spaces, env.action_space, ModelConfig(obs_norm=True)).state_dict())
    net = [f"net.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]
    norm = ["obs_norm.mean", "obs_norm.var", "obs_norm.count"]
    assert keys == ["actor.log_std"] + [f"actor.{k}" for k in norm + net] + [f"critic.{k}" for k in norm + net]


def train_spot(root: Path, *overrides: str) -> Path:
    """A tiny PPO run on the Spot env (camera and joints for the actor, a privileged critic), in-process."""
    settings = tiny_spot_run(root / "run", "model.hidden_sizes=[32]", "model.critic_inputs=[critic]", *overrides)
    return Path(raysim.Trainer(raysim.load_config(None, settings)).train().run_dir)


@pytest.fixture(scope="module")
def spot_run(tmp_path_factory) -> Path:
    return train_spot(tmp_path_factory.mktemp("spot"))


@pytest.fixture(scope="module")
def keypoint_run(tmp_path_factory) -> Path:
    return train_spot(tmp_path_factory.mktemp("keypoints"), "model.cnn=keypoints", "model.cnn_features=8")


def test_ppo_trains_a_cnn_and_mlp_actor_with_a_privileged_critic_and_resumes(spot_run):
    _, _, state, meta = locate_checkpoint(spot_run)
    keys = state["model"].keys()
    assert any(k.startswith("actor.encoders.camera.") for k in keys)
    assert not any(k.startswith("critic.encoders.") for k in keys)
    assert state["model"]["critic.net.0.weight"].shape[1] == 1  # the critic reads its one privileged value
    assert state["shards"][0]["obs"]["camera"].dtype == torch.uint8  # the checkpointed shard state keeps uint8
    assert state["model"]["actor.obs_norm.mean"].shape == (2,) and state["model"]["actor.obs_norm.count"] > 0
    resumed = raysim.Trainer.from_run_dir(spot_run, overrides=["train.total_steps=384"]).train()
    assert locate_checkpoint(spot_run)[3]["iteration"] > meta["iteration"]
    assert Path(resumed.run_dir) == spot_run


@pytest.mark.parametrize("run", ["spot_run", "keypoint_run"])
@pytest.mark.parametrize("format", ["torchscript", "onnx"])
def test_an_exported_multi_input_policy_acts_as_the_model(request, tmp_path, format, run):
    from raysim.export import export_policy, load_policy

    spot_run = request.getfixturevalue(run)

    out = tmp_path / f"policy.{'pt' if format == 'torchscript' else 'onnx'}"
    info = export_policy(spot_run, out, format)
    assert info["inputs"] == ["camera", "joints"]
    policy, _ = load_policy(spot_run)
    env = make(SPOT, 6, seed=5)
    obs = {k: env.reset(5)[k] for k in info["inputs"]}
    with torch.no_grad():
        expected = policy(obs)
    if format == "torchscript":
        assert torch.equal(torch.jit.load(str(out))(obs), expected)
    else:
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(out))
        got = session.run(None, {k: v.numpy() for k, v in obs.items()})[0]
        assert np.array_equal(got, expected.numpy())


def test_a_checkpoint_saved_before_named_inputs_resumes_and_a_changed_input_is_refused_in_one_line():
    from raysim.config import to_dict
    from raysim.coordinator.snapshot import resume_refusal

    config = raysim.load_config(None, [])
    before = {
        k: v
        for k, v in to_dict(config.model).items()
        if k not in ("actor_inputs", "critic_inputs", "cnn", "cnn_features")
    }
    assert resume_refusal({"model": before}, config) is None
    changed = raysim.load_config(None, ["model.cnn=impala"])
    refusal = resume_refusal({"model": before}, changed)
    assert refusal.splitlines()[1:] == ["  model.cnn: checkpoint has 'auto', this config has 'impala'"]


def test_networks_with_a_cnn_act_and_value_through_their_own_forward_not_the_fused_path():
    from raysim.rollout.advantages import chunk_values

    shard, chunk = shard_chunk("uint8")
    assert not shard.actor.fusable and shard.acting.fused is None  # the fused MLP path never took the CNN actor
    obs = {k: v[:-1].flatten(0, 1) for k, v in chunk.obs.items()}
    with inference(shard.actor):
        logp, _ = shard.actor.log_prob_entropy(obs, chunk.actions.flatten())
    assert torch.allclose(logp, chunk.logp.flatten(), atol=1e-6)
    env = make(SPOT, 1)
    config = ModelConfig(actor_inputs=["camera", "joints"], critic_inputs=["camera", "critic"], hidden_sizes=[16])
    critic = ActorCritic(env.observation_spaces, env.action_space, config).critic
    values, _ = chunk_values(critic, chunk)
    with inference(critic):
        assert torch.allclose(values, critic({k: v[:-1].flatten(0, 1) for k, v in chunk.obs.items()}).reshape(8, 4))
