"""From demonstrations to a fine-tuned policy: Meta-World pick-place-v3, every row on the same evaluation episodes.

Rows: uniform random actions, the scripted expert, behaviour cloning from 5, 20 and 100 expert episodes
(``metaworld_pick_place_bc``), PPO from scratch (``metaworld_pick_place_ppo``), and PPO and GRPO fine-tuned
from BC-5's weights (``metaworld_pick_place_ppo_finetune``, ``metaworld_pick_place_grpo_finetune``), the RL
rows at one budget (``--steps``, 500k by default). Each is scored on the same deterministic evaluation
episodes (the configs' ``eval.seed``, sampled goals, success at any step; 500 by default) with its Wilson
95% interval. Per seed the expert's demonstrations are recorded through the evaluation path with a seed of
their own (``1000 + seed``: none is an evaluation episode; episode j depends on j alone, so the 5 are the
first of the 20 and the 20 the first of the 100) into ``<out>/datasets`` (``MINARI_DATASETS_PATH``).

Each finished run is a line of ``finetune.jsonl`` in ``--out``, written as it ends, so a later invocation
runs only the missing ones (``raysim bench mujoco``'s lines: ``raysim.bench.mujoco.run_one``); the table
goes to ``finetune.md`` (included by docs/finetuning.md) and stdout. ``--table`` trains nothing.

``raysim bench finetune [--seeds 1 2 3] [--steps 500000] [--rows ...] [--out DIR] [--table]``; needs
``pip install "raysim[metaworld,demos]"``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from raysim.bench.results import read_results, run_key, seeded_rows_parser
from raysim.evaluation import wilson

DEMOS = (5, 20, 100)
BC_CONFIG = "metaworld_pick_place_bc"
SCRATCH_CONFIG = "metaworld_pick_place_ppo"
FINETUNE_CONFIGS = {"ppo": "metaworld_pick_place_ppo_finetune", "grpo": "metaworld_pick_place_grpo_finetune"}
FINETUNED_FROM = 5  # the BC row the RL rows start from: few demonstrations, where RL has something to add
ROWS = ("random", "expert", *(f"bc{n}" for n in DEMOS), "ppo", "ppo_finetune", "grpo_finetune")
LABELS = {
    "random": "random (uniform actions)",
    "expert": "scripted expert (metaworld.policies)",
    **{f"bc{n}": f"BC from {n} expert episodes" for n in DEMOS},
    "ppo": "PPO from scratch",
    "ppo_finetune": f"PPO fine-tuned from BC-{FINETUNED_FROM}",
    "grpo_finetune": f"GRPO fine-tuned from BC-{FINETUNED_FROM}",
}


def dataset_id(seed: int, episodes: int) -> str:
    return f"raysim/pick-place-v3/expert-{episodes}-s{seed}-v0"


def record(seed: int, episodes: int, args: argparse.Namespace) -> str:
    """The expert's ``episodes`` demonstrations for ``seed`` (recorded once, then found in ``<out>/datasets``)."""
    from raysim.coordinator.demonstrations import record_demonstrations
    from raysim.demos.dataset import locate_dataset

    name = dataset_id(seed, episodes)
    try:
        locate_dataset(name)
    except Exception:  # noqa: BLE001 - not recorded yet
        print(f"[recording {episodes} expert episodes: {name}]", file=sys.stderr, flush=True)
        record_demonstrations(name, episodes, config=BC_CONFIG, policy="expert", seed=1000 + seed, backend="local")
    return name


def bc_run_dir(seed: int, episodes: int, args: argparse.Namespace) -> Path:
    """Where the BC row's run of ``seed`` trained (the fine-tuned rows start from its weights)."""
    from raysim.bench.results import installed_version, run_name

    settings = (f"algo.dataset={dataset_id(seed, episodes)}", f"mujoco={installed_version('mujoco')}")
    return args.out / "runs" / run_name("raysim", BC_CONFIG, seed, bc_updates(), settings)


def bc_updates() -> int:
    import raysim

    return raysim.load_config(BC_CONFIG).algo.updates


def plan(row: str, seed: int, args: argparse.Namespace) -> tuple[str, str, int, list[str]]:
    """``(peer, config, steps, overrides)`` of one row's run of ``seed``."""
    if row in ("random", "expert"):
        return row, SCRATCH_CONFIG, 0, []
    if row.startswith("bc"):
        return "raysim", BC_CONFIG, bc_updates(), [f"algo.dataset={dataset_id(seed, int(row[2:]))}"]
    if row == "ppo":
        return "raysim", SCRATCH_CONFIG, args.steps, []
    start = bc_run_dir(seed, FINETUNED_FROM, args)
    return "raysim", FINETUNE_CONFIGS[row.split("_")[0]], args.steps, [f"model.init_from={start}"]


