"""``Trainer``: the coordinator's loop: broadcast weights, gather chunks, update, evaluate, log.

    trainer = Trainer(load_config("configs/cartpole_ppo.yaml"))
    summary = trainer.train()          # env steps, wall time, last metrics, run directory
    Trainer.from_run_dir(summary.run_dir).train()     # continue a run from its newest checkpoint

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
from raysim.checkpoint import CheckpointError, load_latest, save_checkpoint
from raysim.composition import differences, env_identity
from raysim.config import Config, ConfigError, check_config, load_resume_config, to_dict
from raysim.evaluation import EvalReport, EvalSpec, evaluate_on_shards, write_records
from raysim.learner_group import LearnerGroup
from raysim.metrics import SinkSet, make_sinks
from raysim.rollout.shard import EnvShard
from raysim.seeding import derive_seed


@dataclass
class Summary:
    """What ``Trainer.train`` returns."""

    env_steps: int
    iterations: int
    wall_time: float  # seconds of training, Ray start-up, actor creation and evaluation excluded
    startup_time: float  # seconds to start Ray (if needed) and create the actors
    run_dir: str
    metrics: dict[str, float] = field(default_factory=dict)  # the last log step's record
    evaluation: EvalReport | None = None
    interrupted: bool = False  # Ctrl-C, or train.stop_after reached: resume continues
    steps_this_run: int = 0  # env steps collected by this process (a resumed run counts from its checkpoint)


@dataclass
class ResumePoint:
    """Where a resumed run continues: the checkpoint and its counters."""

    checkpoint: Path
    state: dict[str, Any]
    meta: dict[str, Any]


@dataclass
class Roles:
    shards: list[Handle]
    eval_shards: list[Handle]
    learner: LearnerGroup
    max_episode_steps: int | None
    spaces: tuple  # the env's observation spaces and action space, to build a learner again


class Trainer:
    """Trains ``config`` with shards and a learner group on Ray (or in-process: ``backend: local``).

    ``Trainer(config).train()`` starts a new run directory; ``Trainer.from_run_dir(path).train()``
    continues a run from its newest intact checkpoint.
    """

    def __init__(self, config: Config, address: str | None = None, sinks: list | None = None,
                 resume: ResumePoint | None = None):
        check_config(config)
        self.config = config
        self.address = address
        self.sinks = sinks
        self.resume = resume
        self.run_dir = Path(config.run_dir) if resume else new_run_dir(config)
        self.identity, self.canonical_env = env_identity(to_dict(config.env))
        self.faults = 0  # shards replaced after their process died
        self.next_shard_index = config.shards.count  # elastic: the index (and seed) of the next new shard
        self.learner_restarts = 0

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, config: str | Path | None = None, overrides: list[str] | None = None,
                     force: bool = False, address: str | None = None) -> "Trainer":
        """A trainer that continues ``run_dir`` (also after the directory was moved).

        ``config``: the run's own snapshot by default; or the original declaration; or an env
        config (such as the run's ``configs/gym.yaml``) that replaces the snapshot's env. An env
        whose identity differs from the checkpoint's is refused, listing every differing key,
        unless ``force``.
        """
        run_dir = Path(run_dir).resolve()
        checkpoint, state, meta = load_latest(run_dir)
        config_obj = load_resume_config(run_dir, config, overrides or [])
        config_obj.run_dir = str(run_dir)
        identity, canonical = env_identity(to_dict(config_obj.env))
        if identity != meta.get("identity"):
            lines = differences(meta.get("canonical_env", {}), canonical)
            message = "the env differs from the checkpoint's:\n  " + "\n  ".join(lines or ["(no canonical config saved)"])
            if not force:
                raise ConfigError(f"cannot resume {run_dir}: {message}\nPass --force to resume anyway.")
            print(f"raysim: WARNING: resuming with --force although {message}", flush=True)
        return cls(config_obj, address=address, resume=ResumePoint(checkpoint, state, meta))

    def train(self) -> Summary:
        """Run to ``train.total_steps`` env steps (Ctrl-C stops cleanly), checkpoint, evaluate."""
        cfg = self.config
        t0 = time.perf_counter()
        sinks = None
        backend, started_ray = start_backend(cfg, self.address)
        try:
            iterations = max(1, math.ceil(cfg.train.total_steps / steps_per_iteration(cfg)))
            roles = self.roles = self._create_roles(backend, iterations)  # self.roles: for inspection
            if self.resume:
                iteration, env_steps = self._restore(backend, roles)
            else:
                self._snapshot(roles)
                iteration, env_steps = 0, 0
            startup = time.perf_counter() - t0
            if self.sinks is not None:
                sinks = SinkSet(self.sinks)
            else:
                sinks = make_sinks(cfg.train.sinks, self.run_dir, cfg.train.total_steps, keep_until=iteration,
                                   env_steps=env_steps if self.resume else 0)
            last = iterations if cfg.train.stop_after is None else min(iterations, iteration + cfg.train.stop_after)
            weights = roles.learner.get_weights()
            metrics, interrupted, eval_time, eval_return, first_steps = {}, False, 0.0, None, env_steps
            solved = None  # the evaluation that reached eval.stop_return, if one did
            pending: dict[str, float] = {}  # evaluation metrics waiting for the next log step
            times, timed = dict.fromkeys(TIMES, 0.0), 0  # seconds per phase since the last log step
            start = time.perf_counter()
            try:
                while iteration < last:
                    iteration += 1
                    log = iteration % cfg.train.log_every == 0 or iteration == last
                    t_start = time.perf_counter()
                    if cfg.shards.max:
                        self._grow(backend, roles)
                    try:
                        chunks = self._collect(backend, roles, weights)  # futures; dead shards replaced
                        t_collected = time.perf_counter()
                        result = roles.learner.update(chunks, log)
                    except Exception as error:  # a learner rank died: restart from the newest checkpoint
                        if not (isinstance(error, LearnerLost) or backend.is_actor_failure(error)):
                            raise
                        iteration, env_steps = self._restart_learner(backend, roles, iterations, error)
                        weights = roles.learner.get_weights()
                        continue
                    weights = roles.learner.get_weights()
                    t_updated = time.perf_counter()
                    times["time_collect"] += t_collected - t_start
                    times["time_update"] += t_updated - t_collected
                    timed += 1
                    steps_before, env_steps = env_steps, env_steps + int(result["env_steps"])
                    if (cfg.algo.name == "grpo" or cfg.shards.max) and env_steps >= cfg.train.total_steps:
                        iterations = last = iteration  # GRPO rounds / elastic batches vary: stop on the step budget
                        if not log:
                            log = True
                            result.update(roles.learner.metrics())
                    if eval_due(cfg, iteration, steps_before, env_steps) and iteration < iterations:
                        e0 = time.perf_counter()
                        evaluation = self._evaluate(backend, roles, weights, iteration)
                        eval_return = evaluation.mean_return
                        pending = eval_metrics(evaluation)
                        times["time_eval"] += time.perf_counter() - e0
                        eval_time += time.perf_counter() - e0
                        stop = cfg.eval.stop_return
                        if stop is not None and eval_return is not None and eval_return >= stop:
                            solved, iterations, last = evaluation, iteration, iteration  # target reached: end here
                            if not log:
                                log = True
                                result.update(roles.learner.metrics())
                    if log:
                        elapsed = time.perf_counter() - start - eval_time
                        metrics = {k: v for k, v in result.items() if k != "env_steps"}
                        metrics.update(pending)
                        metrics.update({k: v / max(1, timed) for k, v in times.items()})
                        record = {**metrics, "iteration": iteration, "env_steps": env_steps, "time": elapsed,
                                  "steps_per_s": (env_steps - first_steps) / max(elapsed, 1e-9)}
                        sinks.write(record)
                        metrics = record
                        pending, times, timed = {}, dict.fromkeys(TIMES, 0.0), 0
                    if cfg.checkpoint.every and iteration % cfg.checkpoint.every == 0 and iteration < last:
                        c0 = time.perf_counter()
                        self._save(backend, roles, iteration, env_steps, eval_return)
                        times["time_checkpoint"] += time.perf_counter() - c0
            except KeyboardInterrupt:
                interrupted = True
                print(f"\ninterrupted at iteration {iteration}: saving and stopping", flush=True)
            wall = time.perf_counter() - start - eval_time
            finished = iteration >= iterations and not interrupted
            report = solved or (self._evaluate(backend, roles, weights, iteration) if finished and cfg.eval.episodes > 0 else None)
            if report is not None:
                eval_return = report.mean_return
            self._save(backend, roles, iteration, env_steps, eval_return)
            sinks.close()
            return Summary(env_steps, iteration, wall, startup, str(self.run_dir), metrics, report, not finished,
                           env_steps - first_steps)
        finally:
            if sinks is not None:  # also when training failed: the console line ends, files are closed
                sinks.close()
            if started_ray:
                import ray

                ray.shutdown()

    def _create_roles(self, backend: Backend, iterations: int) -> Roles:
        cfg = self.config
        shards = [create_shard(backend, cfg, i) for i in range(cfg.shards.count)]
        if cfg.shards.max:  # elastic: let an autoscaler know how many shards the run could use
            backend.request_capacity(shard_request(cfg), cfg.shards.max)
        eval_count = cfg.eval.shards if (cfg.eval.episodes or cfg.eval.every or cfg.eval.every_steps) else 0
        eval_shards = [create_shard(backend, cfg, i, evaluation=True) for i in range(eval_count)]
        observation_spaces, action_space, max_episode_steps = backend.get(shards[0].call("spaces"))
        spaces = (observation_spaces, action_space)
        return Roles(shards, eval_shards, self._create_learner(backend, spaces, iterations), max_episode_steps, spaces)

    def _create_learner(self, backend: Backend, spaces: tuple, iterations: int) -> LearnerGroup:
        cfg = self.config
        return LearnerGroup(
            backend, cfg.learner.ranks, *spaces, cfg.model, cfg.algo, iterations, seed=cfg.seed, device=cfg.learner.device,
            options={"num_cpus": cfg.learner.num_cpus, "num_gpus": cfg.learner.num_gpus,
                     "resources": dict(cfg.learner.resources)},
        )

    def _collect(self, backend: Backend, roles: Roles, weights: Any) -> list[Any]:
        """Every shard's chunk of this iteration, as futures the learner resolves.

        The driver reads only each shard's small receipt. A shard whose process died (killed,
        node lost) is replaced and its part collected again, so the iteration's batch has its
        configured size and nothing is counted twice.
        """
        cfg = self.config
        if cfg.algo.name == "grpo":  # one episode per row, groups from shared starts
            args = ("rollout_groups", weights, cfg.algo.num_steps, cfg.algo.group_size)
        else:
            args = ("rollout", weights, cfg.algo.num_steps)
        futures = [shard.call_pair("collect", *args) for shard in roles.shards]
        chunks: list[Any] = [None] * len(futures)
        while True:
            for i, (chunk, receipt) in enumerate(futures):
                if chunks[i] is not None:
                    continue
                try:
                    backend.get(receipt)
                    chunks[i] = chunk
                except Exception as error:
                    if not backend.is_actor_failure(error):
                        raise
                    if alive(backend, roles.shards[i]):  # the shard is fine: its input, the weights, is lost
                        raise LearnerLost(f"shard {i} could not read the learner's weights: {error}") from error
                    if cfg.shards.max and len(roles.shards) > cfg.shards.count and backend.room_for(shard_request(cfg)) < 1:
                        print(f"raysim: elastic: shard {i} was lost with its node and there is no room for a "
                              f"replacement; continuing with {len(roles.shards) - 1} shards", flush=True)
                        del roles.shards[i], futures[i], chunks[i]
                        break  # the indices moved: look at the receipts again
                    self.faults += 1
                    if self.faults > cfg.shards.max_restarts:
                        raise RuntimeError(f"shard {i} died and {cfg.shards.max_restarts} shard restarts are used up "
                                           f"(shards.max_restarts): {error}") from error
                    print(f"raysim: fault: shard {i} died during its rollout ({type(error).__name__}); "
                          f"replaced it, collecting its part of the iteration again", flush=True)
                    roles.shards[i] = create_shard(backend, cfg, i, generation=self.faults)
                    futures[i] = roles.shards[i].call_pair("collect", *args)
            if all(chunk is not None for chunk in chunks):
                return chunks

    def _grow(self, backend: Backend, roles: Roles) -> None:
        """Elastic shards: at an iteration boundary, add shards for the room the cluster has now.

        The iteration's batch is then (current shards) x ``env.num_envs`` x ``algo.num_steps``: it
        grows and shrinks with the cluster, and the run stops once ``train.total_steps`` env steps
        were collected (the learning-rate schedule spans the iterations planned for ``shards.count``).
        """
        cfg = self.config
        add = min(backend.room_for(shard_request(cfg)), cfg.shards.max - len(roles.shards))
        for _ in range(add):
            roles.shards.append(create_shard(backend, cfg, self.next_shard_index))
            self.next_shard_index += 1
        if add > 0:
            print(f"raysim: elastic: added {add} shard(s) for new capacity; {len(roles.shards)} shards now", flush=True)

    def _restart_learner(self, backend: Backend, roles: Roles, iterations: int, error: Exception) -> tuple[int, int]:
        """A new learner group, restored from the newest checkpoint (or fresh when there is none)."""
        cfg = self.config
        self.learner_restarts += 1
        if self.learner_restarts > cfg.learner.max_restarts:
            raise RuntimeError(f"the learner died and {cfg.learner.max_restarts} restarts are used up "
                               f"(learner.max_restarts): {error}") from error
        for handle in roles.learner.handles:
            backend.kill(handle)
        roles.learner = self._create_learner(backend, roles.spaces, iterations)
        try:
            checkpoint, _, meta = load_latest(self.run_dir)
        except CheckpointError:
            print(f"raysim: fault: the learner died ({type(error).__name__}); no checkpoint yet: "
                  "restarted it from scratch", flush=True)
            return 0, 0
        roles.learner.load(str(checkpoint))
        print(f"raysim: fault: the learner died ({type(error).__name__}); restarted it from {checkpoint} "
              f"(iteration {meta['iteration']})", flush=True)
        return int(meta["iteration"]), int(meta["env_steps"])

    def _snapshot(self, roles: Roles) -> None:
        """Freeze the run's configs: ``gym.yaml`` (resources exported by the task) and ``train.yaml``."""
        env = to_dict(self.config.env)
        declared = {"id": env["id"], "kwargs": env["kwargs"]}
        exported = roles.learner.export_env(declared, str(self.run_dir / "resources"))
        write_snapshot(self.run_dir, self.config, exported)

    def _restore(self, backend: Backend, roles: Roles) -> tuple[int, int]:
        """Load the checkpoint on every learner rank and into the shards; returns the counters."""
        point = self.resume
        roles.learner.load(str(point.checkpoint))
        saved = point.state.get("shards") or []
        if len(saved) == len(roles.shards):
            modes = backend.get([s.call("set_state", state) for s, state in zip(roles.shards, saved)])
            how = "exactly" if all(m == "exact" for m in modes) else "; ".join(sorted(set(modes)))
        else:
            how = f"with fresh episodes ({len(saved)} shards saved, {len(roles.shards)} now)"
        iteration, env_steps = int(point.meta["iteration"]), int(point.meta["env_steps"])
        print(f"raysim: resuming {self.run_dir} from {point.checkpoint} (iteration {iteration}, "
              f"{env_steps:,} env steps); shards continue {how}", flush=True)
        return iteration, env_steps

    def _save(self, backend: Backend, roles: Roles, iteration: int, env_steps: int, eval_return: float | None) -> None:
        state = roles.learner.state_dict()
        state["shards"] = backend.get([s.call("get_state") for s in roles.shards])
        meta = {"env_steps": env_steps, "identity": self.identity, "canonical_env": self.canonical_env}
        if eval_return is not None:
            meta["eval_return"] = eval_return
        save_checkpoint(self.run_dir, iteration, state, meta, keep_last=self.config.checkpoint.keep_last)

    def _evaluate(self, backend: Backend, roles: Roles, weights: Any, iteration: int) -> EvalReport:
        cfg = self.config
        report = evaluate_on_shards(
            backend, lambda i: create_shard(backend, cfg, i, evaluation=True), roles.eval_shards,
            [cfg.eval.num_envs] * len(roles.eval_shards), weights, eval_spec(cfg, roles.max_episode_steps),
        )
        write_records(self.run_dir / "eval" / f"{iteration}.parquet", report.records)
        return report


