"""RLlib's PPO on its new API stack: the peer of ``raysim bench rllib`` (CartPole-v1, Hopper-v5, Meta-World reach-v3).

It runs in RLlib's own environment (``benchmarks/rllib/requirements.txt``: ``ray[rllib]`` of raysim's Ray pins
gymnasium 1.2.2), never imports raysim, and builds ``PPOConfig().environment(...).env_runners(...).learners(...)``
from the settings of RLlib's own examples for the task (``TUNED`` below: the files of Ray's repository they come
from are named there; Meta-World has no RLlib example, so reach-v3 takes the MuJoCo one). The options after
``--align`` replace the example's values with raysim's (``raysim bench rllib`` passes those of raysim's packaged
config: env count, rollout length, network, minibatches, epochs, learning rate and its schedule); without them the
example's values stay (``--settings tuned`` in the bench). Placement is always raysim's: ``--env-runners`` runners
of ``--cpus-per-runner`` CPUs each (one per raysim shard, ``shards.num_cpus``), one learner in its own process
(``num_learners=1``), Ray told ``max(cores, what the roles ask)`` CPUs, no dashboard, as raysim's embedded Ray.

Measured the way raysim's side is: the training seconds are the sum of ``algo.train()`` calls (Ray's start-up and
the build of the algorithm, its env runners and learner, are ``startup_seconds``; evaluation is excluded);
``--eval-every`` evaluates ``--eval-episodes`` deterministic episodes (``explore=False``: the argmax or the Gaussian
mean) on RLlib's local evaluation env runner (in this process) each time the env steps pass a multiple of it, and
``--solve`` stops at the first evaluation whose mean return reaches it; at the end of the budget (unsolved) a final
evaluation of the same episodes. Success (Meta-World's ``info["success"]`` at any step) is counted per episode.

Output, JSON lines on stdout: ``{"event": "startup"}``, one ``{"event": "iteration"}`` per ``train()``, one
``{"event": "eval"}`` per evaluation, then ``{"event": "result"}`` with the run's figures (steady env steps/s: the
env steps over the training seconds after ``--warmup`` iterations). Progress and RLlib's own logs go to stderr.

    /work/rllib-venv/bin/python benchmarks/rllib_ppo.py --task cartpole --steps 40000 --solve 475 --eval-every 10000
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import importlib.metadata
import json
import math
import os
import pstats
import statistics
import sys
import time
from typing import Any

TASKS = ("cartpole", "hopper", "reach")
METAWORLD_ENV = "raysim-bench-metaworld"  # the name the Meta-World creator is registered under

# RLlib's examples at Ray 2.60 (rllib/examples/algorithms/ppo/ in Ray's repository): cartpole_ppo.py for CartPole,
# mujoco_ppo.py (new API stack, observation filter, gradient clipping) for Hopper and, as no Meta-World example
# exists, for reach-v3. Keys left out take PPOConfig's defaults (``defaults()`` lists them in the result).
TUNED: dict[str, dict[str, Any]] = {
    "cartpole": {
        "example": "rllib/examples/algorithms/ppo/cartpole_ppo.py",
        "env": "CartPole-v1",
        "num_envs_per_env_runner": 16,
        "rollout_fragment_length": "auto",
        "train_batch_size_per_learner": 4000,  # PPOConfig's train_batch_size (the example keeps it)
        "minibatch_size": 128,  # PPOConfig's default
        "num_epochs": 6,
        "lr": 3e-4,
        "training": {"vf_loss_coeff": 0.01},
        "model": {"fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True},
        "obs_filter": False,
        "eval_envs": 1,
    },
    "hopper": {
        "example": "rllib/examples/algorithms/ppo/mujoco_ppo.py",
        "env": "Hopper-v5",
        "num_envs_per_env_runner": 16,
        "rollout_fragment_length": 32,
        "train_batch_size_per_learner": 2048,
        "minibatch_size": 512,
        "num_epochs": 10,
        "lr": 3e-4,
        "training": {
            "vf_loss_coeff": 1.0,
            "entropy_coeff": [[0, 0.01], [2_000_000, 0.0]],
            "gamma": 0.99,
            "lambda_": 0.95,
            "kl_coeff": 0.5,
            "clip_param": 0.2,
            "vf_clip_param": 10.0,
            "grad_clip": 50.0,
            "grad_clip_by": "global_norm",
        },
        "model": {
            "vf_share_layers": False,
            "fcnet_hiddens": [256, 256],
            "fcnet_kernel_initializer": "orthogonal_",
            "fcnet_activation": "tanh",
            "head_fcnet_hiddens": [256],
            "head_fcnet_activation": None,
            "free_log_std": True,
        },
        "obs_filter": True,
        "eval_envs": 1,
    },
}
TUNED["reach"] = {
    **TUNED["hopper"],
    "env": METAWORLD_ENV,
    "example": "none for Meta-World: mujoco_ppo.py's",
    "eval_envs": 10,
}
TASK_ENV = {"cartpole": "CartPole-v1", "hopper": "Hopper-v5", "reach": "Meta-World/MT1 reach-v3"}
VERSIONS = ("ray", "torch", "gymnasium", "mujoco", "metaworld", "numpy")


def emit(line: dict) -> None:
    """One JSON line on stdout (the bench reads them), flushed at once."""
    print(json.dumps(line), flush=True)


def make_metaworld(env_config):
    """Meta-World's MT1 task through Gymnasium (``gymnasium.make("Meta-World/MT1", env_name=...)``: a goal of the
    task's 50 drawn at each reset, no termination on success), seeded by the run's seed and the env's place."""
    import gymnasium as gym
    import metaworld  # noqa: F401 - registers the Meta-World ids

    place = 1000 * getattr(env_config, "worker_index", 0) + getattr(env_config, "vector_index", 0)
    return gym.make("Meta-World/MT1", env_name=env_config["task"], seed=env_config["seed"] + place)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The task's example settings, with raysim's values where the command line gives them (``aligned``)."""
    chosen = copy.deepcopy(TUNED[args.task])
    given = {"num_envs_per_env_runner": args.envs_per_runner, "rollout_fragment_length": args.rollout}
    aligned: dict[str, Any] = {key: value for key, value in given.items() if value is not None}
    if args.epochs is not None:
        aligned["num_epochs"] = args.epochs
    if args.rollout is not None:  # the batch of one iteration: every runner's rollout of every env
        envs = aligned.get("num_envs_per_env_runner", chosen["num_envs_per_env_runner"])
        aligned["train_batch_size_per_learner"] = args.rollout * args.env_runners * envs
    if args.minibatches is not None:
        batch = aligned.get("train_batch_size_per_learner", chosen["train_batch_size_per_learner"])
        aligned["minibatch_size"] = batch // args.minibatches
    if args.lr is not None:  # RLlib's schedule: (env steps, value) points, linear between them
        aligned["lr"] = args.lr if args.lr_schedule == "constant" else [[0, args.lr], [args.steps, 0.0]]
    if args.hidden is not None:  # raysim's networks: an MLP each for actor and critic, a linear head on each
        aligned["model"] = {
            "fcnet_hiddens": args.hidden,
            "fcnet_activation": args.activation,
            "vf_share_layers": False,
            "head_fcnet_hiddens": [],
        }
    chosen.update({key: value for key, value in aligned.items() if key != "model"})
    chosen["model"].update(aligned.get("model", {}))
    return {**chosen, "aligned": aligned}


class EvaluationEpisodes:
    """Collects the evaluation episodes of RLlib's local evaluation env runner (this process): return, success."""

    episodes: list[tuple[float, bool]] = []

    @classmethod
    def callbacks(cls):
        from ray.rllib.callbacks.callbacks import RLlibCallback

        class Recorder(RLlibCallback):
            def on_episode_end(self, *, episode, prev_episode_chunks=None, env_runner=None, **kwargs) -> None:
                if env_runner is None or not env_runner.config.in_evaluation:
                    return
                chunks = [*(prev_episode_chunks or []), episode]
                infos = [info for chunk in chunks for info in chunk.get_infos()]
                success = any(bool(info.get("success", 0)) for info in infos if isinstance(info, dict))
                cls.episodes.append((float(sum(chunk.get_return() for chunk in chunks)), success))

        return Recorder


