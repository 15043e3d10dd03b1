"""``record_demonstrations``: a policy's episodes played through the evaluation path and written as a Minari
dataset (``raysim demos record``).

The episodes are an evaluation's (``raysim.evaluation``: balanced per-row quotas, episode ``j`` from its own
reset seed and task ``j mod K``, the same on any layout), played with ``EvalEpisodes.trajectories`` so that each
counted episode's record carries its steps; only counted (completed) episodes are written. They are played from
another evaluation seed than the config's ``eval.seed`` (by default ``derive_seed(seed, DEMONSTRATIONS)``), so a
policy trained on them is not scored on the episodes it imitated: except in an env whose seeds choose among few
episodes (``BatchedEnv.distinct_episodes``: ``raysim/MetaWorld`` with ``goals: benchmark``, 50 per task, which an
evaluation of a few hundred episodes covers), where they are among the evaluation's, and recording says so in a
line (``goals: sampled`` keeps them apart). The dataset stores the Gymnasium spec of the env where it has one
(``raysim.envs.gym_vector.gymnasium_spec``), for Minari's ``recover_environment``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from raysim.checkpoint import locate_checkpoint
from raysim.config import Config, ConfigError, load_config, load_run_config, to_dict
from raysim.coordinator.evaluate import eval_overrides, evaluate_config
from raysim.coordinator.preflight import check_env_and_model
from raysim.demos.writing import check_new_dataset, dataset_spaces, write_dataset
from raysim.envs import make
from raysim.envs.gym_vector import gymnasium_spec
from raysim.envs.messages import captured
from raysim.envs.registry import row_multiple
from raysim.evaluation import EvalReport
from raysim.identity import env_identity
from raysim.models import actor_state
from raysim.rollout.policies import SCRIPTED
from raysim.seeding import DEMONSTRATIONS, derive_seed


@dataclass
class Recorded:
    """What ``record_demonstrations`` wrote: the dataset, its episodes' evaluation report, its steps, its seed."""

    dataset_id: str
    path: Path
    report: EvalReport
    steps: int
    seed: int


def record_demonstrations(
    dataset_id: str,
    episodes: int,
    run: str | Path | None = None,
    config: str | Path | None = None,
    policy: str | None = None,
    overrides: Sequence[str] = (),
    seed: int | None = None,
    deterministic: bool = True,
    shards: int | None = None,
    envs_per_shard: int | None = None,
    backend: str | None = None,
    address: str | None = None,
) -> Recorded:
    """Record ``episodes`` evaluation episodes of a run's newest intact checkpoint (``run``), or of the scripted
    ``policy`` in the env of ``config`` (with ``overrides``), as the Minari dataset ``dataset_id``. ``seed``: the
    evaluation seed of the episodes (default ``derive_seed(config seed, DEMONSTRATIONS)``; the config's
    ``eval.seed`` is refused). Everything that can be checked is, before any episode is played."""
    check_new_dataset(dataset_id)
    evaluation = eval_overrides(episodes, None, shards, envs_per_shard, deterministic, True, backend, None)
    weights = None
    if run is not None:
        storage, _, state, meta = locate_checkpoint(run)  # past damaged checkpoints
        try:
            weights = {"version": int(meta.get("iteration", 0)), "actor": actor_state(state["model"])}
            loaded = load_run_config(storage, evaluation)
        finally:
            storage.close()
        source = f"checkpoint {meta.get('iteration', 0)} of {run}"
    elif policy in SCRIPTED:
        loaded, source = load_config(config, [*overrides, *evaluation]), policy
    else:
        raise ConfigError(f"policy must be one of {list(SCRIPTED)}, got {policy!r}")
    loaded = with_eval_seed(loaded, seed)
    env = recorded_env(loaded)
    if env["distinct_episodes"]:
        print(
            f"raysim: {loaded.env.id} has only {env['distinct_episodes']} distinct episodes per task (its reset seeds "
            "choose among them): these demonstrations replay episodes that evaluation plays too, so a policy trained "
            "on them is scored on episodes it imitated (raysim/MetaWorld: env.kwargs.goals: sampled keeps them apart)",
            flush=True,
        )
    report = evaluate_config(loaded, weights, address, policy=policy, trajectories=True)
    records = report.records
    if not records:
        raise ConfigError(
            f"no episode of {episodes} completed within eval.max_steps ({loaded.eval.max_steps or 'the episode limit'})"
            ": nothing to record"
        )
    learned = weights is not None
    spaces = dataset_spaces(env["observation_spaces"], env["action_space"], learned)
    metadata = dataset_metadata(loaded, source, learned, report)
    path = write_dataset(dataset_id, records, spaces, env["task_names"], metadata, env["spec"])
    steps = sum(len(record["trajectory"]["reward"]) for record in records)
    return Recorded(dataset_id, path, report, steps, loaded.eval.seed)


def dataset_metadata(config: Config, source: str, learned: bool, report: EvalReport) -> dict[str, Any]:
    """What a recorded dataset says of itself (its metadata ``raysim``): the env, the policy, the seed, the counts."""
    identity, canonical = env_identity(to_dict(config.env))
    return {
        "env_id": config.env.id,
        "env_identity": identity,
        "canonical_env": canonical,
        "frame_stack": to_dict(config.env.frame_stack),  # of the config recorded with: the observations are unstacked
        "policy": source,
        "deterministic": config.eval.deterministic if learned else None,
        "action_transform": config.model.action_transform if learned else None,  # a learned actor's actions: before it
        "seed": config.eval.seed,
        "episodes_requested": report.requested,
        "episodes": report.completed,
        "successes": report.successes,
    }


def with_eval_seed(config: Config, seed: int | None) -> Config:
    """``config`` evaluating from the demonstrations' seed: ``seed``, by default one derived from the run's seed;
    a ``ConfigError`` for ``eval.seed`` itself (the episodes the evaluation scores)."""
    seed = derive_seed(config.seed, DEMONSTRATIONS) if seed is None else int(seed)
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    if seed == config.eval.seed:
        raise ConfigError(
            f"--seed {seed} is eval.seed: demonstrations would replay the episodes the evaluation scores; "
            "choose another --seed (or leave it out)"
        )
    return dataclasses.replace(config, eval=dataclasses.replace(config.eval, seed=seed))


def recorded_env(config: Config) -> dict[str, Any]:
    """The env's own spaces (before the frame stack), tasks, distinct episodes and Gymnasium spec (or None), from one
    evaluation row set built here; a ``ConfigError`` (before Ray starts) for an env or model that cannot be built,
    or that cannot be recorded."""
    check_env_and_model(config, new_run=False)
    env_id = config.env.id
    with captured():  # what building the env prints was said by ``check_env_and_model``
        env = make(env_id, row_multiple(env_id, config.env.kwargs), seed=0, evaluation=True, **config.env.kwargs)
    env.close()
    if not env.resets_rows:
        raise ConfigError(
            f"{env_id} cannot reset single rows (env.kwargs.vectorize: native): its episodes cannot be recorded "
            "by index; use another vectorize"
        )
    spaces: dict[str, gym.Space] = dict(env.observation_spaces)
    return {
        "observation_spaces": spaces,
        "action_space": env.action_space,
        "task_names": tuple(env.task_names),
        "distinct_episodes": env.distinct_episodes,
        "spec": gymnasium_spec(env_id, config.env.kwargs),
    }
