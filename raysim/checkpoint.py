"""Checkpoints: ``checkpoints/<iteration>/`` appears whole or not at all; loading runs no code.

A checkpoint directory holds ``state.pt`` (tensors and plain data: weights, optimizer, schedule,
RNG states, shard and env states) and ``meta.json`` (counters, the env identity and its canonical
config, package versions). It is written under a temporary name and renamed; the ``latest``
pointer (``checkpoints/latest``, a one-line file) is replaced atomically after it. Loading uses
``torch.load(weights_only=True)``: a file that carries pickled code is refused.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: the message names the file and the cause."""


def package_versions() -> dict[str, str]:
    """The versions that produced a checkpoint (kept in meta.json, for the record)."""
    versions = {"python": platform.python_version()}
    for name in ("raysim", "torch", "ray", "gymnasium", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def save_checkpoint(
    run_dir: str | Path, iteration: int, state: dict[str, Any], meta: dict[str, Any], keep_last: int = 3
) -> Path:
    """Write checkpoint ``iteration`` atomically, point ``latest`` at it, prune old ones.

    Kept: the newest ``keep_last`` checkpoints, plus the one with the best ``meta["eval_return"]``.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / str(iteration)
    tmp = root / f".tmp-{iteration}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    meta = {**meta, "iteration": iteration, "versions": package_versions()}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    for file in tmp.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():  # a re-save of the same iteration replaces it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(f"{iteration}\n")
    os.replace(pointer, root / "latest")
    prune(root, keep_last)
    return final


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints and the best evaluated one."""
    steps = checkpoint_steps(root)
    keep = set(steps[-keep_last:]) if keep_last > 0 else set(steps[-1:])
    scored = [(read_meta(root / str(s)).get("eval_return"), s) for s in steps]
    scored = [(score, s) for score, s in scored if isinstance(score, (int, float))]
    if scored:
        keep.add(max(scored)[1])
    for step in steps:
        if step not in keep:
            shutil.rmtree(root / str(step), ignore_errors=True)


def checkpoint_steps(root: Path) -> list[int]:
    """The iterations that have a checkpoint directory, ascending."""
    return sorted(int(p.name) for p in root.glob("*") if p.is_dir() and p.name.isdigit())


def read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, meta)`` of a checkpoint directory; a clear ``CheckpointError`` when damaged."""
    path = Path(path)
    for name in ("state.pt", "meta.json"):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {path / name} is missing")
    try:
        meta = json.loads((path / "meta.json").read_text())
    except ValueError as error:
        raise CheckpointError(f"checkpoint file {path / 'meta.json'} is corrupted: {error}") from error
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, bad pickle, or a pickled object that would run code
        cause = (
            "it carries pickled objects (refused: loading never runs code)"
            if "weights_only" in str(error)
            else str(error).splitlines()[0]
        )
        raise CheckpointError(f"checkpoint file {path / 'state.pt'} cannot be loaded: {cause}") from error
    return state, meta


def load_latest(run_dir: str | Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The newest intact checkpoint of a run: ``(path, state, meta)``.

    Damaged checkpoints are skipped with a message naming the file; none intact is an error.
    """
    root = Path(run_dir) / "checkpoints"
    steps = checkpoint_steps(root)
    if not steps:
        raise CheckpointError(f"run directory {run_dir} has no checkpoint under {root}")
    errors = []
    for step in reversed(steps):
        try:
            state, meta = load_checkpoint(root / str(step))
        except CheckpointError as error:
            errors.append(str(error))
            print(f"raysim: skipping damaged checkpoint: {error}", flush=True)
            continue
        if errors:
            print(f"raysim: falling back to checkpoint {root / str(step)}", flush=True)
        return root / str(step), state, meta
    raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(errors))


def locate_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint_dir)`` for a run directory (its newest checkpoint) or a checkpoint directory."""
    path = Path(path)
    if (path / "state.pt").is_file():
        return path.parent.parent, path
    if not (path / "configs" / "train.yaml").is_file():
        raise FileNotFoundError(f"{path} is neither a run directory (configs/train.yaml) nor a checkpoint (state.pt)")
    steps = checkpoint_steps(path / "checkpoints")
    if not steps:
        raise FileNotFoundError(f"run directory {path} has no checkpoint under checkpoints/")
    return path, path / "checkpoints" / str(steps[-1])
