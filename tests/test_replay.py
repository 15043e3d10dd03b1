"""The replay buffer: transitions as the bootstrap rules define them, dtypes kept, first in first out, exact refills."""

from __future__ import annotations

import torch

from raysim.algos.replay import ReplayBuffer, chunk_transitions, concat_transitions, size_of
from raysim.rollout import EnvShard, FixedSteps


def weights_of(shard: EnvShard) -> dict:
    return {"version": 0, "actor": {k: v.clone() for k, v in shard.actor.state_dict().items()}}


def test_at_a_time_limit_the_transition_bootstraps_from_the_rows_own_final_observation():
    # CartPole cut at 10 steps: every row is truncated at t = 9 (random-ish weights rarely fall within 10 steps; a
    # row that fell terminated instead, and is checked as such)
    shard = EnvShard("raysim/CartPole", 8, seed=0, env_kwargs={"max_episode_steps": 10})
    chunk = shard.rollout(weights_of(shard), FixedSteps(16))
    assert chunk.truncated.any() and chunk.final_t.numel() > 0
    batch = chunk_transitions(chunk, ["policy"])
    assert size_of(batch) == 16 * 8  # every step counts
    flat = torch.arange(16 * 8).view(16, 8)  # (t, row) -> index in the batch (all valid)
    for k in range(chunk.final_t.numel()):
        t, row = int(chunk.final_t[k]), int(chunk.final_row[k])
        i = int(flat[t, row])
        assert torch.equal(batch["next_obs"]["policy"][i], chunk.final_obs["policy"][k])  # its own final obs...
        assert not torch.equal(batch["next_obs"]["policy"][i], chunk.obs["policy"][t + 1, row])  # ...not the reset
        assert bool(batch["terminated"][i]) == bool(chunk.terminated[t, row])  # truncated only: bootstraps
    truncated_only = chunk.truncated & ~chunk.terminated
    assert truncated_only.any() and not batch["terminated"][flat[truncated_only]].any()
    going_on = ~(chunk.terminated | chunk.truncated)
    t, row = going_on.nonzero()[0].tolist()
    assert torch.equal(batch["next_obs"]["policy"][flat[t, row]], chunk.obs["policy"][t + 1, row])


def test_masked_steps_are_not_transitions():
    # a native Gymnasium vector env shows its final observation once more: that reset transition is masked
    shard = EnvShard("gym:CartPole-v1", 8, seed=3, env_kwargs={"vectorize": "native", "max_episode_steps": 12})
    chunk = shard.rollout(weights_of(shard), FixedSteps(30))
    assert not chunk.mask.all()
    batch = chunk_transitions(chunk, ["policy"])
    assert size_of(batch) == int(chunk.mask.sum()) == chunk.env_steps


def test_image_groups_stay_uint8_and_groups_keep_their_names():
    shard = EnvShard("raysim/ReachCamera", 2, seed=0, model={"actor_inputs": ["camera", "joints"]})
    chunk = shard.rollout(weights_of(shard), FixedSteps(3))
    batch = chunk_transitions(chunk, ["camera", "critic"])
    assert set(batch["obs"]) == set(batch["next_obs"]) == {"camera", "critic"}
    assert batch["obs"]["camera"].dtype == batch["next_obs"]["camera"].dtype == torch.uint8
    buffer = ReplayBuffer(4)
    buffer.add(batch)
    assert buffer.storage["obs"]["camera"].dtype == torch.uint8
    assert buffer.sample(3, torch.Generator().manual_seed(0))["obs"]["camera"].dtype == torch.uint8


def numbered(first: int, count: int) -> dict:
    """Transitions whose reward is their index in the run (to see where each one went)."""
    index = torch.arange(first, first + count, dtype=torch.float32)
    return {
        "obs": {"policy": index.unsqueeze(1)},
        "next_obs": {"policy": index.unsqueeze(1) + 1},
        "actions": index.unsqueeze(1),
        "reward": index,
        "terminated": torch.zeros(count, dtype=torch.bool),
    }


def test_at_capacity_the_oldest_transitions_leave_first():
    buffer = ReplayBuffer(5)
    buffer.add(numbered(0, 3))
    buffer.add(numbered(3, 4))  # 7 added, 5 kept: 2..6
    assert buffer.size == 5 and buffer.added == 7
    assert sorted(buffer.storage["reward"].tolist()) == [2, 3, 4, 5, 6]
    buffer.add(numbered(7, 12))  # more than the capacity at once: the newest 5
    assert sorted(buffer.storage["reward"].tolist()) == [14, 15, 16, 17, 18]


def test_a_buffer_refilled_from_its_segments_samples_exactly_what_the_original_samples():
    original = ReplayBuffer(6)
    segments = []
    for first, count in ((0, 4), (4, 3), (7, 2), (9, 5)):
        original.add(numbered(first, count))
        segments.append((first, numbered(first, count)))
    refilled = ReplayBuffer(6)
    refilled.restore(segments[2:])  # the first two left the buffer (index < 14 - 6 = 8, but for 7 of segment 3)
    a = original.sample(32, torch.Generator().manual_seed(5))
    b = refilled.sample(32, torch.Generator().manual_seed(5))
    assert torch.equal(a["reward"], b["reward"]) and refilled.added == original.added == 14
    both = concat_transitions([numbered(0, 2), numbered(2, 1)])
    assert both["reward"].tolist() == [0, 1, 2]
