"""Learner ranks with batches of their own: an error on one rank is every rank's, at once; the metrics of ranks
with unequal batches are those of one rank over their union. In-process: ranks as threads
(``tests/support/threaded_ranks.py``)."""

from __future__ import annotations

import pytest
import torch

from raysim.algos.ppo import PPOConfig
from raysim.learner.learner import Learner
from raysim.learner.ranks import RankError
from raysim.models.networks import ModelConfig
from raysim.rollout.shard import EnvShard
from tests.support.threaded_ranks import ThreadedRanks


def learners_and_shards(algo: PPOConfig, rows: tuple[int, int]) -> tuple:
    limit = {"max_episode_steps": 12}
    shards = [EnvShard("raysim/CartPole", n, seed=s, env_kwargs=limit) for n, s in zip(rows, (1, 2), strict=True)]
    spaces, action_space, _ = shards[0].spaces()

    def learner(rank: int = 0, world_size: int = 1) -> Learner:
        return Learner(spaces, action_space, ModelConfig(), algo, horizon=10, rank=rank, world_size=world_size)

    return learner, shards


def outcome(fn):
    """``fn``'s result, or the error it raised (returned: the other ranks are not told by the test's harness)."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - the outcome is what the test checks
        return error


def test_an_error_on_one_learner_rank_is_raised_by_every_rank_before_the_first_collective(monkeypatch):
    learner, shards = learners_and_shards(PPOConfig(num_steps=16, update_epochs=1, num_minibatches=4), (4, 1))
    ranks, group = [learner(r, 2) for r in range(2)], ThreadedRanks(2, timeout=5.0)  # before: rank 0 waited 120 s
    group.patch(monkeypatch)
    weights = ranks[0].get_weights()
    chunks = [shards[0].rollout(weights, 16), shards[1].rollout(weights, 2)]  # 64 and 2 transitions
    errors = group.run(lambda r: outcome(lambda: ranks[r].update(chunks[r])))
    assert all(isinstance(e, RankError) for e in errors), errors
    message = "building the update's batch failed on rank 1: ValueError: a batch of 2 transitions cannot be split"
    assert all(str(e).startswith(message) for e in errors), errors


@pytest.mark.parametrize("name", ["pg_loss", "v_loss"])
def test_the_metrics_of_two_learner_ranks_with_unequal_batches_are_those_of_one_rank_over_both(monkeypatch, name):
    algo = PPOConfig(num_steps=16, update_epochs=1, num_minibatches=1, norm_adv=False, max_grad_norm=1e9)
    learner, shards = learners_and_shards(algo, (2, 6))
    one = learner()
    chunks = [shard.rollout(one.get_weights(), 16) for shard in shards]  # 32 and 96 transitions
    alone = one.update(*chunks)
    ranks, group = [learner(r, 2) for r in range(2)], ThreadedRanks(2)
    group.patch(monkeypatch)
    together = group.run(lambda r: ranks[r].update(chunks[r]))[0]  # rank 0 reports the reduced metrics
    # before: the unweighted mean of the ranks' means
    torch.testing.assert_close(together[name], alone[name], rtol=1e-4, atol=1e-6)
