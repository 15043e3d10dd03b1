"""``raysim/MetaWorld``: Meta-World's Sawyer tasks as a native batched env (needs ``raysim[metaworld]``).

Each test builds few rows (a Sawyer env costs ~0.2 s) and plays short episodes.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch

from raysim.envs import make
from raysim.envs.errors import MissingDependencyError, UnknownEnvError

pytest.importorskip("metaworld")

ENV = "raysim/MetaWorld"


def expert_episode(env, row_seeds: list[int], steps: int) -> list:
    """Play the push-v3 expert (``metaworld.policies``) in every row from ``row_seeds`` for ``steps`` steps;
    the steps in which episodes ended, in order."""
    from metaworld.policies import ENV_POLICY_MAP

    policy = ENV_POLICY_MAP["push-v3"]()
    obs = env.reset_rows(torch.arange(env.num_envs), row_seeds)["policy"]
    ended = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the expert's "Constant(s) may be too high"
        for _ in range(steps):
            actions = np.stack([policy.get_action(row[:39].numpy().astype(np.float64)) for row in obs])
            step = env.step(torch.as_tensor(actions, dtype=torch.float32))
            obs = step.obs["policy"]
            if step.done_rows.numel():
                ended.append(step)
    return ended


@pytest.mark.parametrize("goals", ["benchmark", "sampled"])
def test_a_row_reset_from_a_seed_is_exact_whatever_the_row_its_history_or_the_layout(goals):
    env = make(ENV, 3, seed=0, tasks="push-v3", goals=goals, max_episode_steps=50)
    first = env.reset_rows(torch.tensor([0, 2]), [7, 7])["policy"].clone()
    assert torch.equal(first[0], first[2])
    actions = (torch.rand(1, 4, generator=torch.Generator().manual_seed(1)) * 2 - 1).expand(3, 4)  # equal rows
    for _ in range(5):
        env.step(actions)
    again = env.reset_rows(torch.tensor([1]), [7])["policy"][1].clone()
    assert torch.equal(again, first[0])  # another row, after other steps: the same goal and initial state
    other = make(ENV, 1, seed=123, tasks="push-v3", goals=goals, max_episode_steps=50)
    assert torch.equal(other.reset_rows(torch.tensor([0]), [7])["policy"][0], first[0])  # another env, one row
    trajectory = [other.step(actions[:1]).obs["policy"][0].clone() for _ in range(3)]
    env.reset_rows(torch.tensor([1]), [7])
    assert all(torch.equal(env.step(actions).obs["policy"][1], seen) for seen in trajectory)  # same actions, same steps
    goals_of = [tuple(env.reset_rows(torch.tensor([0]), [s])["policy"][0, -3:].tolist()) for s in range(6)]
    assert len(set(goals_of)) == 6  # other seeds, other goals
    env.close()
    other.close()


def test_rows_play_task_row_mod_k_and_the_policy_sees_the_one_hot_task_id():
    env = make(ENV, 4, seed=0, benchmark=None, tasks=["reach-v3", "push-v3"], max_episode_steps=10)
    assert env.task_names == ("reach-v3", "push-v3") and env.task_of_row.tolist() == [0, 1, 0, 1]
    assert [type(e).__name__ for e in env.envs] == ["SawyerReachEnvV3", "SawyerPushEnvV3"] * 2
    obs = env.reset(seed=3)["policy"]
    assert obs.shape == (4, 39 + 2) and env.observation_spaces["policy"].shape == (41,)
    assert obs[:, 39:].tolist() == [[1, 0], [0, 1], [1, 0], [0, 1]]
    step = env.step(torch.zeros(4, 4))
    assert step.obs["policy"][:, 39:].tolist() == [[1, 0], [0, 1], [1, 0], [0, 1]]  # kept past a step
    env.close()
    single = make(ENV, 1, seed=0, tasks="reach-v3", max_episode_steps=10)
    assert single.observation_spaces["policy"].shape == (39,)  # one task: no one-hot
    single.close()
    with pytest.raises(ValueError, match="num_envs 3 is not a multiple of the 2 tasks"):
        make(ENV, 3, benchmark=None, tasks=["reach-v3", "push-v3"])


@pytest.mark.parametrize("how", [None, "any", "final"])
def test_success_counts_at_any_step_when_the_push_expert_succeeds_midway_and_drifts_off(how):
    env = make(ENV, 1, seed=0, tasks="push-v3", max_episode_steps=220, success=how)
    (step,) = expert_episode(env, [9], 220)  # seed 9: success from step 69, lost again at step 208
    assert bool(step.truncated[0]) and not bool(step.terminated[0])
    assert step.episodes["success"].tolist() == [how != "final"]  # Meta-World counts any step by default
    env.close()


def test_env_success_reaches_the_shards_env_and_is_no_part_of_the_env_identity_which_the_tasks_are():
    from raysim.identity import env_identity
    from raysim.rollout import EnvShard

    options = {"tasks": ["reach-v3"], "max_episode_steps": 5}
    shard = EnvShard(ENV, 1, seed=0, env_kwargs=options, success="final")
    assert shard.env.success_count == "final"
    shard.env.close()
    for success in ("any", "final"):
        same = env_identity({"id": ENV, "kwargs": options, "success": success})[0]
        assert same == env_identity({"id": ENV, "kwargs": options})[0]
    as_string = env_identity({"id": ENV, "kwargs": {**options, "tasks": "reach-v3"}})[0]
    other_task = env_identity({"id": ENV, "kwargs": {**options, "tasks": ["push-v3"]}})[0]
    sampled = env_identity({"id": ENV, "kwargs": {**options, "goals": "sampled"}})[0]
    assert as_string == same and len({same, other_task, sampled}) == 3  # the tasks and goals are the env's


def test_end_on_success_terminates_an_episode_at_its_first_success():
    env = make(ENV, 1, seed=0, tasks="push-v3", max_episode_steps=220, end_on_success=True)
    step = expert_episode(env, [9], 220)[0]
    assert bool(step.terminated[0]) and not bool(step.truncated[0])
    assert step.episodes["length"].tolist() == [69] and step.episodes["success"].tolist() == [True]
    env.close()


def test_grpo_groups_on_several_tasks_are_rows_of_one_task_that_share_a_start():
    from raysim.models import ModelConfig
    from raysim.rollout import EnvShard, GroupEpisodes

    options = {"benchmark": None, "tasks": ["reach-v3", "push-v3"], "max_episode_steps": 3}
    shard = EnvShard(ENV, 4, seed=0, env_kwargs=options, model=ModelConfig(critic=False))
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, GroupEpisodes(2, 3))
    first = chunk.obs["policy"][0].reshape(2, 2, -1)  # the chunk's rows [2g, 2g + 2) are group g
    assert torch.equal(first, first[:, :1].expand_as(first))  # one task (its one-hot id) and one start per group
    assert first[:, 0, 39:].argmax(-1).tolist() == [0, 1]
    assert torch.equal(chunk.episodes["group"], torch.arange(4) // 2)
    assert torch.equal(chunk.episodes["return"], chunk.reward.sum(0))  # each row's record is its own steps'
    task_of_row = chunk.obs["policy"][:, :, 39:].argmax(-1)
    assert torch.equal(task_of_row, task_of_row[:1].expand_as(task_of_row))  # a row keeps its task through the round
    shard.env.close()


def test_grpo_groups_that_cannot_share_a_task_are_refused_at_config_time_in_one_line(tmp_path, capsys):
    from raysim.cli import main

    tiny = ["env.id=raysim/MetaWorld", "env.kwargs={benchmark: null, tasks: [reach-v3, push-v3]}", "env.num_envs=2"]
    tiny += ["eval.num_envs=2", "algo.group_size=2"]
    sets = [a for item in tiny for a in ("--set", item)]
    assert main(["train", "cartpole_grpo", "--local", "--run-dir", str(tmp_path / "run"), *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(
        "algo.group_size: 2 does not divide the 1 rows of each task (env.num_envs 2 over the 2 tasks of "
        "raysim/MetaWorld; row i plays task i mod 2): a GRPO group's members play one task"
    )
    assert not (tmp_path / "run").exists()


def test_gym_meta_world_ids_are_refused_in_one_line_naming_the_native_id():
    with pytest.raises(UnknownEnvError, match="use env.id raysim/MetaWorld") as error:
        make("gym:Meta-World/MT1", 2, env_name="reach-v3")
    assert "\n" not in str(error.value)


def test_without_the_package_the_env_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "metaworld", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "raysim\[metaworld\]"'):
        make(ENV, 1, tasks="reach-v3")


def test_a_tiny_local_run_stopped_and_resumed_ends_as_the_uninterrupted_run(tmp_path, capsys):
    import pyarrow.parquet as pq

    from raysim.checkpoint import Checkpoints
    from raysim.cli import main
    from raysim.records import read_metrics
    from raysim.storage import LocalStorage, open_storage

    tiny = ["env.id=raysim/MetaWorld", "env.kwargs={tasks: [reach-v3], max_episode_steps: 20}", "env.num_envs=2"]
    tiny += ["algo.num_steps=16", "algo.num_minibatches=2", "algo.update_epochs=1", "train.total_steps=96"]
    tiny += ["train.log_every=1", "eval.every=2", "eval.episodes=2", "eval.num_envs=2", "train.sinks=[parquet]"]
    sets = [a for item in tiny for a in ("--set", item)]
    run, straight = tmp_path / "run", tmp_path / "straight"
    assert main(["train", "--local", "--run-dir", str(run), *sets, "--set", "train.stop_after=2"]) == 0
    assert (run / "checkpoints" / "2").is_dir() and (run / "resources" / "goal_table.npy").is_file()
    capsys.readouterr()
    assert main(["resume", str(run), "--local"]) == 0  # the rows stopped mid-episode (step 12 of 20)
    out = capsys.readouterr().out
    assert "shards continue exactly" in out and "saved iteration 3 (96 env steps)" in out and "success: " in out
    assert main(["train", "--local", "--run-dir", str(straight), *sets]) == 0

    def metrics(path):
        timing = ("time", "steps_per_s", "time_collect", "time_update", "time_eval", "time_checkpoint")
        return [{k: v for k, v in row.items() if k not in timing} for row in read_metrics(open_storage(path))]

    assert metrics(run) == metrics(straight)
    (_, a, _), (_, b, _) = (Checkpoints(LocalStorage(p)).newest_intact(announce=False) for p in (run, straight))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    for name in ("2.parquet", "3.parquet"):
        assert pq.read_table(run / "eval" / name).to_pylist() == pq.read_table(straight / "eval" / name).to_pylist()


def test_row_counts_off_the_tasks_and_a_wrong_success_count_are_refused_in_one_line(tmp_path, capsys):
    from raysim.cli import main

    tiny = ["env.id=raysim/MetaWorld", "env.kwargs={benchmark: null, tasks: [reach-v3, push-v3]}"]
    sets = [a for item in tiny for a in ("--set", item)]
    assert main(["train", "--local", "--run-dir", str(tmp_path / "a"), *sets, "--set", "eval.num_envs=3"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("eval.num_envs: 3 is not a multiple of 2 (raysim/MetaWorld: one row per task)")
    )
    assert main(["train", "--local", "--run-dir", str(tmp_path / "b"), *sets, "--set", "env.success=sometimes"]) == 2
    assert "env.success must be one of ['any', 'final'], got 'sometimes'" in capsys.readouterr().err


def test_a_pipeline_whose_groups_split_the_tasks_is_refused_in_one_line_before_ray_starts(
    tmp_path, capsys, ray_never_starts
):
    """Each group of a pipelined worker is an env of its own, of env.num_envs / servers.pipeline rows: MT10's ten
    tasks over ten rows in two groups of five is refused at the config check, not as an internal error."""
    from raysim.cli import main

    pipelined = ["shards.placement=servers", "servers.pipeline=2"]
    sets = [a for item in pipelined for a in ("--set", item)]
    assert main(["train", "metaworld_mt10_ppo", "--run-dir", str(tmp_path / "run"), *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and not ray_never_starts and not (tmp_path / "run").exists()
    assert err.endswith(
        "env.num_envs / servers.pipeline: each group of a pipelined worker has 5 rows (10 / 2), not a multiple of 10 "
        "(raysim/MetaWorld: one row per task)"
    ), err


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("env.kwargs.tasks=[reahc-v3]", "unknown task 'reahc-v3'; did you mean 'reach-v3'?"),
        ("env.kwargs.goals=bogus", "goals must be one of ['benchmark', 'sampled'], got 'bogus'"),
    ],
    ids=["unknown task", "goals"],
)
def test_a_meta_world_option_error_names_the_env_once_and_an_unknown_task_the_closest_one(
    tmp_path, capsys, setting, expected
):
    from raysim.cli import main

    assert main(["train", "metaworld_reach_ppo", "--local", "--run-dir", str(tmp_path / "run"), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.count("raysim/MetaWorld") == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert "window-open-v3" not in err  # not the 50 names


@pytest.mark.slow  # ~13 s each on a quiet machine: 50 Sawyer envs and MT10's goal table
@pytest.mark.parametrize("goals", ["benchmark", "sampled"])
def test_mt10_evaluation_records_and_per_task_report_are_the_same_on_1x10_2x10_and_1x20_rows(goals):
    from raysim.actors import LocalBackend
    from raysim.envs.meta_world import MetaWorld
    from raysim.evaluation import EvalSpec, evaluate_on_shards
    from raysim.models.networks import ActorCritic, ModelConfig
    from raysim.rollout import EnvShard

    options = MetaWorld.materialize({"benchmark": "MT10", "goals": goals})  # the table built once, as a driver does
    options["max_episode_steps"] = 4
    backend, weights = LocalBackend(), None
    found: dict[bool, list] = {True: [], False: []}  # deterministic / sampled actions: (records, report) per layout
    for layout in ([10], [10, 10], [20]):  # shards x rows, each a multiple of the 10 tasks

        def make_shard(i: int, layout: list[int] = layout):
            return backend.create(EnvShard, ENV, layout[i], seed=i, env_kwargs=options)

        shards = [make_shard(i) for i in range(len(layout))]
        if weights is None:
            torch.manual_seed(0)
            model = ActorCritic(*shards[0].instance.spaces()[:2], ModelConfig())
            weights = {"version": 1, "actor": model.actor.state_dict()}
        for deterministic in (True, False):
            spec = EvalSpec(episodes=30, seed=4, max_steps=100, deterministic=deterministic)
            report = evaluate_on_shards(backend, make_shard, shards, layout, weights, spec)
            records = {r["episode"]: {k: v for k, v in r.items() if k not in ("row", "step")} for r in report.records}
            found[deterministic].append((records, report))
        for shard in shards:
            shard.instance.env.close()
    tasks = options["tasks"]
    for runs in found.values():
        (records, report), *others = runs
        assert sorted(records) == list(range(30)) and all(other == records for other, _ in others)
        assert [records[j]["task"] for j in range(30)] == [tasks[j % 10] for j in range(30)]  # a name, task j mod K
        assert len({r["seed"] for r in records.values()}) == 30  # distinct episodes
        assert list(report.tasks) == tasks and all(t.requested == t.completed == 3 for t in report.tasks.values())
        assert all(other.tasks == report.tasks for _, other in others)
        rates = [t.success_rate.value for t in report.tasks.values()]
        assert report.mean_task_success == pytest.approx(sum(rates) / 10)  # unweighted over tasks
    assert found[True][0][0] != found[False][0][0]  # sampled actions play other episodes


def test_a_restored_state_continues_every_rows_episode_exactly():
    options = {"benchmark": None, "tasks": ["reach-v3", "push-v3"], "max_episode_steps": 8}
    env = make(ENV, 2, seed=1, **options)
    actions = [torch.rand(2, 4, generator=torch.Generator().manual_seed(t)) * 2 - 1 for t in range(20)]
    for a in actions[:5]:
        env.step(a)
    saved = env.get_state()
    other = make(ENV, 2, seed=99, **options)
    other.set_state(saved)
    assert torch.equal(other.obs, env.obs)
    for a in actions[5:]:  # past the step limit: the auto-resets draw the same seeds too
        mine, theirs = env.step(a), other.step(a)
        assert torch.equal(mine.obs["policy"], theirs.obs["policy"]) and torch.equal(mine.reward, theirs.reward)
        assert torch.equal(mine.done_rows, theirs.done_rows)
    env.close()
    other.close()
