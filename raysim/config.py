"""The run configuration: typed dataclasses with defaults, read from YAML.

``load_config(path, overrides=["algo.lr=1e-3", ...])`` reads the YAML with a safe loader, applies
``--set`` style overrides, and maps the result onto ``Config``. An unknown key or a value of the
wrong type is an error that names the key (and the closest valid key).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raysim.algos import algorithm_class
from raysim.algos.ppo import PPOConfig
from raysim.checkpoint import KEEP_ABANDONED
from raysim.composition import ConfigError, expand, read_yaml, safe_load
from raysim.envs.frame_stack import FrameStackConfig
from raysim.models import ModelConfig
from raysim.schema import setting, violations
from raysim.storage import RunStorage

PACKAGED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_CONFIG = "cartpole_ppo.yaml"
SINKS = ("console", "parquet", "tensorboard", "wandb")  # the names train.sinks may list (raysim.metrics makes them)
DEFAULT_SINKS = SINKS[:3]  # not wandb: it needs an account (or WANDB_MODE=offline) and the wandb extra
#: Keys that were renamed, old name -> new name (within one section): the old name is still read, with a note.
RENAMED = {"shards.first_arrived": "shards.wait_fraction"}

__all__ = ["Config", "ConfigError", "load_config"]


def device_problem(value: str) -> str | None:
    if value in ("cpu", "auto") or value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit()):
        return None
    return f"must be cpu, cuda, cuda:<index> or auto, got {value!r}"


def resources_problem(value: dict) -> str | None:
    if all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        return None
    return f"must map resource names to amounts >= 0, e.g. {{shard: 1}}, got {value!r}"


def name_problem(value: str) -> str | None:
    if value and "/" not in value and value not in (".", ".."):
        return None
    return f"must be a non-empty name without '/', got {value!r}"


@dataclass
class EnvConfig:
    """Which env each shard builds, and how many rows."""

    id: str = setting("raysim/CartPole", help="raysim/<Task>, gym:<Gymnasium id>, or module.path:Class")
    num_envs: int = setting(64, help="rows per shard (one batched env)", low=1)
    kwargs: dict = setting(factory=dict, help="options of the env (its factory's keyword arguments)")
    frame_stack: FrameStackConfig = field(default_factory=FrameStackConfig)  # applied by the shard, to any env
    on_nonfinite: str = setting(
        "raise", help="an env's NaN or inf: stop, or drop that row's episode", choices=("raise", "mask")
    )
    success: str | None = setting(
        None,
        help="an episode's success: set at any step, or at its final step; null: the env's own count (any for "
        "raysim/MetaWorld, final for the rest); reporting only, not the env identity",
        choices=("any", "final"),
    )
    metadata: dict = setting(factory=dict, help="the task's description, kept verbatim in the run's snapshot")


@dataclass
class ShardsConfig:
    """How many EnvShards, and what each asks Ray for."""

    count: int = setting(1, help="env shards (Ray actors); the minimum when shards.max is set", low=1)
    num_cpus: float = setting(1.0, help="CPUs each shard asks Ray for (fractions allowed)", low=0)
    resources: dict = setting(
        factory=dict, help="custom Ray resources per shard, e.g. {shard: 1}", check=resources_problem
    )
    max_restarts: int = setting(10, help="shards replaced after their process died, over the run", low=0)
    max: int | None = setting(None, help="elastic: grow up to this many shards as the cluster adds room", low=1)
    wait_fraction: float = setting(
        1.0,
        help="a batch waits for the chunks of this fraction of each rank's shards, the first to arrive (1: all; "
        "below 1: timing-dependent)",
        low=0,
        high=1,
        open_low=True,
    )
    placement: str = setting(
        "collocated",
        help="collocated: each shard acts with its own copy of the actor; servers: shards keep the envs and ask "
        "policy servers (servers.*) for the actions",
        choices=("collocated", "servers"),
    )


@dataclass
class ServersConfig:
    """Policy servers (shards.placement: servers): the actor's weights in one place, acting for many shards."""

    count: int = setting(1, help="policy servers; shard i asks server i mod count", low=1)
    num_cpus: float = setting(1.0, help="CPUs each server asks Ray for", low=0)
    num_gpus: float = setting(0.0, help="GPUs each server asks Ray for", low=0)
    device: str = setting(
        "cpu", help="cpu, cuda, cuda:<index>, or auto (a GPU when Ray gives one)", check=device_problem
    )
    resources: dict = setting(
        factory=dict, help="custom Ray resources per server, e.g. {server: 1}", check=resources_problem
    )
    max_restarts: int = setting(10, help="servers replaced after their process died, over the run", low=0)
    pipeline: int = setting(
        1,
        help="groups of rows per training shard, each its own env in a thread of its own: one steps while another "
        "waits for its actions (1: none; algorithms of fixed-length chunks: PPO, distill)",
        low=1,
    )


