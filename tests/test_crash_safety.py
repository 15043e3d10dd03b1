"""Crash-safe runs: a kill, a signal or a failure at any phase loses no completed iteration, and a resumed
run ends exactly where an uninterrupted one does (env steps, metric rows, bitwise weights, evaluation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

import raysim
from raysim.checkpoint import Checkpoints
from raysim.cli import main
from raysim.config import ConfigError
from raysim.coordinator import Trainer, faults
from raysim.coordinator.trainer import RunFailed
from raysim.records import read_metrics
from raysim.rollout import EnvShard
from raysim.storage import LocalStorage, RunLock, RunLockedError, open_storage
from tests.support.faulty_train import FaultAt

ROOT = Path(__file__).resolve().parent.parent
# 1 shard x 4 rows x 32 steps = 128 env steps per iteration, 6 iterations; evaluations at 2 and 4 (saved),
# the final one after the final save of 6
TINY = [
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=768",
    "train.log_every=1",
    "eval.every=2",
    "eval.episodes=4",
    "eval.num_envs=2",
    "train.sinks=[parquet]",
]
PER_ITERATION = 128
TIMING = ("time", "steps_per_s", "time_collect", "time_update", "time_eval", "time_checkpoint")


def train_cli(run_dir: Path, fault: str, *overrides: str):
    """``raysim train --local`` in its own process, a fault injected by ``tests.support.faulty_train``. The same
    signals on an embedded Ray, with Ray's own handlers installed: ``tests/test_waits.py``."""
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    sets = [item for override in [*TINY, *overrides] for item in ("--set", override)]
    command = [sys.executable, "-m", "tests.support.faulty_train", fault, "train", "--run-dir", str(run_dir), *sets]
    return subprocess.run([*command, "--local"], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=240)


def rows(run_dir: Path) -> list[dict]:
    table = read_metrics(open_storage(run_dir))
    return [{k: v for k, v in row.items() if k not in TIMING} for row in table]


