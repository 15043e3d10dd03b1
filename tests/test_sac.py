"""SAC: its refusals, its warm-up, the replay ratio it keeps, its losses' ingredients, and runs that resume exactly."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pyarrow.parquet as pq
import pytest
import torch

import raysim
from raysim.algos.sac import SAC, squashed_sample
from raysim.checkpoint import Checkpoints
from raysim.cli import main
from raysim.coordinator import faults
from raysim.coordinator.demonstrations import record_demonstrations
from raysim.demos import load_demonstrations
from raysim.learner.learner import Learner
from raysim.models import ModelConfig
from raysim.records import read_metrics
from raysim.rollout import EnvShard, FixedSteps
from raysim.storage import LocalStorage, open_storage
from tests.support.faulty_train import FaultAt

ROOT = Path(__file__).resolve().parent.parent
# the packaged hopper_sac on raysim's native Reach (a joint vector, 2 actions in [-1, 1], 100-step episodes; a native
# env saves its state: a resume continues its episodes exactly), 1 row x 16 steps an iteration
TINY = [
    "env.id=raysim/Reach",
    "env.num_envs=1",
    "algo.num_steps=16",
    "algo.learning_starts=48",
    "algo.batch_size=32",
    "model.hidden_sizes=[32,32]",
    "model.activation=relu",
    "train.total_steps=160",
    "train.log_every=1",
    "eval.episodes=2",
    "eval.num_envs=2",
    "eval.max_steps=50",
    "train.sinks=[parquet]",
    "backend=local",
]
TIMING = {"time", "steps_per_s", "time_collect", "time_update", "time_eval", "time_checkpoint", "updates_per_s"}


def config_of(tmp_path, *overrides):
    return raysim.load_config("hopper_sac", [*TINY, f"run_dir={tmp_path}", *overrides])


def rows(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(open_storage(run_dir))]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("model.action_transform=clip", "sac needs model.action_transform: squash"),
        ("model.log_std=parameter", "sac needs model.log_std: state"),
        ("model.obs_norm=true", "does not take model.obs_norm"),
        ("model.recurrent=lstm", "does not train recurrent policies"),
        ("env.id=raysim/CartPole", "continuous (Box) action space"),
        ("replay.capacity=100000000000", "replay.capacity=100,000,000,000"),
    ],
)
def test_settings_sac_cannot_train_with_are_refused_in_one_line_before_ray_starts(
    tmp_path, capsys, ray_never_starts, override, said
):
    sets = [item for o in [*TINY[:-1], override] for item in ("--set", o)]
    assert main(["train", "hopper_sac", *sets, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and said in err[0], err
    assert not ray_never_starts


def test_warm_up_actions_are_uniform_in_the_action_space_and_drawn_from_the_shards_generator():
    def warm_up(seed):
        shard = EnvShard("gym:Pendulum-v1", 64, seed=seed, model={"action_transform": "squash", "log_std": "state"})
        return shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, FixedSteps(4, random_actions=True))

    chunk = warm_up(3)
    executed = 2.0 * torch.tanh(chunk.actions)  # Pendulum's [-2, 2], as the squash maps the stored action
    assert executed.abs().max() < 2 and executed.min() < -1.5 and executed.max() > 1.5
    assert abs(float(executed.mean())) < 0.2 and abs(float(executed.std()) - 4 / math.sqrt(12)) < 0.15  # U(-2, 2)
    assert torch.equal(chunk.actions, warm_up(3).actions) and not torch.equal(chunk.actions, warm_up(4).actions)


def test_the_squashed_samples_log_probability_carries_tanhs_log_determinant(tmp_path):
    learner = Learner(
        {"policy": gym.spaces.Box(-1, 1, (3,))},
        gym.spaces.Box(-1, 1, (2,)),
        ModelConfig(log_std="state", action_transform="squash", critic=False, hidden_sizes=[8]),
        config_of(tmp_path).algo,
        horizon=1,
        replay_capacity=10,
    )
    obs = {"policy": torch.randn(5, 3)}
    y, log_prob = squashed_sample(learner.model, obs, torch.Generator().manual_seed(0))
    mean, log_std = learner.model.actor.mean_log_std(learner.model.actor(obs))
    u = torch.atanh(y)
    normal = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1)
    assert torch.allclose(log_prob, normal - torch.log(1 - y.square() + 1e-6).sum(-1), atol=1e-4)


def test_gradient_steps_follow_updates_per_step_with_the_remainder_carried(tmp_path):
    config = config_of(tmp_path / "run", "algo.updates_per_step=0.75", "algo.learning_starts=24", "eval.episodes=0")
    summary = raysim.Trainer(config).train()
    assert summary.env_steps == 160
    table = read_metrics(open_storage(tmp_path / "run"))
    ratios = [r["replay_ratio"] for r in table]
    # 16 steps an iteration; from 24 on, 0.75 per step: iteration 2 counts 8 steps (6 gradient steps), then 12 each
    assert (
        ratios[0] == 0 and ratios[1] == pytest.approx(6 / 16) and all(r == pytest.approx(12 / 16) for r in ratios[2:])
    )
    assert table[-1]["buffer_size"] == 160


def test_a_lockstep_sac_run_stopped_and_resumed_is_bitwise_the_uninterrupted_one(tmp_path):
    straight = raysim.Trainer(config_of(tmp_path / "straight", "checkpoint.every=3")).train()
    stopped = raysim.Trainer(config_of(tmp_path / "resumed", "checkpoint.every=3", "train.stop_after=4")).train()
    assert stopped.iterations == 4 and stopped.interrupted
    resumed = raysim.Trainer.from_run_dir(tmp_path / "resumed").train()
    assert resumed.env_steps == straight.env_steps == 160
    assert rows(tmp_path / "resumed") == rows(tmp_path / "straight")
    (_, a, _), (_, b, _) = (
        Checkpoints(LocalStorage(tmp_path / d)).newest_intact(False) for d in ("resumed", "straight")
    )
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["sac"]["qf"][k], b["sac"]["qf"][k]) for k in a["sac"]["qf"])
    listing = Checkpoints(LocalStorage(tmp_path / "resumed")).replay_listing(
        Checkpoints(LocalStorage(tmp_path / "resumed")).list()[-1]
    )
    assert listing and listing[0][-1]["last"] == 159  # every transition of the run is in a listed segment


def train_cli(run_dir, fault: str, *overrides: str) -> subprocess.CompletedProcess:
    """``raysim train hopper_sac --local`` on the tiny Reach run in its own process, a fault injected
    (``tests.support.faulty_train``)."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    sets = [item for o in [*TINY[:-1], *overrides] for item in ("--set", o)]
    command = [sys.executable, "-m", "tests.support.faulty_train", fault, "train", "hopper_sac", "--local"]
    return subprocess.run(
        [*command, "--run-dir", str(run_dir), *sets], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def straight_sac(tmp_path_factory):
    """The uninterrupted lockstep SAC run the interrupted ones must end equal to (checkpoints every 3 iterations)."""
    run_dir = tmp_path_factory.mktemp("straight_sac") / "run"
    assert raysim.Trainer(config_of(run_dir, "checkpoint.every=3")).train().env_steps == 160
    return run_dir


def assert_same_sac_run(run_dir, straight) -> None:
    """Rows, the actor, the critics and their targets, the temperature, and the evaluation records, bitwise."""
    assert rows(run_dir) == rows(straight)
    (_, a, _), (_, b, _) = (Checkpoints(LocalStorage(d)).newest_intact(False) for d in (run_dir, straight))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for net in ("qf", "qf_target"):
        assert all(torch.equal(a["sac"][net][k], b["sac"][net][k]) for k in a["sac"][net])
    assert torch.equal(a["sac"]["log_alpha"], b["sac"]["log_alpha"])
    for name in sorted(os.listdir(straight / "eval")):
        assert pq.read_table(run_dir / "eval" / name).to_pylist() == pq.read_table(straight / "eval" / name).to_pylist()


@pytest.mark.parametrize(
    ("fault", "resumes_from"),
    [
        ("update:5:kill", 3),
        pytest.param("save:6:kill", 3, marks=pytest.mark.slow),
        pytest.param("collect:8:term", 7, marks=pytest.mark.slow),
    ],
)
def test_a_lockstep_sac_run_killed_at_a_phase_resumes_to_bitwise_the_uninterrupted_one(
    tmp_path, straight_sac, capsys, fault, resumes_from
):
    run_dir = tmp_path / "run"
    killed = train_cli(run_dir, fault, "checkpoint.every=3")
    assert killed.returncode in (-9, 143), killed.stdout[-2000:] + killed.stderr[-2000:]
    assert Checkpoints(LocalStorage(run_dir)).newest_intact(False)[0].iteration == resumes_from
    assert main(["resume", str(run_dir), "--local"]) == 0
    assert f"(iteration {resumes_from}," in capsys.readouterr().out
    assert_same_sac_run(run_dir, straight_sac)


@pytest.mark.slow
def test_a_sac_learner_that_dies_is_restarted_with_its_replay_buffer_and_the_run_is_the_uninterrupted_one(
    ray_session, tmp_path, straight_sac, capsys
):
    # killed after the update of iteration 5, which completes: restarted from iteration 5, whose buffer is the segments
    # of checkpoint 3 and the transitions iterations 4 and 5 appended (in the object store); a Ray run equals its
    # local run
    run_dir = tmp_path / "run"
    with faults.registered(fault := FaultAt("update:5:learner")):
        summary = raysim.Trainer(config_of(run_dir, "backend=ray", "checkpoint.every=3")).train()
    assert fault.fired and "restarted it from the last completed iteration 5;" in capsys.readouterr().out
    assert summary.env_steps == 160
    assert_same_sac_run(run_dir, straight_sac)


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory):
    """4 episodes of Reach (20 steps each) by random actions, recorded as a Minari dataset: RLPD's demonstrations."""
    pytest.importorskip("minari")
    root = tmp_path_factory.mktemp("rlpd")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        overrides = [*TINY[:-1], "env.kwargs={max_episode_steps: 20}", "backend=local"]
        record_demonstrations("raysim/reach-random-v0", 4, config="hopper_sac", policy="random", overrides=overrides)
    return root


