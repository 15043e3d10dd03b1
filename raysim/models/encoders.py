"""CNN encoders of image groups: uint8 images in, a feature vector out; the one place images become float.

Every encoder first ``scale``s its input as Stable-Baselines3's preprocessing does (``x / 255`` as
float32) and puts the channels first (an ``[H, W, C]`` group is permuted here, once; see
``raysim.envs.spaces``), then runs its convolutions and one ``Linear`` to ``features`` values (ReLU):

- ``NatureCNN`` (Mnih et al. 2015, CleanRL's ``ppo_atari.py``, SB3's default): 8x8/4, 4x4/2, 3x3/1
  convolutions; needs images of at least 36 px;
- ``SmallCNN``: two 3x3 stride-2 convolutions (16, 32 channels), for small images such as 32x32
  (about 0.4 M multiply-adds at 32x32x3 before the ``Linear``);
- ``ImpalaCNN`` (Espeholt et al. 2018): three stages of a convolution, a 3x3/2 max-pool and two
  residual blocks (16, 32, 32 channels);
- ``KeypointCNN``: a 3x3 stride-2 convolution and a 1x1 one to ``features / 2`` maps, each reduced by a
  spatial softmax to the expected (x, y) of its activation (Levine et al. 2016's keypoints, robomimic's
  image encoder): positions with sub-pixel precision from few weights, for tasks where what matters
  is where things are (a reach target), at about half the small CNN's training cost.

``model.cnn: auto`` picks the Nature CNN when the image's smaller side is at least 36 px, the small
one otherwise. Weights start orthogonal with gain sqrt(2) (CleanRL's ``layer_init``); every encoder
but the keypoint one ends with that ``Linear`` and ReLU.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn

from raysim.envs.spaces import channels_first, image_shape

CNNS = ("auto", "nature", "small", "impala", "keypoints")
#: The smallest image side the Nature CNN takes (its convolutions leave a 1x1 map at 36 px).
NATURE_MIN_SIDE = 36


class ImageEncoder(nn.Module):
    """Base of the CNN encoders: ``scale`` (uint8 -> float in [0, 1], channels first), then ``body``."""

    __constants__ = ["channels_last"]

    def __init__(self, space: gym.Space):
        super().__init__()
        self.channels_last = not channels_first(space)
        self.shape = image_shape(space)

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """``x / 255`` as float32, channels first (``[B, C, H, W]``)."""
        x = x.to(torch.float32) / 255
        return x.permute(0, 3, 1, 2) if self.channels_last else x

    def head(self, body: nn.Module, features: int) -> nn.Sequential:
        """``body``, flattened, then ``Linear`` to ``features`` and ReLU (the flat width measured once)."""
        with torch.no_grad():
            flat = body(torch.zeros(1, *self.shape)).flatten(1).shape[1]
        return nn.Sequential(*body, nn.Flatten(), _init(nn.Linear(flat, features)), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.scale(x))


class NatureCNN(ImageEncoder):
    """The DQN Nature CNN (32x8x8/4, 64x4x4/2, 64x3x3/1), then ``features`` units."""

    def __init__(self, space: gym.Space, features: int):
        super().__init__(space)
        c = self.shape[0]
        body = [_init(nn.Conv2d(c, 32, 8, 4)), nn.ReLU(), _init(nn.Conv2d(32, 64, 4, 2)), nn.ReLU()]
        body += [_init(nn.Conv2d(64, 64, 3, 1)), nn.ReLU()]
        self.net = self.head(nn.Sequential(*body), features)


class SmallCNN(ImageEncoder):
    """Two 3x3 stride-2 convolutions (16, 32 channels, padding 1), then ``features`` units: for small images."""

    def __init__(self, space: gym.Space, features: int):
        super().__init__(space)
        c = self.shape[0]
        body = [_init(nn.Conv2d(c, 16, 3, 2, 1)), nn.ReLU(), _init(nn.Conv2d(16, 32, 3, 2, 1)), nn.ReLU()]
        self.net = self.head(nn.Sequential(*body), features)


class Residual(nn.Module):
    """``x + conv(relu(conv(relu(x))))`` (IMPALA's residual block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = _init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = _init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ImageEncoder):
    """The IMPALA ResNet: per stage (16, 32, 32) a conv, a 3x3/2 max-pool, two residual blocks; then ``features``."""

    def __init__(self, space: gym.Space, features: int):
        super().__init__(space)
        layers: list[nn.Module] = []
        channels = self.shape[0]
        for out in (16, 32, 32):
            layers += [
                _init(nn.Conv2d(channels, out, 3, padding=1)),
                nn.MaxPool2d(3, 2, 1),
                Residual(out),
                Residual(out),
            ]
            channels = out
        self.net = self.head(nn.Sequential(*layers, nn.ReLU()), features)


class KeypointCNN(ImageEncoder):
    """A 3x3/2 convolution (32 channels), a 1x1 one to ``features / 2`` maps, and a spatial softmax: each map's
    expected (x, y) pixel centre, both in [-1, 1] (x to the right, y down), as ``features`` values."""

    def __init__(self, space: gym.Space, features: int):
        super().__init__(space)
        if features < 2 or features % 2:
            raise ValueError(f"model.cnn_features must be even and >= 2 for keypoints (x and y each), got {features}")
        body = nn.Sequential(
            _init(nn.Conv2d(self.shape[0], 32, 3, 2, 1)), nn.ReLU(), _init(nn.Conv2d(32, features // 2, 1))
        )
        with torch.no_grad():
            height, width = body(torch.zeros(1, *self.shape)).shape[2:]
        rows, cols = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.net = body
        self.register_buffer("grid", torch.stack((cols.flatten(), rows.flatten()), 1), persistent=False)  # [H*W, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maps = self.net(self.scale(x))
        weights = torch.softmax(maps.flatten(2), dim=2)  # [B, K, H*W]
        return torch.matmul(weights, self.grid).flatten(1)  # [B, K * 2]: x0, y0, x1, y1, ...


def image_encoder(space: gym.Space, kind: str, features: int) -> ImageEncoder:
    """The encoder ``model.cnn`` names for an image space (``auto``: Nature from 36 px, else the small CNN)."""
    if kind not in CNNS:
        raise ValueError(f"model.cnn must be one of {CNNS}, got {kind!r}")
    side = min(image_shape(space)[1:])
    if kind == "auto":
        kind = "nature" if side >= NATURE_MIN_SIDE else "small"
    if kind == "nature" and side < NATURE_MIN_SIDE:
        raise ValueError(
            f"model.cnn: nature needs images of at least {NATURE_MIN_SIDE} px, this one is {space.shape}; "
            "use small, impala or auto"
        )
    return {"nature": NatureCNN, "small": SmallCNN, "impala": ImpalaCNN, "keypoints": KeypointCNN}[kind](
        space, features
    )


def _init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer
