"""``GroupInputs``: the observation groups a network reads, and how they become the input of its MLP.

The actor reads ``model.actor_inputs`` (default ``[policy]``), the critic ``model.critic_inputs``
(default ``[critic]``; when the env has no ``critic`` group and the config keeps the default, the
actor's groups). As Stable-Baselines3's ``MultiInputPolicy`` does,
an image group (``raysim.envs.spaces``) goes through its own CNN (``encoders[group]``,
``raysim.models.encoders``) and the vector groups are flattened and concatenated; the network's
``net`` (the MLP and its head) then reads ``[vector groups, CNN features]``. Observation
normalization (``model.obs_norm``, submodule ``obs_norm``) applies to the vector part only.

A network built with ``shared_encoders`` takes those groups' encoders as they are instead of building
its own (``model.shared_encoders``: the critic reuses the actor's CNN, see ``raysim.models.networks``);
``features`` takes image features already computed (``encoded``), so a shared CNN runs once for both.

A network of vector groups alone has no encoders and its weights are ``obs_norm.*`` and ``net.*`` (its
checkpoints load in every raysim version): its ``net`` is a plain ``mlp()``, which the fused inference
path (``raysim.models.fused``) and the row-wise evaluation (``raysim.models.rowwise``) take (``fusable``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from raysim.envs.spaces import is_image_space
from raysim.models.encoders import image_encoder
from raysim.models.normalizer import RunningNorm

DEFAULT_CRITIC_INPUTS = ["critic"]


def critic_groups(
    observation_spaces: dict[str, gym.Space], critic_inputs: list[str], actor_inputs: list[str]
) -> list[str]:
    """The critic's groups: ``critic_inputs``, or the actor's when those are the default and the env has no
    ``critic`` group."""
    if list(critic_inputs) == DEFAULT_CRITIC_INPUTS and "critic" not in observation_spaces:
        return list(actor_inputs)
    return list(critic_inputs)


class GroupInputs(nn.Module):
    """Base of the actor and the critic: its ``inputs``, their ``encoders`` and ``obs_norm``; ``in_dim`` for ``net``."""

    def __init__(
        self,
        observation_spaces: dict[str, gym.Space],
        inputs: list[str],
        key: str,
        config: Any,
        shared_encoders: Mapping[str, nn.Module] | None = None,
    ) -> None:
        """``config``: the ``ModelConfig`` (``cnn``, ``cnn_features``, ``obs_norm``, ``obs_norm_clip``); ``key``: the
        setting that named ``inputs``, for the message when the env lacks one of them; ``shared_encoders``: another
        network's encoders, used (not copied) for the image groups this one reads too."""
        super().__init__()
        if not inputs:
            raise ValueError(f"{key} must name at least one observation group; the env's: {sorted(observation_spaces)}")
        for group in inputs:
            if group not in observation_spaces:
                raise ValueError(
                    f"{key} names group {group!r}, which the env does not have; "
                    f"its groups: {sorted(observation_spaces)}"
                )
        self.inputs = list(inputs)
        self.vector_groups = [g for g in inputs if not is_image_space(observation_spaces[g])]
        self.image_groups = [g for g in inputs if is_image_space(observation_spaces[g])]
        shared = shared_encoders or {}
        self.encoders = nn.ModuleDict(
            {
                g: shared[g] if g in shared else image_encoder(observation_spaces[g], config.cnn, config.cnn_features)
                for g in self.image_groups
            }
        )
        vector_dim = sum(_flat_dim(observation_spaces[g]) for g in self.vector_groups)
        self.obs_norm = RunningNorm(vector_dim, config.obs_norm_clip) if config.obs_norm and vector_dim else None
        self.in_dim = vector_dim + len(self.image_groups) * int(config.cnn_features)

    @property
    def fusable(self) -> bool:
        """Whether the network reads vector groups only (its MLP reads ``vector_input``, or a recurrent core's output
        of it: the fused path applies to the MLP)."""
        return not self.image_groups

    def groups(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> dict[str, torch.Tensor]:
        """``obs`` as groups: a tensor is the one group of a network that reads one."""
        if isinstance(obs, torch.Tensor):
            if len(self.inputs) != 1:
                raise ValueError(f"this network reads groups {self.inputs}: pass a dict of them, not one tensor")
            return {self.inputs[0]: obs}
        return obs

    def vector_input(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The vector groups flattened and concatenated ``[B, D]``, not normalized (one group: no copy)."""
        parts = [obs[g].flatten(1) for g in self.vector_groups]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def features(
        self, obs: dict[str, torch.Tensor] | torch.Tensor, encoded: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """``net``'s input: the normalized vector part, then each image group's CNN features (``encoded``: those
        already computed, by an encoder this network shares)."""
        obs, encoded = self.groups(obs), encoded or {}
        parts = []
        if self.vector_groups:
            x = self.vector_input(obs)
            parts.append(x if self.obs_norm is None else self.obs_norm(x))
        parts += [encoded[g] if g in encoded else self.encoders[g](obs[g]) for g in self.image_groups]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _flat_dim(space: gym.Space) -> int:
    return int(math.prod(space.shape)) if space.shape else 1
