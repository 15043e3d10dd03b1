"""``raysim bench mujoco --table``: the docs page of results.jsonl, and what a results line records."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest

from raysim.bench import distill, mujoco
from raysim.bench.results import read_results, run_key, run_name, run_settings
from raysim.bench.results_page import provenance
from raysim.bench.welch import t_cdf, t_quantile, welch
from raysim.config import load_config

WHEN = {"host": "box", "cpus": 2, "started": "2026-12-01T10:00:00+00:00"}


def line(config: str, env: str, seed: int, training: float, **fields) -> dict:
    """A results line as ``run_one`` writes it, with its curve name (the curve itself is written by ``curve``)."""
    settings = fields.pop("overrides", [])
    name = run_name("raysim", config, seed, 1_000_000, tuple(settings))
    return {
        "peer": "raysim", "config": config, "env": env, "seed": seed, "steps": 1_000_000, "overrides": settings,
        "env_steps": 1_000_000, "train_seconds": 300.0 + seed, "layout": "-", "training_return": training,
        "eval_mean": training + 100.0, "eval_std": 5.0, "eval_episodes": 20, "eval_successes": None,
        "eval_success_lower": None, "curve": f"curves/{name}.csv", "mujoco": "3.3.0", **fields,
    }  # fmt: skip


def curve(out: Path, row: dict, end: float) -> None:
    """A tiny training curve rising to ``end``."""
    path = out / row["curve"]
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = "".join(f"{step},{end * step / 4000:.1f},2\n" for step in (1000, 2000, 3000, 4000))
    path.write_text("env_steps,episode_return,episodes\n" + rows)


@pytest.fixture
def results(tmp_path) -> Path:
    """Hopper overlapped (2,000 / 2,400 / 2,800), run when the config was packaged so, and lockstep (2,600 /
    3,000 / 3,400, as packaged now) over three seeds, Reach with successes over two, and one HalfCheetah line
    as written before lines recorded overrides."""
    out = tmp_path / "bench"
    rows = []
    for seed, (ours, lockstep) in enumerate(((2000.0, 2600.0), (2400.0, 3000.0), (2800.0, 3400.0)), start=1):
        load = {"load_start": [0.5 * seed, 1.0, 1.0], "load_end": [1.0 + seed, 1.0, 1.0]}
        finished = {"finished": f"2026-12-0{seed}T11:00:00+00:00"}
        rows.append(line("hopper_ppo", "Hopper-v5", seed, ours, max_policy_lag=1, **WHEN, **load, **finished))
        rows.append(
            line("hopper_ppo", "Hopper-v5", seed, lockstep, overrides=["algo.max_policy_lag=0"], max_policy_lag=0,
                 **WHEN, **load, **finished)
        )  # fmt: skip
    for seed, k in ((1, 394), (2, 398)):
        rows.append(
            line("reach_ppo", "raysim/Reach", seed, -1.0, eval_episodes=400, eval_successes=k,
                 eval_success_lower=mujoco.wilson(k, 400)[0], max_policy_lag=0, **WHEN)
        )  # fmt: skip
    old = line("halfcheetah_ppo", "HalfCheetah-v5", 1, 1700.0)
    del old["overrides"]
    rows.append(old)
    for row in rows:
        curve(out, row, row["training_return"])
    (out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def sections(page: str) -> dict[str, str]:
    """The page's task sections by heading (``## hopper_ppo (Hopper-v5)`` -> ``hopper_ppo``)."""
    parts = re.split(r"^## ", page, flags=re.M)[1:]
    return {part.split()[0]: part for part in parts}


