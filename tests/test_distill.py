"""Distillation (``algo.name: distill``): the shard labels every step with the teacher's actor, the student acts
(or the teacher, with probability beta), learns the labels, and a run resumes without the teacher's run."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

import raysim
from raysim.algos.distill import Distill, DistillConfig, distill_loss
from raysim.checkpoint import Checkpoints, locate_checkpoint
from raysim.cli import main
from raysim.coordinator.teacher import TEACHER_COPY, from_checkpoint, teacher_key
from raysim.envs import make
from raysim.envs.reach import DEFAULT_OBSERVATIONS
from raysim.models import Actor, ActorCritic, ModelConfig
from raysim.records import read_metrics
from raysim.rollout import EnvShard, FixedSteps, RolloutChunk
from raysim.rollout.teacher import TeacherWeights
from raysim.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("time", "steps_per_s", "time_collect", "time_update", "time_eval", "time_checkpoint")
# a PPO teacher on raysim/Reach in 4 short iterations; lr 0.01 gives its actor outputs well away from 0
TEACHER = [
    "backend=local",
    "env.num_envs=8",
    "algo.num_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "algo.lr=0.01",
    "algo.lr_schedule=constant",
    "train.total_steps=512",
    "eval.episodes=0",
    "train.sinks=[]",
]


def distill(teacher: Path) -> list[str]:
    """A student on raysim/Reach that reads the noise-free ``critic`` group and learns the teacher's actions
    from ``policy``: 8 iterations of 8 rows x 16 steps, beta 0.5 falling to 0 at the end; evaluated at 2, 4, 6
    (and saved there) and after the final save of 8."""
    algo = "num_steps: 16, num_minibatches: 2, update_epochs: 4, lr: 0.003, beta: 0.5, beta_decay_steps: 1024"
    return [
        f"algo={{name: distill, teacher: {teacher}, {algo}}}",
        "model.actor_inputs=[critic]",
        "env.num_envs=8",
        "train.total_steps=1024",
        "train.log_every=1",
        "eval.every=2",
        "eval.episodes=4",
        "eval.num_envs=2",
        "train.sinks=[parquet]",
    ]


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("distill") / "teacher"
    raysim.Trainer(raysim.load_config("reach_ppo", [*TEACHER, f"run_dir={run_dir}"])).train()
    return run_dir


@pytest.fixture(scope="module")
def straight(teacher_run) -> tuple[Path, list[float]]:
    """The uninterrupted distillation run, and the teacher share of each chunk it collected."""
    run_dir = teacher_run.parent / "straight"
    shares: list[float] = []
    collect = EnvShard.collect

    @functools.wraps(collect)  # the backend calls it by name
    def recording(shard, weights, plan):
        shares.append(plan.teacher_share)
        return collect(shard, weights, plan)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EnvShard, "collect", recording)
        config = raysim.load_config("reach_ppo", [*distill(teacher_run), "backend=local", f"run_dir={run_dir}"])
        summary = raysim.Trainer(config).train()
    assert summary.iterations == 8 and not summary.interrupted
    return run_dir, shares


def rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_metrics(open_storage(run_dir))]


def assert_same_run(run_dir: Path, straight: Path) -> None:
    """Equal metric rows, bitwise equal final weights, equal evaluation records."""
    assert rows(run_dir) == rows(straight)
    (_, _, a, meta_a), (_, _, b, meta_b) = locate_checkpoint(run_dir), locate_checkpoint(straight)
    assert meta_a["iteration"] == meta_b["iteration"] == 8
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert sorted(os.listdir(run_dir / "eval")) == sorted(os.listdir(straight / "eval"))
    for name in os.listdir(straight / "eval"):
        assert pq.read_table(run_dir / "eval" / name).to_pylist() == pq.read_table(straight / "eval" / name).to_pylist()


# -- the shard: labels and actions ------------------------------------------------------------------------------


def random_teacher(env_id: str, group: str = "policy", transform: str = "clip") -> tuple[Actor, TeacherWeights]:
    """A randomly initialised teacher actor on ``env_id``'s ``policy`` group (observation statistics and outputs
    away from their defaults), read from the student env's ``group``, of action ``transform``."""
    env = make(env_id, 1)
    model = ModelConfig(hidden_sizes=[16], obs_norm=True, action_transform=transform)
    torch.manual_seed(0)
    actor = Actor(env.observation_spaces, env.action_space, model)
    with torch.no_grad():
        actor.net[-1].weight.normal_()  # outputs of order 1, not the near-zero initial ones
        actor.obs_norm.mean.normal_()
        actor.obs_norm.var.uniform_(0.5, 2.0)
    actor.eval()
    weights = {"source": "a test", "model": dataclasses.asdict(model), "inputs": {"policy": group}}
    state = {k: v.clone() for k, v in actor.state_dict().items()}
    return actor, TeacherWeights(key=teacher_key({**weights, "actor": state}), actor=state, **weights)


