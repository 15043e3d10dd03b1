"""Checkpoints: complete or not at all, verified before use, loaded without running code.

A checkpoint ``checkpoints/<iteration>/`` (``<iteration>.<n>`` when an iteration is saved again)
holds ``state.pt`` (tensors and plain data: weights, optimizer, schedule, RNG, shard and env states),
``meta.json`` (counters, the env identity, package versions) and, written last, ``manifest.json``:
the completion marker, with the SHA-256 and size of every file. Loading verifies every file against
it: a mismatch, a truncated or unreadable file makes the checkpoint *damaged*, named with its path,
and ``newest_intact`` falls back to the one before. A checkpoint without a manifest (``checkpoint_format``
below 2) loads as *unverified* (said once). ``torch.load(weights_only=True)`` refuses a file that carries pickled
code. An evaluation of a checkpoint's own weights is recorded beside it (``score.json``); the best
scored intact checkpoint is kept when older ones are pruned. A run continued from a checkpoint retires
the newer ones (``retire_after``, ``retire``): they belong to an abandoned timeline, and pruning sees only the live one.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from raysim.storage import RunStorage, Staging, is_uri, open_storage

ROOT = "checkpoints"
MANIFEST, STATE, META, SCORE = "manifest.json", "state.pt", "meta.json", "score.json"
FORMAT = 2  # meta.json's "checkpoint_format": 2 and later have a manifest
ABANDONED = "abandoned"  # checkpoints/abandoned/<time>-<name>: checkpoints of abandoned timelines (local runs)
REPLAY = "replay"  # checkpoints/replay/<rank>/<timeline>-<first>-<last>.pt: segments of the replay buffers
KEEP_ABANDONED = 2  # the retirements whose checkpoints prune keeps under abandoned/ (checkpoint.keep_abandoned)
_NAME = re.compile(r"^(\d+)(?:\.(\d+))?$")
_RETIRED = re.compile(r"^(\d{8}T\d{6}Z(?:\.\d+)?)-\d+(?:\.\d+)?$")  # <time>[.<n>]-<checkpoint name>
_warned_unverified: set[str] = set()


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: the message names the file and the cause."""