def test_table_writes_one_table_per_task_with_the_mean_and_std_over_seeds(results, tmp_path, capsys):
    docs = tmp_path / "docs" / "results.md"
    assert mujoco.main(["--table", "--out", str(results), "--docs", str(docs)]) == 0
    page = docs.read_text()
    tasks = sections(page)
    assert sorted(tasks) == ["halfcheetah_ppo", "hopper_ppo", "reach_ppo"]
    for text in tasks.values():
        assert text.count("| settings | budget | seed |") == 1  # one table per task
    hopper = tasks["hopper_ppo"]
    overlapped = "| `algo.max_policy_lag=1` | 1,000,000 |"  # packaged so then: read against the config as now
    assert f"{overlapped} 2 | 2,400.0 | 2,500.0 | - | 302.0 |" in hopper
    assert f"{overlapped} **mean +- std (3 seeds)** | 2,400.0 +- 400.0 | 2,500.0 +- 400.0 | - |" in hopper
    assert "| packaged | 1,000,000 | **mean +- std (3 seeds)** | 3,000.0 +- 400.0 |" in hopper  # lag 0: packaged
    assert hopper.index("| packaged |") < hopper.index(overlapped)
    assert "| CleanRL, published (v4) | 1,000,000 | - | 2,382.9 +- 271.7 |" in hopper
    assert (
        "| SB3 + RL Zoo, published model (v3, one seed, 10 episodes) | 1,000,000 | - | - | 2,410.1 +- 9.9 |" in hopper
    )
    assert "v5, with the same dynamics and rewards" in page
    again = "raysim bench mujoco --configs hopper_ppo --seeds 1 2 3 --peers raysim --steps 1000000 --eval-episodes 20"
    assert f"- packaged: `{again}`" in hopper
    assert f"- `algo.max_policy_lag=1`: `{again} --override algo.max_policy_lag=1`" in hopper
    assert "--eval-episodes 400`" in tasks["reach_ppo"]
    cheetah = tasks["halfcheetah_ppo"]
    assert "| packaged | 1,000,000 | 1 | 1,700.0 |" in cheetah  # a line older than the overrides field
    assert "| packaged | 1,000,000 | **mean +- std (1 seed)** | 1,700.0 | 1,800.0 | - | 301.0 |" in cheetah
    assert "| CleanRL, published (v4) | 1,000,000 | - | 1,442.6 +- 46.0 |" in cheetah
    assert "Runs finished: not recorded. Machine: not recorded. Load: not recorded." in cheetah
    assert "published" not in tasks["reach_ppo"]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{docs}: 3 task(s), 9 run(s) from {results / 'results.jsonl'}"


def test_table_notes_the_date_machine_and_load_once_per_table(results, tmp_path):
    docs = tmp_path / "results.md"
    assert mujoco.main(["--table", "--out", str(results), "--docs", str(docs)]) == 0
    hopper = sections(docs.read_text())["hopper_ppo"]
    note = (
        "Runs finished: 2026-12-01 to 2026-12-03. Machine: box (2 CPUs). Load: 1-minute load average at run "
        "start 0.50-1.50, at end 2.00-4.00."
    )
    assert hopper.count("Runs finished:") == 1 and note in hopper


def test_table_says_how_many_runs_recorded_no_date_machine_or_load():
    recorded = line("reach_camera_ppo", "raysim/ReachCamera", 2, 1.0, **WHEN, finished="2026-12-05T15:00:00+00:00",
                    load_start=[1.0, 1.0, 1.0], load_end=[1.5, 1.0, 1.0], mujoco="3.3.0")  # fmt: skip
    older = [line("reach_camera_ppo", "raysim/ReachCamera", seed, 1.0, mujoco=None) for seed in (1, 3)]
    assert provenance([*older, recorded]) == (
        "Runs finished: 2026-12-05 (2 of 3 runs recorded none). Machine: box (2 CPUs) (2 of 3 runs recorded none). "
        "Load: 1-minute load average at run start 1.00-1.00, at end 1.50-1.50 (2 of 3 runs recorded none)."
    )  # no MuJoCo: the task steps none


def test_a_multi_task_configs_table_gives_each_tasks_successes_per_run_the_unweighted_mean_and_scripted_rows(
    tmp_path,
):
    out, docs = tmp_path / "bench", tmp_path / "results.md"
    tasks = {"reach-v3": [5, 5], "push-v3": [1, 5]}  # [k, c]: 1.0 and 0.2, unweighted mean 0.6 (pooled 0.6 too)
    rows = [line("metaworld_mt10_ppo", "raysim/MetaWorld", 1, 10.0, eval_episodes=10, eval_successes=6,
                 eval_success_lower=mujoco.wilson(6, 10)[0], eval_tasks=tasks, mujoco="3.3.0", **WHEN)]  # fmt: skip
    expert = dict(
        rows[0], peer="expert", steps=0, eval_successes=10, eval_tasks={"reach-v3": [5, 5], "push-v3": [5, 5]}
    )
    out.mkdir()
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (*rows, expert)))
    assert mujoco.main(["--table", "--out", str(out), "--docs", str(docs)]) == 0
    page = sections(docs.read_text())["metaworld_mt10_ppo"]
    assert "MuJoCo: 3.3.0." in page
    assert "| task | packaged, seed 1 | expert (scripted, metaworld.policies), seed 1 |" in page
    assert f"| push-v3 | 1/5 ({mujoco.wilson(1, 5)[0]:.3f}) | 5/5 ({mujoco.wilson(5, 5)[0]:.3f}) |" in page
    assert "| **mean over tasks (unweighted)** | 0.600 | 1.000 |" in page


