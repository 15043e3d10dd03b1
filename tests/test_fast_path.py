"""The optimized collection path computes exactly what a plain, unoptimized loop computes.

The reference below is the straightforward implementation: a per-step loop over the env contract
with CartPole's physics as one plain expression, the actor's ``nn.Module`` forward, sampling with
``torch.multinomial`` and one critic forward over all observations. The shard's hot loop
(``MLPInference``, ``sample_categorical``, in-place CartPole, buffers, blocked values) must give
bitwise equal observations, actions, log-probabilities, rewards, flags, final observations and
values for the same seed.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from raysim.envs import CartPole, make, register
from raysim.envs import cartpole as cp
from raysim.models import RowMemory
from raysim.models.fused import MLPInference
from raysim.models.networks import Actor, ActorCritic, ModelConfig, Tanh, mlp, sample_categorical
from raysim.rollout import EnvShard
from raysim.rollout.advantages import VALUE_BLOCK, chunk_values, critic_values
from raysim.seeding import derive_seed


class PlainCartPole(CartPole):
    """CartPole's physics as the plain out-of-place expression (the unoptimized reference)."""

    env_id = "test/PlainCartPole"

    def _reset_state(self, rows, generator):
        self.state[rows] = torch.rand(rows.numel(), 4, generator=generator) * 0.1 - 0.05

    def _advance(self, actions):
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = actions.to(self.state.dtype) * (2 * cp.FORCE_MAG) - cp.FORCE_MAG
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + cp.POLE_MASS_LENGTH * theta_dot.square() * sin) / cp.TOTAL_MASS
        theta_acc = (cp.GRAVITY * sin - cos * temp) / (
            cp.HALF_LENGTH * (4.0 / 3.0 - cp.MASS_POLE * cos.square() / cp.TOTAL_MASS)
        )
        x_acc = temp - cp.POLE_MASS_LENGTH * theta_acc * cos / cp.TOTAL_MASS
        self.state = torch.stack(
            (x + cp.TAU * x_dot, x_dot + cp.TAU * x_acc, theta + cp.TAU * theta_dot, theta_dot + cp.TAU * theta_acc), 1
        )
        terminated = (self.state[:, 0].abs() > cp.X_THRESHOLD) | (self.state[:, 2].abs() > cp.THETA_THRESHOLD)
        return torch.ones(self.num_envs), terminated


register("test/PlainCartPole", PlainCartPole)


def reference_chunks(num_envs, seed, weights, critic, steps, chunks, env_kwargs, config=None):
    """The unoptimized loop: per-step env contract, module forwards, ``torch.multinomial``."""
    env = make("test/PlainCartPole", num_envs, seed=seed, **env_kwargs)
    actor = Actor(env.observation_spaces, env.action_space, config or ModelConfig())
    actor.load_state_dict(weights["actor"])
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, 1))
    obs = env.reset(seed)
    out = []
    for _ in range(chunks):
        rec = {k: [] for k in ("obs", "actions", "logp", "reward", "terminated", "truncated")}
        final_obs, final_t, final_row, returns, lengths = [], [], [], [], []
        for t in range(steps):
            rec["obs"].append(obs["policy"].clone())
            with torch.no_grad():
                log_probs = actor(obs["policy"]).log_softmax(-1)
            action = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)
            rec["actions"].append(action)
            rec["logp"].append(log_probs.gather(1, action[:, None]).squeeze(1))
            step = env.step(action)
            rec["reward"].append(step.reward.clone())
            rec["terminated"].append(step.terminated.clone())
            rec["truncated"].append(step.truncated.clone())
            if step.done_rows.numel():
                final_obs.append(step.final_obs["policy"])
                final_t.append(torch.full_like(step.done_rows, t))
                final_row.append(step.done_rows)
                returns.append(step.episodes["return"])
                lengths.append(step.episodes["length"])
            obs = step.obs
        rec["obs"].append(obs["policy"].clone())
        rec = {k: torch.stack(v) for k, v in rec.items()}
        rec["final_obs"] = torch.cat(final_obs) if final_obs else torch.empty(0, 4)
        rec["final_t"] = torch.cat(final_t) if final_t else torch.empty(0, dtype=torch.int64)
        rec["final_row"] = torch.cat(final_row) if final_row else torch.empty(0, dtype=torch.int64)
        rec["return"] = torch.cat(returns) if returns else torch.empty(0)
        rec["length"] = torch.cat(lengths) if lengths else torch.empty(0, dtype=torch.int64)
        # values: one plain critic forward over all T+1 observations, then the next-state rule
        with torch.no_grad():
            all_values = critic(rec["obs"].flatten(0, 1)).reshape(steps + 1, num_envs)
            next_values = all_values[1:].clone()
            next_values[rec["terminated"] | rec["truncated"]] = 0.0
            eligible = (rec["truncated"] & ~rec["terminated"])[rec["final_t"], rec["final_row"]]
            if eligible.any():
                next_values[rec["final_t"][eligible], rec["final_row"][eligible]] = critic(
                    rec["final_obs"][eligible]
                ).squeeze(-1)
        rec["values"], rec["next_values"] = all_values[:steps], next_values
        out.append(rec)
    return out