def newest(run_dir: Path):
    return Checkpoints(LocalStorage(run_dir)).newest_intact(announce=False)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> tuple[Path, list[tuple[str, int]]]:
    """The uninterrupted run every interrupted one must end equal to, and the phases a hook saw in it."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    config = raysim.load_config(None, [*TINY, "backend=local", f"run_dir={run_dir}"])
    seen: list[tuple[str, int]] = []
    with faults.registered(lambda phase, iteration, session: seen.append((phase, iteration))):
        summary = Trainer(config).train()
    assert summary.iterations == 6 and not summary.interrupted
    return run_dir, seen


@pytest.fixture(scope="module")
def straight(straight_run) -> Path:
    return straight_run[0]


def test_a_phase_hook_sees_each_phase_of_each_iteration_once_in_order(straight_run):
    expected = []
    for i in range(1, 7):  # evaluated (and so saved) at 2 and 4; the final evaluation after the final save
        expected += [("collect", i), ("update", i), *([("eval", i), ("save", i)] if i in (2, 4) else [])]
    assert straight_run[1] == [*expected, ("final_save", 6), ("final_eval", 6), ("eval", 6)]


def assert_same_run(run_dir: Path, straight: Path) -> None:
    assert rows(run_dir) == rows(straight)  # every column but wall time and steps/s
    (_, a, meta_a), (_, b, meta_b) = newest(run_dir), newest(straight)
    assert meta_a["iteration"] == meta_b["iteration"] == 6 and meta_a["env_steps"] == meta_b["env_steps"] == 768
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for name in sorted(os.listdir(straight / "eval")):
        assert pq.read_table(run_dir / "eval" / name).to_pylist() == pq.read_table(straight / "eval" / name).to_pylist()
    assert sorted(os.listdir(run_dir / "eval")) == sorted(os.listdir(straight / "eval"))


@pytest.mark.parametrize(
    ("fault", "resumes_from", "placement"),
    [
        ("collect:3", 2, "collocated"),
        pytest.param("update:3", 2, "collocated", marks=pytest.mark.slow),
        pytest.param("eval:4", 2, "collocated", marks=pytest.mark.slow),
        ("save:4", 2, "collocated"),  # killed between the checkpoint's files and its completion marker
        pytest.param("final_save:6", 4, "collocated", marks=pytest.mark.slow),
        pytest.param("final_eval:6", 6, "collocated", marks=pytest.mark.slow),
        ("eval:4", 2, "servers"),  # a run with policy servers is the collocated run, resumed too
    ],
)  # the quick set (-m "not slow") keeps three phases; the full suite, every one
def test_a_driver_killed_at_any_phase_resumes_to_exactly_the_uninterrupted_run(
    tmp_path, straight, capsys, fault, resumes_from, placement
):
    run_dir = tmp_path / "run"
    killed = train_cli(run_dir, f"{fault}:kill", f"shards.placement={placement}")
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert newest(run_dir)[0].iteration == resumes_from
    assert main(["resume", str(run_dir), "--local"]) == 0
    out = capsys.readouterr().out
    assert f"(iteration {resumes_from}," in out
    assert "broke the lock of process" in out and "no longer exists" in out  # the killed process's lock
    assert_same_run(run_dir, straight)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "code", "saved"),
    [
        ("collect:3:int", 130, 2),
        ("update:3:term", 143, 2),
        ("eval:4:term", 143, 3),  # iteration 4 is abandoned whole; 3 was the last completed one
        ("save:4:int", 130, 4),  # the checkpoint is finished first
        ("final_save:6:term", 143, 6),
        ("final_eval:6:int", 130, 6),
    ],
)
def test_sigint_and_sigterm_at_any_phase_save_the_last_completed_iteration_and_resume_exactly(
    tmp_path, straight, capsys, fault, code, saved
):
    run_dir = tmp_path / "run"
    stopped = train_cli(run_dir, fault=fault)
    out = stopped.stdout
    assert stopped.returncode == code, out[-2000:] + stopped.stderr[-2000:]
    assert "Traceback" not in out + stopped.stderr
    assert f"continue with `raysim resume {run_dir}`" in out
    checkpoint, state, meta = newest(run_dir)
    assert checkpoint.iteration == meta["iteration"] == saved  # the counters agree with each other
    assert meta["env_steps"] == saved * PER_ITERATION and meta["version"] == state["version"] == saved
    assert [r["iteration"] for r in rows(run_dir)] == list(range(1, saved + 1))
    assert main(["resume", str(run_dir), "--local"]) == 0
    capsys.readouterr()
    assert_same_run(run_dir, straight)


def test_a_run_stopped_by_stop_after_exits_0_and_says_how_to_resume(tmp_path, capsys):
    sets = [item for override in [*TINY, "train.stop_after=2"] for item in ("--set", override)]
    assert main(["train", "--local", "--run-dir", str(tmp_path / "run"), *sets]) == 0
    assert f"continue with `raysim resume {tmp_path / 'run'}`" in capsys.readouterr().out


@pytest.mark.slow
def test_the_learner_dying_during_the_final_evaluation_or_save_loses_nothing(ray_session, tmp_path):
    for phase in ("final_eval", "final_save"):
        run_dir = tmp_path / phase
        with faults.registered(fault := FaultAt(f"{phase}:6:learner")):
            summary = Trainer(raysim.load_config(None, [*TINY, "backend=ray", f"run_dir={run_dir}"])).train()
        assert fault.fired
        assert summary.iterations == 6 and not summary.interrupted
        assert summary.evaluation is not None and summary.evaluation.completed == 4
        assert newest(run_dir)[0].iteration == 6


def test_a_failure_mid_run_saves_the_last_completed_iteration_and_says_how_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *TINY,
        "backend=local",
        "env.id=tests.support.crashing:NaNRewards",
        "env.kwargs={every: 300}",
        "eval.every=0",
        "eval.episodes=0",
    ]
    with pytest.raises(RunFailed) as failed:  # step 300 of the shard: iteration 10 (steps 288..319)
        Trainer(raysim.load_config(None, [*overrides, "train.total_steps=2048", f"run_dir={run_dir}"])).train()
    message = str(failed.value)
    assert "NonFiniteError" in message and "returned a non-finite observation or reward" in message
    assert f"the last completed iteration (9) is saved; after fixing the cause: raysim resume {run_dir}" in message
    assert newest(run_dir)[0].iteration == 9


def test_non_finite_episodes_in_the_final_evaluation_are_left_out_and_counted(tmp_path):
    overrides = [
        *TINY,
        "backend=local",
        "env.id=tests.support.crashing:NaNRewards",
        "env.kwargs={every: 40}",
        "env.on_nonfinite=mask",
        "eval.episodes=20",
        "eval.every=0",
    ]
    summary = Trainer(raysim.load_config(None, [*overrides, f"run_dir={tmp_path / 'run'}"])).train()
    report = summary.evaluation
    assert report.excluded > 0 and report.completed + report.excluded <= 20
    assert report.returns["mean"] is not None and all(v == v for v in report.returns.values())  # no NaN
    # the masked steps are not counted: the run goes on past its 6 iterations of 128 steps to 768 counted ones
    assert summary.env_steps >= 768 and newest(tmp_path / "run")[0].iteration == summary.iterations > 6


def test_the_best_checkpoint_is_one_whose_own_weights_were_evaluated(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *TINY,
        "backend=local",
        "eval.every=3",
        "checkpoint.every=1",
        "checkpoint.keep_last=1",
        "train.total_steps=1280",
    ]
    Trainer(raysim.load_config(None, [*overrides, f"run_dir={run_dir}"])).train()
    checkpoints = Checkpoints(LocalStorage(run_dir))
    kept = checkpoints.list()
    scored = {c.iteration: checkpoints.score(c) for c in kept if checkpoints.score(c) is not None}
    assert kept[-1].iteration == 10 and set(scored) <= {3, 6, 9, 10} and scored  # evaluated iterations only
    for checkpoint in kept:
        score = checkpoints.score(checkpoint)
        if score is not None:
            assert (
                json.loads((run_dir / checkpoint.rel / "score.json").read_text())["iteration"] == checkpoint.iteration
            )
            eval_file = pq.read_table(run_dir / "eval" / f"{checkpoint.iteration}.parquet").to_pylist()
            assert score == pytest.approx(sum(r["return"] for r in eval_file) / len(eval_file))


def test_eval_and_export_fall_back_past_a_damaged_newest_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    Trainer(raysim.load_config(None, [*TINY, "backend=local", f"run_dir={run_dir}"])).train()
    target = run_dir / "checkpoints" / "6" / "state.pt"
    with open(target, "r+b") as handle:
        handle.seek(target.stat().st_size // 2)
        handle.write(b"\x41" * 512)
    assert main(["eval", str(run_dir), "--episodes", "2", "--local"]) == 0
    assert main(["export", str(run_dir), "--out", str(tmp_path / "policy.pt")]) == 0
    out = capsys.readouterr().out
    assert out.count(f"skipping damaged checkpoint: checkpoint file {target} is damaged") == 2
    assert "checkpoints/4" in out  # the newest intact one


def test_resume_force_makes_the_runs_own_snapshot_describe_the_new_env(tmp_path, capsys):
    run_dir = tmp_path / "run"
    Trainer(raysim.load_config(None, [*TINY, "backend=local", "train.stop_after=2", f"run_dir={run_dir}"])).train()
    changed = ["env.kwargs.max_episode_steps=200", "train.stop_after=1"]
    with pytest.raises(ConfigError, match="kwargs.max_episode_steps: checkpoint has 500, this config has 200"):
        Trainer.from_run_dir(run_dir, overrides=changed)
    Trainer.from_run_dir(run_dir, overrides=changed, force=True).train()
    assert "max_episode_steps: 200" in (run_dir / "configs" / "gym.yaml").read_text()
    assert Trainer.from_run_dir(run_dir).train().iterations == 6  # accepted without --force now
    assert raysim.load_config(run_dir / "configs" / "train.yaml").env.kwargs["max_episode_steps"] == 200


def test_resuming_with_other_row_counts_starts_fresh_episodes_and_a_different_model_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    Trainer(raysim.load_config(None, [*TINY, "backend=local", "train.stop_after=2", f"run_dir={run_dir}"])).train()
    Trainer.from_run_dir(run_dir, overrides=["env.num_envs=8", "train.stop_after=1"]).train()
    assert "fresh episodes (4 rows saved per shard, 8 now)" in capsys.readouterr().out
    with pytest.raises(
        ConfigError, match=r"model\.hidden_sizes: checkpoint has \[64, 64\], this config has \[128, 128\]"
    ):
        Trainer.from_run_dir(run_dir, overrides=["model.hidden_sizes=[128,128]"])
    with pytest.raises(ConfigError, match="algo.name: checkpoint has 'ppo', this config has 'grpo'"):
        Trainer.from_run_dir(run_dir, "cartpole_grpo", overrides=["env.num_envs=8"])


def test_resuming_with_another_shard_count_starts_fresh_episodes_in_every_shard_and_says_so(
    tmp_path, capsys, monkeypatch
):
    starts = []  # (shard, fresh, first observations) of every chunk
    rollout = EnvShard.rollout

    def recording(shard, weights, plan):
        chunk = rollout(shard, weights, plan)
        starts.append((chunk.shard, chunk.fresh, chunk.obs["policy"][0].clone()))
        return chunk

    monkeypatch.setattr(EnvShard, "rollout", recording)
    run_dir = tmp_path / "run"
    Trainer(
        raysim.load_config(None, [*TINY, "backend=local", "shards.count=1", "train.stop_after=2", f"run_dir={run_dir}"])
    ).train()
    begun = [obs for _, fresh, obs in starts if fresh]  # the episodes the run started from
    del starts[:]
    Trainer.from_run_dir(run_dir, overrides=["shards.count=2", "train.stop_after=1"]).train()
    assert "shards continue with fresh episodes (1 shards saved, 2 now)" in capsys.readouterr().out
    assert sorted(shard for shard, _, _ in starts) == [0, 1]
    for shard, fresh, obs in starts:  # every shard starts new episodes, none the run already played
        assert fresh and not any(torch.equal(obs, old) for old in begun), shard


def test_a_second_process_on_the_same_run_directory_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    Trainer(raysim.load_config(None, [*TINY, "backend=local", "train.stop_after=1", f"run_dir={run_dir}"])).train()
    holder = RunLock(LocalStorage(run_dir), lease=3600)  # not renewed (finding it taken over) during the test
    holder.acquire()
    try:
        with pytest.raises(RunLockedError, match=rf"in use by process {os.getpid()} on host '{os.uname().nodename}'"):
            Trainer.from_run_dir(run_dir).train()
        assert main(["resume", str(run_dir), "--local"]) == 2  # a one-line refusal, rc 2
        assert Trainer.from_run_dir(run_dir, overrides=["train.stop_after=1"], break_lock=True).train().iterations == 2
    finally:
        holder.release()


def test_a_lock_left_by_a_dead_process_or_an_expired_lease_elsewhere_is_broken(tmp_path, capsys):
    storage = LocalStorage(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    storage.write("lock.json", json.dumps({"host": os.uname().nodename, "pid": int(gone.stdout)}).encode())
    lock = RunLock(storage)
    assert "no longer exists" in lock.acquire()
    lock.release()
    far = {"host": "another-host", "pid": 1, "lease_seconds": 120}
    storage = LocalStorage(tmp_path)  # the other process's: this one gave the lock back and writes no more
    storage.write("lock.json", json.dumps(far).encode())
    os.utime(tmp_path / "lock.json", (1.0, 1.0))  # last renewed long ago, by the filesystem's clock
    assert "lease expired" in (lock := RunLock(LocalStorage(tmp_path))).acquire()
    lock.release()
    storage.write("lock.json", json.dumps(far).encode())  # a live lease elsewhere: renewed just now
    with pytest.raises(RunLockedError, match="in use by process 1 on host 'another-host'"):
        RunLock(storage).acquire()


@pytest.mark.slow
def test_two_learner_ranks_save_every_ranks_state_and_resume_exactly(ray_session, tmp_path):
    ranks = [
        *TINY,
        "backend=ray",
        "shards.count=2",
        "learner.ranks=2",
        "algo.reward_scale=true",
        "eval.every=0",
        "eval.episodes=0",
        "train.total_steps=1536",
        "train.log_every=2",  # stopped at 3: row 4 covers iterations 3 and 4 of both ranks
    ]
    Trainer(raysim.load_config(None, [*ranks, f"run_dir={tmp_path / 'a'}"])).train()
    Trainer(raysim.load_config(None, [*ranks, "train.stop_after=3", f"run_dir={tmp_path / 'b'}"])).train()
    _, halfway, _ = newest(tmp_path / "b")
    assert len(halfway["ranks"]) == 1 and set(halfway["ranks"][0]) == {"generator", "window", "reward_scale"}
    assert not torch.equal(halfway["ranks"][0]["generator"], halfway["generator"])  # rank 1's own
    Trainer.from_run_dir(tmp_path / "b").train()
    (_, a, _), (_, b, _) = newest(tmp_path / "a"), newest(tmp_path / "b")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert [row["iteration"] for row in rows(tmp_path / "b")] == [2, 4, 6]
    assert rows(tmp_path / "a") == rows(tmp_path / "b")


class FillDiskAt:
    """A sink that fills the run's disk after the log step of ``iteration``."""

    def __init__(self, path: Path, iteration: int):
        self.path, self.iteration = path, iteration

    def write(self, record: dict) -> None:
        if record["iteration"] == self.iteration:
            free = os.statvfs(self.path).f_bavail * os.statvfs(self.path).f_frsize
            (self.path / "filler").write_bytes(b"\0" * max(0, free - 4096))

    def close(self) -> None:
        pass