@dataclass
class LearnerConfig:
    """Where the learner runs."""

    device: str = setting(
        "cpu", help="cpu, cuda, cuda:<index>, or auto (a GPU when Ray gives one)", check=device_problem
    )
    num_gpus: float = setting(0.0, help="GPUs each learner rank asks Ray for", low=0)
    num_cpus: float = setting(1.0, help="CPUs each learner rank asks Ray for", low=0)
    ranks: int = setting(
        1, help="data-parallel learner ranks (gloo on CPU, NCCL on GPU); must divide shards.count", low=1
    )
    resources: dict = setting(
        factory=dict, help="custom Ray resources per rank, e.g. {learner: 1}", check=resources_problem
    )
    max_restarts: int = setting(3, help="learner restarts after its process died, over the run", low=0)


@dataclass
class TrainConfig:
    """How long to train and how often to report."""

    total_steps: int = setting(100_000, help="env steps to train for, summed over shards", low=1)
    log_every: int = setting(1, help="iterations between log steps (progress line, metrics rows)", low=1)
    stop_after: int | None = setting(None, help="stop this process after this many iterations (resume goes on)", low=1)
    sinks: list[str] = setting(factory=lambda: list(DEFAULT_SINKS), help="where metrics go", choices=SINKS)


@dataclass
class CheckpointConfig:
    """When to save and what to keep."""

    every: int = setting(50, help="iterations between checkpoints (0: none by iterations)", low=0)
    every_seconds: float = setting(300.0, help="also this much wall time after the last one (0: none by time)", low=0)
    keep_last: int = setting(3, help="newest checkpoints kept (plus the best by evaluation)", low=1)
    keep_abandoned: int = setting(
        KEEP_ABANDONED, help="abandoned timelines kept under checkpoints/abandoned/ (the newest retirements)", low=0
    )


@dataclass
class ReplayConfig:
    """The replay buffer of an off-policy algorithm (``algo.name: sac``), on each learner rank."""

    capacity: int = setting(1_000_000, help="transitions each learner rank keeps (first in, first out)", low=1)
    save: bool = setting(
        True,
        help="save the buffer's transitions beside the checkpoints, so a resume continues exactly (false: a resume "
        "refills it)",
    )


@dataclass
class EvalConfig:
    """Evaluation: balanced episodes over dedicated evaluation shards."""

    episodes: int = setting(100, help="episodes of the final evaluation (0: none)", low=0)
    every: int = setting(0, help="also evaluate every this many iterations (0: only at the end)", low=0)
    every_steps: int = setting(0, help="also whenever another this many env steps were collected (0: off)", low=0)
    stop_return: float | None = setting(None, help="stop at the first evaluation with this mean return or more")
    shards: int = setting(1, help="evaluation shards", low=1)
    num_envs: int = setting(10, help="rows per evaluation shard", low=1)
    seed: int = setting(12345, help="seed of the evaluation episodes", low=0)
    deterministic: bool = setting(True, help="argmax / mean actions (false: sampled)")
    balanced: bool = setting(
        True, help="per-row quotas (false: the first episodes to finish; biased, depends on the layout)"
    )
    confidence: float = setting(
        0.95, help="level of the Wilson intervals", low=0, high=1, open_low=True, open_high=True
    )
    max_steps: int | None = setting(
        None,
        help="steps an episode may take, then it is cut and not completed (default: the episode limit, or 1000)",
        low=1,
    )
    video: bool = setting(
        False, help="film every evaluation during training into videos/<iteration>.mp4 in the run (extra: video)"
    )
    video_frames: int = setting(
        2000, help="frames a video holds at most (the rest of the evaluation is not filmed)", low=1
    )
    video_size: int = setting(128, help="pixels per side of a row's picture, for envs that draw their own", low=8)
    video_fps: int = setting(25, help="frames per second of a video", low=1)


