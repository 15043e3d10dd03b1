"""The Gymnasium adapter: every autoreset mode turned into the same-step contract."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from raysim.envs import make
from raysim.envs.cartpole import X_THRESHOLD
from raysim.identity import current_form, differences, env_identity
from raysim.rollout import EnvShard

MODES = ["NextStep", "SameStep", "Disabled"]
EDGE = np.array([X_THRESHOLD - 0.01, 10.0, 0.0, 0.0])  # past the x threshold on the next step
CALM = np.zeros(4)


class Countdown(gym.Env):
    """Ends after 2..5 steps (drawn at reset); ``is_success`` when the last action was 1."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.horizon = 0, int(self.np_random.integers(2, 6))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.horizon
        return self._obs(), 1.0, done, False, ({"is_success": bool(action == 1)} if done else {})

    def _obs(self):
        return np.array([self.t, self.horizon], dtype=np.float32)


gym.register("RaysimTest/Countdown-v0", entry_point=Countdown, max_episode_steps=100)


class Flicker(Countdown):
    """``Countdown`` whose every step's info has ``is_success``: whether that step's action was 1."""

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {"is_success": bool(action == 1)}


gym.register("RaysimTest/Flicker-v0", entry_point=Flicker, max_episode_steps=100)


def test_autoreset_mode_values_are_gymnasiums():
    assert [m.value for m in AutoresetMode] == MODES
    for mode in MODES:
        env = make("gym:CartPole-v1", 2, seed=0, autoreset_mode=mode)
        assert env.mode == AutoresetMode(mode)
        env.close()


def assert_chunks_equal(a, b):
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, dict):
            assert x.keys() == y.keys(), field.name
            for k in x:
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), f"{field.name}[{k}]"
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), field.name
        else:
            assert x == y, field.name


def lengths_from_flags(done: torch.Tensor, mask: torch.Tensor, counted: torch.Tensor | None = None):
    """Per finished (t, row) in row-major order: valid transitions since the row's last episode end."""
    counted = torch.zeros(done.shape[1], dtype=torch.int64) if counted is None else counted
    lengths = []
    for t in range(done.shape[0]):
        counted += mask[t]
        lengths += counted[done[t]].tolist()
        counted[done[t]] = 0
    return lengths, counted


def test_the_three_autoreset_modes_produce_the_same_chunks():
    shards = [
        EnvShard("gym:CartPole-v1", 16, seed=7, env_kwargs={"autoreset_mode": m, "max_episode_steps": 30})
        for m in MODES
    ]
    weights = {"version": 3, "actor": shards[0].actor.state_dict()}
    for _ in range(2):  # the second chunk continues the first one's episodes
        chunks = [shard.rollout(weights, 120) for shard in shards]
        for other in chunks[1:]:
            assert_chunks_equal(chunks[0], other)
    chunk = chunks[0]
    assert chunk.episodes["length"].numel() > 60
    assert chunk.terminated.any() and (chunk.truncated & ~chunk.terminated).any()
    for shard in shards:
        shard.env.close()


def test_next_step_mode_has_no_reset_transition():
    shard = EnvShard("gym:CartPole-v1", 12, seed=1, env_kwargs={"autoreset_mode": "NextStep", "max_episode_steps": 40})
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    counted = None
    for _ in range(2):
        chunk = shard.rollout(weights, 100)
        assert (chunk.reward == 1.0).all()  # CartPole pays 1 on every real step; a reset transition pays 0
        assert chunk.mask.all() and chunk.env_steps == 100 * 12
        done = chunk.terminated | chunk.truncated
        expected, counted = lengths_from_flags(done, chunk.mask, counted)
        assert chunk.episodes["length"].tolist() == expected
        assert torch.equal(chunk.episodes["return"], chunk.episodes["length"].float())
        # a finished row acts next on the first observation of its new episode, never its final one
        t, row = chunk.final_t, chunk.final_row
        assert (chunk.obs["policy"][t + 1, row].abs() <= 0.05).all()
        assert not torch.equal(chunk.obs["policy"][t + 1, row], chunk.final_obs["policy"])
    assert int(chunk.truncated.sum()) > 0
    shard.env.close()


