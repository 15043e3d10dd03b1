"""The replay buffers as part of the run: segments written beside the checkpoints, read back on a resume or restart.

An off-policy learner returns, with every update, the transitions it appended to its buffer (``Learner.appended``:
an object ref, never fetched by the loop). The session keeps those of the completed iterations since the last save
(``ReplayLog.pending``); a save writes each learner rank's as one segment,
``checkpoints/replay/<rank>/<timeline>-<first>-<last>.pt``, and the checkpoint's manifest lists, per rank, the
segments whose transitions may still be in the buffer (the newest ``replay.capacity``), with their hashes. A resume
(and a learner restarted from a checkpoint) refills each rank's buffer from exactly those, in order; a learner
restarted from the last completed iteration also takes the pending ones. ``<timeline>`` is new for every process
and every rewind, so a segment of an abandoned timeline is never read: no live checkpoint lists it, and pruning
removes it once no kept one does. ``replay.save: false`` writes none (a resume refills the buffer from empty).
"""

from __future__ import annotations

import io
import secrets
from dataclasses import dataclass, field
from typing import Any

import torch

from raysim.actors import Backend
from raysim.algos.replay import concat_transitions, size_of
from raysim.checkpoint import REPLAY, ROOT, Checkpoints, sha256
from raysim.storage import RunStorage


@dataclass
class ReplayLog:
    """Per learner rank: the segments the newest checkpoint lists, and the appended transitions since (refs)."""

    listed: list[list[dict[str, Any]]] = field(default_factory=list)
    pending: list[list[Any]] = field(default_factory=list)
    timeline: str = field(default_factory=lambda: secrets.token_hex(4))

    def completed(self, appended: list[Any]) -> None:
        """An iteration completed: what its update appended on each rank (refs) waits for the next save."""
        if not self.pending:
            self.pending = [[] for _ in appended]
        for rank, ref in enumerate(appended):
            self.pending[rank].append(ref)

    def write(self, storage: RunStorage, backend: Backend, capacity: int) -> list[list[dict[str, Any]]]:
        """Each rank's pending transitions as one segment file; the listing a checkpoint of now records (the
        segments that may still be in a buffer of ``capacity``). ``saved`` makes it this log's once the
        checkpoint is written."""
        listing = []
        for rank in range(max(len(self.listed), len(self.pending))):
            entries = list(self.listed[rank]) if rank < len(self.listed) else []
            parts = [p for p in backend.get(self.pending[rank]) if p is not None] if rank < len(self.pending) else []
            if parts:
                entries.append(self._write_segment(storage, rank, parts))
            end = entries[-1]["last"] + 1 if entries else 0
            listing.append([e for e in entries if e["last"] >= end - capacity])
        return listing

    def _write_segment(self, storage: RunStorage, rank: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
        transitions = concat_transitions([p["transitions"] for p in parts])
        first = int(parts[0]["first"])
        last = first + size_of(transitions) - 1
        buffer = io.BytesIO()
        torch.save(transitions, buffer)
        data = buffer.getvalue()
        rel = f"{ROOT}/{REPLAY}/{rank}/{self.timeline}-{first}-{last}.pt"
        storage.write(rel, data)
        return {"file": rel, "sha256": sha256(data), "bytes": len(data), "first": first, "last": last}

    def saved(self, listing: list[list[dict[str, Any]]]) -> None:
        """A checkpoint with ``listing`` was written: it is what a resume reads; nothing is pending."""
        self.listed, self.pending = listing, []

    def segments(self, checkpoints: Checkpoints, backend: Backend) -> list[list[dict[str, Any]]]:
        """Every rank's segments up to the last completed iteration: the listed ones read from the run directory,
        then the pending ones (a learner restarted from the last completed iteration refills from them)."""
        read = checkpoints.read_segments(self.listed)
        ranks = max(len(read), len(self.pending))
        read += [[] for _ in range(ranks - len(read))]
        for rank, refs in enumerate(self.pending):
            read[rank] += [p for p in backend.get(refs) if p is not None]
        return read

    def rewound(self, listing: list[list[dict[str, Any]]]) -> None:
        """The run continues from a checkpoint that lists ``listing``: later transitions belong to an abandoned
        timeline, and new segments get a timeline of their own."""
        self.listed, self.pending, self.timeline = listing, [], secrets.token_hex(4)


def refill(checkpoints: Checkpoints, checkpoint: Any, save: bool, learner: Any) -> ReplayLog:
    """A resumed run's replay buffers, refilled from the segments ``checkpoint`` lists (``learner``: the
    ``LearnerGroup``); the log the run goes on with. Without segments (``replay.save: false``, or none saved yet)
    the buffers start empty, said in one line."""
    listing = checkpoints.replay_listing(checkpoint) if save and checkpoint is not None else []
    if any(listing):
        learner.restore_replay(checkpoints.read_segments(listing))
    elif checkpoint is not None:
        why = "replay.save is false" if not save else "its checkpoint lists no replay segments"
        print(f"raysim: the replay buffer starts empty and refills as the run goes on ({why})", flush=True)
    return ReplayLog(listed=listing)
