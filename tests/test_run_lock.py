"""The run lock (``lock.json``): one process trains a run directory, a gone holder's lock is broken, and
breaking it is atomic.

On the same host a holder is gone when its pid no longer runs the process that took the lock (a pid is
reused after a restart) or its lease expired; elsewhere when its lease expired, by the storage's clock (on
S3 the server's ``LastModified``). Of processes racing to break one stale lock exactly one wins; a holder
whose lock was taken over (or taken over and given back) stops at its next renewal, saying so, and every
change it would make to the run before that is refused (the fence). S3 runs on moto's server on localhost.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from raysim.checkpoint import Checkpoints
from raysim.composition import ConfigError
from raysim.coordinator.claim import RunClaim
from raysim.coordinator.snapshot import choose_run_dir, default_run_dirs
from raysim.records import append_metrics, metric_parts, read_table
from raysim.storage import LeaseLostError, LocalStorage, RunLock, RunLockedError, Staging, open_storage
from raysim.sweep.trial import start_over, take_over
from tests.support.lock_race import race
from tests.support.moto_s3 import moto_server

ROOT = Path(__file__).resolve().parent.parent
HOST = socket.gethostname()


def proc(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])


def this_machine(pid: int, started: int) -> dict:
    """A lock record of process ``pid`` on this host, as this host's processes see it."""
    return {
        "host": HOST,
        "boot_id": proc("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": os.readlink("/proc/self/ns/pid"),
        "pid": pid,
        "started": started,
        "token": "someone-else",
        "since": time.time(),
        "renewed": time.time(),
        "lease_seconds": 120,
    }


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


@needs_proc
@pytest.mark.parametrize("pid", [os.getpid(), 1], ids=["this-pid", "pid-1"])
def test_a_lock_whose_pid_now_runs_another_process_is_stale(tmp_path, pid):
    storage = LocalStorage(tmp_path)
    storage.write("lock.json", json.dumps(this_machine(pid, start_ticks(pid) + 7)).encode())  # started later
    lock = RunLock(storage)
    note = lock.acquire()
    lock.release()
    assert f"process {pid}" in note and "reused" in note


@needs_proc
def test_a_lock_whose_process_was_killed_but_not_yet_reaped_is_stale_at_once(tmp_path):
    """A driver killed (SIGKILL) whose parent has not waited for it yet is a zombie: its pid exists, it holds
    nothing, and ``raysim resume`` right after the kill must not wait out the lease."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed.kill()
        while Path(f"/proc/{killed.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)
        storage = LocalStorage(tmp_path)
        storage.write("lock.json", json.dumps(this_machine(killed.pid, start_ticks(killed.pid))).encode())
        lock = RunLock(storage)
        note = lock.acquire()
        lock.release()
        assert f"process {killed.pid} has ended" in note
    finally:
        killed.wait()


@needs_proc
def test_a_lock_on_this_host_whose_lease_expired_is_stale_though_its_process_runs(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.write("lock.json", json.dumps(this_machine(os.getpid(), start_ticks(os.getpid()))).encode())
    with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):  # its process runs, its lease holds
        RunLock(storage).acquire()
    long_ago = time.time() - 1000
    os.utime(tmp_path / "lock.json", (long_ago, long_ago))  # not renewed for 1000 s (a stopped process)
    lock = RunLock(storage)
    assert "lease expired" in lock.acquire()
    lock.release()


def race_to_break(location: str, write_stale, env: dict, racers: int = 4, rounds: int = 4) -> None:
    """``racers`` processes at once take over the stale lock ``write_stale`` left: exactly one wins, each round."""
    context = multiprocessing.get_context("forkserver")  # racers forked from a process without this one's threads
    context.set_forkserver_preload(["tests.support.lock_race"])
    for _ in range(rounds):
        write_stale()
        start, done, results = context.Barrier(racers), context.Event(), context.Queue()
        workers = [context.Process(target=race, args=(location, env, start, results, done)) for _ in range(racers)]
        for worker in workers:
            worker.start()
        outcomes = sorted(results.get(timeout=120) for _ in workers)
        done.set()
        for worker in workers:
            worker.join(timeout=60)
        assert outcomes == ["refused"] * (racers - 1) + ["won"]
        assert not open_storage(location).exists("lock.json")  # the winner gave it back


def test_processes_racing_to_break_one_stale_lock_have_exactly_one_winner(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {"host": HOST, "pid": int(gone.stdout), "token": "dead"}

    def write_stale():
        LocalStorage(tmp_path).write("lock.json", json.dumps(dead).encode())

    race_to_break(str(tmp_path), write_stale, {}, racers=6, rounds=15)


HOLDER = """
import sys, time
from raysim.storage import RunLock, open_storage
storage = open_storage(sys.argv[1])
lock = RunLock(storage, lease=float(sys.argv[2]))
lock.acquire()
print("held", flush=True)
for step in range(3000):  # a run writing into its directory until the lock is taken over
    storage.write("progress", str(step).encode())
    time.sleep(0.02)
"""


def take_over_a_live_holder(location: str, env: dict | None = None) -> None:
    """A holder renewing every 0.25 s; another process breaks its lock (``--break-lock``): the holder stops at
    its next renewal, says who took the run over, exits 1, and leaves the new holder's lock alone."""
    environ = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, location, "1.0"], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n", holder.stderr.read()
        lock = RunLock(open_storage(location))
        assert "forced" in lock.acquire(force=True)
        _, err = holder.communicate(timeout=90)
        assert holder.returncode == 1, err
        assert f"taken over by process {os.getpid()} on host {HOST!r}" in err and "stops now" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert lock.holder()["token"] == lock.token  # the stopped holder wrote nothing more
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_whose_lock_was_taken_over_stops_with_a_clear_message(tmp_path):
    take_over_a_live_holder(str(tmp_path))


