"""Distillation on raysim/ReachCamera: a camera student taught by a state teacher, against PPO from the camera alone.

Rows per seed: the teacher (``reach_ppo``, PPO on the privileged state, 1M env steps), the student distilled from
that seed's teacher (``reach_camera_distill`` with ``algo.teacher`` its run directory, ``--steps`` env steps,
300k by default) and PPO on the camera from scratch (``reach_camera_ppo``, 1M env steps). Each is scored on its
config's deterministic evaluation (400 episodes) with its Wilson 95% interval, and the table gives each run's
training seconds (the student's: the teacher's plus its own). The issue's target: the student's Wilson lower bound
at least 0.9 on every seed, within 300k env steps of its own.

Each finished run is a line of ``distill.jsonl`` in ``--out``, written as it ends, so a later invocation runs only
the missing ones (``raysim bench mujoco``'s lines: ``raysim.bench.mujoco.run_one``); a run of the same settings
that ``raysim bench mujoco`` measured in ``results.jsonl`` there (PPO from scratch) is taken as it is, and so is
the teacher's where its run directory is there too. The table goes to ``distill.md`` (included by
docs/distillation.md) and stdout. ``--table`` trains nothing.

``raysim bench distill [--seeds 1 2 3] [--steps 300000] [--rows ...] [--out DIR] [--table]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from raysim.bench.results import read_results, run_key, run_name, seeded_rows_parser
from raysim.evaluation import wilson

TEACHER_CONFIG, STUDENT_CONFIG, SCRATCH_CONFIG = "reach_ppo", "reach_camera_distill", "reach_camera_ppo"
RL_STEPS = 1_000_000  # the teacher's and PPO from scratch's budget: the packaged one
TARGET_LOWER, TARGET_STEPS = 0.9, 300_000  # the target for the student, on every seed
STUDENT_STEPS = 299_008  # the student's budget: 146 whole iterations of 64 rows x 32 steps, within TARGET_STEPS
ROWS = ("teacher", "distill", "scratch")
LABELS = {
    "teacher": "teacher: PPO on the state (reach_ppo, 1M env steps)",
    "distill": "student: distilled from it, camera (reach_camera_distill)",
    "scratch": "PPO from the camera, from scratch (reach_camera_ppo, 1M env steps)",
}


def teacher_run_dir(seed: int, args: argparse.Namespace) -> Path:
    """Where the teacher of ``seed`` trained (``run_one``'s run directory): the student's ``algo.teacher``."""
    return args.out / "runs" / run_name("raysim", TEACHER_CONFIG, seed, RL_STEPS, ())


def plan(row: str, seed: int, args: argparse.Namespace) -> tuple[str, int, list[str]]:
    """``(config, steps, overrides)`` of one row's run of ``seed``."""
    if row == "distill":
        return STUDENT_CONFIG, args.steps, [f"algo.teacher={teacher_run_dir(seed, args)}"]
    return (TEACHER_CONFIG if row == "teacher" else SCRATCH_CONFIG), RL_STEPS, []


def run_row(row: str, seed: int, args: argparse.Namespace, done: set[tuple[str, int]]) -> None:
    """Run one row for one seed unless its line is in ``distill.jsonl`` (the student's teacher first), and append
    its line; a run of the same settings in ``results.jsonl`` there is taken as it is (a teacher only with its run
    directory: the student reads it)."""
    from raysim.bench.mujoco import env_of, run_one

    if (row, seed) in done:
        return
    config, steps, overrides = plan(row, seed, args)
    planned = {"peer": "raysim", "config": config, "env": env_of(config), "seed": seed, "steps": steps}
    key = run_key({**planned, "overrides": overrides})
    measured = [line for line in read_results(args.out / "results.jsonl") if run_key(line) == key]
    if measured and (row != "teacher" or teacher_run_dir(seed, args).is_dir()):
        result = measured[-1]
    else:
        if row == "distill":
            run_row("teacher", seed, args, done)
            if not teacher_run_dir(seed, args).is_dir():
                raise SystemExit(
                    f"raysim bench distill: the teacher of seed {seed} ({teacher_run_dir(seed, args)}) is gone: "
                    f"delete its line from {args.out / 'distill.jsonl'} to train it again"
                )
        result = run_one("raysim", config, seed, steps, argparse.Namespace(**{**vars(args), "override": overrides}))
    result = {**result, "row": row}
    with open(args.out / "distill.jsonl", "a") as f:  # each finished run at once: a later invocation skips it
        f.write(json.dumps(result) + "\n")
    done.add((row, seed))
    print(f"[{row} seed {seed}: {result['eval_successes']}/{result['eval_episodes']}]", file=sys.stderr, flush=True)


def cell(line: dict, seconds: str) -> str:
    k, n = line["eval_successes"], line["eval_episodes"]
    low, high = wilson(k, n)
    return f"{k}/{n} ({k / n:.2f}, [{low:.2f}, {high:.2f}]), {seconds}"


def table(lines: list[dict], seeds: list[int]) -> str:
    """One row per method, one column per seed: successes k/n (rate, Wilson 95% interval) and training seconds (the
    student's: its teacher's + its own)."""
    by_row = {(line["row"], line["seed"]): line for line in lines if "row" in line}
    out = ["| method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|" + "---|" * (len(seeds) + 1)]
    for row in ROWS:
        cells = []
        for seed in seeds:
            line, teacher = by_row.get((row, seed)), by_row.get(("teacher", seed))
            if line is None:
                cells.append("-")
            elif row == "distill":
                before = f"{teacher['train_seconds']:,.0f}" if teacher else "?"
                cells.append(cell(line, f"{before} s + {line['train_seconds']:,.0f} s"))
            else:
                cells.append(cell(line, f"{line['train_seconds']:,.0f} s"))
        out.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n" + verdict(by_row, seeds)


def verdict(by_row: dict, seeds: list[int]) -> str:
    """The issue's target: the student's Wilson 95% lower bound at least 0.9 on every seed, with a budget of at most
    300k env steps of its own (its env steps: whole iterations of it)."""
    students = [by_row.get(("distill", s)) for s in seeds]
    if None in students:
        return ""
    lows = [wilson(line["eval_successes"], line["eval_episodes"])[0] for line in students]
    budget = max(line["steps"] for line in students)
    met = all(low >= TARGET_LOWER for low in lows) and max(line["env_steps"] for line in students) <= TARGET_STEPS
    taken = ", ".join(f"{line['env_steps']:,}" for line in students)
    return (
        f"\n- Student: Wilson 95% lower bounds {', '.join(f'{low:.3f}' for low in lows)} (seeds "
        f"{', '.join(map(str, seeds))}) at a budget of {budget:,} env steps ({taken} taken): target (>= "
        f"{TARGET_LOWER} on every seed, <= {TARGET_STEPS:,} env steps) {'met' if met else 'not met'}\n"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = seeded_rows_parser("raysim bench distill", __doc__.split("\n\n")[0], ROWS)
    parser.add_argument(
        "--steps", type=int, default=STUDENT_STEPS, help="env steps of the student (default 299,008: 146 iterations)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "distill.jsonl"
    if not args.table:
        done = {(line["row"], line["seed"]) for line in read_results(path)}
        for seed in args.seeds:
            for row in args.rows:
                run_row(row, seed, args, done)
    text = table(read_results(path), args.seeds)
    (args.out / "distill.md").write_text(text)  # the docs page includes it (docs/distillation.md)
    print(f"# Distillation on ReachCamera: a camera student taught by a state teacher\n\n{text}")
    return 0
