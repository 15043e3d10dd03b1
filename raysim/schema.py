"""Settings with their range, choices and one line of help: the schema the config sections are built from.

Every config dataclass (``raysim.config``, ``ModelConfig``, each algorithm's config) declares its fields
with ``setting``; the loader checks values against it (``violations``), and the config reference of
``raysim config`` and of the docs (``docs/config-reference.md``) is generated from it (``reference``), so
the documentation cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """What a setting allows: a range (``low``/``high``, each inclusive unless ``open_low``/``open_high``),
    choices, the same for each item of a list; ``help`` says what it is."""

    help: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    choices: tuple | None = None
    item_low: float | None = None  # each item of a list of numbers (an empty list has none to break it)
    check: Callable[[Any], str | None] | None = None  # any other rule: a message when broken

    def describe(self) -> str:
        """The allowed values in a few words (for the reference)."""
        if self.choices is not None:
            return " | ".join(str(c) for c in self.choices)
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.open_low else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.open_high else '<='} {self.high:g}")
        if self.item_low is not None:
            parts.append(f"items >= {self.item_low:g}")
        return ", ".join(parts)

    def violation(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (None when it is); ``None`` values are the type's business."""
        if value is None:
            return None
        if self.choices is not None:
            items = value if isinstance(value, list) else [value]
            bad = [v for v in items if v not in self.choices]
            if bad:
                return f"must be one of {list(self.choices)}, got {value!r}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                return f"must be a finite number, got {value!r}"
            if self.low is not None and (value <= self.low if self.open_low else value < self.low):
                return f"must be {'>' if self.open_low else '>='} {self.low:g}, got {value!r}"
            if self.high is not None and (value >= self.high if self.open_high else value > self.high):
                return f"must be {'<' if self.open_high else '<='} {self.high:g}, got {value!r}"
        if self.item_low is not None and isinstance(value, list):
            if any(v < self.item_low for v in value):
                return f"must be a list of numbers >= {self.item_low:g}, got {value!r}"
        return self.check(value) if self.check is not None else None


def setting(default: Any = MISSING, *, help: str, factory: Callable[[], Any] | None = None, **rule: Any) -> Any:
    """A dataclass field with its ``Rule``: ``help`` and the ``Rule`` fields (``low``, ``high``, ``choices``, ...)."""
    metadata = {"rule": Rule(help=help, **rule)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def rule_of(field: dataclasses.Field) -> Rule | None:
    return field.metadata.get("rule")


def violations(config: Any, prefix: str = "") -> list[str]:
    """``key: why`` for every value of a config dataclass (nested ones too) that its rule does not allow."""
    found = []
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            found += violations(value, key + ".")
            continue
        rule = rule_of(field)
        why = rule.violation(value) if rule is not None else None
        if why:
            found.append(f"{key} {why}")
    return found


def type_name(hint: Any) -> str:
    """A short name of a type hint: ``int``, ``float or null``, ``list of int``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or hint is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def reference(cls: type, prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """``(key, type, default, allowed, help)`` of every setting of ``cls`` (nested sections expanded)."""
    rows = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key, hint = f"{prefix}{field.name}", hints[field.name]
        if dataclasses.is_dataclass(hint):
            rows += reference(hint, key + ".")
            continue
        rule = rule_of(field)
        if rule is None:  # not a setting (e.g. the algo section, described by each algorithm's own config)
            continue
        if field.default is not MISSING:
            default = field.default
        elif field.default_factory is not MISSING:
            default = field.default_factory()
        else:
            default = "(required)"
        rows.append(
            (key, type_name(hint), as_yaml(default), rule.describe() if rule else "", rule.help if rule else "")
        )
    return rows


def as_yaml(value: Any) -> str:
    """A default as it is written in a YAML config."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, list):
        return "[" + ", ".join(as_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {as_yaml(v)}" for k, v in value.items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)
