"""Record expert demonstrations on Meta-World pick-place, clone them (BC), fine-tune the clone with GRPO. The recipe:
docs/tasks/fine-tune-from-demonstrations.md.

    python examples/finetune_from_demonstrations.py            # the full run: ~4 min, then 500k GRPO env steps
    python examples/finetune_from_demonstrations.py --quick    # a tiny budget: seconds

Needs the Meta-World and Minari extras: pip install -e ".[metaworld,demos]".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import raysim
from raysim.coordinator.demonstrations import record_demonstrations

# The quick run: 2 expert episodes, 40 BC steps, one GRPO iteration of 2 groups of 4 rows in 20-step rounds;
# every role in this process, each evaluation 2 episodes cut at 100 steps.
QUICK_EVAL = ["backend=local", "eval.episodes=2", "eval.num_envs=2", "eval.max_steps=100"]
QUICK_BC = ["algo.updates=40", "algo.num_minibatches=20"]
QUICK_GRPO = [
    "env.num_envs=8",
    "algo.group_size=4",
    "algo.num_steps=20",
    "algo.groups_per_shard=1",
    "algo.max_rounds=2",
    "algo.update_epochs=1",
    "algo.num_minibatches=2",
    "train.total_steps=320",
]


def record(dataset_id: str, episodes: int, datasets: Path, quick: bool) -> Path:
    """The scripted expert's episodes as a Minari dataset under ``datasets``; returns its directory."""
    saved = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(datasets.resolve())  # where Minari writes (default ~/.minari/datasets)
    try:
        recorded = record_demonstrations(
            dataset_id,
            episodes,
            config="metaworld_pick_place_bc",
            policy="expert",
            backend="local" if quick else None,
            envs_per_shard=2 if quick else None,
        )
    finally:
        if saved is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = saved
    played = recorded.report
    print(f"recorded {played.completed} expert episodes, {recorded.steps} steps, {played.successes} successes")
    return recorded.path


def report(name: str, summary: raysim.Summary) -> None:
    """What a run did, and its final evaluation's successes."""
    evaluation = summary.evaluation
    scored = f"{evaluation.successes} successes in {evaluation.requested} episodes" if evaluation else "not evaluated"
    print(f"{name}: {summary.iterations} iterations, {summary.env_steps:,} env steps; {scored} -> {summary.run_dir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where the runs and the dataset are written")
    args = parser.parse_args(argv)
    out = args.out / "finetune_from_demonstrations"
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty: give another --out, or remove it")

    episodes = 2 if args.quick else 5
    dataset = record(f"raysim/pick-place-v3/expert-{episodes}-v0", episodes, out / "datasets", args.quick)

    quick_bc, quick_grpo = (QUICK_EVAL + QUICK_BC, QUICK_EVAL + QUICK_GRPO) if args.quick else ([], [])
    bc = [f"algo.dataset={dataset}", f"run_dir={out / 'bc'}", *quick_bc]
    cloned = raysim.Trainer(raysim.load_config("metaworld_pick_place_bc", bc)).train()
    if cloned.interrupted:  # Ctrl-C or SIGTERM: saved; fine-tune once it is finished
        print(f"stopped by {cloned.stopped_by}: finish it with `raysim resume {cloned.run_dir}`")
        return cloned.exit_code
    report("behaviour cloning", cloned)

    grpo = [f"model.init_from={cloned.run_dir}", f"run_dir={out / 'grpo'}", *quick_grpo]
    tuned = raysim.Trainer(raysim.load_config("metaworld_pick_place_grpo_finetune", grpo)).train()
    report("GRPO fine-tuned", tuned)
    return tuned.exit_code


if __name__ == "__main__":
    sys.exit(main())