def test_a_full_disk_ends_the_run_with_a_message_and_the_previous_checkpoint_intact(small_disk):
    run_dir = small_disk / "run"
    config = raysim.load_config(None, [*TINY, "backend=local", "eval.episodes=0", f"run_dir={run_dir}"])
    with pytest.raises(RunFailed) as failed:
        Trainer(config, sinks=[FillDiskAt(small_disk, 3)]).train()  # the save of evaluated iteration 4 fails
    message = str(failed.value)
    full = "OSError: [Errno 28] No space left on device"
    assert f"saving iteration 4 failed: {full}: '{run_dir}/checkpoints/4/" in message  # which write failed
    assert f"the newest intact checkpoint is {run_dir}/checkpoints/2; after fixing the cause: raysim resume" in message
    assert [c.name for c in Checkpoints(LocalStorage(run_dir)).list()] == ["2"]
    assert newest(run_dir)[1]["version"] == 2


@pytest.fixture
def remountable(tmp_path):
    """A tmpfs that a test can turn read-only mid-run (``mount -o remount,ro``: chmod does not stop root); skipped,
    saying why, where mounting or remounting is not permitted."""
    from tests.support.tmpfs import mounted_tmpfs

    with mounted_tmpfs(tmp_path, "size=64m", "a tmpfs") as mount:
        for mode in ("ro", "rw"):
            done = subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot remount a tmpfs read-only here: {done.stderr.strip()}")
        yield mount


