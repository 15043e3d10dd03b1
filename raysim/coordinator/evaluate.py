"""``evaluate(run_dir)``: a saved policy evaluated on new evaluation shards (``raysim eval``);
``evaluate_policy(config, policy)``: a scripted one in a config's env, no run needed (``raysim eval --policy``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from raysim.checkpoint import locate_checkpoint
from raysim.config import Config, ConfigError, load_config, load_run_config
from raysim.coordinator.cluster import start_backend, stop_ray
from raysim.coordinator.preflight import check_env_and_model, check_policy, check_renders
from raysim.coordinator.roles import create_shard
from raysim.coordinator.servers import Servers
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards, write_records
from raysim.models import actor_state
from raysim.recording import Film
from raysim.rollout import EnvShard
from raysim.rollout.policies import SCRIPTED


def evaluate(
    run_dir_or_checkpoint: str | Path,
    episodes: int = 100,
    seed: int | None = None,
    shards: int | None = None,
    envs_per_shard: int | None = None,
    deterministic: bool = True,
    balanced: bool = True,
    out: str | Path | None = None,
    backend: str | None = None,
    address: str | None = None,
    on_scored_episode: Callable[[dict], None] | None = None,
    on_episode: Callable[[dict], None] | None = None,
    film: Film | None = None,
) -> EvalReport:
    """Evaluate a run's latest checkpoint (or the given checkpoint directory); see ``raysim eval``. ``film``: also
    film the evaluation into ``film.writer`` (``raysim.recording``; the caller closes the writer)."""
    storage, _, state, meta = locate_checkpoint(run_dir_or_checkpoint)  # past damaged checkpoints
    overrides = eval_overrides(episodes, seed, shards, envs_per_shard, deterministic, balanced, backend, film)
    try:
        weights = {"version": int(meta.get("iteration", 0)), "actor": actor_state(state["model"])}
        config = load_run_config(storage, overrides)
        report = evaluate_config(config, weights, address, on_scored_episode, on_episode, film)
    finally:
        storage.close()  # the local copy of a remote run's configs
    if out is not None:
        write_records(out, report.records)
    return report


def evaluate_policy(
    config: str | Path,
    policy: str,
    episodes: int = 100,
    seed: int | None = None,
    shards: int | None = None,
    envs_per_shard: int | None = None,
    balanced: bool = True,
    out: str | Path | None = None,
    backend: str | None = None,
    address: str | None = None,
    overrides: Sequence[str] = (),
    on_scored_episode: Callable[[dict], None] | None = None,
    on_episode: Callable[[dict], None] | None = None,
    film: Film | None = None,
) -> EvalReport:
    """Evaluate the scripted ``policy`` (``expert`` or ``random``: ``raysim.rollout.policies``) in the env of
    ``config`` (a packaged config name or a YAML file, with ``overrides`` as ``--set`` gives them): no run, no
    weights; the episodes are those a learned policy plays with the same seed. See ``raysim eval --policy``."""
    if policy not in SCRIPTED:
        raise ConfigError(f"policy must be one of {list(SCRIPTED)}, got {policy!r}")
    evaluation = eval_overrides(episodes, seed, shards, envs_per_shard, True, balanced, backend, film)
    report = evaluate_config(
        load_config(config, [*overrides, *evaluation]), None, address, on_scored_episode, on_episode, film, policy
    )
    if out is not None:
        write_records(out, report.records)
    return report


def eval_overrides(
    episodes: int,
    seed: int | None,
    shards: int | None,
    envs_per_shard: int | None,
    deterministic: bool,
    balanced: bool,
    backend: str | None,
    film: Film | None,
) -> list[str]:
    """The ``eval.*`` (and ``backend``) overrides of an evaluation's options; None keeps the config's value."""
    overrides = [f"eval.episodes={episodes}", f"eval.deterministic={deterministic}", f"eval.balanced={balanced}"]
    overrides.append(f"eval.video={film is not None}")  # evaluation shards that draw, or not
    for key, value in (
        ("eval.seed", seed),
        ("eval.shards", shards),
        ("eval.num_envs", envs_per_shard),
        ("backend", backend),
        ("eval.video_size", film.size if film else None),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    return overrides


def evaluate_config(
    config: Config,
    weights: dict | None,
    address: str | None,
    on_scored_episode: Callable[[dict], None] | None = None,
    on_episode: Callable[[dict], None] | None = None,
    film: Film | None = None,
    policy: str | None = None,
    trajectories: bool = False,
) -> EvalReport:
    """Evaluate ``weights`` (``{"version", "actor"}``: a checkpoint's actor), or with ``weights`` None the scripted
    ``policy``, as ``config.eval`` says, on new evaluation shards; ``trajectories``: each record also carries its
    episode's steps (``EvalEpisodes.trajectories``). A run of the ``servers`` placement evaluates on a policy server
    (``servers.*``), its shards holding no weights."""
    spaces = check_env_and_model(config, new_run=False)  # an env that cannot be built here is said before Ray starts
    if policy is not None:
        check_policy(config, policy)
    if film is not None:
        check_renders(config)
    runner, started = start_backend(config, address)
    shards, servers = [], None
    try:
        if config.shards.placement == "servers" and weights is not None:
            servers = Servers(runner, config, spaces)
            servers.wait_started()
            weights = runner.get(servers.load(weights))[0]  # the shards receive the key
        shards += [create_shard(runner, config, i, evaluation=True, servers=servers) for i in range(config.eval.shards)]
        _, _, max_episode_steps = runner.get(shards[0].call(EnvShard.spaces))
        report = evaluate_on_shards(
            runner,
            lambda i: create_shard(runner, config, i, evaluation=True, servers=servers),
            shards,
            [config.eval.num_envs] * len(shards),
            weights,
            dataclasses.replace(EvalSpec.of(config.eval, max_episode_steps), policy=policy, trajectories=trajectories),
            on_scored_episode,
            on_episode,
            film=film,
        )
    finally:
        for handle in [*shards, *(servers.handles if servers is not None else [])]:
            runner.kill(handle)
        if started:
            stop_ray()
    return report
