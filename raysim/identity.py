"""The one env compatibility identity: a hash of the canonical, resolved env config.

``env_identity(env)`` hashes the *canonical* env config: the env id and its options with the
task's defaults filled in (for ``gym:`` ids, the Gymnasium env's constructor and registration
defaults), materialized resources replaced by a hash of their content, and runtime-only keys (row
counts, seeds, devices, non-finite handling, file locations, descriptive metadata, the Gymnasium
adapter's ``autoreset_mode`` and ``vectorize`` ``sync`` or ``async``, the Atari preset's ``threads``) left
out; ``vectorize: native`` is in it (the env's own vector env resets its rows, through a reset transition
the rows see); the Atari preset (``kwargs.atari``) has its defaults filled in; a frame stack
(``env.frame_stack`` with k > 1) is in it, as it changes what the policy sees (k = 1 adds nothing to
it). It is computed the same way on save and on resume, so a run resumes from the original
declaration, from its own ``configs/gym.yaml`` snapshot, and from a moved run directory. A
checkpoint's saved canonical config is put in ``current_form`` before it is compared
(``checkpoint_identity``): a run resumes whichever raysim version saved it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from enum import Enum
from typing import Any

import numpy as np

from raysim.envs.atari import canonical_preset
from raysim.envs.gym_adapter import RUNTIME_OPTIONS as ADAPTER_OPTIONS
from raysim.envs.gym_adapter import registered_id
from raysim.envs.registry import factory, materialize

#: EnvConfig keys that do not change what the env is.
RUNTIME_ENV_KEYS = ("num_envs", "on_nonfinite", "metadata")
#: Env options that do not change what the env is.
RUNTIME_OPTION_KEYS = ("seed", "num_envs", "device")


def signature_defaults(function: Any) -> dict[str, Any]:
    """The keyword defaults of ``function`` (a class: of its constructor), runtime keys left out."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty and name not in RUNTIME_OPTION_KEYS
    }


def task_defaults(env_id: str) -> dict[str, Any]:
    """The options a native task fills in when they are not given (from its factory's signature)."""
    return {} if env_id.startswith("gym:") else signature_defaults(factory(env_id))


def gym_defaults(env_id: str) -> dict[str, Any]:
    """What a Gymnasium id fills in: its env's constructor defaults, its registration's kwargs and step limit."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    spec = gym.spec(registered_id(env_id[len("gym:") :]))  # ids another package registers exist once imported
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    return {**signature_defaults(creator), "max_episode_steps": spec.max_episode_steps, **dict(spec.kwargs)}


def canonical_env(env: dict[str, Any]) -> dict[str, Any]:
    """The canonical form of a resolved env config (plain data, the input of the identity)."""
    options = {k: v for k, v in dict(env.get("kwargs") or {}).items() if k not in RUNTIME_OPTION_KEYS}
    options = {**task_defaults(env["id"]), **options}
    options = materialize(env["id"], options)
    stack = dict(env.get("frame_stack") or {})
    stacking = {"frame_stack": {"k": stack["k"], "groups": list(stack["groups"])}} if stack.get("k", 1) > 1 else {}
    return current_form({"id": env["id"], "kwargs": _plain(options), **stacking})


def current_form(canonical: dict[str, Any]) -> dict[str, Any]:
    """``canonical`` (as any raysim version saved it) in the form ``env_identity`` hashes: for ``gym:`` ids the
    adapter's runtime options left out (``vectorize: native`` kept) and the Gymnasium defaults filled in, for native
    tasks their defaults filled in (an option added later, such as ``raysim/MetaWorld``'s ``reward``) (idempotent)."""
    env_id, options = canonical["id"], dict(canonical.get("kwargs") or {})
    if env_id.startswith("gym:"):
        native = {"vectorize": "native"} if options.get("vectorize") == "native" else {}
        options = {**{k: v for k, v in options.items() if k not in ADAPTER_OPTIONS}, **native}
        if "atari" in options:  # the Atari preset: every option filled in, its runtime ones left out
            options["atari"] = canonical_preset(options["atari"])
        options = {**_plain(gym_defaults(env_id)), **options}
    else:  # a native task: an option it gained since the checkpoint was saved counts with its default
        options = {**_plain(task_defaults(env_id)), **options}
    stacking = {"frame_stack": canonical["frame_stack"]} if "frame_stack" in canonical else {}
    return {"id": env_id, "kwargs": _plain(options), **stacking}


def _plain(value: Any) -> Any:
    """Resources (arrays) become a hash of their content, an enum its name; everything else stays plain data."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "numpy") or isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value.numpy() if hasattr(value, "numpy") else value)
        return {
            "array_sha256": hashlib.sha256(array.tobytes()).hexdigest(),
            "shape": list(array.shape),
            "dtype": str(array.dtype),
        }
    return value


def env_identity(env: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(identity, canonical config)``: the one compatibility identity of an env config."""
    canonical = canonical_env(env)
    return _digest(canonical), canonical


def checkpoint_identity(meta: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """``(identity, canonical config)`` of a checkpoint's env (``meta.json``'s saved canonical config in
    ``current_form``): what a resumed run's ``env_identity`` is compared with."""
    saved = meta.get("canonical_env")
    if not saved:
        return meta.get("identity"), {}
    canonical = current_form(saved)
    return (meta.get("identity") if canonical == saved else _digest(canonical)), canonical


def _digest(canonical: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, default=str).encode()).hexdigest()[:16]


def differences(saved: dict, current: dict, prefix: str = "", source: str = "checkpoint") -> list[str]:
    """Every key whose value differs between two canonical configs, with both values (``saved``: the ``source``'s,
    a checkpoint's or a dataset's)."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += differences(a, b, f"{prefix}{key}.", source)
        elif a != b:
            lines.append(f"{prefix}{key}: {source} has {a!r}, this config has {b!r}")
    return lines
