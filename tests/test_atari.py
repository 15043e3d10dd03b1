"""The Atari preset (``env.kwargs.atari`` on ale-py's vector env): uint8 frame stacks, lives as training dones,
games as episodes with their raw score, evaluation on whole games, the packaged ``breakout_ppo``."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.envs import make
from raysim.envs.spaces import is_image_space
from raysim.identity import env_identity
from raysim.models import Actor, ModelConfig, RowMemory
from raysim.models.encoders import NatureCNN
from raysim.rollout import EnvShard, EvalEpisodes

pytest.importorskip("ale_py", reason="the Atari preset needs ale-py (raysim[atari])")

BREAKOUT = "gym:BreakoutNoFrameskip-v4"


def test_the_preset_observes_uint8_stacks_of_four_84x84_frames_that_the_nature_cnn_reads():
    env = make(BREAKOUT, 2, seed=0, atari={})
    space = env.observation_spaces["policy"]
    assert space.shape == (4, 84, 84) and space.dtype == np.uint8 and is_image_space(space)
    obs = env.reset(1)["policy"]
    assert obs.dtype == torch.uint8 and obs.shape == (2, 4, 84, 84)
    step = env.step(torch.ones(2, dtype=torch.int64))
    assert step.obs["policy"].dtype == torch.uint8 and step.obs["policy"].shape == (2, 4, 84, 84)
    assert env.max_episode_steps == 27_000  # 108000 frames, 4 per step
    actor = Actor(env.observation_spaces, env.action_space, ModelConfig(actor_inputs=["policy"]))
    assert any(isinstance(m, NatureCNN) for m in actor.modules())
    env.close()


def play_one_game(game: str) -> tuple[list, list, list]:
    """The same game (same seed, same random actions) in a training env and an evaluation env, to its end:
    the training env's steps, the evaluation env's steps, and the lives lost on the way."""
    train = make(f"gym:{game}", 1, seed=0, atari={})
    scored = make(f"gym:{game}", 1, seed=0, atari={}, evaluation=True)
    train.reset(7), scored.reset(7)
    generator = torch.Generator().manual_seed(0)
    trained, played = [], []
    for _ in range(20_000):
        action = torch.randint(0, train.action_space.n, (1,), generator=generator)
        trained.append(train.step(action))
        played.append(scored.step(action))
        assert torch.equal(trained[-1].obs["policy"], played[-1].obs["policy"]), "not the same game"
        if played[-1].done_rows.numel():
            break
    train.close(), scored.close()
    return trained, played


@pytest.mark.parametrize("game, lives", [("BreakoutNoFrameskip-v4", 5), ("SpaceInvadersNoFrameskip-v4", 3)])
def test_a_lost_life_is_a_training_done_but_only_a_whole_game_is_an_episode_with_its_raw_score(game, lives):
    trained, played = play_one_game(game)
    assert played[-1].done_rows.tolist() == [0], "the game did not end"
    assert all(not s.done_rows.numel() for s in played[:-1]), "evaluation plays whole games: no done at a lost life"
    life_dones = [s for s in trained[:-1] if s.done_rows.numel()]
    assert len(life_dones) == lives - 1
    for step in life_dones:  # terminated (no bootstrap), its final observation, and no episode
        assert bool(step.terminated[0]) and step.final_obs["policy"].shape == (1, 4, 84, 84)
        assert step.ended_rows().numel() == 0 and step.episodes == {}
    last, raw = trained[-1], [float(s.reward[0]) for s in played]
    assert last.ended_rows().tolist() == [0] and bool(last.terminated[0])
    assert float(last.episodes["return"][0]) == float(played[-1].episodes["return"][0]) == sum(raw)
    acted = [s.valid is None for s in played]  # the policy's steps (FIRE after a lost life is the env's)
    assert int(last.episodes["length"][0]) == int(played[-1].episodes["length"][0]) == sum(acted)
    clipped = [float(np.sign(r)) for r in raw]
    assert [float(s.reward[0]) for s in trained] == clipped, "training rewards are clipped"
    if game.startswith("SpaceInvaders"):
        assert max(raw) > 1, "raw SpaceInvaders rewards are 5..30: evaluation is not clipped"


def test_after_a_lost_life_fire_is_pressed_for_the_policy_in_a_step_not_trained_on():
    for evaluation in (False, True):
        env = make(BREAKOUT, 1, seed=0, atari={}, evaluation=evaluation)
        env.reset(3)
        steps = [env.step(torch.zeros(1, dtype=torch.int64)) for _ in range(400)]  # NOOP only: FIRE is the env's
        lost = [t for t, s in enumerate(steps[:-1]) if not s.ended_rows().numel() and steps[t + 1].valid is not None]
        assert len(lost) >= 4, "the ball was not launched after a lost life"
        for t in lost:
            assert steps[t + 1].valid.tolist() == [False] and float(steps[t + 1].reward[0]) == 0.0
            assert bool(steps[t].terminated[0]) == (not evaluation)  # a training done only
        assert any(s.ended_rows().numel() for s in steps), "a NOOP policy's game ends: every life was launched"
        env.close()


def test_a_training_chunk_reports_games_not_lives():
    shard = EnvShard(BREAKOUT, 1, seed=3, env_kwargs={"atari": {}}, model={"hidden_sizes": [16]})
    weights = {"version": 0, "actor": shard.actor.state_dict()}
    chunk = shard.rollout(weights, 700)
    games = chunk.episodes
    assert games["return"].numel() >= 1, "no game ended in 700 random steps"
    assert int(chunk.terminated.sum()) >= 5 * games["return"].numel() > 0, "every lost life is a done"
    assert bool(chunk.terminated[games["t"], games["row"]].all())
    first_t, first_row = int(games["t"][0]), int(games["row"][0])
    fires = chunk.mask[: first_t + 1, first_row].logical_not()  # FIRE after each lost life: the env's, not trained on
    assert int(fires.sum()) == 4 and not bool(chunk.reward[: first_t + 1, first_row][fires].any())
    assert int(games["length"][0]) == first_t + 1 - 4  # the policy's steps of the first game


def test_evaluation_counts_whole_games_with_raw_scores_even_where_lives_end_trajectories():
    model = {"hidden_sizes": [16]}
    scored = EnvShard(BREAKOUT, 2, seed=3, env_kwargs={"atari": {}}, model=model, evaluation=True)
    assert not scored.env.episodic_life and not scored.env.clip_rewards
    training = EnvShard(BREAKOUT, 2, seed=3, env_kwargs={"atari": {}}, model=model)
    assert training.env.episodic_life and training.env.clip_rewards
    weights = {"version": 0, "actor": scored.actor.state_dict()}
    plan = EvalEpisodes(quotas=[1, 2], row_offset=0, seed=5, max_steps=5000, deterministic=False)
    games, _, scoring = scored.evaluate(weights, plan)
    assert scoring.defines_success is False
    assert sorted(r["episode"] for r, _ in games) == [0, 1, 3] and all(r["terminated"] for r, _ in games)
    # the same games through the training env: lives end its trajectories, yet evaluation counts the games
    same, _, _ = training.evaluate(weights, plan)
    summary = sorted((r["episode"], r["length"], r["return"]) for r, _ in games)
    assert sorted((r["episode"], r["length"], r["return"]) for r, _ in same) == summary


class RestartLog(RowMemory):
    """A row memory that notes, at each step the policy reads, whether the row's state restarts there."""

    def __init__(self, core, rows: int):
        super().__init__(core, rows)
        self.restarts: list[bool] = []

    def advance(self, core, x, by_row=False):
        self.restarts.append(bool(self.starting[0]))
        return super().advance(core, x, by_row)


