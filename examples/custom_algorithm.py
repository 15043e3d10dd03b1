"""Bring your own algorithm: REINFORCE in one class, trained on CartPole by its import path. The recipe:
docs/tasks/bring-your-own-algorithm.md.

    python -m examples.custom_algorithm            # the full run (from the checkout's root)
    python -m examples.custom_algorithm --quick    # a tiny budget: seconds

Run it as a module from the checkout's root (or with the root on PYTHONPATH): the config names the algorithm
``examples.custom_algorithm:Reinforce``, which the driver and the learner's Ray worker import by that name.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import raysim
from raysim.algos.base import Algorithm
from raysim.algos.epochs import Batch, concat, transitions
from raysim.rollout import FixedSteps, RolloutChunk


@dataclass
class ReinforceConfig:
    """The ``algo.*`` keys (checked as the packaged algorithms' are); the ones from ``lr`` on are the settings
    raysim reads outside the algorithm (``raysim.algos.optimizer.OptimizerConfig``)."""

    name: str = "examples.custom_algorithm:Reinforce"
    num_steps: int = 64  # steps per row in each shard's chunk
    gamma: float = 0.99
    lr: float = 1e-2
    lr_schedule: str = "constant"
    update_epochs: int = 1
    num_minibatches: int = 1
    max_grad_norm: float = 0.5
    max_nonfinite_updates: int = 3
    max_policy_lag: int = 0


def returns_to_go(chunk: RolloutChunk, gamma: float) -> torch.Tensor:
    """Discounted returns [T, N] from each step to the end of its episode or of the chunk (no bootstrap)."""
    returns = torch.zeros_like(chunk.reward)
    running = torch.zeros_like(chunk.reward[0])
    done = chunk.terminated | chunk.truncated
    for t in range(chunk.num_steps - 1, -1, -1):
        running = torch.where(done[t], 0.0, running) * gamma + chunk.reward[t]
        returns[t] = running
    return returns


class Reinforce(Algorithm):
    """REINFORCE with the batch's mean return as its baseline: no critic."""

    name = "reinforce"
    Config = ReinforceConfig
    uses_critic = False  # the learner builds no critic and runs no value inference
    loss_terms = ("pg_loss",)  # a non-finite one skips the minibatch, named

    @classmethod
    def collection(cls, config: ReinforceConfig) -> FixedSteps:
        return FixedSteps(config.num_steps)  # each shard returns a chunk of num_steps steps of its rows

    def batch(self, chunks: list[RolloutChunk]) -> Batch:
        parts = []
        for chunk in chunks:
            part = transitions(chunk)  # obs, actions, logprobs, ... of the valid steps
            part["returns"] = returns_to_go(chunk, self.config.gamma)[chunk.mask]
            parts.append(part)
        return concat(parts)

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprob, entropy = self.model.actor.log_prob_entropy(minibatch["obs"]["policy"], minibatch["actions"])
        advantages = minibatch["returns"] - minibatch["returns"].mean()
        pg_loss = -(logprob * advantages).mean()
        return pg_loss, {"pg_loss": pg_loss, "entropy": entropy.mean()}  # the metrics, as logged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny budget, every role in this process")
    parser.add_argument("--out", help="where the run is written (default: runs/reinforce, as raysim train)")
    args = parser.parse_args(argv)
    quick = ["backend=local", "train.total_steps=4096", "eval.episodes=10"]
    overrides = [*(quick if args.quick else []), *([f"run_dir={args.out}/reinforce"] if args.out else [])]
    config = raysim.load_config(Path(__file__).with_name("reinforce.yaml"), overrides)
    print(f"algo: {type(config.algo).__name__}, critic: {config.model.critic}")
    summary = raysim.Trainer(config).train()
    losses = ", ".join(f"{k} {summary.metrics[k]:.3g}" for k in ("pg_loss", "entropy"))
    print(f"{summary.env_steps} env steps: {losses}, training episode return {summary.metrics['episode_return']:.1f}")
    print(f"evaluation: return {summary.evaluation.mean_return:.1f} over {summary.evaluation.completed} episodes")
    print(f"run directory: {summary.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
