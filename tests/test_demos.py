"""Datasets of demonstrations in Minari's format: ``raysim demos record`` and ``load_demonstrations``.

Recorded through the evaluation path on the local backend, a few short episodes each; read back with Minari's
own API. Needs ``raysim[demos]`` (Minari with HDF5).
"""

from __future__ import annotations

import contextlib
import io
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from raysim.cli import main
from raysim.config import load_config
from raysim.coordinator.demonstrations import record_demonstrations
from raysim.coordinator.preflight import check_env_and_model
from raysim.demos import DatasetError, load_demonstrations
from raysim.demos.demonstrations import stack_episode
from raysim.envs import FrameStack, make

minari = pytest.importorskip("minari")
pytest.importorskip("h5py")

CAMERA = ["env.kwargs.max_episode_steps=12", "eval.num_envs=2"]  # reach_camera_ppo, episodes cut short
STACK = ["env.frame_stack.k=3", "env.frame_stack.groups=[camera,joints]"]


@pytest.fixture(autouse=True)
def datasets(tmp_path, monkeypatch):
    """Every dataset of a test under its own MINARI_DATASETS_PATH."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    return tmp_path / "datasets"


def record(dataset_id: str, config: str, overrides: list[str], episodes: int = 3, **options):
    return record_demonstrations(
        dataset_id, episodes, config=config, policy="random", overrides=overrides, backend="local", **options
    )


def replayed(config: str, overrides: list[str], seed: int, actions: np.ndarray, frame_stack=None):
    """One row of the config's env from the episode's reset seed, stepped with its actions (stacked when asked):
    every observation the policy saw, the final one, and the rewards."""
    env_config = load_config(config, overrides).env
    env = make(env_config.id, 1, seed=0, evaluation=True, **env_config.kwargs)
    env = FrameStack(env, frame_stack) if frame_stack else env
    env.reset(0)  # as a shard starts (the stacks begin here), then the episode's own reset
    obs = [env.reset_rows(torch.tensor([0]), [seed])]
    rewards = []
    for action in actions:
        step = env.step(torch.as_tensor(action).unsqueeze(0))
        rewards.append(step.reward[0])
        obs.append(step.final_obs if step.done_rows.numel() else step.obs)
    return {g: torch.cat([o[g] for o in obs]) for g in obs[0]}, torch.stack(rewards)


def test_a_recorded_dataset_reads_back_through_minari_field_by_field_and_bitwise_images_included():
    recorded = record("raysim/camera-random-v0", "reach_camera_ppo", CAMERA)
    dataset = minari.load_dataset("raysim/camera-random-v0")
    records = recorded.report.records
    assert dataset.total_episodes == len(records) == 3 and dataset.total_steps == recorded.steps == 36
    assert dataset.observation_space["camera"] == gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)
    assert dataset.observation_space["joints"].dtype == np.float32
    assert dataset.action_space == gym.spaces.Box(-1, 1, (2,), np.float32)
    metadata = list(dataset.storage.get_episode_metadata(range(3)))
    for record_, episode, meta in zip(records, dataset.iterate_episodes(), metadata, strict=True):
        steps = record_["trajectory"]
        assert set(episode.observations) == set(steps["obs"]) == {"camera", "joints", "critic"}
        for group, value in steps["obs"].items():
            assert episode.observations[group].dtype == value.dtype and np.array_equal(
                episode.observations[group], value
            )
        assert episode.observations["camera"].shape == (13, 3, 32, 32)
        for name, value in (("actions", "actions"), ("rewards", "reward"), ("terminations", "terminated")):
            assert getattr(episode, name).dtype == steps[value].dtype
            assert np.array_equal(getattr(episode, name), steps[value])
        assert np.array_equal(episode.truncations, steps["truncated"]) and episode.truncations[-1]
        assert (meta["seed"], meta["episode"], meta["length"]) == (record_["seed"], record_["episode"], 12)
        assert meta["success"] == record_["success"] and meta["return"] == pytest.approx(record_["return"])
    # what raysim recorded is the env's own episode: replayed from its reset seed with its actions
    first = records[0]["trajectory"]
    obs, rewards = replayed("reach_camera_ppo", CAMERA, records[0]["seed"], first["actions"])
    assert all(torch.equal(obs[g], torch.from_numpy(first["obs"][g])) for g in obs)
    assert torch.equal(rewards, torch.from_numpy(first["reward"]))
    info = dataset.storage.metadata["raysim"]
    assert info["env_id"] == "raysim/ReachCamera" and info["policy"] == "random" and info["seed"] == recorded.seed
    assert info["seed"] != load_config("reach_camera_ppo").eval.seed  # not the evaluation's episodes


def test_demonstrations_are_stored_before_the_frame_stack_and_read_back_stacked_as_the_shard_stacks():
    plain = record("raysim/plain-v0", "reach_camera_ppo", CAMERA, episodes=2, seed=9)
    stacked = record("raysim/stacked-v0", "reach_camera_ppo", [*CAMERA, *STACK], episodes=2, seed=9)
    for one, other in zip(plain.report.records, stacked.report.records, strict=True):
        assert all(np.array_equal(one["trajectory"]["obs"][g], other["trajectory"]["obs"][g]) for g in ("camera",))
        assert np.array_equal(one["trajectory"]["obs"]["joints"], other["trajectory"]["obs"]["joints"])
    config = load_config("reach_camera_ppo", [*CAMERA, *STACK])
    spaces = check_env_and_model(config, new_run=False)  # as the policy sees them: camera [9, 32, 32]
    demos = load_demonstrations("raysim/stacked-v0", *spaces, config.env.frame_stack)
    assert demos.episodes == 2 and demos.steps == 24 and demos.obs["camera"].shape == (24, 9, 32, 32)
    assert demos.obs["camera"].dtype == torch.uint8 and demos.actions.dtype == torch.float32
    for index, record_ in enumerate(stacked.report.records):
        steps = record_["trajectory"]
        seen, _ = replayed("reach_camera_ppo", CAMERA, record_["seed"], steps["actions"], config.env.frame_stack)
        mine = demos.episode == index
        for group in ("camera", "joints", "critic"):
            assert torch.equal(demos.obs[group][mine], seen[group][:-1])
        assert torch.equal(demos.actions[mine], torch.from_numpy(steps["actions"]))


def test_stack_episode_pads_with_the_first_observation_and_stacks_channels_last_images_on_their_last_axis():
    frames = torch.arange(4 * 2 * 2 * 1, dtype=torch.uint8).view(4, 2, 2, 1)  # [L, H, W, C]
    stacks = stack_episode(frames, 3, -1)
    assert stacks.shape == (4, 2, 2, 3)
    for t in range(4):
        expected = torch.cat([frames[max(0, t - 2)], frames[max(0, t - 1)], frames[t]], dim=-1)
        assert torch.equal(stacks[t], expected)


def test_discrete_demonstrations_load_as_int64_and_split_round_robin_over_steps():
    record("raysim/cartpole-random-v0", "cartpole_ppo", ["eval.num_envs=2"], episodes=4)
    spaces = check_env_and_model(load_config("cartpole_ppo"), new_run=False)
    demos = load_demonstrations("raysim/cartpole-random-v0", *spaces)
    assert demos.actions.dtype == torch.int64 and demos.obs["policy"].dtype == torch.float32
    assert demos.episodes == 4 and demos.steps == minari.load_dataset("raysim/cartpole-random-v0").total_steps
    shares = [demos.split(rank, 3) for rank in range(3)]
    assert sum(share.steps for share in shares) == demos.steps
    assert max(share.steps for share in shares) - min(share.steps for share in shares) <= 1
    assert torch.equal(shares[1].obs["policy"], demos.obs["policy"][1::3])
    assert torch.equal(shares[2].actions, demos.actions[2::3])


def test_a_meta_world_expert_dataset_keeps_each_episode_s_task_and_ends_at_success():
    pytest.importorskip("metaworld")
    overrides = ["env.kwargs.benchmark=null", "env.kwargs.tasks=[reach-v3,push-v3]", "env.kwargs.end_on_success=true"]
    overrides += ["env.kwargs.max_episode_steps=60", "eval.num_envs=2"]
    recorded = record_demonstrations(
        "raysim/reach-push-expert-v0",
        4,
        config="metaworld_reach_ppo",
        policy="expert",
        overrides=overrides,
        backend="local",
    )
    metadata = list(minari.load_dataset("raysim/reach-push-expert-v0").storage.get_episode_metadata(range(2)))
    assert [m["task"] for m in metadata] == ["reach-v3", "push-v3"]  # episode j plays task j mod 2
    reach = recorded.report.records[0]
    assert reach["success"] and reach["trajectory"]["terminated"][-1] and len(reach["trajectory"]["reward"]) < 60


def write(dataset_id: str, observation_space: gym.Space, action_space: gym.Space, episodes: int = 1) -> None:
    """A dataset of ``episodes`` two-step episodes of values from the spaces, made with Minari's own API."""
    from minari.data_collector import EpisodeBuffer

    def sample(space: gym.Space, n: int):
        if isinstance(space, gym.spaces.Dict):
            return {k: sample(v, n) for k, v in space.spaces.items()}
        return np.stack([space.sample() for _ in range(n)])

    buffers = [
        EpisodeBuffer(
            observations=sample(observation_space, 3),
            actions=sample(action_space, 2),
            rewards=np.zeros(2, np.float32),
            terminations=np.array([False, True]),
            truncations=np.zeros(2, bool),
        )
        for _ in range(episodes)
    ]
    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            dataset_id, buffers, observation_space=observation_space, action_space=action_space, data_format="hdf5"
        )


