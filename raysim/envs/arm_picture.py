"""How ``raysim/Reach``'s arm is drawn from above: one scene, for ReachCamera's observations and for videos.

The arm over a dark background: grey links, blue joints, a green end effector and the red target drawn
last (never hidden). The picture spans ``[-VIEW, VIEW]`` reach radii on both axes (x to the right, y up),
so a target at full reach is wholly inside. Only the camera's size differs between the policy's image
(``camera: {size: 32}``) and a video's picture (``eval.video_size``, e.g. 128).
"""

from __future__ import annotations

import torch

from raysim.envs.camera import Camera, Disks, Segments

VIEW = 1.1  # the picture's half width, in reach radii
# what is drawn, in reach radii and (red, green, blue), bottom to top
LINK_RADIUS, LINK_COLOUR = 0.04, (150, 150, 150)
JOINT_RADIUS, JOINT_COLOUR = 0.06, (70, 120, 255)
EFFECTOR_RADIUS, EFFECTOR_COLOUR = 0.06, (40, 220, 70)
TARGET_RADIUS, TARGET_COLOUR = 0.08, (240, 40, 40)
BACKGROUND = (16, 16, 24)


def arm_camera(size: int, reach: float, device: torch.device | str = "cpu") -> Camera:
    """A camera of ``size`` pixels per side that sees an arm of reach radius ``reach`` whole."""
    return Camera(size, VIEW * reach, background=BACKGROUND, device=device)


def draw_arm(
    camera: Camera, joint_pos: torch.Tensor, link_lengths: torch.Tensor, goal: torch.Tensor, reach: float
) -> torch.Tensor:
    """Pictures [n, 3, size, size] uint8 of ``n`` arms (``joint_pos`` [n, J]) and their goals ([n, 2])."""
    phi = torch.cumsum(joint_pos, dim=1)
    links = link_lengths.view(1, -1, 1) * torch.stack((torch.cos(phi), torch.sin(phi)), dim=2)  # [n, J, 2]
    joints = torch.cat((torch.zeros_like(links[:, :1]), torch.cumsum(links, dim=1)), dim=1)  # base .. effector
    layers = [
        Segments(joints[:, :-1], joints[:, 1:], LINK_RADIUS * reach, LINK_COLOUR),
        Disks(joints[:, :-1], JOINT_RADIUS * reach, JOINT_COLOUR),
        Disks(joints[:, -1:], EFFECTOR_RADIUS * reach, EFFECTOR_COLOUR),
        Disks(goal.unsqueeze(1), TARGET_RADIUS * reach, TARGET_COLOUR),
    ]
    return camera.render(layers, joint_pos.shape[0])
