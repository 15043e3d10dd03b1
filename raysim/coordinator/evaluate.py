"""``evaluate(run_dir)``: a saved policy evaluated on new evaluation shards (``raysim eval``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from raysim.checkpoint import locate_checkpoint
from raysim.config import Config, load_run_config
from raysim.coordinator.cluster import start_backend
from raysim.coordinator.preflight import check_env_and_model, check_renders
from raysim.coordinator.roles import create_shard
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards, write_records
from raysim.models import actor_state
from raysim.recording import Film
from raysim.rollout import EnvShard


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
    try:
        config = load_run_config(storage, overrides)
        report = evaluate_config(config, state, meta, address, on_scored_episode, on_episode, film)
    finally:
        storage.close()  # the local copy of a remote run's configs
    if out is not None:
        write_records(out, report.records)
    return report


def evaluate_config(
    config: Config,
    state: dict,
    meta: dict,
    address: str | None,
    on_scored_episode: Callable[[dict], None] | None = None,
    on_episode: Callable[[dict], None] | None = None,
    film: Film | None = None,
) -> EvalReport:
    """Evaluate the actor of a checkpoint's ``state`` as ``config.eval`` says, on new evaluation shards."""
    weights = {"version": int(meta.get("iteration", 0)), "actor": actor_state(state["model"])}
    check_env_and_model(config, new_run=False)  # an env that cannot be built here is said before Ray starts
    if film is not None:
        check_renders(config)
    runner, started = start_backend(config, address)
    handles = []
    try:
        handles += [create_shard(runner, config, i, evaluation=True) for i in range(config.eval.shards)]
        _, _, max_episode_steps = runner.get(handles[0].call(EnvShard.spaces))
        report = evaluate_on_shards(
            runner,
            lambda i: create_shard(runner, config, i, evaluation=True),
            handles,
            [config.eval.num_envs] * len(handles),
            weights,
            EvalSpec.of(config.eval, max_episode_steps),
            on_scored_episode,
            on_episode,
            film=film,
        )
    finally:
        for handle in handles:
            runner.kill(handle)
        if started:
            import ray

            ray.shutdown()
    return report
