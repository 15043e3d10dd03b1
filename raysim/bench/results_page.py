"""The results docs page (``raysim bench mujoco --table``): per task one table over seeds and one curve picture.

Each task (config) gets one table: a row per seed of each group (peer, settings, budget; runs with
overrides apart from the packaged ones) and the group's mean +- std over seeds, CleanRL's published
anchor beside it; the date, machine and load of its runs once; the command that runs each group
again; where the results hold overlapped runs of a config (``algo.max_policy_lag`` > 0) and lockstep
ones (0), otherwise alike, the difference of means with its Welch 95% interval; and a picture
``<page>-<config>.png`` beside the page: each group's training return, mean line and min-max band
over seeds.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import numpy as np

from raysim.bench.results import (
    ANCHORS,
    LAG,
    LAST_EPISODES,
    MUJOCO_SETTING,
    SB3_ZOO,
    SB3_ZOO_LABEL,
    SCRIPTED,
    SMOOTH,
    mean_std,
    mujoco_setting,
    overrides,
    run_lag,
    run_settings,
    settings_label,
    simulates_with_mujoco,
    smoothed,
)
from raysim.bench.welch import welch
from raysim.evaluation import wilson

HEADER = (
    "| settings | budget | seed | training return (last 10 episodes) | deterministic eval (mean return) "
    "| eval success k/n (Wilson 95% lower) | training s |\n|---|---|---|---|---|---|---|"
)
GRID = 200  # points of the band's common env-step grid


def write_page(results: list[dict], out: Path, page: Path) -> list[Path]:
    """Write the page and its pictures (curves read from the results folder ``out``); the paths written."""
    page.parent.mkdir(parents=True, exist_ok=True)
    written = []
    sections = []
    for config_name in sorted({r["config"] for r in results}):
        rows = [r for r in results if r["config"] == config_name]
        picture = page.with_name(f"{page.stem}-{config_name}.png")
        if draw_bands(config_name, rows, out, picture):
            written.append(picture)
        sections.append(task_section(config_name, rows, picture.name if picture in written else None))
    source = out / "results.jsonl"
    page.write_text(
        "# Results over seeds\n\n"
        f"Written by `raysim bench mujoco --table` from `{source}` (do not edit by hand). Per task, each seed's "
        f"CleanRL measure (the mean return of the last {LAST_EPISODES} training episodes), the deterministic "
        "evaluation of the final policy, and the training seconds (start-up and evaluation excluded); each group "
        "(peer, settings, budget) ends with its mean +- std over seeds (sample std). The anchors are CleanRL's "
        "published `ppo_continuous_action.py` figures at 1M env steps on the MuJoCo v4 envs (training return), and "
        "SB3 + RL Zoo's published PPO models at 1M steps with the Zoo's tuned settings on the v3 envs (one model "
        "each, its deterministic evaluation over 10 episodes: a spread over episodes, not seeds); raysim's runs "
        "use v5, with the same dynamics and rewards. Meta-World tasks count an episode's success at any step (the "
        "benchmark's count), list each task's successes where a config has several, with the unweighted mean over "
        "tasks, and add two rows evaluated on the same episodes without training: the task's scripted expert "
        "(`metaworld.policies`) and uniform random actions (`raysim eval --policy expert|random`).\n\n"
        + "\n".join(sections)
    )
    return [page, *written]


def task_section(config_name: str, rows: list[dict], picture: str | None) -> str:
    """The task's heading, the note on its runs, its table, each group's command, the overlap-vs-lockstep line,
    its picture."""
    env = rows[0]["env"]
    lines = [f"## {config_name} ({env})", "", provenance(rows), "", HEADER]
    for key, group in groups(rows).items():
        peer, settings, steps = key
        label = settings_label(peer, settings)
        budget = "- (evaluated only)" if peer in SCRIPTED else f"{steps:,}"
        for r in sorted(group, key=lambda r: r["seed"]):
            lines.append(
                f"| {label} | {budget} | {r['seed']} | {number(r.get('training_return'))} "
                f"| {number(r.get('eval_mean'))} | {success(r)} | {number(r.get('train_seconds'))} |"
            )
        training, evaluation, seconds = (
            [r.get(k) for r in group] for k in ("training_return", "eval_mean", "train_seconds")
        )
        seeds = f"{len(group)} seed{'s' if len(group) > 1 else ''}"
        lines.append(
            f"| {label} | {budget} | **mean +- std ({seeds})** | {over_seeds(training)} "
            f"| {over_seeds(evaluation)} | {pooled_success(group)} | {over_seeds(seconds)} |"
        )
    lines.extend(anchor_rows(env))
    lines.extend(per_task_table(rows))
    lines.extend(["", "To run a group again:", ""])
    lines.extend(
        f"- {settings_label(key[0], key[1])}: `{command(config_name, key, group)}`"
        for key, group in groups(rows).items()
    )
    lines.append("")
    lines.extend(overlap_lines(rows))
    if picture:
        lines.extend([f"![{config_name}: training return over seeds, mean and min-max band]({picture})", ""])
    return "\n".join(lines)


def command(config_name: str, key: tuple, group: list[dict]) -> str:
    """The command that runs a group again: its peer, seeds, budget, evaluation episodes and settings."""
    peer, settings, steps = key
    seeds = " ".join(str(seed) for seed in sorted(r["seed"] for r in group))
    words = ["raysim bench mujoco --configs", config_name, "--seeds", seeds, "--peers", peer]
    words += [] if peer in SCRIPTED else ["--steps", str(steps)]
    episodes = {r.get("eval_episodes") for r in group} - {None}
    if len(episodes) == 1:
        words += ["--eval-episodes", str(episodes.pop())]
    return " ".join(words + [f"--override {o}" for o in settings if not o.startswith(MUJOCO_SETTING)])


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows by (peer, settings, budget): raysim's packaged runs first, then its overrides, then the peers."""
    found: dict[tuple, list[dict]] = {}
    for r in rows:
        found.setdefault((r["peer"], run_settings(r), r["steps"]), []).append(r)
    return dict(sorted(found.items(), key=lambda item: (item[0][0] != "raysim", item[0][0], item[0][1], item[0][2])))