def camera_shard(
    teacher: TeacherWeights | None, group: str = "policy", seed: int = 1, transform: str = "clip"
) -> EnvShard:
    """A raysim/ReachCamera shard of 4 rows (8 px camera) whose student reads [camera, joints] (its action
    ``transform``); the teacher's group (Reach's ``policy`` terms) is named ``group``."""
    observations = {"joints": ["joint_pos", "last_action"], group: DEFAULT_OBSERVATIONS["policy"]}
    student = {"actor_inputs": ["camera", "joints"], "cnn_features": 8, "hidden_sizes": [16], "critic": False}
    student["action_transform"] = transform
    kwargs = {"camera": {"size": 8}, "observations": observations}
    return EnvShard("raysim/ReachCamera", 4, seed=seed, model=student, env_kwargs=kwargs, teacher=teacher)


def rollout(shard: EnvShard, plan: FixedSteps, student: EnvShard | None = None) -> RolloutChunk:
    """``plan`` played by ``shard`` with its own student weights, or ``student``'s."""
    return shard.rollout({"version": 0, "actor": (student or shard).actor.state_dict()}, plan)


@pytest.mark.parametrize("group", ["policy", "privileged"], ids=["same-name", "renamed"])
def test_the_labels_in_a_chunk_equal_the_teachers_actor_applied_to_the_same_observations(group):
    actor, teacher = random_teacher("raysim/Reach", group)
    chunk = rollout(camera_shard(teacher, group), FixedSteps(16))
    assert chunk.labels is not None and chunk.labels.shape == (16, 4, 2)
    assert "camera" in chunk.obs and chunk.labels.abs().mean() > 0.1
    with torch.no_grad():
        for t in range(16):
            assert torch.equal(chunk.labels[t], actor({"policy": chunk.obs[group][t]})), t


def test_a_shard_without_a_teacher_has_no_labels_and_one_at_share_0_acts_exactly_as_without():
    shard = camera_shard(None)
    plain = rollout(shard, FixedSteps(16))
    taught = rollout(camera_shard(random_teacher("raysim/Reach")[1]), FixedSteps(16, teacher_share=0.0), shard)
    assert plain.labels is None
    assert torch.equal(plain.actions, taught.actions) and torch.equal(plain.obs["camera"], taught.obs["camera"])
    assert not (taught.actions == taught.labels).all(-1).any()  # every executed action is the student's


def test_at_teacher_share_1_every_action_is_the_label_and_at_one_half_about_half_are_the_same_each_time():
    teacher = random_teacher("raysim/Reach")[1]
    everything = rollout(camera_shard(teacher), FixedSteps(32, teacher_share=1.0))
    assert torch.equal(everything.actions, everything.labels)
    student = camera_shard(None)  # the same student weights in each shard
    half = [rollout(camera_shard(teacher), FixedSteps(32, teacher_share=0.5), student) for _ in range(2)]
    taken = (half[0].actions == half[0].labels).all(-1)
    assert 0.35 < taken.float().mean() < 0.65  # 128 draws
    for name in ("actions", "labels", "reward"):  # the draws come from the shard's seeded generator
        assert torch.equal(getattr(half[0], name), getattr(half[1], name)), name
    other = rollout(camera_shard(teacher, seed=2), FixedSteps(32, teacher_share=0.5), student)
    assert not torch.equal((other.actions == other.labels).all(-1), taken)