TRAIN = """
import sys
from raysim.cli import main
from raysim.storage import RunLock
RunLock.__init__.__defaults__ = (1.0,)  # the trainer's lock: a lease of 1 s, renewed every 0.25 s
sys.exit(main(sys.argv[1:]))
"""
TINY = ["env.num_envs=4", "algo.num_steps=32", "algo.num_minibatches=2", "algo.update_epochs=1", "eval.every=0"]


def test_a_training_run_whose_lock_was_taken_over_stops_without_saving_or_a_resume_hint(tmp_path):
    run_dir = tmp_path / "run"
    sets = [i for o in [*TINY, "train.total_steps=100000000", "checkpoint.every=1", "train.sinks=[parquet]"]
            for i in ("--set", o)]  # fmt: skip
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAIN, "train", "--local", "--run-dir", str(run_dir), *sets],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while len(LocalStorage(run_dir).list("checkpoints")) < 2 and trainer.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint after 180 s"
            time.sleep(0.2)
        lock = RunLock(LocalStorage(run_dir))
        assert "forced" in lock.acquire(force=True)  # raysim resume --break-lock, elsewhere
        out, err = trainer.communicate(timeout=120)
        assert trainer.returncode == 1, out[-2000:] + err[-2000:]
        assert err.strip().splitlines() == [
            f"raysim: error: run directory {run_dir} was taken over by process {os.getpid()} on host {HOST!r}: "
            "this process lost its lock and stops now, writing nothing more"
        ], err
        assert "resume" not in out, out[-2000:]  # not the signal or failure path: nothing saved, no hint
        assert lock.holder()["token"] == lock.token
        lock.release()
    finally:
        trainer.kill()
        trainer.wait()


TRAIN_WITH_FAKE_WANDB = """
import sys
from tests.support.fake_wandb import CallFile, fake_wandb_module
sys.modules["wandb"] = fake_wandb_module(CallFile(sys.argv[1]))  # each call's name a line of that file
from raysim.cli import main
sys.exit(main(sys.argv[2:]))
"""


def scalar_events(tb: Path) -> int:
    """The scalar events in the TensorBoard files of ``tb``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return sum(1 for f in sorted(tb.glob("events.*")) for e in EventFileLoader(str(f)).Load() if e.summary.value)


def files(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of the run but its lock, with its size and modification time."""
    found = (p for p in run_dir.rglob("*") if p.is_file() and p.name != RunLock.FILE)
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in found}