def provenance(rows: list[dict]) -> str:
    """Once per table: when the runs finished, on what machine, and the 1-minute load average around them;
    each says how many runs recorded none (rows from before the runs recorded them)."""
    days = sorted({r["finished"][:10] for r in rows if r.get("finished")})
    when = (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}") if days else "not recorded"
    hosts = ", ".join(sorted({f"{r['host']} ({r['cpus']} CPUs)" for r in rows if r.get("host")})) or "not recorded"
    load = [r for r in rows if r.get("load_start") and r.get("load_end")]
    if load:
        start = [r["load_start"][0] for r in load]
        end = [r["load_end"][0] for r in load]
        busy = f"1-minute load average at run start {min(start):.2f}-{max(start):.2f}"
        busy += f", at end {min(end):.2f}-{max(end):.2f}"
    else:
        busy = "not recorded"
    when += unrecorded(rows, "finished")
    hosts += unrecorded(rows, "host")
    busy += unrecorded(rows, "load_end")
    line = f"Runs finished: {when}. Machine: {hosts}. Load: {busy}."
    if simulates_with_mujoco(rows[0]["env"]):  # the version of what the task steps
        mujoco = ", ".join(sorted({r["mujoco"] for r in rows if r.get("mujoco")})) or "not recorded"
        line += f" MuJoCo: {mujoco}{unrecorded(rows, 'mujoco')}."
    return line


def unrecorded(rows: list[dict], key: str) -> str:
    """`` (k of n runs recorded none)`` when some but not all rows lack ``key``; else nothing."""
    missing = sum(1 for r in rows if not r.get(key))
    return f" ({missing} of {len(rows)} runs recorded none)" if 0 < missing < len(rows) else ""


def over_seeds(values: list[float | None]) -> str:
    """``mean +- std`` over the seeds (sample std); the value alone for one seed, whose spread is unknown."""
    values = [v for v in values if v is not None]
    return number(values[0]) if len(values) == 1 else mean_std(values)


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def success(row: dict) -> str:
    """``k/n (Wilson 95% lower end)``, or "-" where the task defines no success."""
    if row.get("eval_successes") is None:
        return "-"
    return f"{row['eval_successes']}/{row['eval_episodes']} ({row['eval_success_lower']:.3f})"


def pooled_success(group: list[dict]) -> str:
    """The seeds' successes pooled ``K/N (Wilson 95% lower)`` and the lowest seed's lower end."""
    scored = [r for r in group if r.get("eval_successes") is not None]
    if not scored:
        return "-"
    k, n = sum(r["eval_successes"] for r in scored), sum(r["eval_episodes"] for r in scored)
    lowest = min(r["eval_success_lower"] for r in scored)
    return f"{k:,}/{n:,} ({wilson(k, n)[0]:.3f}); lowest seed {lowest:.3f}"


