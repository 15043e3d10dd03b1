"""Joint action terms: relative (to the position or the previous target) and absolute, with and without limits."""

from __future__ import annotations

import pytest
import torch

from raysim.envs.actions import AbsoluteJointAction, RelativeJointAction, make_action_term

LIMITS = torch.tensor([[-1.0, -2.0], [1.0, 2.0]])


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def relative(reference="position", limit=None, scale=0.5, num_envs=2):
    return RelativeJointAction(num_envs, 2, scale=scale, reference=reference, limit=limit, joint_limits=LIMITS)


# -- relative to the current position ----------------------------------------------------------


def test_relative_position_action_without_limit_adds_the_scaled_action_even_beyond_the_joint_limits():
    term = relative("position", limit=None)
    pos = t([0.2, -0.4], [0.9, 1.9])  # row 1 sits near the upper limits
    target = term(t([1.0, -1.0], [1.0, 1.0]), pos)
    torch.testing.assert_close(target, t([0.7, -0.9], [1.4, 2.4]))  # 1.4 > 1 and 2.4 > 2: not clamped
    assert term.target is target


def test_relative_position_action_with_joint_limits_clamps_the_final_target_at_and_beyond_the_limits():
    term = relative("position", limit="joint_limits")
    pos = t([1.0, -2.0], [0.9, 1.9])  # row 0 exactly at (upper, lower) limits
    target = term(t([1.0, -1.0], [1.0, 1.0]), pos)
    torch.testing.assert_close(target, t([1.0, -2.0], [1.0, 2.0]))
    # inside the limits nothing changes; an action back from the limit moves away from it
    target = term(t([-1.0, 1.0], [-0.2, -0.4]), t([1.0, -2.0], [0.0, 0.0]))
    torch.testing.assert_close(target, t([0.5, -1.5], [-0.1, -0.2]))


def test_relative_position_action_with_explicit_bounds_clamps_to_those_bounds_per_joint():
    term = relative("position", limit=[[-0.25, -0.5], [0.25, 0.5]])
    target = term(t([1.0, 1.0], [-1.0, -1.0]), t([0.0, 0.0], [0.0, 0.0]))
    torch.testing.assert_close(target, t([0.25, 0.5], [-0.25, -0.5]))


def test_relative_position_action_ignores_the_previous_target():
    term = relative("position")
    pos = t([0.0, 0.0], [0.0, 0.0])
    term(t([1.0, 1.0], [1.0, 1.0]), pos)
    target = term(t([1.0, 1.0], [1.0, 1.0]), pos)  # the position did not move: the same target again
    torch.testing.assert_close(target, t([0.5, 0.5], [0.5, 0.5]))


# -- relative to the previous target ----------------------------------------------------------


def test_relative_target_action_accumulates_on_the_previous_target_whatever_the_position():
    term = relative("target", limit=None)
    term.reset(torch.tensor([0, 1]), t([0.0, 0.0], [0.5, -0.5]))
    term(t([1.0, 0.0], [0.0, 1.0]), t([9.0, 9.0], [9.0, 9.0]))
    target = term(t([1.0, 0.0], [0.0, 1.0]), t([-9.0, -9.0], [-9.0, -9.0]))
    torch.testing.assert_close(target, t([1.0, 0.0], [0.5, 0.5]))
    target = term(t([1.0, 1.0], [1.0, 1.0]), t([0.0, 0.0], [0.0, 0.0]))  # beyond the limits: not clamped
    torch.testing.assert_close(target, t([1.5, 0.5], [1.0, 1.0]))


def test_relative_target_action_with_joint_limits_clamps_and_the_clamped_target_is_the_next_reference():
    term = relative("target", limit="joint_limits")
    term.reset(torch.tensor([0, 1]), t([0.9, -1.9], [0.0, 0.0]))
    target = term(t([1.0, -1.0], [1.0, 1.0]), t([0.0, 0.0], [0.0, 0.0]))
    torch.testing.assert_close(target, t([1.0, -2.0], [0.5, 0.5]))  # row 0 clamped beyond, row 1 inside
    target = term(t([1.0, -1.0], [1.0, 1.0]), t([0.0, 0.0], [0.0, 0.0]))  # pushing on: stays at the limits
    torch.testing.assert_close(target, t([1.0, -2.0], [1.0, 1.0]))
    target = term(t([-1.0, 1.0], [0.0, 0.0]), t([0.0, 0.0], [0.0, 0.0]))  # no wind-up: one step back moves back
    torch.testing.assert_close(target, t([0.5, -1.5], [1.0, 1.0]))


def test_reset_makes_the_rows_current_position_their_target_and_leaves_other_rows():
    term = relative("target", num_envs=3)
    term(t([1.0, 1.0], [1.0, 1.0], [1.0, 1.0]), torch.zeros(3, 2))
    term.reset(torch.tensor([1]), t([0.25, -0.25]))
    torch.testing.assert_close(term.target, t([0.5, 0.5], [0.25, -0.25], [0.5, 0.5]))


def test_per_joint_scale_applies_joint_by_joint():
    term = RelativeJointAction(1, 2, scale=[0.1, 1.0])
    torch.testing.assert_close(term(t([1.0, 1.0]), t([0.0, 0.0])), t([0.1, 1.0]))


# -- absolute ---------------------------------------------------------------------------------


def test_absolute_action_is_offset_plus_scaled_action_independent_of_the_position():
    term = AbsoluteJointAction(2, 2, scale=[1.0, 2.0], offset=[0.5, 0.0])
    target = term(t([0.5, -0.5], [1.0, 1.0]), t([7.0, 7.0], [-7.0, 3.0]))
    torch.testing.assert_close(target, t([1.0, -1.0], [1.5, 2.0]))


def test_absolute_action_with_joint_limits_clamps_at_and_beyond_the_limits():
    term = AbsoluteJointAction(2, 2, scale=3.0, limit="joint_limits", joint_limits=LIMITS)
    target = term(t([1 / 3, -2 / 3], [1.0, 1.0]), torch.zeros(2, 2))
    torch.testing.assert_close(target, t([1.0, -2.0], [1.0, 2.0]))


# -- config ----------------------------------------------------------------------------------


def test_make_action_term_builds_each_type_from_a_config_mapping():
    term = make_action_term(
        {"type": "relative", "scale": 0.2, "reference": "target", "limit": "joint_limits"}, 3, 2, LIMITS
    )
    assert isinstance(term, RelativeJointAction) and term.reference == "target"
    torch.testing.assert_close(term.bounds, LIMITS)
    assert isinstance(make_action_term({"type": "absolute"}, 3, 2), AbsoluteJointAction)
    assert isinstance(make_action_term(None, 3, 2), RelativeJointAction)


def test_bad_action_configs_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="reference must be one of"):
        relative("velocity")
    with pytest.raises(ValueError, match="limit must be None, 'joint_limits'"):
        relative(limit="joint_limit")
    with pytest.raises(ValueError, match=r"shape \[2, 2\]"):
        relative(limit=[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match="lower bound exceeds"):
        relative(limit=[[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="needs the task's joint_limits"):
        RelativeJointAction(1, 2, limit="joint_limits")
    with pytest.raises(ValueError, match="action type must be one of"):
        make_action_term({"type": "torque"}, 1, 2)
    with pytest.raises(TypeError, match="action term 'absolute': bad option"):
        make_action_term({"type": "absolute", "reference": "target"}, 1, 2)
    with pytest.raises(ValueError, match="scale must be a number or a list of 2"):
        RelativeJointAction(1, 2, scale=[1.0, 2.0, 3.0])
