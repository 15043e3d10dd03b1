"""What kind of observation a group's space is: an image (kept uint8 end to end) or a vector (float32).

An image space is a ``uint8`` ``Box`` of three dimensions with bounds 0 and 255, as Stable-Baselines3's
``is_image_space`` decides; its channel order is told by the smallest dimension (first: channels x
height x width, else height x width x channels), as SB3's ``is_image_space_channels_first`` does. Every
other ``Box`` is a vector group: float32, flattened into the networks' MLP input.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


def is_image_space(space: gym.Space) -> bool:
    """A ``uint8`` Box ``[C, H, W]`` or ``[H, W, C]`` with bounds 0 and 255 (SB3's rule)."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


def channels_first(space: gym.Space) -> bool:
    """Whether an image space is ``[C, H, W]``: its smallest dimension comes first (else ``[H, W, C]``)."""
    return int(np.argmin(space.shape)) == 0


def image_shape(space: gym.Space) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image space, whichever its order."""
    c, h, w = space.shape if channels_first(space) else (space.shape[2], space.shape[0], space.shape[1])
    return int(c), int(h), int(w)


def group_dtype(space: gym.Space) -> torch.dtype:
    """The dtype a group's observations keep from the env to the model: uint8 for images, float32 otherwise."""
    return torch.uint8 if is_image_space(space) else torch.float32
