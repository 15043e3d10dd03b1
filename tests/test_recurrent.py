"""Recurrent policies (``model.recurrent``): the core, row state on shards, sequences, the terminal-value rule,
evaluation layouts, overlapped collection, the refusals (exact resume: ``test_resume.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import raysim
from raysim.actors import LocalBackend
from raysim.algos.decoupled import decouple
from raysim.algos.epochs import sequence_steps, sequences, valid_steps
from raysim.algos.ppo import PPOConfig
from raysim.algos.reference import reference_of
from raysim.checkpoint import locate_checkpoint
from raysim.config import ConfigError
from raysim.envs import make
from raysim.evaluation import EvalSpec, evaluate_on_shards
from raysim.learner import Learner
from raysim.models import ActorCritic, ModelConfig, RecurrentCore, RowMemory
from raysim.rollout import EnvShard
from raysim.rollout.advantages import sequence_values
from raysim.rollout.inference import inference
from raysim.seeding import derive_seed
from tests.support.multi_input import tiny_spot_run
from tests.test_evaluation import LAYOUTS, assert_same_evaluation
from tests.test_resume import RECURRENT as RECURRENT_MODEL
from tests.test_resume import TINY
from tests.test_shard import NaNCartPole  # noqa: F401  (registers test/NaNCartPole)

ROOT = Path(__file__).resolve().parents[1]

STATELESS = {"velocities": False}
RECURRENT = [*TINY, *RECURRENT_MODEL]


def model_and_shard(kind: str = "lstm", rows: int = 4, env_kwargs: dict | None = None, seed: int = 0):
    """A recurrent ``ActorCritic`` and a shard acting with its actor's weights."""
    config = ModelConfig(recurrent=kind, recurrent_size=8, hidden_sizes=[16])
    shard = EnvShard("raysim/CartPole", rows, seed=seed, model=config, env_kwargs=env_kwargs or STATELESS)
    torch.manual_seed(seed)
    model = ActorCritic(*shard.spaces()[:2], config)
    shard.set_weights({"version": 0, "actor": model.actor.state_dict()})
    return model, shard


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_cell_computes_what_torchs_cell_does_and_by_row_each_row_alone_bitwise(kind):
    torch.manual_seed(0)
    core = RecurrentCore(kind, 5, 8)
    reference = nn.LSTMCell(5, 8) if kind == "lstm" else nn.GRUCell(5, 8)
    with torch.no_grad():
        reference.weight_ih.copy_(core.input.weight)
        reference.bias_ih.copy_(core.input.bias)
        reference.weight_hh.copy_(core.recurrent.weight)
        reference.bias_hh.copy_(core.recurrent.bias.add(torch.randn(core.recurrent.bias.shape)))
        core.recurrent.bias.copy_(reference.bias_hh)
    x, state = torch.randn(7, 5), torch.randn(7, core.state_size)
    with torch.no_grad():
        out, new = core(x, state)
        if kind == "lstm":
            h, c = reference(x, (state[:, :8], state[:, 8:]))
            expected = torch.cat([h, c], 1)
        else:
            h = expected = reference(x, state)
        torch.testing.assert_close(out, h, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(new, expected, atol=1e-6, rtol=1e-5)
        alone = [core(x[i : i + 1], state[i : i + 1], by_row=True) for i in range(7)]
        batched = core(x, state, by_row=True)
    assert torch.equal(torch.cat([o for o, _ in alone]), batched[0])
    assert torch.equal(torch.cat([s for _, s in alone]), batched[1])


@pytest.mark.parametrize("size", [8, 64])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_shards_in_place_step_follows_the_written_out_cell_within_float32_rounding(kind, size):
    """A shard's fused row memory (``CellInference``: in place, tanh as ``2 sigmoid(2z) - 1``) against the written-out
    cell, each stepping its own state over 40 steps with episode starts: within 1e-6 + 1e-6 x |value| at every step
    (an LSTM's cell state grows past 1), not bitwise; ``peek`` gives the output of the next ``advance`` and leaves
    the state as it is."""
    torch.manual_seed(0)
    core = RecurrentCore(kind, 5, size)
    with torch.no_grad():
        for layer in (core.input, core.recurrent):
            layer.bias.normal_()  # gates away from zero
    fused, written_out = RowMemory(core, 33, fused=True), RowMemory(core, 33)
    differ = False
    with torch.no_grad():
        for t in range(40):
            if t % 7 == 3:
                starts = torch.rand(33) < 0.3
                fused.restart(starts)
                written_out.restart(starts)
            x = 2 * torch.randn(33, 5)
            state = fused.state.clone()
            peeked = fused.peek(core, x).clone()
            assert torch.equal(fused.state, state)
            out, expected = fused.advance(core, x), written_out.advance(core, x)
            assert torch.equal(out, peeked)
            torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(fused.state, written_out.state, atol=1e-6, rtol=1e-6)
            differ |= not torch.equal(fused.state, written_out.state)
    assert differ and float(written_out.state.abs().max()) > 0.5  # rounding apart, on states far from zero


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_chunk_stores_the_outputs_and_final_states_that_a_replay_with_the_written_out_cell_computes(kind):
    """``chunk.memory`` (the core's output at each of the T+1 observations, as the shard acted) and
    ``chunk.final_state`` (each final observation's row's state after its episode's last step) agree with the
    learner's replay of the chunk from ``state0`` through the written-out cell, within 1e-6."""
    model, shard = model_and_shard(kind, rows=6, env_kwargs={"velocities": False, "max_episode_steps": 9}, seed=2)
    weights = {"version": 0, "actor": model.actor.state_dict()}
    for chunk in (shard.rollout(weights, 24), shard.rollout(weights, 24)):
        T, N = chunk.num_steps, chunk.num_envs
        with inference(model):
            x = model.actor.features({k: v.flatten(0, 1) for k, v in chunk.obs.items()}).view(T + 1, N, -1)
            outputs, states = model.actor.core.replay(x, chunk.state0, chunk.starts)
        assert chunk.memory.shape == (T + 1, N, 8) and chunk.final_state.shape == (len(chunk.final_t), states.shape[-1])
        torch.testing.assert_close(chunk.memory, outputs, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(chunk.final_state, states[chunk.final_t, chunk.final_row], atol=1e-6, rtol=1e-6)
        assert int(chunk.truncated.sum()) >= 3 and bool(chunk.starts[1:].any())


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_learners_values_from_the_stored_outputs_equal_those_of_a_replay(kind):
    """``sequence_values`` reading the shard's outputs and final states (``acted``) against replaying the chunk: the
    same values and bootstrapped next values, within 1e-5, truncated rows' terminal values included; the stored
    path's values are bitwise the critic's own forward on the stored outputs (``critic_values``' fused MLP)."""
    model, shard = model_and_shard(kind, rows=6, env_kwargs={"velocities": False, "max_episode_steps": 9}, seed=5)
    weights = {"version": 0, "actor": model.actor.state_dict()}
    for chunk in (shard.rollout(weights, 24), shard.rollout(weights, 24)):
        stored, replayed = sequence_values(model, chunk, acted=True), sequence_values(model, chunk, acted=False)
        with inference(model):
            obs = {k: v.flatten(0, 1) for k, v in chunk.obs.items()}
            forward = model.critic(obs, memory=chunk.memory.flatten(0, 1)).view(chunk.num_steps + 1, -1)
        assert torch.equal(stored[0], forward[:-1])
        for a, b in zip(stored, replayed, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        truncated = chunk.truncated & ~chunk.terminated
        assert bool(truncated.any()) and bool((stored[1][truncated] != 0).all())


def test_ppo_reads_the_stored_outputs_of_its_own_policys_chunk_and_replays_a_lagging_one():
    """A chunk of the learner's policy version: its values come from the outputs the shard stored; a chunk of an
    older version (``max_policy_lag``): from replaying it with the learner's weights, which no longer made it."""
    config = ModelConfig(recurrent="lstm", recurrent_size=8, hidden_sizes=[16])
    shard = EnvShard("raysim/CartPole", 4, seed=1, model=config, env_kwargs={"velocities": False})
    learner = Learner(*shard.spaces()[:2], config, PPOConfig(num_minibatches=2), horizon=10, seed=0)
    model, algorithm = learner.model, learner.algorithm
    chunk = shard.rollout(learner.get_weights(), 16)
    assert chunk.policy_version == algorithm.version == 0

    def values_at_valid_steps(acted: bool) -> torch.Tensor:
        return sequence_steps(chunk, sequence_values(model, chunk, acted)[0])[sequences(chunk)["sequences"]["mask"]]

    assert torch.equal(valid_steps(algorithm.batch([chunk]))["values"], values_at_valid_steps(True))
    with torch.no_grad():
        for p in model.actor.core.parameters():
            p.add_(0.1 * torch.randn_like(p))  # the learner moved on: the chunk lags one version
    algorithm.version = 1
    lagging = valid_steps(algorithm.batch([chunk]))["values"]
    assert torch.equal(lagging, values_at_valid_steps(False))
    assert not torch.allclose(lagging, values_at_valid_steps(True), atol=1e-3)


def test_a_chunk_carries_each_rows_state_before_its_first_step_and_where_episodes_start():
    model, shard = model_and_shard()
    weights = {"version": 0, "actor": model.actor.state_dict()}
    first, second = shard.rollout(weights, 64), shard.rollout(weights, 64)
    done = first.terminated | first.truncated
    assert bool(first.starts[0].all())  # a new shard's rows start fresh episodes
    assert torch.equal(first.starts[1:], done) and int(done.sum()) > 4  # random actions: many short episodes
    assert torch.equal(second.starts[0], first.starts[-1])
    # the learner's replay of the first chunk reaches the state the shard carried into the second one ...
    T, N = first.num_steps, first.num_envs
    with inference(model):
        x = model.actor.features({k: v.flatten(0, 1) for k, v in first.obs.items()}).view(T + 1, N, -1)
        _, states = model.actor.core.replay(x, first.state0, first.starts)
    torch.testing.assert_close(states[T - 1], second.state0, atol=1e-6, rtol=1e-5)
    # ... and the log-probabilities the shard acted with
    part = sequences(second)
    with inference(model):
        logp, _ = model.actor.log_prob_entropy(part["obs"], part["actions"], sequences=part["sequences"])
    torch.testing.assert_close(logp, part["logprobs"][part["sequences"]["mask"]], atol=1e-5, rtol=1e-5)
    # a shard's state carries the rows' states (exact resume); fresh episodes (a replacement shard) start zeroed
    twin = model_and_shard()[1]
    assert twin.set_state(shard.get_state()) == "exact"
    assert torch.equal(twin.rollout(weights, 8).state0, shard.rollout(weights, 8).state0)
    shard.start_fresh(7)
    assert bool(shard.rollout(weights, 8).starts[0].all())


def test_the_shard_acts_as_the_actor_with_a_row_memory_does_bitwise():
    """The shard's fused path (the core, then ``MLPInference``) samples what ``Actor.sample`` with a ``RowMemory``
    samples, step by step, episode starts included."""
    model, shard = model_and_shard(rows=5, env_kwargs={"velocities": False, "max_episode_steps": 7}, seed=4)
    chunk = shard.rollout({"version": 0, "actor": model.actor.state_dict()}, 20)
    env = make("raysim/CartPole", 5, seed=4, **{"velocities": False, "max_episode_steps": 7})
    generator, memory = torch.Generator(), RowMemory(model.actor.core, 5, fused=True)  # the shard's in-place step
    generator.manual_seed(derive_seed(4, 1))
    obs = env.reset(4)
    with inference(model):
        for t in range(20):
            action, logp = model.actor.sample(obs, generator, memory=memory)
            assert torch.equal(action, chunk.actions[t]) and torch.equal(logp, chunk.logp[t]), t
            step = env.step(action)
            memory.restart(step.done_rows)
            obs = step.obs
    assert int(chunk.truncated.sum()) > 0


def test_a_row_restarted_after_a_non_finite_value_starts_with_a_zero_state():
    config = ModelConfig(recurrent="gru", recurrent_size=8)
    shard = EnvShard("test/NaNCartPole", 4, model=config, on_nonfinite="mask", env_kwargs={"nan_row": 2, "nan_step": 3})
    model = ActorCritic(*shard.spaces()[:2], config)
    chunk = shard.rollout({"version": 0, "actor": model.actor.state_dict()}, 8)
    assert not bool(chunk.mask[3, 2]) and bool(chunk.starts[4, 2])
    assert chunk.nonfinite == 1


def reference_terminal_value(model: ActorCritic, obs: torch.Tensor, start: int, t: int, row: int, final: torch.Tensor):
    """V(final observation) of the episode that ran from step ``start`` to ``t`` in ``row``, stepping the core over
    that episode's observations alone, from a zero state."""
    core, actor = model.actor.core, model.actor
    with inference(model):
        state = torch.zeros(1, core.state_size)
        for k in range(start, t + 1):
            _, state = core(actor.features({"policy": obs[k, row : row + 1]}), state)
        final_obs = {"policy": final.unsqueeze(0)}
        after, _ = core(actor.features(final_obs), state)
        zero, _ = core(actor.features(final_obs), torch.zeros_like(state))
        return [float(model.critic(final_obs, memory=m)) for m in (after, zero)], state


@pytest.mark.parametrize("acted", [False, True], ids=["replayed", "stored"])
def test_a_truncated_row_bootstraps_from_its_final_observation_read_with_the_state_its_episode_reached(acted):
    """The terminal-value rule with a critic whose value depends on the state: the value of a truncated episode's
    final observation is read from the state that episode reached (across a chunk boundary too), not from a zero
    state nor the next episode's; terminated rows never bootstrap; eval mode during, each module's mode after. The
    same whether the learner replays the chunk or reads the state the shard stored (``chunk.final_state``)."""
    model, shard = model_and_shard(rows=3, env_kwargs={"velocities": False, "max_episode_steps": 5}, seed=3)
    with torch.no_grad():
        model.critic.net[0].weight[:, :8] *= 100  # the core's output, read first: values far apart by state
    weights = {"version": 0, "actor": model.actor.state_dict()}
    first, second = shard.rollout(weights, 12), shard.rollout(weights, 12)
    obs = torch.cat([first.obs["policy"][:-1], second.obs["policy"]])  # the 24 steps, then the next start
    starts = torch.cat([first.starts[:-1], second.starts])
    model.train()
    model.critic.eval()  # a mixed mode, to be restored exactly
    modes = []
    model.actor.core.register_forward_hook(lambda module, *_: modes.append(module.training))
    values, next_values = sequence_values(model, second, acted)
    assert modes and not any(modes)
    assert model.training and model.actor.training and model.actor.core.training and not model.critic.training

    eligible = second.truncated & ~second.terminated
    assert int(eligible.sum()) >= 3
    assert bool((next_values[second.terminated] == 0).all())
    crossing = 0
    for k, (t, row) in enumerate(zip(second.final_t.tolist(), second.final_row.tolist(), strict=True)):
        if not bool(eligible[t, row]):
            continue
        step = 12 + t
        start = max(s for s in range(step + 1) if bool(starts[s, row]))
        crossing += start < 12
        (expected, from_zero), _ = reference_terminal_value(model, obs, start, step, row, second.final_obs["policy"][k])
        assert float(next_values[t, row]) == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert abs(expected - from_zero) > 0.01  # the test tells the states apart
        if t + 1 < 12:  # the next episode's first value, read with its reset state
            assert abs(expected - float(values[t + 1, row])) > 0.01
    assert crossing >= 1  # an episode that began in the previous chunk: its state came in state0


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_recurrent_policys_evaluation_does_not_depend_on_the_shard_layout(deterministic):
    config = ModelConfig(recurrent="lstm", recurrent_size=8)
    torch.manual_seed(1)
    model = ActorCritic(*EnvShard("raysim/CartPole", 1, env_kwargs=STATELESS).spaces()[:2], config)
    weights = {"version": 1, "actor": model.actor.state_dict()}
    spec = EvalSpec(episodes=23, seed=5, max_steps=500, deterministic=deterministic)
    backend, reports = LocalBackend(), []
    for layout in LAYOUTS:

        def make(i, layout=layout):
            return backend.create(EnvShard, "raysim/CartPole", layout[i], seed=i, model=config, env_kwargs=STATELESS)

        shards = [make(i) for i in range(len(layout))]
        reports.append(evaluate_on_shards(backend, make, shards, layout, weights, spec))
    assert_same_evaluation(reports)
    assert len({r["return"] for r in reports[0].records}) > 1


def test_decoupled_ppo_takes_a_lagging_sequences_proximal_log_probabilities_from_replaying_it():
    model, shard = model_and_shard()
    chunk = shard.rollout({"version": 0, "actor": model.actor.state_dict()}, 16)
    with torch.no_grad():
        for p in model.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the learner moved on: the chunk lags one version
    part = sequences(chunk)
    part["sequences"]["mask"][1, 3:] = False  # padding steps keep the acting log-probabilities
    acting = part["logprobs"].clone()
    decouple([part], [chunk], 1, model.actor, max_is_weight=2.0)
    with inference(model):
        replayed, _ = model.actor.log_prob_entropy(part["obs"], part["actions"], sequences=part["sequences"])
    valid = part["sequences"]["mask"]
    assert torch.equal(part["logprobs"][valid], replayed) and not torch.equal(replayed, acting[valid])
    assert torch.equal(part["logprobs"][~valid], acting[~valid])
    assert bool((part["is_weights"] <= 2.0).all()) and bool((part["is_weights"][~valid] == 1).all())


def test_an_overlapped_recurrent_run_trains_and_counts_every_step(tmp_path):
    config = raysim.load_config(None, [*RECURRENT, "algo.max_policy_lag=1", f"run_dir={tmp_path / 'r'}"])
    result = raysim.Trainer(config).train()
    assert result.env_steps == 1024 and result.evaluation.completed == 4


@pytest.mark.parametrize(
    ("config", "overrides", "expected"),
    [
        ("cartpole_grpo", ["model.recurrent=gru"], "algo 'grpo' does not train recurrent policies"),
        (None, [*RECURRENT, "algo.num_minibatches=3"], "a learner rank's 4 rows (shards.count / learner.ranks x"),
        (None, [*RECURRENT, "algo.kl_coef=0.1"], "algo.kl_coef (0.1) pulls toward a frozen actor whose recurrent"),
    ],
)
def test_settings_a_recurrent_policy_cannot_train_with_are_refused_in_one_line(config, overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")) as caught:
        raysim.load_config(config, overrides)
    assert "\n" not in str(caught.value)


def test_a_kl_reference_of_a_recurrent_actor_is_refused_its_state_at_a_chunks_start_is_unknown():
    model, _ = model_and_shard()
    with pytest.raises(ValueError, match="recurrent"):
        reference_of(model.actor, PPOConfig(kl_coef=0.1))
    assert reference_of(model.actor, PPOConfig(kl_coef=0.0)) is None  # no pull, nothing to replay


def test_a_recurrent_actor_acting_without_a_row_state_says_so():
    model, _ = model_and_shard()
    with pytest.raises(ValueError, match="pass their RowMemory"):
        model.actor(torch.zeros(2, 2))
    memory = RowMemory(model.actor.core, 2)
    assert model.actor(torch.zeros(2, 2), memory=memory).shape == (2, 2)
    assert not bool(memory.starting.any())


def test_a_camera_policy_with_a_shared_cnn_an_lstm_and_a_privileged_critic_trains_and_evaluates(tmp_path):
    """The robot's case: images (uint8 to the CNN) and joints into the core; the critic reads the core's output beside
    its privileged group, through the actor's CNN (``model.shared_encoders``)."""
    settings = tiny_spot_run(
        tmp_path / "run",
        "model.recurrent=lstm",
        "model.recurrent_size=16",
        "model.cnn_features=16",
        "model.shared_encoders=true",
        "model.critic_inputs=[camera, critic]",
        "eval.episodes=4",
        "eval.num_envs=2",
    )
    result = raysim.Trainer(raysim.load_config(None, settings)).train()
    assert result.env_steps == 256 and result.evaluation.completed == 4
    _, _, state, _ = locate_checkpoint(tmp_path / "run")
    assert state["model"]["critic.net.0.weight"].shape[1] == 16 + 16 + 1  # memory, CNN features, privileged


def test_the_recorded_five_seed_runs_show_the_lstm_config_solving_stateless_cartpole_where_feed_forward_cannot():
    """Memory is what tells the pole's motion: the packaged configs' runs over seeds 1-5 at their 200k budget,
    as `raysim bench mujoco cartpole_stateless_lstm_ppo cartpole_stateless_ppo` recorded them (100 evaluation
    episodes each). A live run at a test's budget cannot show it: at 16k-40k env steps whether the LSTM has
    taken off yet depends on the seed and the CPU's arithmetic (seed 1 evaluated 462.6 on one machine, 94.3 on
    another; seeds 1-8 here, 16k: 30-402), so the claim is the benchmark's and its record is checked here."""
    runs = [json.loads(line) for line in (ROOT / "benchmarks" / "results" / "results.jsonl").read_text().splitlines()]
    packaged = {
        name: {r["seed"]: r["eval_mean"] for r in runs if r["config"] == name and not r["overrides"]}
        for name in ("cartpole_stateless_lstm_ppo", "cartpole_stateless_ppo")
    }
    lstm, feed_forward = packaged["cartpole_stateless_lstm_ppo"], packaged["cartpole_stateless_ppo"]
    assert sorted(lstm) == sorted(feed_forward) == [1, 2, 3, 4, 5], packaged
    assert min(lstm.values()) >= 475 and max(feed_forward.values()) < 60, packaged


def test_a_filmed_evaluation_of_a_recurrent_policy_plays_the_episodes_of_the_unfilmed_one(tmp_path):
    from tests.test_video import evaluate

    run = tmp_path / "run"
    raysim.Trainer(raysim.load_config(None, [*RECURRENT, f"run_dir={run}"])).train()
    args = ("--episodes", "6", "--envs-per-shard", "3")
    code, filmed = evaluate(run, tmp_path, *args, "--video", str(tmp_path / "out.gif"))
    assert code == 0 and len(filmed) == 6 and (tmp_path / "out.gif").stat().st_size > 0
    code, plain = evaluate(run, tmp_path, *args)
    assert code == 0 and plain == filmed