def test_a_run_directory_turned_read_only_ends_with_the_failed_saves_own_line_and_resume_hint(remountable, capsys):
    run_dir = remountable / "run"

    def read_only(phase: str, iteration: int, session) -> None:
        if (phase, iteration) == ("collect", 3):  # after the checkpoint of iteration 2
            subprocess.run(["mount", "-o", "remount,ro", str(remountable)], check=True)

    sets = [i for o in [*TINY, "eval.every=0", "eval.episodes=0", "checkpoint.every=2"] for i in ("--set", o)]
    with faults.registered(read_only):
        code = main(["train", "--local", "--run-dir", str(run_dir), *sets])
    out, err = capsys.readouterr()
    assert code == 1 and "internal error" not in err and "Traceback" not in err, err
    read_only = f"OSError: [Errno 30] Read-only file system: '{run_dir}/checkpoints/4'"
    assert "raysim: error: " in err and f"saving iteration 4 failed: {read_only}" in err, err
    assert err.rstrip().endswith(
        f"the newest intact checkpoint is {run_dir}/checkpoints/2; after fixing the cause: raysim resume {run_dir}"
    ), err
    assert "giving back the run's lock failed" in err and "lock.json" in err, err  # said, and not instead


def test_a_cleanup_failure_after_a_run_that_ended_well_is_still_said(tmp_path, capsys, monkeypatch):
    def refuse(self) -> None:
        raise OSError(30, "Read-only file system", str(tmp_path / "run" / "lock.json"))

    monkeypatch.setattr(RunLock, "release", refuse)
    sets = [i for o in [*TINY, "eval.episodes=0", "train.total_steps=256"] for i in ("--set", o)]
    code = main(["train", "--local", "--run-dir", str(tmp_path / "run"), *sets])
    err = capsys.readouterr().err
    assert code == 1 and "internal error" not in err, err
    assert "giving back the run's lock failed: OSError: [Errno 30] Read-only file system" in err, err