class NoIntactCheckpoint(CheckpointError):
    """Every checkpoint of a run is damaged: the message names each damaged file."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """One checkpoint directory of a run."""

    iteration: int
    attempt: int  # 0 for ``<iteration>``, n for ``<iteration>.<n>`` (saved again)
    name: str
    folder: str = field(default=ROOT, compare=False)  # "": a checkpoint directory on its own (a Tune checkpoint)

    @property
    def rel(self) -> str:
        return f"{self.folder}/{self.name}" if self.folder else self.name


def package_versions() -> dict[str, str]:
    """The versions that produced a checkpoint (kept in meta.json, for the record)."""
    versions = {"python": platform.python_version()}
    for name in ("raysim", "torch", "ray", "gymnasium", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def meta_json(meta: dict[str, Any]) -> bytes:
    """``meta`` as ``meta.json``: plain JSON, an enum by its name; any other value is refused, naming its key
    (the run checks its meta this way before its first iteration, so that no save can fail on it later)."""
    return json.dumps(_plain_json(meta, "meta"), indent=2, sort_keys=True).encode()


def _plain_json(value: Any, key: str) -> Any:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): _plain_json(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_json(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CheckpointError(
        f"{key} holds a {type(value).__name__} ({value!r:.80}), which a checkpoint's meta.json cannot hold: "
        "give it as plain data (numbers, strings, lists, mappings or an enum's name)"
    )


class Checkpoints:
    """The checkpoints of one run: save, list, load (verified), the newest intact one, scores, pruning."""

    def __init__(self, storage: RunStorage):
        self.storage = storage

    def list(self) -> list[Checkpoint]:
        """Every checkpoint directory (complete or not), oldest first."""
        found = []
        for name in self.storage.list(ROOT):
            match = _NAME.match(name)
            if match:
                found.append(Checkpoint(int(match[1]), int(match[2] or 0), name))
        return sorted(found)

    def save(
        self,
        iteration: int,
        state: dict[str, Any],
        meta: dict[str, Any],
        before_marker: Callable[[], None] | None = None,
        replay: list[list[dict[str, Any]]] | None = None,
    ) -> Checkpoint:
        """Write checkpoint ``iteration``: its files, then the manifest; an earlier save of it stays until then.

        ``before_marker`` runs when the files are written and the marker is not (tests inject faults there).
        ``replay``: per learner rank, the segments of its replay buffer this checkpoint needs (written before, under
        ``checkpoints/replay/``: ``{"file", "sha256", "bytes", "first", "last"}``), listed in the manifest.
        """
        taken = [c.attempt for c in self.list() if c.iteration == iteration]
        attempt = max(taken) + 1 if taken else 0
        checkpoint = Checkpoint(iteration, attempt, f"{iteration}.{attempt}" if attempt else str(iteration))
        buffer = io.BytesIO()
        torch.save(state, buffer)
        meta = {**meta, "iteration": iteration, "checkpoint_format": FORMAT, "versions": package_versions()}
        files = {STATE: buffer.getvalue(), META: meta_json(meta)}
        manifest = {"format": FORMAT, "files": {n: {"sha256": sha256(d), "bytes": len(d)} for n, d in files.items()}}
        if replay:
            manifest["replay"] = replay
        staging = self.storage.staging(checkpoint.rel)
        try:
            for name, data in files.items():
                staging.write(name, data)
            if before_marker is not None:
                before_marker()
            staging.write(MANIFEST, json.dumps(manifest, indent=2).encode())  # the completion marker, last
            staging.commit()
        except BaseException:
            staging.abandon()
            raise
        for older in (c for c in self.list() if c.iteration == iteration and c.attempt < attempt):
            self.storage.remove(older.rel)  # superseded now that the new one is complete
        return checkpoint

    def load(self, checkpoint: Checkpoint) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state, meta)``, every file verified against the manifest; ``CheckpointError`` when damaged."""
        files = self.verified_files(checkpoint)
        try:
            meta = json.loads(files[META])
        except ValueError as error:
            raise CheckpointError(f"checkpoint file {self._path(checkpoint, META)} is corrupted: {error}") from error
        return self._load_state(checkpoint, files[STATE]), meta

    def newest_intact(self, announce: bool = True) -> tuple[Checkpoint, dict[str, Any], dict[str, Any]]:
        """The newest checkpoint that loads: ``(checkpoint, state, meta)``; damaged ones are skipped, said so."""
        found = self.list()
        if not found:
            raise CheckpointError(
                f"run directory {self.storage.path()} has no checkpoint under {self.storage.path(ROOT)}"
            )
        errors = []
        for checkpoint in reversed(found):
            try:
                state, meta = self.load(checkpoint)
            except CheckpointError as error:
                errors.append(str(error))
                if announce:
                    print(f"raysim: skipping damaged checkpoint: {error}", flush=True)
                continue
            if errors and announce:
                print(f"raysim: falling back to checkpoint {self.storage.path(checkpoint.rel)}", flush=True)
            return checkpoint, state, meta
        raise NoIntactCheckpoint(f"no intact checkpoint in {self.storage.path(ROOT)}: " + "; ".join(errors))

    def replay_listing(self, checkpoint: Checkpoint) -> list[list[dict[str, Any]]]:
        """The replay segments ``checkpoint`` lists, per learner rank ([] for a checkpoint without any)."""
        try:
            return json.loads(self.storage.read(f"{checkpoint.rel}/{MANIFEST}")).get("replay") or []
        except (OSError, ValueError, AttributeError):
            return []

    def read_segments(self, listing: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """The segments of ``listing`` per rank, read and verified against their hashes: ``{"first", "transitions"}``
        each (``CheckpointError`` naming a missing or damaged file)."""
        ranks = []
        for entries in listing:
            segments = []
            for entry in entries:
                path = self.storage.path(entry["file"])
                try:
                    data = self.storage.read(entry["file"])
                except OSError as error:
                    raise CheckpointError(f"replay segment {path} is missing") from error
                if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
                    raise CheckpointError(
                        f"replay segment {path} is damaged: its content does not match the hash recorded when it "
                        "was saved"
                    )
                try:
                    transitions = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                except Exception as error:  # noqa: BLE001 - named with its file
                    raise CheckpointError(f"replay segment {path} cannot be loaded: {error}") from error
                segments.append({"first": int(entry["first"]), "transitions": transitions})
            ranks.append(segments)
        return ranks

    def record_score(self, checkpoint: Checkpoint, mean_return: float | None) -> None:
        """An evaluation of exactly this checkpoint's weights (what ``prune`` keeps the best of)."""
        if mean_return is not None:
            score = {"iteration": checkpoint.iteration, "eval_return": mean_return}
            self.storage.write(f"{checkpoint.rel}/{SCORE}", json.dumps(score).encode())

    def score(self, checkpoint: Checkpoint) -> float | None:
        try:
            value = json.loads(self.storage.read(f"{checkpoint.rel}/{SCORE}"))["eval_return"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return float(value) if isinstance(value, (int, float)) else None

    def complete(self) -> list[Checkpoint]:
        """The checkpoints whose save finished (their completion marker exists; intact or not), oldest first."""
        return [c for c in self.list() if self._complete(c)]

    def prune(self, keep_last: int, keep_abandoned: int = KEEP_ABANDONED) -> None:
        """Keep the newest ``keep_last`` complete checkpoints and the best scored intact one; drop the rest, and
        the leftovers of saves that were killed (staging directories, incomplete checkpoints older than those kept);
        under ``checkpoints/abandoned/``, keep the checkpoints of the newest ``keep_abandoned`` retirements."""
        complete = self.complete()
        keep = set(complete[-max(1, keep_last) :])
        scored = [(s, c) for c in complete if (s := self.score(c)) is not None]
        for _, best in sorted(scored, reverse=True):  # a damaged one is never kept for its score
            if best in keep or self._intact(best):
                keep.add(best)
                break
        for checkpoint in self.list():
            if checkpoint not in keep:  # the run is locked: nothing else is writing one
                self.storage.remove(checkpoint.rel)
        for name in self.storage.list(ROOT):
            if name.startswith(Staging.PREFIX):
                self.storage.remove(f"{ROOT}/{name}")
        aside = self.storage.list(f"{ROOT}/{ABANDONED}")
        retirements = sorted({r for name in aside if (r := retirement(name))}, key=retirement_order)
        dropped = set(retirements[: max(0, len(retirements) - keep_abandoned)])
        for name in aside:
            if retirement(name) in dropped:
                self.storage.remove(f"{ROOT}/{ABANDONED}/{name}")
        self._prune_segments()

    def _prune_segments(self) -> None:
        """Remove the replay segments no checkpoint lists any more (kept, best-scored and abandoned ones count)."""
        ranks = self.storage.list(f"{ROOT}/{REPLAY}")
        if not ranks:
            return
        kept = [c.rel for c in self.list()]
        kept += [f"{ROOT}/{ABANDONED}/{name}" for name in self.storage.list(f"{ROOT}/{ABANDONED}")]
        listed = set()
        for rel in kept:
            try:
                manifest = json.loads(self.storage.read(f"{rel}/{MANIFEST}"))
            except (OSError, ValueError):
                continue
            listed.update(entry["file"] for entries in manifest.get("replay") or [] for entry in entries)
        for rank in ranks:
            for name in self.storage.list(f"{ROOT}/{REPLAY}/{rank}"):
                rel = f"{ROOT}/{REPLAY}/{rank}/{name}"
                if rel not in listed:
                    self.storage.remove(rel)

    def retire_after(self, iteration: int) -> list[Checkpoint]:
        """Retire every checkpoint of an iteration after ``iteration``, from which the run continues."""
        later = [c for c in self.list() if c.iteration > iteration]
        return self.retire(later, f"newer than iteration {iteration}, where the run continues")

    def retire(self, checkpoints: list[Checkpoint], why: str) -> list[Checkpoint]:
        """Retire ``checkpoints``, which belong to an abandoned timeline (``why``), said in one line. Locally they
        move to ``checkpoints/abandoned/<time>-<name>`` (names come round again; ``<time>`` names this retirement,
        made unique with ``.<n>``; ``prune`` keeps the newest retirements); object stores cannot rename:
        every completion marker goes first, newest first, then the rest."""
        retired = sorted(checkpoints, reverse=True)
        if not retired:
            return []
        if self.storage.can_rename:
            stamp = self._retirement_stamp()
            for checkpoint in retired:
                self.storage.rename(checkpoint.rel, f"{ROOT}/{ABANDONED}/{stamp}-{checkpoint.name}")
            done = f"moved to {self.storage.path(f'{ROOT}/{ABANDONED}')}/"
        else:
            for checkpoint in retired:  # none of them is complete any more before anything else goes
                self.storage.remove(f"{checkpoint.rel}/{MANIFEST}")
            for checkpoint in retired:
                self.storage.remove(checkpoint.rel)
            done = "removed"
        which = ", ".join(c.name for c in reversed(retired))
        what = f"checkpoints {which} are" if len(retired) > 1 else f"checkpoint {which} is"
        print(f"raysim: {what} {why} (an abandoned timeline): {done}", flush=True)
        return retired

    def _retirement_stamp(self) -> str:
        """The time of a retirement now (UTC); ``<time>.<n>`` after the newest retirement under ``abandoned/`` when
        that one has the same time (or a later one), so the newest retirement always sorts last."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        earlier = [retirement_order(r) for name in self.storage.list(f"{ROOT}/{ABANDONED}") if (r := retirement(name))]
        newest = max(earlier, default=None)
        return f"{newest[0]}.{newest[1] + 1}" if newest is not None and newest[0] >= stamp else stamp

    # -- reading ---------------------------------------------------------------------------------

    def _intact(self, checkpoint: Checkpoint) -> bool:
        try:
            self.verified_files(checkpoint)
        except CheckpointError:
            return False
        return True

    def _path(self, checkpoint: Checkpoint, name: str = "") -> str:
        return self.storage.path(f"{checkpoint.rel}/{name}" if name else checkpoint.rel)

    def _complete(self, checkpoint: Checkpoint) -> bool:
        names = set(self.storage.list(checkpoint.rel))
        return MANIFEST in names or ({STATE, META} <= names and not self._is_new_format(checkpoint))

    def _is_new_format(self, checkpoint: Checkpoint) -> bool:
        try:
            return json.loads(self.storage.read(f"{checkpoint.rel}/{META}")).get("checkpoint_format", 1) >= FORMAT
        except (OSError, ValueError, AttributeError):
            return False

    def verified_files(self, checkpoint: Checkpoint) -> dict[str, bytes]:
        """Every file of ``checkpoint`` by name, each checked against the manifest (``CheckpointError`` if not)."""
        names = set(self.storage.list(checkpoint.rel))
        if MANIFEST not in names:
            missing = [n for n in (STATE, META) if n not in names]
            if missing or self._is_new_format(checkpoint):
                what = f"{self._path(checkpoint, missing[0])} is missing" if missing else "its manifest.json is missing"
                raise CheckpointError(
                    f"checkpoint {self._path(checkpoint)} is incomplete (its save was cut short): {what}"
                )
            if checkpoint.rel not in _warned_unverified:
                _warned_unverified.add(checkpoint.rel)
                print(
                    f"raysim: checkpoint {self._path(checkpoint)} predates content hashes: loaded unverified",
                    flush=True,
                )
            return {n: self.storage.read(f"{checkpoint.rel}/{n}") for n in (STATE, META)}
        try:
            manifest = json.loads(self.storage.read(f"{checkpoint.rel}/{MANIFEST}"))["files"]
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(
                f"checkpoint {self._path(checkpoint, MANIFEST)} is damaged: unreadable ({error})"
            ) from error
        files = {}
        for name, expected in sorted(manifest.items()):
            path = self._path(checkpoint, name)
            try:
                data = self.storage.read(f"{checkpoint.rel}/{name}")
            except OSError as error:
                raise CheckpointError(
                    f"checkpoint {self._path(checkpoint)} is incomplete: {path} is missing"
                ) from error
            if len(data) != expected.get("bytes") or sha256(data) != expected.get("sha256"):
                saved = expected.get("bytes", 0)
                size = f"{len(data):,} bytes where {saved:,} were saved" if len(data) != saved else f"{saved:,} bytes"
                raise CheckpointError(
                    f"checkpoint file {path} is damaged: its content ({size}) does not match the content hash "
                    "recorded when it was saved"
                )
            files[name] = data
        return files

    def _load_state(self, checkpoint: Checkpoint, data: bytes) -> dict[str, Any]:
        path = self._path(checkpoint, STATE)
        if not data:
            raise CheckpointError(f"checkpoint file {path} cannot be loaded: it is empty (0 bytes)")
        if not data.startswith(b"PK\x03\x04"):  # torch.save writes a zip archive
            raise CheckpointError(
                f"checkpoint file {path} cannot be loaded: it is not a complete torch checkpoint file "
                f"({len(data):,} bytes that are not a zip archive)"
            )
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # truncated zip, bad pickle, or a pickled object that would run code
            text = str(error)
            if "Weights only load failed" in text and ("Unsupported global" in text or "GLOBAL" in text):
                cause = "it carries pickled objects (refused: loading never runs code)"
            elif "zip" in text.lower() or "central directory" in text.lower() or "magic number" in text.lower():
                cause = f"it is not a complete torch checkpoint file ({text.splitlines()[0]})"
            else:
                cause = text.splitlines()[0] if text else type(error).__name__
            raise CheckpointError(f"checkpoint file {path} cannot be loaded: {cause}") from error


def retirement(name: str) -> str | None:
    """The retirement (``<time>`` or ``<time>.<n>``) a name under ``checkpoints/abandoned/`` belongs to; None for a
    name that no retirement made."""
    match = _RETIRED.match(name)
    return match[1] if match else None


def retirement_order(stamp: str) -> tuple[str, int]:
    """Retirements oldest first: by time, then by ``.<n>``."""
    time_, _, n = stamp.partition(".")
    return time_, int(n or 0)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- by path (the commands that take a run directory or a checkpoint directory) -----------------------


def _at(storage: RunStorage, rel: str) -> str | Path:
    """``rel`` of a run as a ``Path`` when the run is local, else as a URI."""
    return Path(storage.path(rel)) if storage.is_local else storage.path(rel)


def split_checkpoint(location: str | Path) -> tuple[str, Checkpoint] | None:
    """``(run location, checkpoint)`` when ``location`` is a checkpoint directory (``.../checkpoints/<name>``); a
    URI's query options (``s3://bucket/run/checkpoints/12?endpoint_override=...``) stay with the run's location."""
    found = _split_checkpoint(str(location))
    path, query = _query_apart(str(location))
    if found is None and query and (found := _split_checkpoint(path)):
        found = (found[0] + query, found[1])
    return found


def _query_apart(text: str) -> tuple[str, str]:
    """A URI without its query options, and those options (``?...``; nothing for a local path)."""
    if is_uri(text) and "?" in text:
        path, _, query = text.partition("?")
        return path, f"?{query}"
    return text, ""


def _split_checkpoint(text: str) -> tuple[str, Checkpoint] | None:
    run, _, name = text.rstrip("/").rpartition("/")
    run, _, folder = run.rpartition("/")
    match = _NAME.match(name)
    if not match or folder != ROOT:
        return None
    return run, Checkpoint(int(match[1]), int(match[2] or 0), name)


def load_directory(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, meta)`` of a checkpoint directory anywhere (a copy handed to Ray Tune), verified against its
    manifest; it need not sit under a run's ``checkpoints/``."""
    text, query = _query_apart(str(path))
    parent, _, name = text.rstrip("/").rpartition("/")
    return Checkpoints(open_storage(parent + query if parent else ".")).load(Checkpoint(0, 0, name, folder=""))


def copy_files(storage: RunStorage, checkpoint: Checkpoint, folder: Path) -> Path:
    """The files of ``checkpoint`` that its manifest covers, copied into the local ``folder`` (created): a
    self-contained checkpoint directory that ``load_directory`` verifies."""
    files = Checkpoints(storage).verified_files(checkpoint)
    if storage.exists(f"{checkpoint.rel}/{MANIFEST}"):
        files[MANIFEST] = storage.read(f"{checkpoint.rel}/{MANIFEST}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def locate_checkpoint(path: str | Path) -> tuple[RunStorage, Checkpoint, dict[str, Any], dict[str, Any]]:
    """``(the run's storage, checkpoint, state, meta)`` for a run directory (its newest intact checkpoint,
    falling back past damaged ones) or a checkpoint directory (exactly that one, verified); local or a URI."""
    found = split_checkpoint(path)
    if found is not None:
        storage = open_storage(found[0])
        return storage, found[1], *Checkpoints(storage).load(found[1])
    storage = open_storage(str(path))
    if not storage.exists("configs/train.yaml"):
        raise FileNotFoundError(f"{path} is neither a run directory (configs/train.yaml) nor a checkpoint directory")
    checkpoint, state, meta = Checkpoints(storage).newest_intact()
    return storage, checkpoint, state, meta
