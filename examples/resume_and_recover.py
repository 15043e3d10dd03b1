"""Stop a run and resume it, crash one and recover it: the resumed run is bitwise the uninterrupted one. The recipe:
docs/tasks/resume-and-recover.md.

    python examples/resume_and_recover.py            # the full run
    python examples/resume_and_recover.py --quick    # a tiny budget: seconds
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

import raysim
from raysim.checkpoint import locate_checkpoint

# A tiny CartPole run: 16 iterations of 4 rows x 32 steps, every role in this process.
QUICK = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "train.total_steps=2048",
    "train.log_every=4",
    "eval.episodes=4",
    "eval.num_envs=2",
]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model weights of the run's newest intact checkpoint."""
    _, _, state, _ = locate_checkpoint(run_dir)
    return state["model"]


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def stop_and_resume(overrides: list[str], out: Path, stop_after: int) -> None:
    """Train straight through; train again, stopped after ``stop_after`` iterations; resume; compare."""
    straight = raysim.Trainer(raysim.load_config("cartpole_ppo", [*overrides, f"run_dir={out / 'straight'}"])).train()
    stopped = raysim.Trainer(
        raysim.load_config("cartpole_ppo", [*overrides, f"train.stop_after={stop_after}", f"run_dir={out / 'stopped'}"])
    ).train()
    print(f"stopped by {stopped.stopped_by} after {stopped.iterations} iterations")
    resumed = raysim.Trainer.from_run_dir(out / "stopped").train()  # what `raysim resume RUN_DIR` does
    print(f"resumed to {resumed.iterations} iterations ({resumed.steps_this_run:,} env steps in this process)")
    same = bitwise_equal(final_weights(out / "straight"), final_weights(out / "stopped"))
    print(f"stopped + resumed == straight, bitwise: {same}")
    print(f"evaluation records equal: {straight.evaluation.records == resumed.evaluation.records}")


def saved_iterations(run_dir: Path) -> list[int]:
    """The iterations of the run's complete checkpoints: a directory named by its iteration, with its manifest (a
    save in progress is staged in a hidden ``.tmp-*`` directory and renamed once whole)."""
    found = (p.parent.name for p in run_dir.glob("checkpoints/*/manifest.json"))
    return sorted(int(name) for name in found if name.isdigit())


def crash_and_recover(overrides: list[str], out: Path, quick: bool) -> None:
    """A driver killed with SIGKILL (no chance to save): its newest checkpoint is intact and resumes."""
    run_dir = out / "crashed"
    command = [sys.executable, "-m", "raysim", "train", "cartpole_ppo", "--local", "--run-dir", str(run_dir)]
    command += [f"--set={o}" for o in overrides if not o.startswith("train.total_steps")]
    command += ["--set=checkpoint.every=2", "--set=train.total_steps=40000"]  # long enough to be killed mid-run
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not saved_iterations(run_dir):
        if driver.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run to crash ended or stalled before its first checkpoint: {' '.join(command)}")
        time.sleep(0.05)
    driver.kill()
    driver.wait()
    print(f"killed the driver (exit code {driver.returncode})")
    checkpoints = saved_iterations(run_dir)
    print(f"left behind: checkpoints {checkpoints}, the dead driver's lock: {(run_dir / 'lock.json').exists()}")
    # A save cut by the crash leaves no checkpoint (one appears whole or not at all); a damaged one is skipped:
    # the newest intact one is resumed from. The dead process's lock is broken at once (same host, its pid gone).
    more = ["train.stop_after=2"] if quick else []
    resumed = raysim.Trainer.from_run_dir(run_dir, overrides=more).train()
    print(f"recovered: {resumed.iterations} iterations, {resumed.env_steps:,} env steps")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where the runs are written")
    args = parser.parse_args(argv)
    out = args.out / "resume_and_recover"
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty: give another --out, or remove it")
    overrides = QUICK if args.quick else []
    stop_and_resume(overrides, out, stop_after=8 if args.quick else 20)
    crash_and_recover(overrides, out, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
