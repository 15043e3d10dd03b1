"""``raysim bench rllib``: raysim's side of each row in-process at tiny budgets, what RLlib's side is given, the memory
of a run's process tree, the tables, and the page's tables against the recorded results. RLlib's side runs only where
its own environment is installed (``benchmarks/rllib/requirements.txt``): CI does not install it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.bench import rllib
from raysim.bench.peers import peer_module
from raysim.bench.results import read_results

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "results" / "rllib"
PAGE = ROOT / "docs" / "benchmarks" / "rllib.md"
TINY = ["--override", "eval.episodes=10", "--warmup", "1"]


def one(capsys, *argv: str) -> dict:
    """The JSON line of ``raysim bench rllib --one ...`` run in this process (backend local)."""
    assert rllib.main(["--one", *argv, "--override", "backend=local"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_raysim_run_reports_the_figures_rllibs_side_reports(capsys):
    line = one(capsys, "raysim", "--rows", "cartpole", "--seeds", "3", "--steps", "3072", *TINY)
    assert line["env"] == "raysim/CartPole" and line["env_steps"] == 3072 and line["iterations"] == 3
    assert line["steady_steps_per_s"] > 0 and line["train_seconds"] > 0 and line["startup_seconds"] >= 0
    assert line["solved"] is False and line["solve_env_steps"] is None  # 3k steps: no evaluation is due before the end
    assert line["eval_episodes"] == 10 and line["eval_mean"] > 0 and line["eval_successes"] is None
    assert [point[0] for point in line["curve"]] == [1024, 2048, 3072]
    peer = peer_module("rllib_ppo")
    args = peer.parse(["--task", "cartpole", "--steps", "3072"])
    run = {"iterations": [[1024, 0.5, 20.0]], "evals": [], "train_seconds": 0.5, "solved": None}
    theirs = peer.result_line(args, peer.settings(args), 1.0, run)
    assert set(theirs) - {"event", "task", "seed", "steps", "config", "aligned"} == set(line) - {"event"}


def test_the_gymnasium_side_of_the_cartpole_row_trains_gymnasiums_cartpole_through_the_adapter(capsys):
    line = one(capsys, "raysim-gym", "--rows", "cartpole", "--steps", "1024", *TINY)
    assert line["env"] == "gym:CartPole-v1" and line["env_steps"] == 1024


def test_rllib_is_given_raysims_values_for_the_aligned_keys_and_raysims_placement():
    args = rllib.parse(["--rows", "cartpole", "scale", "--rllib-python", "python"])
    runs = {(run.row, run.shards): (row, run) for row, run in rllib.planned(args) if run.peer == rllib.RLLIB}
    peer = peer_module("rllib_ppo")
    command = rllib.rllib_command(*runs[("cartpole", 0)], args)
    chosen = peer.settings(peer.parse(command[2:]))
    given = dict(zip(command[2::2], command[3::2], strict=False))  # --option value, up to the alignment flags
    assert given["--env-runners"] == "1" and given["--cpus-per-runner"] == "1.0"  # raysim's placement
    assert given["--solve"] == "475.0" and given["--eval-every"] == "10000" and given["--eval-episodes"] == "100"
    assert chosen["num_envs_per_env_runner"] == 8 and chosen["rollout_fragment_length"] == 128  # cartpole_ppo's
    assert chosen["train_batch_size_per_learner"] == 1024 and chosen["minibatch_size"] == 256
    assert chosen["num_epochs"] == 10 and chosen["lr"] == [[0, 2.5e-3], [40_000, 0.0]]
    assert chosen["model"]["fcnet_hiddens"] == [64, 64] and chosen["model"]["vf_share_layers"] is False
    assert chosen["training"] == {"vf_loss_coeff": 0.01}  # the rest is RLlib's example's
    scale = peer.settings(peer.parse(rllib.rllib_command(*runs[("scale", 4)], args)[2:]))
    assert scale["num_envs_per_env_runner"] == 1024 and scale["train_batch_size_per_learner"] == 4 * 1024 * 32
    tuned = rllib.parse(["--rows", "cartpole", "--rllib-settings", "tuned", "--rllib-python", "python"])
    row, run = next((row, run) for row, run in rllib.planned(tuned) if run.peer == rllib.RLLIB)
    example = peer.settings(peer.parse(rllib.rllib_command(row, run, tuned)[2:]))
    assert example["model"]["fcnet_hiddens"] == [32] and example["lr"] == 3e-4 and example["aligned"] == {}


def test_the_sides_take_turns_first_from_seed_to_seed():
    args = rllib.parse(["--rows", "cartpole", "--seeds", "1", "2", "3"])
    order = [(run.seed, run.peer) for _, run in rllib.planned(args)]
    assert [seed for seed, _ in order] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [order[i][1] for i in (0, 3, 6)] == ["rllib", "raysim", "raysim-gym"]  # who goes first, seed by seed


def test_a_row_appends_each_run_as_it_ends_and_the_next_invocation_runs_only_what_is_missing(tmp_path, capsys):
    argv = ["--rows", "cartpole", "--peers", "raysim", "raysim-gym", "--seeds", "1", "--steps", "1024", "--local"]
    argv += [*TINY, "--out", str(tmp_path)]
    assert rllib.main(argv) == 0
    lines = read_results(tmp_path / "results.jsonl")
    assert [(line["peer"], line["seed"]) for line in lines] == [("raysim", 1), ("raysim-gym", 1)]
    assert all(line["load_start"] is not None and line["host"] and line["memory"] is None for line in lines)
    out = capsys.readouterr().out
    assert out.startswith("**CartPole-v1: time to solve**") and (tmp_path / "rllib.md").read_text() == out
    assert "| raysim (eval.episodes=10, backend=local) | raysim/CartPole | 1 | 0/1 |" in out
    assert rllib.main(argv) == 0 and len(read_results(tmp_path / "results.jsonl")) == 2  # done: skipped


def test_a_missing_rllib_python_is_named_in_one_line(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "python"
    assert rllib.main(["--rows", "cartpole", "--rllib-python", str(missing), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no Python at {missing}" in err[0] and "benchmarks/rllib/requirements.txt" in err[0]


def test_memory_sums_the_pss_of_a_process_and_every_process_under_it():
    child = "import time; block = b'x' * (64 * 2**20); time.sleep(2)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    process = subprocess.Popen([sys.executable, "-c", parent])
    with rllib.MemorySampler(process.pid, 0.2) as memory:
        process.wait()
    summary = memory.summary()
    assert summary["processes_peak"] == 2 and summary["pss_peak_mib"] >= 64 and summary["uss_peak_mib"] >= 64


def test_a_stopped_bench_stops_the_run_under_way_with_it():
    def stop(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            rllib.run_process([sys.executable, "-c", "import time; time.sleep(30)"], 0.2)
    finally:
        signal.signal(signal.SIGALRM, previous)
    left = [p for p in rllib.vendored_psutil().Process().children() if "time.sleep(30)" in " ".join(p.cmdline())]
    assert not left


def result(row: str, peer: str, seed: int, **figures) -> dict:
    """A results line as ``record`` writes it, with the figures given."""
    line = {"row": row, "peer": peer, "seed": seed, "steps": 40_000, "shards": 0, "env": "CartPole-v1"}
    line.update(settings=["aligned"] if peer == "rllib" else [], host="vm", cpus=2, load_start=[1.0, 1.0, 1.0])
    line.update(started=f"2026-12-07T0{seed}:00:00+00:00", finished=f"2026-12-07T0{seed}:30:00+00:00")
    line.update(versions={"ray": "2.60.0", "torch": "2.13.0", "gymnasium": "1.2.2" if peer == "rllib" else "1.4.0"})
    line.update(startup_seconds=5.0, train_seconds=10.0, eval_mean=500.0, training_return=None, eval_successes=None)
    return {**line, **figures}


def test_the_table_gives_raysim_over_rllib_against_the_issues_targets():
    lines = [
        result(
            "cartpole",
            "rllib",
            s,
            steady_steps_per_s=1000.0,
            solved=True,
            solve_env_steps=40_960,
            solve_seconds=20.0,
            memory={"pss_peak_mib": 2000.0},
        )
        for s in (1, 2)
    ]
    lines += [
        result(
            "cartpole",
            "raysim",
            s,
            steady_steps_per_s=2000.0,
            solved=s == 1,
            solve_env_steps=10_240 if s == 1 else None,
            solve_seconds=5.0 if s == 1 else None,
            memory={"pss_peak_mib": 2200.0},
        )
        for s in (1, 2)
    ]
    text = rllib.table(lines)
    assert "2026-12-07T01:00:00+00:00 to 2026-12-07T02:30:00+00:00 UTC, vm (2 cores), load 1.00-1.00" in text
    assert "RLlib: ray 2.60.0, torch 2.13.0, gymnasium 1.2.2; raysim: ray 2.60.0, torch 2.13.0, gymnasium 1.4.0" in text
    assert "| RLlib (aligned) | CartPole-v1 | 1,2 | 2/2 | 40,960 / 40,960 | 40,960 | 20.00 |" in text
    assert "| raysim | CartPole-v1 | 1,2 | 1/2 | 10,240 / - | not solved | not solved |" in text
    comparison = text.strip().splitlines()[-1]
    assert comparison.startswith("- raysim / RLlib (aligned): steady env steps/s 2.00x (target >= 1.5x: met)")
    assert "memory (summed PSS peak) 1.10x (target <= 1x: NOT met)" in comparison
    assert "to solve" not in comparison  # raysim's median seed did not solve: no ratio


def test_the_hopper_table_gives_the_difference_of_the_final_evaluations_with_welchs_interval():
    lines = [result("hopper", "rllib", s, eval_mean=1000.0 + 100 * s, steady_steps_per_s=400.0) for s in (1, 2, 3)]
    lines += [result("hopper", "raysim", s, eval_mean=3000.0 + 100 * s, steady_steps_per_s=1000.0) for s in (1, 2, 3)]
    comparison = rllib.table([{**line, "memory": None} for line in lines]).strip().splitlines()[-1]
    assert "steady env steps/s 2.50x (target >= 1.5x: met)" in comparison and "memory" not in comparison
    assert "final evaluation difference +2,000.0 (Welch 95% " in comparison and "above: met)" in comparison


def test_the_pages_tables_are_the_ones_the_recorded_results_give():
    lines = read_results(RECORDED / "results.jsonl")
    page = PAGE.read_text()
    if not lines:  # not measured yet: the page says where its tables will come from
        assert "TO BE FILLED" in page
        return
    text = rllib.table(lines)
    assert (RECORDED / "rllib.md").read_text() == text, "run raysim bench rllib --table again"
    assert text.strip() in page, f"copy {RECORDED / 'rllib.md'} into {PAGE} again"


def rllib_python() -> Path:
    return Path(os.environ.get("RAYSIM_RLLIB_PYTHON", ROOT / rllib.RLLIB_PYTHON))


@pytest.mark.slow
@pytest.mark.skipif(
    rllib.rllib_problem(rllib_python()) is not None,
    reason="RLlib's own environment (benchmarks/rllib/requirements.txt, $RAYSIM_RLLIB_PYTHON) is not installed "
    "here: CI does not install it",
)
def test_rllibs_side_runs_in_its_own_python_and_its_memory_counts_rays_processes(tmp_path, capsys):
    argv = ["--rows", "cartpole", "--peers", "rllib", "--seeds", "1", "--steps", "2048", "--warmup", "1"]
    assert rllib.main([*argv, "--rllib-python", str(rllib_python()), "--out", str(tmp_path)]) == 0
    (line,) = read_results(tmp_path / "results.jsonl")
    assert line["env_steps"] >= 2048 and line["steady_steps_per_s"] > 0 and line["eval_episodes"] == 100
    assert line["versions"]["gymnasium"] == "1.2.2" and line["settings"] == ["aligned"]
    assert line["memory"]["processes_peak"] > 3 and line["memory"]["pss_peak_mib"] > 100


@pytest.mark.slow
@pytest.mark.skipif(rllib.rllib_problem(rllib_python()) is not None, reason="RLlib's own environment is not installed")
def test_the_peers_profile_runs_rllibs_roles_in_its_process_and_prints_where_the_time_goes_not_a_result():
    command = [str(rllib_python()), str(rllib.PEER_SCRIPT), "--task", "cartpole", "--steps", "1024"]
    result = subprocess.run([*command, "--eval-episodes", "0", "--profile", "20"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ordered by: cumulative time" in result.stderr and "single_agent_env_runner.py" in result.stderr
    assert "learner.py" in result.stderr  # the learner's update ran in this process too
    events = [json.loads(line)["event"] for line in result.stdout.splitlines()]
    assert "iteration" in events and "result" not in events
