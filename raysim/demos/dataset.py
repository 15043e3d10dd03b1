"""Reading a Minari dataset of demonstrations into ``Demonstrations``, after checking that it fits the env.

The driver reads it (the learner never reads files): ``load_demonstrations(dataset, observation_spaces,
action_space, frame_stack)``. ``dataset`` is a directory (a Minari dataset's, or its ``data`` folder) when one
exists at that path; otherwise a Minari dataset id under ``MINARI_DATASETS_PATH`` (default
``~/.minari/datasets``), as ``minari.load_dataset`` finds it. On a cluster only the driver's machine needs it.

Every problem is a ``DatasetError`` of one line (a ``ConfigError``: ``raysim`` prints it, exit code 2) said before
any episode is read: Minari not installed, no such dataset, an empty one, an observation group or the actions
missing, a group or the actions whose shape or dtype do not fit the env, a learned actor's actions recorded before
another ``model.action_transform`` than the model's.

Continuous actions are read as the policy samples them, before ``model.action_transform``: a learned actor's
of the model's transform as they are; actions the env received (a scripted expert's: the metadata's
``action_transform`` is null; a dataset made elsewhere) mapped back through the transform
(``raysim.models.sampling.from_action_space``: clipped into the bounds; for ``squash``, the atanh of the action
rescaled from the bounds into [-1, 1]), so the policy executes the demonstrated action, not tanh of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from raysim.composition import ConfigError
from raysim.demos.demonstrations import Demonstrations, stack_episode
from raysim.envs.frame_stack import FrameStackConfig, stack_axis, stacked_space
from raysim.envs.spaces import group_dtype, is_image_space
from raysim.models.sampling import ActionSampling

METADATA_KEY = "raysim"  # the dataset's metadata that ``raysim demos record`` writes (env, identity, policy, seed)


class DatasetError(ConfigError):
    """A dataset of demonstrations that cannot be used here: what is wrong with it, in one line."""


def require_minari() -> Any:
    """The ``minari`` module, with the HDF5 storage it reads and writes (``raysim[demos]``)."""
    try:
        import h5py  # noqa: F401 - Minari's HDF5 format needs it
        import minari
    except ImportError:
        raise DatasetError(
            'datasets of demonstrations need Minari with HDF5, which is not installed: pip install "raysim[demos]"'
        ) from None
    root = os.environ.get("MINARI_DATASETS_PATH")
    if root and not os.path.isabs(root):  # Minari joins a relative root to its own paths twice: resolve it once
        os.environ["MINARI_DATASETS_PATH"] = os.path.abspath(os.path.expanduser(root))
    return minari


def locate_dataset(dataset: str) -> Path:
    """The ``data`` folder of ``dataset``: a directory at that path wins, else a Minari id under its datasets root."""
    from minari.storage import get_dataset_path

    path = Path(dataset).expanduser()
    if path.is_dir():
        for data in (path / "data", path):
            if (data / "metadata.json").is_file():
                return data
        raise DatasetError(f"dataset {dataset}: the directory holds no Minari dataset (no data/metadata.json)")
    data = Path(get_dataset_path(dataset)) / "data"
    if (data / "metadata.json").is_file():
        return data
    raise DatasetError(
        f"dataset {dataset!r} not found: no directory {path.resolve()}, and no Minari dataset {dataset} under "
        f"{Path(get_dataset_path()).resolve()} (MINARI_DATASETS_PATH, default ~/.minari/datasets)"
    )


def open_dataset(dataset: str) -> Any:
    """The ``minari.MinariDataset`` of ``dataset`` (see ``locate_dataset``), refused when it holds no episode."""
    minari = require_minari()
    path = locate_dataset(dataset)
    try:
        opened = minari.MinariDataset(path)
    except Exception as error:  # noqa: BLE001 - Minari's own errors (a damaged file, an unknown format) in one line
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DatasetError(f"dataset {dataset}: not a readable Minari dataset ({path}): {first}") from error
    if opened.total_episodes == 0:
        raise DatasetError(f"dataset {dataset} is empty: it holds no episode ({path})")
    return opened


def dataset_info(dataset: str) -> dict[str, Any]:
    """What a dataset holds, without reading its episodes: where it is, episodes, steps, spaces, raysim's metadata."""
    opened = open_dataset(dataset)
    metadata = opened.storage.metadata
    return {
        "path": str(opened.storage.data_path.parent),
        "episodes": opened.total_episodes,
        "steps": opened.total_steps,
        "observation_space": opened.observation_space,
        "action_space": opened.action_space,
        METADATA_KEY: metadata.get(METADATA_KEY, {}),
    }


