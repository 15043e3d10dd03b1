"""Search spaces: ``KEY=KIND:ARGS`` parameters over config keys, checked against the config schema.

    algo.lr=loguniform:1e-4:1e-2      algo.ent_coef=choice:0,0.01      algo.num_steps=grid:32,64
    algo.clip_coef=uniform:0.1:0.3    algo.update_epochs=randint:2:8   (randint: high excluded)

The same text is accepted as a YAML mapping (``algo.lr: loguniform:1e-4:1e-2``, or ``algo.lr:
{loguniform: [1e-4, 1e-2]}``). Before a sweep starts, every trial the space can make is checked as a
config (``check_params``): every value of a finite parameter (each integer of a randint, every option),
the bounds of a continuous one, in every combination; a wrong key or a value that makes an invalid
trial is one line naming the parameter and its failing values.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raysim.composition import ConfigError, read_yaml, safe_load
from raysim.config import Config, apply_override, check_config, from_dict

BOUNDED = ("uniform", "loguniform", "randint")  # KIND:LOW:HIGH
LISTED = ("choice", "grid")  # KIND:A,B,...
KINDS = BOUNDED + LISTED
MOST_VALUES = 256  # a randint of more integers is checked at its first and last MOST_VALUES // 2
MOST_TRIALS = 1024  # more combinations: each value is checked beside the other parameters' extremes


@dataclass(frozen=True)
class Param:
    """One searched config key: a distribution over its values, or the values of a grid."""

    key: str
    kind: str
    values: tuple  # (low, high) of a bounded kind; the options of choice and grid

    @property
    def spec(self) -> str:
        """The ``KIND:ARGS`` text of this parameter (what ``parse_spec`` reads back)."""
        if self.kind in BOUNDED:
            return f"{self.kind}:{self.values[0]}:{self.values[1]}"
        return f"{self.kind}:" + ",".join(json.dumps(v) for v in self.values)

    def domain(self) -> Any:
        """The Ray Tune search space of this parameter."""
        from ray import tune

        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "loguniform":
            return tune.loguniform(*self.values)
        if self.kind == "randint":
            return tune.randint(*self.values)
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return tune.grid_search(list(self.values))

    def extremes(self) -> list[Any]:
        """The bounds (randint: the largest it draws), every option: what sizes the trials (``raysim.sweep.fit``)."""
        if self.kind == "randint":
            return [self.values[0], self.values[1] - 1]
        return list(self.values)

    def checked(self) -> list[Any]:
        """The values checked before a sweep starts: every value it can take where they are finite (a randint of
        more than ``MOST_VALUES``: its first and last ``MOST_VALUES // 2``), the bounds of a continuous one."""
        if self.kind != "randint":
            return self.extremes()
        low, high = self.values
        if high - low <= MOST_VALUES:
            return list(range(low, high))
        half = MOST_VALUES // 2
        return [*range(low, low + half), *range(high - half, high)]


def parse_param(text: str) -> Param:
    """``KEY=KIND:ARGS`` (``--param``)."""
    key, sep, spec = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--param {text!r}: expected KEY=KIND:ARGS, e.g. algo.lr=loguniform:1e-4:1e-2")
    return parse_spec(key.strip(), spec)


def parse_spec(key: str, spec: Any) -> Param:
    """A parameter from its ``KIND:ARGS`` text or a one-key mapping ``{KIND: [ARGS]}``."""
    where = f"--param {key}"
    if isinstance(spec, dict) and len(spec) == 1:
        kind, args = next(iter(spec.items()))
        args = args if isinstance(args, list) else [args]
    elif isinstance(spec, str) and ":" in spec:
        kind, _, rest = spec.partition(":")
        if kind in LISTED:
            try:
                args = safe_load(f"[{rest}]")
            except yaml.YAMLError:
                raise ConfigError(f"{where}: the values {rest!r} are not a comma-separated YAML list") from None
        else:
            args = [safe_load(part) for part in rest.split(":")]
    else:
        raise ConfigError(f"{where}: expected KIND:ARGS with KIND one of {', '.join(KINDS)}, got {spec!r}")
    kind = str(kind).strip()
    if kind not in KINDS:
        raise ConfigError(f"{where}: unknown distribution {kind!r} (one of: {', '.join(KINDS)})")
    if kind in LISTED:
        if not args:
            raise ConfigError(f"{where}: {kind} needs at least one value, e.g. {kind}:0,0.01")
        return Param(key, kind, tuple(args))
    if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        raise ConfigError(f"{where}: {kind} takes two numbers, {kind}:LOW:HIGH, got {spec!r}")
    low, high = args
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError(f"{where}: {kind} needs finite LOW < HIGH, got {low} and {high}")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"{where}: loguniform needs LOW > 0, got {low}")
    if kind == "randint" and not (isinstance(low, int) and isinstance(high, int)):
        raise ConfigError(f"{where}: randint takes two integers (HIGH excluded), got {low} and {high}")
    return Param(key, kind, (low, high))