VECTOR = gym.spaces.Box(-1, 1, (4,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (3, 8, 8), np.uint8)
ENV = {"camera": IMAGE, "joints": VECTOR}
BAD = [
    (gym.spaces.Dict({"joints": VECTOR}), gym.spaces.Discrete(2), "has no observation group 'camera' of the env"),
    (
        gym.spaces.Dict({"camera": IMAGE, "joints": gym.spaces.Box(-1, 1, (5,), np.float32)}),
        gym.spaces.Discrete(2),
        "observation group 'joints' is Box [5] float32 in the dataset and [4] float in the env",
    ),
    (
        gym.spaces.Dict({"camera": gym.spaces.Box(0, 1, (3, 8, 8), np.float32), "joints": VECTOR}),
        gym.spaces.Discrete(2),
        "observation group 'camera' is Box [3, 8, 8] float32 in the dataset and [3, 8, 8] uint8 in the env",
    ),
    (gym.spaces.Dict(ENV), gym.spaces.Box(-1, 1, (2,), np.float32), "its actions are Box [2] float32; the env's are"),
]


@pytest.mark.parametrize("observation_space, action_space, message", BAD)
def test_a_dataset_that_does_not_fit_the_env_is_refused_in_one_line_naming_what_differs(
    observation_space, action_space, message
):
    write("test/bad-v0", observation_space, action_space)
    with pytest.raises(DatasetError, match=re.escape(message)) as caught:
        load_demonstrations("test/bad-v0", ENV, gym.spaces.Discrete(2))
    assert "\n" not in str(caught.value) and "test/bad-v0" in str(caught.value)


def test_a_missing_or_empty_dataset_or_no_minari_is_refused_in_one_line(tmp_path, datasets, monkeypatch):
    spaces = (ENV, gym.spaces.Discrete(2))
    with pytest.raises(DatasetError, match=f"no directory {tmp_path}/nowhere, and no Minari dataset"):
        load_demonstrations(str(tmp_path / "nowhere"), *spaces)
    with pytest.raises(DatasetError, match=f"'test/none-v0' not found: .* under {datasets} \\(MINARI_DATASETS_PATH"):
        load_demonstrations("test/none-v0", *spaces)
    write("test/empty-v0", gym.spaces.Dict(ENV), gym.spaces.Discrete(2), episodes=0)
    with pytest.raises(DatasetError, match="dataset test/empty-v0 is empty: it holds no episode"):
        load_demonstrations("test/empty-v0", *spaces)
    write("test/good-v0", gym.spaces.Dict(ENV), gym.spaces.Discrete(2), episodes=2)
    by_path = load_demonstrations(str(datasets / "test" / "good-v0"), *spaces)  # a directory: the path is read
    assert by_path.episodes == 2 and by_path.steps == 4 and by_path.obs["camera"].dtype == torch.uint8
    monkeypatch.setitem(__import__("sys").modules, "minari", None)
    with pytest.raises(DatasetError, match=r'not installed: pip install "raysim\[demos\]"'):
        load_demonstrations("test/good-v0", *spaces)


MISUSE = [
    (["--episodes", "2", "--dataset-id", "raysim/x-v0"], "give RUN_DIR_OR_CHECKPOINT"),
    (["--config", "reach_ppo", "--episodes", "2", "--dataset-id", "raysim/x-v0"], "give --policy"),
    (["runs/r", "--policy", "random", "--episodes", "2", "--dataset-id", "raysim/x-v0"], "--policy goes with no RUN"),
    (["runs/r", "--set", "seed=2", "--episodes", "2", "--dataset-id", "raysim/x-v0"], "--set changes the config of"),
    (
        [
            "--config",
            "reach_ppo",
            "--policy",
            "random",
            "--stochastic",
            "--episodes",
            "2",
            "--dataset-id",
            "raysim/x-v0",
        ],
        "leave --stochastic out",
    ),
    (["--config", "reach_ppo", "--policy", "random", "--episodes", "2"], "the following arguments are required"),
    (
        ["--config", "reach_ppo", "--policy", "random", "--episodes", "2", "--dataset-id", "no version"],
        "--dataset-id 'no version': a Minari id is",
    ),
    (
        [
            "--config",
            "reach_ppo",
            "--policy",
            "random",
            "--episodes",
            "2",
            "--dataset-id",
            "raysim/x-v0",
            "--seed",
            "12345",
        ],
        "--seed 12345 is eval.seed: demonstrations would replay the episodes the evaluation scores",
    ),
    (
        ["--config", "cartpole_ppo", "--policy", "expert", "--episodes", "2", "--dataset-id", "raysim/x-v0"],
        "--policy expert: raysim/CartPole has no scripted expert",
    ),
    (
        ["--config", "cartpole_ppo", "--policy", "random", "--set", "env.id=gym:CartPole-v1", "--set"]
        + ["env.kwargs.vectorize=native", "--episodes", "2", "--dataset-id", "raysim/x-v0"],
        "gym:CartPole-v1 cannot reset single rows (env.kwargs.vectorize: native)",
    ),
]


@pytest.mark.parametrize("args, message", MISUSE)
def test_raysim_demos_record_misuse_is_one_line_and_rc_2_with_nothing_written(args, message, capsys, datasets):
    assert main(["demos", "record", "--local", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not list(datasets.glob("**/metadata.json"))


def test_raysim_demos_record_and_info_from_the_command_line(capsys, datasets):
    args = ["--config", "reach_ppo", "--policy", "random", "--episodes", "2", "--dataset-id", "raysim/reach-v0"]
    assert main(["demos", "record", *args, "--set", "env.kwargs.max_episode_steps=5", "--local"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 episodes completed and recorded, 10 steps" in out and str(datasets / "raysim" / "reach-v0") in out
    assert main(["demos", "record", *args, "--local"]) == 2  # Minari never overwrites
    assert "a dataset already exists at" in capsys.readouterr().err
    assert main(["demos", "info", "raysim/reach-v0"]) == 0
    out = capsys.readouterr().out
    assert "2 episodes, 10 steps" in out and "env_id: raysim/Reach" in out and "policy: random" in out
    assert main(["demos", "info", "raysim/nothing-v0"]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_run_s_demonstrations_hold_its_actor_s_output_before_the_clip_into_the_action_space(tmp_path):
    from raysim.checkpoint import locate_checkpoint
    from raysim.coordinator import Trainer
    from raysim.models import Actor, actor_state

    settings = ["backend=local", "train.total_steps=2048", "eval.episodes=0", "env.num_envs=8", "algo.num_steps=32"]
    settings += ["env.kwargs.max_episode_steps=10", "algo.num_minibatches=2", "algo.update_epochs=1"]
    run = Trainer(load_config("reach_ppo", [*settings, f"run_dir={tmp_path / 'run'}"])).train().run_dir
    recorded = record_demonstrations("raysim/reach-ppo-v0", 2, run=run, envs_per_shard=2, backend="local")
    dataset = minari.load_dataset("raysim/reach-ppo-v0")
    box = dataset.action_space
    assert box.shape == (2,) and np.isinf(box.low).all() and np.isinf(box.high).all()  # the actor's mean, unbounded
    config = load_config("reach_ppo", settings)
    actor = Actor(*check_env_and_model(config, new_run=False), config.model)
    actor.load_state_dict(actor_state(locate_checkpoint(run)[2]["model"]))
    episode = dataset[0]
    with torch.no_grad():
        mean = actor.deterministic({g: torch.from_numpy(v[:-1]) for g, v in episode.observations.items()}, by_row=True)
    assert torch.equal(mean, torch.from_numpy(episode.actions))
    assert dataset.storage.metadata["raysim"]["policy"].startswith("checkpoint ") and recorded.report.completed == 2


def test_a_relative_minari_datasets_path_is_taken_from_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", "relative-datasets")  # Minari alone would join it twice
    args = ["--config", "reach_ppo", "--policy", "random", "--episodes", "1", "--dataset-id", "raysim/rel-v0"]
    assert main(["demos", "record", *args, "--set", "env.kwargs.max_episode_steps=3", "--local"]) == 0
    assert (tmp_path / "relative-datasets" / "raysim" / "rel-v0" / "data").is_dir()
    assert main(["demos", "info", "raysim/rel-v0"]) == 0 and "1 episodes, 3 steps" in capsys.readouterr().out


def test_actions_the_env_received_are_mapped_back_through_the_transform_whatever_the_bounds():
    from minari.data_collector import EpisodeBuffer

    from raysim.models.sampling import SQUASH_LIMIT, to_action_space

    box = gym.spaces.Box(np.float32([0, -4]), np.float32([2, 4]))
    received = np.float32([[0.5, 1.0], [2.0, -4.0], [3.0, 0.0]])  # inside; on both bounds; beyond one (clipped)
    observations = {g: np.stack([space.sample() for _ in range(4)]) for g, space in ENV.items()}
    buffer = EpisodeBuffer(
        observations=observations,
        actions=received,
        rewards=np.zeros(3, np.float32),
        terminations=np.array([False, False, True]),
        truncations=np.zeros(3, bool),
    )
    with pytest.warns(UserWarning):  # a dataset made elsewhere: no raysim metadata, actions as the env received them
        minari.create_dataset_from_buffers(
            "test/bounds-v0", [buffer], observation_space=gym.spaces.Dict(ENV), action_space=box, data_format="hdf5"
        )
    low, high = torch.tensor([0.0, -4.0]), torch.tensor([2.0, 4.0])
    inside = torch.from_numpy(received).clamp(low, high)
    clipped = load_demonstrations("test/bounds-v0", ENV, box, None, "clip").actions
    assert torch.equal(clipped, inside)
    squashed = load_demonstrations("test/bounds-v0", ENV, box, None, "squash").actions
    assert torch.isfinite(squashed).all() and squashed[1].abs().max() == pytest.approx(np.arctanh(SQUASH_LIMIT))
    executed = to_action_space(squashed, low, high, squash=True)
    assert torch.allclose(executed[0], inside[0], atol=1e-5)  # exactly the action, in the dataset's own bounds
    assert torch.allclose(executed, inside, atol=(1 - SQUASH_LIMIT) / 2 * 8 + 1e-5)  # on a bound: within the limit


def record_meta_world(dataset_id: str, config: str, overrides: list[str], policy: str = "expert"):
    """One episode of ``config``'s Meta-World task, cut at 60 steps (the pick-place expert succeeds in ~50 and asks
    for actions beyond [-1, 1] from its 30th)."""
    pytest.importorskip("metaworld")
    settings = ["env.kwargs.max_episode_steps=60", "eval.num_envs=1", *overrides]
    return record_demonstrations(dataset_id, 1, config=config, policy=policy, overrides=settings, backend="local")


@pytest.fixture(scope="module")
def pick_place_expert(tmp_path_factory):
    """One episode of the pick-place expert, recorded once: what ``record_demonstrations`` returned, the datasets'
    root and what recording printed."""
    root = tmp_path_factory.mktemp("pick-place") / "datasets"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        recorded = record_meta_world("raysim/pick-place-expert-v0", "metaworld_pick_place_bc", [])
    return recorded, root, printed.getvalue()


def test_meta_world_expert_actions_are_recorded_clipped_as_the_env_received_them(pick_place_expert, monkeypatch):
    recorded, root, printed = pick_place_expert
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    actions = minari.load_dataset("raysim/pick-place-expert-v0")[0].actions
    assert np.abs(actions).max() == 1.0  # the expert asks for more (up to ~2.5): the env clips it
    record_ = recorded.report.records[0]
    _, rewards = replayed("metaworld_pick_place_bc", ["env.kwargs.max_episode_steps=60"], record_["seed"], actions)
    assert torch.equal(rewards, torch.from_numpy(record_["trajectory"]["reward"]))  # they replay the episode
    assert "distinct episodes" not in printed  # goals: sampled: none is an evaluation episode


def test_recording_with_benchmark_goals_says_that_the_episodes_are_among_the_evaluations(capsys):
    record_meta_world("raysim/reach-benchmark-v0", "metaworld_reach_ppo", ["env.kwargs.goals=benchmark"], "random")
    said = [line for line in capsys.readouterr().out.splitlines() if "distinct episodes" in line]
    assert len(said) == 1 and "raysim/MetaWorld has only 50 distinct episodes per task" in said[0], said
    assert "scored on episodes it imitated" in said[0] and "goals: sampled keeps them apart" in said[0]


def test_a_recorded_meta_world_dataset_recovers_meta_worlds_own_env_which_resets_and_steps(
    pick_place_expert, monkeypatch
):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(pick_place_expert[1]))
    dataset = minari.load_dataset("raysim/pick-place-expert-v0")
    assert dataset.env_spec.id == "Meta-World/MT1" and dataset.env_spec.kwargs["name"] == "pick-place-v3"
    env = dataset.recover_environment()
    obs, _ = env.reset(seed=3)
    assert obs.shape == (39,) and env.action_space == gym.spaces.Box(-1, 1, (4,), np.float32)
    for action in dataset[0].actions[:5]:
        obs, reward, terminated, truncated, info = env.step(action)
    assert obs.shape == (39,) and np.isfinite(reward) and "success" in info
    env.close()


def test_a_native_tasks_dataset_recovers_its_gymnasium_env_with_the_recorded_options():
    record("raysim/reach-recover-v0", "reach_ppo", ["env.kwargs.max_episode_steps=5", "eval.num_envs=1"], episodes=1)
    dataset = minari.load_dataset("raysim/reach-recover-v0")
    env = dataset.recover_environment()
    assert dataset.env_spec.id == "raysim/Reach-v0" and env.observation_space == dataset.observation_space["policy"]
    env.reset(seed=0)
    truncated = [env.step(action)[3] for action in dataset[0].actions]
    assert truncated == [False] * 4 + [True]  # its step limit is the recorded one
    record("raysim/camera-v0", "reach_camera_ppo", CAMERA, episodes=1)
    with pytest.raises(ValueError, match="env_spec is None"):  # no Gymnasium id: said by Minari
        minari.load_dataset("raysim/camera-v0").recover_environment()


def test_a_gym_ids_spec_is_gymnasiums_own_with_the_envs_options_and_the_step_limit_but_not_the_adapters():
    from raysim.envs.gym_vector import gymnasium_spec

    spec = gymnasium_spec(
        "gym:CartPole-v1", {"vectorize": "async", "max_episode_steps": 7, "sutton_barto_reward": True}
    )
    assert spec.id == "CartPole-v1" and spec.kwargs == {"sutton_barto_reward": True} and spec.max_episode_steps == 7
    env = gym.make(spec)
    env.reset(seed=0)
    assert env.spec.max_episode_steps == 7 and env.step(0)[0].shape == (4,)
    assert gymnasium_spec("raysim/ReachCamera", {}) is None and gymnasium_spec("raysim/CartPole", {}).kwargs == {
        "task": "raysim/CartPole"
    }
