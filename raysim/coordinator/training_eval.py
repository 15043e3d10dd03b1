"""Evaluations during training: when one is due, running it on the run's evaluation shards, its metrics.

The records of the evaluation after iteration ``i`` go to ``eval/<i>.parquet`` (with ``eval.video``, its
film to ``videos/<i>.mp4``); the final evaluation scores the run's saved last iteration.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

from raysim.actors import InputLost, describe
from raysim.config import Config
from raysim.coordinator.faults import on_phase
from raysim.coordinator.recovery import VIDEOS, restart_learner
from raysim.coordinator.roles import start_shard
from raysim.coordinator.saving import RunFailed
from raysim.coordinator.session import Session
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards
from raysim.recording import film_into
from raysim.records import write_evaluation


def eval_due(config: Config, iteration: int, steps_before: int, env_steps: int) -> bool:
    """Whether an evaluation follows this iteration: every ``eval.every`` iterations, and/or each
    time the env steps pass a multiple of ``eval.every_steps``."""
    cfg = config.eval
    by_iteration = bool(cfg.every) and iteration % cfg.every == 0
    by_steps = bool(cfg.every_steps) and env_steps // cfg.every_steps > steps_before // cfg.every_steps
    return by_iteration or by_steps


def eval_metrics(report: EvalReport) -> dict[str, float]:
    """The metrics of an evaluation during training: mean return, and the success rate where defined."""
    metrics = {"eval_return": math.nan if report.mean_return is None else report.mean_return}
    rate = report.success_rate
    if rate is not None and rate.value is not None:
        metrics["eval_success_rate"] = rate.value
    return metrics


def evaluate_iteration(session: Session, iteration: int, env_steps: int) -> EvalReport:
    """Evaluate the session's current weights (those of ``iteration``, at ``env_steps``) and write its records;
    its film, where there is one, is offered to the sinks."""
    cfg, backend, roles, storage = session.config, session.backend, session.roles, session.storage
    on_phase("eval", iteration, session)
    video = f"{VIDEOS}/{iteration}.mp4"
    while True:
        filming = film_into(storage, video, cfg.eval) if cfg.eval.video else nullcontext()
        try:
            weights = session.weights
            if roles.servers is not None:  # the shards act through the servers: each holds the weights, one key
                weights = backend.get(roles.servers.load(weights))[0]
            with filming as film:
                report = evaluate_on_shards(
                    backend,
                    lambda i: start_shard(backend, cfg, i, evaluation=True, servers=roles.servers),
                    roles.eval_shards,
                    [cfg.eval.num_envs] * len(roles.eval_shards),
                    weights,
                    EvalSpec.of(cfg.eval, roles.max_episode_steps),
                    film=film,
                )
            break
        except Exception as error:  # a policy server that died: replaced, the evaluation played again (by index)
            if roles.servers is None or not roles.servers.recover(roles.served(), describe(error)):
                raise
    write_evaluation(storage, iteration, report.records)
    if cfg.eval.video and storage.exists(video):
        session.sinks.video(video, iteration, env_steps)
    return report


def final_evaluation(session: Session) -> EvalReport:
    """The final evaluation of the saved last iteration; its checkpoint carries the score.

    A learner that died since (its weights lost with it) is restarted from that checkpoint first. A
    failure (no room for that learner within ``resources_timeout``) is ``RunFailed``, naming the saved
    iteration and how to evaluate it.
    """
    iteration, env_steps = session.ready.state.iteration, session.ready.state.env_steps
    on_phase("final_eval", iteration, session)
    try:
        try:
            report = evaluate_iteration(session, iteration, env_steps)
        except InputLost as error:
            restart_learner(session, error)
            report = evaluate_iteration(session, iteration, env_steps)
    except Exception as error:
        raise RunFailed(
            f"{describe(error)}\nthe final evaluation did not finish; iteration {iteration} is saved: "
            f"evaluate it with `raysim eval {session.run_dir}`"
        ) from error
    ready = session.ready  # a restarted learner may have rewound the session
    session.checkpoints.record_score(ready.saved, report.mean_return)
    ready.state = ready.state.scored(report.mean_return)
    return report
