"""EnvShard: owned chunks, episode bookkeeping across chunks, Ray parity, non-finite envs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import raysim
from raysim.envs import CartPole, register
from raysim.learner.learner import Learner
from raysim.rollout import EnvShard, NonFiniteError, RolloutChunk


class NaNCartPole(CartPole):
    """CartPole that puts NaN into one row's observation or reward at one step (counted from 0)."""

    env_id = "test/NaNCartPole"

    def __init__(self, num_envs, seed=None, nan_row=1, nan_step=5, where="obs", **kwargs):
        self.nan_row, self.nan_step, self.where, self.steps_taken = nan_row, nan_step, where, 0
        super().__init__(num_envs, seed, **kwargs)

    def _advance(self, actions):
        reward, terminated = super()._advance(actions)
        if self.steps_taken == self.nan_step:
            if self.where == "obs":
                self.state[self.nan_row, 2] = float("nan")
            else:
                reward[self.nan_row] = float("inf") if self.where == "inf_reward" else float("nan")
        self.steps_taken += 1
        return reward, terminated


register("test/NaNCartPole", NaNCartPole)


def weights_of(shard: EnvShard, version: int = 0) -> dict:
    return {"version": version, "actor": {k: v.clone() for k, v in shard.actor.state_dict().items()}}


def chunk_tensors(chunk: RolloutChunk) -> dict[str, torch.Tensor]:
    out = {}
    for field in dataclasses.fields(chunk):
        value = getattr(chunk, field.name)
        if isinstance(value, dict):
            out.update({f"{field.name}[{k}]": v for k, v in value.items()})
        elif isinstance(value, torch.Tensor):
            out[field.name] = value
    return out


def assert_chunks_equal(a: RolloutChunk, b: RolloutChunk) -> None:
    ta, tb = chunk_tensors(a), chunk_tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name
    for field in ("policy_version", "shard", "nonfinite"):
        assert getattr(a, field) == getattr(b, field), field


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_chunk_has_the_documented_shapes_and_dtypes():
    shard = EnvShard("raysim/CartPole", 8, seed=0, shard_index=2)
    chunk = shard.rollout(weights_of(shard, version=4), 50)
    assert chunk.num_steps == 50 and chunk.num_envs == 8
    assert chunk.obs["policy"].shape == (51, 8, 4) and chunk.obs["policy"].dtype == torch.float32
    assert chunk.actions.shape == (50, 8) and chunk.actions.dtype == torch.int64
    assert chunk.logp.shape == (50, 8) and (chunk.logp <= 0).all()
    assert chunk.reward.dtype == torch.float32 and chunk.terminated.dtype == chunk.truncated.dtype == torch.bool
    assert chunk.policy_version == 4 and chunk.shard == 2 and chunk.nonfinite == 0
    assert chunk.mask.all() and chunk.env_steps == 400
    K = chunk.final_t.numel()
    assert K > 0 and chunk.final_obs["policy"].shape == (K, 4) and chunk.final_row.shape == (K,)
    for column in chunk.episodes.values():
        assert column.shape == (K,)


def test_final_positions_match_the_done_flags_and_reports_ride_along():
    shard = EnvShard("raysim/CartPole", 16, seed=3, env_kwargs={"max_episode_steps": 25})
    chunk = shard.rollout(weights_of(shard), 80)
    done = chunk.terminated | chunk.truncated
    t, row = done.nonzero().unbind(1)  # row-major: by step, then ascending row
    assert torch.equal(chunk.final_t, t) and torch.equal(chunk.final_row, row)
    assert torch.equal(chunk.episodes["t"], t) and torch.equal(chunk.episodes["row"], row)
    # the final observation is the state before the reset, not the next chunk row's reset obs
    assert not torch.isclose(chunk.final_obs["policy"], chunk.obs["policy"][t + 1, row]).all(1).any()
    assert (chunk.obs["policy"][t + 1, row].abs() <= 0.05).all()
    assert (chunk.truncated & ~chunk.terminated).any() and chunk.terminated.any()


def test_final_obs_is_unchanged_by_later_steps_and_in_place_writes():
    shard = EnvShard("raysim/CartPole", 16, seed=1)
    weights = weights_of(shard)
    first = shard.rollout(weights, 60)
    assert first.final_obs["policy"].shape[0] > 5
    saved = {name: t.clone() for name, t in chunk_tensors(first).items()}

    env = shard.env
    env_storages = {storage(t) for t in (env.state, env.episode_length, env.episode_return)}
    tensors = [t for t in chunk_tensors(first).values() if t.numel()]
    chunk_storages = [storage(t) for t in tensors]
    assert len(set(chunk_storages)) == len(chunk_storages)  # no two chunk tensors share storage
    assert not set(chunk_storages) & env_storages
    assert storage(first.final_obs["policy"]) != storage(first.obs["policy"])

    second = shard.rollout(weights, 60)
    assert not {storage(t) for t in chunk_tensors(second).values() if t.numel()} & set(chunk_storages)
    env.state.fill_(123.0)  # in-place writes to everything the env holds
    env.episode_length.fill_(7)
    env.episode_return.fill_(7.0)
    env.reset(seed=5)
    shard.rollout(weights, 10)
    for name, t in chunk_tensors(first).items():
        assert torch.equal(t, saved[name]), name


