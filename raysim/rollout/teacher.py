"""``Teacher``: another run's actor on a shard, labelling every training step from the rows' privileged groups.

Distillation (``raysim.algos.distill``) trains a student to output what a teacher outputs on the states the
student visits (DAgger). The teacher runs where the observations are: the shard computes its output at every
step of a chunk (``RolloutChunk.labels``), so the learner never runs it (nor holds it). The teacher
reads the student env's groups named in ``inputs`` (``{teacher's group: student env's group}``) and is sent to
a shard once, when the shard is created (``TeacherWeights``: plain data, known by ``key``, the hash of its
weights and settings), never with the student's weights.
"""

from __future__ import annotations

from typing import Any, TypedDict

import gymnasium as gym
import torch

from raysim.envs.contract import Obs
from raysim.models import Actor, ModelConfig
from raysim.rollout.inference import inference


class TeacherWeights(TypedDict):
    """A teacher as the driver reads it (``raysim.coordinator.teacher``) and a shard receives it."""

    key: str  # sha256 of the weights, the model settings and the inputs: what the run knows the teacher by
    source: str  # the run directory or checkpoint it was read from (for messages)
    model: dict[str, Any]  # its ``ModelConfig``, every key
    inputs: dict[str, str]  # its actor's groups -> the student env's groups they are read from
    actor: dict[str, torch.Tensor]  # its actor's state_dict (the observation statistics included)


class Teacher:
    """The teacher's actor built on the student env's spaces; ``label`` is its output for the rows."""

    def __init__(self, weights: TeacherWeights, observation_spaces: dict[str, gym.Space], action_space: gym.Space):
        self.key, self.inputs = weights["key"], dict(weights["inputs"])
        spaces = {name: observation_spaces[group] for name, group in self.inputs.items()}
        self.actor = Actor(spaces, action_space, ModelConfig(**weights["model"]))
        self.actor.load_state_dict(weights["actor"])
        self.actor.requires_grad_(False)
        self.width = self.actor.sampling.width  # the label's: action dimensions, or actions (logits)

    def label(self, obs: Obs, out: torch.Tensor | None = None) -> torch.Tensor:
        """The teacher's output [N, A] for the rows' observations: its Gaussian mean before the action transform,
        or its logits; written into ``out`` when given."""
        with inference(self.actor):
            value = self.actor.mean_of(self.actor({name: obs[group] for name, group in self.inputs.items()}))
        return value if out is None else out.copy_(value)

    def action(self, label: torch.Tensor) -> torch.Tensor:
        """The teacher's action for its ``label``: the mean, or the most likely action."""
        return label.argmax(-1) if self.actor.discrete else label
