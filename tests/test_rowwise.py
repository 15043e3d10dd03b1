"""The evaluation's forward pass: a row's result is bitwise the same in any batch."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from raysim.models import Actor, ModelConfig


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "gelu", "silu"])
@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("hidden", [[24, 40], [300]])  # [300]: a layer's products are formed in blocks of rows
def test_a_rows_action_in_evaluation_does_not_depend_on_the_batch_it_is_in(activation, discrete, hidden):
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as on every shard
    spaces = {"policy": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)}
    action_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
    actor = Actor(spaces, action_space, ModelConfig(hidden_sizes=hidden, activation=activation, obs_norm=True))
    obs = torch.randn(80, 5)
    with torch.inference_mode():
        alone = torch.cat([actor(obs[i : i + 1], by_row=True) for i in range(80)])
        for start, size in ((0, 80), (0, 7), (3, 33), (40, 40), (79, 1), (10, 64)):
            batch = actor(obs[start : start + size], by_row=True)
            assert torch.equal(batch, alone[start : start + size]), (start, size)
        assert torch.allclose(actor(obs), alone, atol=1e-6)  # the same function as the batched forward
