"""The run's roles built from its config: shards, evaluation shards, the learner group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raysim.actors import Backend, Handle
from raysim.config import Config, training_shards
from raysim.coordinator.cluster import ResourceError, describe_needs, needs
from raysim.coordinator.servers import Servers, server_request
from raysim.envs.gym_adapter import with_pictures
from raysim.envs.registry import materialize
from raysim.learner import LearnerGroup
from raysim.rollout import EnvShard
from raysim.rollout.arrays import ArrayDict
from raysim.rollout.pipelined import PipelinedShard
from raysim.seeding import derive_seed


@dataclass
class Roles:
    """The actors of a run. ``shards`` is a tuple, never changed in place: replacing, adding or removing
    training shards (the ``Collector`` does) gives ``Roles`` a new one, so one read earlier stays as it was."""

    shards: tuple[Handle, ...]
    eval_shards: list[Handle]
    learner: LearnerGroup
    max_episode_steps: int | None
    spaces: tuple  # the env's observation spaces and action space, to build a learner again
    # what a learner starts from beside its config (object refs: ``create_learner``), to build one again
    starts: dict = field(default_factory=dict)
    teacher: Any = None  # distillation's teacher for the training shards (an object ref: ``create_roles``), or None
    servers: Servers | None = None  # the policy servers the shards ask (shards.placement: servers), or None
    # each training shard's identity, the index it was created with (its seed, its policy server): kept when it moves
    # down after an elastic removal, and taken by its replacement; by default the shards' positions
    ids: tuple[int, ...] = ()

    def __post_init__(self):
        self.ids = self.ids or tuple(range(len(self.shards)))

    def replace_shard(self, index: int, shard: Handle) -> None:
        """Training shard ``index`` is ``shard`` from now on (of the same identity)."""
        self.shards = (*self.shards[:index], shard, *self.shards[index + 1 :])

    def add_shards(self, shards: list[Handle], ids: list[int]) -> None:
        """``shards`` (created as ``ids``) join the training shards, after the others."""
        self.shards, self.ids = (*self.shards, *shards), (*self.ids, *ids)

    def remove_shards(self, indices: set[int]) -> None:
        """The training shards at ``indices`` are gone; the others keep their order."""
        kept = [i for i in range(len(self.shards)) if i not in indices]
        self.shards, self.ids = tuple(self.shards[i] for i in kept), tuple(self.ids[i] for i in kept)

    def served(self) -> list[list[tuple[int, Handle]]]:
        """The shards that ask policy servers, each with its identity (``Servers.of``): the training shards, then the
        evaluation shards."""
        return [list(zip(self.ids, self.shards, strict=True)), list(enumerate(self.eval_shards))]


def shard_request(config: Config) -> dict[str, float]:
    """The Ray resources one shard asks for."""
    return {"CPU": config.shards.num_cpus, **config.shards.resources}


def create_shard(
    backend: Backend,
    config: Config,
    index: int,
    evaluation: bool = False,
    generation: int = 0,
    teacher: Any = None,
    servers: Servers | None = None,
) -> Handle:
    """Training shard ``index`` (or evaluation shard ``index``) of ``config``.

    ``generation`` counts the shards started after the run's first ones (replacements of shards that died,
    elastic additions) over the run: such a shard plays new episodes. ``teacher``: distillation's, for a
    training shard (``Roles.teacher``). ``servers``: the policy servers of the ``servers`` placement, of which the
    shard asks its own (``Servers.caller``) and holds no weights. Evaluation
    shards of a run that films its evaluations (``eval.video``) have envs that draw (``with_pictures``).
    """
    num_envs = config.eval.num_envs if evaluation else config.env.num_envs
    keys = (11 if evaluation else 10, index) + ((generation,) if generation else ())
    seed = derive_seed(config.eval.seed if evaluation else config.seed, *keys)
    env_kwargs = materialize(config.env.id, config.env.kwargs)  # resources as arrays: no file read on a shard
    if evaluation and config.eval.video:
        env_kwargs = with_pictures(config.env.id, env_kwargs)
    pipelined = servers is not None and not evaluation and config.servers.pipeline > 1
    return backend.create(
        PipelinedShard if pipelined else EnvShard,
        config.env.id,
        num_envs,
        **({"groups": config.servers.pipeline} if pipelined else {}),
        seed=seed,
        model=config.model,
        env_kwargs=env_kwargs,
        shard_index=index,
        on_nonfinite=config.env.on_nonfinite,
        frame_stack=config.env.frame_stack,
        evaluation=evaluation,
        success=config.env.success,
        teacher=teacher,
        server=None if servers is None else servers.caller(index),
        options={"num_cpus": config.shards.num_cpus, "resources": dict(config.shards.resources)},
    )


def start_shard(backend: Backend, config: Config, index: int, evaluation: bool = False, **made: Any) -> Handle:
    """``create_shard`` (``made``: its ``generation``, ``teacher``, ``servers``), returned once the shard started: a
    replacement waits for room with a line every few seconds, and gives up after ``resources_timeout``
    (``TimeoutError``); one that dies before it starts (placed on a node that was going) is replaced within that
    time too."""
    shards = [create_shard(backend, config, index, evaluation, **made)]
    what = f"replacement for {'evaluation ' if evaluation else ''}shard {index}"
    backend.wait_started(  # one that died before it started never played: the same shard again
        shards,
        EnvShard.spaces,
        what,
        config.resources_timeout,
        replace=lambda _: create_shard(backend, config, index, evaluation, **made),
    )
    return shards[0]


def create_learner(
    backend: Backend, config: Config, spaces: tuple, horizon: int, starts: dict | None = None
) -> LearnerGroup:
    """The learner group of ``config`` (``learner.ranks`` ranks), started (``TimeoutError`` after
    ``resources_timeout``); ``horizon``: the env steps planned (schedule); ``starts``: ``pretrained`` weights
    and ``demonstrations`` (``Learner``'s arguments, already in the object store)."""
    observation_spaces, action_space = spaces
    return LearnerGroup(
        backend,
        config.learner.ranks,
        **(starts or {}),
        observation_spaces=observation_spaces,
        action_space=action_space,
        model=config.model,
        algo=config.algo,
        horizon=horizon,
        seed=config.seed,
        device=config.learner.device,
        replay_capacity=config.replay.capacity,
        start_timeout=config.resources_timeout,
        options={
            "num_cpus": config.learner.num_cpus,
            "num_gpus": config.learner.num_gpus,
            "resources": dict(config.learner.resources),
        },
    )


def create_roles(
    backend: Backend, config: Config, horizon: int, spaces: tuple, starts: dict | None = None, teacher: Any = None
) -> Roles:
    """Every role of a run: training shards (none for an algorithm without: BC), evaluation shards (when the run
    evaluates), the learner group, all starting at once (``spaces``: the env's observation spaces and action
    space, from the preflight; ``starts``: what the learner starts from, and ``teacher``: distillation's for the
    training shards, each put in the object store once here).

    Returns once the training shards and the learner ranks answer (``ResourceError`` after
    ``resources_timeout``); a role that dies before it starts (its node went) is replaced meanwhile. The
    evaluation shards are created then, not needed before the first evaluation: they start while the first
    iterations run instead of delaying them (the preflight checked that the cluster has room for every role).
    """
    teacher = None if teacher is None else backend.put(ArrayDict(teacher))
    servers = Servers(backend, config, spaces) if config.shards.placement == "servers" else None
    shards = [
        create_shard(backend, config, i, teacher=teacher, servers=servers) for i in range(training_shards(config))
    ]
    starts = {k: backend.put(v) for k, v in (starts or {}).items() if v is not None}
    if config.shards.max:  # elastic: let an autoscaler know how many shards (and servers) the run could use
        served = [(server_request(config), config.servers.count)] if servers is not None else []
        backend.request_capacity([(shard_request(config), config.shards.max), *served])
    learner = None
    try:
        learner = create_learner(backend, config, spaces, horizon, starts)
        if servers is not None:
            servers.wait_started()
        started = backend.wait_started(
            shards,
            EnvShard.spaces,
            "shards",
            config.resources_timeout,
            replace=lambda i: create_shard(backend, config, i, teacher=teacher, servers=servers),
        )
    except TimeoutError as error:
        started_roles = [*shards, *(learner.handles if learner else []), *(servers.handles if servers else [])]
        for handle in started_roles:  # none is left waiting for room
            backend.kill(handle)
        raise ResourceError(f"{error}:\n{describe_needs(needs(config))}") from error
    evaluates = config.eval.episodes or config.eval.every or config.eval.every_steps
    eval_shards = [
        create_shard(backend, config, i, evaluation=True, servers=servers)
        for i in range(config.eval.shards if evaluates else 0)
    ]
    if not started and eval_shards:  # no training shards (BC): the evaluation shards know the episode limit
        started = [backend.get(eval_shards[0].call(EnvShard.spaces))]
    max_episode_steps = started[0][2] if started else None
    return Roles(tuple(shards), eval_shards, learner, max_episode_steps, spaces, starts, teacher, servers)
