"""What the trials of a sweep ask Ray for: each trial's placement group, sized from the trial's own config, and
the checks, before any trial starts, that every trial the search space can make is a valid config that fits.

A *resource parameter* is one whose values change what a trial asks for (``shards.count``, ``learner.ranks``,
``eval.shards``, ``*.num_cpus``, ``*.num_gpus``, custom resources, ``backend``, ...). The trials checked are
every combination of the resource parameters' values: every value of a grid or a choice, the two bounds of a
uniform, loguniform or randint (what a trial asks for only grows with such a key, so between its bounds no
trial is larger than the largest bound's); the other parameters keep the base config's values.
"""

from __future__ import annotations

import itertools
from typing import Any

from raysim.composition import ConfigError
from raysim.config import Config
from raysim.coordinator.cluster import Need, needs, refuse_impossible, total
from raysim.sweep.space import Param, config_with, named
from raysim.sweep.trial import trial_config

TRIAL_CPUS = 0.1  # the trial's coordinator: it waits on its roles and writes the run directory
SIZING_DIR = "trial-sizing"  # the run directory of a config built only to size a trial (nothing is written there)


def trial_needs(config: Config) -> list[Need]:
    """What one trial asks for: its coordinator, then its role actors (none with ``backend: local``)."""
    coordinator = Need("trial coordinators", 1, {"CPU": TRIAL_CPUS}, f"a fixed {TRIAL_CPUS:g} CPU")
    return [coordinator, *(needs(config) if config.backend == "ray" else [])]


def trial_bundles(config: Config) -> list[dict[str, float]]:
    """The placement group of one trial: a bundle per actor of ``trial_needs``."""
    bundles = []
    for need in trial_needs(config):
        each = {k: v for k, v in need.each.items() if v > 0}
        bundles += [each] * need.count if each else []
    return bundles


def sized_config(base: dict, values: dict[str, Any], metric: str) -> Config:
    """The config of the trial with the searched ``values``, as far as what it asks Ray for goes."""
    return trial_config(base, values, SIZING_DIR, metric)


def trial_group(values: dict[str, Any], *, base: dict, metric: str) -> Any:
    """The placement group of the trial with the searched ``values`` (Tune calls it with each trial's config)."""
    from ray import tune

    return tune.PlacementGroupFactory(trial_bundles(sized_config(base, values, metric)))


def resource_params(base: dict, params: list[Param], metric: str) -> list[Param]:
    """The parameters whose values change what a trial asks Ray for."""
    plain = trial_bundles(sized_config(base, {}, metric))

    def changes(param: Param) -> bool:
        try:
            return any(trial_bundles(sized_config(base, {param.key: v}, metric)) != plain for v in param.extremes())
        except ConfigError:  # valid only beside other parameters' values (``check_params``): a resource key
            return True

    return [param for param in params if changes(param)]


def extreme_trials(base: dict, params: list[Param], metric: str) -> list[tuple[dict[str, Any], Config]]:
    """Every combination of the resource parameters' checked values with its trial's config (one with the base
    config's when there are none); a combination that is not a valid config is refused, naming its values."""
    found = resource_params(base, params, metric)
    trials = []
    for combination in itertools.product(*(p.extremes() for p in found)):
        values = {p.key: value for p, value in zip(found, combination, strict=True)}
        config_with(base, values, where=f"the trial with {named(values)}")
        trials.append((values, sized_config(base, values, metric)))
    return trials


def refuse_elastic(base: dict, params: list[Param]) -> None:
    """Elastic shards cannot run inside a trial: its placement group's size is fixed when it starts."""
    if (base.get("shards") or {}).get("max") is not None or any(p.key == "shards.max" for p in params):
        raise ConfigError(
            "shards.max (elastic shards) cannot be used in a sweep: a trial's shards live in its placement group, "
            "whose size is fixed when the trial starts; set shards.count (it may be a --param) and leave shards.max out"
        )


def refuse_unfittable(trials: list[tuple[dict[str, Any], Config]], ray) -> None:
    """Raise ``ResourceError`` for the first trial that can never fit in the cluster (see ``refuse_impossible``)."""
    checked: list[list[Need]] = []
    for values, config in trials:
        found = trial_needs(config)
        if found not in checked:
            checked.append(found)
            what = f"the trial with {named(values)}" if values else "one trial"
            refuse_impossible(found, ray, what=what, settle=10.0)


def largest(trials: list[tuple[dict[str, Any], Config]]) -> Config:
    """The config of the trial that asks for the most CPUs (then GPUs): what an embedded Ray is sized for."""

    def size(config: Config) -> tuple[float, float]:
        wanted = total(trial_needs(config))
        return wanted.get("CPU", 0.0), wanted.get("GPU", 0.0)

    return max((config for _, config in trials), key=size)