def test_a_recurrent_policys_state_restarts_at_each_lost_life_in_evaluation_as_in_training():
    """Trained with episodic life, a recurrent policy's state was zeroed at every life: evaluation, which plays
    whole games, restarts it there too, so the game is the one the training env's lives-as-dones give."""
    model = {"hidden_sizes": [16], "recurrent": "lstm", "recurrent_size": 8, "cnn_features": 32}
    plan = EvalEpisodes(quotas=[1], row_offset=0, seed=5, max_steps=5000, deterministic=False)
    played = {}
    for evaluation in (True, False):
        shard = EnvShard(BREAKOUT, 1, seed=3, env_kwargs={"atari": {}}, model=model, evaluation=evaluation)
        shard.memory = RestartLog(shard.actor.core, 1)
        torch.manual_seed(0)
        weights = {"version": 0, "actor": Actor(*shard.spaces()[:2], ModelConfig(**model)).state_dict()}
        games, _, _ = shard.evaluate(weights, plan)
        played[evaluation] = [(r["length"], r["return"]) for r, _ in games], shard.memory.restarts
        shard.env.close()
    assert played[True] == played[False]
    assert sum(played[True][1]) == 5, "a game of Breakout's 5 lives: its start and 4 lost lives restart the state"


def test_equal_reset_seeds_give_equal_games():
    env = make(BREAKOUT, 3, seed=0, atari={})
    obs = env.reset_rows(torch.tensor([2, 0]), [11, 11])["policy"]
    assert torch.equal(obs[0], obs[2])
    for _ in range(60):
        obs = env.step(torch.tensor([1, 3, 1]))
    assert torch.equal(obs.obs["policy"][0], obs.obs["policy"][2])
    env.close()


