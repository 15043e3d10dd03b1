"""GRPO on success: success in the group episodes, dynamic sampling of informative groups, a success reward."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import raysim
from raysim.algos import GRPO, GRPOConfig
from raysim.cli import main
from raysim.learner import Learner
from raysim.metrics import ConsoleSink, ParquetSink
from raysim.models.networks import ModelConfig
from raysim.records import read_metrics
from raysim.rollout import GroupEpisodes
from raysim.rollout.dynamic_sampling import informative_groups
from raysim.rollout.shard import EnvShard
from raysim.storage import open_storage

COIN = "tests.support.coin:Coin"
# 16 rows: 4 groups of 4 a round; episodes of at most 4 steps
SAMPLING = [
    "backend=local",
    f"env.id={COIN}",
    "env.num_envs=16",
    "model.critic=false",
    "model.hidden_sizes=[16]",
    "algo.group_size=4",
    "algo.num_steps=4",
    "algo.update_epochs=1",
    "algo.num_minibatches=2",
    "algo.groups_per_shard=3",
    "train.log_every=1",
    "eval.episodes=0",
]


def coin_shard(p: float, seed: int = 0) -> EnvShard:
    return EnvShard(COIN, 16, seed=seed, model=ModelConfig(critic=False, hidden_sizes=[16]), env_kwargs={"p": p})


def weights_of(shard: EnvShard) -> dict:
    return {"version": 0, "actor": shard.actor.state_dict()}


def test_group_episodes_carry_the_envs_success_and_grpo_training_reports_a_success_rate():
    shard = coin_shard(0.3)
    chunk = shard.rollout(weights_of(shard), GroupEpisodes(4, 4))
    assert torch.equal(chunk.episodes["success"], chunk.episodes["return"] > 0)  # a win pays 1 and ends it
    assert 0 < int(chunk.episodes["success"].sum()) < 16
    spaces, action_space, _ = shard.spaces()
    model, algo = ModelConfig(critic=False, hidden_sizes=[16]), GRPOConfig(group_size=4)
    learner = Learner(spaces, action_space, model, algo, horizon=10, seed=0)
    metrics = learner.update(chunk)
    assert metrics["success_rate"] == pytest.approx(float(chunk.episodes["success"].float().mean()))
    cartpole = EnvShard("raysim/CartPole", 8, model=ModelConfig(critic=False))  # defines no success: no column
    assert "success" not in cartpole.rollout(weights_of(cartpole), GroupEpisodes(4, 5)).episodes


def test_a_dynamic_sampling_chunk_holds_exactly_the_configured_informative_groups_and_counts_every_step_played():
    shard = coin_shard(0.1)  # most groups all fail: rounds are dropped
    plan = GroupEpisodes(4, 4, keep_groups=3, max_rounds=8)
    chunk = shard.rollout(weights_of(shard), plan)
    episodes = chunk.episodes
    rounds = shard.group_rounds
    assert rounds > 1 and chunk.groups_played == 4 * rounds and chunk.groups_dropped == 4 * rounds - 3
    assert chunk.num_envs == 12 and chunk.groups_filled == 0
    kept = episodes["row"] >= 0
    returns = torch.zeros(12)
    returns[episodes["row"][kept]] = episodes["return"][kept]
    assert bool(informative_groups(returns, 4).all())  # every kept group's rows differ
    assert int(kept.sum()) == 12 and episodes["return"].numel() == 16 * rounds  # every episode played is reported
    assert chunk.env_steps == int(episodes["length"].sum())  # every step played, the dropped groups' too
    assert chunk.transitions == int(episodes["length"][kept].sum()) < chunk.env_steps
    lengths = torch.zeros(12, dtype=torch.int64)
    lengths[episodes["row"][kept]] = episodes["length"][kept]
    assert torch.equal(chunk.mask, torch.arange(chunk.num_steps).unsqueeze(1) < lengths)  # padding is masked


def test_a_restored_shard_plays_the_same_dynamic_sampling_rounds():
    plan = GroupEpisodes(4, 4, keep_groups=3, max_rounds=8)
    shard = coin_shard(0.1)
    shard.rollout(weights_of(shard), plan)
    state = shard.get_state()
    expected = shard.rollout(weights_of(shard), plan)
    twin = coin_shard(0.1)
    assert twin.set_state(state) == "exact"
    again = twin.rollout(weights_of(shard), plan)
    assert torch.equal(again.obs["policy"], expected.obs["policy"]) and torch.equal(again.actions, expected.actions)
    assert all(torch.equal(again.episodes[k], expected.episodes[k]) for k in expected.episodes)
    assert twin.group_rounds == shard.group_rounds


def test_dynamic_sampling_trains_on_the_configured_groups_reports_the_dropped_fraction_and_counts_steps_exactly(
    tmp_path: Path, monkeypatch
):
    trained_rows = []
    batch = GRPO.batch

    def recording(self, chunks):
        trained_rows.extend(c.num_envs for c in chunks)
        return batch(self, chunks)

    monkeypatch.setattr(GRPO, "batch", recording)
    overrides = [*SAMPLING, "env.kwargs.p=0.1", "algo.lr_schedule=linear", "train.total_steps=1000"]
    config = raysim.load_config("cartpole_grpo", [*overrides, f"run_dir={tmp_path / 'run'}"])
    summary = raysim.Trainer(config, sinks=[ParquetSink(open_storage(tmp_path / "metrics"))]).train()
    rows = read_metrics(open_storage(tmp_path / "metrics"))
    assert trained_rows == [12] * len(rows)  # every update: exactly groups_per_shard groups of 4 rows
    assert all(0 < r["groups_dropped"] < 1 and r["groups_filled"] == 0 for r in rows)
    # every step played, dropped groups' included, is in the run's env steps: the episodes' lengths add up to them
    played = sum(round(r["episode_length"] * r["episodes"]) for r in rows)
    assert played == summary.env_steps == int(rows[-1]["env_steps"]) >= 1000
    consumed = [0] + [int(r["env_steps"]) for r in rows[:-1]]
    assert all(0 < r["env_steps_trained"] < b - a for r, a, b in zip(rows, consumed, consumed[1:], strict=False))
    assert [r["lr"] for r in rows] == [config.algo.lr * max(0.0, 1.0 - s / 1000) for s in consumed]  # every step


def test_a_dynamic_sampling_run_stopped_and_resumed_ends_as_the_uninterrupted_run(tmp_path: Path):
    overrides = [*SAMPLING, "env.kwargs.p=0.1", "train.total_steps=400", "train.sinks=[parquet]"]

    def train(run_dir: Path, *more: str) -> None:
        raysim.Trainer(raysim.load_config("cartpole_grpo", [*overrides, *more, f"run_dir={run_dir}"])).train()

    def metrics(run_dir: Path) -> list[dict]:
        timing = ("time", "steps_per_s", "time_collect", "time_update", "time_eval", "time_checkpoint")
        return [{k: v for k, v in r.items() if k not in timing} for r in read_metrics(open_storage(run_dir))]

    run, straight = tmp_path / "run", tmp_path / "straight"
    train(run, "train.stop_after=2")
    raysim.Trainer.from_run_dir(run).train()
    train(straight)
    assert len(metrics(run)) > 3 and metrics(run) == metrics(straight)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_without_informative_groups_a_shard_stops_at_max_rounds_trains_on_what_it_has_and_says_so_once(
    tmp_path: Path, p: float
):
    overrides = [*SAMPLING, f"env.kwargs.p={p}", "algo.max_rounds=2", "train.total_steps=200"]
    config = raysim.load_config("cartpole_grpo", [*overrides, f"run_dir={tmp_path / 'run'}"])
    console = io.StringIO()
    sinks = [ConsoleSink(200, stream=console, live=False), ParquetSink(open_storage(tmp_path / "metrics"))]
    summary = raysim.Trainer(config, sinks=sinks).train()
    rows = read_metrics(open_storage(tmp_path / "metrics"))
    assert len(rows) >= 2 and summary.iterations == len(rows)
    assert all(r["groups_filled"] == 1.0 and r["groups_dropped"] == 5 / 8 for r in rows)  # 2 rounds: 3 of 8 kept
    assert all(r["pg_loss"] == 0.0 and r["success_rate"] == p for r in rows)  # zero advantages: no policy gradient
    assert console.getvalue().count("algo.max_rounds") == 1


def test_dynamic_sampling_refuses_a_policy_lag_and_more_groups_than_a_round_has_in_one_line(tmp_path: Path, capsys):
    for setting, message in [
        ("algo.max_policy_lag=1", "algo.groups_per_shard (dynamic sampling) runs lockstep only"),
        ("algo.groups_per_shard=5", "algo.groups_per_shard (5) must be at most the groups of a round"),
    ]:
        argv = ["train", "cartpole_grpo", "--local", "--run-dir", str(tmp_path / "run")]
        argv += [x for o in [*SAMPLING, setting] for x in ("--set", o)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "run").exists()


def test_metaworld_success_reward_pays_one_at_the_first_success_and_end_on_success_ends_the_episode_there():
    pytest.importorskip("metaworld")
    from raysim.envs.meta_world import MetaWorld

    for end_on_success in (True, False):
        env = MetaWorld(1, seed=0, tasks="reach-v3", reward="success", end_on_success=end_on_success)
        env.reset(0)
        rewards, first = [], None
        for t in range(200):
            step = env.step(env.expert_actions())
            rewards.append(float(step.reward[0]))
            first = t if first is None and rewards[-1] else first
            if step.done_rows.numel() or (first is not None and t >= first + 5):
                break
        assert first is not None and rewards[first] == 1.0 and sum(rewards) == 1.0  # 1 once, at the first success
        if end_on_success:
            assert t == first and bool(step.terminated[0]) and bool(step.episodes["success"][0])
        else:
            assert t == first + 5 and not step.done_rows.numel()  # the episode goes on, unpaid
        env.close()
    with pytest.raises(ValueError, match="reward must be one of"):
        MetaWorld(1, tasks="reach-v3", reward="sparse")
