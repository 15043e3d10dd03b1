"""``make(env_id, num_envs, seed=..., **kwargs)``: the one way to build a batched env by name.

Native tasks register a factory under ``raysim/<Name>``; ``gym:<ID>`` builds any Gymnasium id
through the adapter.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

from raysim.envs.contract import BatchedEnv, check_num_envs

EnvFactory = Callable[..., BatchedEnv]
_REGISTRY: dict[str, EnvFactory] = {}


def register(env_id: str, factory: EnvFactory) -> None:
    """Make ``factory(num_envs=..., seed=..., **kwargs)`` available as ``env_id``."""
    if env_id.startswith("gym:"):
        raise ValueError(f"{env_id!r}: the 'gym:' prefix is reserved for the Gymnasium adapter")
    _REGISTRY[env_id] = factory


def registered() -> list[str]:
    """The ids of the native tasks."""
    return sorted(_REGISTRY)


def make(env_id: str, num_envs: int, seed: int | None = None, **kwargs: Any) -> BatchedEnv:
    """Build ``num_envs`` rows of ``env_id`` (``raysim/<Name>`` or ``gym:<Gymnasium id>``)."""
    check_num_envs(num_envs)
    if env_id.startswith("gym:"):
        from raysim.envs.gym_adapter import GymAdapter

        return GymAdapter(env_id[len("gym:") :], num_envs, seed=seed, **kwargs)
    if env_id not in _REGISTRY:
        hint = difflib.get_close_matches(env_id, list(_REGISTRY), n=1)
        raise ValueError(
            f"unknown env id {env_id!r}"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" Native tasks: {registered()}; Gymnasium envs are named 'gym:<ID>', e.g. 'gym:CartPole-v1'."
        )
    try:
        return _REGISTRY[env_id](num_envs=num_envs, seed=seed, **kwargs)
    except TypeError as error:
        raise TypeError(f"{env_id}: bad env option: {error}") from error