def run_row(row: str, seed: int, args: argparse.Namespace, done: set[tuple[str, int]]) -> None:
    """Run one row for one seed unless its line is in ``finetune.jsonl``, and append its line; a run of the same
    settings that ``raysim bench mujoco`` measured in ``results.jsonl`` there (PPO from scratch, the scripted
    policies) is taken as it is."""
    from raysim.bench.mujoco import env_of, run_one
    from raysim.bench.results import installed_version

    if (row, seed) in done:
        return
    peer, config, steps, overrides = plan(row, seed, args)
    planned = {"peer": peer, "config": config, "env": env_of(config), "seed": seed, "steps": steps}
    key = run_key({**planned, "overrides": overrides, "mujoco": installed_version("mujoco")})
    measured = [line for line in read_results(args.out / "results.jsonl") if run_key(line) == key]
    if measured:
        result = measured[-1]
    else:
        if row.startswith("bc"):
            record(seed, int(row[2:]), args)
        if row.endswith("_finetune"):
            run_row(f"bc{FINETUNED_FROM}", seed, args, done)
        result = run_one(peer, config, seed, steps, argparse.Namespace(**{**vars(args), "override": overrides}))
    result = {**result, "row": row}
    with open(args.out / "finetune.jsonl", "a") as f:  # each finished run at once: a later invocation skips it
        f.write(json.dumps(result) + "\n")
    done.add((row, seed))
    print(f"[{row} seed {seed}: {result['eval_successes']}/{result['eval_episodes']}]", file=sys.stderr, flush=True)


def cell(line: dict) -> str:
    k, n = line["eval_successes"], line["eval_episodes"]
    low, high = wilson(k, n)
    return f"{k}/{n} ({k / n:.2f}, [{low:.2f}, {high:.2f}])"


def table(lines: list[dict], seeds: list[int]) -> str:
    """One row per method, one column per seed: successes k/n (rate, Wilson 95% interval); the scripted rows do not
    depend on the seed (evaluated once, under the first seed)."""
    by_row = {(line["row"], line["seed"]): line for line in lines if "row" in line}
    head = "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |"
    out = [head, "|" + "---|" * (len(seeds) + 1)]
    for row in ROWS:
        cells = []
        for seed in seeds:
            if row in ("random", "expert") and seed != seeds[0]:
                cells.append(f"(no training: as seed {seeds[0]})")
                continue
            line = by_row.get((row, seed))
            cells.append(cell(line) if line else "-")
        out.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n" + verdict(by_row, seeds)


def verdict(by_row: dict, seeds: list[int]) -> str:
    """The issue's target: the better fine-tuned row reaches 0.8 on every seed and beats BC-5 by 0.4."""

    def rate(row: str, seed: int) -> float | None:
        line = by_row.get((row, seed))
        return line["eval_successes"] / line["eval_episodes"] if line else None

    lines = []
    for row in ("ppo_finetune", "grpo_finetune"):
        rates = [(rate(row, s), rate(f"bc{FINETUNED_FROM}", s)) for s in seeds]
        if any(r is None or b is None for r, b in rates):
            continue
        met = all(r >= 0.8 and r - b >= 0.4 for r, b in rates)
        gains = ", ".join(f"{r:.2f} vs {b:.2f}" for r, b in rates)
        lines.append(f"- {LABELS[row]}: {gains} (BC-{FINETUNED_FROM}): target {'met' if met else 'not met'}")
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = seeded_rows_parser("raysim bench finetune", __doc__.split("\n\n")[0], ROWS)
    parser.add_argument("--steps", type=int, default=500_000, help="env steps of each RL row (default 500,000)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MINARI_DATASETS_PATH", str((args.out / "datasets").resolve()))
    path = args.out / "finetune.jsonl"
    if not args.table:
        done = {(line["row"], line["seed"]) for line in read_results(path)}
        for seed in args.seeds:
            for row in args.rows:
                if row in ("random", "expert") and seed != args.seeds[0]:
                    continue  # no training: the same episodes on every seed
                run_row(row, seed, args, done)
    text = table(read_results(path), args.seeds)
    (args.out / "finetune.md").write_text(text)  # the docs page includes it (docs/finetuning.md)
    print(f"# From demonstrations to a fine-tuned policy: pick-place-v3\n\n{text}")
    return 0
