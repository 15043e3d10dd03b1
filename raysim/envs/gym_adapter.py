"""The one way Gymnasium environments enter raysim: ``gym:<ID>`` as a batched env.

Gymnasium vector envs reset finished sub-envs in one of three autoreset modes; the adapter turns
each into raysim's same-step contract:

- ``SAME_STEP``: the vector env resets inside ``step`` and puts the pre-reset observation in
  ``info["final_obs"]``; the adapter copies those rows out.
- ``NEXT_STEP`` and ``DISABLED``: the observation returned for a finished row *is* its final
  observation; the adapter copies it, then resets just those rows at once with
  ``reset(options={"reset_mask": done})``. The vector env's own reset transition (action ignored,
  reward 0) therefore never happens. All three modes give the same rows for the same seeds.
- A native vector env in ``NEXT_STEP`` mode whose ``reset`` cannot reset a subset of rows
  (``reset_mask``; Gymnasium's ``CartPoleVectorEnv`` is one) is stepped through its own reset
  transition: that transition is reported with ``Step.valid`` False for the row and is never
  trained on. Until then the row's ``obs`` is its final observation; its next trajectory starts
  at the reset transition's observation (``Step.start_rows``: a recurrent state and a frame stack
  restart there, not at the final observation). It cannot start one row from a seed
  (``resets_rows`` False), so its evaluation episodes are keyed by row and depend on the layout
  (``raysim.rollout.endings.EvalEnding``).

Observations: a ``Box`` space becomes the ``policy`` group; a ``Dict`` of ``Box`` spaces maps each
key to a group of the same name (the model config names the groups its networks read). An image
group (``raysim.envs.spaces``: a uint8 ``Box`` of three dimensions) stays uint8; every other group
becomes float32. Episode reports carry ``return``, ``length`` and, where the env's info has
``is_success`` or ``success``, ``success``: its value at the episode's last step, or under ``env.success: any``
whether it was set at any step (the adapter reads every step's info; ``count_success``).

Pictures (``frames``, for videos) are the sub-envs' own ``render()`` in ``render_mode="rgb_array"``,
which a filmed evaluation sets (``with_pictures``); ``render_mode`` does not change what the env is
(it is left out of the env identity, as ``vectorize`` is, except ``native``: ``raysim.identity``).

Ids of a namespace another package registers (``ALE/...``: ``ale_py``) are registered by importing
it, and so are ale-py's ids without a namespace (``BreakoutNoFrameskip-v4``); a package that is not
installed (that one, or one Gymnasium reports with ``DependencyNotInstalled``) is a
``MissingDependencyError`` that says what to install (raysim's extra where it has one).

An Atari id with the ``atari`` option (the standard preprocessing preset) is built by
``raysim.envs.atari`` on ale-py's own vector env instead (``make_gym`` decides).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from raysim.envs.contract import BatchedEnv, Obs, Step, check_actions, check_num_envs
from raysim.envs.errors import CannotRender, MissingDependencyError, UnknownEnvError
from raysim.envs.spaces import group_dtype

VECTORIZE = ("sync", "async", "native")
#: Namespaces whose ids another package registers when it is imported: namespace -> (module, what to install).
NAMESPACE_PACKAGES = {"ALE": ("ale_py", "raysim[atari]")}
#: Gymnasium extras that raysim has an extra for, of the same name (``raysim[mujoco]`` installs ``gymnasium[mujoco]``).
RAYSIM_EXTRAS = ("mujoco", "atari")
#: The adapter's own options: how it runs the env, not what the env is (left out of the env identity but
#: ``vectorize: native``, whose rows see the vector env's own resets).
RUNTIME_OPTIONS = ("vectorize", "autoreset_mode", "render_mode")


def make_gym(gym_id: str, num_envs: int, seed: int | None, evaluation: bool, **options: Any) -> BatchedEnv:
    """``gym:<gym_id>``: the Atari preset (``raysim.envs.atari``) when ``options`` name it, else the adapter."""
    if "atari" in options:
        from raysim.envs.atari import AtariEnv

        return AtariEnv(gym_id, num_envs, seed=seed, evaluation=evaluation, **options)
    return GymAdapter(gym_id, num_envs, seed=seed, **options)


class GymAdapter(BatchedEnv):
    """``gym:<ID>``: any registered Gymnasium id, vectorized (``sync``/``async``) or ``native``."""

    def __init__(
        self,
        gym_id: str,
        num_envs: int,
        seed: int | None = None,
        vectorize: str = "sync",
        autoreset_mode: str | None = None,
        **env_kwargs: Any,
    ):
        self.env_id = f"gym:{gym_id}"
        self.num_envs = check_num_envs(num_envs)
        if vectorize not in VECTORIZE:
            raise ValueError(f"{self.env_id}: vectorize must be one of {VECTORIZE}, got {vectorize!r}")
        gym_id = registered_id(gym_id)
        if gym_id not in gym.registry:
            close = [k for k in gym.registry if gym_id.lower().split("-")[0] in k.lower()][:5]
            raise UnknownEnvError(f"unknown Gymnasium id {gym_id!r}" + (f"; similar ids: {close}" if close else ""))
        mode = {"sync": "sync", "async": "async", "native": "vector_entry_point"}[vectorize]
        vector_kwargs = {}
        if autoreset_mode is not None:
            if vectorize == "native":
                raise ValueError(f"{self.env_id}: a native vector env has its own autoreset mode; drop autoreset_mode")
            vector_kwargs["autoreset_mode"] = AutoresetMode(autoreset_mode)
        try:
            self.vec = gym.make_vec(
                gym_id, num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs, **env_kwargs
            )
        except gym.error.DependencyNotInstalled as error:  # Gymnasium's words on what to install
            raise MissingDependencyError(f"{self.env_id}: {raysim_extra(str(error).strip())}") from error
        self.mode = AutoresetMode(self.vec.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self.masked_reset = vectorize != "native"  # Sync/AsyncVectorEnv honour reset_mask
        self.resets_rows = self.masked_reset
        # a native NEXT_STEP env resets a finished row in its next step (a reset transition, dropped)
        self.resets_next_step = not self.masked_reset and self.mode == AutoresetMode.NEXT_STEP
        if not self.masked_reset and self.mode == AutoresetMode.DISABLED:
            raise ValueError(f"{self.env_id}: a native vector env with autoreset DISABLED is not supported")
        self.action_space = self.vec.single_action_space
        self.observation_spaces = _observation_groups(self.env_id, self.vec.single_observation_space)
        self._dtypes = {k: group_dtype(space) for k, space in self.observation_spaces.items()}
        spec = gym.spec(gym_id)
        self.max_episode_steps = env_kwargs.get("max_episode_steps", spec.max_episode_steps)
        self.episode_return = np.zeros(self.num_envs, dtype=np.float32)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self._pending_reset = np.zeros(self.num_envs, dtype=bool)
        self._succeeded = np.zeros(self.num_envs, dtype=bool)  # success set at some step of the running episode
        self._seed = seed
        self._obs: Obs = {}
        self.reset(seed)

    def reset(self, seed: int | None = None) -> Obs:
        obs, _ = self.vec.reset(seed=seed)
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0
        self._pending_reset[:] = False
        self._succeeded[:] = False
        self._obs = self._to_groups(obs)
        return self._obs

    def reset_rows(self, rows: torch.Tensor, seeds: Sequence[int]) -> Obs:
        if not self.masked_reset:
            raise ValueError(f"{self.env_id}: a native vector env cannot reset single rows with seeds")
        rows_np = np.asarray(torch.as_tensor(rows).reshape(-1).tolist(), dtype=np.int64)
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[rows_np] = True
        per_row: list[int | None] = [None] * self.num_envs
        for row, seed in zip(rows_np.tolist(), seeds, strict=True):
            per_row[row] = int(seed)
        obs, _ = self.vec.reset(seed=per_row, options={"reset_mask": mask})
        self.episode_return[mask] = 0.0
        self.episode_length[mask] = 0
        self._succeeded[mask] = False
        self._obs = self._to_groups(obs)
        return self._obs

    def step(self, actions: torch.Tensor) -> Step:
        check_actions(self, actions)
        obs, reward, terminated, truncated, info = self.vec.step(actions.cpu().numpy())
        reward = np.asarray(reward, dtype=np.float32)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        valid = ~self._pending_reset
        if not valid.all():  # the reset transition of a native NEXT_STEP env: drop it
            reward, terminated, truncated = reward * valid, terminated & valid, truncated & valid
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += valid
        done_rows = np.flatnonzero(done)
        if self.success_count == "any":  # a SAME_STEP env's done rows show their next episode's info: not theirs
            theirs = valid & ~done if self.mode == AutoresetMode.SAME_STEP else valid
            self._succeeded |= _success_flags(info, self.num_envs) & theirs
        final_obs: Obs = {}
        episodes: dict[str, torch.Tensor] = {}
        if done_rows.size:
            if self.mode == AutoresetMode.SAME_STEP:
                final = _stack([info["final_obs"][i] for i in done_rows])
                # Gymnasium batches the finished rows' infos into one dict of arrays (``_key`` masks)
                final_info = [_row_info(info.get("final_info", {}), i) for i in done_rows]
            else:
                final = _take(obs, done_rows)
                final_info = [_row_info(info, i) for i in done_rows]
            final_obs = self._to_groups(final)
            episodes = {
                "return": torch.from_numpy(self.episode_return[done_rows].copy()),
                "length": torch.from_numpy(self.episode_length[done_rows].copy()),
            }
            success = [_success(i) for i in final_info]
            if all(s is not None for s in success):
                if self.success_count == "any":
                    success = [s or bool(self._succeeded[i]) for s, i in zip(success, done_rows, strict=True)]
                episodes["success"] = torch.tensor(success, dtype=torch.bool)
            self._succeeded[done_rows] = False
            self.episode_return[done_rows] = 0.0
            self.episode_length[done_rows] = 0
            if self.mode != AutoresetMode.SAME_STEP and self.masked_reset:
                obs, _ = self.vec.reset(options={"reset_mask": done.copy()})
        # A native NEXT_STEP env resets these rows in its next step: that transition is dropped.
        self._pending_reset = done & self.resets_next_step
        self._obs = self._to_groups(obs)
        return Step(
            obs=self._obs,
            reward=torch.from_numpy(reward),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            done_rows=torch.from_numpy(done_rows.astype(np.int64)),
            final_obs=final_obs,
            episodes=episodes,
            valid=None if valid.all() else torch.from_numpy(valid.copy()),
            # the rows reset in this step start here, the rows that finished in it one step later
            start_rows=torch.from_numpy(np.flatnonzero(~valid)) if self.resets_next_step else None,
        )

    def frames(self, size: int) -> torch.Tensor:
        """The sub-envs' own pictures (made with ``render_mode="rgb_array"``), ``[N, H, W, 3]`` uint8 at the
        env's size (``size`` does not apply); every vector mode's ``render`` gives one picture per sub-env."""
        mode = getattr(self.vec, "render_mode", None)
        if mode != "rgb_array":
            raise CannotRender(f"{self.env_id} was made with render_mode={mode!r}: its pictures need 'rgb_array'")
        try:
            pictures = self.vec.render()
        except gym.error.DependencyNotInstalled as error:
            raise CannotRender(f"{self.env_id}: {raysim_extra(str(error).strip())}") from error
        if pictures is None or len(pictures) != self.num_envs:
            raise CannotRender(f"{self.env_id}: render() gave no picture per sub-env (got {type(pictures).__name__})")
        return torch.from_numpy(np.stack([np.asarray(p, dtype=np.uint8)[..., :3] for p in pictures]))

    def close(self) -> None:
        self.vec.close()

    def _to_groups(self, obs: Any) -> Obs:
        """Owned tensors, one per observation group: uint8 for an image group, float32 for a vector one."""
        if not isinstance(obs, dict):
            obs = {"policy": obs}
        return {k: torch.tensor(np.asarray(obs[k]), dtype=self._dtypes[k]) for k in self.observation_spaces}


def with_pictures(env_id: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of ``env_id`` for an env that draws its rows (a filmed evaluation): a Gymnasium id renders
    ``rgb_array`` unless its ``render_mode`` says otherwise; a native task draws without an option."""
    if env_id.startswith("gym:") and options.get("render_mode") is None:
        return {**options, "render_mode": "rgb_array"}
    return options


