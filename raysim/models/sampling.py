"""``ActionSampling``: what acting needs of a policy besides its network: the distribution's kind and width, the
draws of a sample, and the map into the env's action space.

The ``Actor`` owns one. An env worker of the ``servers`` placement (``raysim.rollout.server``) holds one and no
weights: it draws its rows' noise as a collocated shard draws it, a server turns the draws into actions
(``Actor.act_with``), and the worker maps them into the action space.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from raysim.seeding import keyed_normal, keyed_uniform


class ActionSampling:
    """A categorical over ``Discrete(n)`` or a Gaussian over a ``Box``, with ``model.action_transform``."""

    def __init__(self, action_space: gym.Space, action_transform: str = "clip"):
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"action space {action_space} is not supported (Discrete or Box)")
        if action_transform not in ("clip", "squash"):
            raise ValueError(f"model.action_transform must be 'clip' or 'squash', got {action_transform!r}")
        self.width = int(action_space.n) if self.discrete else int(math.prod(action_space.shape or (1,)))
        if not self.discrete:  # copies: the space's arrays are read-only
            self.low = torch.tensor(np.asarray(action_space.low, dtype=np.float32)).reshape(-1)
            self.high = torch.tensor(np.asarray(action_space.high, dtype=np.float32)).reshape(-1)
            self.squash = action_transform == "squash"

    def draws(
        self,
        rows: int,
        generator: torch.Generator | None = None,
        keys: tuple[torch.Tensor, torch.Tensor] | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """What sampling ``rows`` actions draws: standard normals [rows, D] (Gaussian) or Exp(1) variates [rows, K]
        (categorical: ``sample_categorical``'s), float32, from ``generator`` or the ``keys``' counter-based noise
        (``raysim.seeding``); written into ``out`` when given."""
        if keys is not None:
            drawn = (
                keyed_uniform(*keys, self.width).log().neg_().float()
                if self.discrete
                else keyed_normal(*keys, self.width, torch.float32)
            )
            return drawn if out is None else out.copy_(drawn)
        out = torch.empty((rows, self.width)) if out is None else out
        return out.exponential_(1, generator=generator) if self.discrete else out.normal_(generator=generator)

    def uniform(self, rows: int, generator: torch.Generator, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """Actions drawn uniformly in the action space (off-policy warm-up), written into ``action`` as sampled
        actions are stored (before the env's clip or squash: ``env_action`` of them is the uniform draw) with their
        log-density into ``logp``: a uniform index for ``Discrete``; for a ``Box`` ``y ~ U(-1, 1)`` per dimension,
        mapped as the transform maps (``atanh(y)`` for squash, ``low + (y + 1)(high - low) / 2`` for clip)."""
        if self.discrete:
            torch.randint(self.width, (rows,), generator=generator, out=action)
            logp.fill_(-math.log(self.width))
            return action
        y = torch.rand((rows, self.width), generator=generator).mul_(2).sub_(1).clamp_(-1 + 1e-6, 1 - 1e-6)
        if self.squash:
            action.copy_(torch.atanh(y))  # p(u) = 2^-D prod(1 - y^2)
            torch.sum(torch.log1p(-y.square()), -1, out=logp).sub_(self.width * math.log(2))
        else:
            action.copy_(self.low + (y + 1) * 0.5 * (self.high - self.low))
            logp.fill_(-float(torch.log(self.high - self.low).sum()))
        return action

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The action the env receives for a sampled one (continuous: clipped or squashed)."""
        if self.discrete:
            return action
        return to_action_space(action, self.low, self.high, self.squash)

    def policy_action(self, env_action: torch.Tensor) -> torch.Tensor:
        """The action to sample for one the env received (``from_action_space``): what cloning an env-space
        action fits (behaviour cloning on an expert's actions, a teacher of another transform)."""
        if self.discrete:
            return env_action
        low, high = self.low.to(env_action.device), self.high.to(env_action.device)
        return from_action_space(env_action, low, high, self.squash)


def to_action_space(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor, squash: bool) -> torch.Tensor:
    """A continuous action mapped into ``[low, high]``: ``tanh`` scaled into it (``squash``) or clipped.

    The one mapping of the shards, the workers, evaluation and exported policies (TorchScript compiles it too).
    """
    if squash:
        return low + (torch.tanh(action) + 1) * 0.5 * (high - low)
    return torch.maximum(torch.minimum(action, high), low)


#: ``from_action_space`` bounds a squashed target's tanh to this: an action on a bound (an expert's saturated one)
#: becomes atanh(0.995) = 3.0, not infinity; ``to_action_space`` of it is within 0.25 % of the range of the bound.
SQUASH_LIMIT = 0.995


def from_action_space(action: torch.Tensor, low: torch.Tensor, high: torch.Tensor, squash: bool) -> torch.Tensor:
    """The inverse of ``to_action_space`` on an action the env received: clipped into ``[low, high]``, then itself
    (clip) or the atanh of it rescaled into [-1, 1] (squash), the rescaled value bounded by ``SQUASH_LIMIT``."""
    action = torch.maximum(torch.minimum(action, high), low)
    if not squash:
        return action
    unit = (action - low) / (high - low) * 2 - 1
    return torch.atanh(unit.clamp(-SQUASH_LIMIT, SQUASH_LIMIT))