def assert_equal(name, got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape, (name, got.dtype, expected.dtype, got.shape)
    assert torch.equal(got, expected), (name, (got.double() - expected.double()).abs().max())


def assert_chunk_equals(chunk, critic, rec: dict) -> None:
    """The shard's chunk and its values equal the reference loop's record, tensor by tensor."""
    values, next_values = chunk_values(critic, chunk)
    assert_equal("obs", chunk.obs["policy"], rec["obs"])
    for name in (
        "actions",
        "logp",
        "reward",
        "terminated",
        "truncated",
        "final_t",
        "final_row",
        "values",
        "next_values",
    ):
        assert_equal(
            name, {"values": values, "next_values": next_values}.get(name, getattr(chunk, name, None)), rec[name]
        )
    assert_equal("final_obs", chunk.final_obs["policy"], rec["final_obs"])


@pytest.mark.parametrize(
    "num_envs, seed, env_kwargs",
    [(1, 3, {}), (7, 5, {"max_episode_steps": 20}), (64, 42, {}), (300, 1, {"max_episode_steps": 25})],
)
def test_the_shards_chunks_and_values_equal_the_plain_loop(num_envs, seed, env_kwargs):
    steps, chunks = 40, 2
    shard = EnvShard("raysim/CartPole", num_envs, seed=seed, env_kwargs=env_kwargs)
    torch.manual_seed(seed)
    model = ActorCritic(*shard.spaces()[:2], ModelConfig())
    weights = {"version": 1, "actor": {k: v.clone() for k, v in model.actor.state_dict().items()}}
    expected = reference_chunks(num_envs, seed, weights, model.critic.net, steps, chunks, env_kwargs)
    truncations = 0
    for rec in expected:
        chunk = shard.rollout(weights, steps)
        assert_chunk_equals(chunk, model.critic, rec)
        assert_equal("return", chunk.episodes["return"], rec["return"])
        assert_equal("length", chunk.episodes["length"], rec["length"])
        assert bool(chunk.mask.all())
        truncations += int(chunk.truncated.sum())
    if env_kwargs:
        assert truncations > 0  # the terminal-value path was exercised


@pytest.mark.parametrize(
    "num_envs, seed, env_kwargs", [(7, 5, {"max_episode_steps": 20}), (300, 1, {"max_episode_steps": 25})]
)
def test_with_obs_norm_the_shards_chunks_and_values_equal_the_plain_loop(num_envs, seed, env_kwargs):
    """``model.obs_norm``: the fused paths (acting, blocked critic values) normalize exactly as the modules."""
    steps, chunks = 40, 2
    config = ModelConfig(obs_norm=True, obs_norm_clip=2.0)  # a small clip: clamping happens
    shard = EnvShard("raysim/CartPole", num_envs, seed=seed, env_kwargs=env_kwargs, model=config)
    torch.manual_seed(seed)
    model = ActorCritic(*shard.spaces()[:2], config)
    for norm, scale in ((model.actor.obs_norm, 0.05), (model.critic.obs_norm, 0.1)):
        norm.update(torch.randn(500, 4) * scale + 0.01)  # non-trivial statistics
    weights = {"version": 1, "actor": {k: v.clone() for k, v in model.actor.state_dict().items()}}
    assert "obs_norm.mean" in weights["actor"]
    critic = lambda x: model.critic({"policy": x}).unsqueeze(-1)  # noqa: E731 - the module forward, [B, 1]
    expected = reference_chunks(num_envs, seed, weights, critic, steps, chunks, env_kwargs, config)
    for rec in expected:
        chunk = shard.rollout(weights, steps)
        assert_chunk_equals(chunk, model.critic, rec)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("rows", [1, 5, 64, 1024, 4096])
def test_mlp_inference_with_a_normalizer_is_bitwise_the_module_forward(activation, rows):
    from raysim.models.normalizer import RunningNorm

    torch.manual_seed(rows)
    net = mlp(4, [64, 64], 2, activation, 0.01)
    norm = RunningNorm(4, clip=3.0)
    norm.update(torch.randn(300, 4) * 2 + 1)
    x = torch.randn(rows, 4) * 5
    with torch.no_grad():
        expected = net(norm(x))
        fast = MLPInference(net, norm)
        assert torch.equal(fast(x), expected)
        assert torch.equal(MLPInference(net, norm, fixed=True)(x), expected)  # the divisor computed once
        norm.update(torch.randn(50, 4))  # new statistics are seen
        assert torch.equal(fast(x), net(norm(x)))


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("rows", [1, 2, 5, 64, 1000, 1024, 4096])
def test_mlp_inference_is_bitwise_the_module_forward(activation, rows):
    torch.manual_seed(rows)
    for out_dim in (1, 2, 3):
        net = mlp(4, [64, 64], out_dim, activation, 0.01)
        x = torch.randn(rows, 4) * 3
        with torch.no_grad():
            expected = net(x)
            fast = MLPInference(net)
            assert torch.equal(fast(x), expected)
            out = torch.empty(rows, out_dim)
            assert fast(x, out=out) is out and torch.equal(out, expected)


@pytest.mark.parametrize(
    "rows", [VALUE_BLOCK + 1, VALUE_BLOCK + 7, 2 * VALUE_BLOCK + 3, 2 * VALUE_BLOCK - 1, 33 * 64, 33 * 1000, 33 * 1024]
)
def test_blocked_critic_values_equal_one_forward(rows):
    torch.manual_seed(0)
    model = ActorCritic(
        make("raysim/CartPole", 1).observation_spaces, make("raysim/CartPole", 1).action_space, ModelConfig()
    )
    obs = {"policy": torch.randn(rows, 4)}
    with torch.no_grad():
        expected = model.critic(obs)
        assert torch.equal(critic_values(model.critic, obs), expected)


def test_loading_new_weights_is_seen_by_mlp_inference():
    net = mlp(4, [8], 2, "tanh")
    fast = MLPInference(net)
    x = torch.randn(3, 4)
    with torch.no_grad():
        fast(x)
        net.load_state_dict({k: torch.randn_like(v) for k, v in net.state_dict().items()})
        assert torch.equal(fast(x), net(x))


def test_tanh_is_tanh_to_float_rounding():
    x = torch.linspace(-20, 20, 100_001)
    assert (Tanh()(x) - torch.tanh(x)).abs().max() < 2e-7


def test_sample_categorical_draws_what_multinomial_draws():
    probs = torch.softmax(torch.randn(500, 5), -1)
    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(5):
        assert torch.equal(sample_categorical(probs, a), torch.multinomial(probs, 1, generator=b).squeeze(1))
    assert torch.equal(a.get_state(), b.get_state())


def test_a_pickled_chunk_round_trips_with_out_of_band_buffers():
    shard = EnvShard("raysim/CartPole", 16, seed=0, env_kwargs={"max_episode_steps": 10})
    chunk = shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 12)
    buffers = []
    data = pickle.dumps(chunk, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) >= 10 and len(data) < 2000  # the tensors travel out of band, not in the pickle
    back = pickle.loads(data, buffers=buffers)
    for name in ("obs", "final_obs", "episodes"):
        a, b = getattr(chunk, name), getattr(back, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    for name in ("actions", "logp", "reward", "terminated", "truncated", "mask", "final_t", "final_row"):
        assert torch.equal(getattr(chunk, name), getattr(back, name))
    assert (back.policy_version, back.shard, back.nonfinite) == (chunk.policy_version, chunk.shard, chunk.nonfinite)
    assert pickle.loads(pickle.dumps(chunk)).env_steps == chunk.env_steps  # plain pickling too


class FailingAfterNaN(CartPole):
    """Puts NaN into row 1 at step 3, then fails on the next step, as an env might on bad state."""

    env_id = "test/FailingAfterNaN"

    def __init__(self, num_envs, seed=None, **kwargs):
        self.steps_taken = 0
        super().__init__(num_envs, seed, **kwargs)

    def _advance(self, actions):
        if self.steps_taken == 4:
            raise FloatingPointError("cannot integrate a NaN state")
        reward, terminated = super()._advance(actions)
        if self.steps_taken == 3:
            self.state[1, 0] = float("nan")
        self.steps_taken += 1
        return reward, terminated


register("test/FailingAfterNaN", FailingAfterNaN)


def test_an_env_that_fails_after_a_nan_still_reports_the_non_finite_value_first():
    from raysim.rollout import NonFiniteError

    shard = EnvShard("test/FailingAfterNaN", 3, seed=0)
    with pytest.raises(NonFiniteError, match=r"row 1 .*at step 3 \(step 3 of this chunk\)"):
        shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 10)


