"""The run directory and its frozen configs: ``configs/gym.yaml`` (with exported resources) and ``configs/train.yaml``.

The coordinator is the one role that writes them: the task's resource export hook runs here, in
the driver, and writes into the run's ``resources/``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from raysim.composition import ConfigError
from raysim.config import Config, to_dict
from raysim.envs.registry import export_resources
from raysim.storage import RunStorage, open_storage

SNAPSHOT = "configs/train.yaml"  # the run's config; its env in configs/gym.yaml
RUNTIME_ONLY = ("run_dir", "train.stop_after")  # settings of one process, never kept in the snapshot


def choose_run_dir(config: Config) -> tuple[str, str | None]:
    """Where a new run goes and a note when the default name was taken (nothing is created: ``RunClaim.create``
    locks it and looks again under the lock, passing on to the next default name when it was taken meanwhile).

    ``run_dir`` (a local path or a URI), which must not hold anything yet (a run there is continued with
    ``raysim resume``), or ``runs/<name>``, suffixed ``-1``, ``-2``, ... when taken.
    """
    if config.run_dir:
        storage = open_storage(config.run_dir)
        local = Path(config.run_dir)
        if storage.is_local and local.exists() and not local.is_dir():
            raise ConfigError(f"run_dir {config.run_dir} is a file: choose another --run-dir")
        refusal = new_run_refusal(storage, config.run_dir)
        if refusal:
            raise ConfigError(refusal)
        return storage.location, None
    base = next(default_run_dirs(config.name))
    path = next(p for p in default_run_dirs(config.name) if not taken(Path(p)))
    return path, (f"{base} is taken: this run writes {path}" if path != base else None)


def default_run_dirs(name: str, after: str | None = None) -> Iterator[str]:
    """``runs/<name>``, ``runs/<name>-1``, ``-2``, ...: where a new run without ``run_dir`` goes (those after
    ``after`` only, when given)."""
    base = Path("runs") / name
    names = itertools.chain([str(base)], (str(base.with_name(f"{base.name}-{n}")) for n in itertools.count(1)))
    if after is not None:
        names = itertools.dropwhile(lambda path: path != after, names)
        next(names, None)
    return names


def taken(path: Path) -> bool:
    """Whether the local default run directory ``path`` cannot hold a new run (a file, or a directory with files)."""
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def new_run_refusal(storage: RunStorage, run_dir: str, ignore: tuple[str, ...] = ()) -> str | None:
    """Why a new run cannot go into ``run_dir`` (it holds a run, or other files but ``ignore``); None when empty."""
    names = [n for n in storage.list("") if n not in ignore and not n.startswith(".raysim-write-check-")]
    if not names:
        return None
    holds = storage.exists(SNAPSHOT)
    what = "holds a run" if holds else "is not an empty directory"
    hint = f"continue it with `raysim resume {run_dir}`, or " if holds else ""
    return f"run_dir {run_dir} {what}: {hint}choose another --run-dir"


def write_snapshot(storage: RunStorage, config: Config) -> None:
    """Freeze the run's configs: ``gym.yaml`` (the env, its resources exported by the task's hook into
    ``resources/``, files relative to it, metadata verbatim) and ``train.yaml`` (the whole run config,
    its env a component reference to gym.yaml)."""
    env = to_dict(config.env)
    with storage.writing_dir("resources") as resources:
        exported = export_resources(env["id"], env["kwargs"] or {}, resources)
        configs = resources.parent / "configs"  # where the files are referenced from
        kwargs = relative_files(exported, configs)
    gym = {"id": env["id"], "kwargs": kwargs, "metadata": config.env.metadata}
    train = to_dict(config)
    train["train"]["stop_after"] = None  # runtime-only: a resume runs to the end unless told otherwise
    train["env"] = {
        "component": "gym.yaml",
        "num_envs": config.env.num_envs,
        "on_nonfinite": config.env.on_nonfinite,
        "frame_stack": to_dict(config.env.frame_stack),  # the shard's, around the env: beside it, not in gym.yaml
    }
    for name, data in (("gym.yaml", gym), ("train.yaml", train)):
        storage.write(f"configs/{name}", yaml.safe_dump(data, sort_keys=False).encode())
    if not storage.list("resources"):
        storage.remove("resources")


def changed_settings(before: Config, after: Config) -> list[str]:
    """The settings ``after`` changes from ``before``, as ``key=value`` (runtime-only ones left out)."""
    old, new = flat(to_dict(before)), flat(to_dict(after))
    keys = [k for k in sorted(set(old) | set(new)) if k not in RUNTIME_ONLY and old.get(k) != new.get(k)]
    return [f"{k}={new.get(k)}" for k in keys]


def flat(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.key: value}``."""
    items: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            items.update(flat(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


#: Model options that do not change the shapes or meaning of saved weights (only how they start).
START_ONLY_MODEL_KEYS = ("init_log_std", "init_from")


def resume_refusal(meta: dict[str, Any], config: Config) -> str | None:
    """Why ``config`` cannot continue a checkpoint whose meta.json is ``meta`` (a different model or
    algorithm: its weights would not load, or would mean something else); None when it can."""
    lines = []
    saved_model = meta.get("model")
    if isinstance(saved_model, dict):
        model = to_dict(config.model)
        # a key the checkpoint predates (e.g. model.actor_inputs) had its default then
        saved_model = {**to_dict(type(config.model)()), **saved_model}
        for key in sorted(set(saved_model) | set(model)):
            if key not in START_ONLY_MODEL_KEYS and saved_model.get(key) != model.get(key):
                lines.append(
                    f"model.{key}: checkpoint has {saved_model.get(key)!r}, this config has {model.get(key)!r}"
                )
    saved_algo = meta.get("algo")
    if isinstance(saved_algo, str) and saved_algo != config.algo.name:
        lines.append(f"algo.name: checkpoint has {saved_algo!r}, this config has {config.algo.name!r}")
    teacher = meta.get("teacher")  # distillation keeps the teacher it started with (its copy in the run)
    if isinstance(teacher, dict) and saved_algo == config.algo.name:
        for key, saved in (("teacher", teacher.get("run")), ("teacher_inputs", teacher.get("inputs"))):
            value = getattr(config.algo, key, None)
            if saved is not None and value != saved and not (key == "teacher_inputs" and value == []):
                lines.append(f"algo.{key}: checkpoint has {saved!r}, this config has {value!r}")
    if not lines:
        return None
    return "the model or algorithm (or its teacher) differs from the checkpoint's:\n  " + "\n  ".join(lines)


def relative_files(value: Any, base: Path) -> Any:
    """Every ``{file: PATH}`` made relative to ``base`` (so the run directory can move)."""
    if isinstance(value, dict):
        if set(value) == {"file"}:
            return {"file": os.path.relpath(value["file"], base)}
        return {k: relative_files(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_files(v, base) for v in value]
    return value