@pytest.mark.parametrize("teacher_transform, student_transform", [("clip", "squash"), ("squash", "clip")])
def test_a_teacher_of_another_action_transform_labels_and_acts_with_the_action_the_env_received_from_it(
    teacher_transform, student_transform
):
    from raysim.models.sampling import SQUASH_LIMIT

    actor, teacher = random_teacher("raysim/Reach", transform=teacher_transform)
    shard = camera_shard(teacher, transform=student_transform)
    chunk = rollout(shard, FixedSteps(16, teacher_share=1.0))
    with torch.no_grad():
        wanted = torch.stack([actor.env_action(actor({"policy": o})) for o in chunk.obs["policy"][:-1]])
    assert (wanted.abs() == 1).any() or teacher_transform == "squash"  # the clip teacher's mean leaves [-1, 1]
    for taught in (chunk.labels, chunk.actions):  # what the student regresses on, and what it executed
        received = shard.actor.env_action(taught)
        assert torch.allclose(received, wanted, atol=(1 - SQUASH_LIMIT) + 1e-6), (received - wanted).abs().max()
    assert torch.allclose(received[wanted.abs() < SQUASH_LIMIT], wanted[wanted.abs() < SQUASH_LIMIT], atol=1e-5)


def test_a_discrete_teachers_label_is_its_logits_and_its_action_the_most_likely_one():
    actor, teacher = random_teacher("raysim/CartPole")
    chunk = rollout(EnvShard("raysim/CartPole", 4, seed=1, teacher=teacher), FixedSteps(16, teacher_share=1.0))
    with torch.no_grad():
        assert torch.equal(chunk.labels, torch.stack([actor({"policy": o}) for o in chunk.obs["policy"][:-1]]))
    assert torch.equal(chunk.actions, chunk.labels.argmax(-1))


# -- the algorithm -------------------------------------------------------------------------------------------


def test_beta_falls_linearly_to_0_over_beta_decay_steps_and_stays_constant_without():
    config = DistillConfig(teacher="t", beta=0.5, beta_decay_steps=1000, num_steps=7)
    assert Distill.collection_at(config, 0) == FixedSteps(7, 0.5)
    assert Distill.collection_at(config, 500).teacher_share == pytest.approx(0.25)
    assert Distill.collection_at(config, 1000).teacher_share == Distill.collection_at(config, 5000).teacher_share == 0
    constant = DistillConfig(teacher="t", beta=0.5)
    assert Distill.collection_at(constant, 10**9) == Distill.collection(constant) == FixedSteps(32, 0.5)


