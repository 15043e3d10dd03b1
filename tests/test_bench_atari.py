"""The Atari peer (``benchmarks/cleanrl_ppo_atari.py``) and ``raysim bench atari``: tiny budgets, no timing."""

import re
import sys

import numpy as np
import pytest
import torch

from raysim.bench.peers import peer_module
from raysim.cli import main as cli

pytest.importorskip("ale_py")
pytest.importorskip("cv2")


@pytest.fixture
def peer():
    """The peer module; torch's threads (which it sets for the process) put back afterwards."""
    threads = torch.get_num_threads()
    yield peer_module("cleanrl_ppo_atari")
    torch.set_num_threads(threads)


def test_the_atari_peer_trains_a_tiny_budget_and_reports_each_finished_games_raw_score(peer):
    result = peer.train(seed=1, total_timesteps=512, num_envs=2, num_steps=256, update_epochs=1)

    assert result["env_steps"] == 512
    assert result["torch_threads"] == 1
    assert result["train_seconds"] == pytest.approx(result["collect_seconds"] + result["update_seconds"])
    assert min(result["collect_seconds"], result["update_seconds"]) > 0
    assert result["games"], "no game finished in 2 x 256 steps of a near-uniform policy"
    for step, score, frames in result["games"]:
        assert 0 < step <= 512
        assert score >= 0 and score == int(score)  # Breakout's raw points, not a clipped sum's fraction
        assert frames > 4 * 5  # every life of the game played, frame by frame


def test_a_peer_game_is_reported_only_when_its_last_life_is_lost(peer):
    env = peer.make_env()()
    obs, _ = env.reset(seed=0)
    lives = env.unwrapped.ale.lives()
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(5_000):
        obs, reward, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert reward in (-1.0, 0.0, 1.0)  # clipped for training
        if terminated or truncated:
            ends += 1
            if "episode" in info:
                break
            env.reset()  # a life lost: the game goes on
    env.close()

    assert lives == 5 and ends == lives  # each life loss ended a trajectory; the game, only the last one
    assert env.unwrapped.ale.lives() == 0


@pytest.mark.slow
def test_collection_alone_prints_both_sides_env_steps_per_second_and_their_ratio(tmp_path, capsys):
    # raysim's side is a cheap image config in this process: this checks the harness, not the Atari adapter
    args = ["--config", "reach_camera_ppo", "--no-training", "--rounds", "1", "--warmups", "0"]
    threads = torch.get_num_threads()
    code = cli(["bench", "atari", *args, "--override", "backend=local", "--out", str(tmp_path)])

    assert code == 0
    out = capsys.readouterr().out
    row = re.search(
        r"^\| collection alone, env steps/s \(median\) \| ([0-9,]+) \| ([0-9,]+) \| ([0-9.]+)x \|$", out, re.M
    )
    assert row, out
    ours, theirs = (float(row.group(i).replace(",", "")) for i in (1, 2))
    assert float(row.group(3)) == pytest.approx(ours / theirs, rel=0.01)
    cores = re.search(
        r"^\| collection alone, cores used \(CPU / wall time\) \| ([0-9.]+) \| ([0-9.]+) \| +\|$", out, re.M
    )
    assert cores and min(float(cores.group(1)), float(cores.group(2))) > 0, out
    assert re.search(r"^\| torch threads \| shards and learner in this process: 1 \| 1 \(cpu\) \| \|$", out, re.M)
    assert (tmp_path / "table.md").read_text().strip() == out.strip()
    assert torch.get_num_threads() == threads


TINY = ["--config", "reach_camera_ppo", "--override", "backend=local", "--no-training", "--rounds", "1",
        "--warmups", "0", "--round-steps", "4"]  # fmt: skip


def envpool_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("| EnvPool")]


def test_collection_alone_prints_an_envpool_row_and_the_env_alone_rows_with_their_ratios(tmp_path, capsys):
    pytest.importorskip("envpool")
    assert cli(["bench", "atari", *TINY, "--out", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    number = r"([0-9][0-9,]*)"
    for name in (
        r"EnvPool collection alone \(CleanRL's ppo_atari_envpool\.py env, the peer's agent\), env steps/s \(median\)",
        r"env alone \(random actions\), env steps/s \(median\)",
        r"EnvPool env alone \(random actions\), env steps/s \(median\)",
    ):
        row = re.search(rf"^\| {name} \| {number} \| {number} \| ([0-9.]+)x \|$", out, re.M)
        assert row, (name, out)
        ours, theirs = (float(row.group(i).replace(",", "")) for i in (1, 2))
        assert float(row.group(3)) == pytest.approx(ours / theirs, rel=0.01)
    cores = re.search(r"^\| EnvPool collection alone, cores used \(CPU / wall time\) \| ([0-9.]+) \| ([0-9.]+) \| +\|$",
                      out, re.M)  # fmt: skip
    assert cores and min(float(cores.group(1)), float(cores.group(2))) > 0, out
    assert "| EnvPool threads | | torch 1, EnvPool's pool num_threads=1 (thread_affinity_offset=-1) | |" in out
    assert len(envpool_rows(out)) == 4


def test_without_envpool_its_row_says_not_installed_and_nothing_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool fails; find_spec says None
    assert cli(["bench", "atari", *TINY, "--out", str(tmp_path)]) == 0

    out = capsys.readouterr().out
    assert envpool_rows(out) == [
        "| EnvPool (CleanRL's ppo_atari_envpool.py env) | | not installed (pip install envpool) | |"
    ]
    assert re.search(r"^\| env alone \(random actions\), env steps/s \(median\) \| [0-9,]+ \| [0-9,]+ \| [0-9.]+x \|$",
                     out, re.M)  # fmt: skip


def test_raysim_bench_atari_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(["bench", "atari", "--help"])

    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: raysim bench atari")
    for option in ("--steps", "--peer-threads", "--rounds", "--round-steps", "--config"):
        assert option in out


def test_raysim_bench_atari_names_a_missing_config_in_one_line(tmp_path, capsys):
    assert cli(["bench", "atari", "--config", "no_such_atari_config", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raysim bench atari: ") and "no_such_atari_config" in err
    assert "\n" not in err