@dataclass
class Config:
    """A whole run."""

    name: str = setting("run", help="the run's name (its default directory: runs/<name>)", check=name_problem)
    seed: int = setting(1, help="seed of the weights, the shards' envs and the sampling", low=0)
    env: EnvConfig = field(default_factory=EnvConfig)
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    servers: ServersConfig = field(default_factory=ServersConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: Any = field(default_factory=PPOConfig)  # the Config dataclass of algo.name's algorithm (raysim.algos)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)  # read by off-policy algorithms only
    run_dir: str | None = setting(None, help="where the run is written (default: runs/<name>)")
    backend: str = setting(
        "ray", help="ray, or local: every role in this process (tests, debugging)", choices=("ray", "local")
    )
    resources_timeout: float = setting(600.0, help="seconds to wait for the cluster to make room for every role", low=0)


def resolve_config_path(path: str | Path | None) -> Path:
    """A config file by path, or by name among the packaged configs (``cartpole_ppo``)."""
    if path is None:
        return PACKAGED_CONFIGS / DEFAULT_CONFIG
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    for name in (candidate.name, f"{candidate.name}.yaml"):
        if (PACKAGED_CONFIGS / name).is_file() and not candidate.exists():
            return PACKAGED_CONFIGS / name
    packaged = sorted(p.name for p in PACKAGED_CONFIGS.glob("*.yaml"))
    raise ConfigError(f"config file {str(path)!r} not found (packaged configs: {packaged})")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, check: bool = True) -> Config:
    """Read a YAML config (default: the packaged ``cartpole_ppo.yaml``) and apply overrides.

    ``include:`` and ``env: {component: ...}`` references are expanded first (see composition.py). ``check``
    False: each value's type is checked, not the rules across keys (a packaged config with a key its user sets,
    such as ``reach_camera_distill``'s ``algo.teacher``, still names its env).
    """
    file = resolve_config_path(path).resolve()
    return config_from_data(read_config(file), file, overrides, check)


def read_config(file: Path) -> Any:
    """A config file's YAML; an empty one (or only comments) is refused: it would train on every default."""
    data = read_yaml(file)
    if data is None:
        raise ConfigError(
            f"{file} is empty: it would train on every default; give a config that sets the run (`raysim config` "
            "lists every key), or none for the packaged cartpole_ppo"
        )
    return data


def config_from_data(data: Any, file: Path, overrides: list[str] | None = None, check: bool = True) -> Config:
    """A ``Config`` from the raw YAML data of ``file``: expanded, overridden, checked (``check_config``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of keys, got {type(data).__name__}")
    data = expand(data, file.parent)
    rename_old_keys(data, str(file))
    for item in overrides or []:
        apply_override(data, item)
    where = f"{file} with --set" if overrides else str(file)
    config = from_dict(Config, data, where)
    if check:
        check_config(config, where)
    return config


def load_resume_config(run_dir: Path, path: str | Path | None, overrides: list[str]) -> Config:
    """The config to resume ``run_dir`` with: its snapshot, a whole run config, or an env config.

    An env config (a file with an ``id`` and no ``env`` section, such as the run's own
    ``configs/gym.yaml``) replaces the env of the run's snapshot; its row counts stay.
    """
    snapshot = run_dir / "configs" / "train.yaml"
    if path is None:
        return load_config(snapshot, overrides)
    file = resolve_config_path(path).resolve()
    data = read_config(file)
    if isinstance(data, dict) and "id" in data and "env" not in data:
        run = read_yaml(snapshot)
        run["env"] = {**{k: v for k, v in run["env"].items() if k != "component"}, "component": str(file)}
        return config_from_data(run, snapshot, overrides)
    return config_from_data(data, file, overrides)


def load_run_config(storage: RunStorage, overrides: list[str] | None = None) -> Config:
    """A run's own config snapshot (``configs/train.yaml``, its env and task resources beside it; copied here
    first when the run is on a remote filesystem); ``run_dir`` is the run's location."""
    root = storage.local_copy("configs", "resources")
    config = load_config(root / "configs" / "train.yaml", overrides)
    config.run_dir = storage.location
    return config


