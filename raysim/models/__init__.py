"""The networks: the actor the shards act with and the learner trains, the critic, their input normalizer.

They sit below ``raysim.rollout`` (a shard acts with the ``Actor``; the learner computes values with
the ``Critic``) and know nothing of rollouts, algorithms or Ray.
"""

from raysim.models.device import resolve_device
from raysim.models.fused import MLPInference
from raysim.models.networks import (
    Actor,
    ActorCritic,
    Critic,
    ModelConfig,
    actor_state,
    sample_categorical,
)
from raysim.models.normalizer import RunningNorm
from raysim.models.pretrained import load_pretrained
from raysim.models.recurrent import RecurrentCore, RowMemory
from raysim.models.sampling import ActionSampling, to_action_space

__all__ = [
    "ActionSampling",
    "Actor",
    "ActorCritic",
    "Critic",
    "MLPInference",
    "ModelConfig",
    "RecurrentCore",
    "RowMemory",
    "RunningNorm",
    "actor_state",
    "load_pretrained",
    "resolve_device",
    "sample_categorical",
    "to_action_space",
]
