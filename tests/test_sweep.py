"""Sweeps with Ray Tune: bad input refused up front, ASHA stopping trials early and resuming after its driver
was killed, PBT cloning one trial's raysim checkpoint into another with the mutated learning rate."""

from __future__ import annotations

import glob
import json
import re
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from raysim.cli import main
from raysim.composition import ConfigError
from raysim.config import load_config, to_dict
from raysim.coordinator.cluster import ResourceError
from raysim.storage import RunLock, open_storage
from raysim.sweep.fit import extreme_trials, largest, refuse_unfittable
from raysim.sweep.sweep import Sweep, check_sweep, checkpoints_kept, planned_reports, scheduler_of, trainable_of
from raysim.sweep.trial import wait_for_handover
from tests.support.ray_head import RayHead

pytest.importorskip("ray.tune")

RAYSIM = str(Path(sys.executable).parent / "raysim")
TINY = [  # CartPole PPO: 4 iterations of 1,024 steps, a report each, trials of 1 CPU (2 at once on 2 CPUs)
    # (no eval.max_steps: an evaluation cut before any episode ends reports NaN, which ASHA cannot rank)
    "--set=train.total_steps=4096",
    "--set=train.log_every=1",
    "--set=shards.num_cpus=0.3",
    "--set=learner.num_cpus=0.3",
    "--set=eval.episodes=5",
]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--param", "algo.lrr=uniform:1e-4:1e-3"], "unknown key 'algo.lrr'; did you mean 'algo.lr'?"),
        (["--param", "algo.lr=gaussian:0:1"], "unknown distribution 'gaussian'"),
        (["--param", "algo.lr=loguniform:0:1e-3"], "loguniform needs LOW > 0"),
        (["--param", "algo.lr=uniform:-1:1e-3"], "algo.lr"),
        (["--param", "algo.update_epochs=randint:1.5:4"], "randint takes two integers"),
        (["--param", "algo.ent_coef=choice:"], "choice needs at least one value"),
        (["--param", "algo.lr"], "expected KEY=KIND:ARGS"),
        (["--param", "model.hidden_sizes=grid:[32],[64]", "--scheduler", "pbt"], "cannot search model.hidden_sizes"),
        ([], "give at least one --param"),
        (["--param", "shards.num_cpus=choice:0.5,1", "--scheduler", "pbt"], "cannot search shards.num_cpus: it"),
        (["--param", "learner.ranks=choice:1,2", "--set", "shards.count=2", "--scheduler", "pbt"], "learner.ranks"),
        (["--param", "shards.max=choice:2,4"], "shards.max (elastic shards) cannot be used in a sweep"),
        (["--param", "algo.lr=choice:1e-3", "--set", "shards.max=2"], "shards.max (elastic shards) cannot be used"),
        (
            ["--set", "shards.count=2", "--param", "shards.count=grid:2,3", "--param", "learner.ranks=grid:1,2"],
            "the trial with shards.count=3, learner.ranks=2: learner.ranks must be >= 1 and divide shards.count (3)",
        ),
    ],
)
def test_bad_sweeps_are_refused_in_one_line_before_anything_starts(args, says, tmp_path, capsys):
    code = main(["tune", *args, "--dir", str(tmp_path / "sweep")])
    err = capsys.readouterr().err
    assert code == 2
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "sweep").exists()


