"""The one env compatibility identity: a hash of the canonical, resolved env config.

``env_identity(env)`` hashes the *canonical* env config: the env id and its options with the
task's defaults filled in, materialized resources replaced by a hash of their content, and
runtime-only keys (row counts, seeds, devices, non-finite handling, file locations, descriptive
metadata) left out. It is computed the same way on save and on resume, so a run resumes from the
original declaration, from its own ``configs/gym.yaml`` snapshot, and from a moved run directory.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

import numpy as np

from raysim.envs.registry import factory, materialize

#: EnvConfig keys that do not change what the env is.
RUNTIME_ENV_KEYS = ("num_envs", "on_nonfinite", "metadata")
#: Env options that do not change what the env is.
RUNTIME_OPTION_KEYS = ("seed", "num_envs", "device")


def task_defaults(env_id: str) -> dict[str, Any]:
    """The options a task fills in when they are not given (from its factory's signature)."""
    if env_id.startswith("gym:"):
        import gymnasium as gym

        spec = gym.spec(env_id[len("gym:") :])
        return {"max_episode_steps": spec.max_episode_steps, **dict(spec.kwargs)}
    defaults = {}
    for name, parameter in inspect.signature(factory(env_id)).parameters.items():
        if parameter.default is not inspect.Parameter.empty and name not in RUNTIME_OPTION_KEYS:
            defaults[name] = parameter.default
    return defaults


def canonical_env(env: dict[str, Any]) -> dict[str, Any]:
    """The canonical form of a resolved env config (plain data, the input of the identity)."""
    options = {k: v for k, v in dict(env.get("kwargs") or {}).items() if k not in RUNTIME_OPTION_KEYS}
    options = {**task_defaults(env["id"]), **options}
    options = materialize(env["id"], options)
    return {"id": env["id"], "kwargs": _plain(options)}


def _plain(value: Any) -> Any:
    """Resources (arrays) become a hash of their content; everything else stays plain data."""
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
    digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, default=str).encode()).hexdigest()
    return digest[:16], canonical


def differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Every key whose value differs between two canonical configs, with both values."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: checkpoint has {a!r}, this config has {b!r}")
    return lines