TIMES = ("time_collect", "time_update", "time_eval", "time_checkpoint")  # seconds per iteration, by phase


def eval_metrics(report: EvalReport) -> dict[str, float]:
    """The metrics of an evaluation during training: mean return, and the success rate where defined."""
    metrics = {"eval_return": math.nan if report.mean_return is None else report.mean_return}
    rate = report.success_rate
    if rate is not None and rate.value is not None:
        metrics["eval_success_rate"] = rate.value
    return metrics


class LearnerLost(RuntimeError):
    """The learner's weights could not be read: its process died."""


def alive(backend: Backend, handle: Handle) -> bool:
    """Whether a shard's process still answers."""
    try:
        backend.get(handle.call("spaces"))
        return True
    except Exception as error:
        if backend.is_actor_failure(error):
            return False
        raise


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


def shard_request(config: Config) -> dict[str, float]:
    """The Ray resources one shard asks for."""
    return {"CPU": config.shards.num_cpus, **config.shards.resources}


def create_shard(backend: Backend, config: Config, index: int, evaluation: bool = False, generation: int = 0) -> Handle:
    """Training shard ``index`` (or evaluation shard ``index``) of ``config``.

    ``generation`` counts replacements of a shard that died: a replacement plays new episodes.
    """
    num_envs = config.eval.num_envs if evaluation else config.env.num_envs
    keys = (11 if evaluation else 10, index) + ((generation,) if generation else ())
    seed = derive_seed(config.eval.seed if evaluation else config.seed, *keys)
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