def test_native_vector_env_reset_transitions_are_masked_and_never_counted():
    env = make("gym:CartPole-v1", 16, seed=3, vectorize="native")
    assert not env.masked_reset and env.mode == AutoresetMode.NEXT_STEP
    generator = torch.Generator().manual_seed(0)
    previous_done = torch.zeros(16, dtype=torch.bool)
    invalid = 0
    for _ in range(150):
        step = env.step(torch.randint(0, 2, (16,), generator=generator))
        if previous_done.any():
            assert step.valid is not None and torch.equal(step.valid, ~previous_done)
            assert (step.reward[previous_done] == 0).all()
            assert not (step.terminated | step.truncated)[previous_done].any()
            invalid += int(previous_done.sum())
        else:
            assert step.valid is None
        previous_done = step.terminated | step.truncated
    assert invalid > 50
    with pytest.raises(ValueError, match="native vector env cannot reset single rows"):
        env.reset_rows(torch.tensor([0]), [1])

    shard = EnvShard("gym:CartPole-v1", 16, seed=3, env_kwargs={"vectorize": "native", "max_episode_steps": 40})
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    counted, done_before = None, torch.zeros(16, dtype=torch.bool)
    for _ in range(2):
        chunk = shard.rollout(weights, 100)
        done = chunk.terminated | chunk.truncated
        after_done = torch.cat([done_before[None], done[:-1]])  # a reset transition follows each episode end
        assert torch.equal(chunk.mask, ~after_done)
        assert (chunk.reward[~chunk.mask] == 0).all() and (chunk.reward[chunk.mask] == 1).all()
        expected, counted = lengths_from_flags(done, chunk.mask, counted)
        assert chunk.episodes["length"].tolist() == expected
        assert torch.equal(chunk.episodes["return"], chunk.episodes["length"].float())
        assert chunk.env_steps == int(chunk.mask.sum()) < 100 * 16
        done_before = done[-1]
    assert (chunk.episodes["length"] <= 40).all() and (chunk.truncated & ~chunk.terminated).any()


@pytest.mark.parametrize("mode", MODES + ["native"])
def test_adapter_reports_a_row_terminated_and_truncated_in_the_same_step_with_both_flags(mode):
    kwargs = {"vectorize": "native"} if mode == "native" else {"autoreset_mode": mode}
    env = make("gym:CartPole-v1", 3, seed=0, max_episode_steps=10, **kwargs)
    states, elapsed = [EDGE, CALM, CALM], [9, 9, 3]
    if mode == "native":
        env.vec.unwrapped.state[:] = np.stack(states).T
        env.vec.unwrapped.steps[:] = elapsed
    else:
        for sub, state, steps in zip(env.vec.envs, states, elapsed, strict=True):
            sub.unwrapped.state = state.copy()
            while not isinstance(sub, gym.wrappers.TimeLimit):
                sub = sub.env
            sub._elapsed_steps = steps
    env.episode_length[:] = elapsed
    env.episode_return[:] = elapsed
    step = env.step(torch.tensor([1, 1, 1]))
    assert step.terminated.tolist() == [True, False, False]
    assert step.truncated.tolist() == [True, True, False]
    assert step.done_rows.tolist() == [0, 1]
    assert step.episodes["length"].tolist() == [10, 10] and step.episodes["return"].tolist() == [10.0, 10.0]
    final = step.final_obs["policy"]
    assert final[0, 0] == pytest.approx(EDGE[0] + 0.02 * EDGE[1], abs=1e-6)  # the state past the edge
    if mode != "native":  # the native env shows the final observation until its reset transition
        assert (step.obs["policy"][:2].abs() <= 0.05).all()
        assert not torch.isclose(step.obs["policy"][:2], final).all(1).any()
    env.close()


@pytest.mark.parametrize("mode", MODES)
def test_success_counted_at_any_step_reports_an_episode_whose_flag_came_and_went_in_every_mode(mode):
    counted = {}
    for how in ("any", "final"):
        env = make("gym:RaysimTest/Flicker-v0", 4, seed=5, autoreset_mode=mode, success=how)
        generator = torch.Generator().manual_seed(0)
        seen = torch.zeros(4, dtype=torch.bool)  # the flag was set in the running episode
        counted[how] = []
        for _ in range(40):
            actions = torch.randint(0, 2, (4,), generator=generator)
            seen |= actions == 1
            step = env.step(actions)
            rows = step.done_rows
            if rows.numel():
                expected = seen[rows] if how == "any" else actions[rows] == 1
                assert step.episodes["success"].tolist() == expected.tolist()
                counted[how] += expected.tolist()
                seen[rows] = False
        env.close()
    assert len(counted["any"]) == len(counted["final"]) > 20 and sum(counted["any"]) > sum(counted["final"])
    with pytest.raises(ValueError, match="success must be one of"):
        make("gym:RaysimTest/Flicker-v0", 1, success="sometimes")