def build_config(args: argparse.Namespace, chosen: dict[str, Any]):
    """``PPOConfig`` of the chosen settings, placed as raysim places its roles."""
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    model = dict(chosen["model"])
    if model.get("fcnet_kernel_initializer") == "orthogonal_":
        model["fcnet_kernel_initializer"] = torch.nn.init.orthogonal_
    runners = {
        "num_env_runners": 0 if args.profile else args.env_runners,
        "num_envs_per_env_runner": chosen["num_envs_per_env_runner"],
        "num_cpus_per_env_runner": args.cpus_per_runner,
        "rollout_fragment_length": chosen["rollout_fragment_length"],
    }
    if chosen["obs_filter"]:
        runners["env_to_module_connector"] = lambda env, spaces, device: MeanStdFilter()
    env_config = {"task": "reach-v3", "seed": args.seed} if args.task == "reach" else {}
    config = (
        PPOConfig()
        .environment(chosen["env"], env_config=env_config)
        .env_runners(**runners)
        .learners(num_learners=0 if args.profile else 1, num_cpus_per_learner=1)
        .training(
            train_batch_size_per_learner=chosen["train_batch_size_per_learner"],
            minibatch_size=chosen["minibatch_size"],
            num_epochs=chosen["num_epochs"],
            lr=chosen["lr"],
            **chosen["training"],
        )
        .rl_module(model_config=DefaultModelConfig(**model))
        .reporting(metrics_num_episodes_for_smoothing=10)  # the return of the last 10 training episodes
        .callbacks(EvaluationEpisodes.callbacks())
        .debugging(seed=args.seed)
    )
    if args.eval_episodes:
        config.evaluation(
            evaluation_interval=10**9,  # creates the evaluation env runner; this script decides when to evaluate
            evaluation_num_env_runners=0,  # the local one, in this process
            evaluation_duration=args.eval_episodes,
            evaluation_duration_unit="episodes",
            evaluation_config=PPOConfig.overrides(explore=False, num_envs_per_env_runner=chosen["eval_envs"]),
        )
    return config


