"""Large tensors cross Ray's object store as NumPy arrays (out of band, zero-copy): chunks, shard states, weights.

Pickle protocol 5 with a ``buffer_callback`` is what Ray does: a buffer handed to the callback is written
into the object store once and mapped by the reader; bytes inside the pickle are copied on both sides.
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict

import torch

from raysim.actors import LocalBackend
from raysim.algos.epochs import concat, transitions
from raysim.algos.ppo import PPOConfig
from raysim.learner.learner import Learner
from raysim.models import ModelConfig
from raysim.rollout.arrays import ArrayDict, from_arrays, plain, to_arrays
from raysim.rollout.shard import EnvShard

CAMERA = {"actor_inputs": ["camera", "joints"]}  # raysim/ReachCamera: the actor sees the image


def through_ray_pickle(value):
    """``value`` pickled and unpickled as Ray does (protocol 5, out-of-band buffers); and those buffers' bytes."""
    buffers = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=buffers), sum(b.raw().nbytes for b in buffers), len(data)


def assert_bitwise_equal(got, want):
    assert type(got) is type(want) or (isinstance(want, dict) and type(got) is dict), (type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            assert_bitwise_equal(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_bitwise_equal(a, b)
    elif torch.is_tensor(want):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(
            got.view(torch.uint8) if got.dtype.is_floating_point else got,
            want.view(torch.uint8) if want.dtype.is_floating_point else want,
        )  # NaN bits too
    else:
        assert got == want


def test_nested_tensors_round_trip_bitwise_with_their_dtypes_out_of_band():
    image = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    weights = OrderedDict(w=torch.tensor([1.5, float("nan"), -0.0]), b=torch.tensor([1, 2], dtype=torch.bfloat16))
    weights._metadata = {"": {"version": 1}}
    value = {
        "obs": {"camera": image, "strided": image[:, 1::2, :, ::3]},
        "weights": weights,
        "flags": [torch.tensor([True, False]), (torch.tensor(7), 3, "x")],
        "shape": torch.Size([2, 3]),
        "none": None,
    }
    got, out_of_band, in_band = through_ray_pickle(ArrayDict(value))
    assert type(got) is dict  # the reader gets a plain dict
    assert_bitwise_equal(got, value)
    assert type(got["weights"]) is OrderedDict and got["weights"]._metadata == weights._metadata
    assert out_of_band >= image.numel()  # the image's bytes never went through the pickle stream
    assert in_band < image.numel() // 4  # only the strided view (1/6 of it, copied) went in band
    assert_bitwise_equal(from_arrays(to_arrays(value)), value)  # in-process, no pickle: the same


def test_shard_state_with_image_observations_travels_out_of_band_and_a_shard_continues_from_it():
    shard = EnvShard("raysim/ReachCamera", 3, seed=1, model=CAMERA)
    weights = {"version": 1, "actor": shard.actor.state_dict()}
    shard.rollout(weights, 4)
    state = shard.get_state()
    got, out_of_band, in_band = through_ray_pickle(state)
    camera = state["obs"]["camera"]
    assert camera.dtype == torch.uint8 and got["obs"]["camera"].dtype == torch.uint8
    assert_bitwise_equal(got, plain(state))
    assert out_of_band >= camera.numel() and in_band < camera.numel()

    other = EnvShard("raysim/ReachCamera", 3, seed=1, model=CAMERA)
    assert other.set_state(got) == "exact"  # read-only views of the object store: the shard copies what it keeps
    a, b = shard.rollout(weights, 5), other.rollout(weights, 5)
    assert_bitwise_equal(b.obs, a.obs)
    assert torch.equal(b.actions, a.actions) and torch.equal(b.reward, a.reward)


def test_learner_weights_and_snapshot_travel_out_of_band_and_are_consumed():
    shard = EnvShard("raysim/ReachCamera", 2, seed=1, model=CAMERA)
    spaces, action_space = shard.spaces()[:2]
    learner = Learner(spaces, action_space, ModelConfig(**CAMERA), PPOConfig(), horizon=1000, seed=2)

    weights, out_of_band, in_band = through_ray_pickle(learner.get_weights())
    assert out_of_band > in_band  # the CNN's parameters went out of band
    assert_bitwise_equal(weights, plain(learner.get_weights()))
    shard.set_weights(weights)
    assert_bitwise_equal(shard.actor.state_dict(), learner.model.actor.state_dict())

    snapshot, out_of_band, _ = through_ray_pickle(learner.snapshot())
    assert out_of_band > 0
    fresh = Learner(spaces, action_space, ModelConfig(**CAMERA), PPOConfig(), horizon=1000, seed=3)
    fresh.load_state(snapshot)
    assert_bitwise_equal(fresh.model.state_dict(), learner.model.state_dict())


def test_in_process_roles_hand_plain_dicts_that_a_checkpoint_loads_with_weights_only():
    shard = LocalBackend().create(EnvShard, "raysim/ReachCamera", 2, seed=1, model=CAMERA)
    state = shard.call(EnvShard.get_state)
    assert type(state) is dict
    buffer = io.BytesIO()
    torch.save({"shards": [state]}, buffer)
    buffer.seek(0)
    assert_bitwise_equal(torch.load(buffer, weights_only=True)["shards"][0], state)


def test_a_shard_state_read_by_another_ray_actor_is_consumed_exactly(ray_session):
    import ray

    remote = ray.remote(EnvShard).options(num_cpus=1)
    first, second = (remote.remote("raysim/ReachCamera", 2, seed=1, model=CAMERA) for _ in range(2))
    try:
        _, _, state = first.collect.options(num_returns=3).remote({"version": 1, "actor": local_actor()}, 3)
        assert ray.get(second.set_state.remote(state)) == "exact"
        fetched = ray.get(state)
        assert type(fetched) is dict and fetched["obs"]["camera"].dtype == torch.uint8
        assert_bitwise_equal(ray.get(second.get_state.remote()), fetched)
    finally:
        ray.kill(first)
        ray.kill(second)


def local_actor() -> dict:
    return EnvShard("raysim/ReachCamera", 1, seed=1, model=CAMERA).actor.state_dict()


def test_the_learner_copies_a_single_chunks_transitions_out_of_the_object_store_once():
    shard = EnvShard("raysim/ReachCamera", 2, seed=1, model=CAMERA)
    chunk, _, _ = through_ray_pickle(shard.rollout({"version": 1, "actor": shard.actor.state_dict()}, 3))
    part = transitions(chunk)  # the copy out of the store (boolean mask): writable, owned
    batch = concat([part])
    assert batch["obs"]["camera"].data_ptr() == part["obs"]["camera"].data_ptr()  # no second copy
    assert batch["actions"].data_ptr() == part["actions"].data_ptr()
    two = concat([part, part])
    assert torch.equal(two["obs"]["camera"], torch.cat([part["obs"]["camera"]] * 2))
