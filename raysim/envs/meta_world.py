"""``raysim/MetaWorld``: Meta-World's Sawyer tasks as a native batched env, one ``SawyerXYZEnv`` per row.

Needs the ``metaworld`` package (``pip install "raysim[metaworld]"``; it pins MuJoCo 3.3).

Tasks. ``benchmark: MT1`` with one task (``tasks: reach-v3``), ``MT10`` or ``MT50`` (their task lists, in
Meta-World's order), or ``benchmark: null`` with an explicit ``tasks`` list. Row ``i`` plays task
``i mod K`` (K tasks), so ``num_envs`` must be a multiple of K; with K > 1 the ``policy`` group ends with
the one-hot task id (as Meta-World's MT wrappers append it). The task list is part of the env identity.

Goals: **the reset seed picks them**, unlike Meta-World's own ``reset`` (which ignores its seed):

- ``goals: benchmark``: one of the benchmark's 50 goal variations of the row's task (Meta-World's
  ``MT1`` / ``MT10`` / ``MT50`` built with ``benchmark_seed``; an explicit list takes each task's
  ``MT1``), chosen by the seed. The table ``goal_table`` [K, 50, D] (NaN-padded) is built once, in the
  driver (``materialize``, cached per process), and shipped to the shards as a task resource;
- ``goals: sampled``: a goal drawn from the task's own goal space by a generator seeded from the reset
  seed (Meta-World's ``seeded_rand_vec`` path, its own redraws of invalid goals included), so every
  evaluation episode is distinct.

Each row's episode starts from one 63-bit seed: the ``reset_rows`` seed's generator draws it (equal
seeds, equal goals and initial states), and auto-resets draw it from the env's generator. Meta-World's
own reset is deterministic given the goal vector (it resets MuJoCo's data and re-runs the hand).

Episodes. ``max_episode_steps`` (500, Meta-World's ``max_path_length``) truncates. ``success`` in the
report is Meta-World's ``info["success"]`` set **at any step** of the episode (the benchmark's count), or
the flag at the last step under ``env.success: final`` (``count_success``). ``end_on_success``: an episode
terminates at its first success (Meta-World's evaluation protocol). Reward: Meta-World's dense reward, of
``reward_version`` (v2, or v1); or, with ``reward: success``, a sparse success reward: 1 at the step the
episode first succeeds, 0 at every other (with ``end_on_success``, the step it ends), as GRPO fine-tuning on
success uses it. Both are options of the task, so part of the env identity.

Observations: ``policy``, Meta-World's 39 values (hand, gripper, objects, the previous frame's, the
goal: goal-observable as in the MT benchmarks) as float32, then the one-hot task id when K > 1.
Actions ``[N, 4]`` in ``[-1, 1]`` (clipped). Checkpoints: a row's state is its episode's seed and the actions
it took so far; ``set_state`` replays them (MuJoCo is deterministic), so a resumed shard continues exactly.
``expert_actions()``: Meta-World's scripted expert of each row's task (``metaworld.policies``) in the state the row
is in, clipped into [-1, 1] (what the env receives, and what a dataset of the expert records), for ``raysim eval
--policy expert`` and ``raysim demos record --policy expert``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import pickle
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec

from raysim.envs.contract import Obs
from raysim.envs.errors import MissingDependencyError
from raysim.envs.torch_env import TorchEnv

ENV_ID = "raysim/MetaWorld"
INSTALL = 'pip install "raysim[metaworld]"'
BENCHMARKS = ("MT1", "MT10", "MT50")
GOALS = ("benchmark", "sampled")
REWARD_VERSIONS = ("v1", "v2")
REWARDS = ("dense", "success")  # Meta-World's shaped reward (of reward_version), or 1 at the first success
NUM_GOALS = 50  # Meta-World's goal variations per task
OBS_SIZE = 39


def import_metaworld() -> Any:
    """The ``metaworld`` package; a ``MissingDependencyError`` naming the extra when it is not installed."""
    try:
        import metaworld
    except ImportError as error:
        raise MissingDependencyError(f"{ENV_ID} needs metaworld, which is not installed: {INSTALL}") from error
    return metaworld


def task_list(benchmark: str | None, tasks: str | Sequence[str] | None) -> list[str]:
    """The tasks of ``benchmark`` / ``tasks``, checked (a ``ValueError`` in one line otherwise)."""
    import_metaworld()
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT50_V3

    names = [tasks] if isinstance(tasks, str) else (None if tasks is None else list(tasks))
    if benchmark is not None and benchmark not in BENCHMARKS:
        raise ValueError(f"{ENV_ID}: benchmark must be one of {list(BENCHMARKS)} or null, got {benchmark!r}")
    if benchmark in ("MT10", "MT50"):
        listed = list(MT10_V3 if benchmark == "MT10" else MT50_V3)
        if names is not None and names != listed:
            raise ValueError(f"{ENV_ID}: {benchmark} has its own tasks; leave tasks out (or use benchmark null)")
        return listed
    if benchmark == "MT1" and (names is None or len(names) != 1):
        raise ValueError(f"{ENV_ID}: benchmark MT1 takes one task (tasks: [reach-v3]), got {tasks!r}")
    if not names:
        raise ValueError(f"{ENV_ID}: name the tasks (tasks: [reach-v3, push-v3]) or a benchmark (MT10, MT50)")
    unknown = [n for n in names if n not in ALL_V3_ENVIRONMENTS]
    if unknown:
        raise ValueError(f"{ENV_ID}: {unknown_tasks(unknown, sorted(ALL_V3_ENVIRONMENTS))}")
    if len(set(names)) != len(names):
        raise ValueError(f"{ENV_ID}: tasks must be distinct, got {names}")
    return names


def unknown_tasks(unknown: list[str], valid: list[str]) -> str:
    """Which task names are not Meta-World's, each with the closest one; all of them when one has none close."""
    close = [difflib.get_close_matches(str(name), valid, n=1) for name in unknown]
    if not all(close):
        return f"unknown tasks {unknown}; Meta-World's v3 tasks: {valid}"
    if len(unknown) == 1:
        return f"unknown task {unknown[0]!r}; did you mean {close[0][0]!r}?"
    return "unknown tasks " + ", ".join(f"{n!r} (did you mean {c[0]!r}?)" for n, c in zip(unknown, close, strict=True))