def start(args: argparse.Namespace, chosen: dict[str, Any]):
    """Ray (as raysim's embedded one: no dashboard, room for every role) and the algorithm; its seconds."""
    import ray

    begin = time.perf_counter()
    wanted = args.env_runners * args.cpus_per_runner + 1  # the runners and the learner
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(wanted)), include_dashboard=False)
    if args.task == "reach":
        from ray.tune.registry import register_env

        register_env(METAWORLD_ENV, make_metaworld)
    algo = build_config(args, chosen).build_algo()
    return algo, time.perf_counter() - begin


def evaluate(algo) -> dict[str, Any]:
    """The deterministic evaluation of ``--eval-episodes`` episodes (RLlib's ``Algorithm.evaluate``). The local
    evaluation env runner is first given the training runners' merged connector state (the observation filter's
    statistics): RLlib syncs it only to remote evaluation runners, and a fresh filter feeds the policy observations
    it never saw (Hopper's evaluation returned 2.0 where its training episodes returned 487)."""
    from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR

    EvaluationEpisodes.episodes.clear()
    begin = time.perf_counter()
    # the local training runner holds the training runners' merged state (RLlib broadcasts it there every step)
    algo.eval_env_runner.set_state(algo.env_runner.get_state(components=COMPONENT_ENV_TO_MODULE_CONNECTOR))
    algo.evaluate()
    returns = [r for r, _ in EvaluationEpisodes.episodes]
    return {
        "episodes": len(returns),
        "mean_return": statistics.fmean(returns) if returns else None,
        "std_return": statistics.pstdev(returns) if returns else None,
        "successes": sum(s for _, s in EvaluationEpisodes.episodes),
        "eval_seconds": time.perf_counter() - begin,
    }


def env_steps_of(algo) -> int:
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    return int(algo.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0))


