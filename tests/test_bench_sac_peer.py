"""The SAC peer (``benchmarks/cleanrl_sac_continuous.py``, CleanRL's sac_continuous_action): tiny budgets, no timing."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from raysim.bench.peers import peer_module


@pytest.fixture
def peer():
    """The peer module; torch's threads (which it sets for the process) put back afterwards."""
    threads = torch.get_num_threads()
    yield peer_module("cleanrl_sac_continuous")
    torch.set_num_threads(threads)


def test_the_sac_peer_writes_a_json_line_per_evaluation_and_one_at_the_end(peer, tmp_path, capsys):
    out = tmp_path / "peer.jsonl"
    args = ["--env-id", "Pendulum-v1", "--total-steps", "300", "--eval-every", "150", "--eval-episodes", "1"]
    code = peer.main([*args, "--learning-starts", "100", "--batch-size", "32", "--out", str(out)])

    assert code == 0
    lines = out.read_text().splitlines()
    assert capsys.readouterr().out.splitlines() == lines
    records = [json.loads(line) for line in lines]
    assert [(r["event"], r["env_steps"]) for r in records] == [("eval", 150), ("eval", 300), ("end", 300)]
    first, last, end = records
    assert (first["updates"], last["updates"]) == (150 - 101, 300 - 101)  # CleanRL's first update at step 5,001
    for r in records:
        assert r["train_seconds"] == pytest.approx(r["collect_seconds"] + r["update_seconds"], abs=2e-3)
        assert min(r["collect_seconds"], r["update_seconds"], r["eval_seconds"]) > 0
        assert r["updates_per_s"] == pytest.approx(r["updates"] / r["update_seconds"], rel=0.02)
        assert r["env_steps_per_s"] == pytest.approx(r["env_steps"] / r["train_seconds"], rel=0.02)
        assert len(r["eval_returns"]) == 1 and r["eval_return_mean"] == pytest.approx(r["eval_returns"][0], abs=0.01)
        assert r["torch_threads"] == 1 and len(r["loadavg"]) == 3
    assert first["train_episodes"] == 0 and first["train_return_last10"] is None
    assert [step for step, _ in end["train_episodes_curve"]] == [200]  # Pendulum's time limit
    assert end["train_return_last10"] == pytest.approx(end["train_episodes_curve"][0][1])
    assert first["eval_seconds"] < last["eval_seconds"] == end["eval_seconds"]


def test_a_truncated_transition_keeps_its_real_final_observation_and_bootstraps(peer):
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1"))
    twin = gym.make("Pendulum-v1")  # stepped alongside, never reset: its 200th observation is the real final one
    buffer = peer.ReplayBuffer(256, 3, 1)
    obs, _ = env.reset(seed=3)
    twin.reset(seed=3)
    action = np.array([0.5], dtype=np.float32)
    for _ in range(200):
        obs, finished = peer.env_step(env, buffer, obs, action)
        final = twin.step(action)[0]

    assert finished is not None and buffer.pos == 200
    np.testing.assert_allclose(buffer.next_obs[199], final, rtol=1e-6)
    assert not np.allclose(obs, final)  # the env was reset: acting goes on from a fresh episode
    np.testing.assert_array_equal(buffer.next_obs[:199], buffer.obs[1:200])
    assert not buffer.dones[:200].any()  # a time limit is not a termination


def test_a_terminated_transition_is_a_done(peer):
    pytest.importorskip("mujoco")
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("Hopper-v5"))
    buffer = peer.ReplayBuffer(1_000, 11, 3)
    obs, _ = env.reset(seed=0)
    finished = None
    while finished is None:
        obs, finished = peer.env_step(env, buffer, obs, np.ones(3, dtype=np.float32))
    step = buffer.pos - 1

    def fallen(o: np.ndarray) -> bool:  # Hopper-v5's unhealthy states: height, angle or any state out of range
        return not (o[0] > 0.7 and abs(o[1]) < 0.2 and (np.abs(o[1:]) < 100).all())

    assert step < 999  # Hopper falls over long before its time limit
    assert buffer.dones[step] == 1 and not buffer.dones[:step].any()
    assert fallen(buffer.next_obs[step]) and not any(fallen(o) for o in buffer.next_obs[:step])
    assert not fallen(obs)  # the env was reset after the fall


def test_the_update_cost_mode_times_a_loop_over_ten_critics_with_the_target_min_over_two(peer, tmp_path, capsys):
    out = tmp_path / "cost.jsonl"
    args = ["--update-cost", "--env-id", "Pendulum-v1", "--critics", "10", "--steps", "3", "--warmup", "1"]
    code = peer.main([*args, "--batch-size", "16", "--out", str(out)])

    assert code == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert capsys.readouterr().out.strip() == out.read_text().strip()
    assert (record["critics"], record["critic_subset"], record["batch_size"]) == (10, 2, 16)
    assert record["steps"] == 4  # rounded up to even: every second step holds the actor's two steps
    assert record["steps_per_s"] == pytest.approx(record["steps"] / record["seconds"], rel=0.02)
    assert record["ms_per_step"] * record["steps_per_s"] == pytest.approx(1000, rel=0.02)
    assert len(record["loadavg_before"]) == len(record["loadavg_after"]) == 3


def test_an_env_the_peer_cannot_train_is_refused_in_one_line(peer, capsys):
    with pytest.raises(SystemExit) as exit_:
        peer.main(["--env-id", "CartPole-v1", "--total-steps", "10"])

    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("--env-id CartPole-v1: its action space is Discrete(2); this SAC needs a 1-D Box")