def plain_gaussian_chunks(env_id, num_envs, seed, weights, config, steps, env_kwargs):
    """The general path for a Gaussian actor: per step ``Actor.sample`` (module forward, ``torch.randn``), the actor's
    ``env_action``, the env contract; one record per weights version in ``weights``, and the generator's state."""
    env = make(env_id, num_envs, seed=seed, **env_kwargs)
    actor = Actor(env.observation_spaces, env.action_space, config)
    memory = None if actor.core is None else RowMemory(actor.core, num_envs, fused=True)  # the shard's in-place step
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, 1))
    obs = env.reset(seed)
    out = []
    for version in weights:
        actor.load_state_dict(version["actor"])
        rec = {k: [] for k in ("obs", "actions", "logp", "reward", "terminated", "truncated")}
        finals = []
        for t in range(steps):
            rec["obs"].append({k: v.clone() for k, v in obs.items()})
            with torch.no_grad():
                action, logp = actor.sample(obs, generator, memory=memory)
            rec["actions"].append(action)
            rec["logp"].append(logp)
            step = env.step(actor.env_action(action))
            for name in ("reward", "terminated", "truncated"):
                rec[name].append(getattr(step, name).clone())
            if step.done_rows.numel():
                finals.append((t, step))
            if memory is not None:
                memory.restart(step.started_rows())
            obs = step.obs
        rec["obs"].append({k: v.clone() for k, v in obs.items()})
        observations = rec.pop("obs")
        rec = {k: torch.stack(v) for k, v in rec.items()}
        rec["obs"] = {g: torch.stack([o[g] for o in observations]) for g in observations[0]}
        rec["final_obs"] = {g: torch.cat([s.final_obs[g] for _, s in finals]) for g in obs} if finals else {}
        rec["final_t"] = torch.cat([torch.full_like(s.done_rows, t) for t, s in finals])
        rec["final_row"] = torch.cat([s.done_rows for _, s in finals])
        rec["return"] = torch.cat([s.episodes["return"] for _, s in finals])
        rec["generator"] = generator.get_state()
        out.append(rec)
    return out