def per_task_table(rows: list[dict]) -> list[str]:
    """A multi-task config's evaluation per task: a column per run (group and seed), each task's successes
    ``k/c (Wilson 95% lower)``, and the unweighted mean of the per-task rates (each task counts the same)."""
    runs = [(key, r) for key, group in groups(rows).items() for r in sorted(group, key=lambda r: r["seed"])]
    runs = [(key, r) for key, r in runs if r.get("eval_tasks")]
    if not runs:
        return []
    names = list(runs[0][1]["eval_tasks"])
    lines = [
        "",
        "Per task (evaluation episode j plays task j mod K):",
        "",
        "| task | " + " | ".join(f"{settings_label(key[0], key[1])}, seed {r['seed']}" for key, r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for name in names:
        cells = []
        for _, r in runs:
            k, c = r["eval_tasks"].get(name, (None, 0))
            cells.append(f"{k}/{c} ({wilson(k, c)[0]:.3f})" if c else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    means = [
        f"{statistics.fmean(k / c for k, c in r['eval_tasks'].values()):.3f}"
        if all(c for _, c in r["eval_tasks"].values())
        else "- (a task completed no episode)"
        for _, r in runs
    ]
    lines.append("| **mean over tasks (unweighted)** | " + " | ".join(means) + " |")
    return lines


def anchor_rows(env: str) -> list[str]:
    """The published figures for the env, as table rows (none for tasks without any)."""
    base = env.split("-")[0]
    rows = []
    if base in ANCHORS:
        mean, std = ANCHORS[base]
        rows.append(f"| CleanRL, published (v4) | 1,000,000 | - | {mean:,.1f} +- {std:,.1f} | - | - | - |")
    if base in SB3_ZOO:
        mean, std = SB3_ZOO[base]
        rows.append(f"| {SB3_ZOO_LABEL} | 1,000,000 | - | - | {mean:,.1f} +- {std:,.1f} | - | - |")
    return rows


def overlap_lines(rows: list[dict]) -> list[str]:
    """Overlapped (``algo.max_policy_lag`` > 0) minus lockstep (0) runs of the config, at each budget and MuJoCo
    both hold with no other setting apart: the difference of means of each measure with its Welch 95% interval."""
    lines = []
    for steps, mujoco in sorted({(r["steps"], mujoco_setting(r)) for r in rows}):
        alike = [
            r
            for r in rows
            if r["peer"] == "raysim" and r["steps"] == steps and mujoco_setting(r) == mujoco and not other_settings(r)
        ]
        lag = {id(r): run_lag(r) or 0 for r in alike}
        overlapped = [r for r in alike if lag[id(r)] > 0]
        lockstep = [r for r in alike if lag[id(r)] == 0]
        if not overlapped or not lockstep:
            continue
        lags = ", ".join(str(n) for n in sorted({lag[id(r)] for r in overlapped}))
        head = f"Overlapped (`{LAG}` {lags}) - lockstep (`{LAG}` 0), {steps:,} steps"
        head += "".join(f", `{setting}`" for setting in mujoco)
        if len(overlapped) < 2 or len(lockstep) < 2:
            lines += [f"{head}: Welch's interval needs two seeds of each ({len(overlapped)} and {len(lockstep)}).", ""]
            continue
        parts = []
        for key, name in (("training_return", "training return"), ("eval_mean", "deterministic eval")):
            a, b = [r.get(key) for r in overlapped], [r.get(key) for r in lockstep]
            if None in a or None in b:
                continue
            d = welch(a, b)
            ratio = (
                f", overlapped mean {100 * (statistics.fmean(a) / statistics.fmean(b) - 1):+.1f}% against lockstep's"
            )
            parts.append(
                f"{name} {d.difference:+,.1f} (95% Welch interval {d.low:+,.1f} to {d.high:+,.1f}, {d.dof:.1f} dof"
                f"{ratio if statistics.fmean(b) > 0 else ''})"
            )
        lines += [f"{head}, {len(overlapped)} vs {len(lockstep)} seeds: " + "; ".join(parts) + ".", ""]
    return lines


def other_settings(row: dict) -> tuple[str, ...]:
    """The run's overrides apart from the policy lag."""
    return tuple(o for o in overrides(row) if not o.startswith(f"{LAG}="))


def read_curve(out: Path, row: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """A run's training curve (env steps, return smoothed over ``SMOOTH`` rows); None where its file is gone."""
    path = out / row["curve"]
    if not path.is_file():
        return None
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    x = np.array([float(r["env_steps"]) for r in rows])
    return x, np.array(smoothed([float(r["episode_return"]) for r in rows]))


def draw_bands(config_name: str, rows: list[dict], out: Path, path: Path) -> bool:
    """One picture for the task: per group, the mean over seeds and its min-max band on a common env-step grid
    (where every seed's curve has points); whether there was a curve to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=80, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    drawn = False
    for color, ((peer, settings, steps), group) in enumerate(groups(rows).items()):
        curves = [c for c in (read_curve(out, r) for r in group) if c is not None]
        if not curves:
            continue
        start, end = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
        grid = np.linspace(start, end, GRID) if end > start else np.array([end])
        ys = np.stack([np.interp(grid, x, y) for x, y in curves])
        label = f"{settings_label(peer, settings).replace('`', '')}, {steps:,} steps ({len(curves)} seeds)"
        axes.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=f"C{color}", alpha=0.2)
        axes.plot(grid, ys.mean(axis=0), color=f"C{color}", lw=2, label=f"{label}: mean, min-max band")
        drawn = True
    if not drawn:
        return False
    base = rows[0]["env"].split("-")[0]
    if base in ANCHORS:
        axes.axhline(ANCHORS[base][0], color="grey", linestyle="--", label="CleanRL published, 1M (v4)")
    axes.set(
        title=f"{config_name} ({rows[0]['env']})",
        xlabel="env steps",
        ylabel=f"training episode return (mean of {SMOOTH} rows)",
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path)
    return True
