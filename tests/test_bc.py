"""Behaviour cloning: an algorithm on the learner without training shards, on a dataset of demonstrations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


# -- actions in the policy's space, the budget, the dataset's env --------------------------------------------------


def held_action_dataset(dataset_id: str, action: list[float], transform: str | None, env: list[str] = ()) -> None:
    """4 episodes of 8 steps on raysim/Reach's spaces (random observations) whose every action is ``action`` (an
    expert that holds it), written by raysim's writer with the metadata of a policy of ``transform`` (None: a
    scripted one) on reach_ppo's env with the overrides ``env``."""
    from raysim.config import to_dict
    from raysim.demos.writing import dataset_spaces, write_dataset
    from raysim.identity import env_identity

    observation_spaces, action_space = EnvShard("raysim/Reach", 1).spaces()[:2]
    rng = np.random.default_rng(0)
    records = []
    for episode in range(4):
        obs = {g: rng.uniform(-1, 1, (9, *s.shape)).astype(np.float32) for g, s in observation_spaces.items()}
        steps = {"obs": obs, "actions": np.tile(np.float32(action), (8, 1)), "reward": np.zeros(8, np.float32)}
        steps |= {"terminated": np.zeros(8, bool), "truncated": np.arange(8) == 7}
        records.append({"trajectory": steps, "seed": episode, "episode": episode, "return": 0.0, "length": 8})
    identity, canonical = env_identity(to_dict(raysim.load_config("reach_ppo", list(env)).env))
    metadata = {"env_id": "raysim/Reach", "env_identity": identity, "canonical_env": canonical}
    metadata |= {"policy": "expert" if transform is None else "checkpoint 1 of runs/x", "action_transform": transform}
    write_dataset(
        dataset_id, records, dataset_spaces(observation_spaces, action_space, transform is not None), (), metadata
    )


def clone(tmp_path: Path, dataset_id: str, *overrides: str) -> raysim.Trainer:
    algo = f"algo={{name: bc, dataset: {dataset_id}, updates: 200, num_minibatches: 100, batch_size: 32, lr: 0.01}}"
    settings = [algo, "backend=local", "eval.episodes=0", "train.sinks=[]", f"run_dir={tmp_path / 'bc'}", *overrides]
    return raysim.Trainer(raysim.load_config("reach_ppo", settings))


def cloned_env_action(run_dir: Path, transform: str) -> torch.Tensor:
    """The env action of the run's deterministic policy, averaged over 64 random observations."""
    from raysim.models import Actor, ModelConfig, actor_state

    observation_spaces, action_space = EnvShard("raysim/Reach", 1).spaces()[:2]
    actor = Actor(observation_spaces, action_space, ModelConfig(action_transform=transform))
    actor.load_state_dict(actor_state(locate_checkpoint(run_dir)[2]["model"]))
    with torch.no_grad():
        return actor.env_action(actor({"policy": torch.rand(64, actor.in_dim) * 2 - 1})).mean(0)


def test_an_experts_actions_are_cloned_through_the_squash_so_the_policy_executes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    held_action_dataset("test/held-v0", [0.8, -0.3], None)  # a scripted expert's: what the env received
    trainer = clone(tmp_path, "test/held-v0", "model.action_transform=squash")
    trainer.train()
    executed = cloned_env_action(trainer.run_dir, "squash")
    assert torch.allclose(executed, torch.tensor([0.8, -0.3]), atol=0.02), executed  # not tanh(0.8) = 0.66


def test_an_actors_dataset_is_cloned_as_recorded_and_one_of_another_transform_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys, ray_never_starts
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    held_action_dataset("test/actor-v0", [2.5, -0.3], "clip")  # an actor's mean before its clip
    demos = load_demonstrations("test/actor-v0", *EnvShard("raysim/Reach", 1).spaces()[:2], None, "clip")
    assert torch.equal(demos.actions, torch.tensor([2.5, -0.3]).expand(32, 2))  # as recorded, not clipped
    args = ["train", "reach_ppo", "--set", "algo={name: bc, dataset: test/actor-v0}"]
    assert main([*args, "--set", "model.action_transform=squash", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "test/actor-v0" in err, err
    assert "before its action transform 'clip'" in err and "model.action_transform is 'squash'" in err
    assert not ray_never_starts and not (tmp_path / "run").exists()


def test_bc_takes_exactly_algo_updates_gradient_steps_whatever_its_epochs_and_minibatches(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    held_action_dataset("test/held-v0", [0.8, -0.3], None)
    algo = "{name: bc, dataset: test/held-v0, updates: 7, num_minibatches: 3, update_epochs: 2, batch_size: 4}"
    trainer = clone(tmp_path, "test/held-v0", f"algo={algo}")
    assert trainer.schedule.planned == 2  # 6 steps, then the 1 that remains
    assert trainer.train().iterations == 2
    optimizer = locate_checkpoint(trainer.run_dir)[2]["optimizer"]
    assert {int(state["step"]) for state in optimizer["state"].values()} == {7}  # Adam's steps, every parameter


def test_a_dataset_recorded_on_another_env_is_said_in_one_line_and_cloned(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    held_action_dataset("test/other-v0", [0.8, -0.3], None, ["env.kwargs.max_episode_steps=5"])
    held_action_dataset("test/same-v0", [0.8, -0.3], None)
    clone(tmp_path, "test/other-v0", "algo.updates=2", "algo.num_minibatches=2").train()
    said = [line for line in capsys.readouterr().out.splitlines() if "algo.dataset" in line]
    assert len(said) == 1 and "test/other-v0 was recorded on another env than this run's" in said[0], said
    assert "env.kwargs.max_episode_steps: the dataset has 5, this config has " in said[0]
    clone(tmp_path / "same", "test/same-v0", "algo.updates=2", "algo.num_minibatches=2").train()
    assert "algo.dataset" not in capsys.readouterr().out


def test_with_squash_the_squared_error_is_the_executed_actions_and_the_nll_that_of_the_squashed_distribution():
    from raysim.algos.bc import BCConfig, bc_loss
    from raysim.models import ActorCritic, ModelConfig

    model = ActorCritic(*EnvShard("raysim/Reach", 1).spaces()[:2], ModelConfig(critic=False, action_transform="squash"))
    obs = {"policy": torch.randn(6, model.actor.in_dim)}
    actions = torch.randn(6, 2) * 2  # as the policy samples them: the atanh of the executed ones
    loss, metrics = bc_loss(model, {"obs": obs, "actions": actions}, BCConfig())
    executed = model.actor.env_action(model.actor(obs))
    assert torch.allclose(loss, (executed - model.actor.env_action(actions)).square().mean(), atol=1e-6)
    assert metrics["action_mse"] == loss
    nll, _ = bc_loss(model, {"obs": obs, "actions": actions}, BCConfig(loss="nll"))
    assert torch.allclose(nll, -model.actor.log_prob_entropy(obs, actions)[0].mean())