def eval_due(config: Config, iteration: int, steps_before: int, env_steps: int) -> bool:
    """Whether an evaluation follows this iteration: every ``eval.every`` iterations, and/or each
    time the env steps pass a multiple of ``eval.every_steps``."""
    cfg = config.eval
    by_iteration = bool(cfg.every) and iteration % cfg.every == 0
    by_steps = bool(cfg.every_steps) and env_steps // cfg.every_steps > steps_before // cfg.every_steps
    return by_iteration or by_steps


def steps_per_iteration(config: Config) -> int:
    """Env steps collected per iteration: shards x rows x chunk length.

    GRPO: a round lasts until every row finished its episode, so its length varies; this is then
    the least a round collects (one step per row), the loop stops once ``train.total_steps`` env
    steps were collected, and the linear lr schedule decays over this most-rounds horizon.
    """
    steps = 1 if config.algo.name == "grpo" else config.algo.num_steps
    return config.shards.count * config.env.num_envs * steps


def new_run_dir(config: Config) -> Path:
    """A new, empty run directory: ``run_dir``, or ``runs/<name>`` (suffixed when taken)."""
    base = Path(config.run_dir) if config.run_dir else Path("runs") / config.name
    path, n = base, 1
    while path.exists() and any(path.iterdir()):
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    (path / "configs").mkdir(parents=True, exist_ok=True)
    return path


def write_snapshot(run_dir: Path, config: Config, env: dict[str, Any]) -> None:
    """``configs/gym.yaml`` (the env, resource files relative to it, metadata verbatim) and
    ``configs/train.yaml`` (the whole run config, its env a component reference to gym.yaml)."""
    configs = run_dir / "configs"
    kwargs = relative_files(env["kwargs"], configs)
    gym = {"id": env["id"], "kwargs": kwargs, "metadata": config.env.metadata}
    train = to_dict(config)
    train["train"]["stop_after"] = None  # runtime-only: a resume runs to the end unless told otherwise
    train["env"] = {"component": "gym.yaml", "num_envs": config.env.num_envs, "on_nonfinite": config.env.on_nonfinite}
    for name, data in (("gym.yaml", gym), ("train.yaml", train)):
        tmp = configs / f".{name}.tmp"
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, configs / name)


def relative_files(value: Any, base: Path) -> Any:
    """Every ``{file: PATH}`` made relative to ``base`` (so the run directory can move)."""
    if isinstance(value, dict):
        if set(value) == {"file"}:
            return {"file": os.path.relpath(value["file"], base)}
        return {k: relative_files(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_files(v, base) for v in value]
    return value