def load_demonstrations(
    dataset: str,
    observation_spaces: dict[str, gym.Space],
    action_space: gym.Space,
    frame_stack: FrameStackConfig | dict | None = None,
    action_transform: str = "clip",
    transitions: bool = False,
) -> Demonstrations:
    """Every step of ``dataset`` as the policy sees it (``Demonstrations``), checked against the env first.

    ``observation_spaces`` and ``action_space``: the env's as the policy sees them (``EnvShard.spaces``, after the
    frame stack); ``frame_stack`` (``env.frame_stack``): rebuilt per episode from the dataset's observations, which
    are the env's own; ``action_transform`` (``model.action_transform``): the actions become what the policy
    samples (``fitting_transform``); ``transitions``: each step's next observation, reward and termination too
    (an off-policy algorithm's demonstrations: RLPD). A ``DatasetError`` in one line for a dataset that is missing,
    empty or does not fit.
    """
    frame_stack = frame_stack if isinstance(frame_stack, FrameStackConfig) else FrameStackConfig(**(frame_stack or {}))
    opened = open_dataset(dataset)
    stacked = set(frame_stack.groups) if frame_stack.k > 1 else set()
    groups = fitting_groups(dataset, opened.observation_space, observation_spaces, frame_stack.k, stacked)
    action_dtype = fitting_actions(dataset, opened.action_space, action_space)
    metadata = json.loads(json.dumps(opened.storage.metadata.get(METADATA_KEY, {})))  # plain data, owned
    sampling = ActionSampling(action_space, action_transform)
    recorded_before = fitting_transform(dataset, metadata, sampling, action_transform)
    obs: dict[str, list[torch.Tensor]] = {g: [] for g in groups}
    next_obs: dict[str, list[torch.Tensor]] = {g: [] for g in groups}
    actions, episode, reward, terminated = [], [], [], []
    for number, data in enumerate(opened.iterate_episodes()):
        steps = len(data.rewards)
        for group, key in groups.items():
            frames = episode_frames(dataset, data, key, group, observation_spaces[group])
            if group in stacked:
                frames = stack_episode(frames, frame_stack.k, stack_axis(opened_space(opened, key)))
            obs[group].append(frames[:steps])
            if transitions:
                next_obs[group].append(frames[1:])
        acted = torch.from_numpy(np.asarray(data.actions)).to(action_dtype)
        if acted.shape[0] != steps:
            raise DatasetError(f"dataset {dataset}: episode {data.id} has {steps} steps and {acted.shape[0]} actions")
        actions.append(acted)
        episode.append(torch.full((steps,), number, dtype=torch.int64))
        reward.append(torch.as_tensor(np.asarray(data.rewards), dtype=torch.float32))
        terminated.append(torch.as_tensor(np.asarray(data.terminations), dtype=torch.bool))
    actions = torch.cat(actions)
    return Demonstrations(
        {g: torch.cat(v) for g, v in obs.items()},
        actions if recorded_before else sampling.policy_action(actions),
        torch.cat(episode),
        opened.total_episodes,
        metadata,
        {g: torch.cat(v) for g, v in next_obs.items()} if transitions else None,
        torch.cat(reward) if transitions else None,
        torch.cat(terminated) if transitions else None,
    )


def episode_frames(dataset: str, data: Any, key: str | None, group: str, space: gym.Space) -> torch.Tensor:
    """One episode's observations of ``group`` (its ``key`` in the dataset), all ``steps + 1`` of them, in the dtype
    the policy reads; a ``DatasetError`` when they are missing or their count is not the steps' plus one."""
    steps = len(data.rewards)
    if key is not None and key not in data.observations:
        raise DatasetError(f"dataset {dataset}: episode {data.id} has no observations of group {key!r}")
    frames = torch.from_numpy(np.asarray(data.observations if key is None else data.observations[key]))
    if frames.shape[0] != steps + 1:
        raise DatasetError(
            f"dataset {dataset}: episode {data.id} has {steps} steps and {frames.shape[0]} observations of "
            f"{group!r} (Minari keeps one more observation than steps)"
        )
    return frames.to(group_dtype(space))


