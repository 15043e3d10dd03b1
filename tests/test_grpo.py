"""GRPO: grouped starts, group-relative advantages, no critic, masked rows, config, learning."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from raysim.algos.grpo import GRPOConfig, chunk_advantages, group_advantages, grpo_loss
from raysim.config import Config, ConfigError, EnvConfig, load_config
from raysim.coordinator import Trainer
from raysim.envs.cartpole import CartPole
from raysim.learner import Learner
from raysim.metrics import ParquetSink
from raysim.models.networks import ModelConfig
from raysim.records import read_metrics
from raysim.rollout import GroupEpisodes, GroupResetError
from raysim.rollout.inference import inference
from raysim.rollout.shard import EnvShard
from raysim.storage import open_storage


def make_shard(num_envs=8, seed=3, critic=False):
    return EnvShard("raysim/CartPole", num_envs, seed=seed, model=ModelConfig(critic=critic))


def weights_of(shard):
    return {"version": 0, "actor": copy.deepcopy(shard.actor.state_dict())}


def make_learner(shard, algo, critic=False):
    spaces, action_space, _ = shard.spaces()
    return Learner(spaces, action_space, ModelConfig(critic=critic), algo, horizon=10, seed=0)


def test_group_members_start_from_identical_observations_and_different_groups_differ():
    shard = make_shard(num_envs=12)
    chunk = shard.rollout(weights_of(shard), GroupEpisodes(4, 200))
    first = chunk.obs["policy"][0].reshape(3, 4, -1)
    assert torch.equal(first, first[:, :1].expand_as(first))
    assert not torch.equal(first[0, 0], first[1, 0]) and not torch.equal(first[1, 0], first[2, 0])
    # the next round starts from new shared states
    again = shard.rollout(weights_of(shard), GroupEpisodes(4, 200)).obs["policy"][0].reshape(3, 4, -1)
    assert torch.equal(again, again[:, :1].expand_as(again)) and not torch.equal(again[0, 0], first[0, 0])


def test_rollout_groups_stops_when_every_row_finished_and_masks_rows_that_finished_early():
    shard = make_shard()
    chunk = shard.rollout(weights_of(shard), GroupEpisodes(4, 500))
    length = chunk.episodes["length"]
    assert chunk.num_steps == int(length.max())  # no trailing step where every row is masked
    assert bool(chunk.episodes["finished"].all())
    steps = torch.arange(chunk.num_steps).unsqueeze(1)
    assert torch.equal(chunk.mask, steps < length.unsqueeze(0))
    assert torch.equal(chunk.episodes["return"], chunk.reward.sum(0))  # masked steps carry no reward
    assert chunk.env_steps == int(length.sum())
    assert torch.equal(chunk.episodes["group"], torch.arange(8) // 4)


def test_a_round_cut_by_the_step_limit_counts_the_return_so_far():
    shard = make_shard()
    chunk = shard.rollout(weights_of(shard), GroupEpisodes(4, 5))
    assert chunk.num_steps == 5 and not bool(chunk.episodes["finished"].any())
    assert torch.equal(chunk.episodes["return"], torch.full((8,), 5.0))


class UnseededCartPole(CartPole):
    seeded_reset = False


class NoisyResetCartPole(CartPole):
    """Claims seeded resets but ignores the seed."""

    def reset_rows(self, rows, seeds):
        return super().reset_rows(rows, list(range(len(seeds))))


@pytest.mark.parametrize(
    "env_cls, message", [(UnseededCartPole, "seeded_reset is False"), (NoisyResetCartPole, "different")]
)
def test_an_env_that_cannot_share_a_start_is_refused_with_a_clear_error(env_cls, message):
    shard = make_shard()
    shard.env = env_cls(8, seed=0)
    with pytest.raises(GroupResetError, match=message):
        shard.rollout(weights_of(shard), GroupEpisodes(4, 50))


def reference_advantages(returns, size, std_normalize):
    out = []
    for group in returns.reshape(-1, size).tolist():
        mean = sum(group) / size
        std = (sum((r - mean) ** 2 for r in group) / (size - 1)) ** 0.5
        for r in group:
            if std == 0:
                out.append(0.0)
            else:
                out.append((r - mean) / (std + 1e-8) if std_normalize else r - mean)
    return torch.tensor(out)


@pytest.mark.parametrize("std_normalize", [True, False])
def test_group_relative_advantages_match_a_reference_computation_and_equal_returns_give_zeros(std_normalize):
    returns = torch.tensor([1.0, 2.0, 3.0, 10.0, 500.0, 500.0, 500.0, 500.0, 0.0, 0.0, 7.0, 0.0, 0.1, 0.1, 0.1, 0.1])
    advantages = group_advantages(returns, 4, std_normalize)
    assert torch.allclose(advantages, reference_advantages(returns, 4, std_normalize), atol=1e-5)
    assert torch.equal(advantages[4:8], torch.zeros(4)) and torch.equal(advantages[12:], torch.zeros(4))
    assert bool(torch.isfinite(advantages).all())


def test_every_step_of_an_episode_gets_its_members_advantage():
    shard = make_shard()
    chunk = shard.rollout(weights_of(shard), GroupEpisodes(4, 500))
    advantages = chunk_advantages(chunk, GRPOConfig(group_size=4))
    expected = group_advantages(chunk.episodes["return"], 4)
    assert torch.equal(advantages, expected.expand(chunk.num_steps, -1))


def test_the_critic_is_never_called_during_a_grpo_run(monkeypatch):
    shard = make_shard(critic=True)
    learner = make_learner(shard, GRPOConfig(group_size=4, kl_coef=0.1), critic=True)
    assert learner.model.critic is not None

    def forbidden(*args, **kwargs):
        raise AssertionError("the critic was called")

    monkeypatch.setattr(learner.model.critic, "forward", forbidden)
    monkeypatch.setattr("raysim.algos.ppo.chunk_values", forbidden)  # the one caller of value inference
    monkeypatch.setattr("raysim.rollout.advantages.critic_values", forbidden)
    before = copy.deepcopy(learner.model.actor.state_dict())
    metrics = learner.update(shard.rollout(learner.get_weights(), GroupEpisodes(4, 500)))
    assert metrics["policy_version"] == 1 and metrics["env_steps"] > 0
    assert any(not torch.equal(before[k], v) for k, v in learner.model.actor.state_dict().items())


def test_a_model_without_a_critic_trains_with_grpo_and_ppo_refuses_it():
    shard = make_shard()
    learner = make_learner(shard, GRPOConfig(group_size=4))
    assert learner.model.critic is None and learner.algorithm.reference is None
    before = copy.deepcopy(learner.model.actor.state_dict())
    for _ in range(2):
        metrics = learner.update(shard.rollout(learner.get_weights(), GroupEpisodes(4, 500)))
    assert all(v == v for v in metrics.values())  # no NaN
    assert any(not torch.equal(before[k], v) for k, v in learner.model.actor.state_dict().items())
    from raysim.algos.ppo import PPOConfig

    with pytest.raises(ValueError, match="needs a critic"):
        make_learner(shard, PPOConfig())


def test_masked_transitions_contribute_nothing_to_the_loss_gradient():
    shard = make_shard()
    algo = GRPOConfig(group_size=4, kl_coef=0.1, ent_coef=0.01)
    learner = make_learner(shard, algo)
    chunk = shard.rollout(learner.get_weights(), GroupEpisodes(4, 500))
    assert not bool(chunk.mask.all())

    def gradient(chunk):
        batch = learner.algorithm.batch([chunk])
        learner.model.zero_grad(set_to_none=True)
        loss, _ = grpo_loss(learner.model.actor, batch, algo, learner.algorithm.reference, algo.kl_coef)
        loss.backward()
        return [p.grad.clone() for p in learner.model.actor.parameters()]

    clean = gradient(chunk)
    altered = copy.deepcopy(chunk)
    masked = ~altered.mask
    altered.obs["policy"][:-1][masked] = 1e3
    altered.actions[masked] = 1 - altered.actions[masked]
    altered.logp[masked] = -50.0
    altered.reward[masked] = 1e6
    for a, b in zip(clean, gradient(altered), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("size", [1, 3, 0])
def test_a_group_size_that_is_below_two_or_does_not_divide_num_envs_is_a_config_error(size):
    with pytest.raises(ConfigError, match="algo.group_size"):
        load_config("cartpole_grpo", [f"algo.group_size={size}", "env.num_envs=8"])
    with pytest.raises(ConfigError, match="algo.group_size"):  # the Python API checks it too
        Trainer(Config(algo=GRPOConfig(group_size=size), env=EnvConfig(num_envs=8)))


def test_algo_name_picks_the_algorithm_config_and_an_unknown_name_lists_the_valid_ones():
    config = load_config("cartpole_grpo")
    assert isinstance(config.algo, GRPOConfig) and config.model.critic is False
    default = load_config("cartpole_grpo", ["model={}"])
    assert default.model.critic is False  # GRPO's model defaults to no critic
    with pytest.raises(ConfigError, match="group_size"):
        load_config("cartpole_ppo", ["algo.group_size=4"])  # a GRPO key is unknown to PPO
    with pytest.raises(ConfigError, match=r"algo.name must be one of \['bc', 'distill', 'grpo', 'ppo', 'sac'\]"):
        load_config("cartpole_ppo", ["algo.name=a2c"])


def test_grpo_clearly_improves_on_native_cartpole_with_a_fixed_seed(tmp_path: Path):
    config = load_config(
        "cartpole_grpo",
        ["backend=local", "train.total_steps=40000", "eval.episodes=20", "seed=1", f"run_dir={tmp_path / 'run'}"],
    )
    summary = Trainer(config, sinks=[]).train()
    assert summary.env_steps >= 40000
    # an untrained policy balances CartPole for about 20 steps
    assert summary.evaluation.mean_return > 150, summary.evaluation.mean_return


def test_a_linear_schedule_falls_on_the_env_steps_of_grpos_variable_rounds_to_the_budget(tmp_path: Path):
    overrides = ["backend=local", "env.num_envs=8", "algo.update_epochs=1", "algo.num_minibatches=2"]
    overrides += ["algo.lr_schedule=linear", "train.total_steps=1500", "train.log_every=1", "eval.episodes=0"]
    config = load_config("cartpole_grpo", [*overrides, f"run_dir={tmp_path / 'run'}"])
    Trainer(config, sinks=[ParquetSink(open_storage(tmp_path / "metrics"))]).train()
    rows = read_metrics(open_storage(tmp_path / "metrics"))
    consumed = [0] + [int(r["env_steps"]) for r in rows[:-1]]  # before each round's update
    assert len({b - a for a, b in zip(consumed, consumed[1:], strict=False)}) > 1  # rounds of varying size
    assert [r["lr"] for r in rows] == [config.algo.lr * max(0.0, 1.0 - s / 1500) for s in consumed]
    assert rows[-1]["lr"] < 0.3 * config.algo.lr  # the last round trains near the end of the schedule


def test_a_lagging_round_is_clipped_around_the_learners_policy_and_weighted_truncated():
    shard = make_shard()
    learner = make_learner(shard, GRPOConfig(group_size=4, max_policy_lag=1, max_is_weight=1.05, lr=0.05))
    old = shard.rollout(learner.get_weights(), GroupEpisodes(4, 500))  # version 0, trained on after version 1 is out
    learner.update(shard.rollout(learner.get_weights(), GroupEpisodes(4, 500)))
    current = shard.rollout(learner.get_weights(), GroupEpisodes(4, 500))  # version 1, the learner's
    learner.algorithm.version = learner.version  # as the learner sets it before an update
    plain = learner.algorithm.batch([current])  # no lagging round: the acting policy is the proximal one
    assert "is_weights" not in plain and torch.equal(plain["logprobs"], current.logp[current.mask])
    batch = learner.algorithm.batch([old, current])
    lagging = int(old.mask.sum())
    actor = learner.model.actor
    with inference(actor):
        proximal, _ = actor.log_prob_entropy(batch["obs"]["policy"][:lagging], batch["actions"][:lagging])
    assert torch.equal(batch["logprobs"][:lagging], proximal)  # the ratio starts at 1 for the lagging round
    weights = (proximal - old.logp[old.mask]).exp()
    assert (weights > 1.05).any() and (weights < 1.05).any()  # the policy moved: some weights are truncated
    assert torch.equal(batch["is_weights"][:lagging], weights.clamp(max=1.05))
    assert torch.equal(batch["is_weights"][lagging:], torch.ones(len(batch["logprobs"]) - lagging))
    head = {"obs": {g: o[:lagging] for g, o in batch["obs"].items()}}
    head |= {k: v[:lagging] for k, v in batch.items() if k != "obs"}
    loss, metrics = grpo_loss(actor, head, learner.algorithm.config, None, 0.0)
    assert metrics["approx_kl"] == 0 and metrics["clipfrac"] == 0  # nothing outside the clip range at the start
    assert torch.allclose(metrics["pg_loss"], -(head["advantages"] * head["is_weights"]).mean())
