"""Tune's own state in an experiment directory, checked before a resume and mended where it was cut short.

Tune writes its state (``experiment_state-*.json``, the searcher's ``basic-variant-state-*.json``, ``tuner.pkl``)
into its driver's staging directory first (atomically), then copies it into the experiment directory, not
atomically: a driver killed during that copy leaves a file cut short, and ``Tuner.restore`` then silently starts
another experiment (one trial of the default config). A cut file is replaced by its staging copy where this
machine still has it (``<ray temp>/session_*/artifacts/*/<experiment>/driver_artifacts/``); else the resume is
refused, naming the file.
"""

from __future__ import annotations

import fnmatch
import json
import pickletools
from pathlib import Path

from raysim.storage import RunStorage
from raysim.storage.base import StorageError

PATTERNS = ("experiment_state-*.json", "basic-variant-state-*.json", "tuner.pkl")  # Tune restores the newest


class TuneStateError(StorageError):
    """Tune's state in an experiment directory is cut short and no intact copy is at hand."""


def intact(name: str, data: bytes) -> bool:
    """Whether a state file is whole: JSON for the experiment state, a pickle that reaches its STOP for the others
    (walked, not loaded: nothing of it runs)."""
    try:
        if name.startswith("experiment_state-"):
            json.loads(data)
            return True
        return [op.name for op, _, _ in pickletools.genops(data)][-1:] == ["STOP"]
    except ValueError:  # JSON or a pickle cut short
        return False


def newest_state_files(storage: RunStorage) -> list[str]:
    """The file of each pattern that ``Tuner.restore`` reads (the newest by name)."""
    names = storage.list("")
    return [max(found) for pattern in PATTERNS if (found := fnmatch.filter(names, pattern))]


def staging_copy(ray_temp: Path | None, experiment_name: str, name: str) -> bytes | None:
    """The newest intact copy of ``name`` in a Ray session's driver staging directory on this machine."""
    if ray_temp is None:
        return None
    copies = ray_temp.glob(f"session_*/artifacts/*/{experiment_name}/driver_artifacts/{name}")
    for copy in sorted(copies, key=lambda p: p.stat().st_mtime, reverse=True):
        data = copy.read_bytes()
        if intact(name, data):
            return data
    return None


def mend(storage: RunStorage, ray_temp: Path | None) -> list[str]:
    """Replace each cut-short state file of the experiment by its staging copy; the names mended. Raises
    ``TuneStateError`` for one without an intact copy."""
    mended = []
    experiment_name = storage.location.rstrip("/").rpartition("/")[2]
    for name in newest_state_files(storage):
        if intact(name, storage.read(name)):
            continue
        data = staging_copy(ray_temp, experiment_name, name)
        if data is None:
            raise TuneStateError(
                f"{storage.path(name)} is cut short (the sweep's driver was killed while Tune copied it) and this "
                f"machine has no intact copy of it: Tune cannot resume this sweep; start it again in a new --dir "
                f"(the trials' run directories stay under {storage.path('trials')})"
            )
        storage.write(name, data)
        mended.append(name)
    return mended
