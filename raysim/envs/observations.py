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
order, of ``(term(env) + noise_std * N(0, 1)) * scale``. The standard normal draws are passed to
``compute`` (``noise_width(env)`` columns, taken in entry order by the entries with ``noise > 0``);
the env draws them as counter-based noise of each row's episode key and step
(``raysim.seeding.keyed_normal``), so a row's noise does not depend on the batch it is in. Example::

    observations:
      policy: [{term: joint_pos, noise: 0.01}, {term: joint_vel, noise: 0.05, scale: 0.2}, goal_rel]
      critic: [joint_pos, {term: joint_vel, scale: 0.2}, ee_pos, goal, goal_rel]

so the critic sees privileged, noise-free inputs. ``compute`` returns new tensors (no views of
the env's state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
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

    def __call__(self, env: Any, noise: Iterator[torch.Tensor] | None = None) -> torch.Tensor:
        """The entry's value; ``noise``: columns [N] of standard normal draws, one taken per value element
        when the entry is noisy."""
        value = self.fn(env).float()
        if self.noise > 0:
            if noise is None:
                raise ValueError(f"observation term {self.name!r} is noisy: compute needs noise draws")
            draws = torch.stack([next(noise) for _ in range(value[0].numel())], 1)
            value = value + self.noise * draws.reshape(value.shape).to(value)
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
    """Named groups of terms: ``{group: [entry, ...]}`` -> ``compute(env, noise)``."""

    def __init__(
        self,
        config: Mapping[str, Sequence[str | Mapping[str, Any]]],
        terms: Mapping[str, Term] = TERMS,
        required: Sequence[str] = ("policy",),
    ):
        missing = [group for group in required if group not in config] if isinstance(config, Mapping) else required
        if not isinstance(config, Mapping) or missing:
            must = f" and include {', '.join(repr(g) for g in required)}" if required else ""
            raise ValueError(f"observations must map group names to term lists{must}, got {config!r}")
        self.groups: dict[str, list[ObsTerm]] = {}
        for group, entries in config.items():
            if isinstance(entries, (str, Mapping)) or not entries:
                raise ValueError(f"observation group {group!r} must be a non-empty list of terms, got {entries!r}")
            self.groups[str(group)] = [parse_entry(e, terms) for e in entries]

    def names(self, group: str) -> list[str]:
        """The term names of ``group``, in order."""
        return [t.name for t in self.groups[group]]

    def noise_width(self, env: Any) -> int:
        """How many standard normal draws per row ``compute`` needs: the elements of the noisy entries."""
        return sum(int(np.prod(t.fn(env).shape[1:])) for terms in self.groups.values() for t in terms if t.noise > 0)

    def compute(self, env: Any, noise: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Every group's observation [N, sum of term dims] (new tensors); ``noise``: standard normal draws
        [N, noise_width(env)], needed when some entry is noisy."""
        columns = None if noise is None else iter(noise.unbind(1))
        return {
            group: torch.cat([term(env, columns).flatten(1) for term in terms], dim=1)
            for group, terms in self.groups.items()
        }

    def spaces(self, env: Any) -> dict[str, gym.spaces.Box]:
        """Per-row spaces of every group (unbounded boxes)."""
        spaces = {}
        for group, terms in self.groups.items():
            dim = sum(int(np.prod(term.fn(env).shape[1:])) for term in terms)
            spaces[group] = gym.spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)
        return spaces