def test_the_loss_is_the_squared_error_of_the_means_or_the_cross_entropy_from_the_teachers_probabilities():
    reach = EnvShard("raysim/Reach", 1).spaces()[:2]
    model = ActorCritic(*reach, ModelConfig(critic=False))
    obs, labels = {"policy": torch.randn(6, model.actor.in_dim)}, torch.randn(6, 2)
    loss, metrics = distill_loss(model, {"obs": obs, "labels": labels})
    assert torch.allclose(loss, (model.actor(obs) - labels).square().mean()) and set(metrics) == {"distill_loss"}
    cartpole = EnvShard("raysim/CartPole", 1).spaces()[:2]
    model = ActorCritic(*cartpole, ModelConfig(critic=False))
    obs, labels = {"policy": torch.randn(6, 4)}, torch.randn(6, 2)
    loss, metrics = distill_loss(model, {"obs": obs, "labels": labels})
    logits = model.actor(obs)
    assert torch.allclose(loss, -(labels.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean())
    assert metrics["agreement"] == (logits.argmax(-1) == labels.argmax(-1)).float().mean()


def test_a_squash_students_loss_is_the_squared_error_of_the_actions_the_env_receives():
    model = ActorCritic(*EnvShard("raysim/Reach", 1).spaces()[:2], ModelConfig(critic=False, action_transform="squash"))
    obs, labels = {"policy": torch.randn(6, model.actor.in_dim)}, torch.randn(6, 2) * 2
    loss, _ = distill_loss(model, {"obs": obs, "labels": labels})
    executed, taught = model.actor.env_action(model.actor(obs)), model.actor.env_action(labels)
    assert torch.allclose(loss, (executed - taught).square().mean(), atol=1e-6)


# -- runs ------------------------------------------------------------------------------------------------------


def test_a_student_learns_the_teachers_actions_and_the_run_keeps_the_teacher_and_its_key(teacher_run, straight):
    run_dir, shares = straight
    losses = [row["distill_loss"] for row in rows(run_dir)]
    assert len(losses) == 8 and losses[-1] < losses[0] / 2
    assert shares == [0.5 * (1 - 128 * i / 1024) for i in range(8)]  # beta, decayed by each iteration's env steps
    key = from_checkpoint(str(teacher_run), [])["key"]
    assert (run_dir / TEACHER_COPY).is_file()
    assert torch.load(run_dir / TEACHER_COPY, weights_only=True)["key"] == key
    saved = sorted((run_dir / "checkpoints").glob("*/meta.json"))
    assert saved and all(json.loads(meta.read_text())["teacher"]["key"] == key for meta in saved)


def test_train_2k_equals_train_k_stop_delete_the_teachers_run_resume_train_k_bitwise(teacher_run, straight, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run, teacher)
    run_dir = tmp_path / "student"
    overrides = [*distill(teacher), "backend=local", "train.stop_after=3", f"run_dir={run_dir}"]
    assert raysim.Trainer(raysim.load_config("reach_ppo", overrides)).train().iterations == 3
    shutil.rmtree(teacher)  # a resume reads the run's own copy
    summary = raysim.Trainer.from_run_dir(run_dir).train()
    assert summary.iterations == 8 and not summary.interrupted
    assert_same_run(run_dir, straight[0])


def train_cli(run_dir: Path, overrides: list[str], fault: str) -> subprocess.CompletedProcess:
    """``raysim train reach_ppo --local`` in its own process with a fault (``tests.support.faulty_train``)."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    sets = [item for override in overrides for item in ("--set", override)]
    command = [sys.executable, "-m", "tests.support.faulty_train", fault, "train", "reach_ppo", "--local"]
    return subprocess.run(
        [*command, "--run-dir", str(run_dir), *sets], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=240
    )


@pytest.mark.parametrize(
    ("fault", "code", "resumes_from"),
    [("update:3:kill", -9, 2), pytest.param("eval:4:term", 143, 3, marks=pytest.mark.slow)],
)
def test_a_distillation_run_killed_or_signalled_at_a_phase_resumes_to_exactly_the_uninterrupted_run(
    teacher_run, straight, tmp_path, capsys, fault, code, resumes_from
):
    run_dir = tmp_path / "student"
    stopped = train_cli(run_dir, distill(teacher_run), fault)
    assert stopped.returncode == code, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    assert main(["resume", str(run_dir), "--local"]) == 0
    assert f"(iteration {resumes_from}," in capsys.readouterr().out
    assert_same_run(run_dir, straight[0])


# -- the user's mistakes ---------------------------------------------------------------------------------------


def train_main(run_dir: Path, *overrides: str) -> int:
    small = ["env.num_envs=4", "algo.num_steps=8", "train.total_steps=32", "eval.episodes=0", "train.sinks=[]"]
    sets = [item for override in [*overrides, *small] for item in ("--set", override)]  # algo={...} first
    return main(["train", "reach_ppo", "--local", "--run-dir", str(run_dir), *sets])


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_missing_or_wrong_teacher_is_one_line_naming_the_key_before_anything_is_written(
    teacher_run, tmp_path, capsys
):
    run_dir = tmp_path / "student"
    assert train_main(run_dir, "algo={name: distill}") == 2
    assert "algo.teacher must name the teacher's run directory" in one_line(capsys)
    for nowhere in (tmp_path / "nowhere", tmp_path):
        assert train_main(run_dir, f"algo={{name: distill, teacher: {nowhere}}}") == 2
        assert f"algo.teacher {nowhere}: {nowhere} is neither a run directory" in one_line(capsys)
    assert train_main(run_dir, f"algo={{name: distill, teacher: {teacher_run}, teacher_inputs: [nosuch]}}") == 2
    assert "algo.teacher_inputs: the student env (raysim/Reach) has no group 'nosuch'" in one_line(capsys)
    assert train_main(run_dir, f"algo={{name: distill, teacher: {teacher_run}, teacher_inputs: [policy, critic]}}") == 2
    assert "algo.teacher_inputs: ['policy', 'critic'] names 2 group(s), but the teacher's actor reads 1" in one_line(
        capsys
    )
    assert not run_dir.exists()


def test_a_teacher_whose_actor_does_not_fit_or_that_is_recurrent_is_refused_in_one_line(tmp_path, capsys):
    three_links = tmp_path / "three-links"
    assert train_main(three_links, "env.kwargs.num_links=3", "env.kwargs.link_lengths=[0.4, 0.3, 0.3]") == 0
    recurrent = tmp_path / "recurrent"
    assert train_main(recurrent, "model.recurrent=lstm", "model.recurrent_size=8", "algo.num_minibatches=1") == 0
    capsys.readouterr()
    run_dir = tmp_path / "student"
    assert train_main(run_dir, f"algo={{name: distill, teacher: {three_links}}}") == 2
    err = one_line(capsys)
    assert f"algo.teacher {three_links} (checkpoint 1): its actor does not fit the student env's groups" in err
    assert "net.0.weight [64, 11] vs [64, 8]" in err  # the teacher's shape vs this env's
    assert train_main(run_dir, f"algo={{name: distill, teacher: {recurrent}}}") == 2
    assert f"algo.teacher {recurrent}: a recurrent teacher (model.recurrent: lstm)" in one_line(capsys)
    assert not run_dir.exists()


def test_a_damaged_copy_of_the_teacher_is_refused_on_resume_naming_the_file(teacher_run, tmp_path, capsys):
    run_dir = tmp_path / "student"
    assert train_main(run_dir, f"algo={{name: distill, teacher: {teacher_run}}}", "train.stop_after=1") == 0
    copy = run_dir / TEACHER_COPY
    intact = copy.read_bytes()
    middle = len(intact) // 2
    copy.write_bytes(intact[:middle] + bytes(b ^ 0xFF for b in intact[middle : middle + 64]) + intact[middle + 64 :])
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--local"]) == 2
    assert f"the run's teacher {copy} " in one_line(capsys)
    teacher = torch.load(io.BytesIO(intact), weights_only=True)
    teacher["actor"]["net.0.weight"][0, 0] += 1  # readable, but not the weights the run was trained with
    torch.save(teacher, copy)
    assert main(["resume", str(run_dir), "--local"]) == 2
    assert f"the run's teacher {copy} is damaged: its weights do not match the hash" in one_line(capsys)


def test_a_resume_keeps_its_teacher_refuses_another_and_saves_a_missing_copy(teacher_run, tmp_path, capsys):
    """A resume cannot change ``algo.teacher``: the run says so. A run whose copy went missing saves it again from
    ``algo.teacher`` when that is still the teacher its checkpoints name (the hash), and refuses one that is not."""
    run_dir, mine = tmp_path / "student", tmp_path / "teacher"
    shutil.copytree(teacher_run, mine)
    assert train_main(run_dir, f"algo={{name: distill, teacher: {mine}}}", "train.stop_after=1") == 0
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--local", "--set", f"algo.teacher={teacher_run}"]) == 2
    assert f"algo.teacher: checkpoint has '{mine}', this config has '{teacher_run}'" in capsys.readouterr().err
    copy = run_dir / TEACHER_COPY
    copy.unlink()
    assert main(["resume", str(run_dir), "--local", "--set", "train.stop_after=1"]) == 0
    assert copy.exists()
    copy.unlink()
    _, newest, state, meta = locate_checkpoint(mine)
    state["model"]["actor.net.0.weight"][0, 0] += 1  # the teacher's run moved on since the student started
    Checkpoints(open_storage(mine)).save(newest.iteration + 1, state, meta)
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--local"]) == 2
    assert "is not the teacher this run was trained with" in one_line(capsys)
    assert not copy.exists()


def test_the_packaged_camera_config_distils_a_reach_ppo_teacher_into_an_image_student(teacher_run, tmp_path):
    overrides = [
        "backend=local",
        f"algo.teacher={teacher_run}",
        "env.num_envs=4",
        "algo.num_steps=8",
        "algo.num_minibatches=1",
        "algo.update_epochs=1",
        "train.total_steps=64",
        "train.log_every=1",
        "eval.episodes=2",
        "eval.num_envs=2",
        f"run_dir={tmp_path / 'student'}",
    ]
    summary = raysim.Trainer(raysim.load_config("reach_camera_distill", overrides)).train()
    assert summary.iterations == 2 and summary.evaluation.completed == 2
    assert [row["iteration"] for row in rows(tmp_path / "student")] == [1, 2]
    assert all(row["distill_loss"] > 0 for row in rows(tmp_path / "student"))
