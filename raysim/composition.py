"""Reading config files: the safe YAML loader, ``include`` / ``component`` composition, ``ConfigError``.

Composition: a mapping with ``include: FILE`` (anywhere) or, for the env, ``component: FILE``
is the content of that file with the mapping's other keys merged over it. Relative paths (the
included file, and every ``{file: PATH}`` resource reference) resolve against the declaring file.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config that cannot be used, with the key and the file it came from."""


class _Loader(yaml.SafeLoader):
    """The safe loader, also reading ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3``, PyYAML a str), and refusing a
    key given twice in one mapping (YAML forbids it; PyYAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: keys given here override it
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        "first given", first[key], f"key {key!r} given twice", key_node.start_mark
                    )
                first[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def safe_load(text: str) -> Any:
    """YAML through raysim's safe loader (no Python objects; ``1e-3`` is a float)."""
    return yaml.load(text, Loader=_Loader)


def read_yaml(path: Path) -> Any:
    """A YAML file through the safe loader, with errors that name the file."""
    try:
        return safe_load(path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"file {path} not found") from error
    except yaml.YAMLError as error:
        raise ConfigError(yaml_problem(path, error)) from None


def yaml_problem(path: Path, error: yaml.YAMLError) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: what`` in one line (PyYAML's own message quotes the source over 8)."""
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return f"{path}: not valid YAML: {' '.join(str(error).split())}"
    problem = getattr(error, "problem", None) or "cannot parse"
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    after = f" ({context} at line {start.line + 1}, column {start.column + 1})" if context and start else ""
    return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}{after}"


def expand(data: Any, base: Path, depth: int = 0) -> Any:
    """``data`` with every ``include`` / ``component`` expanded and resource paths made absolute."""
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
