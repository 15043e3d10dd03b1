"""Evaluation: balanced quotas, layout-independent seeds, denominators, Wilson intervals, records."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import pytest
import torch

import raysim
from raysim.actors import LocalBackend, RayBackend
from raysim.envs import register
from raysim.envs.cartpole import CartPole
from raysim.evaluation import EvalSpec, evaluate_on_shards, format_report, quotas, summarize, wilson
from raysim.models.networks import ActorCritic, ModelConfig
from raysim.rollout.shard import EnvShard


class RowLengthEnv(CartPole):
    """Row 0 ends every episode after 1 step, the other rows after 20 (return = length)."""

    env_id = "test/RowLength"

    def _advance(self, actions):
        reward, _ = super()._advance(actions)
        limit = torch.where(self._all_rows == 0, 1, 20)
        return reward, self.episode_length + 1 >= limit


register("test/RowLength", RowLengthEnv)


def actor_weights(env_id: str = "raysim/CartPole", seed: int = 0, env_kwargs: dict | None = None) -> dict:
    torch.manual_seed(seed)
    shard = EnvShard(env_id, 1, env_kwargs=env_kwargs)
    model = ActorCritic(*shard.spaces()[:2], ModelConfig())
    return {"version": 1, "actor": model.actor.state_dict()}


def run_local(env_id: str, layout: list[int], spec: EvalSpec, env_kwargs: dict | None = None, **callbacks):
    backend = LocalBackend()
    make = lambda i: backend.create(EnvShard, env_id, layout[i], seed=i, env_kwargs=env_kwargs)  # noqa: E731
    shards = [make(i) for i in range(len(layout))]
    weights = actor_weights(env_id, env_kwargs=env_kwargs)
    return evaluate_on_shards(backend, make, shards, layout, weights, spec, **callbacks)


def test_quotas_split_episodes_over_rows_with_the_remainder_first():
    assert quotas(10, 4) == [3, 3, 2, 2]
    assert quotas(3, 5) == [1, 1, 1, 0, 0]
    assert sum(quotas(101, 7)) == 101


def test_balanced_quotas_remove_the_bias_toward_short_episodes_that_first_n_to_finish_has():
    spec = EvalSpec(episodes=40, seed=3, max_steps=1000)
    balanced = run_local("test/RowLength", [4], spec)
    rows = [r["row"] for r in balanced.records]
    assert [rows.count(r) for r in range(4)] == [10, 10, 10, 10]
    true_mean = (10 * 1 + 30 * 20) / 40
    assert balanced.returns["mean"] == pytest.approx(true_mean)

    first_n = run_local("test/RowLength", [4], EvalSpec(episodes=40, seed=3, max_steps=1000, balanced=False))
    assert first_n.completed == 40
    assert first_n.returns["mean"] < true_mean - 5  # visibly biased toward row 0's 1-step episodes
    assert sum(r["row"] == 0 for r in first_n.records) > 10


LAYOUTS = ([1], [8], [4, 4], [5, 5, 5], [16] * 8)  # shards x envs: 1x1, 1x8, 2x4, 3x5, 8x16


def by_episode(report) -> dict[int, dict]:
    """The report's records keyed by global episode index, without the layout facts ``row`` and ``step``."""
    return {r["episode"]: {k: v for k, v in r.items() if k not in ("row", "step")} for r in report.records}


def assert_same_evaluation(reports: list, layouts=LAYOUTS) -> None:
    """Equal records per episode index and equal reports (denominators, rates, statistics) on every layout."""
    expected = by_episode(reports[0])
    for layout, report in zip(layouts, reports, strict=True):
        assert by_episode(report) == expected, layout
        assert [r["episode"] for r in report.records] == sorted(expected), layout  # in index order
        assert dataclasses.replace(report, records=[]) == dataclasses.replace(reports[0], records=[]), layout


@pytest.mark.parametrize("deterministic", [True, False])
def test_eval_report_independent_of_shard_layout(deterministic):
    spec = EvalSpec(episodes=37, seed=11, max_steps=500, deterministic=deterministic)
    reports = [run_local("raysim/CartPole", layout, spec) for layout in LAYOUTS]
    assert_same_evaluation(reports)
    assert sorted(by_episode(reports[0])) == list(range(37))  # exactly episodes 0..n-1
    assert len({r["seed"] for r in reports[0].records}) == 37
    other = run_local("raysim/CartPole", [8], EvalSpec(episodes=37, seed=11, max_steps=500, deterministic=True))
    if not deterministic:  # actions are sampled
        assert [r["return"] for r in reports[0].records] != [r["return"] for r in other.records]


