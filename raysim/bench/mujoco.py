"""MuJoCo locomotion benchmark: raysim's MuJoCo configs against CleanRL's published returns and a peer.

For each config, seed and step budget, ``raysim`` trains the packaged config (``raysim.Trainer``, shards
and learner as Ray actors) and ``cleanrl`` trains ``benchmarks/cleanrl_ppo_continuous.py`` (CleanRL's
``ppo_continuous_action.py``, its settings and wrappers) on the same Gymnasium id. Each run reports
CleanRL's measure, the mean raw training episodic return over the last 10 episodes, a deterministic
evaluation of the final policy (quota-balanced, ``--eval-episodes``, by default the config's
``eval.episodes``: 20 for MuJoCo, 100 for CartPole, 400 for Reach), and its training seconds (start-up and
evaluation excluded). Where the task defines success (the native ``reach_ppo``: ``raysim/Reach``; Meta-
World), the evaluation's successes k of its n episodes and the lower end of their Wilson 95% interval too,
and per task where the env has several (``eval_tasks``); the peer runs only the configs on Gymnasium ids,
and MuJoCo is needed only by those. On an env with a scripted expert (``raysim/MetaWorld``) ``expert`` and
``random`` are evaluated once (``raysim eval --policy``, the trained policy's episodes, no training)
beside the seeds: the task's ceiling and floor. Each finished run is appended to ``results.jsonl`` in the
output folder as it ends, so a later invocation runs only the runs still missing; the training curves go
to ``curves/*.csv`` and ``curves.png``, the table to ``table.md`` and stdout. A line records the run's
overrides and its machine, load and dates (``raysim.bench.results``); runs at other settings than the
config as packaged now (``run_settings``) are apart from the packaged ones, and not skipped for them.
``--table`` trains nothing: it writes the docs page of every task in the results, one table over seeds and
one curve picture each (``raysim.bench.results_page``).

``raysim bench mujoco`` or ``python benchmarks/locomotion.py`` (``--configs``, ``--seeds`` (1-5 by default),
``--steps``, ``--peer-steps``, ``--quick``, ``--override``; ``--table [--docs PAGE]``; needs
``pip install "raysim[mujoco]"``).
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from raysim.algos import algorithm_class
from raysim.bench.peers import MISSING, peer_module
from raysim.bench.results import (
    ANCHORS,
    LAST_EPISODES,
    MUJOCO_SETTING,
    SB3_ZOO,
    SB3_ZOO_LABEL,
    SCRIPTED,
    SMOOTH,
    installed_version,
    load,
    machine,
    mean_std,
    now,
    read_results,
    run_key,
    run_name,
    run_settings,
    settings_label,
    simulates_with_mujoco,
    smoothed,
)
from raysim.evaluation import wilson

if TYPE_CHECKING:
    from raysim.config import Config
    from raysim.evaluation import EvalReport

SCRIPTED_ENVS = ("raysim/MetaWorld",)  # the envs with a scripted expert: SCRIPTED evaluated there, not trained
PEERS = ("raysim", "cleanrl", *SCRIPTED)
CONFIGS = ("halfcheetah_ppo", "hopper_ppo")
RECORDED = Path("benchmarks/results")  # the repository's recorded runs, relative to a checkout's root


def env_id(config_name: str) -> str:
    """The env id a packaged config trains, as the config names it (``gym:HalfCheetah-v5``, ``raysim/Reach``); read
    without the checks across keys, so a config with a key left to set (``reach_camera_distill``'s ``algo.teacher``,
    given as a run's override) names its env too."""
    import raysim

    return raysim.load_config(config_name, check=False).env.id


def env_of(config_name: str) -> str:
    """The Gymnasium id a packaged config trains (``gym:HalfCheetah-v5`` -> ``HalfCheetah-v5``), else its env id."""
    return env_id(config_name).removeprefix("gym:")


def packaged(config_name: str) -> Config:
    """The packaged config: its budget (``train.total_steps``) and evaluation episodes are a run's defaults."""
    import raysim

    return raysim.load_config(config_name)


def on_gymnasium(config_name: str) -> bool:
    """Whether the config trains a Gymnasium id (``gym:...``): only those need MuJoCo and have the peer."""
    return env_id(config_name).startswith("gym:")


def last_episodes_return(curve: list[tuple[int, float, int]], last: int = LAST_EPISODES) -> float | None:
    """Mean return of the last ``last`` training episodes; a curve row ``(env_steps, mean return, episodes)``
    stands for its episodes (the rows of raysim's metrics are per log step)."""
    total, count = 0.0, 0
    for _, mean, episodes in reversed(curve):
        if count >= last:
            break
        total, count = total + mean * episodes, count + episodes
    return total / count if count else None


def train_raysim(config_name: str, seed: int, steps: int, run_dir: Path, args: argparse.Namespace):
    """One raysim run through Ray actors; its curve (one row per iteration) and its final evaluation."""
    import raysim
    from raysim.records import read_metrics
    from raysim.storage import open_storage

    shutil.rmtree(run_dir, ignore_errors=True)  # a run interrupted before it finished starts again
    config = raysim.load_config(
        config_name,
        [
            f"seed={seed}",
            f"train.total_steps={steps}",
            *([f"eval.episodes={args.eval_episodes}"] if args.eval_episodes else []),
            "train.log_every=1",
            "train.sinks=[parquet]",
            f"run_dir={run_dir}",
            *args.override,
        ],
    )
    summary = raysim.Trainer(config, address=args.address).train()
    if summary.evaluation is None:  # stopped (a signal) before its final evaluation: nothing to record
        raise SystemExit(f"raysim bench: {run_dir} stopped ({summary.stopped_by}) before its evaluation: not recorded")
    rows = read_metrics(open_storage(str(run_dir)))
    curve = [(int(r["env_steps"]), r["episode_return"], int(r["episodes"])) for r in rows if r.get("episodes")]
    return {
        "env_steps": summary.env_steps,
        "train_seconds": summary.wall_time,
        "startup_seconds": summary.startup_time,
        **evaluation_result(summary.evaluation),
        "layout": layout(config),
        "max_policy_lag": config.algo.max_policy_lag,
    }, curve


def layout(config: Config) -> str:
    """Shards x rows x steps of a chunk (a GRPO round: its step limit); an algorithm without shards (BC): none."""
    if algorithm_class(config.algo.name).collection(config.algo) is None:
        return "no shards (the learner on a dataset)"
    return f"{config.shards.count} shard(s) x {config.env.num_envs} env(s) x {config.algo.num_steps} steps"


def evaluation_result(report: EvalReport) -> dict:
    """What a results line keeps of an evaluation: the returns, the successes k, and per task ``[k, c]`` where the
    env has several tasks (``eval_tasks``, None otherwise)."""
    rate = report.success_rate
    tasks = {name: [task.success_rate.numerator, task.completed] for name, task in report.tasks.items()}
    return {
        "eval_returns": [record["return"] for record in report.records],
        "eval_successes": rate.numerator if rate is not None else None,
        "eval_tasks": tasks if tasks and rate is not None else None,
    }


def train_cleanrl(config_name: str, seed: int, steps: int, run_dir: Path, args: argparse.Namespace):
    """One run of the CleanRL-style peer on the config's Gymnasium id (CleanRL's own settings)."""
    episodes = args.eval_episodes or packaged(config_name).eval.episodes
    result = peer_module("cleanrl_ppo_continuous").train(env_of(config_name), seed, steps, episodes)
    curve = [(step, episode_return, 1) for step, episode_return in result["curve"]]
    return {
        "env_steps": result["env_steps"],
        "train_seconds": result["train_seconds"],
        "eval_returns": result["eval_returns"],
        "eval_successes": None,
        "layout": "1 env x 2048 steps",
    }, curve


def evaluate_scripted(policy: str, config_name: str, seed: int, steps: int, run_dir: Path, args: argparse.Namespace):
    """The env's scripted expert or uniform random actions (``raysim eval --policy``) on the episodes a trained
    policy of the config is evaluated on (in-process: no Ray): no training, no curve."""
    from raysim.coordinator import evaluate_policy

    episodes = args.eval_episodes or packaged(config_name).eval.episodes
    report = evaluate_policy(config_name, policy, episodes=episodes, backend="local", overrides=args.override)
    return {"env_steps": 0, "train_seconds": 0.0, **evaluation_result(report), "layout": "-"}, []


def scripted(peer: str, config_name: str) -> bool:
    """Whether ``peer`` is a scripted policy (``expert``, ``random``) and the config's env has them."""
    return peer in SCRIPTED and env_id(config_name) in SCRIPTED_ENVS


RUNNERS = {
    "raysim": train_raysim,
    "cleanrl": train_cleanrl,
    **{policy: functools.partial(evaluate_scripted, policy) for policy in SCRIPTED},
}


def run_one(peer: str, config_name: str, seed: int, steps: int, args: argparse.Namespace) -> dict:
    """Train one run, write its curve, and return its result line (``eval_success_lower``: the lower end
    of the Wilson 95% interval of the evaluation's successes, None where the task defines no success;
    ``overrides``: the config overrides of raysim and the scripted policies, none for the peer, which runs its
    own settings)."""
    settings = tuple(args.override) if peer == "raysim" or peer in SCRIPTED else ()
    version = installed_version("mujoco") if simulates_with_mujoco(env_of(config_name)) else None
    name = run_name(peer, config_name, seed, steps, settings + ((f"mujoco={version}",) if version else ()))
    run_dir = args.out / "runs" / name
    doing = "evaluating" if peer in SCRIPTED else f"training {steps:,} env steps in {run_dir}"
    print(f"[{peer} {config_name} seed {seed}: {doing}]", file=sys.stderr, flush=True)
    started, load_start = now(), load()
    result, curve = RUNNERS[peer](config_name, seed, steps, run_dir, args)
    finished, load_end = now(), load()
    curves = args.out / "curves"
    curves.mkdir(parents=True, exist_ok=True)
    with open(curves / f"{name}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["env_steps", "episode_return", "episodes"])
        writer.writerows(curve)
    evals = result.pop("eval_returns")
    successes = result["eval_successes"]
    return {
        "peer": peer,
        "config": config_name,
        "env": env_of(config_name),
        "seed": seed,
        "steps": steps,
        "overrides": list(settings),
        **result,
        "training_return": last_episodes_return(curve),
        "eval_mean": statistics.fmean(evals) if evals else None,
        "eval_std": statistics.pstdev(evals) if evals else None,
        "eval_episodes": len(evals),
        "eval_success_lower": wilson(successes, len(evals))[0] if successes is not None and evals else None,
        "curve": f"curves/{name}.csv",
        **machine(),
        "started": started,
        "finished": finished,
        "load_start": load_start,
        "load_end": load_end,
    }


def successes(rows: list[dict]) -> str:
    """Each run's evaluation successes ``k/n (Wilson 95% lower end)``, in seed order; "-" without success."""
    cells = [
        f"{r['eval_successes']}/{r['eval_episodes']} ({r['eval_success_lower']:.3f})"
        for r in sorted(rows, key=lambda r: r["seed"])
        if r.get("eval_successes") is not None
    ]
    return ", ".join(cells) or "-"


def table(results: list[dict]) -> str:
    """The markdown table: one row per (env, budget, peer, overrides), the anchors, and raysim/peer ratios."""
    lines = [
        "| env | budget | peer | seeds | training return (last 10 episodes) | deterministic eval (mean return) "
        "| eval success k/n (Wilson 95% lower) | training s | layout |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["env"], r["steps"], r["peer"], run_settings(r)), []).append(r)
    for (env, steps, peer, settings), rows in sorted(groups.items()):
        seeds = ",".join(str(r["seed"]) for r in sorted(rows, key=lambda r: r["seed"]))
        name = f"{peer}, {settings_label(peer, settings)}" if settings else peer
        name = settings_label(peer, settings) if peer in SCRIPTED else name
        lines.append(
            f"| {env} | {steps:,} | {name} | {seeds} | {mean_std([r['training_return'] for r in rows])} "
            f"| {mean_std([r['eval_mean'] for r in rows])} | {successes(rows)} "
            f"| {mean_std([r['train_seconds'] for r in rows])} "
            f"| {rows[0]['layout']} |"
        )
    for env in sorted({r["env"] for r in results}):
        base = env.split("-")[0]
        if base in ANCHORS:
            mean, std = ANCHORS[base]
            lines.append(
                f"| {env} | 1,000,000 | CleanRL, published (v4) | - | {mean:,.1f} +- {std:,.1f} | - | - | - | - |"
            )
        if base in SB3_ZOO:
            mean, std = SB3_ZOO[base]
            lines.append(f"| {env} | 1,000,000 | {SB3_ZOO_LABEL} | - | - | {mean:,.1f} +- {std:,.1f} | - | - | - |")
    return "\n".join(lines) + "\n" + ratios(groups)


def ratios(groups: dict[tuple, list[dict]]) -> str:
    """raysim against cleanrl, same env and budget: training seconds per env step (the two round the budget
    to whole iterations differently) and training return, means over seeds."""
    lines = []
    for (env, steps, peer, settings), rows in sorted(groups.items()):
        same_mujoco = tuple(o for o in settings if o.startswith(MUJOCO_SETTING))
        peers = groups.get((env, steps, "cleanrl", same_mujoco))
        if peer != "raysim" or not peers:
            continue

        def mean(key: str, rows: list[dict]) -> float:
            return statistics.fmean(r[key] for r in rows)

        per_step = [statistics.fmean(r["train_seconds"] / r["env_steps"] for r in group) for group in (rows, peers)]
        ratio = per_step[0] / per_step[1]
        name = f"raysim ({settings_label(peer, settings)})" if settings else "raysim"
        line = f"- {env}, {steps:,} steps: {name} / CleanRL-style training seconds per env step {ratio:.2f}x"
        if None not in [r["training_return"] for r in rows + peers]:
            ours, theirs = mean("training_return", rows), mean("training_return", peers)
            ratio = f" ({ours / theirs:.2f}x)" if ours > 0 and theirs > 0 else ""
            line += f"; training return {ours:,.1f} vs {theirs:,.1f}{ratio}"
        lines.append(line)
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def plot(results: list[dict], out: Path) -> Path:
    """Training episode return against env steps, one panel per env, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r["env"] for r in results})
    figure, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4), squeeze=False)
    colors = {"raysim": "tab:blue", "cleanrl": "tab:orange"}
    for axis, env in zip(axes[0], envs, strict=True):
        for r in (r for r in results if r["env"] == env and r["peer"] in colors):  # the scripted rows have no curve
            with open(out / r["curve"]) as f:
                rows = list(csv.DictReader(f))
            x = [int(row["env_steps"]) for row in rows]
            y = smoothed([float(row["episode_return"]) for row in rows])
            axis.plot(
                x, y, color=colors[r["peer"]], alpha=0.7, label=f"{r['peer']} seed {r['seed']}, {r['steps']:,} steps"
            )
        base = env.split("-")[0]
        if base in ANCHORS:
            axis.axhline(ANCHORS[base][0], color="grey", linestyle="--", label="CleanRL published, 1M")
        axis.set(title=env, xlabel="env steps", ylabel=f"training episode return (mean of {SMOOTH} rows)")
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    figure.tight_layout()
    path = out / "curves.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raysim bench mujoco", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs", nargs="+", help=f"packaged configs or YAML files (default: {' '.join(CONFIGS)}; --table: all)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument(
        "--steps", type=int, default=None, help="env steps of each raysim run (default: the config's train.total_steps)"
    )
    parser.add_argument(
        "--peer-steps", type=int, default=None, help="env steps of each peer run (default: the raysim runs')"
    )
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=None,
        help="deterministic evaluation episodes at the end of each run (default: the config's eval.episodes)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results/mujoco"),
        help=f"results folder (the repository's recorded runs: {RECORDED})",
    )
    parser.add_argument("--quick", action="store_true", help="HalfCheetah, seed 1, 20,480 steps: a few minutes")
    parser.add_argument(
        "--address", default="local", help="Ray address of raysim's runs (default: an embedded Ray per run)"
    )
    parser.add_argument(
        "--override", action="append", default=[], help="raysim config override (key=value), repeatable"
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="train nothing: write the docs page of the results (--docs) and its pictures",
    )
    parser.add_argument("--docs", type=Path, default=Path("docs/benchmarks/results.md"), help="the page --table writes")
    args = parser.parse_args(argv)
    if args.quick:
        args.configs, args.seeds, args.steps, args.peer_steps = ["halfcheetah_ppo"], [1], 20_480, 20_480
    if args.configs is None and not args.table:
        args.configs = list(CONFIGS)
    return args


def where_results_are(args: argparse.Namespace) -> str:
    """What to do when ``--out`` holds no results: the repository's recorded ones and the command that tables
    them, where the working directory has them, else run the benchmark first."""
    recorded = read_results(RECORDED / "results.jsonl")
    recorded = [r for r in recorded if args.configs is None or r["config"] in args.configs]
    if not recorded or args.out.resolve() == RECORDED.resolve():
        return "run raysim bench mujoco first, or give --out"
    configs = f" --configs {' '.join(args.configs)}" if args.configs else ""
    command = f"raysim bench mujoco --table{configs} --out {RECORDED} --docs {args.docs}"
    return f"the recorded results are in {RECORDED}: {command}"


def write_table(args: argparse.Namespace) -> int:
    """``--table``: the docs page and its pictures from ``results.jsonl`` (every config, or ``--configs``)."""
    from raysim.bench.results_page import write_page

    path = args.out / "results.jsonl"
    results = [r for r in read_results(path) if args.configs is None or r["config"] in args.configs]
    if not results:
        print(f"raysim bench mujoco: no results in {path}; {where_results_are(args)}", file=sys.stderr)
        return 2
    written = write_page(results, args.out, args.docs)
    tasks = len({r["config"] for r in results})
    print(f"{written[0]}: {tasks} task(s), {len(results)} run(s) from {path}")
    for picture in written[1:]:
        print(f"{picture}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table:
        return write_table(args)
    from raysim.composition import ConfigError

    try:
        gymnasium = [name for name in args.configs if on_gymnasium(name)]
    except ConfigError as error:
        print(f"raysim bench mujoco: {error}", file=sys.stderr)
        return 2
    if gymnasium and importlib.util.find_spec("mujoco") is None:
        print('raysim bench mujoco: MuJoCo is not installed (pip install "raysim[mujoco]")', file=sys.stderr)
        return 2
    peers = [p for p in args.peers if p != "cleanrl" or peer_module("cleanrl_ppo_continuous") is not None]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.jsonl"
    done = {run_key(r) for r in read_results(path)}
    for config_name in args.configs:
        budget = args.steps or packaged(config_name).train.total_steps
        for seed in args.seeds:
            for peer in peers:
                if peer in SCRIPTED and (seed != args.seeds[0] or not scripted(peer, config_name)):
                    continue  # its evaluation does not depend on the training seed: once
                steps = 0 if peer in SCRIPTED else budget if peer == "raysim" else args.peer_steps or budget
                planned = {"peer": peer, "config": config_name, "env": env_of(config_name), "seed": seed}
                planned.update(steps=steps, mujoco=installed_version("mujoco"))
                planned["overrides"] = list(args.override) if peer == "raysim" or peer in SCRIPTED else []
                if run_key(planned) in done or (peer == "cleanrl" and config_name not in gymnasium):
                    continue
                result = run_one(peer, config_name, seed, steps, args)
                with open(path, "a") as f:  # each finished run at once: a later invocation skips it
                    f.write(json.dumps(result) + "\n")
                print(f"[{peer} {config_name} seed {seed}: {json.dumps(result)}]", file=sys.stderr, flush=True)
    results = [r for r in read_results(path) if r["config"] in args.configs]
    text = f"# MuJoCo PPO, {', '.join(args.configs)}\n\n{table(results)}"
    (args.out / "table.md").write_text(text)
    print(text)
    print(f"curves: {plot(results, args.out)}; results: {path}")
    if "cleanrl" in args.peers and "cleanrl" not in peers:
        print(f"\nSkipped cleanrl: {MISSING}")
    return 0
