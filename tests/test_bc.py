"""Behaviour cloning: an algorithm on the learner without training shards, on a dataset of demonstrations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import raysim
from raysim.checkpoint import locate_checkpoint
from raysim.cli import main
from raysim.coordinator.demonstrations import record_demonstrations
from raysim.demos import Demonstrations, load_demonstrations
from raysim.models.normalizer import moments
from raysim.records import read_metrics
from raysim.rollout.shard import EnvShard
from raysim.storage import open_storage

pytest.importorskip("minari")
pytest.importorskip("h5py")

TEACHER = [
    "backend=local",
    "env.num_envs=8",
    "algo.num_steps=64",
    "train.total_steps=12288",
    "eval.episodes=0",
    "train.sinks=[]",
]
BC = [
    "algo={name: bc, dataset: raysim/cartpole-teacher-v0, updates: 600, num_minibatches: 200, batch_size: 64}",
    "model.obs_norm=true",
    "backend=local",
    "eval.episodes=10",
    "eval.num_envs=5",
    "train.sinks=[parquet]",
    "train.log_every=1",
]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> tuple[Path, Path]:
    """A briefly trained CartPole PPO run and 10 deterministic episodes of it, recorded as a Minari dataset."""
    root = tmp_path_factory.mktemp("bc")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root / "datasets"))
        raysim.Trainer(raysim.load_config("cartpole_ppo", [*TEACHER, f"run_dir={root / 'teacher'}"])).train()
        record_demonstrations("raysim/cartpole-teacher-v0", 10, run=root / "teacher", backend="local")
    return root / "teacher", root / "datasets"


@pytest.fixture
def datasets(teacher, monkeypatch) -> Path:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(teacher[1]))
    return teacher[1]


def dataset() -> Demonstrations:
    return load_demonstrations("raysim/cartpole-teacher-v0", *EnvShard("raysim/CartPole", 1).spaces()[:2])


def test_bc_trains_without_shards_for_its_updates_and_imitates_the_teacher(datasets, tmp_path):
    config = raysim.load_config("cartpole_ppo", [*BC, f"run_dir={tmp_path / 'bc'}"])
    trainer = raysim.Trainer(config)
    assert trainer.plan is None and trainer.schedule.planned == 3  # 600 updates, 200 per iteration
    summary = trainer.train()
    assert summary.iterations == 3 and summary.env_steps == 0
    assert trainer.session.roles.shards == ()  # no training shard was started
    rows = read_metrics(open_storage(tmp_path / "bc"))
    assert [int(r["policy_version"]) for r in rows] == [1, 2, 3]
    assert rows[-1]["accuracy"] > 0.9 and rows[-1]["bc_loss"] < rows[0]["bc_loss"]
    assert summary.evaluation.completed == 10  # evaluated by the usual evaluation shards


def test_the_observation_statistics_are_those_of_the_whole_dataset_and_stay_fixed(datasets, tmp_path):
    raysim.Trainer(raysim.load_config("cartpole_ppo", [*BC, f"run_dir={tmp_path / 'bc'}"])).train()
    _, _, state, _ = locate_checkpoint(tmp_path / "bc")
    count, mean, var = moments(dataset().obs["policy"])
    assert float(state["model"]["actor.obs_norm.count"]) == float(count)
    assert torch.allclose(state["model"]["actor.obs_norm.mean"].double(), mean)
    assert torch.allclose(state["model"]["actor.obs_norm.var"].double(), var)


def test_bc_stopped_and_resumed_ends_with_the_uninterrupted_runs_weights(datasets, tmp_path):
    whole = tmp_path / "whole"
    raysim.Trainer(raysim.load_config("cartpole_ppo", [*BC, f"run_dir={whole}"])).train()
    parts = tmp_path / "parts"
    raysim.Trainer(raysim.load_config("cartpole_ppo", [*BC, f"run_dir={parts}", "train.stop_after=1"])).train()
    raysim.Trainer.from_run_dir(parts, overrides=["train.stop_after=null"]).train()
    a, b = locate_checkpoint(whole)[2]["model"], locate_checkpoint(parts)[2]["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_default_losses_are_cross_entropy_for_discrete_and_squared_error_of_the_mean_for_continuous():
    from raysim.algos.bc import BCConfig, bc_loss
    from raysim.models import ActorCritic, ModelConfig

    shard = EnvShard("raysim/Reach", 1)
    model = ActorCritic(*shard.spaces()[:2], ModelConfig(critic=False))
    obs = {"policy": torch.randn(6, model.actor.in_dim)}
    actions = torch.rand(6, 2) * 2 - 1
    loss, metrics = bc_loss(model, {"obs": obs, "actions": actions}, BCConfig())
    assert torch.allclose(loss, (model.actor(obs) - actions).square().mean())
    nll, _ = bc_loss(model, {"obs": obs, "actions": actions}, BCConfig(loss="nll"))
    assert torch.allclose(nll, -model.actor.log_prob_entropy(obs, actions)[0].mean())


def test_a_bc_config_without_a_dataset_or_with_a_missing_one_is_one_line_before_anything_starts(
    datasets, capsys, ray_never_starts
):
    assert main(["train", "cartpole_ppo", "--set", "algo={name: bc}", "--local"]) == 2
    assert "algo.dataset must name a dataset" in capsys.readouterr().err
    assert main(["train", "cartpole_ppo", "--set", "algo={name: bc, dataset: raysim/none-v0}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "raysim/none-v0" in err and len(err.splitlines()) == 1
    assert not ray_never_starts


@pytest.mark.slow
def test_bc_on_two_learner_ranks_reads_the_dataset_through_the_object_store_and_trains_each_on_its_share(
    datasets, tmp_path, ray_session
):
    overrides = [o for o in BC if o != "backend=local"]
    config = raysim.load_config("cartpole_ppo", [*overrides, "learner.ranks=2", f"run_dir={tmp_path / 'bc'}"])
    summary = raysim.Trainer(config).train()
    assert summary.iterations == 3 and summary.evaluation.completed == 10
    rows = read_metrics(open_storage(tmp_path / "bc"))
    assert rows[-1]["accuracy"] > 0.9
    share = dataset().split(1, 2)
    assert share.steps == dataset().steps // 2 and torch.equal(share.actions, dataset().actions[1::2])
