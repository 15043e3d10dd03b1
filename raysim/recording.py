"""Filming an evaluation on its shards: every shard's steps in parts, tiled step by step into the video.

Each evaluation shard plays its rows' episodes in parts of ``PART_STEPS`` steps (``EnvShard.record``),
drawing every row before every step where the env lives (a remote actor too). The driver takes one part
of every shard, in shard order, tiles step ``t`` of all rows into one frame (``raysim.video.grid``) and
hands it to the writer, which streams it to the encoder; the shards' next parts are asked for before
this one is written, so they play while the driver encodes, and no more than two parts of pictures per
shard exist at any time. Step ``t`` of every shard is frame ``t``: a shard that has ended gives blank
tiles, and rows with no episode to play (fewer episodes than rows) are left out of the grid. Once the
writer's frame cap is reached the shards play the rest without pictures. A shard whose process dies is
replaced and replays its episodes by index: the steps already filmed without pictures, then on. The
records are those of an evaluation without a video (``raysim.rollout.recording``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.actors import Backend, Handle, InputLost
from raysim.config import EvalConfig
from raysim.rollout import EnvShard, EvalEpisodes, Scoring
from raysim.rollout.recording import Part
from raysim.storage import RunStorage
from raysim.video import VideoWriter, grid

PART_STEPS = 16  # steps of pictures per part: ~8 MB for 10 rows of 128 x 128 pictures


@dataclass
class Film:
    """Where an evaluation's frames go, and how large a row's picture is drawn by envs that draw their own."""

    writer: VideoWriter
    size: int = 128


@contextmanager
def film_into(storage: RunStorage, rel: str, config: EvalConfig) -> Iterator[Film]:
    """A film as ``config`` sets it (``eval.video_*``) whose video is written to ``rel`` of the run when the block
    ends without an error (encoded into a local temporary file first: run storage takes whole files)."""
    with tempfile.TemporaryDirectory(prefix="raysim-video-") as folder:
        writer = VideoWriter(Path(folder) / Path(rel).name, config.video_fps, config.video_frames)
        try:
            yield Film(writer, config.video_size)
        except BaseException:
            writer.abandon()
            raise
        path = writer.close()
        if path is not None:
            storage.write(rel, path.read_bytes())


def film_on_shards(
    backend: Backend,
    make_shard: Callable[[int], Handle],
    shards: list[Handle],
    plans: list[EvalEpisodes],
    weights: object,
    film: Film,
    max_restarts: int = 3,
) -> tuple[list[tuple[dict, dict]], int, Scoring | None]:
    """Play ``plans`` on ``shards`` (one each) as ``EnvShard.evaluate`` would, filming them into ``film``;
    returns the counted ``(record, report)`` pairs, the episodes left out and how the task counts them."""
    count = len(shards)
    filmed = [0] * count  # steps of each shard taken so far (filmed, or played past the cap)
    results: list[tuple | None] = [None] * count
    restarts = 0

    def ask(i: int, plan: EvalEpisodes | None = None) -> object:
        """Shard ``i``'s next part (``plan``: its first, with the weights), drawn until the writer is full."""
        drawing = not film.writer.full
        return shards[i].call(
            EnvShard.record,
            weights if plan is not None else None,
            plan,
            PART_STEPS if drawing else None,
            film.size if drawing else None,
        )

    def take(i: int, future: object) -> Part:
        nonlocal restarts
        while True:
            try:
                got = backend.get(future)
                return got[-1] if isinstance(got, list) else got
            except Exception as error:
                if not backend.is_actor_failure(error) or restarts >= max_restarts:
                    raise
                if backend.alive(shards[i], EnvShard.spaces):
                    raise InputLost(f"evaluation shard {i} could not read the policy's weights: {error}") from error
                restarts += 1
                print(
                    f"evaluation shard {i} died ({type(error).__name__}); replacing it and replaying its rows",
                    flush=True,
                )
                shards[i] = make_shard(i)
                catch_up = shards[i].call(EnvShard.record, weights, plans[i], filmed[i], None)  # the filmed steps
                future = [catch_up, ask(i)]

    pending = {i: ask(i, plans[i]) for i in range(count)}
    while pending:
        parts = {i: take(i, future) for i, future in sorted(pending.items())}
        pending = {}
        for i, part in parts.items():
            filmed[i] += part.steps
            if part.result is None:
                pending[i] = ask(i)  # the shard plays its next part while this one is written
            else:
                results[i] = part.result
        write_parts(film.writer, parts, [np.asarray(plan.quotas) > 0 for plan in plans])
    counted = [pair for result in results for pair in result[0]]
    return counted, sum(result[1] for result in results), next((r[2] for r in results if r[2] is not None), None)


def write_parts(writer: VideoWriter, parts: dict[int, Part], shown: list[np.ndarray]) -> None:
    """Frames of the steps of one part of every shard (``parts`` by shard). ``shown``: each shard's rows that
    have episodes to play (a row with none is left out of the grid); the tiles of a shard without pictures
    at a step (it has ended) are blank."""
    drawn = [part.pictures for part in parts.values() if part.pictures is not None]
    if not drawn:
        writer.cut |= writer.full and any(part.steps for part in parts.values())  # steps played past the cap
        return
    picture = drawn[0].shape[2:]
    blank = [np.zeros((int(rows.sum()), *picture), np.uint8) for rows in shown]
    for t in range(max(pictures.shape[0] for pictures in drawn)):
        tiles = []
        for i, rows in enumerate(shown):
            pictures = parts[i].pictures if i in parts else None
            tiles.append(pictures[t][rows] if pictures is not None and t < pictures.shape[0] else blank[i])
        if not writer.add(grid(tiles)):
            return
