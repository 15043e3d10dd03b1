"""Rollout collection: EnvShard and its plans, the rollout chunk, the inference-mode context, advantages."""

from raysim.rollout.chunk import RolloutChunk
from raysim.rollout.endings import Collection, EvalEpisodes, FixedSteps, GroupEpisodes, GroupResetError, Scoring
from raysim.rollout.inference import inference
from raysim.rollout.rows import NonFiniteError
from raysim.rollout.shard import EnvShard

__all__ = [
    "Collection",
    "EnvShard",
    "EvalEpisodes",
    "FixedSteps",
    "GroupEpisodes",
    "GroupResetError",
    "NonFiniteError",
    "RolloutChunk",
    "Scoring",
    "inference",
]
