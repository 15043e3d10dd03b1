"""``raysim/Reach``: a batched planar arm of 2..7 revolute links that brings its end effector to a goal.

Kinematics. Joint ``i`` rotates link ``i`` relative to link ``i-1``; with ``phi_i = q_1 + ... + q_i``
the end effector is ``sum_i l_i (cos phi_i, sin phi_i)`` (``forward_kinematics``). The base is at
the origin; the workspace is the set of points reachable within the joint limits.

Joint control: a **first-order model**. Each step the action term (``raysim.envs.actions``)
turns the action into joint position targets; then, for ``decimation`` sub-steps of ``dt``
seconds, every joint moves toward its target as the exact solution of
``dq/dt = (target - q) / time_constant`` over ``dt`` (unconditionally stable), with the move
capped at ``max_joint_vel * dt``. ``joint_vel`` is the velocity of the last sub-step. With
``hard_limits`` off the joints stop at their limits (clamped); with it on, a joint that passes
a limit ends the episode as a failure.

Episodes. Initial joints are uniform in the middle ``init_joint_range`` fraction of each joint's
range; goals are the end-effector position of joints drawn uniformly within the limits (so every
goal is reachable), redrawn (up to 16 times) while closer than ``min_goal_distance`` to the start.
All draws come from the generator the contract passes (equal reset seeds, equal starts).

- success: the end effector is within ``tolerance`` of the goal for ``hold_steps`` consecutive
  steps: terminated, ``success=True``;
- failure (``hard_limits`` on): a joint outside its limits: terminated, ``success=False``
  (failure wins over a success in the same step);
- the step limit ``max_episode_steps`` truncates; a success on the last step is terminated
  *and* truncated, with ``success=True``.

Reward: ``sum_k weight_k * term_k`` over the named terms ``distance`` (end effector to goal),
``success`` (1 on the success step), ``action_rate`` (``|a_t - a_{t-1}|^2``) and ``failure``
(1 on the failure step); a term with weight 0 (or left out of ``rewards``) is off.

Episode report: ``success`` (bool), ``failure`` (bool), ``final_distance``, and per reward term
``reward_<name>``: the episode's mean per step of ``weight * term``.

Actions ``[N, J]`` in ``[-1, 1]`` (values outside are clipped) go to the action term configured
by ``actions`` (default: relative to the current joint position, scale 0.2 rad, targets clamped
to the joint limits). Observations are the groups configured by ``observations``
(``raysim.envs.observations``); by default ``policy`` and a noise-free, privileged ``critic``.
Observation noise is counter-based (``raysim.seeding.keyed_normal``): row ``i`` at step ``t`` of its
episode draws from its episode's key and ``t`` alone, the key being drawn at the episode's reset
from the reset's generator. So equal reset seeds give equal observations and equal noise
(``seeded_reset`` holds: GRPO group members share their noise as they share their start), and a
seeded evaluation does not depend on the layout of its rows.

Options (defaults): ``num_links`` 2, ``link_lengths`` ``1/num_links`` each (reach radius 1),
``joint_limits`` [-2.8, 2.8] rad for every joint (or ``[[lo...], [hi...]]``), ``dt`` 0.01 s,
``decimation`` 4, ``time_constant`` 0.05 s, ``max_joint_vel`` 5 rad/s, ``tolerance`` 5% of the
reach radius, ``hold_steps`` 1, ``hard_limits`` off, ``init_joint_range`` 0.5,
``min_goal_distance`` 2 x tolerance, ``max_episode_steps`` 100, ``actions`` / ``observations`` /
``rewards`` as ``DEFAULT_ACTIONS`` / ``DEFAULT_OBSERVATIONS`` / ``DEFAULT_REWARDS``.
``get_state`` / ``set_state`` (checkpoints) cover every row's episode, the action term's
targets, the noise keys and the generator.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.actions import make_action_term
from raysim.envs.arm_picture import arm_camera, draw_arm
from raysim.envs.contract import Obs
from raysim.envs.observations import ObservationGroups
from raysim.envs.torch_env import TorchEnv
from raysim.seeding import keyed_normal

DEFAULT_ACTIONS = {"type": "relative", "scale": 0.2, "reference": "position", "limit": "joint_limits"}
DEFAULT_OBSERVATIONS = {
    "policy": ["joint_pos", {"term": "joint_vel", "scale": 0.2}, "goal_rel", "last_action"],
    "critic": ["joint_pos", {"term": "joint_vel", "scale": 0.2}, "ee_pos", "goal", "goal_rel", "last_action"],
}
DEFAULT_REWARDS = {"distance": -1.0, "success": 10.0, "action_rate": -0.01, "failure": -10.0}
REWARD_TERMS = ("distance", "success", "action_rate", "failure")
DEFAULT_JOINT_LIMIT = 2.8  # rad, every joint in [-2.8, 2.8] unless joint_limits says otherwise


def forward_kinematics(joint_pos: torch.Tensor, link_lengths: torch.Tensor) -> torch.Tensor:
    """End-effector positions [N, 2] of planar arms with joint angles [N, J] and lengths [J]."""
    phi = torch.cumsum(joint_pos, dim=1)
    lengths = link_lengths.to(joint_pos)
    return torch.stack(((lengths * torch.cos(phi)).sum(1), (lengths * torch.sin(phi)).sum(1)), dim=1)


class Reach(TorchEnv):
    """``raysim/Reach``: planar arm reaching; see the module docstring for the task."""

    env_id = "raysim/Reach"
    defines_success = True
    #: the tensors that, with the action term's target, make up the task state (checkpoints)
    state_keys = (
        "joint_pos",
        "joint_vel",
        "ee_pos",
        "goal",
        "last_action",
        "distance",
        "hold_count",
        "succeeded",
        "failed",
        "reward_sums",
    )

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        max_episode_steps: int = 100,
        device: str = "cpu",
        num_links: int = 2,
        link_lengths: Sequence[float] | None = None,
        joint_limits: Sequence[Sequence[float]] | Sequence[float] | None = None,
        dt: float = 0.01,
        decimation: int = 4,
        time_constant: float = 0.05,
        max_joint_vel: float = 5.0,
        tolerance: float | None = None,
        hold_steps: int = 1,
        hard_limits: bool = False,
        init_joint_range: float = 0.5,
        min_goal_distance: float | None = None,
        actions: dict | None = None,
        observations: dict | None = None,
        rewards: dict | None = None,
    ):
        super().__init__(num_envs, seed, max_episode_steps, device)
        self._set_arm(num_links, link_lengths, joint_limits)
        self._set_joint_control(dt, decimation, time_constant, max_joint_vel)
        self._set_episode_rules(tolerance, hold_steps, hard_limits, init_joint_range, min_goal_distance, rewards)
        J = self.num_links
        self.action_term = make_action_term(
            DEFAULT_ACTIONS if actions is None else actions, self.num_envs, J, self.joint_limits, self.device
        )
        self.observations = self._observation_groups(observations)

        N, f = self.num_envs, dict(device=self.device)
        self.joint_pos = torch.zeros(N, J, **f)
        self.joint_vel = torch.zeros(N, J, **f)
        self.ee_pos = torch.zeros(N, 2, **f)
        self.goal = torch.zeros(N, 2, **f)
        self.last_action = torch.zeros(N, J, **f)
        self.distance = torch.zeros(N, **f)
        self.hold_count = torch.zeros(N, dtype=torch.int64, **f)
        self.succeeded = torch.zeros(N, dtype=torch.bool, **f)
        self.failed = torch.zeros(N, dtype=torch.bool, **f)
        self.reward_sums = torch.zeros(N, len(self.reward_names), **f)  # per-episode sums of weight * term
        self.noise_key = torch.zeros(N, dtype=torch.int64, **f)  # each row's episode key of observation noise
        self.noise_width = self.observations.noise_width(self)  # draws per row and observation (0: none)

        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(J,), dtype=np.float32)
        self.reset(seed)
        self.observation_spaces = self.observations.spaces(self)

    def _set_arm(self, num_links: int, link_lengths: Sequence[float] | None, joint_limits: Any) -> None:
        """The links, their lengths (reach radius) and the joint limits, checked."""
        if isinstance(num_links, bool) or not isinstance(num_links, int) or not 2 <= num_links <= 7:
            raise ValueError(f"num_links must be an integer in 2..7, got {num_links!r}")
        J = self.num_links = num_links
        lengths = [1.0 / J] * J if link_lengths is None else list(link_lengths)
        if len(lengths) != J or any(not length > 0 for length in lengths):
            raise ValueError(f"link_lengths must be {J} positive numbers, got {link_lengths!r}")
        self.link_lengths = torch.tensor(lengths, dtype=torch.float32, device=self.device)
        self.reach = float(sum(lengths))
        self.joint_limits = self._parse_limits(joint_limits, J).to(self.device)  # [2, J]

    def _set_joint_control(self, dt: float, decimation: int, time_constant: float, max_joint_vel: float) -> None:
        """The first-order joint model: sub-step length, sub-steps per step, time constant, speed cap."""
        if not (dt > 0 and time_constant > 0 and max_joint_vel > 0):
            raise ValueError("dt, time_constant and max_joint_vel must be > 0")
        if isinstance(decimation, bool) or not isinstance(decimation, int) or decimation < 1:
            raise ValueError(f"decimation must be an integer >= 1, got {decimation!r}")
        self.dt, self.decimation = float(dt), decimation
        self.alpha = 1.0 - math.exp(-self.dt / float(time_constant))
        self.max_joint_vel = float(max_joint_vel)

    def _set_episode_rules(
        self,
        tolerance: float | None,
        hold_steps: int,
        hard_limits: bool,
        init_joint_range: float,
        min_goal_distance: float | None,
        rewards: dict | None,
    ) -> None:
        """Success (tolerance held for ``hold_steps``), failure (hard limits), starts, goals and reward weights."""
        self.tolerance = 0.05 * self.reach if tolerance is None else float(tolerance)
        if not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
        if isinstance(hold_steps, bool) or not isinstance(hold_steps, int) or hold_steps < 1:
            raise ValueError(f"hold_steps must be an integer >= 1, got {hold_steps!r}")
        self.hold_steps = hold_steps
        self.hard_limits = bool(hard_limits)
        if not 0.0 <= init_joint_range <= 1.0:
            raise ValueError(f"init_joint_range must be in [0, 1], got {init_joint_range!r}")
        self.init_joint_range = float(init_joint_range)
        self.min_goal_distance = 2 * self.tolerance if min_goal_distance is None else float(min_goal_distance)
        weights = dict(DEFAULT_REWARDS if rewards is None else rewards)
        unknown = set(weights) - set(REWARD_TERMS)
        if unknown:
            raise ValueError(f"unknown reward terms {sorted(unknown)}; terms: {list(REWARD_TERMS)}")
        self.reward_weights = {k: float(weights[k]) for k in REWARD_TERMS if k in weights}
        self.reward_names = list(self.reward_weights)  # the columns of reward_sums

    def _observation_groups(self, observations: dict | None) -> ObservationGroups:
        """The vector observation groups (``observations``, default ``DEFAULT_OBSERVATIONS``); 'policy' among them."""
        return ObservationGroups(DEFAULT_OBSERVATIONS if observations is None else observations)

    @classmethod
    def materialize(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Fill in the defaults of ``options`` (its own copy), so equal tasks have one canonical config.

        ``actions``, ``observations``, ``rewards`` left out (or None) become the defaults, and
        ``link_lengths`` / ``tolerance`` the values derived from ``num_links``. A given
        ``actions`` / ``observations`` / ``rewards`` mapping replaces its default whole.
        """
        for key, default in (
            ("actions", DEFAULT_ACTIONS),
            ("observations", DEFAULT_OBSERVATIONS),
            ("rewards", DEFAULT_REWARDS),
        ):
            if options.get(key) is None:
                options[key] = copy.deepcopy(default)
        J = options.get("num_links", 2)
        if options.get("link_lengths") is None and isinstance(J, int) and not isinstance(J, bool) and 2 <= J <= 7:
            options["link_lengths"] = [1.0 / J] * J
        lengths = options.get("link_lengths")
        if (
            options.get("tolerance") is None
            and isinstance(lengths, (list, tuple))
            and all(isinstance(limit, (int, float)) for limit in lengths)
        ):
            options["tolerance"] = 0.05 * float(sum(lengths))
        return options

    @staticmethod
    def _parse_limits(joint_limits: Any, J: int) -> torch.Tensor:
        if joint_limits is None:
            return torch.tensor([[-DEFAULT_JOINT_LIMIT] * J, [DEFAULT_JOINT_LIMIT] * J])
        limits = torch.as_tensor(joint_limits, dtype=torch.float32)
        if limits.shape == (2,):  # one [lo, hi] for every joint
            limits = limits.unsqueeze(1).expand(2, J).clone()
        if limits.shape != (2, J) or bool((limits[0] >= limits[1]).any()):
            raise ValueError(
                f"joint_limits must be [lo, hi] or [[lo_1..lo_{J}], [hi_1..hi_{J}]] with lo < hi, got {joint_limits!r}"
            )
        return limits

    # -- TorchEnv ----------------------------------------------------------------------------

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        n, J = rows.numel(), self.num_links
        lo, hi = self.joint_limits
        centre, half = (lo + hi) / 2, (hi - lo) / 2

        def uniform(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
            return low + (high - low) * torch.rand(n, J, generator=generator, device=self.device)

        start = uniform(centre - half * self.init_joint_range, centre + half * self.init_joint_range)
        start_ee = forward_kinematics(start, self.link_lengths)
        goal = forward_kinematics(uniform(lo, hi), self.link_lengths)
        for _ in range(16):  # redraw goals that start (almost) solved
            close = (goal - start_ee).norm(dim=1) < self.min_goal_distance
            if not bool(close.any()):
                break
            goal = torch.where(close.unsqueeze(1), forward_kinematics(uniform(lo, hi), self.link_lengths), goal)
        self.joint_pos[rows] = start
        self.joint_vel[rows] = 0.0
        self.ee_pos[rows] = start_ee
        self.goal[rows] = goal
        self.distance[rows] = (goal - start_ee).norm(dim=1)
        self.last_action[rows] = 0.0
        self.hold_count[rows] = 0
        self.succeeded[rows] = False
        self.failed[rows] = False
        self.reward_sums[rows] = 0.0
        self.action_term.reset(rows, start)
        if self.noise_width:  # drawn last: without noise the starts are those of a noise-free Reach
            key = torch.randint(-(2**63), 2**63 - 1, (n,), generator=generator, dtype=torch.int64, device=self.device)
            self.noise_key[rows] = key

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action = actions.to(self.joint_pos).clamp(-1.0, 1.0)
        target = self.action_term(action, self.joint_pos)
        lo, hi = self.joint_limits
        q, qd = self.joint_pos, self.joint_vel
        cap = self.max_joint_vel * self.dt
        for _ in range(self.decimation):
            move = ((target - q) * self.alpha).clamp(-cap, cap)
            q_next = q + move
            if not self.hard_limits:
                q_next = torch.maximum(torch.minimum(q_next, hi), lo)
            qd = (q_next - q) / self.dt
            q = q_next
        self.joint_pos.copy_(q)
        self.joint_vel.copy_(qd)
        self.ee_pos.copy_(forward_kinematics(q, self.link_lengths))
        self.distance.copy_((self.goal - self.ee_pos).norm(dim=1))

        within = self.distance <= self.tolerance
        self.hold_count.copy_(torch.where(within, self.hold_count + 1, torch.zeros_like(self.hold_count)))
        failed = ((q < lo) | (q > hi)).any(1) if self.hard_limits else torch.zeros_like(within)
        succeeded = (self.hold_count >= self.hold_steps) & ~failed
        self.failed.copy_(failed)
        self.succeeded.copy_(succeeded)

        values = {
            "distance": self.distance,
            "success": succeeded.float(),
            "action_rate": (action - self.last_action).square().sum(1),
            "failure": failed.float(),
        }
        reward = torch.zeros(self.num_envs, device=self.device)
        for column, (name, weight) in enumerate(self.reward_weights.items()):
            weighted = weight * values[name]
            self.reward_sums[:, column] += weighted
            reward += weighted
        self.last_action.copy_(action)
        return reward, succeeded | failed

    def _observe(self) -> Obs:
        noise = None
        if self.noise_width:  # the step counter is the episode's: 0 at the reset, t after t steps
            noise = keyed_normal(self.noise_key, self.episode_length, self.noise_width)
        return self.observations.compute(self, noise)

    def _episode_report(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        length = self.episode_length.index_select(0, rows).clamp(min=1).float()
        report = {
            "success": self.succeeded.index_select(0, rows),
            "failure": self.failed.index_select(0, rows),
            "final_distance": self.distance.index_select(0, rows),
        }
        sums = self.reward_sums.index_select(0, rows)
        for column, name in enumerate(self.reward_names):
            report[f"reward_{name}"] = sums[:, column] / length
        return report

    def frames(self, size: int) -> torch.Tensor:
        """Every row's arm and target from above (``raysim.envs.arm_picture``), ``[N, size, size, 3]`` uint8."""
        camera = getattr(self, "_video_camera", None)
        if camera is None or camera.size != size:
            camera = self._video_camera = arm_camera(size, self.reach, self.device)
        pictures = draw_arm(camera, self.joint_pos, self.link_lengths, self.goal, self.reach)
        return pictures.permute(0, 2, 3, 1).contiguous()

    def get_state(self) -> dict[str, torch.Tensor]:
        state = super().get_state()
        state["action_target"] = self.action_term.target.clone()
        state["noise_key"] = self.noise_key.clone()
        return state

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        super().set_state(state)
        self.action_term.target = state["action_target"].to(self.device).clone()
        if "noise_key" in state:  # states saved before the keys existed continue with new keys
            self.noise_key = state["noise_key"].to(self.device).clone()