def test_rlpd_draws_demo_fraction_of_every_batch_from_the_demonstrations(tmp_path, reach_demos, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(reach_demos))
    rlpd = [
        "env.kwargs={max_episode_steps: 20}",
        "algo.demonstrations=raysim/reach-random-v0",
        "algo.demo_fraction=0.25",
    ]
    summary = raysim.Trainer(config_of(tmp_path / "run", *rlpd, "eval.episodes=0")).train()
    table = read_metrics(open_storage(summary.run_dir))
    assert all(r["demo_fraction"] == 0.25 for r in table) and summary.env_steps == 160
    # one batch on a learner: 8 of its 32 transitions are demonstrated steps, 24 come from the buffer
    model = ModelConfig(**SAC.model_defaults(), hidden_sizes=[8])
    shard = EnvShard("raysim/Reach", 1, seed=0, model=model)
    spaces = shard.spaces()[:2]
    demos = load_demonstrations("raysim/reach-random-v0", *spaces, action_transform="squash", transitions=True)
    algo = config_of(tmp_path / "x", *rlpd, "algo.learning_starts=0").algo
    learner = Learner(*spaces, model, algo, horizon=1, replay_capacity=100, demonstrations=demos)
    learner.update(shard.rollout(learner.get_weights(), FixedSteps(16)))
    batch = learner.algorithm.sample(torch.Generator().manual_seed(0))
    demonstrated = (batch["obs"]["policy"].unsqueeze(1) == demos.obs["policy"].unsqueeze(0)).all(-1).any(1)
    assert int(demonstrated.sum()) == 8 and batch["reward"].shape == (32,)


