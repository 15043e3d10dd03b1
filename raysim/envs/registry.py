"""``make(env_id, num_envs, seed=..., **kwargs)``: the one way to build a batched env by name.

Native tasks register a factory under ``raysim/<Name>``; ``gym:<ID>`` builds any Gymnasium id
through the adapter.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raysim.envs.contract import BatchedEnv, check_num_envs
from raysim.envs.errors import EnvOptionError, UnknownEnvError

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


def factory(env_id: str) -> EnvFactory:
    """The factory registered as ``env_id``, or ``module.path:Name`` imported (e.g. a user's own
    task, which then also works in Ray workers that never imported it); an error that suggests
    the closest registered id otherwise."""
    if env_id not in _REGISTRY and ":" in env_id:
        module, _, name = env_id.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            raise UnknownEnvError(f"env id {env_id!r}: cannot import {name} from {module}: {error}") from error
    if env_id not in _REGISTRY:
        hint = difflib.get_close_matches(env_id, list(_REGISTRY), n=1)
        raise UnknownEnvError(
            f"unknown env id {env_id!r}"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
            + f" Native tasks: {registered()}; Gymnasium envs are named 'gym:<ID>', e.g. 'gym:CartPole-v1'."
        )
    return _REGISTRY[env_id]


def materialize(env_id: str, options: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``options`` with the task's resources materialized (its ``materialize`` hook)."""
    options = copy.deepcopy(options)
    hook = None if env_id.startswith("gym:") else getattr(factory(env_id), "materialize", None)
    return hook(options) if hook is not None else options


def export_resources(env_id: str, options: dict[str, Any], directory: Path) -> dict[str, Any]:
    """Options whose materialized resources are written under ``directory`` (the task's hook)."""
    hook = None if env_id.startswith("gym:") else getattr(factory(env_id), "export_resources", None)
    return hook(materialize(env_id, options), directory) if hook is not None else copy.deepcopy(options)


def row_multiple(env_id: str, options: dict[str, Any]) -> int:
    """What every row count of ``env_id`` must be a multiple of (its ``row_multiple`` hook: a task over the rows,
    ``raysim/MetaWorld``'s K tasks); 1 for the others."""
    hook = None if env_id.startswith("gym:") else getattr(factory(env_id), "row_multiple", None)
    return 1 if hook is None else int(hook(copy.deepcopy(options)))


def make(
    env_id: str,
    num_envs: int,
    seed: int | None = None,
    evaluation: bool = False,
    success: str | None = None,
    **kwargs: Any,
) -> BatchedEnv:
    """Build ``num_envs`` rows of ``env_id`` (``raysim/<Name>`` or ``gym:<Gymnasium id>``).

    ``evaluation``: the env as evaluation plays it, without what only shapes training (the Atari preset's
    episodic life and reward clipping, ``raysim.envs.atari``); the native tasks have none of that.
    ``success``: how the episode reports count success (``BatchedEnv.count_success``; None: the env's own count).
    The env works on its own deep copy of ``kwargs``: the caller's objects are never mutated.
    """
    check_num_envs(num_envs)
    if env_id.startswith("gym:"):
        from raysim.envs.gym_adapter import make_gym

        env = make_gym(env_id[len("gym:") :], num_envs, seed, evaluation, **copy.deepcopy(kwargs))
    else:
        build = factory(env_id)
        check_options(env_id, build, kwargs)
        env = build(num_envs=num_envs, seed=seed, **materialize(env_id, kwargs))
    try:
        env.count_success(success)
    except ValueError:
        env.close()
        raise
    return env


def check_options(env_id: str, build: EnvFactory, options: dict[str, Any]) -> None:
    """Refuse an option the factory does not take (``EnvOptionError``, with the closest valid name)."""
    parameters = inspect.signature(build).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    valid = [n for n in parameters if n not in ("num_envs", "seed")]
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"its options: {valid}"
            raise EnvOptionError(f"{env_id} has no option {key!r}; {hint}", key)
