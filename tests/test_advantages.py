"""Values, the terminal-value bootstrap and GAE of a chunk (docs/concepts.md, "Bootstrap rules")."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch
from torch import nn

from raysim.algos.ppo import PPOConfig
from raysim.learner import Learner
from raysim.models.networks import ModelConfig
from raysim.rollout.advantages import chunk_values, gae, terminal_values
from raysim.rollout.chunk import RolloutChunk

T, N, D = 4, 4, 3


def make_chunk(
    obs: torch.Tensor, terminated, truncated, final_obs: torch.Tensor, finals, mask=None, reward=None
) -> RolloutChunk:
    """A chunk with obs [T+1, N, D] and finished rows ``finals`` = [(t, row), ...] in order."""
    steps, rows = obs.shape[0] - 1, obs.shape[1]
    final_t = torch.tensor([t for t, _ in finals], dtype=torch.int64)
    final_row = torch.tensor([r for _, r in finals], dtype=torch.int64)
    return RolloutChunk(
        obs={"policy": obs},
        actions=torch.zeros(steps, rows, dtype=torch.int64),
        logp=torch.full((steps, rows), -0.69),
        reward=torch.ones(steps, rows) if reward is None else reward,
        terminated=terminated,
        truncated=truncated,
        mask=torch.ones(steps, rows, dtype=torch.bool) if mask is None else mask,
        final_obs={"policy": final_obs},
        final_t=final_t,
        final_row=final_row,
        episodes={
            "return": torch.zeros(len(finals)),
            "length": torch.ones(len(finals)),
            "row": final_row.clone(),
            "t": final_t.clone(),
        },
        policy_version=0,
    )


class SumCritic(nn.Module):
    """V(o) = 2 * sum(o) + 0.5, recording the batch size and inputs of every call."""

    group = "policy"

    def __init__(self):
        super().__init__()
        self.calls: list[torch.Tensor] = []

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = obs["policy"]
        self.calls.append(x.clone())
        return 2.0 * x.sum(-1) + 0.5


def v(x: torch.Tensor) -> float:
    return float(2.0 * x.sum() + 0.5)


def hand_built_chunk() -> RolloutChunk:
    """T=4, N=4 with distinct observations: every value tells which observation it came from.

    Finished rows: (t=0, row 1) truncated; (t=1, row 2) terminated; (t=2, row 3) terminated and
    truncated in the same step; (t=2, row 0) truncated; (t=3, row 1) terminated.
    """
    t_idx = torch.arange(T + 1).view(-1, 1, 1).float()
    n_idx = torch.arange(N).view(1, -1, 1).float()
    d_idx = torch.arange(D).view(1, 1, -1).float()
    obs = 100 * t_idx + 10 * n_idx + d_idx  # [T+1, N, D], all distinct
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    finals = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 1)]
    truncated[0, 1] = True
    terminated[1, 2] = True
    truncated[2, 0] = True
    terminated[2, 3] = truncated[2, 3] = True
    terminated[3, 1] = True
    final_obs = -(1000 + 10 * torch.arange(len(finals)).view(-1, 1).float() + torch.arange(D).float())
    return make_chunk(obs, terminated, truncated, final_obs, finals)


def test_next_values_follow_the_terminal_value_rule_on_a_hand_built_chunk():
    chunk = hand_built_chunk()
    critic = SumCritic()
    values, next_values = chunk_values(critic, chunk)
    final_index = {(int(t), int(r)): k for k, (t, r) in enumerate(zip(chunk.final_t, chunk.final_row, strict=True))}
    obs = chunk.obs["policy"]
    for t in range(T):
        for n in range(N):
            assert values[t, n].item() == v(obs[t, n])
            term, trunc = bool(chunk.terminated[t, n]), bool(chunk.truncated[t, n])
            if term:  # terminated, also when truncated in the same step
                expected = 0.0
            elif trunc:
                expected = v(chunk.final_obs["policy"][final_index[(t, n)]])
            else:
                expected = v(obs[t + 1, n])
            assert next_values[t, n].item() == expected, (t, n, term, trunc)
    # the truncated-only rows got exactly V(final_obs), not V(obs[t+1]) (the reset observation)
    assert next_values[0, 1].item() == v(chunk.final_obs["policy"][0])
    assert next_values[2, 0].item() == v(chunk.final_obs["policy"][2])
    assert next_values[2, 3].item() == 0.0 and next_values[1, 2].item() == 0.0 and next_values[3, 1].item() == 0.0


def test_the_critic_sees_all_observations_once_and_then_only_the_eligible_final_observations():
    chunk = hand_built_chunk()
    critic = SumCritic()
    chunk_values(critic, chunk)
    assert [c.shape[0] for c in critic.calls] == [(T + 1) * N, 2]
    assert torch.equal(critic.calls[0], chunk.obs["policy"].flatten(0, 1))
    # eligible: truncated and not terminated -> finals 0 (t=0, row 1) and 2 (t=2, row 0)
    assert torch.equal(critic.calls[1], chunk.final_obs["policy"][[0, 2]])

    critic = SumCritic()
    t, row, values = terminal_values(critic, chunk)
    assert t.tolist() == [0, 2] and row.tolist() == [1, 0]
    assert values.tolist() == [v(chunk.final_obs["policy"][0]), v(chunk.final_obs["policy"][2])]
    assert len(critic.calls) == 1 and critic.calls[0].shape[0] == 2


def test_no_eligible_rows_means_no_terminal_value_forward_pass():
    base = hand_built_chunk()
    # only terminated rows (one also truncated): nothing to bootstrap
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    terminated[1, 2] = True
    terminated[2, 3] = truncated[2, 3] = True
    chunk = make_chunk(base.obs["policy"], terminated, truncated, -torch.ones(2, D), [(1, 2), (2, 3)])
    critic = SumCritic()
    _, next_values = chunk_values(critic, chunk)
    assert [c.shape[0] for c in critic.calls] == [(T + 1) * N]
    assert next_values[1, 2].item() == 0.0 and next_values[2, 3].item() == 0.0
    critic = SumCritic()
    t, row, values = terminal_values(critic, chunk)
    assert critic.calls == [] and t.numel() == row.numel() == values.numel() == 0
    assert values.device == chunk.final_t.device and values.dtype == torch.float32

    # and no finished rows at all
    chunk = make_chunk(
        base.obs["policy"],
        torch.zeros(T, N, dtype=torch.bool),
        torch.zeros(T, N, dtype=torch.bool),
        torch.zeros(0, D),
        [],
    )
    critic = SumCritic()
    _, next_values = chunk_values(critic, chunk)
    assert [c.shape[0] for c in critic.calls] == [(T + 1) * N]
    torch.testing.assert_close(next_values, 2.0 * chunk.obs["policy"][1:].sum(-1) + 0.5)


class BatchNormCritic(nn.Module):
    group = "policy"

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
        self.calls: list[int] = []

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls.append(obs["policy"].shape[0])
        return self.net(obs["policy"]).squeeze(-1)


def test_a_single_eligible_row_works_through_a_batchnorm_critic_and_its_flags_are_restored():
    torch.manual_seed(0)
    critic = BatchNormCritic().train()
    critic.net[3].eval()  # a deliberately mixed module tree
    before = {name: m.training for name, m in critic.named_modules()}
    with torch.no_grad():
        critic({"policy": torch.randn(32, D)})  # non-trivial running statistics
    critic.calls.clear()
    bn = critic.net[1]
    running = (bn.running_mean.clone(), bn.running_var.clone())

    base = hand_built_chunk()
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    truncated[1, 3] = True
    final_obs = torch.randn(1, D)
    chunk = make_chunk(base.obs["policy"] / 100, terminated, truncated, final_obs, [(1, 3)])
    with pytest.raises(ValueError):  # what a train-mode pass over one row would do
        critic({"policy": final_obs})
    critic.calls.clear()

    values, next_values = chunk_values(critic, chunk)

    assert critic.calls == [(T + 1) * N, 1]
    reference = copy.deepcopy(critic).eval()
    with torch.no_grad():
        expected_final = reference({"policy": final_obs})
        expected_values = reference({"policy": chunk.obs["policy"].flatten(0, 1)}).view(T + 1, N)
    torch.testing.assert_close(next_values[1, 3], expected_final[0])
    torch.testing.assert_close(values, expected_values[:T])
    assert {name: m.training for name, m in critic.named_modules()} == before
    assert torch.equal(bn.running_mean, running[0]) and torch.equal(bn.running_var, running[1])


# --- GAE against a slow reference --------------------------------------------------------------


def random_chunk(generator: torch.Generator, steps: int, rows: int, dim: int) -> RolloutChunk:
    """Random observations and rewards, ~15% terminated, ~15% truncated (some both), ~10% masked."""
    obs = torch.randn(steps + 1, rows, dim, generator=generator)
    u = torch.rand(steps, rows, generator=generator)
    terminated = u < 0.15
    truncated = (u > 0.1) & (u < 0.25)  # overlaps terminated in (0.1, 0.15)
    mask = torch.rand(steps, rows, generator=generator) > 0.1
    terminated &= mask  # a masked transition carries no episode end (as the shard makes it)
    truncated &= mask
    done = terminated | truncated
    finals = [(t, n) for t in range(steps) for n in range(rows) if done[t, n]]
    final_obs = torch.randn(len(finals), dim, generator=generator)
    reward = torch.randn(steps, rows, generator=generator)
    chunk = make_chunk(obs, terminated, truncated, final_obs, finals, mask=mask, reward=reward)
    chunk.actions = torch.randint(0, 2, (steps, rows), generator=generator)
    return chunk


def reference_advantages(critic, chunk: RolloutChunk, gamma: float, lam: float) -> tuple[list, list]:
    """Per row, per step, backwards, in plain Python floats; the critic sees one observation at a time."""

    def value(x: torch.Tensor) -> float:
        with torch.no_grad():
            return float(critic({"policy": x.unsqueeze(0)})[0])

    steps, rows = chunk.num_steps, chunk.num_envs
    finals = {(int(t), int(r)): k for k, (t, r) in enumerate(zip(chunk.final_t, chunk.final_row, strict=True))}
    advantages = [[0.0] * rows for _ in range(steps)]
    values = [[value(chunk.obs["policy"][t, n]) for n in range(rows)] for t in range(steps + 1)]
    for n in range(rows):
        following = 0.0  # the advantage of step t+1 of this row, if it continues this episode
        for t in reversed(range(steps)):
            if not bool(chunk.mask[t, n]):
                advantages[t][n] = 0.0
                following = 0.0  # a masked transition belongs to no episode: nothing flows through it
                continue
            terminated, truncated = bool(chunk.terminated[t, n]), bool(chunk.truncated[t, n])
            if terminated:
                next_value = 0.0
            elif truncated:
                next_value = value(chunk.final_obs["policy"][finals[(t, n)]])
            else:
                next_value = values[t + 1][n]
            delta = float(chunk.reward[t, n]) + gamma * next_value - values[t][n]
            if terminated or truncated:  # the episode ends here: the trace does not reach step t+1
                advantages[t][n] = delta
            else:
                advantages[t][n] = delta + gamma * lam * following
            following = advantages[t][n]
    return advantages, values


def make_learner(dim: int = 4, seed: int = 0, **algo) -> Learner:
    spaces = {"policy": gym.spaces.Box(-float("inf"), float("inf"), (dim,))}
    return Learner(
        spaces, gym.spaces.Discrete(2), ModelConfig(hidden_sizes=[16, 16]), PPOConfig(**algo), horizon=10, seed=seed
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_a_slow_reference_loop_on_random_chunks_with_episode_ends_and_masks(seed):
    generator = torch.Generator().manual_seed(seed)
    gamma, lam = 0.97, 0.9
    learner = make_learner(gamma=gamma, gae_lambda=lam, seed=seed)
    critic = learner.model.critic
    chunk = random_chunk(generator, 16, 6, 4)
    assert chunk.terminated.any() and chunk.truncated.any() and (chunk.terminated & chunk.truncated).any()
    assert (~chunk.mask).any()

    values, next_values = chunk_values(critic, chunk)
    done = chunk.terminated | chunk.truncated
    advantages = gae(chunk.reward, values, next_values, done, chunk.mask, gamma, lam)

    expected, expected_values = reference_advantages(critic, chunk, gamma, lam)
    torch.testing.assert_close(values, torch.tensor(expected_values[:-1]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(advantages, torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_learner_batch_has_returns_equal_to_advantages_plus_values_and_leaves_the_reward_alone():
    generator = torch.Generator().manual_seed(7)
    gamma, lam = 0.99, 0.95
    learner = make_learner(gamma=gamma, gae_lambda=lam)
    chunks = (random_chunk(generator, 12, 5, 4), random_chunk(generator, 12, 5, 4))
    rewards = [c.reward.clone() for c in chunks]

    batch = learner.algorithm.batch(list(chunks))

    for chunk, reward in zip(chunks, rewards, strict=True):
        assert torch.equal(chunk.reward, reward)
    torch.testing.assert_close(batch["returns"], batch["advantages"] + batch["values"], rtol=0, atol=0)
    expected_adv, expected_values = [], []
    for chunk in chunks:
        adv, values = reference_advantages(learner.model.critic, chunk, gamma, lam)
        mask = chunk.mask
        expected_adv.append(torch.tensor(adv)[mask])
        expected_values.append(torch.tensor(values[:-1])[mask])
    assert batch["advantages"].shape[0] == sum(int(c.mask.sum()) for c in chunks)
    torch.testing.assert_close(batch["advantages"], torch.cat(expected_adv), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch["values"], torch.cat(expected_values), rtol=1e-5, atol=1e-5)
    # the batch holds only the valid transitions, in (t, row) order
    torch.testing.assert_close(batch["obs"]["policy"], torch.cat([c.obs["policy"][:-1][c.mask] for c in chunks]))
