"""Observation terms composed into named groups (``policy``, ``critic``, ...) by config.

Public, stable import paths (tests and tasks import them from here)::

    from raysim.envs.observations import (
        TERMS, ObsTerm, ObservationGroups,
        joint_pos, joint_vel, ee_pos, goal, goal_rel, last_action,
    )

A term is a function ``term(env) -> Tensor [N, d]`` of an env that exposes the tensors it reads:

==============  ==================================================  ==========
term            value                                               reads
==============  ==================================================  ==========
``joint_pos``   joint positions                                     ``env.joint_pos``
``joint_vel``   joint velocities                                    ``env.joint_vel``
``ee_pos``      end-effector position                               ``env.ee_pos``
``goal``        goal position                                       ``env.goal``
``goal_rel``    goal relative to the end effector (goal - ee_pos)   ``env.goal``, ``env.ee_pos``
``last_action`` the action of the previous step (0 after a reset)   ``env.last_action``
==============  ==================================================  ==========

A group is an ordered list of term entries, each a term name or a mapping
``{term: NAME, noise: STD, scale: S}``; the group's observation is the concatenation, in that
order, of ``(term(env) + noise_std * N(0, 1)) * scale``. The Gaussian noise is drawn from the
generator passed to ``compute`` (the env's own), only for entries with ``noise > 0``. Example::

    observations:
      policy: [{term: joint_pos, noise: 0.01}, {term: joint_vel, noise: 0.05, scale: 0.2}, goal_rel]
      critic: [joint_pos, {term: joint_vel, scale: 0.2}, ee_pos, goal, goal_rel]

so the critic sees privileged, noise-free inputs. ``compute`` returns new tensors (no views of
the env's state).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

Term = Callable[[Any], torch.Tensor]


def joint_pos(env: Any) -> torch.Tensor:
    """Joint positions [N, J]."""
    return env.joint_pos


def joint_vel(env: Any) -> torch.Tensor:
    """Joint velocities [N, J]."""
    return env.joint_vel


def ee_pos(env: Any) -> torch.Tensor:
    """End-effector position [N, D]."""
    return env.ee_pos


def goal(env: Any) -> torch.Tensor:
    """Goal position [N, D]."""
    return env.goal


def goal_rel(env: Any) -> torch.Tensor:
    """Goal relative to the end effector, ``goal - ee_pos`` [N, D]."""
    return env.goal - env.ee_pos


def last_action(env: Any) -> torch.Tensor:
    """The action applied at the previous step [N, A] (zeros after a reset)."""
    return env.last_action


TERMS: dict[str, Term] = {
    "joint_pos": joint_pos,
    "joint_vel": joint_vel,
    "ee_pos": ee_pos,
    "goal": goal,
    "goal_rel": goal_rel,
    "last_action": last_action,
}


@dataclass
class ObsTerm:
    """One entry of a group: a named term with optional Gaussian noise (std) and scale."""

    name: str
    fn: Term
    noise: float = 0.0
    scale: float | Sequence[float] = 1.0

    def __call__(self, env: Any, generator: torch.Generator | None) -> torch.Tensor:
        value = self.fn(env).float()
        if self.noise > 0:
            value = value + self.noise * torch.randn(value.shape, generator=generator, device=value.device)
        return value * torch.as_tensor(self.scale, dtype=value.dtype, device=value.device)


def parse_entry(entry: str | Mapping[str, Any], terms: Mapping[str, Term] = TERMS) -> ObsTerm:
    """``"name"`` or ``{term: name, noise: std, scale: s}`` as an ``ObsTerm``."""
    if isinstance(entry, str):
        entry = {"term": entry}
    if not isinstance(entry, Mapping) or "term" not in entry:
        raise ValueError(f"an observation entry is a term name or {{term: NAME, noise: STD, scale: S}}, got {entry!r}")
    unknown = set(entry) - {"term", "noise", "scale"}
    if unknown:
        raise ValueError(f"observation entry {entry!r}: unknown keys {sorted(unknown)} (term, noise, scale)")
    name = entry["term"]
    if name not in terms:
        raise ValueError(f"unknown observation term {name!r}; terms: {sorted(terms)}")
    noise = float(entry.get("noise", 0.0) or 0.0)
    if noise < 0:
        raise ValueError(f"observation term {name!r}: noise must be >= 0, got {noise}")
    scale = entry.get("scale", 1.0)
    return ObsTerm(name, terms[name], noise, scale)


class ObservationGroups:
    """Named groups of terms: ``{group: [entry, ...]}`` -> ``compute(env, generator)``."""

    def __init__(self, config: Mapping[str, Sequence[str | Mapping[str, Any]]], terms: Mapping[str, Term] = TERMS):
        if not isinstance(config, Mapping) or "policy" not in config:
            raise ValueError(f"observations must map group names to term lists and include 'policy', got {config!r}")
        self.groups: dict[str, list[ObsTerm]] = {}
        for group, entries in config.items():
            if isinstance(entries, (str, Mapping)) or not entries:
                raise ValueError(f"observation group {group!r} must be a non-empty list of terms, got {entries!r}")
            self.groups[str(group)] = [parse_entry(e, terms) for e in entries]

    @property
    def noisy(self) -> bool:
        """True when some entry adds noise (equal reset seeds then give unequal observations)."""
        return any(t.noise > 0 for terms in self.groups.values() for t in terms)

    def names(self, group: str) -> list[str]:
        """The term names of ``group``, in order."""
        return [t.name for t in self.groups[group]]

    def compute(self, env: Any, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Every group's observation [N, sum of term dims] (new tensors)."""
        return {
            group: torch.cat([term(env, generator).flatten(1) for term in terms], dim=1)
            for group, terms in self.groups.items()
        }

    def spaces(self, env: Any) -> dict[str, gym.spaces.Box]:
        """Per-row spaces of every group (unbounded boxes)."""
        spaces = {}
        for group, terms in self.groups.items():
            dim = sum(int(np.prod(term.fn(env).shape[1:])) for term in terms)
            spaces[group] = gym.spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)
        return spaces