def test_nothing_of_a_taken_over_training_run_lands_after_the_take_over_tensorboard_and_wandb_included(tmp_path):
    """The lease of 120 s is renewed every 30 s and Parquet flushes every 10 s: only a fence on every TensorBoard
    event and W&B row stops the old holder before it writes again."""
    run_dir, calls = tmp_path / "run", tmp_path / "wandb-calls"
    sinks = "train.sinks=[parquet,tensorboard,wandb]"
    sets = [i for o in [*TINY, "train.total_steps=100000000", "train.log_every=1", sinks] for i in ("--set", o)]
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAIN_WITH_FAKE_WANDB, str(calls), "train", "--local", "--run-dir", str(run_dir), *sets],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while (calls.read_text().count("log\n") if calls.exists() else 0) < 3 and trainer.poll() is None:
            assert time.monotonic() < deadline, "no W&B row after 180 s"
            time.sleep(0.05)
        lock = RunLock(LocalStorage(run_dir))
        assert "forced" in lock.acquire(force=True)  # a --break-lock ...
        taken = files(run_dir), scalar_events(run_dir / "tb"), calls.read_text().count("log\n")
        lock.release()  # ... that gave the run back (a sweep's start over)
        out, err = trainer.communicate(timeout=120)
        assert trainer.returncode == 1 and "was taken over" in err and "stops now" in err, out[-2000:] + err[-2000:]
        assert taken[1] > 0 and taken[2] >= 3
        assert (files(run_dir), scalar_events(run_dir / "tb"), calls.read_text().count("log\n")) == taken
        assert "finish" not in calls.read_text()  # W&B is not finished by a process that lost the run
    finally:
        trainer.kill()
        trainer.wait()


def test_what_a_writer_puts_in_a_writing_dir_lands_before_a_take_over_never_after(tmp_path):
    storage = LocalStorage(tmp_path / "run")
    holder = Holder(storage, lease=60.0)
    holder.acquire()
    other = RunLock(LocalStorage(tmp_path / "run"))
    taking = threading.Thread(target=other.acquire, kwargs={"force": True})
    with storage.writing_dir("resources") as folder:  # a task's resource export hook
        taking.start()
        taking.join(0.5)  # a take-over would be done by now: it waits for the writer
        (folder / "table.npy").write_bytes(b"written")
        written_after_take_over = other._version is not None
    taking.join(10)
    try:
        assert other._version is not None and not written_after_take_over
        with pytest.raises(LeaseLostError), storage.writing_dir("resources"):
            pass
        assert holder.lost
    finally:
        other.release()
        holder.release()


def test_a_restarted_trial_never_deletes_a_run_directory_a_live_process_holds(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.write("checkpoints/4/state.pt", b"weights")
    holder = RunLock(storage)
    holder.acquire()
    try:
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):
            start_over(storage)
        assert storage.exists("checkpoints/4/state.pt") and holder.holder()["token"] == holder.token
    finally:
        holder.release()
    start_over(storage)  # nobody holds it: the earlier attempt's files go
    assert storage.list("") == []


def test_a_pbt_exploit_never_changes_a_trial_directory_a_live_process_holds(tmp_path):
    from raysim.config import load_config

    donor = LocalStorage(tmp_path / "donor")
    Checkpoints(donor).save(7, {"weights": torch.ones(2)}, {})
    trial = LocalStorage(tmp_path / "trial")
    Checkpoints(trial).save(4, {"weights": torch.zeros(2)}, {})
    holder = RunLock(trial)  # the trial's earlier attempt still runs
    holder.acquire()
    try:
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}"):
            take_over(LocalStorage(tmp_path / "trial"), tmp_path / "donor/checkpoints/7", load_config("cartpole_ppo"))
        assert trial.list("checkpoints") == ["4"]  # its own checkpoint neither retired nor joined by the donor's
    finally:
        holder.release()
    point = take_over(LocalStorage(tmp_path / "trial"), tmp_path / "donor/checkpoints/7", load_config("cartpole_ppo"))
    assert point.checkpoint.name == "7" and not trial.exists("lock.json")