def test_checkpoints_are_saved_by_wall_time_too(tmp_path):
    run_dir = tmp_path / "run"
    config = raysim.load_config(
        None,
        [
            *TINY,
            "backend=local",
            "eval.every=0",
            "checkpoint.every=0",
            "checkpoint.every_seconds=0.000001",
            "checkpoint.keep_last=10",
            f"run_dir={run_dir}",
        ],
    )
    Trainer(config).train()
    assert [c.iteration for c in Checkpoints(LocalStorage(run_dir)).list()] == [1, 2, 3, 4, 5, 6]
    defaults = raysim.load_config(None).checkpoint
    assert defaults.every > 0 and defaults.every_seconds > 0  # periodic checkpoints without being asked


def test_a_run_killed_before_its_first_checkpoint_is_resumed_by_starting_it_over(tmp_path, straight, capsys):
    run_dir = tmp_path / "run"
    killed = train_cli(run_dir, fault="update:1:kill")
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    assert (run_dir / "configs" / "train.yaml").is_file() and not Checkpoints(LocalStorage(run_dir)).list()
    assert main(["resume", str(run_dir), "--local"]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir} has no checkpoint: starting the run over from its configs" in out
    assert_same_run(run_dir, straight)


def test_a_run_failing_before_its_first_iteration_leaves_no_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    sets = ["env.id=tests.support.crashing:NaNRewards", "env.kwargs={every: 5}", "eval.episodes=0"]
    assert (
        main(["train", "--local", "--run-dir", str(run_dir), *[a for s in [*TINY, *sets] for a in ("--set", s)]]) == 1
    )
    assert "no iteration had completed" in capsys.readouterr().err
    assert not run_dir.exists()
