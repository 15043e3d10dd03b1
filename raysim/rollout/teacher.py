"""``Teacher``: another run's actor on a shard, labelling every training step from the rows' privileged groups.

Distillation (``raysim.algos.distill``) trains a student to output what a teacher outputs on the states the
student visits (DAgger). The teacher runs where the observations are: the shard computes its output at every
step of a chunk (``RolloutChunk.labels``), so the learner never runs it (nor holds it). The teacher
reads the student env's groups named in ``inputs`` (``{teacher's group: student env's group}``) and is sent to
a shard once, when the shard is created (``TeacherWeights``: plain data, known by ``key``, the hash of its
weights and settings), never with the student's weights.

Continuous labels are in the space the env receives: a teacher whose ``model.action_transform`` is the student's
labels with its mean before the transform (what the student's mean regresses on); one of another transform with
the mean whose student transform gives the teacher's env action (``ActionSampling.policy_action`` of it: a clip
teacher's clipped mean, atanh'd for a squash student; a squash teacher's squashed mean for a clip student), so
neither the loss nor a teacher's action at ``beta`` executes the teacher's mean through the wrong transform.
"""

from __future__ import annotations

from typing import Any, TypedDict

import gymnasium as gym
import torch

from raysim.envs.contract import Obs
from raysim.models import ActionSampling, Actor, ModelConfig
from raysim.rollout.inference import inference


class TeacherWeights(TypedDict):
    """A teacher as the driver reads it (``raysim.coordinator.teacher``) and a shard receives it."""

    key: str  # sha256 of the weights, the model settings and the inputs: what the run knows the teacher by
    source: str  # the run directory or checkpoint it was read from (for messages)
    model: dict[str, Any]  # its ``ModelConfig``, every key
    inputs: dict[str, str]  # its actor's groups -> the student env's groups they are read from
    actor: dict[str, torch.Tensor]  # its actor's state_dict (the observation statistics included)


class Teacher:
    """The teacher's actor built on the student env's spaces; ``label`` is its output for the rows, in the
    student's ``sampling`` (its action transform)."""

    def __init__(self, weights: TeacherWeights, observation_spaces: dict[str, gym.Space], student: ActionSampling):
        self.key, self.inputs = weights["key"], dict(weights["inputs"])
        spaces = {name: observation_spaces[group] for name, group in self.inputs.items()}
        self.actor = Actor(spaces, student.action_space, ModelConfig(**weights["model"]))
        self.actor.load_state_dict(weights["actor"])
        self.actor.requires_grad_(False)
        self.width = self.actor.sampling.width  # the label's: action dimensions, or actions (logits)
        # None: the transforms agree (or the actions are discrete), the mean is the label as it is
        self.student = None if student.discrete or student.squash == self.actor.squash else student

    def label(self, obs: Obs, out: torch.Tensor | None = None) -> torch.Tensor:
        """The teacher's output [N, A] for the rows' observations: its Gaussian mean before the action transform
        (of another transform than the student's: mapped into the student's, see the module), or its logits;
        written into ``out`` when given."""
        with inference(self.actor):
            value = self.actor.mean_of(self.actor({name: obs[group] for name, group in self.inputs.items()}))
        if self.student is not None:
            value = self.student.policy_action(self.actor.env_action(value))
        return value if out is None else out.copy_(value)

    def action(self, label: torch.Tensor) -> torch.Tensor:
        """The teacher's action for its ``label``: the mean, or the most likely action."""
        return label.argmax(-1) if self.actor.discrete else label