def registered_id(gym_id: str) -> str:
    """Import the package that registers ``gym_id`` and return the id as registered.

    ``module:Id`` (Gymnasium's own form, for an id your module registers): ``module`` is imported, in every
    process that makes the env, and ``Id`` returned. ``ALE/...`` ids (and an unregistered id without a namespace
    when ale-py is installed) import ``ale_py``; a ``MissingDependencyError`` says what to install when the
    package is not installed. Meta-World's ids are refused: raysim runs it natively (``raysim/MetaWorld``)."""
    if ":" in gym_id:
        module, _, gym_id = gym_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UnknownEnvError(
                f"gym:{module}:{gym_id}: cannot import {module!r}, the module that registers {gym_id!r} ({error}); "
                "run from the folder that holds it, or put it on PYTHONPATH"
            ) from error
    namespace = gym_id.split("/")[0] if "/" in gym_id else None
    if namespace == "Meta-World":
        raise UnknownEnvError(
            f"gym:{gym_id}: Meta-World's Gymnasium envs ignore reset seeds; use env.id raysim/MetaWorld "
            "(env.kwargs: benchmark MT1 / MT10 / MT50, tasks, goals; needs raysim[metaworld])"
        )
    if namespace is None and gym_id not in gym.registry and _installed("ale_py"):
        namespace = "ALE"  # ale-py also registers ids without a namespace (BreakoutNoFrameskip-v4)
    if namespace not in NAMESPACE_PACKAGES:
        return gym_id
    module, install = NAMESPACE_PACKAGES[namespace]
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise MissingDependencyError(
            f'gym:{gym_id} needs {module}, which is not installed: pip install "{install}"'
        ) from error
    return gym_id


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, and not marked missing in ``sys.modules``)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def raysim_extra(message: str) -> str:
    """Gymnasium's "not installed" message, naming raysim's extra where raysim has one of that name."""
    return re.sub(r"gymnasium\[(\w+)\]", lambda m: f"raysim[{m[1]}]" if m[1] in RAYSIM_EXTRAS else m[0], message)


