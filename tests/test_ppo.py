"""PPO: the log-space clipped objective, the guarded optimizer step, and the Learner around them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from raysim.algos.epochs import run_epochs
from raysim.algos.guard import GuardedStep, NonFiniteUpdateError
from raysim.algos.ppo import PPOConfig, clipped_objective
from raysim.config import load_config
from raysim.coordinator import Trainer
from raysim.learner import Learner
from raysim.metrics import ParquetSink
from raysim.models.networks import ModelConfig
from raysim.records import read_metrics
from raysim.rollout.inference import inference
from raysim.rollout.shard import EnvShard
from raysim.storage import open_storage
from tests.support.threaded_ranks import ThreadedRanks

EPS = 0.2


def classic(logratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float = EPS) -> torch.Tensor:
    ratio = logratio.exp()
    return torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages)


def objective_and_grads(fn, logratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float = EPS):
    logratio = logratio.clone().requires_grad_(True)
    advantages = advantages.clone().requires_grad_(True)
    out = fn(logratio, advantages, clip_coef)
    grads = torch.autograd.grad(out.sum(), [logratio, advantages])
    return out.detach(), grads[0], grads[1]


@pytest.mark.parametrize("clip_coef", [0.1, 0.2, 0.3])
def test_log_space_objective_and_gradients_equal_the_classic_form_on_moderate_ratios(clip_coef):
    generator = torch.Generator().manual_seed(int(clip_coef * 10))
    logratio = (torch.rand(4096, generator=generator, dtype=torch.float64) - 0.5) * 1.2  # ratio in ~[0.55, 1.8]
    advantages = torch.randn(4096, generator=generator, dtype=torch.float64) * 3
    ratio = logratio.exp()
    # every regime is present: clipped above and below, for both signs of A, and unclipped
    assert (ratio > 1 + clip_coef).any() and (ratio < 1 - clip_coef).any()
    assert (advantages > 0).any() and (advantages < 0).any()

    ours = objective_and_grads(clipped_objective, logratio, advantages, clip_coef)
    reference = objective_and_grads(classic, logratio, advantages, clip_coef)
    assert ours[0].dtype == torch.float64
    for mine, theirs, name in zip(ours, reference, ("objective", "d/dlogratio", "d/dadvantages"), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def test_log_space_objective_stays_finite_at_a_huge_ratio_with_non_negative_advantages_unlike_the_classic_form():
    logratio = torch.full((4,), 100.0)
    for value in (2.0, 0.0):
        advantages = torch.full((4,), value)
        out, d_logratio, d_adv = objective_and_grads(clipped_objective, logratio, advantages)
        assert torch.isfinite(out).all() and torch.isfinite(d_logratio).all() and torch.isfinite(d_adv).all()
        torch.testing.assert_close(out, advantages * (1 + EPS))  # the clipped branch: A * (1 + eps)
        assert (d_logratio == 0).all()  # clipped: no gradient through the ratio
        torch.testing.assert_close(d_adv, torch.full((4,), 1 + EPS))

        c_out, c_dlog, c_dadv = objective_and_grads(classic, logratio, advantages)
        classic_finite = bool(
            torch.isfinite(c_out).all() and torch.isfinite(c_dlog).all() and torch.isfinite(c_dadv).all()
        )
        assert not classic_finite, f"the classic form was finite at A={value}"
        if value == 0.0:
            assert torch.isnan(c_out).all()  # inf * 0


def test_log_space_objective_is_finite_at_a_tiny_ratio_with_negative_advantages():
    logratio = torch.full((4,), -100.0)
    advantages = torch.full((4,), -1.5)
    out, d_logratio, d_adv = objective_and_grads(clipped_objective, logratio, advantages)
    assert torch.isfinite(out).all() and torch.isfinite(d_logratio).all() and torch.isfinite(d_adv).all()
    torch.testing.assert_close(out, advantages * (1 - EPS))
    assert (d_logratio == 0).all()


def test_a_huge_ratio_with_negative_advantages_is_unbounded_below():
    out = clipped_objective(torch.full((3,), 100.0), torch.full((3,), -1.0), EPS)
    assert torch.isneginf(out).all()


class LogRatioModel(nn.Module):
    """A 'policy' whose log-ratio is a parameter: logratio = w * x + b."""

    def __init__(self, bias: float):
        super().__init__()
        self.layer = nn.Linear(1, 1)
        with torch.no_grad():
            self.layer.weight.fill_(0.5)
            self.layer.bias.fill_(bias)

    def loss(self, advantages: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logratio = self.layer(torch.ones(advantages.shape[0], 1)).squeeze(1)
        pg_loss = -clipped_objective(logratio, advantages, EPS).mean()
        return pg_loss, {"pg_loss": pg_loss}


def test_guarded_step_skips_an_unbounded_objective_without_touching_the_weights_and_stops_after_repeats():
    model = LogRatioModel(bias=100.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    step = GuardedStep(optimizer, max_grad_norm=0.5, max_consecutive=3)
    before = copy.deepcopy(model.state_dict())
    advantages = -torch.ones(8)

    for expected in (1, 2):
        loss, terms = model.loss(advantages)
        assert torch.isposinf(loss)  # -(-inf)
        assert step(loss, terms) is None
        assert step.skipped == expected and step.consecutive == expected
        for name, value in model.state_dict().items():
            assert torch.equal(value, before[name])
        assert all(p.grad is None for p in model.parameters())
        assert not optimizer.state  # Adam never stepped

    loss, terms = model.loss(advantages)
    with pytest.raises(NonFiniteUpdateError, match="pg_loss") as info:
        step(loss, terms)
    assert "3 consecutive" in str(info.value)
    assert step.skipped == 3
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_guarded_step_skips_a_finite_loss_with_non_finite_gradients_and_names_the_gradient_norm():
    model = LogRatioModel(bias=100.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = GuardedStep(optimizer, max_grad_norm=0.5, max_consecutive=1)
    before = copy.deepcopy(model.state_dict())
    logratio = model.layer(torch.ones(4, 1)).squeeze(1)
    loss = -classic(logratio, torch.ones(4)).mean()  # finite (clipped branch), gradient inf * 0 = NaN
    assert torch.isfinite(loss)
    with pytest.raises(NonFiniteUpdateError, match="grad_norm"):
        step(loss, {"pg_loss": loss})
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_a_finite_step_is_applied_and_resets_the_consecutive_count():
    model = LogRatioModel(bias=100.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = GuardedStep(optimizer, max_grad_norm=0.5, max_consecutive=2)
    loss, terms = model.loss(-torch.ones(4))
    assert step(loss, terms) is None and step.consecutive == 1
    with torch.no_grad():
        model.layer.bias.fill_(-0.5)  # logratio 0: inside the clip range
    before = copy.deepcopy(model.state_dict())
    loss, terms = model.loss(torch.ones(4))
    grad_norm = step(loss, terms)
    assert grad_norm is not None and torch.isfinite(grad_norm) and grad_norm > 0
    assert step.consecutive == 0 and step.skipped == 1
    assert not torch.equal(model.layer.bias, before["layer.bias"])


# --- the Learner -------------------------------------------------------------------------------


def cartpole_learner_and_shard(**algo):
    shard = EnvShard("raysim/CartPole", 4, seed=3, model=ModelConfig(hidden_sizes=[16, 16]))
    spaces, action_space, _ = shard.spaces()
    config = PPOConfig(**{"num_steps": 16, "update_epochs": 2, "num_minibatches": 2, **algo})
    learner = Learner(spaces, action_space, ModelConfig(hidden_sizes=[16, 16]), config, horizon=5, seed=1)
    return learner, shard


def clone_chunk(chunk):
    return {
        k: ({g: t.clone() for g, t in v.items()} if isinstance(v, dict) else v.clone() if torch.is_tensor(v) else v)
        for k, v in vars(chunk).items()
    }


def test_learner_weights_are_cpu_copies_whose_version_increments_with_every_update():
    learner, shard = cartpole_learner_and_shard()
    weights = learner.get_weights()
    assert weights["version"] == 0
    assert set(weights["actor"]) == set(learner.model.actor.state_dict())
    for name, tensor in weights["actor"].items():
        assert tensor.device.type == "cpu" and not tensor.requires_grad
        assert tensor.data_ptr() != learner.model.actor.state_dict()[name].data_ptr()  # a copy, not a view
    first = {k: v.clone() for k, v in weights["actor"].items()}

    for version in (1, 2, 3):
        chunk = shard.rollout(weights, 16)
        assert chunk.policy_version == version - 1
        metrics = learner.update(chunk)
        assert metrics["policy_version"] == version
        weights = learner.get_weights()
        assert weights["version"] == version
        assert all(t.device.type == "cpu" for t in weights["actor"].values())
    # the weights moved, and the first snapshot was not changed by the updates
    assert any(not torch.equal(first[k], weights["actor"][k]) for k in first)
    # the learner's own actor holds the published weights
    for name, tensor in learner.model.actor.state_dict().items():
        assert torch.equal(tensor, weights["actor"][name])


def test_learner_update_never_modifies_the_chunks_tensors():
    learner, shard = cartpole_learner_and_shard()
    chunks = [shard.rollout(learner.get_weights(), 16) for _ in range(2)]
    before = [clone_chunk(c) for c in chunks]
    metrics = learner.update(*chunks)
    assert metrics["env_steps"] == 2 * 16 * 4
    for chunk, saved in zip(chunks, before, strict=True):
        for name, value in vars(chunk).items():
            if isinstance(value, dict):
                assert value.keys() == saved[name].keys()
                for group, tensor in value.items():
                    assert torch.equal(tensor, saved[name][group]), (name, group)
            elif torch.is_tensor(value):
                assert torch.equal(value, saved[name]), name
            else:
                assert value == saved[name], name


def test_learner_update_reports_the_ppo_metrics_as_plain_finite_numbers():
    learner, shard = cartpole_learner_and_shard()
    metrics = learner.update(shard.rollout(learner.get_weights(), 16))
    for name in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "grad_norm", "lr"):
        assert isinstance(metrics[name], float) and torch.isfinite(torch.tensor(metrics[name])), name
    assert metrics["skipped_updates"] == 0


def test_ppo_update_with_an_unbounded_objective_skips_every_minibatch_and_then_stops():
    learner, shard = cartpole_learner_and_shard(norm_adv=False, max_nonfinite_updates=3)
    batch = learner.algorithm.batch([shard.rollout(learner.get_weights(), 16)])
    batch["logprobs"] = batch["logprobs"] - 100.0  # new/old ratio e^100
    batch["advantages"] = -batch["advantages"].abs() - 1.0  # A < 0: unbounded below
    before = copy.deepcopy(learner.model.state_dict())
    config = PPOConfig(**{**vars(learner.algorithm.config), "update_epochs": 1, "num_minibatches": 2})
    loss_terms = learner.algorithm.loss_terms
    metrics = run_epochs(learner.algorithm.loss, loss_terms, learner.step, batch, config, learner.generator)
    assert metrics == {}  # nothing applied
    assert learner.step.skipped == 2
    for name, value in learner.model.state_dict().items():
        assert torch.equal(value, before[name])
    with pytest.raises(NonFiniteUpdateError, match="pg_loss"):
        run_epochs(learner.algorithm.loss, loss_terms, learner.step, batch, config, learner.generator)
    resumed, _ = cartpole_learner_and_shard(norm_adv=False, max_nonfinite_updates=3)
    resumed.load_state(learner.snapshot())  # a checkpoint: the skipped updates go on being counted
    assert (
        (resumed.step.skipped, resumed.step.consecutive) == (learner.step.skipped, learner.step.consecutive) == (3, 3)
    )


# --- several learner ranks, early stopping and the schedule ------------------------------------------


def test_two_learner_ranks_with_unequal_batches_take_the_gradient_of_one_rank_over_both(monkeypatch):
    algo = PPOConfig(num_steps=16, update_epochs=1, num_minibatches=1, norm_adv=False, max_grad_norm=1e9)
    shards = [EnvShard("raysim/CartPole", n, seed=s, env_kwargs={"max_episode_steps": 12}) for n, s in ((2, 1), (6, 2))]
    spaces, action_space, _ = shards[0].spaces()

    def learner(rank: int = 0, world_size: int = 1) -> Learner:
        return Learner(spaces, action_space, ModelConfig(), algo, horizon=10, rank=rank, world_size=world_size)

    one = learner()
    chunks = [shard.rollout(one.get_weights(), 16) for shard in shards]  # 32 and 96 transitions
    one.update(*chunks)
    ranks, group = [learner(r, 2) for r in range(2)], ThreadedRanks(2)
    group.patch(monkeypatch)
    group.run(lambda r: ranks[r].update(chunks[r]))
    for (name, p), q, r in zip(one.model.named_parameters(), *(x.model.parameters() for x in ranks), strict=True):
        assert torch.equal(q.grad, r.grad), name  # every rank applies the same gradient
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


class ScriptedKL:
    """A loss on one parameter whose minibatches report the scripted ``approx_kl`` values, in order."""

    def __init__(self, kls: list[float]):
        self.weight = nn.Parameter(torch.zeros(1))
        self.kls, self.calls = list(kls), 0

    def __call__(self, minibatch):
        loss = (self.weight * minibatch["x"]).mean()
        self.calls += 1
        return loss, {"pg_loss": loss.detach(), "approx_kl": torch.tensor(self.kls[self.calls - 1])}

    def epochs(self, size: int, target_kl: float | None, ranks=None) -> int:
        """Run 4 epochs of 2 minibatches over ``size`` samples; how many minibatches were computed."""
        config = PPOConfig(update_epochs=4, num_minibatches=2, target_kl=target_kl)
        step = GuardedStep(torch.optim.SGD([self.weight], lr=0.1), 1.0, 3, ranks)
        batch = {"actions": torch.zeros(size), "x": torch.ones(size)}
        run_epochs(self, ("pg_loss",), step, batch, config, torch.Generator().manual_seed(0))
        return self.calls


def test_target_kl_stops_after_the_epoch_whose_last_minibatch_exceeds_it_cleanrls_rule():
    zeros = [0.0] * 6
    assert ScriptedKL([0.0, 0.03, *zeros]).epochs(8, target_kl=0.02) == 2  # the epoch's mean (0.015) is below
    assert ScriptedKL([0.05, 0.0, *zeros]).epochs(8, target_kl=0.02) == 8  # only the last minibatch counts
    assert ScriptedKL([0.0, 0.03, *zeros]).epochs(8, target_kl=None) == 8


def test_target_kl_stops_a_real_ppo_update_after_the_first_epoch():
    learner, shard = cartpole_learner_and_shard(target_kl=1e-12, update_epochs=4)
    learner.update(shard.rollout(learner.get_weights(), 16))
    assert {int(s["step"]) for s in learner.optimizer.state.values()} == {2}  # 1 epoch of 2 minibatches, not 8
    unlimited, shard = cartpole_learner_and_shard(update_epochs=4)
    unlimited.update(shard.rollout(unlimited.get_weights(), 16))
    assert {int(s["step"]) for s in unlimited.optimizer.state.values()} == {8}


@pytest.mark.parametrize(
    "kls, minibatches",
    [
        ((0.01, 0.04), 8),  # rank 1 alone would stop; the union's KL (0.0175) does not exceed 0.02
        ((0.03, 0.0), 2),  # rank 1 alone would go on; the union's KL (0.0225) exceeds 0.02
    ],
)
def test_learner_ranks_stop_together_on_the_sample_weighted_kl_of_their_last_minibatches(kls, minibatches):
    sizes = (12, 4)  # minibatches of 6 and 2 samples
    losses = [ScriptedKL([0.0, kl] * 4) for kl in kls]
    group = ThreadedRanks(2)
    assert group.run(lambda r: losses[r].epochs(sizes[r], 0.02, group.view(r))) == [minibatches] * 2
    assert load_config(None, ["learner.ranks=2", "shards.count=2", "algo.target_kl=0.02"]).algo.target_kl == 0.02


def test_a_linear_schedule_falls_on_the_env_steps_consumed_toward_the_horizon():
    learner, shard = cartpole_learner_and_shard(lr_schedule="linear")  # horizon 5 env steps: too short
    learner.horizon = 1000
    assert learner.learning_rate(0) == 3e-4 and learner.learning_rate(250) == 3e-4 * 0.75
    assert learner.learning_rate(1000) == 0.0 == learner.learning_rate(1500)
    assert learner.update(shard.rollout(learner.get_weights(), 16), env_steps=600)["lr"] == 3e-4 * (1 - 0.6)
    assert learner.optimizer.param_groups[0]["lr"] == 3e-4 * (1 - 0.6)


def test_fixed_batches_keep_the_per_iteration_linear_schedule_bitwise(tmp_path):
    overrides = ["backend=local", "env.num_envs=4", "algo.num_steps=32", "algo.update_epochs=1", "train.log_every=1"]
    overrides += ["algo.lr_schedule=linear", "train.total_steps=1000", "eval.episodes=0", f"run_dir={tmp_path / 'run'}"]
    config = load_config(None, overrides)
    summary = Trainer(config, sinks=[ParquetSink(open_storage(tmp_path / "metrics"))]).train()
    rows = read_metrics(open_storage(tmp_path / "metrics"))
    planned = 8  # ceil(1000 / 128) iterations of 128 env steps: the horizon is 1024 steps
    assert summary.iterations == planned and [r["iteration"] for r in rows] == list(range(1, planned + 1))
    assert [r["lr"] for r in rows] == [config.algo.lr * max(0.0, 1.0 - i / planned) for i in range(planned)]


def test_a_chunk_of_an_older_policy_is_clipped_around_the_learners_policy_and_weighted_truncated():
    learner, shard = cartpole_learner_and_shard(max_policy_lag=1, max_is_weight=1.05, lr=0.05)
    old = shard.rollout(learner.get_weights(), 16)  # version 0, trained on after version 1 is out
    learner.update(shard.rollout(learner.get_weights(), 16))
    current = shard.rollout(learner.get_weights(), 16)  # version 1, the learner's
    learner.algorithm.version = learner.version  # as the learner sets it before an update
    assert "is_weights" not in learner.algorithm.batch([current])  # no lagging chunk: plain PPO
    batch = learner.algorithm.batch([old, current])
    lagging = int(old.mask.sum())
    actor = learner.model.actor
    with inference(actor):
        proximal, _ = actor.log_prob_entropy(batch["obs"]["policy"][:lagging], batch["actions"][:lagging])
    assert torch.equal(batch["logprobs"][:lagging], proximal)  # the ratio starts at 1 for the lagging chunk
    weights = (proximal - old.logp[old.mask]).exp()
    assert (weights > 1.05).any() and (weights < 1.05).any()  # the policy moved: some weights are truncated
    assert torch.equal(batch["is_weights"][:lagging], weights.clamp(max=1.05))
    assert torch.equal(batch["logprobs"][lagging:], current.logp[current.mask])  # the acting policy is proximal
    assert torch.equal(batch["is_weights"][lagging:], torch.ones(len(batch["logprobs"]) - lagging))
    _, metrics = learner.algorithm.loss(
        {k: v[:lagging] if torch.is_tensor(v) else v for k, v in batch.items()}
        | {"obs": {g: o[:lagging] for g, o in batch["obs"].items()}}
    )
    assert metrics["approx_kl"] == 0 and metrics["clipfrac"] == 0


class SeenRows:
    """A loss that records the rows of each minibatch (a recurrent batch: one row per env row, ``sequences``)."""

    def __init__(self):
        self.weight = nn.Parameter(torch.zeros(1))
        self.minibatches: list[list[int]] = []

    def __call__(self, minibatch):
        self.minibatches.append(minibatch["row"].tolist())
        loss = (self.weight * minibatch["row"].float()).mean()
        return loss, {"pg_loss": loss.detach(), "approx_kl": torch.tensor(0.0)}

    def run(self, rows: int, num_minibatches: int, update_epochs: int = 2) -> None:
        config = PPOConfig(update_epochs=update_epochs, num_minibatches=num_minibatches)
        step = GuardedStep(torch.optim.SGD([self.weight], lr=0.1), 1.0, 3, None)
        batch = {"actions": torch.zeros(rows), "row": torch.arange(rows), "sequences": {"mask": torch.ones(rows, 4)}}
        run_epochs(self, ("pg_loss",), step, batch, config, torch.Generator().manual_seed(0))


def test_an_uneven_split_trains_every_row_in_each_epoch_in_minibatches_that_differ_by_one_row():
    """Elastic shards make a rank's rows vary: 5 rows in 2 minibatches are 3 and 2, none left out."""
    seen = SeenRows()
    seen.run(rows=5, num_minibatches=2)
    assert sorted(len(m) for m in seen.minibatches) == [2, 2, 3, 3]
    for epoch in (seen.minibatches[:2], seen.minibatches[2:]):
        assert sorted(epoch[0] + epoch[1]) == [0, 1, 2, 3, 4]


def test_a_recurrent_batch_too_small_for_its_minibatches_is_named_in_rows():
    with pytest.raises(ValueError, match=r"a batch of 2 rows \(a recurrent model's minibatch is whole rows\) cannot"):
        SeenRows().run(rows=2, num_minibatches=4)
