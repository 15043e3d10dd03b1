"""Evaluate a trained Reach policy (success k/n with its Wilson interval), film it and export it. The recipe:
docs/tasks/evaluate-and-film.md.

    python examples/evaluate_and_film.py            # the full run: reach_ppo's 1M env steps, then 100 episodes
    python examples/evaluate_and_film.py --quick    # a tiny budget: seconds

Filming needs the video extra: pip install -e ".[video]".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import raysim
from raysim.evaluation import EvalReport, Rate
from raysim.export import export_policy
from raysim.recording import Film
from raysim.video import VideoWriter

QUICK = ["backend=local", "env.num_envs=8", "train.total_steps=2048", "eval.episodes=0"]  # evaluated below


def rate(r: Rate) -> str:
    """``k/n [low, high]``: a rate and its Wilson interval (nan where the denominator is 0)."""
    low, high = r.interval if r.interval else (float("nan"), float("nan"))
    return f"{r.numerator}/{r.denominator} [{low:.3f}, {high:.3f}]"


def show(report: EvalReport) -> None:
    """The report's fields, as ``raysim eval`` prints them."""
    print(f"requested n {report.requested}, completed c {report.completed}, successes k {report.successes}")
    print(f"success k/n {rate(report.success_per_requested)}  ({report.confidence:.0%} Wilson)")
    print(f"success k/c {rate(report.success_rate)}, completed c/n {rate(report.completion_rate)}")
    print(f"return {report.returns['mean']:.2f} +- {report.returns['std']:.2f}, length {report.lengths['mean']:.1f}")
    print(f"records: {len(report.records)}, e.g. {sorted(report.records[0])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument(
        "--out", help="where the run, the records, the video and the policy go (default: runs/reach_ppo, .)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out or ".")
    overrides = [*(QUICK if args.quick else []), *([f"run_dir={out / 'reach_ppo'}"] if args.out else [])]
    summary = raysim.Trainer(raysim.load_config("reach_ppo", overrides)).train()
    run_dir = summary.run_dir
    print(f"trained {summary.env_steps:,} env steps: {run_dir}")
    backend = "local" if args.quick else None  # None: on Ray, as raysim eval does

    episodes = 8 if args.quick else 100
    report = raysim.evaluate(run_dir, episodes=episodes, seed=0, backend=backend, out=out / "eval.parquet")
    show(report)

    writer = VideoWriter(out / "reach.mp4", fps=25)  # .gif works too
    filmed = raysim.evaluate(run_dir, episodes=4, seed=0, envs_per_shard=4, backend=backend, film=Film(writer))
    video = writer.close()
    unfilmed = {r["episode"]: r["return"] for r in report.records}
    same = all(unfilmed[r["episode"]] == r["return"] for r in filmed.records)
    print(f"video: {video}, {writer.frames} frames of 4 tiles; episodes 0-3 as in the unfilmed evaluation: {same}")

    info = export_policy(run_dir, out / "policy.pt")  # what `raysim export RUN --out policy.pt` writes
    policy = torch.jit.load(info["out"])  # torch alone: no raysim needed to load it
    actions = policy(torch.zeros(3, *info["observation_shape"]))
    print(f"{info['out']}: obs {info['observation_shape']} -> actions {tuple(actions.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
