"""Roles and values lost with their node: a shard's state lost before the save, a replacement's generation across
resumes, a role that dies before it starts. In-process (a backend whose values and shards can be lost), and one
small Ray test for the roles that die while starting."""

from __future__ import annotations

import os

import pytest

import raysim
from raysim.actors import LocalBackend, RayBackend, _LocalHandle
from raysim.checkpoint import Checkpoints
from raysim.coordinator import Trainer, faults
from raysim.coordinator.preflight import check_env_and_model
from raysim.coordinator.roles import create_roles, start_shard
from raysim.coordinator.session import end_roles
from raysim.rollout import EnvShard
from raysim.storage import LocalStorage

SMALL = [
    "backend=local",
    "shards.count=2",
    "env.num_envs=2",
    "algo.num_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=4096",
    "train.log_every=1",
    "eval.episodes=0",
    "train.sinks=[]",
    "checkpoint.every=100",
]


class Lost:
    """A value lost with its node: reading it fails."""


class LostError(RuntimeError):
    pass


class _MortalHandle(_LocalHandle):
    """An in-process role that can die: afterwards every call's result is lost."""

    dead = False

    def call(self, method, *args, **kwargs):
        return Lost() if self.dead else super().call(method, *args, **kwargs)

    def call_split(self, method, *args, returns, **kwargs):
        return (Lost(),) * returns if self.dead else super().call_split(method, *args, returns=returns, **kwargs)


class LosingBackend(LocalBackend):
    """``LocalBackend`` with losses, as Ray has them: a ``Lost`` value fails when read (``is_lost``), a killed
    shard's results are lost (``is_actor_failure``). Records every shard's index and seed as it is created."""

    def __init__(self):
        self.created: list[tuple[int, int]] = []

    def create(self, cls, *args, options=None, **kwargs):
        if cls is EnvShard:
            self.created.append((kwargs["shard_index"], kwargs["seed"]))
        return _MortalHandle(cls(*args, **kwargs))

    def get(self, value):
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, Lost) for v in values):
            raise LostError("the object was lost with its node")
        return value

    def is_actor_failure(self, error):
        return isinstance(error, LostError)


@pytest.fixture
def losing_backend(monkeypatch):
    backend = LosingBackend()
    monkeypatch.setattr("raysim.coordinator.trainer.start_backend", lambda *args: (backend, False))
    return backend


def at(phase: str, iteration: int, action):
    """A fault hook: ``action(session)`` once, at ``phase`` of ``iteration``."""

    def hook(name, number, session):
        if (name, number) == (phase, iteration):
            action(session)

    return hook


def lose_state_of_shard_0(session) -> None:
    """Shard 0's state after this iteration's chunk lived on a node that is gone (the shard itself is not)."""
    session.collector.lanes[0].state = Lost()


def test_a_shard_state_lost_with_its_node_before_the_save_is_saved_without_and_continues_with_fresh_episodes(
    tmp_path, capsys, losing_backend
):
    run_dir = tmp_path / "run"
    config = raysim.load_config(None, [*SMALL, "train.stop_after=2", f"run_dir={run_dir}"])
    with faults.registered(at("collect", 2, lose_state_of_shard_0)):
        summary = Trainer(config).train()  # before: RunFailed, "saving iteration 2 failed"
    out = capsys.readouterr().out
    assert summary.iterations == 2 and summary.stopped_by == "stop_after"
    assert "shard 0's state of iteration 2 was lost with its node (LostError): saved without it" in out
    state = Checkpoints(LocalStorage(run_dir)).newest_intact(announce=False)[1]
    assert state["shards"][0] is None and state["shards"][1] is not None
    resumed = Trainer.from_run_dir(run_dir, overrides=["train.stop_after=1"]).train()
    assert resumed.iterations == 3
    assert "fresh episodes (its state was lost with its node)" in capsys.readouterr().out


def kill_shard_0(session) -> None:
    session.roles.shards[0].dead = True


def test_a_replacement_after_a_resume_plays_episodes_no_earlier_replacement_played(tmp_path, capsys, losing_backend):
    run_dir = tmp_path / "run"
    config = raysim.load_config(None, [*SMALL, "train.stop_after=2", f"run_dir={run_dir}"])
    with faults.registered(at("update", 1, kill_shard_0)):
        Trainer(config).train()
    with faults.registered(at("update", 3, kill_shard_0)):
        Trainer.from_run_dir(run_dir, overrides=["train.stop_after=2"]).train()
    assert capsys.readouterr().out.count("fault: shard 0 died during its rollout") == 2
    seeds = [seed for index, seed in losing_backend.created if index == 0]
    assert len(seeds) == 4  # each process: shard 0, then its replacement
    assert seeds[0] == seeds[2]  # the same shard 0 (restored from the checkpoint)...
    assert len({seeds[0], seeds[1], seeds[3]}) == 3  # ...but the second replacement is no replay of the first


@pytest.mark.slow  # Ray actors and a learner start, and two die while starting (~15 s on 2 cores)
def test_a_role_that_dies_before_it_starts_is_replaced_at_the_start_and_as_a_replacement(ray_session, tmp_path, capsys):
    marker = tmp_path / "died"
    config = raysim.load_config(
        None,
        [
            *SMALL,
            "backend=ray",
            "env.id=tests.support.crashing:DiesAtStart",
            f"env.kwargs={{marker: '{marker}', driver_pid: {os.getpid()}}}",
            "resources_timeout=60",
        ],
    )
    backend = RayBackend()
    roles = create_roles(backend, config, 4096, check_env_and_model(config))  # before: ActorDiedError
    replacement = None
    try:
        assert marker.exists(), "no shard died while starting"
        assert "died before it started" in capsys.readouterr().out
        marker.unlink()  # the next shard to start dies too: a replacement placed on a node that is going
        replacement = start_shard(backend, config, 0, generation=1)
        assert marker.exists()
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("raysim: fault: replacement"))
        assert line.startswith("raysim: fault: replacement for shard 0 died before it started (ActorDiedError:")
        assert line.endswith("; another starts") and len(line) < 400  # a line, not Ray's account of the actor
        assert len(backend.get([s.call(EnvShard.spaces) for s in [*roles.shards, replacement]])) == 3
    finally:
        end_roles(backend, roles)
        if replacement is not None:
            backend.kill(replacement)