def train(algo, args: argparse.Namespace) -> dict[str, Any]:
    """``train()`` until the budget or a passing evaluation; the iterations and evaluations on the way."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EPISODE_RETURN_MEAN

    seconds, iterations, evals, solved = 0.0, [], [], None
    next_eval = args.eval_every or None
    while env_steps_of(algo) < args.steps and solved is None:
        begin = time.perf_counter()
        result = algo.train()
        seconds += time.perf_counter() - begin
        steps = env_steps_of(algo)
        episode_return = result.get(ENV_RUNNER_RESULTS, {}).get(EPISODE_RETURN_MEAN)
        episode_return = None if episode_return is None or math.isnan(episode_return) else float(episode_return)
        iterations.append([steps, seconds, episode_return])
        emit({"event": "iteration", "env_steps": steps, "train_seconds": seconds, "episode_return": episode_return})
        if next_eval is not None and steps >= next_eval:
            report = {"env_steps": steps, "train_seconds": seconds, **evaluate(algo)}
            evals.append(report)
            emit({"event": "eval", **report})
            next_eval = (steps // args.eval_every + 1) * args.eval_every
            if args.solve is not None and report["mean_return"] is not None and report["mean_return"] >= args.solve:
                solved = report
    if args.eval_episodes and (not evals or evals[-1]["env_steps"] != env_steps_of(algo)):
        evals.append({"env_steps": env_steps_of(algo), "train_seconds": seconds, **evaluate(algo)})
        emit({"event": "eval", **evals[-1]})
    return {"train_seconds": seconds, "iterations": iterations, "evals": evals, "solved": solved}


def steady(iterations: list[list], warmup: int) -> float | None:
    """Env steps per training second after the first ``warmup`` iterations (all of them where the run is shorter)."""
    if not iterations:
        return None
    first = iterations[warmup - 1] if 0 < warmup < len(iterations) else [0, 0.0]
    steps, seconds = iterations[-1][0] - first[0], iterations[-1][1] - first[1]
    return steps / seconds if seconds > 0 else None


def versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def result_line(args: argparse.Namespace, chosen: dict[str, Any], startup: float, run: dict[str, Any]) -> dict:
    """The run's figures: what ``raysim bench rllib`` records for each side."""
    final = run["evals"][-1] if run["evals"] else {"episodes": 0, "mean_return": None, "std_return": None}
    returns = [r for _, _, r in run["iterations"] if r is not None]
    solved = run["solved"]
    return {
        "event": "result",
        "task": args.task,
        "env": TASK_ENV[args.task],
        "seed": args.seed,
        "steps": args.steps,
        "env_steps": run["iterations"][-1][0] if run["iterations"] else 0,
        "iterations": len(run["iterations"]),
        "startup_seconds": startup,
        "train_seconds": run["train_seconds"],
        "steady_steps_per_s": steady(run["iterations"], args.warmup),
        "warmup_iterations": args.warmup,
        "solved": None if args.solve is None else solved is not None,
        "solve_env_steps": solved["env_steps"] if solved else None,
        "solve_seconds": solved["train_seconds"] if solved else None,
        "evals": [[e["env_steps"], e["train_seconds"], e["mean_return"]] for e in run["evals"]],
        "eval_episodes": final["episodes"],
        "eval_mean": final["mean_return"],
        "eval_std": final["std_return"],
        "eval_successes": final.get("successes") if args.task == "reach" else None,
        "training_return": returns[-1] if returns else None,
        "curve": run["iterations"],
        "config": {k: v for k, v in chosen.items() if k != "aligned"},
        "aligned": chosen["aligned"],
        "versions": versions(),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=TASKS, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, required=True, help="env step budget")
    parser.add_argument("--env-runners", type=int, default=1, help="env runners (raysim: shards.count)")
    parser.add_argument("--cpus-per-runner", type=float, default=1.0, help="num_cpus_per_env_runner (shards.num_cpus)")
    parser.add_argument("--eval-episodes", type=int, default=100, help="deterministic episodes per evaluation")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every this many env steps (0: at the end)")
    parser.add_argument("--solve", type=float, default=None, help="stop at the first evaluation with this mean return")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the steady env steps/s")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="the env runner and the learner in this process (num_env_runners=0, num_learners=0) under cProfile: "
        "print its N costliest functions by cumulative time to stderr (where RLlib's time goes, not its speed: "
        "no result line)",
    )
    align = parser.add_argument_group("--align", "raysim's values in place of the example's (none: the example's)")
    align.add_argument("--envs-per-runner", type=int, help="num_envs_per_env_runner (raysim: env.num_envs)")
    align.add_argument("--rollout", type=int, help="rollout_fragment_length (algo.num_steps); the batch follows")
    align.add_argument("--minibatches", type=int, help="minibatches per epoch (algo.num_minibatches)")
    align.add_argument("--epochs", type=int, help="num_epochs (algo.update_epochs)")
    align.add_argument("--lr", type=float, help="learning rate (algo.lr)")
    align.add_argument("--lr-schedule", choices=("constant", "linear"), default="constant", help="linear: to 0")
    align.add_argument("--hidden", type=int, nargs="+", help="fcnet_hiddens, actor and critic apart")
    align.add_argument("--activation", default="tanh", help="fcnet_activation (with --hidden)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    chosen = settings(args)
    algo, startup = start(args, chosen)
    emit({"event": "startup", "startup_seconds": startup})
    profile = cProfile.Profile() if args.profile else None
    try:
        run = train(algo, args) if profile is None else profile.runcall(train, algo, args)
    finally:
        algo.stop()
        import ray

        ray.shutdown()
    if profile is not None:  # the roles in this process, under the profiler: no figures to record
        pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(args.profile)
    else:
        emit(result_line(args, chosen, startup, run))
    print(f"[rllib {args.task} seed {args.seed}: done]", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
