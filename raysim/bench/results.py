"""The ``results.jsonl`` of ``raysim bench mujoco``: one line per finished run, and how lines are grouped.

A line names its run (peer, config, seed, steps and ``overrides``, the config overrides beyond the
packaged settings), its measures (and raysim's ``max_policy_lag``), and where and when it ran (``host``,
``cpus``, ``mujoco``: its version, ``started`` and ``finished`` in UTC, ``load_start`` and ``load_end``:
``os.getloadavg()``), so a table can say on what machine, how loaded, and when. Lines written before a
field existed read as lacking it: no overrides (the packaged settings), machine and dates unknown.

Lines are grouped by their ``settings``: the overrides against the config as packaged now (an override the
config took since reads as packaged), the policy lag as the run recorded it (the MuJoCo configs were
overlapped until 2026-12-05 and are lockstep since).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import platform
import re
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raysim.config import Config

PACKAGED = "packaged"  # the label of the runs at the packaged settings
MUJOCO = "3.3.0"  # the MuJoCo raysim pins (pyproject.toml's mujoco extra: the one metaworld 3.1.1 pins)
MUJOCO_SETTING = "MuJoCo "  # a run's setting that says it ran on another MuJoCo: not an override
LAG = "algo.max_policy_lag"  # overlapped collection (> 0) or lockstep (0)
SMOOTH = 10  # the plotted curves: running mean of this many curve rows
LAST_EPISODES = 10  # CleanRL's measure: the mean training return of the last episodes
# CleanRL ppo_continuous_action.py, 1M steps, MuJoCo v4: mean +- std over its benchmark seeds
ANCHORS = {"HalfCheetah": (1442.6, 46.0), "Hopper": (2382.9, 271.7), "Walker2d": (2287.9, 571.8)}
# SB3 + RL Zoo's published PPO models (huggingface.co/sb3/ppo-<env>-v3, 1M steps with the Zoo's tuned settings):
# one trained model each, its deterministic evaluation over 10 episodes (mean +- std over episodes)
SB3_ZOO = {"HalfCheetah": (5836.3, 171.7), "Hopper": (2410.1, 9.9), "Walker2d": (3571.7, 807.8)}
SB3_ZOO_LABEL = "SB3 + RL Zoo, published model (v3, one seed, 10 episodes)"


def seeded_rows_parser(prog: str, description: str, rows: tuple[str, ...]) -> argparse.ArgumentParser:
    """The options of a bench of rows per seed, each row a run (``finetune``, ``distill``): the seeds, the rows,
    the evaluation episodes, the results folder, the Ray address, ``--table`` (train nothing)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rows", nargs="+", choices=rows, default=list(rows), help="the rows to run (default: all)")
    parser.add_argument("--eval-episodes", type=int, default=None, help="evaluation episodes (default: the configs')")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    parser.add_argument("--address", default=None, help="Ray address of the runs (default: an embedded Ray per run)")
    parser.add_argument("--table", action="store_true", help="train nothing: print the table of the results")
    return parser


def read_results(path: Path) -> list[dict]:
    """Every line of ``path`` (none when it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def overrides(row: dict) -> tuple[str, ...]:
    """The run's config overrides beyond the packaged settings (none for a line without the field)."""
    return tuple(row.get("overrides") or ())


def run_settings(row: dict) -> tuple[str, ...]:
    """A run's settings against its config as packaged now: its overrides but those that set what the config sets
    now, ``algo.max_policy_lag`` among them only where the run's lag (as recorded, else as its overrides set it)
    differs from the packaged one. So a MuJoCo run made when the config was overlapped reads
    ``algo.max_policy_lag=1``, and an ``algo.max_policy_lag=0`` run of it reads as packaged. A peer's runs, and
    configs no longer packaged: their overrides as written. A run of a MuJoCo task on another MuJoCo than the one
    raysim pins (``MUJOCO``), or that recorded none, has that as a setting too (``MuJoCo 4.0.1``)."""
    given = overrides(row) + mujoco_setting(row)
    packaged = policy_lag(row["config"], ()) if row["peer"] == "raysim" else None
    if packaged is None:
        return given
    lag = run_lag(row)
    others = tuple(o for o in given if not o.startswith(f"{LAG}=") and not packaged_now(row["config"], o))
    return others if lag == packaged else (*others, f"{LAG}={lag}")


