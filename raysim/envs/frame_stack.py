"""Frame stacking: each row sees its last ``k`` observations of some groups, applied by the shard to any env.

``FrameStack(env, FrameStackConfig(k=4, groups=["camera"]))`` is a ``BatchedEnv`` around ``env`` (native or
Gymnasium) that the shard builds; the env itself knows nothing of it. A stacked group's observation is the
row's last ``k`` observations, oldest first, concatenated along the channel axis of an image (``C x H x W``
-> ``k*C x H x W``, or ``H x W x C`` -> ``H x W x k*C``; uint8 kept) and along the first axis of a vector.

Reset-aware, batched: when a row's trajectory starts (``reset``, ``reset_rows``, ``Step.started_rows``: the
rows of a same-step auto-reset, or a native Gymnasium vector env's row one step after its done, at the new
episode's first observation, not the old one's final) its stack restarts filled with ``k`` copies of that
first observation (Gymnasium's ``FrameStackObservation`` with ``padding_type="reset"``; SB3's
``VecFrameStack`` pads with zeros instead). A finished row's ``final_obs`` is its stack as it was at the end
(its final observation last, owned), so the terminal value bootstraps from what the policy would have
seen. The stacks are part of ``get_state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.contract import BatchedEnv, Obs, Step
from raysim.envs.spaces import channels_first, is_image_space
from raysim.schema import setting


@dataclass
class FrameStackConfig:
    """Which observation groups the shard stacks, and how many observations deep (``env.frame_stack``)."""

    k: int = setting(1, help="observations per stack, oldest first (1: no stacking)", low=1)
    groups: list[str] = setting(
        factory=list, help="observation groups stacked: channels of an image, features of a vector"
    )


def stacked(env: BatchedEnv, config: FrameStackConfig | dict | None) -> BatchedEnv:
    """``env`` with its frame stack (``FrameStack``), or ``env`` itself when ``config`` stacks nothing."""
    config = config if isinstance(config, FrameStackConfig) else FrameStackConfig(**(config or {}))
    return env if config.k == 1 else FrameStack(env, config)


def stack_axis(space: gym.Space) -> int:
    """The per-row axis a group is stacked along: channels of an image (first or last), else the first."""
    return -1 if is_image_space(space) and not channels_first(space) else 0


def stacked_space(space: gym.Space, k: int) -> gym.spaces.Box:
    """The space of ``k`` observations of ``space`` concatenated along ``stack_axis``."""
    axis = stack_axis(space)
    low, high = (np.concatenate([bound] * k, axis=axis) for bound in (space.low, space.high))
    return gym.spaces.Box(low, high, dtype=space.dtype)


class FrameStack(BatchedEnv):
    """``env`` whose ``config.groups`` observations are the rows' last ``config.k`` ones (see the module)."""

    def __init__(self, env: BatchedEnv, config: FrameStackConfig):
        self.env, self.k, self.groups = env, int(config.k), list(config.groups)
        if not self.groups:
            raise ValueError(f"env.frame_stack.groups: name the groups to stack ({sorted(env.observation_spaces)})")
        self.observation_spaces = dict(env.observation_spaces)
        self.axis: dict[str, int] = {}  # the batched axis each group is stacked along
        for group in self.groups:
            space = env.observation_spaces.get(group)
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(
                    f"env.frame_stack.groups: {group!r} is not a Box group of {env.env_id} "
                    f"(its groups: {sorted(env.observation_spaces)})"
                )
            self.observation_spaces[group] = stacked_space(space, self.k)
            if is_image_space(space) and channels_first(self.observation_spaces[group]) != channels_first(space):
                raise ValueError(
                    f"env.frame_stack: {self.k} x the channels of {group!r} {space.shape} would read as another "
                    "channel order (more channels than height or width): stack fewer"
                )
            self.axis[group] = stack_axis(space) % len(space.shape) + 1
        self.env_id, self.num_envs, self.action_space = env.env_id, env.num_envs, env.action_space
        self.max_episode_steps, self.seeded_reset = env.max_episode_steps, env.seeded_reset
        self.resets_rows, self.defines_success = env.resets_rows, env.defines_success
        self.task_names = env.task_names
        if hasattr(env, "expert_actions"):  # a scripted expert reads the rows' states, which stacking leaves alone
            self.expert_actions = env.expert_actions
        self.stacks: Obs = {}

    def reset(self, seed: int | None = None) -> Obs:
        """Every row's stack restarts from its first observation."""
        obs = self.env.reset(seed)
        self.stacks = {g: self._repeat(g, obs[g]) for g in self.groups}
        return self._observed(obs)

    def reset_rows(self, rows: torch.Tensor, seeds: Sequence[int]) -> Obs:
        """The stacks of ``rows`` restart from their first observation; the other rows' stay."""
        obs = self.env.reset_rows(rows, seeds)
        stacks = {g: v.clone() for g, v in self.stacks.items()}  # earlier observations handed out stay as they were
        for group, stack in stacks.items():
            stack[rows] = self._repeat(group, obs[group][rows])
        self.stacks = stacks
        return self._observed(obs)

    def step(self, actions: torch.Tensor) -> Step:
        """Push every row's new observation; a finished row's ``final_obs`` is its whole last stack, and a row
        whose next trajectory starts here (``Step.started_rows``) restarts from that trajectory's first observation."""
        step = self.env.step(actions)
        done, started = step.done_rows, step.started_rows()
        stacks = {}
        for group, stack in self.stacks.items():
            stacks[group] = self._push(group, stack, step.obs[group])
            if done.numel():
                step.final_obs[group] = self._push(group, stack[done], step.final_obs[group])
            if started.numel():
                stacks[group][started] = self._repeat(group, step.obs[group][started])
        self.stacks = stacks
        step.obs = self._observed(step.obs)
        return step

    def newest(self, obs: Obs) -> Obs:
        """``obs`` (of this wrapper: the rows' stacks, or ``final_obs``) with each stacked group's newest
        observation, as the env gave it (views): what demonstrations keep (``raysim.rollout.trajectories``)."""
        newest = dict(obs)
        for group in self.groups:
            axis, stack = self.axis[group], obs[group]
            width = stack.shape[axis] // self.k
            newest[group] = stack.narrow(axis, stack.shape[axis] - width, width)
        return newest

    def frames(self, size: int) -> torch.Tensor:
        """The env's pictures (a stack is what the policy sees, not what a person watches)."""
        return self.env.frames(size)

    def get_state(self) -> dict | None:
        """The env's state and the rows' stacks; None when the env cannot save its state."""
        state = self.env.get_state()
        return None if state is None else {"env": state, "stacks": {g: v.clone() for g, v in self.stacks.items()}}

    def set_state(self, state: dict) -> None:
        self.env.set_state(state["env"])
        self.stacks = {g: v.clone() for g, v in state["stacks"].items()}

    def close(self) -> None:
        self.env.close()

    def _observed(self, obs: Obs) -> Obs:
        """``obs`` with the stacked groups replaced by the stacks."""
        return {g: self.stacks.get(g, v) for g, v in obs.items()}

    def _repeat(self, group: str, frame: torch.Tensor) -> torch.Tensor:
        """A stack of ``k`` copies of ``frame`` (rows first), a new tensor."""
        return torch.cat([frame] * self.k, dim=self.axis[group])

    def _push(self, group: str, stack: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """``stack`` without its oldest observation, ``frame`` appended (a new tensor)."""
        axis, width = self.axis[group], frame.shape[self.axis[group]]
        return torch.cat([stack.narrow(axis, width, stack.shape[axis] - width), frame.to(stack.dtype)], dim=axis)
