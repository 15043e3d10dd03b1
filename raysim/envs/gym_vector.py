"""raysim's native tasks as Gymnasium environments: ``gymnasium.make_vec("raysim/CartPole-v0", num_envs=N)``.

Importing raysim registers, for every native task ``raysim/<Name>``, the Gymnasium id
``raysim/<Name>-v0`` (``raysim/CartPole-v0``, ``raysim/Reach-v0``):

- ``gymnasium.make_vec(id, num_envs=N, **options)`` returns a ``RaysimVectorEnv``: a
  ``gymnasium.vector.VectorEnv`` over the native batched task (no per-row Python loop, no
  sub-processes). Its ``metadata["autoreset_mode"]`` is ``AutoresetMode.SAME_STEP``: a row that
  finishes is reset inside the same ``step``, the returned observation is the first one of the
  new episode, and the finished episode's last observation is in ``info["final_obs"]``, in the
  layout of Gymnasium's own ``SyncVectorEnv`` in SAME_STEP mode: an object array of ``num_envs``
  entries (``None`` for rows that did not finish) with the bool mask ``info["_final_obs"]``, and
  ``info["final_info"]``, a dict of arrays with ``_key`` masks (the task's episode report:
  ``return``, ``length``, ``success`` where the task defines it, any task scalar, plus
  ``episode: {"r", "l"}`` as Gymnasium's ``RecordEpisodeStatistics`` names them), masked by
  ``info["_final_info"]``. ``info`` is ``{}`` in steps where no row finished.
- ``gymnasium.make(id, **options)`` returns a ``RaysimEnv``, a single ``gymnasium.Env`` (one row).

Observations are the task's ``policy`` group as float32 NumPy arrays; rewards are float64 (as
``SyncVectorEnv`` returns them), ``terminated`` / ``truncated`` bool arrays. ``options`` are the
task's own (e.g. ``num_links=3`` for Reach, ``max_episode_steps=200``). ``reset(seed=s)`` with an
int seed is reproducible and gives the same rows as ``raysim.envs.make(task, N, seed=s)``.
Without ``import raysim`` first, ``gymnasium.make_vec("raysim:raysim/CartPole-v0", ...)``
imports it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from raysim.envs.contract import BatchedEnv

GROUP = "policy"  # the observation group a Gymnasium env sees


def gym_id(task: str) -> str:
    """The Gymnasium id of native task ``raysim/<Name>``: ``raysim/<Name>-v0``."""
    return f"{task}-v0"


def gymnasium_spec(env_id: str, options: dict[str, Any]) -> EnvSpec | None:
    """The Gymnasium spec one row of ``env_id`` with ``options`` is rebuilt from (``gymnasium.make(spec)``: what a
    dataset of demonstrations stores for Minari's ``recover_environment``), or None where there is none.

    A native task's ``gymnasium_spec`` hook (``raysim/MetaWorld``: Meta-World's own env of one task); else a
    native task registered here (``raysim/<Name>-v0``: a ``RaysimEnv`` of the options); else for ``gym:<ID>`` that
    id's spec with the options (none for the Atari preset, whose preprocessing it lacks). A user's own task
    (``module:Class``), ``raysim/ReachCamera`` and several Meta-World tasks have none."""
    from raysim.envs.gym_adapter import RUNTIME_OPTIONS, registered_id
    from raysim.envs.registry import factory

    if env_id.startswith("gym:"):
        spec = gym.spec(registered_id(env_id[len("gym:") :]))
        if "atari" in options or not isinstance(spec.entry_point, str):
            return None
        kwargs = {k: v for k, v in copy.deepcopy(options).items() if k not in RUNTIME_OPTIONS}
        limit = kwargs.pop("max_episode_steps", spec.max_episode_steps)  # gymnasium.make's, not the env's
        return dataclasses.replace(spec, kwargs={**spec.kwargs, **kwargs}, max_episode_steps=limit)
    hook = getattr(factory(env_id), "gymnasium_spec", None)
    if hook is not None:
        return hook(copy.deepcopy(options))
    if gym_id(env_id) not in gym.registry:
        return None
    spec = gym.spec(gym_id(env_id))
    return dataclasses.replace(spec, kwargs={**spec.kwargs, **copy.deepcopy(options)})


def _actions_tensor(env: BatchedEnv, actions: Any) -> torch.Tensor:
    """Gymnasium actions (NumPy / lists) as the tensor the batched env takes."""
    space = env.action_space
    dtype = torch.int64 if isinstance(space, gym.spaces.Discrete) else torch.float32
    tensor = torch.as_tensor(np.asarray(actions), dtype=dtype)
    device = getattr(env, "device", None)
    return tensor.to(device) if device is not None else tensor


def _numpy(value: torch.Tensor) -> np.ndarray:
    """An owned NumPy copy of a tensor (never a view of the env's state)."""
    return value.detach().cpu().numpy().copy()


class RaysimVectorEnv(VectorEnv):
    """A Gymnasium ``VectorEnv`` (SAME_STEP autoreset) over ``num_envs`` rows of a native raysim task."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, task: str, num_envs: int = 1, seed: int | None = None, **options: Any):
        from raysim.envs.registry import make

        self.task = task
        self.env = make(task, num_envs, seed=seed, **options)
        self.num_envs = self.env.num_envs
        self.single_observation_space = self.env.observation_spaces[GROUP]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.single_action_space = self.env.action_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = None
        self._np_random, self._np_random_seed = seeding.np_random(seed)

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """Start new episodes: all rows, or with ``options={"reset_mask": mask}`` only the masked ones.

        ``seed``: an int (the whole batch reproducibly, as ``raysim.envs.make(task, N, seed=seed)``),
        a list of ``num_envs`` ints (each row from its own seed) or None (continue the generator).
        """
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise ValueError(f"{self.task}: unknown reset options {sorted(options)} (only 'reset_mask')")
        if isinstance(seed, (int, np.integer)):
            self._np_random, self._np_random_seed = seeding.np_random(int(seed))
        if mask is None and (seed is None or isinstance(seed, (int, np.integer))):
            obs = self.env.reset(None if seed is None else int(seed))
            return _numpy(obs[GROUP]), {}
        # per-row seeds (a list) and/or a subset of rows
        rows = np.arange(self.num_envs) if mask is None else np.flatnonzero(np.asarray(mask, dtype=bool))
        if mask is not None and np.asarray(mask).shape != (self.num_envs,):
            raise ValueError(f"{self.task}: reset_mask must have shape ({self.num_envs},)")
        if isinstance(seed, (list, tuple, np.ndarray)):
            if len(seed) != self.num_envs:
                raise ValueError(f"{self.task}: {len(seed)} seeds for {self.num_envs} envs")
            per_row = [seed[i] for i in rows]
        else:
            per_row = [None] * len(rows)
        seeds = [int(s) if s is not None else int(self._np_random.integers(2**31)) for s in per_row]
        obs = self.env.reset_rows(torch.as_tensor(rows, dtype=torch.int64), seeds)
        return _numpy(obs[GROUP]), {}

    def step(self, actions: Any):
        step = self.env.step(_actions_tensor(self.env, actions))
        obs = _numpy(step.obs[GROUP])
        reward = step.reward.detach().cpu().numpy().astype(np.float64)
        terminated = _numpy(step.terminated).astype(bool)
        truncated = _numpy(step.truncated).astype(bool)
        info: dict[str, Any] = {}
        done_rows = step.done_rows.cpu().numpy()
        if done_rows.size:
            mask = np.zeros(self.num_envs, dtype=bool)
            mask[done_rows] = True
            final_obs = np.full(self.num_envs, None, dtype=object)
            finals = _numpy(step.final_obs[GROUP])
            for i, row in enumerate(done_rows):
                final_obs[row] = finals[i]
            final_info: dict[str, Any] = {}
            for key, column in step.episodes.items():
                values = _numpy(column)
                array = np.zeros((self.num_envs, *values.shape[1:]), dtype=values.dtype)
                array[done_rows] = values
                final_info[key], final_info[f"_{key}"] = array, mask.copy()
            if "return" in step.episodes and "length" in step.episodes:
                final_info["episode"] = {
                    "r": final_info["return"].astype(np.float64),
                    "_r": mask.copy(),
                    "l": final_info["length"].astype(np.int64),
                    "_l": mask.copy(),
                }
                final_info["_episode"] = mask.copy()
            info = {
                "final_obs": final_obs,
                "_final_obs": mask.copy(),
                "final_info": final_info,
                "_final_info": mask.copy(),
            }
        return obs, reward, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


class RaysimEnv(gym.Env):
    """A single Gymnasium env: one row of a native raysim task (``gymnasium.make("raysim/CartPole-v0")``).

    The row's step limit truncates (``truncated=True``); after ``terminated`` or ``truncated``,
    call ``reset`` as with any Gymnasium env. The observation returned by the finishing step is
    the episode's last one.
    """

    metadata = {"render_modes": []}

    def __init__(self, task: str, seed: int | None = None, **options: Any):
        from raysim.envs.registry import make

        self.task = task
        self.env = make(task, 1, seed=seed, **options)
        self.observation_space = self.env.observation_spaces[GROUP]
        self.action_space = self.env.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is None:  # continue from the env's generator; first draw one from np_random for reproducibility
            seed = int(self.np_random.integers(2**31))
        obs = self.env.reset(int(seed))
        return _numpy(obs[GROUP])[0], {}

    def step(self, action: Any):
        step = self.env.step(_actions_tensor(self.env, np.asarray(action)[None]))
        done = bool(step.done_rows.numel())
        obs = step.final_obs[GROUP] if done else step.obs[GROUP]
        info = {key: _numpy(value)[0].item() for key, value in step.episodes.items()} if done else {}
        if done:
            info["episode"] = {"r": info["return"], "l": info["length"]}
        return (_numpy(obs)[0], float(step.reward[0]), bool(step.terminated[0]), bool(step.truncated[0]), info)

    def close(self) -> None:
        self.env.close()


def register_gymnasium(tasks: Sequence[str]) -> None:
    """Register ``raysim/<Name>-v0`` with Gymnasium for each native task (idempotent)."""
    for task in tasks:
        name = gym_id(task)
        if name in gym.registry:
            continue
        gym.register(
            id=name,
            entry_point="raysim.envs.gym_vector:RaysimEnv",
            vector_entry_point="raysim.envs.gym_vector:RaysimVectorEnv",
            kwargs={"task": task},
            disable_env_checker=False,
        )
