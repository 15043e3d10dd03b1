"""``raysim.tune``: a hyperparameter sweep of raysim runs with Ray Tune, resumable, with the best config.

    grid = raysim.tune(load_config("cartpole_ppo"), {"algo.lr": "loguniform:1e-4:1e-2"}, samples=8,
                       scheduler="asha", experiment="runs/lr-sweep")
    grid.get_best_result()          # Tune's ResultGrid; runs/lr-sweep/best.yaml trains with `raysim train`

The experiment directory (a local path or a ``pyarrow.fs`` URI) holds Tune's state, one raysim run
directory per trial (``trials/<trial id>``), ``sweep.yaml`` (what ``resume`` rebuilds the sweep
from) and, at the end, ``best.yaml``. Each trial asks for a placement group sized from its own
config: a bundle for the trial's coordinator (``TRIAL_CPUS``) and one per role (shards, evaluation shards,
learner ranks); every trial the search space can make is checked against the cluster before anything
starts (``raysim.sweep.fit``).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from raysim.composition import ConfigError
from raysim.config import Config, to_dict
from raysim.coordinator.cluster import connect, ray_logs_dir
from raysim.coordinator.trainer import planned_iterations
from raysim.storage import is_uri, open_storage
from raysim.sweep.fit import (
    TRIAL_CPUS,
    extreme_trials,
    largest,
    refuse_elastic,
    refuse_unfittable,
    resource_params,
    trial_group,
)
from raysim.sweep.pause_fix import keep_paused_trials_alive
from raysim.sweep.space import Param, check_params, config_with, parse_spec
from raysim.sweep.tune_state import mend

SCHEDULERS = ("fifo", "asha", "pbt")
MODES = ("max", "min")
SWEEP_FILE, BEST_FILE = "sweep.yaml", "best.yaml"


@dataclass
class Sweep:
    """Everything that defines a sweep (``sweep.yaml``): the base config, the parameters, the search."""

    base: dict  # the plain-data config every trial starts from
    params: dict[str, str]  # config key -> KIND:ARGS
    experiment: str  # the experiment directory: an absolute local path or a URI
    samples: int = 1
    scheduler: str = "fifo"
    metric: str = "eval_return"
    mode: str = "max"
    max_concurrent: int | None = None
    grace_period: int = 1  # ASHA: reports before a trial can be stopped
    reduction_factor: float = 2.0  # ASHA: 1 / the fraction of trials kept at each rung
    perturbation_interval: int = 2  # PBT: reports between exploits
    quantile_fraction: float = 0.25  # PBT: the bottom fraction that exploits the top one
    synch: bool = False  # PBT: every trial perturbed together at each interval (waits for the slowest)
    max_failures: int = 2  # retries of a trial that failed, from its last checkpoint

    @property
    def parsed(self) -> list[Param]:
        """The parameters, parsed from their ``KIND:ARGS`` text."""
        return [parse_spec(key, spec) for key, spec in self.params.items()]


def check_sweep(sweep: Sweep) -> None:
    """The mistakes that can be caught before Ray starts, one line each."""
    if sweep.scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {sweep.scheduler!r}: one of {', '.join(SCHEDULERS)}")
    if sweep.mode not in MODES:
        raise ConfigError(f"--mode {sweep.mode!r}: one of {', '.join(MODES)}")
    if sweep.samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {sweep.samples}")
    params = sweep.parsed
    check_params(sweep.base, params)
    refuse_elastic(sweep.base, params)
    if sweep.scheduler == "pbt":
        check_mutations(sweep, params)
    extreme_trials(sweep.base, params, sweep.metric)  # every combination of the resource parameters is a valid config


def check_mutations(sweep: Sweep, params: list[Param]) -> None:
    """What PBT can mutate: not a grid, a model or env key (a cloned checkpoint would not fit it), or a key that
    changes what a trial asks Ray for (its placement group is fixed when it starts)."""
    if not params:
        raise ConfigError("--scheduler pbt needs at least one --param to mutate")
    fixed = [p.key for p in params if p.kind == "grid" or p.key.split(".")[0] in ("model", "env")]
    if fixed:
        raise ConfigError(
            f"--scheduler pbt mutates running trials, so it cannot search {fixed[0]} (a grid, or a model or env "
            "key: a cloned checkpoint would not fit it); use asha or fifo for it"
        )
    resources = resource_params(sweep.base, params, sweep.metric)
    if resources:
        raise ConfigError(
            f"--scheduler pbt mutates running trials, so it cannot search {resources[0].key}: it changes what a "
            "trial asks Ray for, and a trial's placement group is fixed when it starts; use asha or fifo for it"
        )


def planned_reports(config: Config) -> int:
    """The most reports a trial makes (ASHA's ``max_t``): one per log step, plus the final one."""
    return math.ceil(planned_iterations(config) / config.train.log_every) + 1


def scheduler_of(sweep: Sweep, trials: list[tuple[dict[str, Any], Config]]) -> Any:
    """Tune's trial scheduler for ``--scheduler``: on ``training_iteration``, one per report (ASHA's ``max_t``: the
    most reports of the ``extreme_trials``; fewer shards, smaller batches, more of them)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    if sweep.scheduler == "asha":
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=max(*(planned_reports(config) for _, config in trials), sweep.grace_period + 1),
            grace_period=sweep.grace_period,
            reduction_factor=sweep.reduction_factor,
        )
    if sweep.scheduler == "pbt":
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=sweep.perturbation_interval,
            hyperparam_mutations={p.key: p.domain() for p in sweep.parsed},
            quantile_fraction=sweep.quantile_fraction,
            synch=sweep.synch,
        )
    return FIFOScheduler()


def checkpoints_kept(sweep: Sweep) -> int:
    """How many of each trial's newest Tune checkpoints Tune keeps: 2; with PBT, ``2 x perturbation_interval + 2``.

    PBT clones the checkpoint a donor saved at its last perturbation while the donor goes on, reporting a
    checkpoint each time; the donor saves another at its next perturbation (``perturbation_interval`` reports
    later), and a trial that cloned it restores it when it starts again: twice that interval leaves room.
    """
    return 2 * sweep.perturbation_interval + 2 if sweep.scheduler == "pbt" else 2


def trainable_of(sweep: Sweep) -> Any:
    """``SweepTrial`` with the sweep's base config, each trial in a placement group sized from its own config."""
    from ray import tune

    from raysim.sweep.trainable import SweepTrial

    bound = tune.with_parameters(SweepTrial, base=sweep.base, experiment=sweep.experiment, metric=sweep.metric)
    return tune.with_resources(bound, partial(trial_group, base=sweep.base, metric=sweep.metric))


def experiment_location(path: str | None, name: str) -> str:
    """The experiment directory: a URI as given, a local path made absolute (trials chdir elsewhere)."""
    location = path or str(Path("runs") / f"{name}-sweep")
    return location.rstrip("/") if is_uri(location) else str(Path(location).resolve())


def tune(
    config: Config,
    param_space: dict[str, Any],
    *,
    samples: int = 1,
    scheduler: str = "fifo",
    metric: str = "eval_return",
    mode: str = "max",
    max_concurrent: int | None = None,
    experiment: str | None = None,
    address: str | None = None,
    **options: Any,
) -> Any:
    """Sweep ``config`` over ``param_space`` (config key -> ``KIND:ARGS`` text or ``{KIND: [ARGS]}``) with Ray
    Tune; returns Tune's ``ResultGrid`` and writes ``best.yaml`` into the experiment directory.

    ``options``: ``grace_period``, ``reduction_factor`` (ASHA), ``perturbation_interval``,
    ``quantile_fraction``, ``synch`` (PBT), ``max_failures``.
    """
    params = {key: parse_spec(key, spec).spec for key, spec in param_space.items()}
    base = to_dict(config)
    base["run_dir"] = None
    sweep = Sweep(
        base,
        params,
        experiment_location(experiment, config.name),
        samples=samples,
        scheduler=scheduler,
        metric=metric,
        mode=mode,
        max_concurrent=max_concurrent,
        **options,
    )
    check_sweep(sweep)
    storage = open_storage(sweep.experiment)
    if storage.exists(SWEEP_FILE):
        raise ConfigError(
            f"{sweep.experiment} holds a sweep already: continue it with `raysim tune --resume {sweep.experiment}`, "
            "or choose another --dir"
        )
    return _fit(sweep, address, resume=False)


def resume(experiment: str, address: str | None = None) -> Any:
    """Continue the interrupted sweep in ``experiment``: finished trials stay, the others go on from their
    last checkpoints; returns Tune's ``ResultGrid``."""
    sweep = load_sweep(experiment)
    check_sweep(sweep)
    return _fit(sweep, address, resume=True)


def load_sweep(experiment: str) -> Sweep:
    """The sweep of an experiment directory, from its ``sweep.yaml`` (the directory may have moved)."""
    location = experiment_location(experiment, "")
    storage = open_storage(location)
    if not storage.exists(SWEEP_FILE):
        raise FileNotFoundError(f"{location} is not a sweep's experiment directory (no {SWEEP_FILE})")
    data = yaml.safe_load(storage.read(SWEEP_FILE))
    return Sweep(**{**data, "experiment": location})


def _fit(sweep: Sweep, address: str | None, resume: bool) -> Any:
    """Connect to Ray, check that every trial fits, run (or restore and continue) the Tuner, write ``best.yaml``."""
    import ray
    from ray import tune as ray_tune

    trials = extreme_trials(sweep.base, sweep.parsed, sweep.metric)
    keep_paused_trials_alive()  # synchronous PBT: a trial paused while saving is not ended early
    # each report hands Tune a checkpoint, and Tune then saves its experiment state (what a resume needs)
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # an embedded Ray: room for the largest trial; Ray's messages on the console (Tune's among them)
    started = connect(largest(trials), address, extra_cpus=TRIAL_CPUS, keep_messages=False)
    try:
        refuse_unfittable(trials, ray)
        storage = open_storage(sweep.experiment)
        trainable = trainable_of(sweep)
        if resume:
            logs = ray_logs_dir()  # <ray temp>/session_*/logs: the staging copies are in that temp's sessions
            for name in mend(storage, Path(logs).parents[1] if logs else None):
                print(
                    f"raysim: {storage.path(name)} was cut short by the driver's end: Ray's staging copy put back",
                    flush=True,
                )
            tuner = ray_tune.Tuner.restore(sweep.experiment, trainable, resume_unfinished=True, resume_errored=True)
        else:
            storage.write(SWEEP_FILE, yaml.safe_dump(asdict(sweep), sort_keys=False).encode())
            parent, _, name = sweep.experiment.rpartition("/")
            tuner = ray_tune.Tuner(
                trainable,
                param_space={p.key: p.domain() for p in sweep.parsed},
                tune_config=ray_tune.TuneConfig(
                    metric=sweep.metric,
                    mode=sweep.mode,
                    num_samples=sweep.samples,
                    scheduler=scheduler_of(sweep, trials),
                    max_concurrent_trials=sweep.max_concurrent,
                ),
                run_config=ray_tune.RunConfig(
                    name=name,
                    storage_path=parent,
                    failure_config=ray_tune.FailureConfig(max_failures=sweep.max_failures),
                    checkpoint_config=ray_tune.CheckpointConfig(num_to_keep=checkpoints_kept(sweep)),
                    verbose=1,  # the table of trials; each trial's metrics are in its run directory
                ),
            )
        grid = tuner.fit()
        write_best(sweep, grid, storage)
        return grid
    finally:
        if started:
            ray.shutdown()


def best_config(sweep: Sweep, values: dict[str, Any]) -> dict:
    """The best trial's config as plain data that ``raysim train`` accepts (no run directory)."""
    data = to_dict(config_with(sweep.base, values))
    data["run_dir"] = None
    data["train"]["stop_after"] = None
    return data


def best_trial(sweep: Sweep, grid: Any) -> tuple[Any, dict[str, Any]] | None:
    """The best trial's result (by its last report) and its searched values; None if no trial reported the metric."""
    try:
        best = grid.get_best_result(metric=sweep.metric, mode=sweep.mode, scope="last")
    except RuntimeError:
        return None
    if best.metrics is None or sweep.metric not in best.metrics:
        return None
    return best, {k: v for k, v in best.config.items() if k in sweep.params}


def write_best(sweep: Sweep, grid: Any, storage) -> None:
    """``best.yaml`` of the best trial, if any trial reported the metric."""
    found = best_trial(sweep, grid)
    if found is not None:
        storage.write(BEST_FILE, yaml.safe_dump(best_config(sweep, found[1]), sort_keys=False).encode())


def unfinished_trials(experiment: str) -> int:
    """How many trials of the experiment's saved state are neither finished nor failed (after Ctrl-C)."""
    from ray.tune import ExperimentAnalysis

    return sum(t.status not in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(experiment).trials)
