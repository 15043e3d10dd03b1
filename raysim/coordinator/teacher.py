"""``algo.teacher``: the teacher a distillation run learns from, read once by the driver and kept in the run.

A new run reads the teacher's newest intact checkpoint (``locate_checkpoint``: a run directory or one checkpoint,
local or a URI), checks that its actor fits the student env's groups (``algo.teacher_inputs``) and copies it into
its own directory (``resources/teacher.pt``: the actor's weights with its observation statistics, its model
settings, the groups it reads), so a resume never depends on the teacher's run still being there: a run that
has the copy reads it, and refuses one that does not match the hash it was saved with. The shards receive it
once, when they are created (``raysim.rollout.teacher``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from typing import Any

import gymnasium as gym
import torch

from raysim.checkpoint import CheckpointError, locate_checkpoint
from raysim.composition import ConfigError
from raysim.config import Config
from raysim.models import Actor, ModelConfig
from raysim.models.networks import actor_state
from raysim.models.pretrained import mismatched
from raysim.rollout.teacher import TeacherWeights
from raysim.storage import RunStorage

TEACHER_COPY = "resources/teacher.pt"  # in the run directory


def read_teacher(config: Config, spaces: tuple[dict, Any], storage: RunStorage) -> TeacherWeights | None:
    """The teacher of a distillation run (None for other algorithms): the run's copy where it has one, else
    ``algo.teacher``'s checkpoint; checked against the student env's ``spaces``. A ``ConfigError`` in one line
    when it cannot be read or does not fit."""
    source = getattr(config.algo, "teacher", None)
    if not source:
        return None
    if storage.exists(TEACHER_COPY):
        teacher = decode(storage.read(TEACHER_COPY), storage.path(TEACHER_COPY))
        print(f"raysim: algo.teacher: the run's copy ({TEACHER_COPY}) of {teacher['source']}", flush=True)
    else:
        teacher = from_checkpoint(source, config.algo.teacher_inputs)
        reads = ", ".join(f"{group} as {name}" if name != group else group for name, group in teacher["inputs"].items())
        print(f"raysim: algo.teacher: {teacher['source']}, reading {reads}", flush=True)
    check_fits(teacher, *spaces, config.env.id)
    transform = teacher["model"]["action_transform"]
    if transform != config.model.action_transform and not isinstance(spaces[1], gym.spaces.Discrete):
        print(
            f"raysim: algo.teacher: its model.action_transform is {transform}, this model's "
            f"{config.model.action_transform}: it is distilled in the actions the env receives",
            flush=True,
        )
    return teacher


def teacher_meta(config: Config, teacher: TeacherWeights, saved: dict[str, Any] | None) -> dict[str, Any]:
    """What every checkpoint's meta.json says of the teacher: the configured run, the groups and the key. A
    ``ConfigError`` when the checkpoint being resumed (its meta, ``saved``) was trained with another teacher (the
    run's copy went missing and the teacher's run changed since)."""
    meta = {"run": config.algo.teacher, "inputs": list(teacher["inputs"].values()), "key": teacher["key"]}
    before = (saved or {}).get("teacher")
    if isinstance(before, dict) and before.get("key") not in (None, teacher["key"]):
        raise ConfigError(
            f"algo.teacher {teacher['source']} is not the teacher this run was trained with (its checkpoints name "
            f"another hash; the run's copy {TEACHER_COPY} is missing or was replaced): start a new run to distil "
            "from it"
        )
    return meta


def save_teacher(storage: RunStorage, teacher: TeacherWeights) -> None:
    """The teacher's copy in a new run's directory."""
    storage.write(TEACHER_COPY, encode(teacher))


def from_checkpoint(source: str, inputs: list[str]) -> TeacherWeights:
    """The teacher of run (or checkpoint) ``source``, reading the student env's groups ``inputs`` ([]: the names
    its actor reads)."""
    try:
        _, checkpoint, state, meta = locate_checkpoint(source)
    except (CheckpointError, FileNotFoundError, OSError) as error:
        raise ConfigError(f"algo.teacher {source}: {str(error).splitlines()[0]}") from error
    saved = meta.get("model")
    if not isinstance(saved, dict):
        raise ConfigError(
            f"algo.teacher {source}: its checkpoint {checkpoint.name} names no model settings (meta.json)"
        )
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    model = {**dataclasses.asdict(ModelConfig()), **{k: v for k, v in saved.items() if k in known}}
    if model["recurrent"] != "none":
        raise ConfigError(
            f"algo.teacher {source}: a recurrent teacher (model.recurrent: {model['recurrent']}) cannot label single "
            "steps; distil from a feed-forward one"
        )
    names = list(model["actor_inputs"])
    groups = list(inputs) or names
    if len(groups) != len(names):
        raise ConfigError(
            f"algo.teacher_inputs: {groups} names {len(groups)} group(s), but the teacher's actor reads {len(names)}: "
            f"{names} (one student group for each, in that order)"
        )
    actor = {k: v.clone() for k, v in actor_state(state.get("model") or {}).items()}
    weights = {
        "source": f"{source} (checkpoint {checkpoint.name})",
        "model": model,
        "inputs": dict(zip(names, groups, strict=True)),
    }
    return TeacherWeights(key=teacher_key({**weights, "actor": actor}), actor=actor, **weights)


def check_fits(teacher: TeacherWeights, observation_spaces: dict, action_space: Any, env_id: str) -> None:
    """A ``ConfigError`` when the student env lacks a group the teacher reads, or the teacher's actor does not fit
    those groups and the action space (each tensor's saved shape against the one built here)."""
    missing = [group for group in teacher["inputs"].values() if group not in observation_spaces]
    if missing:
        raise ConfigError(
            f"algo.teacher_inputs: the student env ({env_id}) has no group {missing[0]!r} (its groups: "
            f"{', '.join(observation_spaces)}); add it to env.kwargs.observations or name another"
        )
    spaces = {name: observation_spaces[group] for name, group in teacher["inputs"].items()}
    actor = Actor(spaces, action_space, ModelConfig(**teacher["model"]))  # as a shard builds it (``Teacher``)
    problems = mismatched(actor.state_dict(), teacher["actor"])
    if problems:
        raise ConfigError(
            f"algo.teacher {teacher['source']}: its actor does not fit the student env's groups "
            f"{dict(teacher['inputs'])} and action space: {'; '.join(problems[:3])} (the teacher's shape vs this env's)"
        )
    actor.load_state_dict(teacher["actor"])  # what a shard loads: no tensor more or less


def teacher_key(teacher: dict[str, Any]) -> str:
    """sha256 of the teacher's settings and weights (every tensor's name, dtype, shape and bytes)."""
    digest = hashlib.sha256(json.dumps([teacher["model"], teacher["inputs"]], sort_keys=True).encode())
    for name in sorted(teacher["actor"]):
        tensor = teacher["actor"][name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def encode(teacher: TeacherWeights) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(teacher), buffer)
    return buffer.getvalue()


def decode(data: bytes, where: str) -> TeacherWeights:
    """The copy at ``where``, checked against the hash it was saved with."""
    try:
        teacher = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        intact = teacher_key(teacher) == teacher["key"]
    except Exception as error:  # noqa: BLE001 - a truncated or foreign file: said in one line
        raise ConfigError(f"the run's teacher {where} cannot be read: {str(error).splitlines()[0]}") from error
    if not intact:
        raise ConfigError(
            f"the run's teacher {where} is damaged: its weights do not match the hash they were saved with"
        )
    return TeacherWeights(**teacher)