@pytest.mark.parametrize(
    "env_id, num_envs, env_kwargs, config",
    [
        ("raysim/Reach", 3, {"max_episode_steps": 15}, {"obs_norm": False, "action_transform": "clip"}),
        ("raysim/Reach", 8, {"max_episode_steps": 15}, {"obs_norm": True, "action_transform": "clip"}),
        ("raysim/Reach", 64, {"max_episode_steps": 15}, {"obs_norm": True, "action_transform": "squash"}),
        ("raysim/Reach", 8, {"max_episode_steps": 15}, {"obs_norm": False, "action_transform": "squash"}),
        ("raysim/Reach", 8, {"max_episode_steps": 15}, {"obs_norm": True, "recurrent": "gru", "recurrent_size": 8}),
        ("gym:Pendulum-v1", 5, {"max_episode_steps": 25}, {"obs_norm": True, "action_transform": "squash"}),
        ("gym:Pendulum-v1", 5, {"max_episode_steps": 25}, {"obs_norm": False, "action_transform": "clip"}),
        ("raysim/Reach", 8, {"max_episode_steps": 15}, {"obs_norm": True, "log_std": "state"}),
        ("raysim/Reach", 8, {"max_episode_steps": 15}, {"log_std": "state", "recurrent": "gru", "recurrent_size": 8}),
    ],
)
def test_a_gaussian_actors_chunks_equal_the_general_paths_bitwise(env_id, num_envs, env_kwargs, config):
    """``OwnActor.sample_gaussian`` (fused MLP, in place) draws what ``Actor.sample`` draws: the same actions,
    log-probabilities, generator state and so the same observations, rewards and values, with new weights (log-std,
    or the net's log-std outputs with ``log_std: state``, and normalizer statistics) in every chunk."""
    steps, seed = 30, 4
    config = ModelConfig(init_log_std=-0.5, obs_norm_clip=2.0, **config)  # a small clip: clamping happens
    shard = EnvShard(env_id, num_envs, seed=seed, env_kwargs=env_kwargs, model=config)
    torch.manual_seed(seed)
    model = ActorCritic(*shard.spaces()[:2], config)
    weights = []
    moved = [model.actor.log_std] if model.actor.log_std is not None else list(model.actor.net[-1].parameters())
    for version in range(2):
        with torch.no_grad():
            for p in moved:
                p.add_(0.3 * torch.randn_like(p))
        if model.actor.obs_norm is not None:
            model.actor.obs_norm.update(torch.randn(200, model.actor.obs_norm.mean.numel()) * 3 + version)
        weights.append({"version": version, "actor": {k: v.clone() for k, v in model.actor.state_dict().items()}})
    expected = plain_gaussian_chunks(env_id, num_envs, seed, weights, config, steps, env_kwargs)
    recurrent = model.actor.core is not None
    for version, rec in zip(weights, expected, strict=True):
        chunk = shard.rollout(version, steps)
        for group, value in rec["obs"].items():
            assert_equal(f"obs[{group}]", chunk.obs[group], value)
        for name in ("actions", "logp", "reward", "terminated", "truncated", "final_t", "final_row"):
            assert_equal(name, getattr(chunk, name), rec[name])
        for group, value in rec["final_obs"].items():
            assert_equal(f"final_obs[{group}]", chunk.final_obs[group], value)
        assert_equal("return", chunk.episodes["return"], rec["return"])
        assert torch.equal(shard.generator.get_state(), rec["generator"])
        if not recurrent:  # values: the learner's fused, blocked critic against one module forward over all T+1 obs
            values, _ = chunk_values(model.critic, chunk)
            with torch.no_grad():
                flat = {g: v.flatten(0, 1) for g, v in rec["obs"].items()}
                assert_equal("values", values, model.critic(flat).reshape(steps + 1, num_envs)[:steps])
    assert int(chunk.truncated.sum()) > 0  # episodes ended within the chunks: final observations were compared