def test_a_longer_evaluation_plays_the_episodes_of_a_shorter_one_first():
    short = run_local("raysim/CartPole", [8], EvalSpec(episodes=8, seed=2, max_steps=500))
    long = run_local("raysim/CartPole", [16], EvalSpec(episodes=20, seed=2, max_steps=500))
    assert {j: r for j, r in by_episode(long).items() if j < 8} == by_episode(short)


NOISY_REACH = {
    "max_episode_steps": 15,
    "observations": {"policy": [{"term": "joint_pos", "noise": 0.05}, "goal_rel"], "critic": ["goal"]},
}


@pytest.mark.parametrize("deterministic", [True, False])
def test_an_evaluation_of_reach_with_observation_noise_does_not_depend_on_the_shard_layout(deterministic):
    spec = EvalSpec(episodes=14, seed=5, max_steps=1000, deterministic=deterministic)
    reports = [run_local("raysim/Reach", layout, spec, NOISY_REACH) for layout in LAYOUTS]
    assert reports[0].completed == 14 and "success" in reports[0].records[0]
    assert_same_evaluation(reports)  # bitwise: continuous actions too


def test_the_step_budget_cuts_the_same_episodes_on_any_layout():
    spec = EvalSpec(episodes=24, seed=1, max_steps=12)  # an episode still running after 12 steps is cut
    reports = [run_local("raysim/CartPole", layout, spec) for layout in LAYOUTS]
    assert_same_evaluation(reports)
    assert 0 < reports[0].completed < 24 and all(r["length"] <= 12 for r in reports[0].records)


def _wilson_by_bisection(k: int, n: int, z: float) -> tuple[float, float]:
    """Independent reference: the two roots of |p - pi| = z sqrt(pi (1 - pi) / n)."""
    p = k / n

    def f(pi: float) -> float:
        return (p - pi) ** 2 - z * z * pi * (1 - pi) / n

    def root(lo: float, hi: float) -> float:
        for _ in range(200):
            mid = (lo + hi) / 2
            if (f(lo) > 0) == (f(mid) > 0):
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else root(0.0, p)
    upper = 1.0 if k == n else root(p, 1.0)
    return lower, upper


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (5, 10), (81, 263)])
def test_wilson_intervals_match_known_values(k, n):
    z = 1.959963984540054
    assert wilson(k, n, 0.95) == pytest.approx(_wilson_by_bisection(k, n, z), abs=1e-9)


