"""The run configuration: typed dataclasses with defaults, read from YAML.

``load_config(path, overrides=["algo.lr=1e-3", ...])`` reads the YAML with a safe loader, applies
``--set`` style overrides, and maps the result onto ``Config``. An unknown key or a value of the
wrong type is an error that names the key (and the closest valid key).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raysim.algos import algorithm_class
from raysim.algos.ppo import PPOConfig
from raysim.composition import ConfigError, expand, read_yaml, safe_load
from raysim.models import ModelConfig

PACKAGED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_CONFIG = "cartpole_ppo.yaml"
SINKS = ("console", "parquet", "tensorboard")  # the names train.sinks may list (raysim.metrics makes them)

__all__ = ["Config", "ConfigError", "load_config"]


@dataclass
class EnvConfig:
    """Which env each shard builds, and how many rows."""

    id: str = "raysim/CartPole"  # raysim/<Task> or gym:<Gymnasium id>
    num_envs: int = 64  # rows per shard
    kwargs: dict = field(default_factory=dict)  # options for the env factory
    on_nonfinite: str = "raise"  # raise | mask
    metadata: dict = field(default_factory=dict)  # the task's description, kept verbatim in snapshots


@dataclass
class ShardsConfig:
    """How many EnvShards, and what each asks Ray for."""

    count: int = 1
    num_cpus: float = 1.0
    resources: dict = field(default_factory=dict)  # custom Ray resources per shard
    max_restarts: int = 10  # shards replaced after their process died, over the run
    max: int | None = None  # elastic: grow up to this many shards as the cluster adds capacity (count is the minimum)


@dataclass
class LearnerConfig:
    """Where the learner runs."""

    device: str = "cpu"  # cpu | cuda | auto (a GPU when Ray gives one)
    num_gpus: float = 0.0  # per rank
    num_cpus: float = 1.0  # per rank
    ranks: int = 1  # data-parallel learner ranks (torch.distributed: gloo on CPU, NCCL on GPU)
    resources: dict = field(default_factory=dict)  # custom Ray resources per rank (e.g. {learner: 1})
    max_restarts: int = 3  # learner restarts from the newest checkpoint after its process died


@dataclass
class TrainConfig:
    """How long to train and how often to report."""

    total_steps: int = 100_000  # env steps, summed over shards
    log_every: int = 1  # iterations between progress lines
    stop_after: int | None = None  # stop this process after this many iterations (resume continues)
    sinks: list[str] = field(default_factory=lambda: list(SINKS))  # metrics sinks


@dataclass
class CheckpointConfig:
    """When to save and what to keep."""

    every: int = 50  # iterations between checkpoints (0: none by iterations)
    every_seconds: float = 300.0  # also after this much wall time since the last checkpoint (0: none by time)
    keep_last: int = 3  # newest checkpoints kept (plus the best by evaluation)


@dataclass
class EvalConfig:
    """Evaluation: balanced episodes over dedicated evaluation shards."""

    episodes: int = 100  # at the end of training (0: none)
    every: int = 0  # also every this many iterations (0: only at the end)
    every_steps: int = 0  # also whenever another this many env steps were collected (0: off)
    stop_return: float | None = None  # stop training at the first evaluation with this mean return or more
    shards: int = 1
    num_envs: int = 10  # rows per evaluation shard
    seed: int = 12345
    deterministic: bool = True  # argmax / mean action
    balanced: bool = True  # per-row quotas; False: plain "first n to finish" (biased, for comparison)
    confidence: float = 0.95  # of the Wilson intervals
    max_steps: int | None = None  # batched steps per shard; default: every quota at the episode limit


@dataclass
class Config:
    """A whole run."""

    name: str = "run"
    seed: int = 1
    env: EnvConfig = field(default_factory=EnvConfig)
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: Any = field(default_factory=PPOConfig)  # the Config dataclass of algo.name's algorithm (raysim.algos)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run_dir: str | None = None  # default: runs/<name>
    backend: str = "ray"  # ray | local (everything in this process; tests, debugging)


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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (default: the packaged ``cartpole_ppo.yaml``) and apply overrides.

    ``include:`` and ``env: {component: ...}`` references are expanded first (see composition.py).
    """
    file = resolve_config_path(path).resolve()
    return config_from_data(read_yaml(file) or {}, file, overrides)


def config_from_data(data: Any, file: Path, overrides: list[str] | None = None) -> Config:
    """A ``Config`` from the raw YAML data of ``file``: expanded, overridden, checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of keys, got {type(data).__name__}")
    data = expand(data, file.parent)
    for item in overrides or []:
        apply_override(data, item)
    config = from_dict(Config, data, str(file))
    check_config(config, str(file))
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
    data = read_yaml(file) or {}
    if isinstance(data, dict) and "id" in data and "env" not in data:
        run = read_yaml(snapshot)
        run["env"] = {**{k: v for k, v in run["env"].items() if k != "component"}, "component": str(file)}
        return config_from_data(run, snapshot, overrides)
    return config_from_data(data, file, overrides)


def check_config(config: Config, where: str = "config") -> None:
    """Checks across sections: the algorithm's own (e.g. GRPO's group size against the rows per shard); ranks."""
    unknown = [s for s in config.train.sinks if s not in SINKS]
    if unknown:
        raise ConfigError(f"{where}: train.sinks: unknown sink(s) {unknown}; valid: {list(SINKS)}")
    if config.shards.max is not None and config.shards.max < config.shards.count:
        raise ConfigError(f"{where}: shards.max ({config.shards.max}) must be >= shards.count ({config.shards.count})")
    ranks = config.learner.ranks
    if not isinstance(ranks, int) or ranks < 1 or config.shards.count % ranks:
        raise ConfigError(
            f"{where}: learner.ranks must be >= 1 and divide shards.count ({config.shards.count}), got {ranks!r}"
        )
    try:
        algorithm_class(config.algo.name).check(config.algo, config.env.num_envs)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from error


def apply_override(data: dict, item: str) -> None:
    """Apply one ``dotted.key=value`` (value parsed as YAML) to a nested dict."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. algo.lr=1e-3")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. algo.lr=1e-3")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part!r} is not a section")
    try:
        node[parts[-1]] = safe_load(raw)
    except yaml.YAMLError as error:
        raise ConfigError(
            f"--set {item!r}: the value is not valid YAML: {getattr(error, 'problem', None) or error}"
        ) from error


def from_dict(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    if cls is Config:  # the algo section's class depends on algo.name; a critic-free algorithm's model has none
        algo = data.get("algo") or {}
        name = algo.get("name", "ppo") if isinstance(algo, dict) else "ppo"
        try:
            algorithm = algorithm_class(name)
        except ValueError as error:
            raise ConfigError(f"{where}: {error}") from error
        hints = {**hints, "algo": algorithm.Config}
        model = data.get("model") or {}
        if not algorithm.uses_critic and isinstance(model, dict) and "critic" not in model:
            data = {**data, "model": {**model, "critic": False}}
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