def load_params(path: str | Path) -> list[Param]:
    """The parameters of a YAML file: a mapping of config keys to ``KIND:ARGS`` (``--params FILE``)."""
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigError(f"--params {path}: expected a mapping of config keys to KIND:ARGS, e.g. 'algo.lr: ...'")
    return [parse_spec(str(key), spec) for key, spec in data.items()]


def config_with(base: dict, values: dict[str, Any], where: str = "sweep") -> Config:
    """The config ``base`` (a plain-data config) with ``values`` (dotted key -> value) set, checked."""
    data = copy.deepcopy(base)
    for key, value in values.items():
        apply_override(data, f"{key}={json.dumps(value)}")
    config = from_dict(Config, data, where)
    check_config(config, where)
    return config


def check_params(base: dict, params: list[Param]) -> None:
    """Every trial the parameters can make, as a config on ``base``: one line naming the parameter and its values
    that make invalid trials (the first reason given).

    The trials checked are every combination of the parameters' ``checked`` values when there are at most
    ``MOST_TRIALS``; else each checked value beside the first combinations of the other parameters' ``extremes``
    (about ``MOST_TRIALS`` trials in all). A value invalid with the base config alone is accepted when each trial
    it is part of is valid (``learner.ranks=grid:1,2`` beside ``shards.count=grid:2,4`` on a base of one shard).
    """
    seen = set()
    for param in params:
        if param.key in seen:
            raise ConfigError(f"--param {param.key} is given twice")
        seen.add(param.key)
    failing = []
    for values in trials_checked(params):
        try:
            config_with(base, values, where=TRIAL)
        except ConfigError as error:
            failing.append((values, str(error).removeprefix(f"{TRIAL}: ")))
    if failing:
        raise ConfigError(refusal(base, params, failing))


TRIAL = "trial"  # the ``where`` of a checked trial's config (taken off its errors)


def trials_checked(params: list[Param]) -> list[dict[str, Any]]:
    """The searched values of each trial ``check_params`` checks."""
    keys = [p.key for p in params]
    if math.prod(len(p.checked()) for p in params) <= MOST_TRIALS:
        return [dict(zip(keys, c, strict=True)) for c in itertools.product(*(p.checked() for p in params))]
    trials, each = [], max(1, MOST_TRIALS // sum(len(p.checked()) for p in params))
    for i, param in enumerate(params):
        others = [*params[:i], *params[i + 1 :]]
        for value in param.checked():
            for combination in itertools.islice(itertools.product(*(p.extremes() for p in others)), each):
                trials.append({param.key: value, **{p.key: v for p, v in zip(others, combination, strict=True)}})
    return trials


def refusal(base: dict, params: list[Param], failing: list[tuple[dict[str, Any], str]]) -> str:
    """The one line of ``check_params``: the parameter whose values tell the failing trials apart (else the first
    that fails on the base config alone, else the first), those values, a failing trial and its reason."""
    bad = {p.key: [v for v in p.checked() if any(values[p.key] == v for values, _ in failing)] for p in params}
    telling = [p for p in params if len(bad[p.key]) < len(p.checked())]
    param = next(iter(telling), None) or next((p for p in params if fails_alone(base, p)), params[0])
    values, reason = next((v, r) for v, r in failing if v[param.key] in bad[param.key])
    shown = bad[param.key] if param in telling else []
    which = f"{param.key}={', '.join(map(str, shown))}" if shown else "every value"
    trial = f", e.g. the trial with {named(values)}" if len(params) > 1 else ""
    return f"--param {param.key}={param.spec}: {which} makes invalid trials{trial}: {reason}"


def fails_alone(base: dict, param: Param) -> bool:
    """Whether some checked value of ``param`` is an invalid config on ``base`` alone."""
    for value in param.checked():
        try:
            config_with(base, {param.key: value})
        except ConfigError:
            return True
    return False


def named(values: dict[str, Any]) -> str:
    """``key=value, ...`` of a trial's searched values."""
    return ", ".join(f"{key}={value}" for key, value in values.items())