def test_table_gives_overlap_minus_lockstep_with_its_welch_interval(results, tmp_path):
    """Equal variances over 3 and 3 seeds: 4 degrees of freedom, t(0.975, 4) = 2.776445 from the t table;
    se = sqrt(2 * 400**2 / 3) = 326.599, so -600 +- 906.785."""
    docs = tmp_path / "results.md"
    assert mujoco.main(["--table", "--out", str(results), "--docs", str(docs)]) == 0
    hopper = sections(docs.read_text())["hopper_ppo"]
    half = 2.776445 * math.sqrt(2 * 400.0**2 / 3)
    expected = f"training return -600.0 (95% Welch interval {-600 - half:+,.1f} to {-600 + half:+,.1f}, 4.0 dof"
    assert expected == "training return -600.0 (95% Welch interval -1,506.8 to +306.8, 4.0 dof"
    assert "Overlapped (`algo.max_policy_lag` 1) - lockstep (`algo.max_policy_lag` 0)" in hopper
    assert expected + ", overlapped mean -20.0% against lockstep's)" in hopper
    assert "deterministic eval -600.0" in hopper
    assert "Welch" not in sections(docs.read_text())["reach_ppo"]  # no lockstep runs there


def test_table_pools_the_successes_where_the_task_defines_them(results, tmp_path):
    docs = tmp_path / "results.md"
    assert mujoco.main(["--table", "--out", str(results), "--docs", str(docs)]) == 0
    reach = sections(docs.read_text())["reach_ppo"]
    assert "| packaged | 1,000,000 | 1 | -1.0 | 99.0 | 394/400 (0.968) |" in reach
    pooled = f"792/800 ({mujoco.wilson(792, 800)[0]:.3f}); lowest seed {mujoco.wilson(394, 400)[0]:.3f}"
    assert f"| {pooled} |" in reach


def test_table_draws_one_picture_per_task_beside_the_page(results, tmp_path, capsys):
    docs = tmp_path / "docs" / "results.md"
    assert mujoco.main(["--table", "--out", str(results), "--docs", str(docs)]) == 0
    page = docs.read_text()
    for task in ("halfcheetah_ppo", "hopper_ppo", "reach_ppo"):
        picture = docs.parent / f"results-{task}.png"
        assert picture.read_bytes()[:4] == b"\x89PNG" and f"]({picture.name})" in sections(page)[task]
    assert sorted(capsys.readouterr().out.splitlines()[1:]) == sorted(
        str(docs.parent / f"results-{task}.png") for task in ("halfcheetah_ppo", "hopper_ppo", "reach_ppo")
    )


