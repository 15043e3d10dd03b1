"""``Trainer``: the coordinator's loop: broadcast weights, gather chunks, update, evaluate, log.

    trainer = Trainer(load_config("configs/cartpole_ppo.yaml"))
    summary = trainer.train()          # env steps, wall time, last metrics, run directory

It runs in the driver (``raysim train``, a user's script, or a ``ray job``). Data never passes
through it: shards receive the learner's weights as one object ref, the learner receives the
shards' chunk refs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raysim.actors import Backend, Handle, LocalBackend, RayBackend
from raysim.checkpoint import save_checkpoint
from raysim.config import Config, check_config, to_dict
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards, write_records
from raysim.learner import Learner
from raysim.metrics import ConsoleSink, ParquetSink
from raysim.rollout.shard import EnvShard
from raysim.seeding import derive_seed


@dataclass
class Summary:
    """What ``Trainer.train`` returns."""

    env_steps: int
    iterations: int
    wall_time: float  # seconds, Ray start-up and actor creation excluded
    startup_time: float  # seconds to start Ray (if needed) and create the actors
    run_dir: str
    metrics: dict[str, float] = field(default_factory=dict)  # the last iteration's
    evaluation: EvalReport | None = None
    interrupted: bool = False


class Trainer:
    """Trains ``config`` with shards and a learner on Ray (or in-process: ``backend: local``)."""

    def __init__(self, config: Config, address: str | None = None, sinks: list | None = None):
        check_config(config)
        self.config = config
        self.address = address
        self.run_dir = make_run_dir(config)
        self.sinks = sinks
        self.started_ray = False

    def train(self) -> Summary:
        """Run to ``train.total_steps`` env steps (Ctrl-C stops cleanly); evaluate; save."""
        cfg = self.config
        t0 = time.perf_counter()
        backend, self.started_ray = start_backend(cfg, self.address)
        try:
            iterations = max(1, math.ceil(cfg.train.total_steps / steps_per_iteration(cfg)))
            shards, eval_shards, learner, max_episode_steps = self._create_roles(backend, iterations)
            startup = time.perf_counter() - t0
            sinks = self.sinks if self.sinks is not None else [ConsoleSink(cfg.train.total_steps), ParquetSink(self.run_dir / "metrics.parquet")]
            weights = learner.call("get_weights")
            env_steps, metrics, interrupted, iteration = 0, {}, False, 0
            start = time.perf_counter()
            eval_time = 0.0
            try:
                for iteration in range(1, iterations + 1):
                    if cfg.algo.name == "grpo":  # one episode per row, groups from shared starts
                        chunks = [shard.call("rollout_groups", weights, cfg.algo.num_steps, cfg.algo.group_size)
                                  for shard in shards]
                    else:
                        chunks = [shard.call("rollout", weights, cfg.algo.num_steps) for shard in shards]
                    metrics = backend.get(learner.call("update", *chunks))
                    weights = learner.call("get_weights")
                    env_steps += int(metrics["env_steps"])
                    if cfg.algo.name == "grpo" and env_steps >= cfg.train.total_steps:
                        iterations = iteration  # GRPO rounds vary in length: stop on the step budget
                    if cfg.eval.every and iteration % cfg.eval.every == 0 and iteration < iterations:
                        e0 = time.perf_counter()
                        report = self._evaluate(backend, eval_shards, weights, max_episode_steps, iteration)
                        metrics["eval_return"] = report.mean_return if report.mean_return is not None else math.nan
                        eval_time += time.perf_counter() - e0
                    if iteration % cfg.train.log_every == 0 or iteration == iterations:
                        elapsed = time.perf_counter() - start - eval_time
                        record = {**metrics, "iteration": iteration, "env_steps": env_steps, "time": elapsed,
                                  "steps_per_s": env_steps / max(elapsed, 1e-9)}
                        for sink in sinks:
                            sink.write(record)
                    if iteration == iterations:
                        break
            except KeyboardInterrupt:
                interrupted = True
                print(f"\ninterrupted at iteration {iteration}: saving and stopping", flush=True)
            wall = time.perf_counter() - start - eval_time
            state = backend.get(learner.call("state_dict"))
            save_checkpoint(self.run_dir, iteration, state, {"iteration": iteration, "env_steps": env_steps})
            report = None
            if cfg.eval.episodes > 0 and not interrupted:
                report = self._evaluate(backend, eval_shards, weights, max_episode_steps, iteration)
            for sink in sinks:
                sink.close()
            return Summary(env_steps, iteration, wall, startup, str(self.run_dir), metrics, report, interrupted)
        finally:
            if self.started_ray:
                import ray

                ray.shutdown()

    def _create_roles(self, backend: Backend, iterations: int):
        cfg = self.config
        shards = [create_shard(backend, cfg, i) for i in range(cfg.shards.count)]
        eval_count = cfg.eval.shards if (cfg.eval.episodes or cfg.eval.every) else 0
        eval_shards = [create_shard(backend, cfg, i, evaluation=True) for i in range(eval_count)]
        observation_spaces, action_space, max_episode_steps = backend.get(shards[0].call("spaces"))
        learner_options = {"num_cpus": cfg.learner.num_cpus, "num_gpus": cfg.learner.num_gpus}
        learner = backend.create(Learner, observation_spaces, action_space, cfg.model, cfg.algo, iterations,
                                 seed=cfg.seed, device=cfg.learner.device, options=learner_options)
        return shards, eval_shards, learner, max_episode_steps

    def _evaluate(self, backend: Backend, eval_shards: list, weights: Any, max_episode_steps: int | None,
                  iteration: int) -> EvalReport:
        cfg = self.config
        report = evaluate_on_shards(
            backend, lambda i: create_shard(backend, cfg, i, evaluation=True), eval_shards,
            [cfg.eval.num_envs] * len(eval_shards), weights, eval_spec(cfg, max_episode_steps),
        )
        write_records(self.run_dir / "eval" / f"{iteration}.parquet", report.records)
        return report


def start_backend(config: Config, address: str | None = None) -> tuple[Backend, bool]:
    """The backend of ``config``; starts an embedded local Ray when none is running and no address is given.

    Returns ``(backend, started)``: ``started`` is True when this call started Ray (then the
    caller shuts it down).
    """
    if config.backend == "local":
        return LocalBackend(), False
    if config.backend != "ray":
        raise ValueError(f"backend must be 'ray' or 'local', got {config.backend!r}")
    import ray

    if ray.is_initialized():
        return RayBackend(), False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:  # the embedded local Ray: enough logical CPUs for every role of this run
        wanted = (config.shards.count + config.eval.shards) * config.shards.num_cpus + config.learner.num_cpus
        ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(wanted)), include_dashboard=False)
    return RayBackend(), True


def create_shard(backend: Backend, config: Config, index: int, evaluation: bool = False) -> Handle:
    """Training shard ``index`` (or evaluation shard ``index``) of ``config``."""
    num_envs = config.eval.num_envs if evaluation else config.env.num_envs
    seed = derive_seed(config.eval.seed if evaluation else config.seed, 11 if evaluation else 10, index)
    return backend.create(
        EnvShard, config.env.id, num_envs, seed=seed, model=config.model, env_kwargs=config.env.kwargs,
        shard_index=index, on_nonfinite=config.env.on_nonfinite,
        options={"num_cpus": config.shards.num_cpus, "resources": dict(config.shards.resources)},
    )


def eval_spec(config: Config, max_episode_steps: int | None) -> EvalSpec:
    """The evaluation of ``config``; the default step budget covers every quota at the episode limit."""
    cfg = config.eval
    rows = max(1, cfg.shards * cfg.num_envs)
    per_row = math.ceil(cfg.episodes / rows) if cfg.balanced else cfg.episodes
    max_steps = cfg.max_steps or per_row * (max_episode_steps or 1000)
    return EvalSpec(cfg.episodes, cfg.seed, max_steps, cfg.deterministic, cfg.balanced, cfg.confidence)


def steps_per_iteration(config: Config) -> int:
    """Env steps collected per iteration: shards x rows x chunk length.

    GRPO: a round lasts until every row finished its episode, so its length varies; this is then
    the least a round collects (one step per row), the loop stops once ``train.total_steps`` env
    steps were collected, and the linear lr schedule decays over this most-rounds horizon.
    """
    steps = 1 if config.algo.name == "grpo" else config.algo.num_steps
    return config.shards.count * config.env.num_envs * steps


def make_run_dir(config: Config) -> Path:
    """A new run directory (``runs/<name>``, suffixed when taken) with its config snapshot."""
    base = Path(config.run_dir) if config.run_dir else Path("runs") / config.name
    path, n = base, 1
    while path.exists() and any(path.iterdir()):
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    (path / "configs").mkdir(parents=True, exist_ok=True)
    (path / "configs" / "train.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return path
