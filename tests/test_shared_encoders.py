"""``model.shared_encoders``: the critic uses the actor's CNN (one trunk, as CleanRL's Atari agent), and
``model.hidden_sizes: []`` (heads straight on the features); ``ActorCritic.evaluate`` for PPO's loss."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
import torch
from torch import nn

import raysim
from raysim.algos.ppo import PPOConfig, clipped_objective, ppo_loss
from raysim.checkpoint import locate_checkpoint
from raysim.config import ConfigError
from raysim.envs import make
from raysim.learner import Learner
from raysim.models import ActorCritic, ModelConfig
from raysim.rollout import EnvShard
from tests.support.multi_input import Spot, tiny_spot_run

SPOT = "tests.support.multi_input:Spot"
BOTH_SEE = {"actor_inputs": ["camera", "joints"], "critic_inputs": ["camera", "critic"], "hidden_sizes": [16]}


def spot_model(shared: bool, **settings) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(
        Spot(1).observation_spaces,
        gym.spaces.Discrete(2),
        ModelConfig(**{**BOTH_SEE, **settings}, shared_encoders=shared),
    )


def spot_batch(rows: int = 16, advantages: torch.Tensor | None = None) -> dict:
    g = torch.Generator().manual_seed(1)
    obs = {
        "camera": torch.randint(0, 256, (rows, 16, 16, 3), generator=g, dtype=torch.uint8),
        "joints": torch.randn(rows, 2, generator=g),
        "critic": torch.randn(rows, 1, generator=g),
    }
    return {
        "obs": obs,
        "actions": torch.randint(0, 2, (rows,), generator=g),
        "logprobs": torch.full((rows,), -0.69),
        "advantages": torch.randn(rows, generator=g) if advantages is None else advantages,
        "values": torch.randn(rows, generator=g),
        "returns": torch.randn(rows, generator=g),
    }


def trunk(model: ActorCritic) -> list[nn.Parameter]:
    return list(model.actor.encoders["camera"].parameters())


def test_a_shared_trunk_is_the_actors_encoder_named_once_and_the_optimizer_holds_it_once():
    spot = Spot(1)
    learner = Learner(
        spot.observation_spaces,
        spot.action_space,
        ModelConfig(**BOTH_SEE, shared_encoders=True),
        PPOConfig(),
        horizon=10,
    )
    model = learner.model
    assert model.critic.encoders["camera"] is model.actor.encoders["camera"]
    optimized = [p for group in learner.optimizer.param_groups for p in group["params"]]
    assert len({id(p) for p in optimized}) == len(optimized) == len(list(model.parameters()))
    assert sum(p is q for p in optimized for q in trunk(model)) == len(trunk(model))  # each trunk weight once
    keys = model.state_dict().keys()
    assert any(k.startswith("actor.encoders.camera.") for k in keys)
    assert not any(k.startswith("critic.encoders.") for k in keys)
    assert any(k.startswith("critic.encoders.camera.") for k in spot_model(False).state_dict())  # separate: its own
    assert set(learner.get_weights()["actor"]) == {k[len("actor.") :] for k in keys if k.startswith("actor.")}


def test_a_shared_trunk_loads_a_state_dict_in_place_and_stays_shared():
    source, target = spot_model(True), spot_model(True)
    with torch.no_grad():
        for p in trunk(source):
            p.add_(1.0)
    target.load_state_dict(source.state_dict())
    assert target.critic.encoders["camera"] is target.actor.encoders["camera"]
    assert all(torch.equal(p, q) for p, q in zip(trunk(source), trunk(target), strict=True))


def test_the_value_loss_alone_moves_a_shared_trunk_and_the_policy_loss_reaches_it_too():
    config = PPOConfig(norm_adv=False, ent_coef=0.0)
    for shared in (True, False):
        model = spot_model(shared)
        loss, metrics = ppo_loss(model, spot_batch(advantages=torch.zeros(16)), config)  # no policy gradient
        loss.backward()
        moved = any(p.grad is not None and p.grad.abs().sum() > 0 for p in trunk(model))
        assert moved == shared  # separate networks: the critic's loss trains the critic's own CNN only
    model = spot_model(True)
    _, metrics = ppo_loss(model, spot_batch(), config)
    grads = torch.autograd.grad(metrics["pg_loss"], trunk(model), allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_without_a_critic_shared_encoders_change_nothing():
    alone, asked = spot_model(False, critic=False), spot_model(True, critic=False)  # GRPO's model
    assert asked.critic is None and asked.shared_groups == []
    assert all(torch.equal(a, b) for a, b in zip(alone.state_dict().values(), asked.state_dict().values(), strict=True))


def ppo_loss_as_it_was(model: ActorCritic, batch: dict, config: PPOConfig) -> torch.Tensor:
    """``ppo_loss`` before ``ActorCritic.evaluate``: the actor's log-probabilities, then the critic's own forward."""
    newlogprob, entropy = model.actor.log_prob_entropy(batch["obs"], batch["actions"])
    logratio = newlogprob - batch["logprobs"]
    advantages = batch["advantages"]
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -clipped_objective(logratio, advantages, config.clip_coef).mean()
    newvalue = model.critic(batch["obs"])
    v_clipped = batch["values"] + (newvalue - batch["values"]).clamp(-config.clip_coef, config.clip_coef)
    v_loss = 0.5 * torch.max((newvalue - batch["returns"]).square(), (v_clipped - batch["returns"]).square()).mean()
    return pg_loss - config.ent_coef * entropy.mean() + config.vf_coef * v_loss


def test_the_ppo_loss_of_separate_networks_is_bitwise_the_actor_and_critic_computed_apart():
    config = PPOConfig(ent_coef=0.01, clip_vloss=True)
    model, batch = spot_model(False), spot_batch()
    logp, entropy, value = model.evaluate(batch["obs"], batch["actions"])
    apart_logp, apart_entropy = model.actor.log_prob_entropy(batch["obs"], batch["actions"])
    assert torch.equal(logp, apart_logp) and torch.equal(entropy, apart_entropy)
    assert torch.equal(value, model.critic(batch["obs"]))
    loss, before = ppo_loss(model, batch, config)[0], ppo_loss_as_it_was(model, batch, config)
    assert torch.equal(loss, before)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    grads_before = torch.autograd.grad(before, list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_before, strict=True))


def test_the_heads_read_the_features_directly_with_no_hidden_layers():
    config = raysim.load_config(None, ["model.hidden_sizes=[]"])
    assert config.model.hidden_sizes == []
    with pytest.raises(ConfigError, match=r"model\.hidden_sizes"):
        raysim.load_config(None, ["model.hidden_sizes=[0]"])
    model = spot_model(True, hidden_sizes=[], cnn_features=32)
    assert [type(m) for m in model.actor.net] == [nn.Linear] and model.actor.net[0].in_features == 2 + 32
    assert [type(m) for m in model.critic.net] == [nn.Linear] and model.critic.net[0].out_features == 1
    shard = EnvShard("raysim/CartPole", 4, seed=3, model=ModelConfig(hidden_sizes=[]))  # the fused acting path
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 4)
    assert chunk.actions.shape == (4, 4)


def train_shared(run_dir: Path, *overrides: str) -> raysim.Trainer:
    shared = ["model.hidden_sizes=[]", "model.cnn_features=32", "model.critic_inputs=[camera, critic]"]
    settings = tiny_spot_run(run_dir, *shared, "model.shared_encoders=true", *overrides)
    return raysim.Trainer(raysim.load_config(None, settings))


def test_a_shared_trunk_trains_resumes_exports_and_refuses_a_resume_without_it_in_one_line(tmp_path):
    from raysim.export import export_policy, load_policy

    run_dir = tmp_path / "run"
    train_shared(run_dir).train()
    _, _, state, meta = locate_checkpoint(run_dir)
    assert not any(k.startswith("critic.encoders.") for k in state["model"])
    with pytest.raises(ConfigError) as refused:
        raysim.Trainer.from_run_dir(run_dir, overrides=["model.shared_encoders=false"])
    assert str(refused.value).splitlines()[1:] == [
        "  model.shared_encoders: checkpoint has True, this config has False"
    ]
    resumed = raysim.Trainer.from_run_dir(run_dir, overrides=["train.total_steps=384", "eval.episodes=2"])
    resumed.train()
    _, _, after, meta_after = locate_checkpoint(run_dir)
    assert meta_after["iteration"] > meta["iteration"]
    name = "actor.encoders.camera.net.0.weight"
    assert not torch.equal(after["model"][name], state["model"][name])  # the resumed run trained the trunk
    out = tmp_path / "policy.pt"
    export_policy(run_dir, out, "torchscript")
    policy, _ = load_policy(run_dir)
    obs = {k: v for k, v in make(SPOT, 4, seed=5).reset(5).items() if k in ("camera", "joints")}
    with torch.no_grad():
        assert torch.equal(torch.jit.load(str(out))(obs), policy(obs))


def test_a_lagging_chunk_trains_a_shared_trunk_through_decoupled_ppo():
    model = ModelConfig(**BOTH_SEE, shared_encoders=True)
    spot = Spot(1)
    learner = Learner(spot.observation_spaces, spot.action_space, model, PPOConfig(max_policy_lag=1), horizon=10)
    shard = EnvShard(SPOT, 4, seed=3, model=model)
    chunk = shard.rollout(learner.get_weights(), 8)  # version 0
    learner.update(chunk, log=False)
    before = [p.detach().clone() for p in trunk(learner.model)]
    metrics = learner.update(chunk, log=True)  # now one version behind: proximal log-probabilities, IS weights
    assert metrics["policy_version"] == 2 and metrics["skipped_updates"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trunk(learner.model), strict=True))