def test_table_without_results_says_so_in_one_line(tmp_path, capsys):
    from raysim.cli import main

    assert main(["bench", "mujoco", "--table", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no results in" in err[0] and "results.jsonl" in err[0]


def test_table_without_results_shows_the_command_that_tables_the_recorded_ones(results, tmp_path, monkeypatch, capsys):
    from raysim.cli import main

    checkout = tmp_path / "checkout"  # a fresh checkout: its recorded runs in benchmarks/results, none in --out
    (checkout / "benchmarks").mkdir(parents=True)
    results.rename(checkout / "benchmarks" / "results")
    monkeypatch.chdir(checkout)
    assert main(["bench", "mujoco", "--table"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no results in bench-results/mujoco/results.jsonl" in err[0]
    command = err[0].split(": ")[-1]
    assert command == "raysim bench mujoco --table --out benchmarks/results --docs docs/benchmarks/results.md"
    assert main(command.split()[1:]) == 0  # the command shown tables them
    assert "## hopper_ppo (Hopper-v5)" in (checkout / "docs" / "benchmarks" / "results.md").read_text()


def test_t_quantile_matches_the_t_table_and_inverts_the_cdf():
    for dof, value in ((1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139), (30, 2.042272)):
        assert t_quantile(0.975, dof) == pytest.approx(value, abs=1e-6)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)  # the normal's
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
    assert t_cdf(t_quantile(0.9, 3.37), 3.37) == pytest.approx(0.9, abs=1e-10)  # Welch's dof are fractional


def test_welch_uses_the_welch_satterthwaite_degrees_of_freedom():
    """var(a)/5 = 0.5 and var(b)/6 = 14/6: dof = (0.5 + 7/3)**2 / (0.5**2/4 + (7/3)**2/5) = 6.9723."""
    d = welch([1, 2, 3, 4, 5], [2, 4, 6, 8, 10, 12])
    assert d.difference == -4.0 and d.dof == pytest.approx((0.5 + 7 / 3) ** 2 / (0.5**2 / 4 + (7 / 3) ** 2 / 5))
    half = t_quantile(0.975, d.dof) * math.sqrt(0.5 + 7 / 3)
    assert (d.low, d.high) == pytest.approx((-4.0 - half, -4.0 + half))


def test_a_run_line_records_its_overrides_machine_load_and_dates(tmp_path, monkeypatch, capsys):
    def fake(config_name, seed, steps, run_dir, args):
        result = {"env_steps": steps, "train_seconds": 1.0, "eval_returns": [1.0], "eval_successes": 1}
        return {**result, "layout": "-", "max_policy_lag": 0}, [(steps, 1.0, 1)]

    monkeypatch.setitem(mujoco.RUNNERS, "raysim", fake)
    args = argparse.Namespace(out=tmp_path, override=["algo.max_policy_lag=0"])
    row = mujoco.run_one("raysim", "reach_ppo", 3, 64, args)
    assert row["overrides"] == ["algo.max_policy_lag=0"] and row["max_policy_lag"] == 0
    assert row["curve"] == "curves/raysim-reach_ppo-s3-64-algo.max_policy_lag=0.csv"
    assert (tmp_path / row["curve"]).is_file()
    assert row["host"] and row["cpus"] >= 1 and row["started"] <= row["finished"]
    assert len(row["load_start"]) == 3 and len(row["load_end"]) == 3
    run_dir = tmp_path / "runs" / "raysim-reach_ppo-s3-64-algo.max_policy_lag=0"
    assert capsys.readouterr().err == f"[raysim reach_ppo seed 3: training 64 env steps in {run_dir}]\n"  # said first


def test_a_run_with_overrides_is_not_skipped_for_the_packaged_one(tmp_path, monkeypatch, capsys):
    trained = []

    def fake_run_one(peer, config_name, seed, steps, args):
        trained.append((config_name, seed, tuple(args.override)))
        row = line(config_name, "raysim/Reach", seed, 1.0, overrides=list(args.override))
        curve(tmp_path, row, 1.0)
        return row

    monkeypatch.setattr(mujoco, "run_one", fake_run_one)
    argv = ["--configs", "reach_ppo", "--seeds", "1", "--steps", "1000000", "--peers", "raysim", "--out", str(tmp_path)]
    assert mujoco.main(argv) == 0 and mujoco.main(argv) == 0  # the second finds it done
    overlapped = [*argv, "--override", "algo.max_policy_lag=1"]
    assert mujoco.main(overlapped) == 0 and mujoco.main(overlapped) == 0
    assert trained == [("reach_ppo", 1, ()), ("reach_ppo", 1, ("algo.max_policy_lag=1",))]
    assert len(read_results(tmp_path / "results.jsonl")) == 2
    assert "| raysim/Reach | 1,000,000 | raysim, `algo.max_policy_lag=1` | 1 |" in capsys.readouterr().out


def test_runs_are_skipped_by_their_settings_against_the_config_as_packaged_now(tmp_path, monkeypatch):
    """hopper_ppo went lockstep: its ``algo.max_policy_lag=0`` runs are packaged ones, and its runs made while it
    was overlapped (no overrides, lag 1 recorded) are ``algo.max_policy_lag=1`` ones."""
    trained = []

    def fake_run_one(peer, config_name, seed, steps, args):
        trained.append((seed, tuple(args.override)))
        return line(config_name, "Hopper-v5", seed, 1.0, overrides=list(args.override))

    old = [line("hopper_ppo", "Hopper-v5", 1, 1.0, overrides=["algo.max_policy_lag=0"], max_policy_lag=0)]
    old.append(line("hopper_ppo", "Hopper-v5", 2, 1.0, max_policy_lag=1))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in old))
    monkeypatch.setattr(mujoco, "run_one", fake_run_one)
    monkeypatch.setattr(mujoco, "plot", lambda results, out: out / "curves.png")
    argv = ["--configs", "hopper_ppo", "--seeds", "1", "2", "--peers", "raysim", "--out", str(tmp_path)]
    assert mujoco.main(argv) == 0 and mujoco.main([*argv, "--override", "algo.max_policy_lag=1"]) == 0
    assert trained == [(2, ()), (1, ("algo.max_policy_lag=1",))]
    lag1 = ("algo.max_policy_lag=1",)
    assert [run_settings(r) for r in read_results(tmp_path / "results.jsonl")] == [(), lag1, (), lag1]


def test_an_override_the_config_took_since_reads_as_packaged():
    """A run made with ``--override`` of what the config sets now is a packaged run; one that sets otherwise is not."""
    gamma = load_config("hopper_ppo").algo.gamma
    took = line("hopper_ppo", "Hopper-v5", 1, 1.0, overrides=[f"algo.gamma={gamma}"], max_policy_lag=0)
    other = line("hopper_ppo", "Hopper-v5", 1, 1.0, overrides=["algo.gamma=0.5", "algo.lr=0.001"], max_policy_lag=0)
    assert run_settings(took) == () and run_key(took) == run_key({**took, "overrides": []})
    assert run_settings(other) == ("algo.gamma=0.5", "algo.lr=0.001")


def test_a_run_evaluates_the_configs_own_episodes_over_five_seeds_unless_told(tmp_path, monkeypatch):
    """The packaged settings exactly: CartPole's 100 evaluation episodes, not MuJoCo's 20; seeds 1-5 by default."""
    import raysim

    seen = []

    class Stop(Exception):
        pass

    def trainer(config, address=None):
        seen.append(config.eval.episodes)
        raise Stop

    monkeypatch.setattr(raysim, "Trainer", trainer)
    for given in ([], ["--eval-episodes", "7"]):
        args = mujoco.parse(["--configs", "cartpole_ppo", *given])
        with pytest.raises(Stop):
            mujoco.train_raysim("cartpole_ppo", 1, 1024, tmp_path / "run", args)
    assert seen == [100, 7]
    assert mujoco.parse([]).seeds == [1, 2, 3, 4, 5]


def test_each_config_trains_for_its_own_budget_unless_steps_are_given(tmp_path, monkeypatch):
    """A packaged config is run at its packaged settings exactly: ``train.total_steps`` is the default budget."""
    budgets = []

    def fake_run_one(peer, config_name, seed, steps, args):
        budgets.append((config_name, steps))
        row = line(config_name, "raysim/CartPole", seed, 1.0)
        curve(args.out, row, 1.0)
        return {**row, "steps": steps}

    monkeypatch.setattr(mujoco, "run_one", fake_run_one)
    argv = ["--configs", "cartpole_ppo", "cartpole_stateless_ppo", "--seeds", "1", "--peers", "raysim"]
    assert mujoco.main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert mujoco.main([*argv, "--out", str(tmp_path / "b"), "--steps", "1024"]) == 0
    assert budgets == [
        ("cartpole_ppo", 40_000),
        ("cartpole_stateless_ppo", 200_000),
        ("cartpole_ppo", 1024),
        ("cartpole_stateless_ppo", 1024),
    ]


def test_a_meta_world_config_gets_the_expert_and_random_rows_once_on_the_trained_policys_episodes(tmp_path, capsys):
    pytest.importorskip("metaworld")
    out = tmp_path / "bench"
    argv = ["--configs", "metaworld_reach_ppo", "--seeds", "1", "2", "--peers", "expert", "random", "--out", str(out)]
    argv += ["--eval-episodes", "4", "--override", "env.kwargs.max_episode_steps=60", "--override", "eval.num_envs=2"]
    assert mujoco.main(argv) == 0
    lines = read_results(out / "results.jsonl")
    assert [(r["peer"], r["seed"], r["steps"]) for r in lines] == [("expert", 1, 0), ("random", 1, 0)]  # once
    expert, random = lines
    assert expert["eval_episodes"] == random["eval_episodes"] == 4 and expert["mujoco"]
    assert expert["eval_successes"] >= 3 and random["eval_successes"] <= 1  # the task's ceiling and floor
    assert expert["eval_tasks"] is None  # one task: its successes are the run's
    assert mujoco.main(argv) == 0 and len(read_results(out / "results.jsonl")) == 2  # done: skipped
    assert "| random (uniform actions), `env.kwargs.max_episode_steps=60`" in capsys.readouterr().out


def test_a_mujoco_tasks_runs_on_another_or_an_unrecorded_mujoco_are_a_group_apart_and_not_skipped(tmp_path):
    out, docs = tmp_path / "bench", tmp_path / "results.md"
    pinned = [line("hopper_ppo", "Hopper-v5", 1, 3000.0, max_policy_lag=0)]
    older = [line("hopper_ppo", "Hopper-v5", seed, 2000.0, max_policy_lag=0, mujoco=None) for seed in (1, 2)]
    other = [line("hopper_ppo", "Hopper-v5", 1, 2500.0, max_policy_lag=0, mujoco="4.0.1")]
    out.mkdir()
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (*pinned, *older, *other)))
    assert len({run_key(r) for r in (*pinned, *older, *other)}) == 4  # seed 1 three times: three runs
    assert run_settings(older[0]) == ("MuJoCo not recorded",) and run_settings(pinned[0]) == ()
    assert mujoco.main(["--table", "--out", str(out), "--docs", str(docs)]) == 0
    hopper = sections(docs.read_text())["hopper_ppo"]
    assert "| packaged | 1,000,000 | 1 | 3,000.0 |" in hopper
    assert "| `MuJoCo not recorded` | 1,000,000 | **mean +- std (2 seeds)** | 2,000.0 +- 0.0 |" in hopper
    assert "| `MuJoCo 4.0.1` | 1,000,000 | 1 | 2,500.0 |" in hopper
    assert "--override MuJoCo" not in hopper  # the commands run them again on this MuJoCo
    assert "MuJoCo: 3.3.0, 4.0.1 (2 of 4 runs recorded none)." in hopper


