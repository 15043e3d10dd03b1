"""raysim: Ray-based rollout collection and PPO / GRPO training for batched environments."""

__version__ = "0.1.0"
