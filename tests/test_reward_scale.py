"""Reward scaling by the running std of the discounted return (``algo.reward_scale``)."""

from __future__ import annotations

import numpy as np
import torch

import raysim
from raysim.algos.ppo import PPOConfig
from raysim.algos.reward_scale import FORGET_AFTER, RewardScale
from raysim.checkpoint import locate_checkpoint
from raysim.learner import Learner
from raysim.learner.ranks import RankGroup
from raysim.models.networks import ModelConfig
from raysim.rollout import RolloutChunk
from raysim.rollout.advantages import chunk_values, gae
from raysim.rollout.shard import EnvShard


def reference_returns(chunks, gamma):
    """A slow loop: every valid transition's discounted return, per shard and row, across chunks."""
    running, seen = {}, []
    for chunk in chunks:
        for n in range(chunk.num_envs):
            g = running.get((chunk.shard, n), 0.0)
            for t in range(chunk.num_steps):
                if not chunk.mask[t, n]:
                    g = 0.0
                    continue
                g = g * gamma + float(chunk.reward[t, n])
                seen.append(g)
                if chunk.terminated[t, n] or chunk.truncated[t, n]:
                    g = 0.0
            running[(chunk.shard, n)] = g
    return np.array(seen)


def test_return_statistics_follow_the_discounted_returns_and_the_logged_reward_is_untouched():
    shards = [
        EnvShard("raysim/CartPole", 4, seed=s, shard_index=s, env_kwargs={"max_episode_steps": 30}) for s in (0, 1)
    ]
    algo = PPOConfig(reward_scale=True, gamma=0.9, num_minibatches=2, update_epochs=1)
    learner = Learner(*shards[0].spaces()[:2], ModelConfig(), algo, 10, seed=0)
    chunks = []
    for _ in range(3):
        weights = learner.get_weights()
        new = [s.rollout(weights, 16) for s in shards]
        rewards = [c.reward.clone() for c in new]
        learner.update(*new)
        assert all(torch.equal(c.reward, r) for c, r in zip(new, rewards, strict=True))
        chunks += new
    expected = reference_returns(sorted(chunks, key=lambda c: c.shard), 0.9)
    norm = learner.algorithm.reward_scale.norm
    assert int(norm.count) == expected.size
    assert abs(float(norm.mean) - expected.mean()) < 1e-5
    assert abs(float(norm.var) - expected.var()) < 1e-4 * max(1.0, expected.var())


def test_advantages_are_computed_from_the_scaled_reward():
    shard = EnvShard("raysim/CartPole", 4, seed=0)
    algo = PPOConfig(reward_scale=True, num_minibatches=2, update_epochs=1)
    learner = Learner(*shard.spaces()[:2], ModelConfig(), algo, 10, seed=0)
    learner.update(shard.rollout(learner.get_weights(), 16))
    chunk = shard.rollout(learner.get_weights(), 16)
    learner.algorithm.reward_scale.observe([chunk], learner.ranks)
    std = float(learner.algorithm.reward_scale.norm.std())
    batch = learner.algorithm.batch([chunk])
    values, next_values = chunk_values(learner.model.critic, chunk)
    expected = gae(
        chunk.reward / std,
        values,
        next_values,
        chunk.terminated | chunk.truncated,
        chunk.mask,
        algo.gamma,
        algo.gae_lambda,
    )
    assert torch.allclose(batch["advantages"], expected[chunk.mask], atol=1e-6)
    assert std != 1.0


def test_a_run_with_reward_scaling_resumes_exactly(tmp_path):
    overrides = [
        "backend=local",
        "env.num_envs=4",
        "algo.num_steps=32",
        "algo.num_minibatches=2",
        "algo.update_epochs=1",
        "algo.reward_scale=true",
        "train.total_steps=1024",
        "eval.episodes=0",
        "train.sinks=[]",
    ]
    raysim.Trainer(raysim.load_config(None, [*overrides, f"run_dir={tmp_path / 'a'}"])).train()
    raysim.Trainer(raysim.load_config(None, [*overrides, "train.stop_after=4", f"run_dir={tmp_path / 'b'}"])).train()
    raysim.Trainer.from_run_dir(tmp_path / "b").train()
    (_, _, a, _), (_, _, b, _) = locate_checkpoint(tmp_path / "a"), locate_checkpoint(tmp_path / "b")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["reward_scale"]["norm"]["var"], b["reward_scale"]["norm"]["var"])
    assert int(a["reward_scale"]["norm"]["count"]) == 8 * 4 * 32


def test_a_fresh_chunk_restarts_its_shards_return_accumulators():
    """A replaced shard (or one resumed with fresh episodes) starts new episodes: no inherited return sums."""
    shard = EnvShard("raysim/CartPole", 4, seed=0)
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    first, second = shard.rollout(weights, 16), shard.rollout(weights, 16)
    assert first.fresh and not second.fresh
    scale = RewardScale(gamma=0.9)
    scale.batch_moments(first)
    carried = scale.returns[0].clone()
    assert bool((carried != 0).any())
    replacement = EnvShard("raysim/CartPole", 4, seed=1)  # the same shard index, fresh episodes
    chunk = replacement.rollout(weights, 16)
    assert chunk.fresh and chunk.shard == 0
    scale.batch_moments(chunk)
    expected = RewardScale(gamma=0.9)
    expected.batch_moments(chunk)
    assert torch.equal(scale.returns[0], expected.returns[0])  # as if no earlier shard had been there


def test_the_accumulators_of_shards_gone_with_elastic_churn_are_dropped_and_the_live_ones_kept():
    """Shard 0 stays; each update an elastic shard with a new index comes and goes: only the last FORGET_AFTER stay."""

    def chunk(shard: int) -> RolloutChunk:
        ends, none = torch.zeros(2, 3, dtype=torch.bool), torch.zeros(0, dtype=torch.long)  # 2 steps, 3 rows
        steps = {"actions": torch.zeros(2, 3), "logp": torch.zeros(2, 3), "reward": torch.ones(2, 3), "mask": ~ends}
        finals = {"final_obs": {}, "final_t": none, "final_row": none}
        return RolloutChunk(
            {}, **steps, terminated=ends, truncated=ends, **finals, episodes={}, policy_version=0, shard=shard
        )

    scale, ranks = RewardScale(gamma=0.5), RankGroup(0, 1, torch.device("cpu"))
    for update in range(FORGET_AFTER + 50):
        scale.observe([chunk(0), chunk(1000 + update)], ranks)
    assert sorted(scale.returns) == [0, *range(1050, 1000 + FORGET_AFTER + 50)]
    assert torch.allclose(scale.returns[0], torch.full((3,), 2.0, dtype=torch.float64))  # 1 + 0.5 + ...: carried
    resumed = RewardScale(gamma=0.5)
    resumed.load_state_dict(scale.state_dict())
    resumed.observe([chunk(0)], ranks)
    assert sorted(resumed.returns) == [0, *range(1051, 1000 + FORGET_AFTER + 50)]  # the oldest one went next
