"""``raysim/ReachCamera``: ``raysim/Reach``'s planar arm seen by a top-down camera; the target is in the image only.

The task is Reach's (dynamics, rewards, success, episodes, seeding: the same rows and episodes for
the same seed and actions); only what the policy observes differs. Groups:

- ``camera``: ``[3, size, size]`` uint8 RGB, **channels first** (what torch convolutions take), the
  arm from above as ``raysim.envs.arm_picture`` draws it (a video's pictures are the same scene,
  larger). The image spans ``[-1.1, 1.1]`` reach radii on both axes (x to the right, y up), so at
  32 px a pixel is 0.069 reach radii, more than the default tolerance (0.05): edges are
  anti-aliased (``raysim.envs.camera``), and sub-pixel moves change the image.
- the vector groups of ``observations`` (Reach's terms), by default ``joints``: joint angles, joint
  velocities and the last action, not the target; and ``critic``: Reach's privileged critic group
  (with the goal), so the critic needs no image encoder.

Options: Reach's, plus ``camera: {size: 32}`` (pixels per side). ``observations`` names vector groups
only (no group is required; ``camera`` is the image's name). Final observations render only the
finished rows, as new tensors (owned).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.arm_picture import arm_camera, draw_arm
from raysim.envs.contract import Obs, take_rows
from raysim.envs.observations import ObservationGroups
from raysim.envs.reach import DEFAULT_OBSERVATIONS, Reach

DEFAULT_CAMERA = {"size": 32}
DEFAULT_CAMERA_OBSERVATIONS = {
    "joints": ["joint_pos", {"term": "joint_vel", "scale": 0.2}, "last_action"],
    "critic": copy.deepcopy(DEFAULT_OBSERVATIONS["critic"]),
}
IMAGE_GROUP = "camera"


class ReachCamera(Reach):
    """``raysim/ReachCamera``: Reach observed through a camera; see the module docstring."""

    env_id = "raysim/ReachCamera"

    def __init__(self, num_envs: int, seed: int | None = None, camera: dict | None = None, **options: Any):
        self.camera_size = parse_camera(camera)
        super().__init__(num_envs, seed, **options)
        image = gym.spaces.Box(0, 255, shape=(3, self.camera_size, self.camera_size), dtype=np.uint8)
        self.observation_spaces = {IMAGE_GROUP: image, **self.observation_spaces}

    def _set_arm(self, num_links: int, link_lengths: Any, joint_limits: Any) -> None:
        """Reach's arm, and the camera that fits its reach."""
        super()._set_arm(num_links, link_lengths, joint_limits)
        self.camera = arm_camera(self.camera_size, self.reach, self.device)

    def _observation_groups(self, observations: dict | None) -> ObservationGroups:
        """The vector groups (default ``DEFAULT_CAMERA_OBSERVATIONS``); the name ``camera`` is the image's."""
        config = DEFAULT_CAMERA_OBSERVATIONS if observations is None else observations
        if isinstance(config, dict) and IMAGE_GROUP in config:
            raise ValueError(f"observations: '{IMAGE_GROUP}' is the image group of {self.env_id}; name it otherwise")
        return ObservationGroups(config, required=())

    @classmethod
    def materialize(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Reach's defaults, the camera's vector groups and ``camera: {size: 32}`` filled in."""
        if options.get("observations") is None:
            options["observations"] = copy.deepcopy(DEFAULT_CAMERA_OBSERVATIONS)
        camera = options.get("camera")
        if camera is None or isinstance(camera, dict):  # anything else is left for the constructor to refuse
            options["camera"] = {**DEFAULT_CAMERA, **(camera or {})}
        return super().materialize(options)

    # -- observations ---------------------------------------------------------------------------

    def _observe(self) -> Obs:
        return {IMAGE_GROUP: self.render(self._all_rows), **super()._observe()}

    def _observe_rows(self, rows: torch.Tensor) -> Obs:
        return {IMAGE_GROUP: self.render(rows), **take_rows(super()._observe(), rows)}

    def render(self, rows: torch.Tensor) -> torch.Tensor:
        """The camera images [len(rows), 3, size, size] uint8 of ``rows`` (new tensors)."""
        joint_pos, goal = self.joint_pos.index_select(0, rows), self.goal.index_select(0, rows)
        return draw_arm(self.camera, joint_pos, self.link_lengths, goal, self.reach)


def parse_camera(camera: dict | None) -> int:
    """The image size of a ``camera`` option (``{size: pixels}``; None: the default), checked."""
    options = {**DEFAULT_CAMERA, **(camera or {})} if camera is None or isinstance(camera, dict) else None
    if options is None:
        raise ValueError(f"camera must be a mapping like {{size: 32}}, got {camera!r}")
    unknown = sorted(set(options) - set(DEFAULT_CAMERA))
    if unknown:
        raise ValueError(f"camera: unknown keys {unknown} (known: {sorted(DEFAULT_CAMERA)})")
    size = options["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"camera size must be an integer >= 1 (pixels), got {size!r}")
    return size


# The options are Reach's and ``camera``: the signature that option checks and the env identity read.
ReachCamera.__signature__ = inspect.signature(Reach).replace(
    parameters=[
        *inspect.signature(Reach).parameters.values(),
        inspect.Parameter("camera", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="dict | None"),
    ]
)
