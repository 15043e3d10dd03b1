"""The chunks of an update: handed to every learner rank by reference, read by the rank itself.

Ray fetches a call's own arguments before the call runs: a rank whose chunk was lost with its node
would fail there while the other ranks wait in the update's first collective until it times out.
Handed inside a list, the references reach the rank unread; it fetches them, and before any
collective of the update every rank learns which chunks any rank lost: all raise the same
``ChunksLost`` (the update happened on none), and the coordinator collects those chunks again.
"""

from __future__ import annotations

from typing import Any

from raysim.actors import ValuesLost, fetch
from raysim.learner.ranks import RankGroup
from raysim.rollout import RolloutChunk


class ChunksLost(RuntimeError):
    """Chunks of an update were lost with their node before the learner read them; ``positions[r]``: where
    they were in rank r's chunks (trained, then stale). Every rank raises it; none updated."""

    def __init__(self, positions: list[list[int]]):
        super().__init__(positions)
        self.positions = positions

    def __str__(self) -> str:
        where = "; ".join(f"rank {r}: {lost}" for r, lost in enumerate(self.positions) if lost)
        return f"chunks lost with their node before the learner read them (positions {where})"


def read_chunks(ranks: RankGroup, refs: list[Any]) -> list[RolloutChunk]:
    """This rank's chunks, fetched; ``ChunksLost`` on every rank when any rank lost one, and any other failure
    to read them agreed on as well (``RankGroup.agree``), so that no rank waits in a collective alone."""
    chunks, lost, error = [], [], None
    try:
        chunks = fetch(refs)
    except ValuesLost as caught:
        lost = caught.positions
    except Exception as caught:  # noqa: BLE001 - agreed on, then raised by every rank
        error = caught
    every = ranks.gather_objects(lost)
    if any(every):
        raise ChunksLost(every)
    ranks.agree("reading the chunks", error)
    return chunks