def test_the_distill_table_gives_successes_and_seconds_per_seed_and_judges_the_students_lower_bound(tmp_path, capsys):
    def run(row: str, seed: int, k: int, seconds: float) -> dict:
        steps = 299_008 if row == "distill" else 1_000_000
        return {"row": row, "seed": seed, "eval_successes": k, "eval_episodes": 400, "train_seconds": seconds,
                "steps": steps, "env_steps": steps + 1472 * (row != "distill")}  # fmt: skip

    lines = [run("teacher", 1, 392, 130.0), run("distill", 1, 396, 600.0), run("scratch", 1, 396, 2525.0)]
    lines += [run("teacher", 2, 390, 128.0), run("distill", 2, 380, 640.0)]  # seed 2: no scratch line
    out = tmp_path / "bench"
    out.mkdir()
    (out / "distill.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert distill.main(["--table", "--out", str(out), "--seeds", "1", "2"]) == 0  # trains nothing
    text = (out / "distill.md").read_text()
    assert text in capsys.readouterr().out
    student = next(row for row in text.splitlines() if row.startswith("| student"))
    assert "| 396/400 (0.99, [0.97, 1.00]), 130 s + 600 s | 380/400 (0.95, [0.92, 0.97]), 128 s + 640 s |" in student
    assert next(row for row in text.splitlines() if row.startswith("| PPO from the camera")).endswith("2,525 s | - |")
    assert "lower bounds 0.975, 0.924 (seeds 1, 2) at a budget of 299,008 env steps (299,008, 299,008 taken)" in text
    assert text.endswith("target (>= 0.9 on every seed, <= 300,000 env steps) met\n")
    lines[-1] = run("distill", 2, 350, 640.0)  # 0.875: its lower bound 0.84
    assert distill.table(lines, [1, 2]).endswith(") not met\n")
    lines[-1] = {**run("distill", 2, 380, 640.0), "steps": 300_000, "env_steps": 301_056}  # whole iterations: over
    assert distill.table(lines, [1, 2]).endswith(") not met\n")
