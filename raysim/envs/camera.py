"""A small batched camera: scenes of round-capped segments and disks, drawn by torch as anti-aliased uint8 RGB.

A scene is a list of layers, painted in order over a plain background; a layer is ``Segments``
(round-capped lines of one width and colour) or ``Disks`` (of one radius and colour), given per
scene in world coordinates, ``[N, K, 2]``. The camera looks straight down on the world's x-y
plane: x grows to the right, y upward, the image centre is ``centre`` and the image spans
``2 * half_width`` world units across. Images are ``[N, 3, size, size]`` uint8, channels first
(what torch's convolutions take).

Anti-aliasing is by coverage: a pixel's opacity for a shape is ``clamp(r + 0.5 - d, 0, 1)``
with ``d`` the distance, in pixels, from the pixel centre to the shape's core (a disk's centre,
a segment's line) and ``r`` its radius in pixels: a one-pixel smooth edge, the exact coverage of
a straight edge crossing the pixel parallel to its side. A layer's opacity is that of its nearest
shape (their union), and the layer is blended over the image below it. All shapes of all scenes are
evaluated at once, each on the square patch of pixels around its bounding box (a disk is a segment
whose ends meet), and scattered into the image: no Python loop over scenes, rows or pixels, and the
work follows the shapes' area, not the image's. ``benchmarks/camera.py`` measures it.
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
        # pixel position = world * _scale + _offset; x to the right, y up (row 0 at the top)
        self._scale = torch.tensor([1.0, -1.0], device=self.device) / self.pixel
        self._offset = torch.tensor([half_width - centre[0], half_width + centre[1]], device=self.device) / self.pixel
        self._colours: dict[Colour, torch.Tensor] = {}
        self._shapes: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.background = self._colour(background)

    def pixel_position(self, points: torch.Tensor) -> torch.Tensor:
        """Where world ``points`` [..., 2] land in the image: (column, row) in pixels, pixel j spanning [j, j + 1)."""
        return torch.addcmul(self._offset, points, self._scale)

    def render(self, layers: Sequence[Segments | Disks], num_scenes: int) -> torch.Tensor:
        """``num_scenes`` images [N, 3, size, size] uint8 of ``layers`` painted in order over the background."""
        shape = (num_scenes, 3, self.size, self.size)
        if not layers or num_scenes == 0:
            return to_uint8(self.background.expand(shape))
        ends = [(x.centre, x.centre) if isinstance(x, Disks) else (x.start, x.end) for x in layers]
        start, end = torch.cat([s for s, _ in ends], 1).float(), torch.cat([e for _, e in ends], 1).float()
        structure = tuple((s.shape[1], float(x.radius)) for (s, _), x in zip(ends, layers, strict=True))
        radius, first_pixel = self._shape_table(structure)
        alpha = self._coverage(start, end, radius, first_pixel, len(layers)).unsqueeze(2)  # [N, L, 1, H + 2, W + 2]
        image = (alpha[:, 0] * (self._colour(layers[0].colour) - self.background)).add_(self.background)
        for i, layer in enumerate(layers[1:], 1):
            image.lerp_(self._colour(layer.colour), alpha[:, i])
        return to_uint8(image[..., 1:-1, 1:-1])  # without the border

    def _colour(self, colour: Colour) -> torch.Tensor:
        """A colour [1, 3, 1, 1] with 0.5 added (blends are affine: the image keeps the offset); cached."""
        colour = tuple(colour)
        if colour not in self._colours:
            if len(colour) != 3 or any(not 0 <= c <= 255 for c in colour):
                raise ValueError(f"a colour is three numbers in 0..255 (red, green, blue), got {colour!r}")
            value = torch.tensor(colour, dtype=torch.float32, device=self.device).add_(0.5).view(1, 3, 1, 1)
            self._colours[colour] = value
        return self._colours[colour]

    def _shape_table(self, layers: tuple[tuple[int, float], ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per shape of layers of (count, world radius): its radius in pixels [K] and where its layer's
        image starts in the canvas [K] (cached: a scene's structure rarely changes)."""
        if layers not in self._shapes:
            if any(not r >= 0 for _, r in layers):
                raise ValueError(f"a shape's radius is a number >= 0 (world units), got {[r for _, r in layers]}")
            pixels = (self.size + 2) ** 2
            radius = [r / self.pixel for count, r in layers for _ in range(count)]
            first = [i * pixels for i, (count, _) in enumerate(layers) for _ in range(count)]
            self._shapes[layers] = (
                torch.tensor(radius, device=self.device),
                torch.tensor(first, dtype=torch.int64, device=self.device),
            )
        return self._shapes[layers]

    def _coverage(
        self, start: torch.Tensor, end: torch.Tensor, radius: torch.Tensor, first_pixel: torch.Tensor, num_layers: int
    ) -> torch.Tensor:
        """Opacity [N, L, H + 2, W + 2] of each layer, the union of its round-capped segments (a disk where the
        ends meet), with a one-pixel border around the image that takes what falls outside it (junk).

        ``start``, ``end``: [N, K, 2] world; ``radius`` [K] in pixels; ``first_pixel`` [K]: where each
        shape's layer starts in the canvas. Each shape is evaluated on a square patch of pixels that holds
        its bounding box (one size for all, the largest); the patches go into their layer's image by their
        maximum.
        """
        n, k, size = start.shape[0], start.shape[1], self.size
        a, b = self.pixel_position(start), self.pixel_position(end)  # [N, K, 2]: (column, row) in pixels
        r = radius.view(1, k, 1)
        # the patch: from the first pixel the shape may cover (those before it are r + 1 away, or more) to
        # past the last, both clamped to the image and its border, so a huge or far shape costs no more
        first = torch.floor(torch.minimum(a, b) - r - 0.5).clamp_(-1, size)
        last = (torch.maximum(a, b) + r + 0.5).clamp_(-1, size + 1)
        patch = max(int((last - first).amax().ceil()), 1)
        pixel = first.unsqueeze(3) + torch.arange(patch, dtype=torch.float32, device=self.device)  # [N, K, 2, P]
        d = pixel + 0.5 - a.unsqueeze(3)  # pixel centre minus start
        dx, dy = d[:, :, 0].unsqueeze(2), d[:, :, 1].unsqueeze(3)  # [N, K, 1, P] (columns), [N, K, P, 1] (rows)
        u = (b - a).unsqueeze(3)  # [N, K, 2, 1]
        ux, uy = u[:, :, 0:1], u[:, :, 1:2]  # [N, K, 1, 1]
        along = u / u.square().sum(2, keepdim=True).clamp_min(1e-12)
        # t: where the pixel centre projects on the segment, clamped to it; then the centre's offset from there
        t = torch.add(dy * along[:, :, 1:2], dx * along[:, :, 0:1]).clamp_(0.0, 1.0)  # [N, K, P, P]
        distance = (dx - t * ux).square_().add_((dy - t * uy).square_()).sqrt_()
        alpha = torch.sub(r.unsqueeze(3) + 0.5, distance).clamp_(0.0, 1.0)
        # the canvas index of each patch pixel: rows and columns past the image land on the border
        row_col = pixel.clamp_(-1, size).add_(1).long()  # [N, K, 2, P]
        index = (row_col[:, :, 1] * (size + 2) + first_pixel.view(1, k, 1)).unsqueeze(3) + row_col[:, :, 0].unsqueeze(2)
        canvas = torch.zeros(n, num_layers * (size + 2) ** 2, device=self.device)
        canvas.scatter_reduce_(1, index.view(n, -1), alpha.view(n, -1), "amax")
        return canvas.view(n, num_layers, size + 2, size + 2)


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """``image`` (values in [0, 256), any strides) truncated to a new contiguous uint8 tensor; on the CPU
    through NumPy, ~3x faster than torch's cast (``benchmarks/camera.py``)."""
    if image.device.type != "cpu":
        return image.to(torch.uint8, memory_format=torch.contiguous_format)
    return torch.from_numpy(np.ascontiguousarray(image.numpy().astype(np.uint8)))
