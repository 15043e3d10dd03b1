"""Fine-tuning: ``model.init_from`` starts a new run from another's weights; the guards (critic warm-up, KL pull)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import raysim
from raysim.algos import GRPOConfig, PPOConfig
from raysim.checkpoint import locate_checkpoint
from raysim.config import ConfigError
from raysim.coordinator.pretrained import read_pretrained
from raysim.identity import env_identity
from raysim.learner.learner import Learner
from raysim.models import ModelConfig
from raysim.rollout.shard import EnvShard

TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=128",
    "eval.episodes=0",
    "model.obs_norm=true",
    "train.sinks=[]",
]
NORM = ModelConfig(hidden_sizes=[16, 16], obs_norm=True, init_log_std=-0.5)


def tree_hash(folder: Path) -> str:
    """One digest of every file under ``folder`` (names and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> Path:
    """A tiny PPO run on raysim/Reach (continuous actions: a log-std) with observation statistics."""
    run_dir = tmp_path_factory.mktemp("source") / "run"
    config = raysim.load_config("reach_ppo", [*TINY, f"run_dir={run_dir}"])
    raysim.Trainer(config).train()
    return run_dir


def test_a_run_started_from_another_is_a_new_run_and_the_one_it_reads_is_left_unchanged(source_run, tmp_path, capsys):
    before = tree_hash(source_run)
    config = raysim.load_config(
        "reach_ppo", [*TINY, f"run_dir={tmp_path / 'tuned'}", f"model.init_from={source_run}", "model.init_log_std=-1"]
    )
    summary = raysim.Trainer(config).train()
    assert summary.env_steps == 128 and summary.iterations == 2  # its own counters, from 0
    assert "model.init_from: starting from" in capsys.readouterr().out
    assert tree_hash(source_run) == before
    _, _, state, meta = locate_checkpoint(tmp_path / "tuned")
    assert meta["iteration"] == 2 and state["optimizer"]["state"]  # its own optimizer, two iterations of steps


def test_the_actor_and_a_fitting_critic_load_the_log_std_resets_and_the_statistics_are_kept(source_run):
    config = raysim.load_config("reach_ppo", [*TINY, f"model.init_from={source_run}", "model.init_log_std=-1"])
    spaces = EnvShard("raysim/Reach", 1).spaces()[:2]
    saved = read_pretrained(config, spaces, env_identity(raysim.config.to_dict(config.env))[0])
    learner = Learner(*spaces, config.model, config.algo, horizon=1, pretrained=saved)
    loaded = learner.model.state_dict()
    for name, tensor in saved.items():
        if name != "actor.log_std":
            assert torch.equal(loaded[name], tensor), name  # actor, critic and both normalizers' statistics
    assert float(saved["actor.obs_norm.count"]) > 0
    assert torch.equal(loaded["actor.log_std"], torch.full_like(saved["actor.log_std"], -1.0))


def test_grpo_and_ppo_take_their_kl_reference_from_the_pretrained_actor_not_the_random_initialisation(source_run):
    _, _, state, _ = locate_checkpoint(source_run)
    spaces = EnvShard("raysim/Reach", 1).spaces()[:2]
    for algo in (GRPOConfig(kl_coef=0.1), PPOConfig(kl_coef=0.1)):
        model = ModelConfig(**{**vars(raysim.load_config("reach_ppo", TINY).model), "critic": algo.name == "ppo"})
        learner = Learner(*spaces, model, algo, horizon=1, pretrained=state["model"])
        reference = learner.algorithm.reference.actor.state_dict()
        assert torch.equal(reference["net.0.weight"], state["model"]["actor.net.0.weight"]), algo.name


def test_an_actor_of_other_shapes_is_refused_in_one_line_naming_the_tensors(source_run):
    config = raysim.load_config(
        "reach_ppo", [*TINY, f"model.init_from={source_run}", "model.hidden_sizes=[8]", "backend=local"]
    )
    with pytest.raises(ConfigError) as caught:
        raysim.Trainer(config)
    message = str(caught.value)
    assert "\n" not in message and "actor.net.0.weight" in message and "model.init_from" in message


def test_an_actor_with_the_other_kind_of_log_std_is_refused_in_one_line_naming_the_tensors(source_run):
    config = raysim.load_config("reach_ppo", [*TINY, f"model.init_from={source_run}", "model.log_std=state"])
    with pytest.raises(ConfigError) as caught:
        raysim.Trainer(config)
    message = str(caught.value)
    assert "\n" not in message and "model.init_from" in message
    assert "actor.net.4.weight [2, 64] vs [4, 64]" in message  # a log-std per state: the mean's outputs, then its


def test_a_missing_source_is_one_line_and_another_env_is_said_not_refused(source_run, tmp_path, capsys):
    with pytest.raises(ConfigError, match="model.init_from .*nowhere"):
        raysim.Trainer(raysim.load_config("reach_ppo", [*TINY, f"model.init_from={tmp_path / 'nowhere'}"]))
    config = raysim.load_config(
        "reach_ppo", [*TINY, f"model.init_from={source_run}", "env.kwargs.max_episode_steps=37"]
    )
    raysim.Trainer(config)
    assert "another env identity" in capsys.readouterr().out


def test_a_resumed_run_continues_from_its_own_checkpoint_and_ignores_init_from(source_run, tmp_path):
    import shutil

    source = tmp_path / "source"
    shutil.copytree(source_run, source)
    run_dir = tmp_path / "tuned"
    overrides = [*TINY, f"run_dir={run_dir}", f"model.init_from={source}", "train.stop_after=1"]
    raysim.Trainer(raysim.load_config("reach_ppo", overrides)).train()
    shutil.rmtree(source)  # the source is gone: a resume must not need it
    summary = raysim.Trainer.from_run_dir(run_dir, overrides=["train.stop_after=null"]).train()
    assert summary.iterations == 2 and summary.stopped_by == "budget"


def chunks_and_learner(algo: PPOConfig):
    shard = EnvShard("raysim/Reach", 4, seed=0, model=NORM)
    return shard, Learner(*shard.spaces()[:2], NORM, algo, horizon=10_000)


def test_the_critic_warm_up_moves_only_the_critic_and_freezes_the_statistics_until_its_env_steps():
    algo = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=2, critic_warmup_steps=128)
    shard, learner = chunks_and_learner(algo)
    consumed = 0
    for phase in ("warm-up", "warm-up", "training"):
        before = {k: v.clone() for k, v in learner.model.state_dict().items()}
        chunk = shard.rollout(learner.get_weights(), 16)
        metrics = learner.update(chunk, env_steps=consumed)
        consumed += int(chunk.env_steps)
        after = learner.model.state_dict()
        actor_same = all(torch.equal(before[k], after[k]) for k in after if k.startswith("actor."))
        critic_moved = any(not torch.equal(before[k], after[k]) for k in after if k.startswith("critic.net"))
        assert critic_moved, phase
        assert actor_same == (phase == "warm-up"), phase  # the actor's weights and its obs_norm statistics
        assert metrics["actor_frozen"] == float(phase == "warm-up")


def test_the_kl_pull_toward_the_start_decays_linearly_to_zero_over_its_env_steps():
    algo = PPOConfig(num_steps=16, kl_coef=0.4, kl_decay_steps=1000)
    _, learner = chunks_and_learner(algo)
    reference = learner.algorithm.reference
    assert [reference.weight(s) for s in (0, 250, 1000, 5000)] == pytest.approx([0.4, 0.3, 0.0, 0.0])
    assert PPOConfig().kl_coef == 0 and PPOConfig().critic_warmup_steps == 0  # plain PPO by default
