"""A small batched camera: scenes of round-capped segments and disks, drawn by torch as anti-aliased uint8 RGB.

A scene is a list of layers, painted in order over a plain background; a layer is ``Segments``
(round-capped lines of one width and colour) or ``Disks`` (of one radius and colour), given per
scene in world coordinates, ``[N, K, 2]``. The camera looks straight down on the world's x-y
plane: x grows to the right, y upward, the image centre is ``centre`` and the image spans
``2 * half_width`` world units across. Images are ``[N, 3, size, size]`` uint8, channels first
(what torch's convolutions take).

Anti-aliasing is by coverage: a pixel's opacity for a shape is ``clamp(r + 0.5 - d, 0, 1)``
with ``d`` the distance, in pixels, from the pixel centre to the shape's core (a disk's centre,
a segment's line) and ``r`` its radius in pixels, a one-pixel smooth edge that is the exact
coverage of a straight edge crossing the pixel square's axis. A layer's opacity is that of its
nearest shape (their union), and the layer is blended over the image below it. Every distance is
computed for all scenes and pixels at once; the squared distances split into a row part and a
column part, so a layer costs a few tensor operations of ``N x K x size x size`` elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

Colour = tuple[int, int, int]


@dataclass(frozen=True)
class Segments:
    """Round-capped line segments from ``start`` to ``end`` ([N, K, 2] world), ``radius`` half their width."""

    start: torch.Tensor
    end: torch.Tensor
    radius: float
    colour: Colour


@dataclass(frozen=True)
class Disks:
    """Filled disks at ``centre`` ([N, K, 2] world) of one ``radius``."""

    centre: torch.Tensor
    radius: float
    colour: Colour


class Camera:
    """A top-down camera of ``size`` x ``size`` pixels over ``[centre +- half_width]``; ``render(layers)``."""

    def __init__(
        self,
        size: int,
        half_width: float,
        centre: tuple[float, float] = (0.0, 0.0),
        background: Colour = (0, 0, 0),
        device: str | torch.device = "cpu",
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"camera size must be an integer >= 1 (pixels), got {size!r}")
        if not half_width > 0:
            raise ValueError(f"camera half_width must be > 0, got {half_width!r}")
        self.size = size
        self.pixel = 2.0 * float(half_width) / size  # world units per pixel
        self.device = torch.device(device)
        centres = torch.arange(size, dtype=torch.float32, device=self.device) + 0.5 - size / 2  # pixels from the middle
        self.column_x = centres + centre[0] / self.pixel  # [W], the x of each column's pixel centres, in pixels
        self.row_y = centre[1] / self.pixel - centres  # [H], the y of each row's pixel centres (row 0 at the top)
        self.background = self._colour(background)

    def pixel_position(self, points: torch.Tensor) -> torch.Tensor:
        """Where world ``points`` [..., 2] land in the image: (column, row) in pixels, pixel j spanning [j, j + 1)."""
        column = points[..., 0] / self.pixel - self.column_x[0] + 0.5
        row = self.row_y[0] - points[..., 1] / self.pixel + 0.5
        return torch.stack((column, row), -1)

    def render(self, layers: Sequence[Segments | Disks], num_scenes: int) -> torch.Tensor:
        """``num_scenes`` images [N, 3, size, size] uint8 of ``layers`` painted in order over the background."""
        shape = (num_scenes, 3, self.size, self.size)
        image = None  # the background until the first layer writes the image
        for layer in layers:
            alpha = (self._disk_alpha(layer) if isinstance(layer, Disks) else self._segment_alpha(layer)).unsqueeze(1)
            colour = self._colour(layer.colour)
            if image is None:
                image = (alpha * (colour - self.background)).add_(self.background)
            else:
                image.lerp_(colour.expand(shape), alpha.expand(shape))
        if image is None:
            image = self.background.expand(shape)
        return to_uint8(image)

    def _colour(self, colour: Colour) -> torch.Tensor:
        """A colour [1, 3, 1, 1] with 0.5 added (blends are affine: the image keeps the offset)."""
        if len(colour) != 3 or any(not 0 <= c <= 255 for c in colour):
            raise ValueError(f"a colour is three numbers in 0..255 (red, green, blue), got {colour!r}")
        return torch.tensor(colour, dtype=torch.float32, device=self.device).add_(0.5).view(1, 3, 1, 1)

    def _coverage(self, distance_sq: torch.Tensor, radius: float) -> torch.Tensor:
        """Opacity [N, H, W] of the nearest of K shapes from squared pixel distances [N, K, H, W] to their cores."""
        nearest = distance_sq.amin(1) if distance_sq.shape[1] > 1 else distance_sq.squeeze(1)
        return nearest.sqrt_().neg_().add_(radius / self.pixel + 0.5).clamp_(0.0, 1.0)

    def _disk_alpha(self, disks: Disks) -> torch.Tensor:
        """Opacity [N, H, W] of a layer of disks."""
        centre = disks.centre / self.pixel  # in pixels, like everything below
        dx = self.column_x - centre[..., 0:1]  # [N, K, W]
        dy = self.row_y - centre[..., 1:2]  # [N, K, H]
        return self._coverage(dy.square().unsqueeze(3) + dx.square().unsqueeze(2), disks.radius)

    def _segment_alpha(self, segments: Segments) -> torch.Tensor:
        """Opacity [N, H, W] of a layer of segments: the distance to the nearest point of each segment."""
        a, b = segments.start / self.pixel, segments.end / self.pixel
        u = b - a  # [N, K, 2]
        inverse_length_sq = 1.0 / u.square().sum(2).clamp_min(1e-12)  # [N, K]
        dx = self.column_x - a[..., 0:1]  # [N, K, W]: pixel minus start, x
        dy = self.row_y - a[..., 1:2]  # [N, K, H]
        ux, uy = u[..., 0:1], u[..., 1:2]
        # t: where the pixel projects on the segment, clamped to it; then the pixel's offset from that point
        t = ((dy * uy).unsqueeze(3) + (dx * ux).unsqueeze(2)).mul_(inverse_length_sq[..., None, None]).clamp_(0, 1)
        off_x = dx.unsqueeze(2) - t * ux.unsqueeze(3)
        off_y = dy.unsqueeze(3) - t * uy.unsqueeze(3)
        return self._coverage(off_x.square_().add_(off_y.square_()), segments.radius)


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """``image`` (values in [0, 256)) truncated to uint8; on the CPU through NumPy, ~3x faster than torch's cast."""
    if image.device.type != "cpu":
        return image.to(torch.uint8)
    return torch.from_numpy(image.contiguous().numpy().astype(np.uint8))