def test_wilson_intervals_of_textbook_cases():
    assert wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-5)
    assert wilson(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson(3, 0) is None


def test_a_too_small_step_budget_counts_unfinished_episodes_in_n_but_not_c():
    report = run_local("test/RowLength", [4], EvalSpec(episodes=8, seed=0, max_steps=10))
    # Row 0 finishes its 2 one-step episodes; the 20-step episodes of rows 1..3 cannot finish in 10 steps.
    assert report.requested == 8 and report.completed == 2
    assert report.completion_rate.value == pytest.approx(2 / 8)
    assert report.completion_rate.interval == wilson(2, 8)


def test_zero_completed_episodes_give_a_report_with_no_intervals():
    report = run_local("raysim/CartPole", [4], EvalSpec(episodes=4, seed=0, max_steps=1))
    assert report.completed == 0 and report.requested == 4
    assert report.returns["mean"] is None and report.lengths["max"] is None
    assert report.completion_rate.value == 0.0
    assert summarize([], 0).completion_rate.interval is None
    assert report.successes is None and report.success_rate is None  # CartPole defines no success
    assert "success k / n          n/a (the task defines no success)" in format_report(report)


def test_zero_completed_episodes_of_a_task_that_defines_success_report_k_over_n_and_leave_k_over_c_undefined():
    # 100-step episodes cannot end within 5 steps, and a goal tolerance of 1e-6 is never met
    report = run_local("raysim/Reach", [4], EvalSpec(episodes=8, seed=0, max_steps=5), {"tolerance": 1e-6})
    assert (report.requested, report.completed, report.successes) == (8, 0, 0)
    assert report.success_per_requested.value == 0.0
    assert report.success_per_requested.interval == wilson(0, 8) == pytest.approx((0.0, 0.32440), abs=1e-5)
    assert report.success_rate.value is None and report.success_rate.interval is None
    text = format_report(report)
    assert "success k / n          0/8 = 0.000  [0.000, 0.324]" in text
    assert "success k / c          0/0  undefined (no denominator)" in text


def test_success_rates_use_the_env_owned_success_and_both_denominators():
    records = [{"return": 1.0, "length": 1, "success": s} for s in (True, True, False)]
    report = summarize(records, requested=5)
    assert (report.successes, report.completed, report.requested) == (2, 3, 5)
    assert report.success_rate.value == pytest.approx(2 / 3)
    assert report.success_per_requested.value == pytest.approx(2 / 5)
    assert report.success_per_requested.interval == wilson(2, 5)


def test_callbacks_receive_one_scalar_record_per_counted_episode_and_the_unchanged_report():
    scored, reports = [], []
    report = run_local(
        "raysim/CartPole",
        [3],
        EvalSpec(episodes=7, seed=2, max_steps=5000),
        on_scored_episode=scored.append,
        on_episode=reports.append,
    )
    assert len(scored) == len(reports) == report.completed == 7
    for record, env_report in zip(scored, reports, strict=True):
        assert all(isinstance(v, (int, float, bool)) for v in record.values())
        assert set(env_report) == {"return", "length"}
        assert env_report["return"] == record["return"] and env_report["length"] == record["length"]


@pytest.mark.slow  # a fault on Ray
def test_a_shard_killed_during_evaluation_is_replaced_and_the_report_is_unchanged(ray_session):
    spec = EvalSpec(episodes=60, seed=5, max_steps=100_000)
    env_id = "gym:Pendulum-v1"  # every episode lasts 200 steps: a long evaluation
    expected = run_local(env_id, [3, 3], spec)

    backend = RayBackend()
    created = []

    def make(i: int):
        created.append(i)
        return backend.create(EnvShard, env_id, 3, seed=i, options={"num_cpus": 1})

    shards = [make(0), make(1)]
    killer = threading.Timer(1.0, lambda: backend.kill(shards[1]))
    killer.start()
    started = time.perf_counter()
    report = evaluate_on_shards(backend, make, shards, [3, 3], actor_weights(env_id), spec)
    killer.join()
    assert created.count(1) == 2, f"shard 1 was not replaced (evaluation took {time.perf_counter() - started:.1f} s)"
    assert report.records == expected.records
    assert math.isclose(report.returns["mean"], expected.returns["mean"])


def test_evaluate_api_and_cli_read_a_run_directory(tmp_path, capsys):
    config = raysim.load_config(
        None, ["backend=local", "train.total_steps=1024", "eval.episodes=0", f"run_dir={tmp_path / 'run'}"]
    )
    summary = raysim.Trainer(config).train()
    report = raysim.evaluate(summary.run_dir, episodes=12, seed=4, backend="local", out=tmp_path / "e.parquet")
    assert report.requested == 12 and report.completed == 12
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "e.parquet")
    assert table.num_rows == 12 and {"row", "episode", "seed", "return", "length"} <= set(table.column_names)

    from raysim.cli import main

    assert main(["eval", summary.run_dir, "--episodes", "6", "--local", "--shards", "2", "--envs-per-shard", "3"]) == 0
    out = capsys.readouterr().out
    assert "requested episodes n   6" in out and "Wilson" in out


def test_raysim_eval_on_another_layout_reports_what_the_evaluation_during_training_found(tmp_path, capsys):
    import pyarrow.parquet as pq

    from raysim.cli import main

    run_dir = tmp_path / "run"
    settings = ["backend=local", "train.total_steps=1024", "eval.episodes=13", "eval.shards=1", "eval.num_envs=4"]
    summary = raysim.Trainer(raysim.load_config(None, [*settings, f"run_dir={run_dir}"])).train()
    capsys.readouterr()
    args = ["eval", str(run_dir), "--episodes", "13", "--local", "--shards", "3", "--envs-per-shard", "5"]
    assert main([*args, "--out", str(tmp_path / "e.parquet")]) == 0
    assert format_report(summary.evaluation) in capsys.readouterr().out

    def scored(records: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("row", "step")} for r in records]

    (in_training,) = (run_dir / "eval").glob("*.parquet")
    assert scored(pq.read_table(tmp_path / "e.parquet").to_pylist()) == scored(pq.read_table(in_training).to_pylist())


def test_an_env_that_cannot_reset_one_row_is_evaluated_with_per_row_keys():
    native = {"vectorize": "native", "max_episode_steps": 60}  # Gymnasium's CartPoleVectorEnv
    spec = EvalSpec(episodes=10, seed=4, max_steps=500)
    report = run_local("gym:CartPole-v1", [4], spec, native)
    assert report.completed == 10 and sorted(by_episode(report)) == list(range(10))
    assert all(r["seed"] is None for r in report.records)  # no episode has a seed of its own
    assert report == run_local("gym:CartPole-v1", [4], spec, native)  # reproducible on its layout

    cut = run_local("gym:CartPole-v1", [4], dataclasses.replace(spec, max_steps=25), native)
    assert 0 < cut.completed < 10 and all(r["length"] <= 25 for r in cut.records)