def test_consecutive_chunks_continue_from_the_last_observation():
    shard = EnvShard("raysim/CartPole", 4, seed=0)
    weights = weights_of(shard)
    first, second = shard.rollout(weights, 20), shard.rollout(weights, 20)
    assert torch.equal(first.obs["policy"][-1], second.obs["policy"][0])
    assert shard.steps_done == 40


def test_episode_bookkeeping_continues_across_chunks():
    shard = EnvShard("raysim/CartPole", 8, seed=2, env_kwargs={"max_episode_steps": 40})
    weights = weights_of(shard)
    counted = torch.zeros(8, dtype=torch.int64)
    spanning = 0
    for _ in range(12):
        chunk = shard.rollout(weights, 7)  # shorter than any episode: every episode spans chunks
        done = chunk.terminated | chunk.truncated
        expected = []
        for t in range(7):
            counted += 1
            expected += counted[done[t]].tolist()
            counted[done[t]] = 0
        assert chunk.episodes["length"].tolist() == expected
        assert torch.equal(chunk.episodes["return"], chunk.episodes["length"].float())
        spanning += int((chunk.episodes["length"] > chunk.episodes["t"] + 1).sum())
    assert spanning > 5


def test_a_chunk_without_finished_episodes_still_has_the_report_columns():
    shard = EnvShard("raysim/CartPole", 4, seed=0)
    chunk = shard.rollout(weights_of(shard), 3)  # no CartPole episode ends within 3 steps
    assert chunk.final_t.numel() == 0 and chunk.final_obs["policy"].shape == (0, 4)
    assert {k: (v.shape, v.dtype) for k, v in chunk.episodes.items()} == {
        "length": ((0,), torch.int64),
        "return": ((0,), torch.float32),
        "row": ((0,), torch.int64),
        "t": ((0,), torch.int64),
    }


def test_same_seed_and_weights_give_identical_chunks_and_another_seed_does_not():
    a = EnvShard("raysim/CartPole", 8, seed=4)
    b = EnvShard("raysim/CartPole", 8, seed=4)
    c = EnvShard("raysim/CartPole", 8, seed=5)
    weights = weights_of(a)
    for _ in range(2):
        ca, cb, cc = a.rollout(weights, 30), b.rollout(weights, 30), c.rollout(weights, 30)
        assert_chunks_equal(ca, cb)
        assert not torch.equal(ca.obs["policy"], cc.obs["policy"])


def test_new_weights_are_loaded_by_version():
    shard = EnvShard("raysim/CartPole", 2, seed=0)
    weights = weights_of(shard, version=1)
    shard.rollout(weights, 1)
    changed = {k: v + 1.0 for k, v in weights["actor"].items()}
    shard.rollout({"version": 1, "actor": changed}, 1)  # same version: not reloaded
    assert torch.equal(shard.actor.net[0].bias, weights["actor"]["net.0.bias"])
    chunk = shard.rollout({"version": 2, "actor": changed}, 1)
    assert torch.equal(shard.actor.net[0].bias, changed["net.0.bias"]) and chunk.policy_version == 2


def test_in_process_and_ray_actor_shards_give_identical_chunks(ray_session):
    ray = ray_session
    settings = [
        dict(env_id=env_id, num_envs=8, seed=9, env_kwargs={"max_episode_steps": 30}, shard_index=1)
        for env_id in ("raysim/CartPole", "gym:CartPole-v1")
    ]
    remotes = [ray.remote(EnvShard).remote(**kwargs) for kwargs in settings]  # the actors start side by side
    try:
        for kwargs, remote in zip(settings, remotes, strict=True):
            local = EnvShard(**kwargs)
            weights_ref = ray.put(weights_of(local, version=2))
            for _ in range(2):  # the second chunk continues the first one's episodes on both sides
                remote_chunk = ray.get(remote.rollout.remote(weights_ref, 40))
                local_chunk = local.rollout(ray.get(weights_ref), 40)
                assert_chunks_equal(local_chunk, remote_chunk)
            assert local_chunk.episodes["length"].numel() > 0 and local_chunk.final_obs["policy"].shape[0] > 0
    finally:
        for remote in remotes:
            ray.kill(remote)