def simulates_with_mujoco(env: str) -> bool:
    """Whether a results line's env steps MuJoCo (the locomotion envs, Meta-World)."""
    return env.split("-")[0] in ANCHORS or env == "raysim/MetaWorld"


def mujoco_setting(row: dict) -> tuple[str, ...]:
    """``("MuJoCo <version>",)`` for a run of a MuJoCo task on another MuJoCo than ``MUJOCO`` (``MuJoCo not
    recorded``: a line from before lines recorded it); none otherwise."""
    if not simulates_with_mujoco(row["env"]):
        return ()
    version = row.get("mujoco")
    return () if version == MUJOCO else (f"{MUJOCO_SETTING}{version or 'not recorded'}",)


def run_lag(row: dict) -> int | None:
    """A raysim run's ``algo.max_policy_lag``: as recorded, else as its config and overrides set it (None: the
    config is not packaged)."""
    lag = row.get("max_policy_lag")
    return int(lag) if lag is not None else policy_lag(row["config"], overrides(row))


def policy_lag(config_name: str, given: tuple[str, ...]) -> int | None:
    """``algo.max_policy_lag`` of the packaged config with overrides ``given``; None where it is not packaged."""
    config = packaged_config(config_name, given)
    return None if config is None else config.algo.max_policy_lag


def packaged_now(config_name: str, override: str) -> bool:
    """Whether ``override`` sets what the packaged config sets now (a setting the config took after the run)."""
    if override.startswith(MUJOCO_SETTING):
        return False
    config = packaged_config(config_name, (override,))
    return config is not None and config == packaged_config(config_name, ())


@functools.cache
def packaged_config(config_name: str, given: tuple[str, ...]) -> Config | None:
    """The packaged config with overrides ``given`` (one load per pair); None where it is not packaged or refused."""
    from raysim.composition import ConfigError
    from raysim.config import load_config

    try:
        return load_config(config_name, list(given))
    except ConfigError:
        return None


def run_key(row: dict) -> tuple:
    """What makes two lines the same run: a later invocation skips a run whose key is in the results (a MuJoCo
    task's run on another MuJoCo is another run: ``mujoco_setting``)."""
    return row["peer"], row["config"], row["seed"], row["steps"], run_settings(row)


# the scripted policies of ``raysim eval --policy`` (``raysim.rollout.policies``), as the tables name them
SCRIPTED = {"expert": "expert (scripted, metaworld.policies)", "random": "random (uniform actions)"}


def settings_label(peer: str, settings: tuple[str, ...]) -> str:
    """How a table names a group's settings: ``packaged``, its overrides, the scripted policy, or the peer's name."""
    if peer in SCRIPTED:
        return ", ".join([SCRIPTED[peer], *(f"`{o}`" for o in settings)])
    if peer != "raysim":
        return f"{peer} (its own settings)"
    return ", ".join(f"`{o}`" for o in settings) if settings else PACKAGED


def run_name(peer: str, config_name: str, seed: int, steps: int, settings: tuple[str, ...]) -> str:
    """The run's folder and curve name; overrides mark it off from the packaged run (``...-algo.max_policy_lag=0``),
    and so does a MuJoCo version (``...-mujoco=3.3.0``)."""
    name = f"{peer}-{config_name}-s{seed}-{steps}"
    return "-".join([name, *(re.sub(r"[^\w.=-]", "_", o) for o in settings)])


def now() -> str:
    """The current UTC time, to the second (ISO 8601)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict:
    """Where a run ran: host name, CPU count and the MuJoCo it simulated with (None where not installed)."""
    return {"host": platform.node(), "cpus": os.cpu_count(), "mujoco": installed_version("mujoco")}


def installed_version(package: str) -> str | None:
    """The installed version of ``package``, None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def mean_std(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):,.1f} +- {spread:,.1f}"


def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]