def check_config(config: Config, where: str = "config") -> None:
    """Every value against its setting's rule (the first one broken is named), then the checks across
    sections: the algorithm's own (e.g. GRPO's group size against the rows per shard), learner ranks."""
    problems = violations(config)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{where}: {problems[0]}{more}")
    if config.shards.max is not None and config.shards.max < config.shards.count:
        raise ConfigError(f"{where}: shards.max ({config.shards.max}) must be >= shards.count ({config.shards.count})")
    if config.model.cnn == "keypoints" and config.model.cnn_features % 2:
        raise ConfigError(
            f"{where}: model.cnn_features must be even with model.cnn: keypoints (an x and a y per keypoint), "
            f"got {config.model.cnn_features}"
        )
    try:
        algorithm = algorithm_class(config.algo.name)
        algorithm.check(config.algo, config.env.num_envs)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from error
    ranks = config.learner.ranks
    if not isinstance(ranks, int) or ranks < 1 or training_shards(config) % ranks:
        raise ConfigError(
            f"{where}: learner.ranks must be >= 1 and divide shards.count ({config.shards.count}), got {ranks!r}"
            if training_shards(config)
            else f"{where}: learner.ranks must be >= 1, got {ranks!r}"
        )
    plan, minibatches = algorithm.collection(config.algo), config.algo.num_minibatches
    per_row = plan.steps_per_row if plan is not None else None
    if plan is not None:
        check_pipeline(config, per_row, where)
    rows, counted = least_trained_rows(config)
    if config.model.recurrent != "none":
        check_recurrent(config, algorithm.trains_recurrent, where)
    if per_row is not None and rows * per_row < minibatches:
        raise ConfigError(
            f"{where}: algo.num_minibatches ({minibatches}) is more than a learner rank's batch of {rows * per_row} "
            f"transitions ({counted} x {per_row} steps): lower it or collect more"
        )


def check_recurrent(config: Config, trains_recurrent: bool, where: str) -> None:
    """A ``ConfigError`` for a setting a recurrent model (``model.recurrent``) cannot train with."""
    rows, counted = least_trained_rows(config)
    minibatches = config.algo.num_minibatches
    if not trains_recurrent:
        raise ConfigError(
            f"{where}: algo {config.algo.name!r} does not train recurrent policies (model.recurrent: "
            f"{config.model.recurrent}); use algo.name: ppo, or model.recurrent: none"
        )
    kl_coef = getattr(config.algo, "kl_coef", 0.0)
    if kl_coef > 0:
        raise ConfigError(
            f"{where}: algo.kl_coef ({kl_coef}) pulls toward a frozen actor whose recurrent state at a chunk's start "
            f"is unknown (model.recurrent: {config.model.recurrent}); set algo.kl_coef: 0, or model.recurrent: none"
        )
    if config.shards.max is None and rows % minibatches:
        raise ConfigError(
            f"{where}: with model.recurrent a minibatch is whole rows: a learner rank's {rows} rows "
            f"({counted}) must divide into algo.num_minibatches ({minibatches})"
        )
    if rows < minibatches:  # elastic: the rows vary, an uneven split uses them all (run_epochs)
        raise ConfigError(
            f"{where}: with model.recurrent a minibatch is whole rows: a learner rank can train on as few as "
            f"{rows} rows ({counted}; elastic shards never go below shards.count), fewer than "
            f"algo.num_minibatches ({minibatches})"
        )


def check_pipeline(config: Config, per_row: int | None, where: str) -> None:
    """A ``ConfigError`` for a ``servers.pipeline`` its shards cannot split (``per_row``: the plan's steps per row,
    None for episodes per row)."""
    pipeline = config.servers.pipeline
    if pipeline == 1 or config.shards.placement != "servers":
        return
    if per_row is None:
        raise ConfigError(
            f"{where}: servers.pipeline ({pipeline}) needs chunks of fixed steps (PPO, distill); algo "
            f"{config.algo.name!r} plays episodes per row: set servers.pipeline: 1"
        )
    if config.env.num_envs % pipeline:
        raise ConfigError(
            f"{where}: servers.pipeline ({pipeline}) must divide env.num_envs ({config.env.num_envs}): each group is "
            "a batched env of env.num_envs / servers.pipeline rows"
        )