@pytest.mark.parametrize("mode", MODES)
def test_success_from_the_final_info_is_reported_in_every_mode(mode):
    env = make("gym:RaysimTest/Countdown-v0", 4, seed=5, autoreset_mode=mode)
    generator = torch.Generator().manual_seed(0)
    reports = 0
    for _ in range(30):
        obs = env._obs["policy"]
        actions = torch.randint(0, 2, (4,), generator=generator)
        step = env.step(actions)
        if step.done_rows.numel():
            rows = step.done_rows
            assert step.episodes["success"].tolist() == (actions[rows] == 1).tolist()
            assert torch.equal(step.episodes["length"], obs[rows, 1].long())  # the drawn horizon
            assert torch.equal(step.final_obs["policy"][:, 0], step.final_obs["policy"][:, 1])  # t == horizon
            assert (step.obs["policy"][rows, 0] == 0).all()  # the new episode's first observation
            reports += rows.numel()
    assert reports > 20
    env.close()


def test_pendulum_runs_through_a_shard_and_truncates_at_200_with_truncated_only():
    shard = EnvShard("gym:Pendulum-v1", 4, seed=2)
    assert shard.env.max_episode_steps == 200
    assert isinstance(shard.env.action_space, gym.spaces.Box)
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 205)
    assert chunk.actions.shape == (205, 4, 1) and chunk.actions.dtype == torch.float32
    assert chunk.obs["policy"].shape == (206, 4, 3)
    assert not chunk.terminated.any()
    assert chunk.truncated[199].all() and int(chunk.truncated.sum()) == 4
    assert chunk.final_t.tolist() == [199] * 4 and chunk.final_row.tolist() == [0, 1, 2, 3]
    assert chunk.episodes["length"].tolist() == [200] * 4
    assert torch.allclose(chunk.episodes["return"], chunk.reward[:200].sum(0), rtol=1e-5)
    assert (chunk.reward <= 0).all() and chunk.mask.all()
    assert not torch.isclose(chunk.final_obs["policy"], chunk.obs["policy"][200]).all(1).any()
    shard.env.close()


@pytest.mark.parametrize("mode", MODES)
def test_adapter_reset_rows_with_equal_seeds_gives_equal_initial_observations(mode):
    env = make("gym:CartPole-v1", 5, seed=0, autoreset_mode=mode)
    for _ in range(3):
        env.step(torch.zeros(5, dtype=torch.int64))
    before = env._obs["policy"].clone()
    obs = env.reset_rows(torch.tensor([0, 2, 3]), [11, 11, 12])["policy"]
    assert torch.equal(obs[0], obs[2]) and not torch.equal(obs[0], obs[3])
    assert torch.equal(obs[[1, 4]], before[[1, 4]])  # the other rows go on
    assert env.episode_length.tolist() == [0, 3, 0, 0, 3]
    other = make("gym:CartPole-v1", 2, seed=9, autoreset_mode=mode)
    assert torch.equal(other.reset_rows(torch.tensor([1]), [11])["policy"][1], obs[0])
    step = env.step(torch.zeros(5, dtype=torch.int64))  # no reset transition after a reset_rows
    assert (step.reward == 1).all() and step.valid is None
    env.close()
    other.close()


def test_adapter_refuses_bad_actions_and_unsupported_options():
    env = make("gym:CartPole-v1", 3, seed=0)
    with pytest.raises(ValueError, match=r"gym:CartPole-v1: actions must have shape \(3,\).*got \(3, 1\)"):
        env.step(torch.zeros(3, 1, dtype=torch.int64))
    env.close()
    with pytest.raises(ValueError, match="vectorize must be one of"):
        make("gym:CartPole-v1", 2, vectorize="threads")
    with pytest.raises(ValueError, match="'Bogus' is not a valid AutoresetMode"):
        make("gym:CartPole-v1", 2, autoreset_mode="Bogus")


@pytest.mark.parametrize("mode", MODES)
def test_nested_info_from_a_wrapper_does_not_break_episode_reports(mode):
    # RecordEpisodeStatistics puts a dict ("episode": {"r", "l", "t"}) into the info of finished rows
    env = make("gym:CartPole-v1", 4, seed=0, autoreset_mode=mode, wrappers=[gym.wrappers.RecordEpisodeStatistics])
    generator = torch.Generator().manual_seed(0)
    reports = 0
    for _ in range(100):
        step = env.step(torch.randint(0, 2, (4,), generator=generator))
        if step.done_rows.numel():
            assert torch.equal(step.episodes["return"], step.episodes["length"].float())
            assert "success" not in step.episodes
            reports += step.done_rows.numel()
    assert reports > 10
    env.close()