# -- S3 -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on localhost, serving one request at a time (S3's conditional writes are atomic; moto's
    threaded server checks the condition and writes in two steps); a bucket; the variables every client needs."""
    pytest.importorskip("moto", reason="moto[server] is in the test extra: pip install -e '.[test]'")
    boto3 = pytest.importorskip("boto3", reason="boto3 is in the test extra: pip install -e '.[test]'")
    with moto_server(one_at_a_time=True) as (_, env):
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            boto3.client("s3").create_bucket(Bucket="raysim-lock")
            yield env
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def elsewhere(**fields) -> bytes:
    return json.dumps({"host": "another-host", "pid": 1, "token": "elsewhere", "lease_seconds": 120, **fields}).encode()


@pytest.mark.slow
def test_on_s3_processes_racing_to_break_one_stale_lock_have_exactly_one_winner(s3):
    uri = "s3://raysim-lock/runs/race"

    def write_stale():
        open_storage(uri).write("lock.json", elsewhere(lease_seconds=1))
        time.sleep(2.5)  # its lease of 1 s has expired by the server's clock (whole seconds)

    race_to_break(uri, write_stale, s3, rounds=3)


def test_on_s3_a_lease_is_judged_by_the_servers_clock_not_the_holders(s3):
    storage = open_storage("s3://raysim-lock/runs/clock")
    storage.write("lock.json", elsewhere(renewed=0.0))  # the holder's clock is decades behind; renewed just now
    with pytest.raises(RunLockedError, match="in use by process 1 on host 'another-host'"):
        RunLock(storage).acquire()
    storage.write("lock.json", elsewhere(renewed=1e12, lease_seconds=1))  # the holder's clock is far ahead
    time.sleep(2.5)  # but the server last saw it renewed more than its lease ago
    lock = RunLock(storage)
    assert "lease expired" in lock.acquire()
    lock.release()
    assert not storage.exists("lock.json")


def test_on_s3_a_holder_whose_lock_was_taken_over_stops_with_a_clear_message(s3):
    take_over_a_live_holder("s3://raysim-lock/runs/holder", s3)


def test_on_s3_locking_without_boto3_says_which_extra_to_install(s3, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if not installed
    with pytest.raises(RunLockedError, match=r'pip install "raysim\[s3\]"'):
        RunLock(open_storage("s3://raysim-lock/runs/no-boto3"))


# -- a new run's directory: chosen and locked in one step -------------------------------------------------------


def claim_new_run(run_dir: str, default: bool) -> tuple[RunClaim, str | None]:
    """What ``Trainer.train`` does for a new run once Ray started: ``run_dir`` (``choose_run_dir``'s) locked."""
    claim = RunClaim(open_storage(run_dir), run_dir, break_lock=False)
    return claim, claim.create(default_run_dirs("demo", after=run_dir) if default else ())


def test_two_new_runs_that_chose_the_same_default_directory_get_one_each_and_never_touch_the_other(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    config = type("Config", (), {"run_dir": None, "name": "demo"})()
    chosen = [choose_run_dir(config)[0] for _ in range(3)]  # three `raysim train` started together: Ray starts next
    assert chosen == ["runs/demo"] * 3
    first, note = claim_new_run(chosen[0], default=True)
    assert note is None and first.run_dir == "runs/demo"
    first.storage.write("configs/train.yaml", b"first")
    second, note = claim_new_run(chosen[1], default=True)  # the first holds it: the next name, not a refusal
    assert (second.run_dir, note) == ("runs/demo-1", "runs/demo is taken: this run writes runs/demo-1")
    second.discard()  # the second fails before its first iteration: it removes its own directory only
    assert not Path("runs/demo-1").exists() and first.storage.read("configs/train.yaml") == b"first"
    first.release()  # the first ended; the third looks only now
    third, note = claim_new_run(chosen[2], default=True)
    assert third.run_dir == "runs/demo-1" and note == "runs/demo is taken: this run writes runs/demo-1"
    third.discard()
    assert sorted(os.listdir("runs/demo")) == ["configs"] and first.storage.read("configs/train.yaml") == b"first"


def test_a_train_whose_default_directory_was_locked_after_it_chose_it_trains_in_the_next_one(
    tmp_path, monkeypatch, capsys
):
    from raysim.config import load_config
    from raysim.coordinator import Trainer

    monkeypatch.chdir(tmp_path)
    tiny = ["backend=local", "train.total_steps=256", "eval.episodes=0", "env.num_envs=4", "train.sinks=[parquet]"]
    trainer = Trainer(load_config("cartpole_ppo", tiny))  # chooses runs/cartpole_ppo; Ray would start now
    first = RunLock(LocalStorage("runs/cartpole_ppo"))
    first.acquire()  # a `raysim train` started at the same time locked it meanwhile
    try:
        summary = trainer.train()
    finally:
        first.release()
    assert summary.run_dir == "runs/cartpole_ppo-1"
    assert "raysim: runs/cartpole_ppo is taken: this run writes runs/cartpole_ppo-1" in capsys.readouterr().out
    assert os.listdir("runs/cartpole_ppo") == [] and Checkpoints(LocalStorage("runs/cartpole_ppo-1")).complete()


def test_a_new_run_whose_given_directory_was_taken_meanwhile_is_refused_with_what_train_accepts(tmp_path):
    run_dir = str(tmp_path / "run")
    holder, _ = claim_new_run(run_dir, default=False)
    try:
        with pytest.raises(RunLockedError, match=f"in use by process {os.getpid()}") as refused:
            claim_new_run(run_dir, default=False)
        assert str(refused.value).endswith("choose another --run-dir") and "--break-lock" not in str(refused.value)
        holder.storage.write("configs/train.yaml", b"a run")
    finally:
        holder.release()
    with pytest.raises(ConfigError, match=f"run_dir {run_dir} holds a run: continue it with `raysim resume {run_dir}`"):
        claim_new_run(run_dir, default=False)  # it finished meanwhile: nothing is written into it
    assert os.listdir(run_dir) == ["configs"]


# -- the fence: a holder that lost its lock writes nothing more -------------------------------------------------


class Holder(RunLock):
    """A run lock whose loss is recorded where a process would stop (``os._exit``): threads of one test can hold it."""

    lost = False

    def _lost(self, observed) -> None:
        self.lost = True


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path) -> str:
    """A run directory on the local filesystem, or on moto's S3 server."""
    if request.param == "local":
        return str(tmp_path / "run")
    request.getfixturevalue("s3")
    return f"s3://raysim-lock/runs/{request.node.name.replace('[', '-').rstrip(']')}-{time.time_ns()}"


def test_a_holder_whose_lock_was_taken_over_and_given_back_sees_it_lost_and_never_brings_it_back(location):
    storage = open_storage(location)
    holder = Holder(storage, lease=60.0)  # renewed by hand below
    holder.acquire()
    other = RunLock(open_storage(location))
    assert "forced" in other.acquire(force=True)  # start_over, a discarded run, a --break-lock that failed early
    other.release()
    holder._renew_once()
    assert holder.lost and not storage.exists("lock.json")  # not written again with the old holder's token
    with pytest.raises(LeaseLostError):
        storage.write("progress", b"1")
    assert not storage.exists("progress")
    holder.release()
    assert not storage.exists("lock.json")


def test_a_renewal_in_flight_ends_before_release_deletes_the_lock(tmp_path):
    storage = LocalStorage(tmp_path)
    holder = Holder(storage, lease=60.0)
    holder.acquire()
    entered, go_on, replace = threading.Event(), threading.Event(), holder.file.replace

    def slow_replace(data, version):
        entered.set()
        go_on.wait(10)
        return replace(data, version)

    holder.file.replace = slow_replace
    renewal = threading.Thread(target=holder._renew_once)
    renewal.start()
    entered.wait(10)
    release = threading.Thread(target=holder.release)
    release.start()
    release.join(0.3)  # it waits for the renewal in flight (an older release deleted the lock now)
    go_on.set()
    renewal.join(10)
    release.join(10)
    assert not storage.exists("lock.json") and not holder.lost


def test_a_holder_taken_over_saves_no_checkpoint_flushes_no_record_and_prunes_nothing(location):
    """Item 12's probe in one process: A trains; B resumes with --break-lock and saves iteration 21; A's next
    save, metrics flush and pruning are refused before A's renewal comes, and B's checkpoint stays."""
    state = {"weights": torch.zeros(2)}
    mine = open_storage(location)
    holder = Holder(mine, lease=60.0)
    holder.acquire()
    Checkpoints(mine).save(20, state, {})
    append_metrics(mine, [{"iteration": 20.0}])
    theirs = open_storage(location)
    other = RunLock(theirs)
    other.acquire(force=True)
    try:
        Checkpoints(theirs).save(21, state, {})
        with pytest.raises(LeaseLostError):
            Checkpoints(mine).save(22, state, {})
        assert holder.lost
        with pytest.raises(LeaseLostError):
            append_metrics(mine, [{"iteration": 22.0}])
        with pytest.raises(LeaseLostError):
            Checkpoints(mine).prune(keep_last=1)
        assert [c.name for c in Checkpoints(theirs).list()] == ["20", "21"]
        assert len(metric_parts(theirs)) == 1 and theirs.list("checkpoints") == ["20", "21"]
        assert json.loads(theirs.read("lock.json"))["token"] == other.token
    finally:
        other.release()
        holder.release()


def race_for_the_run(location: str, seconds: float, lease: float, settle: float = 0.0, workers: int = 3) -> list[str]:
    """``workers`` threads, each in a loop: take the run's lock (forced at random), clear it at random, save
    checkpoints and flush metrics rows tagged with its tenure, then give the lock back or keep it renewing and
    start again. At the end of each tenure that still holds the run, every checkpoint or metrics part added or
    changed since it took the run over must be its own: returns what was written by a process that did not
    hold the run. On a local filesystem the check and the write are one step (a take-over waits for the write);
    on S3 they are two requests, so a write checked just before a take-over can land just after it: there a
    tenure looks at the run ``settle`` seconds after taking it over (less than a renewal interval, so a holder
    that went on writing until its next renewal is still seen)."""
    tenures, violations, held, deadline = itertools.count(1), [], [], time.monotonic() + seconds

    def files(storage) -> dict[str, str]:
        """Every checkpoint file and metrics part: ``{rel: digest}`` (staged and temporary files left out)."""
        found = {}
        for name in storage.list("checkpoints"):
            for file in storage.list(f"checkpoints/{name}") if not name.startswith(Staging.PREFIX) else []:
                found[f"checkpoints/{name}/{file}"] = ""
        for _, rel in metric_parts(storage):
            found[rel] = hashlib.sha256(storage.read(rel)).hexdigest()
        return found

    def writers(storage, rel: str) -> set[int]:
        if rel.startswith("checkpoints/"):
            return {int(rel.split("/")[1].split(".")[0]) // 1000}
        return {int(w) for w in read_table(storage, rel).column("writer").to_pylist()}

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            storage = open_storage(location)
            lock = Holder(storage, lease=lease)
            try:
                lock.acquire(force=rng.random() < 0.6)
            except RunLockedError:
                time.sleep(rng.uniform(0, lease / 4))
                continue
            me = next(tenures)
            time.sleep(settle)  # a write of the previous holder checked before the take-over lands meanwhile
            try:
                if rng.random() < 0.3:
                    lock.clear_run()
                before = files(storage)
                for n in range(rng.randint(1, 5)):
                    if lock.lost:
                        break
                    if rng.random() < 0.5:
                        Checkpoints(storage).save(me * 1000 + n, {"writer": torch.tensor(me)}, {"writer": me})
                    else:
                        append_metrics(storage, [{"writer": float(me), "n": float(n)}])
                    time.sleep(rng.uniform(0, 0.05))  # renewals (every lease / 4) come between some writes
                now = files(storage)
                ours = (lock.holder() or {}).get("token") == lock.token and not lock.lost  # held since it took over
                intruders = [r for r, digest in now.items() if before.get(r) != digest and writers(storage, r) - {me}]
                if ours and intruders:
                    violations.append(f"tenure {me} found {intruders} written by another")
            except (LeaseLostError, OSError, ValueError):  # lost meanwhile (a file vanished under a reader)
                pass
            if rng.random() < 0.5:
                lock.release()
            else:
                held.append(lock)  # still renewing: a later take-over and release must not bring it back

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for lock in held:
        lock.release()
    return violations


def test_holders_racing_to_take_over_release_and_renew_never_write_into_a_run_they_do_not_hold(location):
    on_s3 = location.startswith("s3://")  # S3 judges a lease in whole seconds by the server's clock
    assert race_for_the_run(location, seconds=2.5, lease=2.0 if on_s3 else 1.0, settle=0.1 if on_s3 else 0.0) == []
