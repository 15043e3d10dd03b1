"""Videos of evaluations: each step's pictures of every row tiled into one frame, streamed to ffmpeg.

One frame per evaluation step: the pictures of all the evaluation's rows (every row of every shard, in
global row order) tiled into a grid of ``ceil(sqrt(rows))`` columns, row 0 top left, two grey pixels
between tiles; a row that has
played its quota of episodes is a blank (black) tile. A frame goes to the encoder (``imageio-ffmpeg``'s
``write_frames``) as soon as it is tiled: none is kept here, whatever the video's length. At most
``max_frames`` frames are written (an untrained policy may never end an episode): the rest is dropped.
``.mp4`` (H.264) and ``.gif`` (a palette per frame, also streamed) are written; ``imageio`` reads both
back. The packages are the ``video`` extra.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raysim.composition import ConfigError

INSTALL = 'pip install -e ".[video]"'
GAP, GAP_COLOUR = 2, 96  # pixels between two tiles, and their grey
#: ffmpeg's settings per extension: codec, pixel format and filters.
FORMATS = {
    ".mp4": {"codec": "libx264", "pix_fmt_out": "yuv420p", "quality": 7},
    ".gif": {
        "codec": "gif",
        "pix_fmt_out": "pal8",
        "output_params": ["-vf", "split[a][b];[a]palettegen=stats_mode=single[p];[b][p]paletteuse=new=1"],
    },
}


class VideoError(ConfigError):
    """A video that cannot be made: an unsupported file type, the ``video`` extra not installed."""


def require_video() -> None:
    """Refuse, before any work, a video when ``imageio`` and ``imageio-ffmpeg`` are not installed."""
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        raise VideoError(
            f"videos need imageio and imageio-ffmpeg, which are not installed: {INSTALL} "
            '(or pip install "raysim[video]")'
        ) from None


def check_video_path(path: str | Path, what: str = "--video") -> None:
    """Refuse a video file of a type this module does not write."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise VideoError(f"{what} {path}: unsupported file type {suffix or '(none)'!r}; write one of {sorted(FORMATS)}")


def grid(pictures: Sequence[np.ndarray]) -> np.ndarray:
    """One frame [H', W', 3] uint8 of every row's picture (``pictures``: [rows_i, H, W, 3] per shard, in order),
    ``ceil(sqrt(rows))`` tiles per line, ``GAP`` grey pixels between tiles, padded to even sides (for H.264)."""
    tiles = np.concatenate(list(pictures))
    count, height, width = tiles.shape[:3]
    columns = math.ceil(math.sqrt(count))
    lines = math.ceil(count / columns)
    size = (lines * (height + GAP) - GAP, columns * (width + GAP) - GAP)
    frame = np.full((size[0] + size[0] % 2, size[1] + size[1] % 2, 3), GAP_COLOUR, np.uint8)
    for i, tile in enumerate(tiles):
        top, left = (height + GAP) * (i // columns), (width + GAP) * (i % columns)
        frame[top : top + height, left : left + width] = tile
    return frame


class VideoWriter:
    """Frames streamed to the video file at ``path`` as they come, at most ``max_frames`` of them.

    The file appears whole: frames go to a temporary file beside it, renamed to ``path`` by ``close``;
    ``abandon`` removes it (a failed evaluation leaves no half video).
    """

    def __init__(self, path: str | Path, fps: int = 25, max_frames: int = 2000):
        check_video_path(path)
        require_video()
        self.path = Path(path)
        self.partial = self.path.with_name(f".{self.path.stem}.partial{self.path.suffix}")
        self.fps, self.max_frames = int(fps), int(max_frames)
        self.frames = 0
        self.cut = False  # whether frames were dropped at the cap
        self._encoder = None

    @property
    def full(self) -> bool:
        """Whether the frame cap is reached: more frames are dropped."""
        return self.frames >= self.max_frames

    def add(self, frame: np.ndarray) -> bool:
        """Write one frame [H, W, 3] uint8 (every frame the same size); False when it was dropped (the cap)."""
        if self.full:
            self.cut = True
            return False
        if self._encoder is None:
            import imageio_ffmpeg

            height, width = frame.shape[:2]
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._encoder = imageio_ffmpeg.write_frames(
                str(self.partial),
                (width, height),
                fps=self.fps,
                macro_block_size=1,
                ffmpeg_log_level="error",  # not the palette generator's notices among raysim's lines
                **FORMATS[self.path.suffix.lower()],
            )
            self._encoder.send(None)
        self._encoder.send(np.ascontiguousarray(frame))
        self.frames += 1
        return True

    def close(self) -> Path | None:
        """Finish the file; its path, or None when no frame was written (no file)."""
        if self._encoder is None:
            return None
        self._encoder.close()
        self._encoder = None
        os.replace(self.partial, self.path)
        return self.path

    def abandon(self) -> None:
        """Stop encoding and remove what was written."""
        if self._encoder is not None:
            try:
                self._encoder.close()
            finally:
                self._encoder = None
                self.partial.unlink(missing_ok=True)
