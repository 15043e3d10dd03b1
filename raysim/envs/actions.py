"""Joint action terms: turn a policy's action ``[N, J]`` into joint position targets ``[N, J]``.

Reusable by any task with J position-controlled joints; they know nothing of a particular task.

- ``RelativeJointAction``: ``target = reference + scale * action``, where ``reference`` is the
  current joint position (``reference="position"``) or the previous target
  (``reference="target"``, an integrating controller).
- ``AbsoluteJointAction``: ``target = offset + scale * action``.

Both take an optional final-target limit, applied after the sum: ``limit=None`` (no clamp),
``"joint_limits"`` (clamp to the ``joint_limits`` the task passes in) or explicit bounds
``[[lo_1, ..., lo_J], [hi_1, ..., hi_J]]``. ``scale`` and ``offset`` are a float or one value per joint.

A task calls ``reset(rows, joint_pos)`` when rows start a new episode (the previous target
becomes the current position) and ``term(action, joint_pos)`` once per step; ``term.target``
holds the latest targets.

``make_action_term(config, num_joints, joint_limits)`` builds a term from a config mapping such
as ``{"type": "relative", "scale": 0.2, "reference": "position", "limit": "joint_limits"}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Bounds = torch.Tensor  # [2, J]: row 0 the lower, row 1 the upper bounds


def _per_joint(value: float | Sequence[float], num_joints: int, name: str) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.float32)
    if tensor.ndim == 0:
        tensor = tensor.expand(num_joints)
    if tensor.shape != (num_joints,):
        raise ValueError(f"{name} must be a number or a list of {num_joints} numbers, got {value!r}")
    return tensor.clone()


def _limit_bounds(limit: Any, num_joints: int, joint_limits: torch.Tensor | None) -> Bounds | None:
    """``limit`` (None | "joint_limits" | [[lo...], [hi...]]) as a [2, J] tensor, or None."""
    if limit is None:
        return None
    if isinstance(limit, str):
        if limit != "joint_limits":
            raise ValueError(f"limit must be None, 'joint_limits' or [[lo...], [hi...]], got {limit!r}")
        if joint_limits is None:
            raise ValueError("limit='joint_limits' needs the task's joint_limits")
        bounds = torch.as_tensor(joint_limits, dtype=torch.float32)
    else:
        bounds = torch.as_tensor(limit, dtype=torch.float32)
    if bounds.shape != (2, num_joints):
        raise ValueError(
            f"limit bounds must have shape [2, {num_joints}] ([[lo...], [hi...]]), got {tuple(bounds.shape)}"
        )
    if bool((bounds[0] > bounds[1]).any()):
        raise ValueError(f"limit bounds: a lower bound exceeds its upper bound: {bounds.tolist()}")
    return bounds.clone()


class JointActionTerm:
    """Base of the joint action terms: scale, final-target limit, the latest targets."""

    def __init__(
        self,
        num_envs: int,
        num_joints: int,
        scale: float | Sequence[float] = 1.0,
        limit: None | str | Sequence[Sequence[float]] = None,
        joint_limits: torch.Tensor | Sequence[Sequence[float]] | None = None,
        device: str | torch.device = "cpu",
    ):
        self.num_joints = int(num_joints)
        self.device = torch.device(device)
        self.scale = _per_joint(scale, self.num_joints, "scale").to(self.device)
        bounds = _limit_bounds(limit, self.num_joints, joint_limits)
        self.bounds = None if bounds is None else bounds.to(self.device)
        self.target = torch.zeros(num_envs, self.num_joints, device=self.device)

    def reset(self, rows: torch.Tensor, joint_pos: torch.Tensor) -> None:
        """Rows start a new episode at ``joint_pos`` [len(rows), J]: it becomes their target."""
        self.target[rows] = joint_pos.to(self.target.dtype)

    def clamp(self, target: torch.Tensor) -> torch.Tensor:
        """The final-target limit (identity when ``limit`` is None)."""
        if self.bounds is None:
            return target
        return torch.maximum(torch.minimum(target, self.bounds[1]), self.bounds[0])

    def _raw_target(self, action: torch.Tensor, joint_pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, action: torch.Tensor, joint_pos: torch.Tensor) -> torch.Tensor:
        """The joint targets [N, J] for ``action`` [N, J] at the current ``joint_pos`` [N, J]."""
        if action.shape[-1] != self.num_joints:
            raise ValueError(f"expected actions with {self.num_joints} joint values, got shape {tuple(action.shape)}")
        self.target = self.clamp(self._raw_target(action.to(self.target.dtype), joint_pos))
        return self.target


class RelativeJointAction(JointActionTerm):
    """``target = reference + scale * action``; ``reference``: ``"position"`` or ``"target"``.

    ``"position"``: relative to the current joint position (action 0 holds the arm where it is).
    ``"target"``: relative to the previous (limited) target, which accumulates the actions.
    """

    REFERENCES = ("position", "target")

    def __init__(
        self,
        num_envs: int,
        num_joints: int,
        scale: float | Sequence[float] = 0.1,
        reference: str = "position",
        **kwargs: Any,
    ):
        if reference not in self.REFERENCES:
            raise ValueError(f"reference must be one of {self.REFERENCES}, got {reference!r}")
        super().__init__(num_envs, num_joints, scale, **kwargs)
        self.reference = reference

    def _raw_target(self, action: torch.Tensor, joint_pos: torch.Tensor) -> torch.Tensor:
        base = joint_pos if self.reference == "position" else self.target
        return base + self.scale * action


class AbsoluteJointAction(JointActionTerm):
    """``target = offset + scale * action`` (e.g. offset = mid-range, scale = half-range)."""

    def __init__(
        self,
        num_envs: int,
        num_joints: int,
        scale: float | Sequence[float] = 1.0,
        offset: float | Sequence[float] = 0.0,
        **kwargs: Any,
    ):
        super().__init__(num_envs, num_joints, scale, **kwargs)
        self.offset = _per_joint(offset, self.num_joints, "offset").to(self.device)

    def _raw_target(self, action: torch.Tensor, joint_pos: torch.Tensor) -> torch.Tensor:
        return self.offset + self.scale * action


ACTION_TERMS = {"relative": RelativeJointAction, "absolute": AbsoluteJointAction}


def make_action_term(
    config: dict | None,
    num_envs: int,
    num_joints: int,
    joint_limits: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> JointActionTerm:
    """A term from ``{"type": "relative" | "absolute", **options}`` (default: relative)."""
    options = dict(config or {})
    kind = options.pop("type", "relative")
    if kind not in ACTION_TERMS:
        raise ValueError(f"action type must be one of {sorted(ACTION_TERMS)}, got {kind!r}")
    try:
        return ACTION_TERMS[kind](num_envs, num_joints, joint_limits=joint_limits, device=device, **options)
    except TypeError as error:
        raise TypeError(f"action term {kind!r}: bad option: {error}") from error