def _observation_groups(env_id: str, space: gym.Space) -> dict[str, gym.Space]:
    if isinstance(space, gym.spaces.Box):
        return {"policy": space}
    if isinstance(space, gym.spaces.Dict) and all(isinstance(s, gym.spaces.Box) for s in space.spaces.values()):
        return dict(space.spaces)
    raise ValueError(
        f"{env_id}: observation space {space} is not supported; use a Box, or a Dict of Boxes (its keys are the "
        "groups model.actor_inputs and model.critic_inputs name; wrap the env with "
        "gymnasium.wrappers.FlattenObservation for other spaces)"
    )


def _take(obs: Any, rows: np.ndarray) -> Any:
    """Copies of ``rows`` of a batched observation (array or dict of arrays)."""
    if isinstance(obs, dict):
        return {k: np.asarray(v)[rows] for k, v in obs.items()}
    return np.asarray(obs)[rows]


def _stack(per_row: list) -> Any:
    """One batched observation from a list of single-row observations."""
    if isinstance(per_row[0], dict):
        return {k: np.stack([o[k] for o in per_row]) for k in per_row[0]}
    return np.stack(per_row)


def _row_info(info: dict, row: int) -> dict:
    """Row ``row`` of a vector env's info (arrays with ``_key`` masks; nested dicts likewise)."""
    return {
        k: _row_info(v, row) if isinstance(v, dict) else v[row]
        for k, v in info.items()
        if not k.startswith("_") and info.get(f"_{k}", np.ones(row + 1, bool))[row]
    }


def _success_flags(info: dict, num_envs: int) -> np.ndarray:
    """Every row's success flag in a vector env's step ``info`` (``is_success`` or ``success``; False where a
    row has none)."""
    for key in ("is_success", "success"):
        if key in info:
            present = np.asarray(info.get(f"_{key}", np.ones(num_envs, bool)), dtype=bool)
            return np.asarray(info[key]).astype(bool).reshape(num_envs) & present
    return np.zeros(num_envs, dtype=bool)


def _success(info: dict | None) -> bool | None:
    if not info:
        return None
    for key in ("is_success", "success"):
        if key in info:
            return bool(info[key])
    return None
