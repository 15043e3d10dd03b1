"""A checkpoint's meta.json is plain JSON: an enum is written by its name, anything else is refused before training."""

from __future__ import annotations

import enum
import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import raysim
from raysim.checkpoint import CheckpointError, Checkpoints, meta_json
from raysim.cli import main
from raysim.identity import checkpoint_identity, env_identity
from raysim.storage import open_storage

TINY = ["backend=local", "env.num_envs=2", "algo.num_steps=16", "algo.num_minibatches=2", "algo.update_epochs=1",
        "train.total_steps=64", "eval.episodes=2", "eval.num_envs=2"]  # fmt: skip


class Flagged(gym.Env):
    """A Gymnasium env whose constructor default is an enum (as Meta-World's registrations carry AutoresetMode)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, mode: AutoresetMode = AutoresetMode.NEXT_STEP, other: object = None):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 5, False, {}


gym.register("RaysimTest/Flagged-v0", entry_point=Flagged, max_episode_steps=20)


def test_an_env_whose_options_hold_an_enum_saves_and_resumes_with_the_enum_by_name(tmp_path):
    run_dir = tmp_path / "run"
    assert main(["train", *sum((["--set", o] for o in [*TINY, "env.id=gym:RaysimTest/Flagged-v0"]), []),
                 "--run-dir", str(run_dir)]) == 0  # fmt: skip
    checkpoints = Checkpoints(open_storage(run_dir))
    checkpoint, _, meta = checkpoints.newest_intact(announce=False)
    assert meta["canonical_env"]["kwargs"]["mode"] == "NEXT_STEP"
    identity, _ = env_identity({"id": "gym:RaysimTest/Flagged-v0", "kwargs": {}})
    assert checkpoint_identity(meta)[0] == identity  # a resume finds the same env
    assert main(["resume", str(run_dir), "--set", "train.total_steps=96"]) == 0


def test_meta_json_writes_an_enum_by_its_name_and_refuses_other_objects_naming_the_key():
    class Colour(enum.Enum):
        RED = 1

    assert json.loads(meta_json({"a": {"b": [Colour.RED, (1, 2.5)]}})) == {"a": {"b": ["RED", [1, 2.5]]}}
    with pytest.raises(CheckpointError, match=r"meta\.canonical_env\.kwargs\.other holds a object"):
        meta_json({"canonical_env": {"kwargs": {"other": object()}}})


def test_a_meta_that_cannot_be_written_fails_before_the_first_iteration(tmp_path, capsys):
    gym.register("RaysimTest/Unwritable-v0", entry_point=Flagged, max_episode_steps=20, kwargs={"other": object()})
    config = raysim.load_config(None, [*TINY, "env.id=gym:RaysimTest/Unwritable-v0", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(CheckpointError, match=r"kwargs\.other holds a object"):
        raysim.Trainer(config)
    assert not (tmp_path / "run" / "checkpoints").exists()