def test_a_native_vector_envs_rows_restart_their_recurrent_state_at_the_new_episodes_first_observation():
    """NEXT_STEP native: a finished row's next observation is still its final one (the reset transition follows,
    masked); its state restarts at the observation after it, the new episode's first, not at the old final one."""
    model = {"recurrent": "lstm", "recurrent_size": 8, "hidden_sizes": [16]}
    shard = EnvShard("gym:CartPole-v1", 8, seed=3, model=model, env_kwargs={"vectorize": "native"})
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    first, second = shard.rollout(weights, 60), shard.rollout(weights, 60)
    done = first.terminated | first.truncated
    assert int(done.sum()) >= 4, "random actions end many CartPole episodes"
    assert bool(first.starts[0].all())  # a new shard's rows start fresh episodes
    assert not first.starts[1:][done].any()  # the old final observation is read with the old episode's state
    assert torch.equal(first.starts[1:], ~first.mask)  # the reset transition's observation starts the new one
    assert torch.equal(second.starts[1:], ~second.mask) and torch.equal(second.starts[0], first.starts[-1])
    new_first = first.obs["policy"][1:][first.starts[1:]]
    assert (new_first.abs() <= 0.05).all(), "a restart on an observation that does not start a CartPole episode"
    shard.env.close()


def test_vectorize_native_is_part_of_the_env_identity_sync_and_async_are_not():
    """``native`` changes what a row sees (its own resets, the reset transition): a resume cannot switch to or from
    it silently; ``sync`` and ``async`` step the same rows."""
    plain = env_identity({"id": "gym:CartPole-v1", "kwargs": {}})
    for vectorize in ("sync", "async"):
        assert env_identity({"id": "gym:CartPole-v1", "kwargs": {"vectorize": vectorize}})[0] == plain[0]
    native = env_identity({"id": "gym:CartPole-v1", "kwargs": {"vectorize": "native"}})
    assert native[0] != plain[0]
    assert differences(plain[1], native[1]) == ["kwargs.vectorize: checkpoint has '<absent>', this config has 'native'"]
    assert current_form(native[1]) == native[1]  # the saved form stays as it is


def test_an_id_your_module_registers_is_named_module_colon_id_and_the_module_is_imported_where_the_env_is_made(
    tmp_path, monkeypatch
):
    """Gymnasium's own ``module:Id`` form: the process that makes the env (the driver, each shard's worker) imports
    ``module``, which registers ``Id``, so a user's registration needs no import of raysim's. A shard's Ray worker
    runs the same ``make`` (the page docs/tasks/bring-your-own-env.md shows that run on Ray)."""
    import raysim

    (tmp_path / "my_registration.py").write_text(
        "import gymnasium as gym\nfrom tests.support.painted import Painted\n\n"
        "gym.register('Mine/Painted-v0', entry_point=Painted, max_episode_steps=20)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [
        "env.id=gym:my_registration:Mine/Painted-v0",
        "env.num_envs=2",
        "algo.num_steps=16",
        "train.total_steps=64",
        "eval.episodes=2",
        "backend=local",
        f"run_dir={tmp_path / 'run'}",
    ]
    summary = raysim.Trainer(raysim.load_config(None, overrides=overrides), sinks=[]).train()
    assert summary.env_steps == 64 and summary.evaluation.completed == 2 and "Mine/Painted-v0" in gym.registry
    with pytest.raises(ValueError, match="cannot import 'no_such_module', the module that registers 'Mine-v0'"):
        make("gym:no_such_module:Mine-v0", 2)
    gym.registry.pop("Mine/Painted-v0")


def test_a_native_vector_env_trains_until_its_counted_env_steps_reach_the_budget(tmp_path, capsys):
    """Its reset transitions are not env steps: the run goes on past the 4 iterations of 4 x 16 steps, to 256 counted
    steps, and a linear learning rate falls to 0 there."""
    from raysim.cli import main
    from raysim.records import read_metrics
    from raysim.storage import open_storage

    tiny = ["env.id=gym:CartPole-v1", "env.kwargs.vectorize=native", "env.num_envs=4", "algo.num_steps=16"]
    tiny += ["algo.num_minibatches=2", "algo.update_epochs=1", "algo.lr=0.001", "algo.lr_schedule=linear"]
    tiny += ["train.total_steps=256", "train.log_every=1", "eval.episodes=0", "train.sinks=[console, parquet]"]
    run = tmp_path / "run"
    assert (
        main(["train", "cartpole_ppo", "--local", "--run-dir", str(run), *[a for s in tiny for a in ("--set", s)]]) == 0
    )
    rows = read_metrics(open_storage(run))
    steps = [int(row["env_steps"]) for row in rows]
    assert len(rows) > 4 and steps[-2] < 256 <= steps[-1]  # stopped at the first iteration that reached it
    consumed = [0, *steps[:-1]]  # before each update
    assert [row["lr"] for row in rows] == [0.001 * max(0.0, 1.0 - s / 256) for s in consumed]  # 0 at 256
    out = capsys.readouterr().out
    assert f"steps {steps[-1]:>9,}/256 ({100.0 * steps[-1] / 256:5.1f}%)" in out