def test_the_preset_identity_fills_defaults_and_leaves_out_threads():
    identity = env_identity({"id": BREAKOUT, "kwargs": {"atari": {}}})[0]
    assert env_identity({"id": BREAKOUT, "kwargs": {"atari": {"noop_max": 30, "threads": 2}}})[0] == identity
    assert env_identity({"id": BREAKOUT, "kwargs": {"atari": {"noop_max": 10}}})[0] != identity
    assert env_identity({"id": "gym:ALE/Breakout-v5", "kwargs": {"atari": {}}})[0] != identity  # sticky actions


def test_sticky_actions_come_from_the_id():
    from raysim.envs.atari import ale_settings

    assert ale_settings("BreakoutNoFrameskip-v4", {})["repeat_action_probability"] == 0.0
    assert ale_settings("ALE/Breakout-v5", {})["repeat_action_probability"] == 0.25
    with pytest.raises(ValueError, match="NoFrameskip-v4"):
        ale_settings("Breakout-v4", {})  # a random frame skip of 2..5


@pytest.fixture(scope="module")
def breakout_run(tmp_path_factory) -> tuple[Path, str]:
    """A tiny local run of the packaged ``breakout_ppo`` with a 2-game evaluation, and what it printed."""
    from raysim.cli import main

    run = tmp_path_factory.mktemp("breakout") / "run"
    tiny = ["env.num_envs=2", "algo.num_steps=160", "algo.num_minibatches=2", "algo.update_epochs=1"]
    tiny += ["train.total_steps=640", "eval.episodes=2", "eval.num_envs=2", "eval.max_steps=3000"]
    tiny += ["model.cnn_features=32", "model.hidden_sizes=[16]"]
    args = [a for item in tiny for a in ("--set", item)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["train", "breakout_ppo", "--local", *args, "--run-dir", str(run)]) == 0
    return run, printed.getvalue()


def test_the_packaged_breakout_ppo_trains_and_evaluates_whole_games_in_a_tiny_local_run(breakout_run):
    import pyarrow.parquet as pq

    run, out = breakout_run
    assert "episode_return" in out or "return" in out
    records = [r for path in sorted((run / "eval").glob("*.parquet")) for r in pq.read_table(path).to_pylist()]
    assert len(records) == 2 and all(r["terminated"] for r in records)


def test_a_video_of_an_atari_evaluation_holds_every_frame_of_its_counted_games(breakout_run, tmp_path):
    import imageio.v3 as iio
    import pyarrow.parquet as pq

    from raysim.cli import main

    run, video, records = breakout_run[0], tmp_path / "games.mp4", tmp_path / "games.parquet"
    args = ["--local", "--episodes", "2", "--shards", "1", "--envs-per-shard", "2", "--video-size", "84"]
    assert main(["eval", str(run), *args, "--out", str(records), "--video", str(video)]) == 0
    games = pq.read_table(records).to_pylist()
    frames = iio.imread(video, index=None)
    assert len(games) == 2 and all(game["terminated"] for game in games)  # whole games, not lives
    # a frame a step of the longest game, 2 tiles side by side; a game's length leaves out the FIRE the env
    # presses after each of its 4 lost lives before the last (a step of the evaluation, filmed)
    assert frames.shape == (max(game["length"] for game in games) + 4, 84, 2 * 84 + 2, 3)


def test_pictures_for_videos_are_the_newest_frame_the_policy_sees():
    env = make(BREAKOUT, 2, seed=0, atari={}, render_mode="rgb_array")  # what a filmed evaluation passes
    step = env.step(torch.ones(2, dtype=torch.int64))
    pictures = env.frames(168)
    assert pictures.shape == (2, 168, 168, 3) and pictures.dtype == torch.uint8
    newest = step.obs["policy"][:, -1]
    assert torch.equal(pictures[:, ::2, ::2, 0], newest) and torch.equal(pictures[..., 0], pictures[..., 2])
    env.close()