def test_a_lockstep_rlpd_run_stopped_and_resumed_is_bitwise_the_uninterrupted_one(tmp_path, reach_demos, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(reach_demos))
    rlpd = ["env.kwargs={max_episode_steps: 20}", "algo.demonstrations=raysim/reach-random-v0", "checkpoint.every=3"]
    raysim.Trainer(config_of(tmp_path / "straight", *rlpd)).train()
    assert raysim.Trainer(config_of(tmp_path / "resumed", *rlpd, "train.stop_after=4")).train().iterations == 4
    raysim.Trainer.from_run_dir(tmp_path / "resumed").train()
    assert_same_sac_run(tmp_path / "resumed", tmp_path / "straight")


def test_demonstrations_that_do_not_fit_the_env_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    record_demonstrations("raysim/cartpole-random-v0", 1, config="cartpole_ppo", policy="random", backend="local")
    sets = [item for o in [*TINY[:-1], "algo.demonstrations=raysim/cartpole-random-v0"] for item in ("--set", o)]
    assert main(["train", "hopper_sac", "--local", *sets, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dataset raysim/cartpole-random-v0 has no observation group 'critic'" in err[0], err


@pytest.mark.slow
def test_two_learner_ranks_each_hold_their_shards_transitions_and_a_resume_refills_both_exactly(ray_session, tmp_path):
    # 2 shards x 1 row, one per rank: each rank's buffer holds its shard's 16 steps an iteration; segments per rank.
    # 4 iterations, updates from the 2nd (learning_starts 48), saved at 2 and stopped: the resume updates twice more
    two = ["backend=ray", "shards.count=2", "shards.num_cpus=0.5", "learner.ranks=2", "learner.num_cpus=0.5"]
    two += ["eval.episodes=0", "checkpoint.every=2", "train.total_steps=128"]
    raysim.Trainer(config_of(tmp_path / "straight", *two)).train()
    assert raysim.Trainer(config_of(tmp_path / "resumed", *two, "train.stop_after=2")).train().iterations == 2
    raysim.Trainer.from_run_dir(tmp_path / "resumed").train()
    assert rows(tmp_path / "resumed") == rows(tmp_path / "straight")
    assert read_metrics(open_storage(tmp_path / "straight"))[-1]["buffer_size"] == 64  # each rank: its shard's
    checkpoints = Checkpoints(LocalStorage(tmp_path / "resumed"))
    listing = checkpoints.replay_listing(checkpoints.list()[-1])
    assert len(listing) == 2 and [entries[-1]["last"] for entries in listing] == [63, 63]
    (_, a, _), (_, b, _) = (
        Checkpoints(LocalStorage(tmp_path / d)).newest_intact(False) for d in ("resumed", "straight")
    )
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_a_sac_run_with_policy_servers_is_the_collocated_run(tmp_path):
    # the servers placement acts with the same draws (the warm-up's uniform ones and the actor's): the same run
    collocated = raysim.Trainer(config_of(tmp_path / "collocated", "eval.episodes=0")).train()
    served = raysim.Trainer(config_of(tmp_path / "served", "eval.episodes=0", "shards.placement=servers")).train()
    assert collocated.env_steps == served.env_steps == 160
    assert rows(tmp_path / "served") == rows(tmp_path / "collocated")
