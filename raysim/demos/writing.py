"""Writing recorded episodes as a Minari dataset (HDF5, images stored raw): ``raysim demos record``'s last step.

The episodes come from the evaluation path (``EvalEpisodes.trajectories``: each counted episode's record carries
its steps); one ``minari.EpisodeBuffer`` is built from each, and ``minari.create_dataset_from_buffers`` writes
them, under ``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``) as ``<id>/data``. Minari's
``DataCollector`` wraps one ``gym.Env``, raysim's rows are batched: hence the buffers.

- observations: a ``Dict`` of the env's groups as raysim's tensors are (float32 vectors, uint8 images), each as
  the env gave it (before the frame stack), ``[L+1, ...]`` per episode; ``jpeg_encoding=False`` keeps images
  bitwise (Minari's default would store channels-last uint8 images of 32 px and more as lossy JPEG);
- actions: the policy's output (``EvalPolicy.act``): a scripted policy's is the action the env receives (Meta-World's
  expert clipped into [-1, 1]), in the env's action space; a learned actor's is its Gaussian mean or sample before
  the clip or squash into the action space (the metadata's ``action_transform`` names it; behaviour cloning fits
  it as it is, or maps an env action back through the transform), so its space is then an unbounded Box;
- each episode's reset seed (Minari's ``seed``) and, in its metadata, the evaluation episode index, its task,
  return, length and success (``success`` is an episode's: the env reports it per episode, not per step);
- the dataset's metadata ``raysim``: the env (id, identity, canonical config), the policy and the seeds;
- Minari's ``env_spec``: the Gymnasium spec of the env where it has one (``gymnasium_spec``; Meta-World's own
  ``Meta-World/MT1`` env of the task, ``raysim/CartPole-v0``, ``raysim/Reach-v0``, a ``gym:`` id's), so
  ``minari.load_dataset(id).recover_environment()`` returns an env that resets and steps; None otherwise.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from raysim.demos.dataset import METADATA_KEY, DatasetError, require_minari
from raysim.envs.spaces import is_image_space

DATA_FORMAT = "hdf5"  # per-episode metadata, and read back whatever the infos' shapes (Arrow is not)


def check_new_dataset(dataset_id: str) -> Path:
    """Where ``dataset_id`` will be written; a ``DatasetError`` for an id Minari refuses or one already taken."""
    require_minari()
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage import get_dataset_path

    try:
        parse_dataset_id(dataset_id)
    except ValueError:
        raise DatasetError(
            f"--dataset-id {dataset_id!r}: a Minari id is (namespace/)name-v<version>, e.g. raysim/pick-place-expert-v0"
        ) from None
    path = Path(get_dataset_path(dataset_id))
    if path.exists():
        raise DatasetError(
            f"--dataset-id {dataset_id}: a dataset already exists at {path} (Minari never overwrites): "
            "choose another id or version"
        )
    return path


def dataset_spaces(
    observation_spaces: dict[str, gym.Space], action_space: gym.Space, learned: bool
) -> tuple[gym.spaces.Dict, gym.Space]:
    """The dataset's observation space (a ``Dict`` of the env's groups as raysim's tensors are) and action space
    (the env's; a learned actor's output: an unbounded float32 Box of its shape)."""
    groups = {}
    for group, space in observation_spaces.items():
        dtype = np.uint8 if is_image_space(space) else np.float32  # ``group_dtype``'s, in NumPy
        groups[group] = gym.spaces.Box(np.asarray(space.low, dtype), np.asarray(space.high, dtype), space.shape, dtype)
    if isinstance(action_space, gym.spaces.Box):
        low, high = (-np.inf, np.inf) if learned else (action_space.low, action_space.high)
        action_space = gym.spaces.Box(
            np.broadcast_to(np.asarray(low, np.float32), action_space.shape),
            np.broadcast_to(np.asarray(high, np.float32), action_space.shape),
            action_space.shape,
            np.float32,
        )
    return gym.spaces.Dict(groups), action_space


def episode_buffer(record: dict) -> Any:
    """The ``minari.EpisodeBuffer`` of one counted episode's record (its ``trajectory``)."""
    from minari.data_collector import EpisodeBuffer

    steps = record["trajectory"]
    return EpisodeBuffer(
        seed=record["seed"],
        observations=dict(steps["obs"]),
        actions=steps["actions"],
        rewards=steps["reward"],
        terminations=steps["terminated"],
        truncations=steps["truncated"],
    )


def episode_metadata(record: dict, task_names: tuple[str, ...]) -> dict[str, Any]:
    """What an episode's metadata holds besides its seed: its evaluation index, task, return, length, success."""
    metadata = {"episode": int(record["episode"]), "return": float(record["return"]), "length": int(record["length"])}
    if task_names:  # episode j plays task j mod K
        metadata["task"] = record.get("task", task_names[int(record["episode"]) % len(task_names)])
    if "success" in record:
        metadata["success"] = bool(record["success"])
    return metadata


def write_dataset(
    dataset_id: str,
    records: list[dict],
    spaces: tuple[gym.spaces.Dict, gym.Space],
    task_names: tuple[str, ...],
    metadata: dict[str, Any],
    env_spec: EnvSpec | None = None,
) -> Path:
    """Write the counted episodes' ``records`` (in their order) as the Minari dataset ``dataset_id``; its directory.
    ``env_spec``: the Gymnasium spec ``recover_environment`` makes (None: the dataset cannot recover its env)."""
    minari = require_minari()
    observation_space, action_space = spaces
    with warnings.catch_warnings():  # Minari's advice to name an author, a code link, an evaluation env
        warnings.simplefilter("ignore", UserWarning)
        dataset = minari.create_dataset_from_buffers(
            dataset_id,
            [episode_buffer(record) for record in records],
            env=env_spec,
            observation_space=observation_space,
            action_space=action_space,
            algorithm_name=f"raysim {metadata['policy']}",
            description=f"{metadata['policy']} in {metadata['env_id']}, recorded by raysim demos record",
            data_format=DATA_FORMAT,
            jpeg_encoding=False,
        )
    dataset.storage.update_metadata({METADATA_KEY: metadata})
    dataset.storage.update_episode_metadata([episode_metadata(record, task_names) for record in records])
    return dataset.storage.data_path.parent