def training_shards(config: Config) -> int:
    """The training shards a run starts with: ``shards.count``, none for an algorithm that collects nothing (BC)."""
    return 0 if algorithm_class(config.algo.name).collection(config.algo) is None else config.shards.count


def shards_awaited(shards: int, wait_fraction: float) -> int:
    """How many of a learner rank's ``shards`` an update waits for: ``ceil(wait_fraction * shards)``, at least one."""
    return min(shards, max(1, math.ceil(wait_fraction * shards)))


def least_trained_rows(config: Config) -> tuple[int, str]:
    """The fewest env rows a learner rank trains on in one update, and how they are counted: the chunks of the
    first ``shards_awaited`` of its share of ``shards.count`` to arrive (the collector's rule; elastic shards never
    go below ``shards.count``), ``env.num_envs`` rows each."""
    shards, fraction = config.shards.count // config.learner.ranks, config.shards.wait_fraction
    taken = shards_awaited(shards, fraction)
    if taken == shards:
        return taken * config.env.num_envs, "shards.count / learner.ranks x env.num_envs"
    return (
        taken * config.env.num_envs,
        f"the first {taken} of its {shards} shards to arrive, shards.wait_fraction {fraction:g}, x env.num_envs",
    )


def apply_override(data: dict, item: str) -> None:
    """Apply one ``dotted.key=value`` (value parsed as YAML) to a nested dict."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. algo.lr=1e-3")
    key, raw = item.split("=", 1)
    key = key.strip()
    if key in RENAMED:
        deprecation_note(f"--set {item!r}", key)
        key = RENAMED[key]
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. algo.lr=1e-3")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part!r} is not a section")
    try:
        value = safe_load(raw)
    except yaml.YAMLError as error:
        raise ConfigError(
            f"--set {item!r}: the value is not valid YAML: {getattr(error, 'problem', None) or error}"
        ) from error
    if isinstance(value, dict):  # a whole section: its keys may be old names too
        rename_old_keys(value, f"--set {item!r}", prefix=key + ".")
    node[parts[-1]] = value


def rename_old_keys(data: dict, where: str, prefix: str = "") -> None:
    """Give every old key of ``RENAMED`` in ``data`` (the mapping at dotted ``prefix``) its new name, with a note
    for each; a section that has both names is a ``ConfigError``."""
    for old, new in RENAMED.items():
        if not old.startswith(prefix):
            continue
        *path, old_name = old[len(prefix) :].split(".")
        new_name = new.rsplit(".", 1)[-1]
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_name not in node:
            continue
        if new_name in node:
            raise ConfigError(f"{where}: {old} is the old name of {new}: set only {new}")
        node[new_name] = node.pop(old_name)
        deprecation_note(where, old)


def deprecation_note(where: str, old: str) -> None:
    """One line on stderr: ``old`` is read as its new name, which the config should use."""
    print(f"raysim: {where}: {old} is deprecated: read as {RENAMED[old]}, its new name", file=sys.stderr)


def from_dict(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    if cls is Config:  # the algo section's class depends on algo.name, and so do some model defaults
        algo = data.get("algo") or {}
        name = algo.get("name", "ppo") if isinstance(algo, dict) else "ppo"
        try:
            algorithm = algorithm_class(name)
        except ValueError as error:
            raise ConfigError(f"{where}: {error}") from error
        hints = {**hints, "algo": algorithm.Config}
        model = data.get("model") or {}
        if isinstance(model, dict):
            data = {**data, "model": {**algorithm.model_defaults(), **model}}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid keys: {sorted(fields)}"
            raise ConfigError(f"{where}: unknown key {dotted!r}{hint}")
        values[key] = _convert(hints[key], value, where, dotted)
    return cls(**values)


def _convert(hint: Any, value: Any, where: str, key: str) -> Any:
    """``value`` checked (and, for int -> float, widened) against the type ``hint``."""
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where, key + ".")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    expected = origin or hint
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is Any or (isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)):
        if expected is list and args:
            return [_convert(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(value)]
        return value
    raise ConfigError(f"{where}: {key} must be {getattr(expected, '__name__', expected)}, got {value!r}")


def to_dict(config: Any) -> dict:
    """A plain-data copy of a config (for snapshots and logs)."""
    return dataclasses.asdict(config)