def fitting_transform(dataset: str, metadata: dict[str, Any], sampling: ActionSampling, transform: str) -> bool:
    """Whether the dataset's actions are already what the policy samples: a learned actor's recorded before this
    model's ``action_transform`` (True), or actions the env received (False: a scripted policy's, metadata
    ``action_transform: null``, or a dataset made elsewhere), which ``ActionSampling.policy_action`` maps back. A
    ``DatasetError`` for a learned actor's actions before another transform."""
    recorded = metadata.get("action_transform")
    if sampling.discrete:
        return True
    if recorded is None:
        return False
    if recorded != transform:
        raise DatasetError(
            f"dataset {dataset} holds an actor's actions before its action transform {recorded!r}, and this "
            f"model's model.action_transform is {transform!r}: set model.action_transform: {recorded}, or record "
            "the demonstrations again with an actor of this transform"
        )
    return True


def opened_space(opened: Any, key: str | None) -> gym.Space:
    """The dataset's space of one observation group (``key`` None: its only, a plain Box)."""
    return opened.observation_space if key is None else opened.observation_space[key]


def fitting_groups(
    dataset: str, space: gym.Space, observation_spaces: dict[str, gym.Space], k: int, stacked: set[str]
) -> dict[str, str | None]:
    """Each env group's key in the dataset's observations (None: the dataset's one Box is the env's one group); a
    ``DatasetError`` naming the group for a group missing, or one whose shape or dtype does not fit the env's."""
    if isinstance(space, gym.spaces.Box) and len(observation_spaces) == 1:
        keys = {next(iter(observation_spaces)): None}
    elif isinstance(space, gym.spaces.Dict):
        missing = sorted(set(observation_spaces) - set(space.spaces))
        if missing:
            raise DatasetError(
                f"dataset {dataset} has no observation group {missing[0]!r} of the env (its groups: "
                f"{sorted(space.spaces)}; the env's: {sorted(observation_spaces)})"
            )
        keys = {g: g for g in observation_spaces}
    else:
        raise DatasetError(
            f"dataset {dataset}: its observations are a {type(space).__name__}; raysim reads a Dict of the env's "
            f"groups {sorted(observation_spaces)} (or one Box for an env of one group)"
        )
    for group, key in keys.items():
        have = space if key is None else space.spaces[key]
        want = observation_spaces[group]
        seen = stacked_space(have, k) if group in stacked and isinstance(have, gym.spaces.Box) else have
        image = is_image_space(want)
        dtype_fits = have.dtype == np.uint8 if image else np.issubdtype(have.dtype, np.floating)
        if not isinstance(have, gym.spaces.Box) or seen.shape != want.shape or not dtype_fits:
            stack = f" ({k} stacked: {list(seen.shape)})" if group in stacked else ""
            raise DatasetError(
                f"dataset {dataset}: observation group {group!r} is {describe(have)}{stack} in the dataset and "
                f"{list(want.shape)} {'uint8' if image else 'float'} in the env"
            )
    return keys


def fitting_actions(dataset: str, space: gym.Space, action_space: gym.Space) -> torch.dtype:
    """The dtype the actions are read as (int64 Discrete, float32 Box); a ``DatasetError`` when they do not fit."""
    if isinstance(action_space, gym.spaces.Discrete):
        if isinstance(space, gym.spaces.Discrete) and space.n == action_space.n:
            return torch.int64
    elif isinstance(space, gym.spaces.Box) and space.shape == action_space.shape:
        if np.issubdtype(space.dtype, np.floating):
            return torch.float32
    raise DatasetError(f"dataset {dataset}: its actions are {describe(space)}; the env's are {describe(action_space)}")


def describe(space: gym.Space) -> str:
    """A space in a few words: ``Box [3, 32, 32] uint8``, ``Discrete(2)``."""
    if isinstance(space, gym.spaces.Box):
        return f"Box {list(space.shape)} {space.dtype}"
    return str(space)