def test_resume_of_a_folder_that_holds_no_sweep_names_it(tmp_path, capsys):
    assert main(["tune", "--resume", str(tmp_path)]) == 2
    assert f"{tmp_path} is not a sweep's experiment directory (no sweep.yaml)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, says",
    [
        (["--param", "algo.lr=choice:1e-3", "--set", "shards.num_cpus=3"], "one trial needs"),
        (["--param", "shards.count=grid:1,4"], "the trial with shards.count=4 needs"),  # the base config fits
    ],
)
def test_a_trial_larger_than_the_cluster_is_refused_before_any_trial_starts(args, says, ray_session, tmp_path, capsys):
    code = main(["tune", *args, "--dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "the cluster has" in err
    assert not (tmp_path / "s" / "sweep.yaml").exists()


class FourCPUs:
    """What the fit check reads of Ray: one node of 4 CPUs, no autoscaler."""

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": 4.0}}]

    def cluster_resources(self):
        return {"CPU": 4.0}


def sweep_of(*params: str, sets: tuple[str, ...] = (), scheduler: str = "fifo") -> Sweep:
    base = to_dict(load_config(None, ["shards.num_cpus=1", "learner.num_cpus=1", *sets]))
    return Sweep(base, dict(p.split("=", 1) for p in params), "/nowhere", scheduler=scheduler)


def test_each_trial_asks_for_a_placement_group_sized_from_its_own_config():
    trainable = trainable_of(sweep_of("shards.count=grid:1,3", "learner.num_cpus=choice:1,2"))
    for count, learner in ((1, 1), (3, 2)):
        group = trainable.default_resource_request({"shards.count": count, "learner.num_cpus": learner})
        coordinator, *shards, evaluation, rank = group.bundles  # eval_return: an evaluation shard
        assert coordinator == {"CPU": 0.1} and shards == [{"CPU": 1.0}] * count
        assert evaluation == {"CPU": 1.0} and rank == {"CPU": float(learner)}


@pytest.mark.parametrize(
    "params, says",
    [
        (["shards.count=grid:1,8"], "the trial with shards.count=8 needs 10.1 CPU and the cluster has 4 CPU"),
        (["shards.count=randint:1:3", "eval.shards=choice:1,2"], "with shards.count=1, eval.shards=2 needs 4.1 CPU"),
        (["shards.num_cpus=uniform:0.5:5"], "one of the shards asks for 5 CPU and no node of this cluster has"),
        (["algo.lr=uniform:1e-4:1e-3", "learner.num_cpus=loguniform:1:8"], "one of the learner ranks asks for 8 CPU"),
    ],
)
def test_a_search_space_with_a_trial_that_can_never_fit_is_refused_naming_that_trial(params, says):
    sweep = sweep_of(*params)
    check_sweep(sweep)  # a valid search space
    with pytest.raises(ResourceError, match=re.escape(says)):
        refuse_unfittable(extreme_trials(sweep.base, sweep.parsed, sweep.metric), FourCPUs())


def test_a_search_space_whose_every_trial_fits_is_accepted_and_sizes_an_embedded_ray_for_its_largest_trial():
    params = ("shards.count=grid:1,2", "learner.num_cpus=uniform:0.5:1", "algo.lr=loguniform:1e-4:1e-3")
    sweep = sweep_of(*params, sets=("shards.num_cpus=0.5",))
    trials = extreme_trials(sweep.base, sweep.parsed, sweep.metric)
    assert [values for values, _ in trials] == [  # algo.lr does not change what a trial asks for
        {"shards.count": count, "learner.num_cpus": cpus} for count in (1, 2) for cpus in (0.5, 1)
    ]
    refuse_unfittable(trials, FourCPUs())
    assert largest(trials).shards.count == 2 and largest(trials).learner.num_cpus == 1


def test_a_value_valid_only_beside_another_params_values_is_accepted_and_each_combination_checked():
    sweep = sweep_of("learner.ranks=grid:1,2", "shards.count=grid:2,4")  # ranks 2 alone: the base has 1 shard
    check_sweep(sweep)
    trials = extreme_trials(sweep.base, sweep.parsed, sweep.metric)
    assert sorted((c.learner.ranks, c.shards.count) for _, c in trials) == [(1, 2), (1, 4), (2, 2), (2, 4)]
    with pytest.raises(ConfigError, match="learner.ranks"):  # no combination makes 3 ranks divide 2 or 4 shards
        check_sweep(sweep_of("learner.ranks=grid:1,3", "shards.count=grid:2,4"))


def test_every_value_of_a_finite_parameter_is_checked_and_the_failing_ones_named_in_one_line():
    """A randint's bounds (2 and 8) divide by 2 learner ranks; 3, 5 and 7 do not, and would fail as trials."""
    says = "--param shards.count=randint:2:9: shards.count=3, 5, 7 makes invalid trials: learner.ranks must be >= 1"
    with pytest.raises(ConfigError, match=re.escape(says)):
        check_sweep(sweep_of("shards.count=randint:2:9", sets=("learner.ranks=2", "shards.count=2")))
    with pytest.raises(ConfigError, match=re.escape("shards.count=3 makes invalid trials, e.g. the trial with")):
        check_sweep(sweep_of("shards.count=choice:2,3,4", "learner.ranks=choice:1,2"))  # (3, 2) can be drawn
    check_sweep(sweep_of("shards.count=choice:2,4", "learner.ranks=randint:1:3"))  # every pair is valid


def test_tune_keeps_a_bounded_number_of_each_trials_checkpoints_with_pbt_enough_for_a_clone():
    assert checkpoints_kept(sweep_of("algo.lr=choice:1e-3", scheduler="asha")) == 2
    pbt = sweep_of("algo.lr=loguniform:1e-4:1e-3", scheduler="pbt")
    pbt.perturbation_interval = 3
    assert checkpoints_kept(pbt) == 8  # a donor's saved checkpoint, then up to 3 reports and a save before the next


def test_asha_lets_the_trial_with_the_most_reports_run_to_its_end():
    sweep = sweep_of("shards.count=grid:1,2", sets=("shards.count=2",), scheduler="asha")  # 1 shard: 2x the reports
    trials = extreme_trials(sweep.base, sweep.parsed, sweep.metric)
    reports = {values["shards.count"]: planned_reports(config) for values, config in trials}
    assert reports[1] > reports[2] and scheduler_of(sweep, trials)._max_t == reports[1]


def test_a_checkpoint_handed_to_tune_is_self_contained_and_verified_when_handed_back(tmp_path):
    import torch

    from raysim.checkpoint import CheckpointError, Checkpoints, copy_files, load_directory
    from raysim.storage import open_storage

    storage = open_storage(str(tmp_path / "run"))
    saved = Checkpoints(storage).save(3, {"weights": torch.arange(4.0)}, {"iteration": 3})
    handed = copy_files(storage, saved, tmp_path / "tune" / "checkpoint_000001")  # no run directory around it
    state, meta = load_directory(handed)
    assert torch.equal(state["weights"], torch.arange(4.0)) and meta["iteration"] == 3
    (handed / "state.pt").write_bytes((handed / "state.pt").read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="checkpoint_000001/state.pt is damaged"):
        load_directory(handed)


def test_a_trials_run_waits_at_each_report_until_tune_takes_the_next_and_stops_there_once_tune_stops_it():
    from raysim.sweep.trainable import Handoff, Report

    handoff, stopped_at = Handoff(), []

    def run() -> None:  # the run's thread: a report per log step
        for iteration in range(1, 6):
            if handoff.offer(Report({"iteration": iteration}, None)):
                stopped_at.append(iteration)
                break
        handoff.end()

    thread = threading.Thread(target=run)
    thread.start()
    assert handoff.take().metrics == {"iteration": 1}
    time.sleep(0.3)
    assert handoff.reports.empty()  # the run waits: its checkpoint stays in place while Tune saves it
    assert handoff.take().metrics == {"iteration": 2}
    handoff.stop()  # Tune stops the trial while the run waits at its report of iteration 2
    thread.join(10)
    assert stopped_at == [2] and handoff.take() is None


def test_a_trial_run_whose_reporter_asks_it_to_stop_ends_after_that_iteration_saved_and_closed(tmp_path):
    from raysim.sweep.trial import TrialRun

    sets = ["backend=local", "env.num_envs=4", "algo.num_steps=32", "algo.num_minibatches=2", "algo.update_epochs=1"]
    base = to_dict(load_config(None, [*sets, "train.total_steps=1024", "train.log_every=1", "eval.episodes=0"]))
    reports = []

    def reporter(record: dict, checkpoint) -> bool:
        reports.append((record["iteration"], checkpoint.iteration))
        return len(reports) == 2  # Tune stopped the trial: the run ends here

    run = TrialRun({"algo.lr": 1e-3}, "t_00000", base=base, experiment=str(tmp_path), metric="episode_return")
    summary = run.train(reporter)
    assert summary.stopped_by == "reporter" and summary.iterations == 2 and reports == [(1, 1), (2, 2)]
    run_dir = tmp_path / "trials" / "t_00000"
    assert summary.checkpoint.iteration == 2 and not (run_dir / "lock.json").exists()  # closed: the lock given back
    assert len(list((run_dir / "metrics").glob("part-*.parquet"))) == 1  # its metrics merged


@pytest.mark.parametrize("trial_id", ["", "../../elsewhere", "a/b"])  # ../../elsewhere: tmp_path/elsewhere
def test_a_trial_run_only_ever_opens_one_folder_under_the_experiments_trials(tmp_path, trial_id):
    from raysim.sweep.trial import TrialRun

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_text("a file outside the trials folder")
    base = to_dict(load_config(None, ["backend=local"]))
    with pytest.raises(ValueError, match="a trial id names one folder under trials/"):
        TrialRun({}, trial_id, base=base, experiment=str(tmp_path / "experiment"), metric="episode_return")
    assert (tmp_path / "elsewhere" / "keep").exists() and not (tmp_path / "experiment").exists()


def trial_states(experiment: Path) -> dict[str, dict]:
    """Tune's experiment state: trial id -> its status and last result (as the driver last saved it)."""
    files = sorted(glob.glob(str(experiment / "experiment_state-*.json")))
    if not files:
        return {}
    try:
        data = json.loads(Path(files[-1]).read_text())
    except ValueError:  # being written
        return {}
    states = {}
    for trial, runtime in data["trial_data"]:
        trial = json.loads(trial)
        runtime = json.loads(runtime) if isinstance(runtime, str) else runtime
        states[trial["trial_id"]] = {"status": trial["status"], "last": runtime.get("last_result") or {}}
    return states


def files_of(run_dir: Path) -> dict[str, int]:
    """Every file of a run directory with its modification time (what a rerun would change)."""
    return {str(p.relative_to(run_dir)): p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}


def metrics_rows(run_dir: Path) -> list[dict]:
    parts = sorted((run_dir / "metrics").glob("part-*.parquet"))
    return [row for part in parts for row in pq.read_table(part).to_pylist()]


@pytest.fixture(scope="module")
def head():
    with RayHead(num_cpus=2, grace=0.5) as started:  # thrown away: its GCS and raylet need not end gracefully
        yield started


@pytest.mark.slow
def test_asha_sweep_stops_trials_early_and_resumes_after_its_driver_is_killed(head, tmp_path):
    experiment = tmp_path / "asha"
    # two learning trials run to the end; then a third that barely learns (lr 1e-6) is stopped at the first rung
    # while a fourth still runs. Tune does not save ASHA's rungs with the experiment: the kill waits for that stop.
    # The learning trials are the same run (the same seed: the same results), so whatever order they report in, no
    # rung's cutoff (a median of those results and the third's) is above theirs: only the third stops early, and
    # the fourth still has three iterations to go when it does (a grid of 3e-3,8e-3,1e-6,5e-3 stopped its 5e-3 at the
    # first rung too, 122 against 261 and 153: the kill then raced the two stops).
    command = [RAYSIM, "tune", "--param", "algo.lr=grid:3e-3,3e-3,1e-6,3e-3", "--scheduler", "asha"]
    command += ["--grace-period", "1", "--reduction-factor", "2", "--max-concurrent", "2", *TINY]
    command += ["--set=backend=local"]  # the roles in the trial actor: one process to start per trial
    command += ["--dir", str(experiment), "--address", head.address]
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(command, env=head.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None:
            states = trial_states(experiment)
            finished = [t for t, s in states.items() if s["status"] == "TERMINATED"]
            stopped_early = [t for t in finished if states[t]["last"].get("iteration", 4) < 4]
            if stopped_early and len(finished) < 4:
                break
            time.sleep(0.2)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert 1 <= len(finished) < 4, (tmp_path / "driver.log").read_text()[-3000:]
    for trial in finished:  # a trial Tune stopped may still be closing its run when the driver dies
        wait_for_handover(RunLock(open_storage(experiment / "trials" / trial)), timeout=60)
    before = {t: files_of(experiment / "trials" / t) for t in finished}
    # what a kill during Tune's copy of its state into the experiment directory leaves (seen under load): the
    # resume puts back Ray's staging copy, where Tune alone would run another experiment (tests/test_tune_state.py)
    searcher = max(experiment.glob("basic-variant-state-*.json"))
    searcher.write_bytes(b"")

    done = subprocess.run(
        [RAYSIM, "tune", "--resume", str(experiment), "--address", head.address],
        env=head.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"raysim: {searcher} was cut short by the driver's end: Ray's staging copy put back" in done.stdout
    states = trial_states(experiment)
    assert len(states) == 4 and all(s["status"] == "TERMINATED" for s in states.values())
    for trial in finished:  # not run again: not a file of their run directories changed
        assert files_of(experiment / "trials" / trial) == before[trial]
    for trial in set(states) - set(finished):  # ended under the resumed driver: each run closed before its actor
        files = files_of(experiment / "trials" / trial)
        assert "lock.json" not in files and sum(f.startswith("metrics/") for f in files) == 1, sorted(files)
    iterations = {t: s["last"]["iteration"] for t, s in states.items()}
    assert min(iterations.values()) < 4 <= max(iterations.values()), iterations  # ASHA stopped one early
    assert "best config:" in done.stdout

    best = experiment / "best.yaml"
    run = tmp_path / "best-run"
    assert main(["train", str(best), "--local", "--set", "train.total_steps=1024", "--run-dir", str(run)]) == 0
    assert (run / "configs" / "train.yaml").exists()


@pytest.mark.slow
def test_pbt_exploit_restores_the_donors_checkpoint_with_the_mutated_learning_rate(head, tmp_path):
    experiment = tmp_path / "pbt"
    command = [RAYSIM, "tune", "--param", "algo.lr=choice:1e-4,3e-3", "--samples", "2", "--scheduler", "pbt"]
    command += ["--perturbation-interval", "2", "--quantile-fraction", "0.5", "--synch", *TINY]
    command += ["--set=algo.lr_schedule=constant"]
    command += ["--set=backend=local"]  # the roles in the trial actor: quick restarts
    command += ["--dir", str(experiment), "--address", head.address]
    done = subprocess.run(command, env=head.env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    exploits = [json.loads(line) for line in (experiment / "pbt_global.txt").read_text().splitlines()]
    # one perturbation, at result 2: a trial's results are its iterations (the 4th, its last, is the final result,
    # which PBT does not perturb), and each result's checkpoint is of its own iteration. PBT logs each trial's
    # last result, which Tune updates after the scheduler ran: the trial whose result came last logs the one before
    assert len(exploits) == 1 and sorted(exploits[0][2:4]) in ([1, 2], [2, 2]), exploits
    prefix = next(iter(trial_states(experiment))).split("_")[0]
    target, donor, _, _, _, new_config = exploits[0]
    receiver, donor = (experiment / "trials" / f"{prefix}_{int(t.split('_')[0]):05d}" for t in (target, donor))
    state = "checkpoints/2/state.pt"
    assert (receiver / state).read_bytes() == (donor / state).read_bytes()  # the donor's checkpoint, taken over
    rows = metrics_rows(receiver)
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4]  # continued from the checkpoint, to the end
    assert [row["lr"] for row in rows[2:]] == pytest.approx([new_config["algo.lr"]] * 2)  # the mutation wins
    assert "resuming" in done.stdout + done.stderr


def test_synchronous_pbt_pausing_a_saving_trial_leaves_no_stop_to_end_it_later(monkeypatch):
    """ray-project/ray#57906, run through Tune's own pause and stop on a stand-in controller: the exploited trial,
    paused without a checkpoint while its own pause's save is in flight, is PAUSED with no STOP cached for its
    next save (which, in the PBT test under load, ended the trial after its first result from the donor's state)."""
    from types import SimpleNamespace

    from ray.tune.execution.tune_controller import TuneController

    from raysim.sweep.pause_fix import keep_paused_trials_alive

    monkeypatch.setattr(TuneController, "_schedule_trial_pause", TuneController._schedule_trial_pause)
    keep_paused_trials_alive()

    class SavingTrial:  # what Tune's pause and stop read of a trial
        trial_id, status, is_saving = "t1", "RUNNING", True
        temporary_state = SimpleNamespace(saving_to="a save in flight", restoring_from=None)

        def set_location(self, location) -> None:
            pass

    trial = SavingTrial()
    controller = SimpleNamespace(
        _trial_to_actor={trial: "actor"},
        _cached_trial_decisions={},
        _set_trial_status=lambda t, status: setattr(t, "status", status),
        _actor_manager=SimpleNamespace(clear_actor_task_futures=lambda tracked_actor: None),
        _mark_trial_to_checkpoint=lambda t: None,
        _maybe_cache_trial_actor=lambda t: True,
    )
    controller._schedule_trial_stop = partial(TuneController._schedule_trial_stop, controller)
    TuneController._schedule_trial_pause(controller, trial, should_checkpoint=False)
    assert trial.status == "PAUSED" and controller._cached_trial_decisions == {}


@pytest.mark.slow
def test_a_trial_whose_param_sets_shards_count_gets_a_placement_group_of_its_own_size_and_runs(head, tmp_path):
    experiment = tmp_path / "shards"
    command = [RAYSIM, "tune", "--param", "shards.count=grid:2", *TINY, "--set=resources_timeout=60"]
    command += ["--set=train.total_steps=2048"]  # one iteration of the 2 shards: the trial's roles start and run
    command += ["--max-failures", "0", "--dir", str(experiment), "--address", head.address]
    done = subprocess.run(command, env=head.env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ((trial, state),) = trial_states(experiment).items()
    assert state["status"] == "TERMINATED"
    rows = metrics_rows(experiment / "trials" / trial)  # 2 shards of 8 rows x 128 steps in its iteration
    assert [row["env_steps"] for row in rows] == [2048]
