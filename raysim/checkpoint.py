"""Checkpoints: ``checkpoints/<iteration>/`` appears whole or not at all; loading runs no code."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(run_dir: str | Path, iteration: int, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` (tensors and plain data) and ``meta.json`` under a temporary name, then rename."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / str(iteration)
    tmp = root / f".tmp-{iteration}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, meta)`` of a checkpoint directory, with ``weights_only=True`` (no pickled code)."""
    path = Path(path)
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError as error:
        raise FileNotFoundError(f"checkpoint {path} is incomplete: {error.filename} is missing") from error
    except Exception as error:
        raise RuntimeError(f"checkpoint file {path / 'state.pt'} cannot be loaded: {error}") from error
    return state, meta


def locate_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint_dir)`` for a run directory (its newest checkpoint) or a checkpoint directory."""
    path = Path(path)
    if (path / "state.pt").is_file():
        return path.parent.parent, path
    if not (path / "configs" / "train.yaml").is_file():
        raise FileNotFoundError(f"{path} is neither a run directory (configs/train.yaml) nor a checkpoint (state.pt)")
    steps = sorted((int(p.name), p) for p in (path / "checkpoints").glob("*") if p.name.isdigit())
    if not steps:
        raise FileNotFoundError(f"run directory {path} has no checkpoint under checkpoints/")
    return path, steps[-1][1]
