"""The run configuration: typed dataclasses with defaults, read from YAML.

``load_config(path, overrides=["algo.lr=1e-3", ...])`` reads the YAML with a safe loader, applies
``--set`` style overrides, and maps the result onto ``Config``. An unknown key or a value of the
wrong type is an error that names the key (and the closest valid key).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raysim.algos.models import ModelConfig
from raysim.algos.grpo import GRPOConfig
from raysim.algos.ppo import PPOConfig

PACKAGED_CONFIGS = Path(__file__).parent / "configs"
DEFAULT_CONFIG = "cartpole_ppo.yaml"


ALGOS = {"ppo": PPOConfig, "grpo": GRPOConfig}  # algo.name -> its config class


class ConfigError(ValueError):
    """A config that cannot be used, with the key and the file it came from."""


class _Loader(yaml.SafeLoader):
    """The safe loader, also reading ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3``, PyYAML a str)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


@dataclass
class EnvConfig:
    """Which env each shard builds, and how many rows."""

    id: str = "raysim/CartPole"  # raysim/<Task> or gym:<Gymnasium id>
    num_envs: int = 64  # rows per shard
    kwargs: dict = field(default_factory=dict)  # options for the env factory
    on_nonfinite: str = "raise"  # raise | mask


@dataclass
class ShardsConfig:
    """How many EnvShards, and what each asks Ray for."""

    count: int = 1
    num_cpus: float = 1.0
    resources: dict = field(default_factory=dict)  # custom Ray resources per shard


@dataclass
class LearnerConfig:
    """Where the learner runs."""

    device: str = "cpu"  # cpu | cuda | auto (a GPU when Ray gives one)
    num_gpus: float = 0.0
    num_cpus: float = 1.0


@dataclass
class TrainConfig:
    """How long to train and how often to report."""

    total_steps: int = 100_000  # env steps, summed over shards
    log_every: int = 1  # iterations between progress lines


@dataclass
class EvalConfig:
    """Evaluation: balanced episodes over dedicated evaluation shards."""

    episodes: int = 100  # at the end of training (0: none)
    every: int = 0  # also every this many iterations (0: only at the end)
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
    algo: PPOConfig | GRPOConfig = field(default_factory=PPOConfig)  # by algo.name, see ALGOS
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
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
    """Read a YAML config (default: the packaged ``cartpole_ppo.yaml``) and apply overrides."""
    file = resolve_config_path(path)
    try:
        data = yaml.load(file.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{file}: not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of keys, got {type(data).__name__}")
    for item in overrides or []:
        apply_override(data, item)
    config = from_dict(Config, data, str(file))
    check_config(config, str(file))
    return config


def check_config(config: Config, where: str = "config") -> None:
    """Checks across sections: GRPO's group size against the rows per shard."""
    algo = config.algo
    if algo.name == "grpo":
        size, rows = algo.group_size, config.env.num_envs
        if not isinstance(size, int) or size < 2 or rows % size:
            raise ConfigError(
                f"{where}: algo.group_size must be an integer >= 2 that divides env.num_envs ({rows}), got {size!r}"
            )


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
        node[parts[-1]] = yaml.load(raw, Loader=_Loader)
    except yaml.YAMLError as error:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML: {getattr(error, 'problem', None) or error}") from error


def from_dict(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    if cls is Config:  # the algo section's class depends on algo.name; GRPO's model has no critic by default
        algo = data.get("algo") or {}
        name = algo.get("name", "ppo") if isinstance(algo, dict) else "ppo"
        if name not in ALGOS:
            raise ConfigError(f"{where}: algo.name must be one of {sorted(ALGOS)}, got {name!r}")
        hints = {**hints, "algo": ALGOS[name]}
        model = data.get("model") or {}
        if name == "grpo" and isinstance(model, dict) and "critic" not in model:
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
