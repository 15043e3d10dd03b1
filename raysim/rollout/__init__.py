"""Rollout collection: EnvShard, the rollout chunk, the inference-mode context."""

from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.inference import inference
from raysim.rollout.shard import EnvShard, NonFiniteError

__all__ = ["EnvShard", "NonFiniteError", "RolloutChunk", "inference"]