@functools.cache
def _goal_table(benchmark: str | None, tasks: tuple[str, ...], seed: int) -> np.ndarray:
    """The benchmark's 50 goal vectors of each task, [K, 50, D] float64 (NaN past a task's own length)."""
    metaworld = import_metaworld()
    if benchmark in ("MT10", "MT50"):
        built = getattr(metaworld, benchmark)(seed=seed).train_tasks
    else:
        built = [task for name in tasks for task in metaworld.MT1(name, seed=seed).train_tasks]
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in tasks}
    for task in built:
        vectors[task.env_name].append(np.asarray(pickle.loads(task.data)["rand_vec"], dtype=np.float64))
    width = max(len(v) for rows in vectors.values() for v in rows)
    table = np.full((len(tasks), NUM_GOALS, width), np.nan)
    for k, name in enumerate(tasks):
        for j, vector in enumerate(vectors[name]):
            table[k, j, : len(vector)] = vector
    table.setflags(write=False)
    return table


class MetaWorld(TorchEnv):
    """``raysim/MetaWorld``: Meta-World's Sawyer tasks over the rows (task = row mod K); see the module."""

    env_id = ENV_ID
    defines_success = True
    success_count = "any"  # the benchmark's count; ``env.success: final`` reads the flag at the last step
    #: a row's state is its episode's seed and the actions it took (``set_state`` replays them)
    state_keys = ("episode_seed", "actions_taken", "succeeded", "success_now")

    def __init__(
        self,
        num_envs: int,
        seed: int | None = None,
        benchmark: str | None = "MT1",
        tasks: str | Sequence[str] | None = None,
        goals: str = "benchmark",
        benchmark_seed: int = 0,
        goal_table: Any = None,
        max_episode_steps: int = 500,
        end_on_success: bool = False,
        reward_version: str = "v2",
        reward: str = "dense",
        device: str = "cpu",
    ):
        super().__init__(num_envs, seed, max_episode_steps, device)
        options = self.materialize(
            dict(benchmark=benchmark, tasks=tasks, goals=goals, benchmark_seed=benchmark_seed, goal_table=goal_table)
        )
        self.task_names = tuple(options["tasks"])
        K = len(self.task_names)
        if self.num_envs % K:
            raise ValueError(
                f"{ENV_ID}: num_envs {self.num_envs} is not a multiple of the {K} tasks (row i plays task i mod {K})"
            )
        if reward_version not in REWARD_VERSIONS:
            raise ValueError(f"{ENV_ID}: reward_version must be one of {list(REWARD_VERSIONS)}, got {reward_version!r}")
        if not isinstance(end_on_success, bool):
            raise ValueError(f"{ENV_ID}: end_on_success must be true or false, got {end_on_success!r}")
        if reward not in REWARDS:
            raise ValueError(f"{ENV_ID}: reward must be one of {list(REWARDS)}, got {reward!r}")
        self.goals, self.end_on_success, self.sparse = goals, end_on_success, reward == "success"
        self.goal_table = options["goal_table"]
        self.distinct_episodes = None if self.goal_table is None else NUM_GOALS  # the start state follows the goal
        self.task_of_row = torch.arange(self.num_envs) % K
        self.envs = [self._build(self.task_names[k], reward_version) for k in self.task_of_row.tolist()]

        N, width = self.num_envs, OBS_SIZE + (K if K > 1 else 0)
        self.obs = torch.zeros(N, width)
        if K > 1:
            self.obs[torch.arange(N), OBS_SIZE + self.task_of_row] = 1.0
        self.succeeded = torch.zeros(N, dtype=torch.bool)  # at any step of the running episode
        self.success_now = torch.zeros(N, dtype=torch.bool)  # at its latest step
        self.episode_seed = torch.zeros(N, dtype=torch.int64)  # each row's running episode started from it
        self.actions_taken = torch.zeros(N, self.max_episode_steps, 4)  # and took these actions (clipped)
        space = self.envs[0].sawyer_observation_space  # goal-observable bounds
        low = np.concatenate([space.low, np.zeros(width - OBS_SIZE)]).astype(np.float32)
        high = np.concatenate([space.high, np.ones(width - OBS_SIZE)]).astype(np.float32)
        self.observation_spaces = {"policy": gym.spaces.Box(low, high, dtype=np.float32)}
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.reset(seed)

    @classmethod
    def materialize(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The canonical options (its own copy): ``tasks`` as the full list, and for ``goals: benchmark`` the
        goal table as an array (built once per process; ``{file: ...}`` read; an array kept)."""
        benchmark = options.get("benchmark", "MT1")
        options["tasks"] = tasks = task_list(benchmark, options.get("tasks"))
        goals = options.get("goals", "benchmark")
        if goals not in GOALS:
            raise ValueError(f"{ENV_ID}: goals must be one of {list(GOALS)}, got {goals!r}")
        table = options.get("goal_table")
        if goals == "sampled":
            table = None
        elif isinstance(table, dict) and "file" in table:
            table = np.load(table["file"])
        elif table is None:
            table = _goal_table(benchmark, tuple(tasks), int(options.get("benchmark_seed", 0)))
        else:
            table = np.asarray(table, dtype=np.float64)
        if table is not None and (table.ndim != 3 or table.shape[:2] != (len(tasks), NUM_GOALS)):
            raise ValueError(f"{ENV_ID}: goal_table must be [{len(tasks)}, {NUM_GOALS}, D], got {table.shape}")
        options["goal_table"] = table
        return options

    @classmethod
    def gymnasium_spec(cls, options: dict[str, Any]) -> EnvSpec | None:
        """Meta-World's own Gymnasium env of a one-task config, as ``gymnasium.make("Meta-World/MT1",
        env_name=task, seed=benchmark_seed, ...)`` builds it (its registered entry point is a lambda, which a spec
        cannot store: the spec names the function it calls), or None for several tasks (``Meta-World/MT10`` is a
        vector env only). It plays the benchmark's 50 goals of the task, whatever ``goals`` says; the step limit,
        ``end_on_success`` and ``reward_version`` are passed on; its observations are the 39 values."""
        options = {**{k: p.default for k, p in inspect.signature(cls).parameters.items()}, **options}
        tasks = task_list(options["benchmark"], options["tasks"])
        if len(tasks) != 1:
            return None
        kwargs = {
            "name": tasks[0],
            "seed": int(options["benchmark_seed"]),
            "max_episode_steps": int(options["max_episode_steps"]),
            "terminate_on_success": bool(options["end_on_success"]),
            "reward_function_version": options["reward_version"],
        }
        return EnvSpec("Meta-World/MT1", entry_point="metaworld:make_mt_envs", kwargs=kwargs)

    @classmethod
    def row_multiple(cls, options: dict[str, Any]) -> int:
        """Row counts must be multiples of this: the number of tasks."""
        return len(task_list(options.get("benchmark", "MT1"), options.get("tasks")))

    def _build(self, name: str, reward_version: str) -> Any:
        """One Sawyer env of task ``name``, goal-observable (as in the MT benchmarks), allowed the step limit."""
        import_metaworld()
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS
        from metaworld.types import Task

        cls = ALL_V3_ENVIRONMENTS[name]
        env = cls(reward_function_version=reward_version)
        data = {"env_cls": cls, "rand_vec": np.zeros(0), "partially_observable": False}
        env.set_task(Task(env_name=name, data=pickle.dumps(data)))  # observability; the goal is set per reset
        env.max_path_length = self.max_episode_steps  # the row is reset at raysim's limit, never stepped past it
        return env

    # -- TorchEnv ----------------------------------------------------------------------------

    def _reset_state(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        seeds = torch.randint(0, 2**63 - 1, (rows.numel(),), generator=generator, dtype=torch.int64)
        for row, seed in zip(rows.tolist(), seeds.tolist(), strict=True):
            self._reset_row(row, seed)
        self.succeeded[rows] = False
        self.success_now[rows] = False

    def _reset_row(self, row: int, seed: int) -> None:
        """Start row ``row``'s episode from ``seed``: the goal (and so the initial state) is the seed's."""
        env, rng = self.envs[row], np.random.default_rng(seed)
        self.episode_seed[row] = seed
        if self.goal_table is None:  # Meta-World's own draw from the task's goal space, on our generator
            env._freeze_rand_vec, env.seeded_rand_vec, env.np_random = False, True, rng
        else:
            vector = self.goal_table[int(self.task_of_row[row]), int(rng.integers(NUM_GOALS))]
            env._freeze_rand_vec, env._last_rand_vec = True, vector[~np.isnan(vector)].copy()
        self.obs.numpy()[row, :OBS_SIZE] = env.reset()[0]  # the tensor's memory, cast to float32

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action = actions.detach().to("cpu", torch.float32).clamp(-1.0, 1.0).numpy()
        # the tensors' memory, written in place through NumPy (cheaper than torch indexing for a few rows)
        self.actions_taken.numpy()[self._all_rows.numpy(), self.episode_length.numpy()] = action
        reward = np.zeros(self.num_envs, dtype=np.float32)
        success = self.success_now.numpy()  # every row's flag at this step
        obs = self.obs.numpy()  # rows cast to float32
        for row, env in enumerate(self.envs):
            obs[row, :OBS_SIZE], reward[row], _, _, info = env.step(action[row])
            success[row] = bool(info["success"])
        if self.sparse:  # 1 at the episode's first success
            reward = (self.success_now & ~self.succeeded).numpy().astype(np.float32)
        self.succeeded |= self.success_now
        terminated = self.success_now.clone() if self.end_on_success else torch.zeros_like(self.success_now)
        return torch.from_numpy(reward), terminated

    def _observe(self) -> Obs:
        return {"policy": self.obs}

    def _episode_report(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        flags = self.succeeded if self.success_count == "any" else self.success_now
        return {"success": flags.index_select(0, rows), "task": self.task_of_row.index_select(0, rows)}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a ``get_state`` result (counters, success flags, generator), then replay every row's episode from
        its seed with the actions it took (MuJoCo is deterministic: the same states, bitwise)."""
        super().set_state(state)
        for row, env in enumerate(self.envs):
            self._reset_row(row, int(self.episode_seed[row]))
            for action in self.actions_taken[row, : int(self.episode_length[row])].numpy():
                self.obs.numpy()[row, :OBS_SIZE] = env.step(action)[0]

    @functools.cached_property
    def experts(self) -> list[Any]:
        """Meta-World's scripted expert of each task (``metaworld.policies``), by task index."""
        from metaworld.policies import ENV_POLICY_MAP

        return [ENV_POLICY_MAP[name]() for name in self.task_names]

    def expert_actions(self) -> torch.Tensor:
        """The scripted expert's action [N, 4] for every row: its task's expert on the row's 39 values (without the
        one-hot task id), as the policy observes them (``raysim eval --policy expert``), clipped into [-1, 1] as
        the env receives it (the experts' own go up to about 2.5): what a dataset of the expert records."""
        obs = self.obs[:, :OBS_SIZE].double().numpy()
        experts = self.experts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the experts' "Constant(s) may be too high", every step
            actions = [experts[k].get_action(obs[row]) for row, k in enumerate(self.task_of_row.tolist())]
        return torch.from_numpy(np.stack(actions)).float().clamp_(-1.0, 1.0)

    def close(self) -> None:
        for env in self.envs:
            env.close()
