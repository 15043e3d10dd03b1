"""Config composition and the one env compatibility identity.

Composition: a mapping with ``include: FILE`` (anywhere) or, for the env, ``component: FILE``
is the content of that file with the mapping's other keys merged over it. Relative paths (the
included file, and every ``{file: PATH}`` resource reference) resolve against the declaring file.

Identity: ``env_identity(env)`` hashes the *canonical* env config: the env id and its options
with the task's defaults filled in, materialized resources replaced by a hash of their content,
and runtime-only keys (row counts, seeds, devices, non-finite handling, file locations,
descriptive metadata) left out. It is computed the same way on save and on resume, so a run
resumes from the original declaration, from its own ``configs/gym.yaml`` snapshot, and from a
moved run directory.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: EnvConfig keys that do not change what the env is.
RUNTIME_ENV_KEYS = ("num_envs", "on_nonfinite", "metadata")
#: Env options that do not change what the env is.
RUNTIME_OPTION_KEYS = ("seed", "num_envs", "device")


def read_yaml(path: Path) -> Any:
    """A YAML file through the safe loader, with errors that name the file."""
    from raysim.config import ConfigError, safe_load

    try:
        return safe_load(path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"file {path} not found") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error


def expand(data: Any, base: Path, depth: int = 0) -> Any:
    """``data`` with every ``include`` / ``component`` expanded and resource paths made absolute."""
    from raysim.config import ConfigError

    if depth > 16:
        raise ConfigError(f"{base}: includes nested more than 16 deep (a cycle?)")
    if isinstance(data, list):
        return [expand(v, base, depth) for v in data]
    if not isinstance(data, dict):
        return data
    if set(data) == {"file"} and isinstance(data["file"], str):  # a resource reference
        return {"file": str((base / data["file"]).resolve())}
    result: dict = {}
    for key in ("include", "component"):
        if key in data:
            file = (base / str(data[key])).resolve()
            included = expand(read_yaml(file), file.parent, depth + 1)
            if not isinstance(included, dict):
                raise ConfigError(f"{file}: an {key}d file must hold a mapping")
            result = merge(result, included)
    rest = {k: expand(v, base, depth) for k, v in data.items() if k not in ("include", "component")}
    return merge(result, rest)


def merge(base: dict, override: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``override`` replaces."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict) and set(value) != {"file"}:
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def task_defaults(env_id: str) -> dict[str, Any]:
    """The options a task fills in when they are not given (from its factory's signature)."""
    if env_id.startswith("gym:"):
        import gymnasium as gym

        spec = gym.spec(env_id[len("gym:") :])
        return {"max_episode_steps": spec.max_episode_steps, **dict(spec.kwargs)}
    from raysim.envs.registry import factory

    defaults = {}
    for name, parameter in inspect.signature(factory(env_id)).parameters.items():
        if parameter.default is not inspect.Parameter.empty and name not in RUNTIME_OPTION_KEYS:
            defaults[name] = parameter.default
    return defaults


def canonical_env(env: dict[str, Any]) -> dict[str, Any]:
    """The canonical form of a resolved env config (plain data, the input of the identity)."""
    from raysim.envs.registry import materialize

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
        return {"array_sha256": hashlib.sha256(array.tobytes()).hexdigest(), "shape": list(array.shape), "dtype": str(array.dtype)}
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
