"""A Gaussian actor whose log-std is an output of its network per state (``model.log_std: state``, SAC's), beside the
learned state-independent one (``parameter``, PPO's): the bounds, sampling and its log-probability, the mean as the
deterministic action and as what imitation fits, recurrent replay, training, init_from, the refusals."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

import raysim
from raysim.algos.bc import BCConfig, bc_loss
from raysim.algos.distill import distill_loss
from raysim.algos.epochs import sequences
from raysim.checkpoint import locate_checkpoint
from raysim.cli import main
from raysim.config import ConfigError, to_dict
from raysim.coordinator.snapshot import resume_refusal
from raysim.models import ActionSampling, Actor, ActorCritic, ModelConfig
from raysim.models.pretrained import load_pretrained
from raysim.rollout import EnvShard
from raysim.rollout.inference import inference
from raysim.rollout.teacher import Teacher
from tests.test_finetune import TINY

SPACES = {"policy": gym.spaces.Box(-math.inf, math.inf, (6,))}
ACTIONS = gym.spaces.Box(-1.0, 1.0, (3,))


def trained_looking(model: torch.nn.Module, scale: float = 1.0, seed: int = 0) -> torch.nn.Module:
    """``model`` with every parameter moved by seeded noise (the log-std outputs' zero initial weights included)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


def actor(log_std: str = "state", **model: object) -> Actor:
    torch.manual_seed(0)
    return Actor(SPACES, ACTIONS, ModelConfig(hidden_sizes=[16], log_std=log_std, **model))


def written_out(actor: Actor, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and log-std by hand: the net's first 3 outputs, and its last 3 bounded into [-5, 2] as CleanRL's SAC
    bounds them (or the log-std parameter)."""
    out = actor.net(obs["policy"])
    if actor.log_std is not None:
        return out, actor.log_std.expand_as(out)
    return out[:, :3], -5 + 0.5 * (2 - -5) * (torch.tanh(out[:, 3:]) + 1)


def test_a_state_log_std_is_an_output_of_the_net_bounded_to_minus_5_and_2_that_varies_with_the_state():
    state = actor()
    assert state.net[-1].out_features == 6 and "log_std" not in state.state_dict()
    trained_looking(state, scale=3.0)  # outputs far beyond the bounds' reach: tanh saturates both ways
    obs = {"policy": torch.randn(512, 6)}
    with torch.no_grad():
        mean, log_std = state.mean_log_std(state(obs))
        assert torch.equal(mean, written_out(state, obs)[0]) and torch.equal(log_std, written_out(state, obs)[1])
    assert log_std.shape == (512, 3) and bool((log_std >= -5).all()) and bool((log_std <= 2).all())
    assert float(log_std.min()) < -4.9 and float(log_std.max()) > 1.9
    assert bool((log_std.std(0) > 0.5).all())  # another state, another std, in every dimension


def test_a_new_state_actor_starts_at_init_log_std_in_every_state_and_one_outside_the_bounds_is_refused():
    obs = {"policy": torch.randn(64, 6) * 3}
    with torch.no_grad():
        _, log_std = actor(init_log_std=-1.5).mean_log_std(actor(init_log_std=-1.5)(obs))
    torch.testing.assert_close(log_std, torch.full_like(log_std, -1.5))
    with pytest.raises(ValueError, match=r"model.init_log_std: 2.0 .*\(-5, 2\)"):
        actor(init_log_std=2.0)


@pytest.mark.parametrize("log_std", ["parameter", "state"])
def test_a_samples_log_probability_and_entropy_are_the_normals_of_its_mean_and_std(log_std):
    model = trained_looking(actor(log_std), scale=0.3)
    obs = {"policy": torch.randn(32, 6)}
    with torch.no_grad():
        action, logp = model.sample(obs, torch.Generator().manual_seed(1))
        mean, log_std = written_out(model, obs)
        normal = torch.distributions.Normal(mean, log_std.exp())
        draws = torch.empty(32, 3).normal_(generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(action, mean + draws * log_std.exp())  # each row's own std
        torch.testing.assert_close(logp, normal.log_prob(action).sum(-1))
        again, entropy = model.log_prob_entropy(obs, action)
    torch.testing.assert_close(again, logp)
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))


@pytest.mark.parametrize("transform", ["clip", "squash"])
def test_the_deterministic_action_is_the_mean_and_the_env_receives_it_through_the_transform(transform):
    model = trained_looking(actor(action_transform=transform), scale=0.5)
    obs = {"policy": torch.randn(64, 6) * 3}
    with torch.no_grad():
        mean = written_out(model, obs)[0]
        action = model.deterministic(obs)
        assert torch.equal(action, mean)
        torch.testing.assert_close(model.deterministic(obs, by_row=True), mean)  # each row alone: to rounding
        expected = torch.tanh(mean) if transform == "squash" else mean.clamp(-1, 1)  # the action space is [-1, 1]
        torch.testing.assert_close(model.env_action(action), expected)


def test_behaviour_cloning_distillation_and_a_teachers_labels_read_the_mean():
    model = trained_looking(ActorCritic(SPACES, ACTIONS, ModelConfig(log_std="state", critic=False)), scale=0.3)
    obs, actions = {"policy": torch.randn(8, 6)}, torch.rand(8, 3) * 2 - 1
    loss, _ = bc_loss(model, {"obs": obs, "actions": actions}, BCConfig())
    loss.backward()
    assert bool((model.actor.net[-1].weight.grad[3:] == 0).all())  # the log-std outputs: not trained, not moved
    with torch.no_grad():
        mean = written_out(model.actor, obs)[0]
        torch.testing.assert_close(
            bc_loss(model, {"obs": obs, "actions": actions}, BCConfig())[0], (mean - actions).square().mean()
        )
        torch.testing.assert_close(
            distill_loss(model, {"obs": obs, "labels": actions})[0], (mean - actions).square().mean()
        )
    weights = {
        "key": "k",
        "source": "made up",
        "model": to_dict(ModelConfig(log_std="state")),
        "inputs": {"policy": "policy"},
    }
    teacher = Teacher({**weights, "actor": model.actor.state_dict()}, SPACES, ActionSampling(ACTIONS, "clip"))
    assert teacher.width == 3 and torch.equal(teacher.label(obs), mean)


def test_a_recurrent_state_actors_replayed_log_probabilities_are_those_it_acted_with():
    """PPO's ratio on sequences: ``log_prob_entropy`` and ``ActorCritic.evaluate`` through the replayed core give
    the log-probabilities the shard stored (per-row std from the same core outputs)."""
    config = ModelConfig(recurrent="gru", recurrent_size=8, hidden_sizes=[16], log_std="state")
    shard = EnvShard("raysim/Reach", 4, seed=1, model=config, env_kwargs={"max_episode_steps": 9})
    torch.manual_seed(0)
    model = trained_looking(ActorCritic(*shard.spaces()[:2], config), scale=0.1)
    part = sequences(shard.rollout({"version": 0, "actor": model.actor.state_dict()}, 16))
    valid = part["sequences"]["mask"]
    with inference(model):
        replayed, _ = model.actor.log_prob_entropy(part["obs"], part["actions"], sequences=part["sequences"])
        evaluated, _, _ = model.evaluate(part["obs"], part["actions"], part["sequences"])
    torch.testing.assert_close(replayed, part["logprobs"][valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(evaluated, replayed)


def test_ppo_with_a_state_log_std_trains_on_reach_and_learns_the_std_per_state(tmp_path):
    config = raysim.load_config(
        "reach_ppo", [*TINY, "train.total_steps=192", "model.log_std=state", f"run_dir={tmp_path}"]
    )
    assert raysim.Trainer(config).train().iterations == 3
    saved = locate_checkpoint(tmp_path)[2]["model"]
    head = saved[f"actor.net.{2 * len(config.model.hidden_sizes)}.weight"]
    assert "actor.log_std" not in saved and head.shape[0] == 4  # Reach: 2 action dimensions, mean then log-std
    assert bool((head[2:] != 0).any()) and bool(torch.isfinite(head).all())  # the log-std outputs' weights moved


def test_init_from_restarts_a_state_actors_log_std_at_init_log_std_and_keeps_its_mean():
    config = ModelConfig(hidden_sizes=[16], log_std="state")
    source = trained_looking(ActorCritic(SPACES, ACTIONS, config), scale=0.3)
    model = ActorCritic(SPACES, ACTIONS, config)
    load_pretrained(model, source.state_dict(), -1.0)
    obs = {"policy": torch.randn(16, 6)}
    with torch.no_grad():
        mean, log_std = model.actor.mean_log_std(model.actor(obs))
        assert torch.equal(mean, written_out(source.actor, obs)[0])
    torch.testing.assert_close(log_std, torch.full_like(log_std, -1.0))


def test_a_state_log_std_for_discrete_actions_is_refused_in_one_line_naming_the_key(tmp_path, capsys):
    assert (
        main(["train", "cartpole_ppo", "--local", "--set", "model.log_std=state", "--set", f"run_dir={tmp_path}"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert "model.log_std" in err and "discrete" in err and "\n" not in err and "Traceback" not in err


def test_changing_the_log_std_kind_on_resume_is_refused_as_other_model_keys_are():
    saved = {"model": to_dict(raysim.load_config("reach_ppo").model), "algo": "ppo"}
    refusal = resume_refusal(saved, raysim.load_config("reach_ppo", ["model.log_std=state"]))
    assert refusal is not None and "model.log_std: checkpoint has 'parameter', this config has 'state'" in refusal
    with pytest.raises(ConfigError, match="model.log_std"):
        raysim.load_config("reach_ppo", ["model.log_std=per_state"])
