"""Observation normalization (``model.obs_norm``): running statistics that change in ``Learner.update`` only."""

from __future__ import annotations

import copy
import threading

import numpy as np
import torch

import raysim
from raysim.algos.ppo import PPOConfig
from raysim.checkpoint import locate_checkpoint
from raysim.learner import Learner
from raysim.models.networks import ActorCritic, ModelConfig
from raysim.models.normalizer import RunningNorm, combine, moments
from raysim.rollout import EvalEpisodes
from raysim.rollout.advantages import chunk_values, terminal_values
from raysim.rollout.shard import EnvShard

NORM = ModelConfig(hidden_sizes=[16, 16], obs_norm=True)
TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "train.total_steps=1024",
    "eval.episodes=4",
    "eval.num_envs=2",
    "train.log_every=1",
    "model.obs_norm=true",
]


def buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items() if "obs_norm." in k}


def learner(shard: EnvShard, seed: int = 0, rank: int = 0, world_size: int = 1) -> Learner:
    algo = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=1)
    return Learner(*shard.spaces()[:2], NORM, algo, horizon=10, seed=seed, rank=rank, world_size=world_size)


def test_running_statistics_equal_numpy_over_all_updates():
    rng = np.random.default_rng(0)
    norm = RunningNorm(3)
    seen = []
    for size in (1, 7, 100, 0, 333, 2):
        x = rng.normal(loc=[1.0, -5.0, 100.0], scale=[0.1, 3.0, 20.0], size=(size, 3)).astype(np.float32)
        norm.update(torch.from_numpy(x))
        seen.append(x)
        all_x = np.concatenate(seen).astype(np.float64)
        if len(all_x):
            assert float(norm.count) == len(all_x)
            np.testing.assert_allclose(norm.mean.numpy(), all_x.mean(0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(norm.var.numpy(), all_x.var(0), rtol=1e-5, atol=1e-6)
    x = torch.randn(10, 3) * 1000
    expected = torch.clamp((x - norm.mean) / torch.sqrt(norm.var + 1e-8), -10, 10)
    assert torch.equal(norm(x), expected) and float(norm(x).abs().max()) == 10.0


def test_combining_two_halves_equals_one_pass():
    x = torch.randn(1001, 5, dtype=torch.float64) * torch.tensor([1.0, 2, 3, 4, 5]) + 7
    whole = moments(x)
    for split in (0, 1, 500, 1000, 1001):
        n, mean, var = combine(moments(x[:split]), moments(x[split:]))
        assert float(n) == float(whole[0])
        torch.testing.assert_close(mean, whole[1], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(var, whole[2], rtol=1e-12, atol=1e-12)


def test_two_learner_ranks_hold_identical_statistics_equal_to_one_pass_over_both_batches(monkeypatch):
    """The ranks' batch statistics are gathered and combined on every rank (``all_gather`` simulated in-process)."""
    shards = [EnvShard("raysim/CartPole", 8, seed=s, model=NORM, env_kwargs={"max_episode_steps": 10}) for s in (1, 2)]
    chunks = [s.rollout({"version": 0, "actor": s.actor.state_dict()}, 16) for s in shards]
    single = learner(shards[0])
    single.update_normalizers(list(chunks))
    ranks = [learner(shards[0], rank=r, world_size=2) for r in range(2)]
    posted: dict[int, torch.Tensor] = {}
    barrier, local = threading.Barrier(2), threading.local()

    def all_gather(parts, tensor):
        posted[local.rank] = tensor.clone()
        barrier.wait()
        for r, part in enumerate(parts):
            part.copy_(posted[r])

    monkeypatch.setattr("raysim.learner.ranks.dist.all_gather", all_gather)

    def run(rank):
        local.rank = rank
        ranks[rank].update_normalizers([chunks[rank]])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    a, b, one = (buffers(x.model) for x in (*ranks, single))
    assert a.keys() == one.keys() and len(a) == 6  # actor and critic: mean, var, count
    assert all(torch.equal(a[k], b[k]) for k in a)  # identical on every rank
    for k in a:
        torch.testing.assert_close(a[k], one[k], rtol=1e-6, atol=1e-7)


def test_statistics_change_only_in_the_learners_update_from_the_chunks_valid_observations():
    shard = EnvShard("raysim/CartPole", 8, seed=0, model=NORM, env_kwargs={"max_episode_steps": 12})
    learn = learner(shard)
    weights = learn.get_weights()
    before_model, before_shard = buffers(learn.model), buffers(shard.actor)
    chunk = shard.rollout(weights, 16)  # shard rollout
    shard.evaluate(weights, EvalEpisodes([2] * 8, 0, seed=3, max_steps=50))  # evaluation
    chunk_values(learn.model.critic, chunk)  # value and terminal-value inference
    terminal_values(learn.model.critic, chunk)
    learn.algorithm.batch([chunk])
    assert chunk.final_obs["policy"].shape[0] > 0  # final observations were there to be (wrongly) used
    for now, then in ((buffers(learn.model), before_model), (buffers(shard.actor), before_shard)):
        assert all(torch.equal(now[k], then[k]) for k in then)

    learn.update(chunk)  # the one place they change
    valid = chunk.obs["policy"][:-1][chunk.mask].double()
    for prefix in ("actor", "critic"):
        norm = getattr(learn.model, prefix).obs_norm
        assert float(norm.count) == valid.shape[0] == 16 * 8
        torch.testing.assert_close(norm.mean, valid.mean(0).float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(norm.var, valid.var(0, unbiased=False).float(), rtol=1e-5, atol=1e-6)

    # the shard's actor receives the learner's statistics with the weights
    weights = learn.get_weights()
    assert "obs_norm.mean" in weights["actor"]
    shard.rollout(weights, 4)
    received = buffers(shard.actor)
    expected = {k: v for k, v in buffers(learn.model).items() if k.startswith("actor.")}
    assert all(torch.equal(received[k[len("actor.") :]], v) for k, v in expected.items())
    # and acts on normalized observations: the fused path equals the module's forward
    obs = chunk.obs["policy"][0]
    with torch.no_grad():
        assert torch.equal(shard.actor(obs), shard.actor.net(shard.actor.obs_norm(obs)))


def test_masked_transitions_do_not_enter_the_statistics():
    shard = EnvShard("raysim/CartPole", 4, seed=0, model=NORM)
    learn = learner(shard)
    chunk = shard.rollout(learn.get_weights(), 16)
    chunk.mask[::2] = False
    learn.update_normalizers([chunk])
    valid = chunk.obs["policy"][:-1][chunk.mask].double()
    assert float(learn.model.actor.obs_norm.count) == valid.shape[0] == 8 * 4
    torch.testing.assert_close(learn.model.actor.obs_norm.mean, valid.mean(0).float(), rtol=1e-5, atol=1e-6)


def test_without_obs_norm_nothing_changes():
    model = ActorCritic(*EnvShard("raysim/CartPole", 1).spaces()[:2], ModelConfig())
    assert model.actor.obs_norm is None and model.critic.obs_norm is None
    assert not any("obs_norm" in k for k in model.state_dict())


def test_a_local_run_with_obs_norm_saves_its_statistics_and_a_resumed_run_continues_them(tmp_path):
    overrides = [*TINY, "train.total_steps=2048"]  # 16 iterations of 128 steps
    straight = raysim.Trainer(raysim.load_config(None, [*overrides, f"run_dir={tmp_path / 'a'}"])).train()
    raysim.Trainer(raysim.load_config(None, [*overrides, "train.stop_after=8", f"run_dir={tmp_path / 'b'}"])).train()
    _, _, state, _ = locate_checkpoint(tmp_path / "b")
    halfway = copy.deepcopy(state["model"])
    for prefix in ("actor", "critic"):
        assert float(halfway[f"{prefix}.obs_norm.count"]) == 8 * 128  # every training transition, nothing else
        assert not torch.equal(halfway[f"{prefix}.obs_norm.var"], torch.ones(4))
    resumed = raysim.Trainer.from_run_dir(tmp_path / "b").train()
    assert straight.iterations == resumed.iterations == 16
    _, _, a, _ = locate_checkpoint(tmp_path / "a")
    _, _, b, _ = locate_checkpoint(tmp_path / "b")
    a, b = a["model"], b["model"]
    assert float(b["actor.obs_norm.count"]) == 16 * 128  # continued from the checkpoint's statistics
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # exactly as without the stop
    assert straight.evaluation.records == resumed.evaluation.records


def test_an_update_reads_the_statistics_the_actors_acted_with_so_its_first_ratio_is_exactly_one():
    """Lockstep with ``model.obs_norm`` is plain PPO: the chunk's statistics are merged after the update."""
    shard = EnvShard("raysim/CartPole", 8, seed=0, model=NORM, env_kwargs={"max_episode_steps": 12})
    algo = PPOConfig(num_steps=16, num_minibatches=1, update_epochs=1, lr=1e-12)  # the metrics: the first minibatch's
    learn = Learner(*shard.spaces()[:2], NORM, algo, horizon=10)
    for _ in range(3):
        chunk = shard.rollout(learn.get_weights(), 16)
        before = buffers(learn.model)
        metrics = learn.update(chunk)
        assert metrics["approx_kl"] == 0.0 and metrics["clipfrac"] == 0.0
        assert float(learn.model.actor.obs_norm.count) == float(before["actor.obs_norm.count"]) + 16 * 8  # merged