@pytest.mark.parametrize("where", ["obs", "reward", "inf_reward"])
def test_a_non_finite_env_value_raises_with_env_id_row_and_step(where):
    shard = EnvShard("test/NaNCartPole", 4, seed=0, env_kwargs={"nan_row": 2, "nan_step": 13, "where": where})
    weights = weights_of(shard)
    shard.rollout(weights, 10)
    with pytest.raises(NonFiniteError, match=r"test/NaNCartPole .*row 2 .*at step 13 \(step 3 of this chunk\)"):
        shard.rollout(weights, 10)


@pytest.mark.parametrize("where", ["obs", "reward"])
def test_with_on_nonfinite_mask_the_row_is_masked_counted_and_the_chunk_has_no_nan(where):
    shard = EnvShard(
        "test/NaNCartPole", 4, seed=0, on_nonfinite="mask", env_kwargs={"nan_row": 1, "nan_step": 5, "where": where}
    )
    chunk = shard.rollout(weights_of(shard), 40)
    assert chunk.nonfinite == 1
    expected_mask = torch.ones(40, 4, dtype=torch.bool)
    expected_mask[5, 1] = False
    assert torch.equal(chunk.mask, expected_mask)
    for name, t in chunk_tensors(chunk).items():
        assert not (t.is_floating_point() and not torch.isfinite(t).all()), name
    assert (chunk.obs["policy"][6, 1].abs() <= 0.05).all()  # the row restarts from a fresh state
    assert torch.equal(chunk.final_t, (chunk.terminated | chunk.truncated).nonzero()[:, 0])


def test_with_on_nonfinite_mask_a_nan_reward_on_a_rows_last_step_leaves_no_nan_report():
    # every row reaches the step limit at step 5; row 1's last reward is NaN
    kwargs = {"nan_row": 1, "nan_step": 5, "where": "reward", "max_episode_steps": 6}
    shard = EnvShard("test/NaNCartPole", 4, seed=0, on_nonfinite="mask", env_kwargs=kwargs)
    shard.env.state.zero_()  # balanced poles: no termination before the limit
    shard.obs = shard.env._observe()
    chunk = shard.rollout(weights_of(shard), 8)
    assert chunk.nonfinite == 1 and not chunk.mask[5, 1] and int((~chunk.mask).sum()) == 1
    for name, t in chunk_tensors(chunk).items():
        assert not (t.is_floating_point() and not torch.isfinite(t).all()), name
    # the corrupted episode is discarded: no flags, final_obs or report for (5, 1); the others finish
    assert chunk.truncated[5].tolist() == [True, False, True, True]
    assert chunk.final_row.tolist() == [0, 2, 3] and chunk.final_t.tolist() == [5, 5, 5]
    assert chunk.episodes["row"].tolist() == [0, 2, 3] and chunk.episodes["length"].tolist() == [6, 6, 6]
    assert chunk.reward[5, 1] == 0


def test_the_finiteness_check_scans_floats_and_takes_integer_images_as_finite_without_a_scan(monkeypatch):
    from raysim.rollout import rows as rows_module

    assert rows_module.all_finite(torch.zeros(3)) and not rows_module.all_finite(torch.tensor([0.0, float("nan")]))
    scanned = []
    monkeypatch.setattr(
        rows_module.torch, "isfinite", lambda v: scanned.append(v.dtype) or torch.ones_like(v, dtype=torch.bool)
    )
    assert rows_module.all_finite(torch.full((2, 3, 8, 8), 255, dtype=torch.uint8)) and scanned == []


def test_on_nonfinite_must_be_raise_or_mask():
    with pytest.raises(ValueError, match=r"on_nonfinite must be one of \('raise', 'mask'\), got 'skip'"):
        EnvShard("raysim/CartPole", 2, on_nonfinite="skip")


@pytest.mark.parametrize("num_envs", [0, -1, 1.5])
def test_a_shard_with_a_bad_row_count_is_refused(num_envs):
    with pytest.raises(ValueError, match=rf"num_envs must be an integer >= 1, got {num_envs!r}"):
        EnvShard("raysim/CartPole", num_envs)


def test_after_a_rewind_a_version_number_that_comes_round_again_acts_with_the_new_weights():
    config = raysim.load_config(None, ["backend=local"])
    shard = EnvShard("raysim/CartPole", 2, seed=0, model=config.model)
    observation_spaces, action_space, _ = shard.spaces()
    learner = Learner(observation_spaces, action_space, config.model, config.algo, horizon=1000)
    timelines = [Learner(observation_spaces, action_space, config.model, config.algo, 1000, seed=s) for s in (1, 2)]
    a, b = ({**other.state_dict(), "version": 5} for other in timelines)
    learner.load_state(a)
    shard.rollout(learner.get_weights(), 4)  # acts with version 5 of one timeline (A)
    learner.load_state(b)  # a rewind to a checkpoint of another timeline, also at version 5 (B)
    weights = learner.get_weights()
    chunk = shard.rollout(weights, 4)
    assert chunk.policy_version == 5
    assert all(torch.equal(v, weights["actor"][k]) for k, v in shard.actor.state_dict().items())  # B, not A
