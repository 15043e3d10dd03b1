"""Train a policy that sees through a camera: reach_camera_ppo, filmed. The recipe: docs/tasks/train-from-a-camera.md.

    python examples/train_from_camera.py            # the full run: 1M env steps, about 18 minutes on 2 cores
    python examples/train_from_camera.py --quick    # a tiny budget: seconds

Filming needs the video extra: pip install -e ".[video]".
"""

from __future__ import annotations

import argparse
import sys

import raysim
from raysim.envs import make

QUICK = [  # every role in this process, 2 iterations of 128 env steps, 4 filmed evaluation episodes
    "backend=local",
    "env.num_envs=8",
    "algo.num_steps=16",
    "train.total_steps=256",
    "eval.episodes=4",
    "eval.num_envs=4",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument("--out", help="where the run is written (default: runs/reach_camera_ppo, as raysim train)")
    args = parser.parse_args(argv)
    overrides = [*(QUICK if args.quick else []), "eval.video=true"]  # film the final evaluation
    config = raysim.load_config(
        "reach_camera_ppo", [*overrides, *([f"run_dir={args.out}/reach_camera_ppo"] if args.out else [])]
    )

    env = make(config.env.id, 1, seed=0, **config.env.kwargs)
    for group, space in env.observation_spaces.items():
        print(f"observation group {group}: {space.dtype} {space.shape}")
    model = config.model
    cnn = f"the {model.cnn} CNN ({model.cnn_features} features)"
    print(f"actor reads {', '.join(model.actor_inputs)}: the camera through {cnn}")
    print(f"critic reads {', '.join(model.critic_inputs)}: the privileged state (no image), an MLP")

    summary = raysim.Trainer(config).train()
    report = summary.evaluation
    low, high = report.success_per_requested.interval
    print(f"{summary.env_steps:,} env steps in {summary.wall_time:.0f} s")
    print(f"evaluation: success {report.successes}/{report.requested} [{low:.3f}, {high:.3f}] 95% Wilson")
    print(f"video: {summary.run_dir}/videos/{summary.iterations}.mp4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
