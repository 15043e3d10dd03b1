"""``raysim bench sac``: each row at tiny budgets in this process (the peer through ``peer_module``), the results
appended and skipped on the next invocation, what a fresh process is given, the critics as a loop, the tables, and the
page against the recorded results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

import raysim
from raysim.bench import sac
from raysim.bench.results import read_results
from raysim.models.ensemble import QEnsemble

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "results" / "sac"
PAGE = ROOT / "docs" / "benchmarks" / "sac.md"
# both sides: 512 env steps, the first 128 random, batch 32; evaluated at 256 and at the end on 2 episodes
TINY = ["--steps", "512", "--eval-every", "256", "--eval-episodes", "2", "--local"]
TINY += ["--override", "algo.learning_starts=128", "--override", "algo.batch_size=32"]


@pytest.fixture(autouse=True)
def threads():
    """torch's thread count put back (raysim's in-process shards set one thread for the process)."""
    count = torch.get_num_threads()
    yield
    torch.set_num_threads(count)


@pytest.mark.slow
def test_a_hopper_row_runs_both_sides_appends_each_run_and_the_next_invocation_skips_them(tmp_path, capsys):
    pytest.importorskip("mujoco")
    argv = ["--rows", "hopper", "--seeds", "1", *TINY, "--out", str(tmp_path)]
    assert sac.main(argv) == 0
    lines = read_results(tmp_path / "results.jsonl")
    assert [(line["side"], line["seed"]) for line in lines] == [("raysim", 1), ("cleanrl", 1)]
    ours, theirs = lines
    for line in lines:
        assert line["env_steps"] == 512 and line["eval_episodes"] == 2
        assert [point[0] for point in line["evals"]] == [256, 512] and line["eval_mean"] == line["evals"][-1][1]
        assert line["collect_seconds"] > 0 and line["update_seconds"] > 0 and line["training_return"] is not None
        parts = line["collect_seconds"] + line["update_seconds"] + line["checkpoint_seconds"]
        assert parts == pytest.approx(line["train_seconds"], rel=0.1)  # the rest: bookkeeping between the phases
        assert line["updates_per_s"] == pytest.approx(line["gradient_steps"] / line["update_seconds"], rel=0.02)
        assert line["env_steps_per_s"] == pytest.approx(512 / line["train_seconds"], rel=0.02)
        assert line["load_start"] is not None and line["host"] and line["versions"]["torch"]
    assert ours["gradient_steps"] == 512 - 128 and ours["settings"][-1] == "backend=local"
    assert theirs["gradient_steps"] == 512 - 129  # CleanRL's first update follows step learning_starts + 1
    assert (theirs["learning_starts"], theirs["batch_size"]) == (128, 32)  # raysim's config with the overrides
    out = capsys.readouterr().out
    assert out.startswith("**Hopper-v5: returns**") and (tmp_path / "sac.md").read_text() == out
    assert sac.main(argv) == 0 and len(read_results(tmp_path / "results.jsonl")) == 2  # done: skipped


def test_the_sides_take_turns_first_from_seed_to_seed():
    order = [(run.seed, run.side) for run in sac.planned(sac.parse(["--rows", "hopper", "--eval-episodes", "10"]))]
    assert order == [(1, "raysim"), (1, "cleanrl"), (2, "cleanrl"), (2, "raysim"), (3, "raysim"), (3, "cleanrl")]
    runs = sac.planned(sac.parse(["--rows", "wallclock", "rlpd", "--eval-episodes", "10"]))  # the rlpd config unread
    assert [(run.row, run.seed, run.steps, run.eval_every) for run in runs][:2] == [("wallclock", 1, 100_000, 0)] * 2
    rlpd = [(run.seed, run.side, run.demonstrations) for run in runs if run.row == "rlpd"]
    assert rlpd == [
        (1, "raysim", "raysim/pick-place-v3/expert-5-s1-rlpd-v0"),
        (1, "raysim-no-demos", ""),  # the run without demonstrations: the first seed alone
        (2, "raysim", "raysim/pick-place-v3/expert-5-s2-rlpd-v0"),
        (3, "raysim", "raysim/pick-place-v3/expert-5-s3-rlpd-v0"),
    ]
    assert all(run.steps == 150_000 and run.eval_every == 25_000 for run in runs if run.row == "rlpd")


def test_a_fresh_process_is_given_the_run_it_was_planned_as():
    argv = ["--rows", "hopper", "rlpd", "--seeds", "2", "--eval-episodes", "10", "--override", "algo.tau=0.01"]
    for run in sac.planned(sac.parse(argv)):
        given = sac.run_of(sac.parse(sac.one_command(run)[3:]))
        assert (given.row, given.side, given.config, given.seed) == (run.row, run.side, run.config, run.seed)
        assert (given.steps, given.eval_every, given.eval_episodes) == (run.steps, run.eval_every, run.eval_episodes)
        assert given.overrides() == run.overrides() and run.overrides()[0] == "algo.tau=0.01"
    raysim.load_config("hopper_sac", ["algo.demonstrations=''"])  # the no-demonstrations side's override loads


def test_phase_seconds_and_gradient_steps_sum_over_rows_that_each_stand_for_several_iterations():
    rows = [
        {"iteration": 2, "env_steps": 128, "time_collect": 1.0, "time_update": 2.0, "replay_ratio": 0.5},
        {"iteration": 5, "env_steps": 320, "time_collect": 0.5, "time_update": 4.0, "time_checkpoint": 1.0},
        {"iteration": 6, "env_steps": 384, "time_collect": 0.25, "time_update": 3.0, "replay_ratio": 1.0},
    ]
    assert sac.phase_sums(rows) == {"collect_seconds": 3.75, "update_seconds": 19.0, "checkpoint_seconds": 3.0}
    assert sac.gradient_steps(rows) == 64 + 0 + 64


@pytest.mark.parametrize("layer_norm", [False, True])
def test_the_critics_as_a_loop_compute_what_the_batched_ensemble_computes(layer_norm):
    torch.manual_seed(0)
    batched = QEnsemble(3, 5, [8, 8], "relu", layer_norm)
    loop = sac.QLoop(3, 5, [8, 8], "relu", layer_norm)
    with torch.no_grad():
        for c, net in enumerate(loop.nets):
            linears = [m for m in net if isinstance(m, torch.nn.Linear)]
            for i, linear in enumerate(linears):
                linear.weight.copy_(batched.weights[i][c].T)
                linear.bias.copy_(batched.biases[i][c, 0])
            for i, norm in enumerate(m for m in net if isinstance(m, torch.nn.LayerNorm)):
                norm.weight.copy_(batched.norms[i][c, 0])
                norm.bias.copy_(batched.norms[i][c, 1])
    x = torch.randn(7, 5)
    assert torch.allclose(loop(x), batched(x), atol=1e-5) and loop(x).shape == (3, 7)


def test_the_update_cost_learner_takes_the_loop_of_critics_for_its_critics_and_their_targets():
    pytest.importorskip("mujoco")
    learner = sac.cost_learner(10, True, ())
    algorithm = learner.algorithm
    assert isinstance(algorithm.qf, sac.QLoop) and isinstance(algorithm.qf_target, sac.QLoop)
    assert len(algorithm.qf.nets) == 10 and algorithm.config.critic_subset == 2 and algorithm.config.actor_q == "mean"
    assert isinstance(sac.cost_learner(2, False, ()).algorithm.qf, QEnsemble)


def test_the_update_cost_times_each_variant_with_2_and_10_critics_on_a_full_buffer(tmp_path, capsys):
    pytest.importorskip("mujoco")
    argv = ["--rows", "update-cost", "--cost-steps", "1", "--cost-rounds", "2", "--cost-warmup", "1"]
    assert sac.main([*argv, "--cost-buffer", "512", "--out", str(tmp_path)]) == 0
    (line,) = read_results(tmp_path / "results.jsonl")
    assert line["steps"] == 2 and line["batch_size"] == 256 and line["torch_threads"] == 1  # steps rounded up to even
    assert set(line["variants"]) == {"raysim", "raysim-loop", "cleanrl"} and len(line["loads"]) == 3
    for figures in line["variants"].values():
        for critics in ("2", "10"):
            times = figures[critics]["seconds"]
            assert len(times) == 2 and figures[critics]["steps_per_s"] == pytest.approx(4 / sum(times))
            assert figures[critics]["ms_per_step"] * figures[critics]["steps_per_s"] == pytest.approx(1000)
    out = capsys.readouterr().out
    assert "| raysim, critics as a loop (QLoop) |" in out and "cost 10 / 2 |" in out


def test_the_variants_of_the_update_cost_take_turns_the_first_rotating_from_round_to_round(monkeypatch):
    calls = []

    def timer(name):
        return lambda: calls.append(name) or 1.0

    monkeypatch.setattr(
        sac, "raysim_timer", lambda critics, loop, *_: timer(f"{'loop' if loop else 'raysim'}{critics}")
    )
    monkeypatch.setattr(sac, "cleanrl_timer", lambda critics, *_: timer(f"cleanrl{critics}"))
    args = sac.parse(["--rows", "update-cost", "--cost-rounds", "3", "--cost-steps", "4"])
    result = sac.update_cost(sac.planned(args)[0], args)
    keys = ["raysim2", "loop2", "cleanrl2", "raysim10", "loop10", "cleanrl10"]
    assert calls == keys + keys[1:] + keys[:1] + keys[2:] + keys[:2]
    assert result["variants"]["raysim-loop"]["10"] == {"seconds": [1.0] * 3, "steps_per_s": 4.0, "ms_per_step": 250.0}


def stand_in(tmp_path: Path) -> Path:
    """A stand-in for the rlpd row's config: ``hopper_sac``'s settings on pick-place-v3, small networks."""
    settings = yaml.safe_load((ROOT / "raysim" / "configs" / "hopper_sac.yaml").read_text())
    env = {"benchmark": "MT1", "tasks": "pick-place-v3", "goals": "sampled", "max_episode_steps": 100}
    settings["env"] = {"id": "raysim/MetaWorld", "kwargs": env, "num_envs": 1, "success": "any"}
    settings["model"]["hidden_sizes"] = [16, 16]
    settings["eval"].update(episodes=2, num_envs=2)
    path = tmp_path / "stand_in.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.mark.slow  # records demonstrations, trains BC and two runs on Meta-World: ~8-15 s
def test_the_rlpd_row_records_the_seeds_demonstrations_and_sets_its_runs_beside_grpo(tmp_path, capsys, monkeypatch):
    pytest.importorskip("metaworld")
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    grpo = tmp_path / "finetune.jsonl"
    grpo.write_text("".join(json.dumps(line) + "\n" for line in finetune_lines()))
    argv = ["--rows", "rlpd", "--rlpd-config", str(stand_in(tmp_path)), "--demos", "1", "--seeds", "1", "--local"]
    argv += ["--bc-updates", "20"]
    argv += ["--steps", "128", "--eval-every", "64", "--override", "algo.learning_starts=64", "--override"]
    argv += ["algo.batch_size=16", "--finetune-results", str(grpo), "--out", str(tmp_path / "out")]
    assert sac.main(argv) == 0
    lines = read_results(tmp_path / "out" / "results.jsonl")
    assert [(line["side"], line["demonstrations"]) for line in lines] == [
        ("raysim", "raysim/pick-place-v3/expert-1-s1-rlpd-v0"),
        ("raysim-no-demos", ""),
    ]
    assert (tmp_path / "datasets" / "raysim" / "pick-place-v3" / "expert-1-s1-rlpd-v0").is_dir()
    assert [line.get("pretrained") for line in lines] == [str(tmp_path / "out" / "bc" / "s1"), None]
    assert (tmp_path / "out" / "bc" / "s1" / "checkpoints").is_dir()  # BC on the demonstrations, the actor's start
    for line in lines:
        assert [point[0] for point in line["evals"]] == [64, 128] and line["eval_successes"] is not None
    out = capsys.readouterr().out
    assert "| GRPO fine-tuned from BC-5 (500,000 env steps; raysim bench finetune) | 199/500 (0.40) |" in out
    assert "success >= 0.8 within 128 env steps on seeds 1: NOT met" in out


def test_a_config_the_rlpd_row_cannot_load_is_named_in_one_line_before_anything_runs(tmp_path, capsys):
    assert sac.main(["--rows", "hopper", "rlpd", "--rlpd-config", "no_such_config", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raysim bench sac: --rlpd-config no_such_config: config file")
    assert not (tmp_path / "results.jsonl").exists()


def line_of(row: str, side: str, seed: int, **figures) -> dict:
    """A results line as ``record`` writes it, with the figures given."""
    line = {"bench": "sac", "row": row, "side": side, "config": "hopper_sac", "seed": seed, "steps": 50_000}
    line.update(eval_every=10_000, eval_episodes=10, settings=[], demonstrations=None, host="vm", cpus=2)
    line.update(started=f"2026-12-07T0{seed}:00:00+00:00", finished=f"2026-12-07T0{seed}:30:00+00:00")
    line.update(load_start=[1.0, 1.0, 1.0], versions={"torch": "2.13.0", "gymnasium": "1.4.0", "mujoco": "3.3.0"})
    line.update(env_steps=50_000, startup_seconds=None, evals=[], training_return=None, eval_successes=None)
    line.update(train_seconds=600.0, collect_seconds=40.0, update_seconds=550.0, updates_per_s=80.0)
    return {**line, "env_steps_per_s": line["env_steps"] / line["train_seconds"], **figures}


def finetune_lines() -> list[dict]:
    """GRPO fine-tuned from BC-5 as ``raysim bench finetune`` records it (docs/finetuning.md's figures)."""
    return [
        {"row": "grpo_finetune", "seed": s, "steps": 500_000, "eval_successes": k, "eval_episodes": 500}
        for s, k in ((1, 199), (2, 445), (3, 304))
    ]


def test_the_tables_give_welchs_interval_the_wall_clock_ratio_the_cost_ratio_and_where_rlpd_reached_08(tmp_path):
    lines = [line_of("hopper", "cleanrl", s, eval_mean=1000.0 + 100 * s, training_return=900.0 + s) for s in (1, 2, 3)]
    lines += [line_of("hopper", "raysim", s, eval_mean=1500.0 + 100 * s, training_return=800.0 + s) for s in (1, 2, 3)]
    lines += [line_of("wallclock", "cleanrl", 1, steps=100_000, env_steps=100_000, train_seconds=1000.0)]
    lines += [line_of("wallclock", "raysim", 1, steps=100_000, env_steps=100_032, train_seconds=800.0)]
    cost = {v: {"2": {"steps_per_s": 50.0, "ms_per_step": 20.0}, "10": {"steps_per_s": 20.0, "ms_per_step": 50.0}}
            for v in ("raysim", "raysim-loop", "cleanrl")}  # fmt: skip
    lines += [line_of("update-cost", "all", 1, variants=cost, loads=[[1.5], [2.5]], batch_size=256, torch_threads=1)]
    rlpd = {"row": "rlpd", "config": "metaworld_pick_place_rlpd", "steps": 150_000, "eval_episodes": 100}
    evals = [[25_000, 1.0, 0.1], [50_000, 1.0, 0.85], [150_000, 1.0, 0.9]]
    lines += [line_of(**rlpd, side="raysim", seed=s, evals=evals, eval_successes=90, demo_episodes=5) for s in (1, 2)]
    lines += [line_of(**rlpd, side="raysim", seed=3, evals=evals[:1], eval_successes=10, demo_episodes=5)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "finetune.jsonl").write_text("".join(json.dumps(line) + "\n" for line in finetune_lines()))
    text = sac.table(read_results(tmp_path / "results.jsonl"), sac.grpo_lines(tmp_path / "finetune.jsonl"))
    assert "2026-12-07T01:00:00+00:00 to 2026-12-07T03:30:00+00:00 UTC, vm (2 cores), load 1.00-1.00" in text
    assert "| raysim | 50,000 | 1,2,3 | 1,600.0 / 1,700.0 / 1,800.0 | 1,700.0 +- 100.0 |" in text
    assert "- raysim - CleanRL sac_continuous_action: final evaluation +500.0 (Welch 95% +" in text
    assert "above: met); last 10 training episodes -100.0 (Welch 95% " in text and "above: NOT met)" in text
    assert "training seconds per env step 0.80x (target <= 1x, no slower: met)" in text
    assert "| raysim | 1 | 100,032 | 800.0 | 40.0 (5%) | 550.0 (69%) | 210.0 |" in text
    assert "| raysim, critics as a loop (QLoop) | 50.0 | 20.00 | 20.0 | 50.00 | 2.50x |" in text
    assert "load 1.50-2.50 over the rounds" in text
    assert (
        "| raysim, 5 expert episodes, metaworld_pick_place_rlpd, 150,000 env steps | 90/100 (0.90); 0.8 first at "
        "50,000 | 90/100 (0.90); 0.8 first at 50,000 | 10/100 (0.10); 0.8 not reached |"
    ) in text
    assert "| GRPO fine-tuned from BC-5 (500,000 env steps; raysim bench finetune) | 199/500 (0.40) | 445/500" in text
    assert "within 150,000 env steps on seeds 1, 2, 3: NOT met; above GRPO fine-tuned from BC-5 on every seed " in text
    assert "(0.90 vs 0.40, 0.90 vs 0.89, 0.10 vs 0.61): NOT met" in text


def test_the_pages_tables_are_the_ones_the_recorded_results_give():
    lines = read_results(RECORDED / "results.jsonl")
    page = PAGE.read_text()
    if not lines:  # not measured yet: the page says where its tables will come from
        assert "TO BE FILLED" in page
        return
    text = sac.table(lines, sac.grpo_lines(sac.FINETUNE_RESULTS))
    assert (RECORDED / "sac.md").read_text() == text, "run raysim bench sac --table --out benchmarks/results/sac again"
    assert text.strip() in page, f"copy {RECORDED / 'sac.md'} into {PAGE} again"


def test_the_page_states_hopper_sacs_settings_as_the_config_has_them():
    config = raysim.load_config("hopper_sac")
    stated = dict(re.findall(r"`((?:algo|model|replay|eval)\.[a-z_]+): ([^`]+)`", PAGE.read_text()))
    assert len(stated) >= 8
    for key, value in stated.items():
        section, name = key.split(".")
        assert yaml.safe_load(value) == getattr(getattr(config, section), name), key
