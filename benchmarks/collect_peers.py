"""The collection benchmark's peers: CleanRL's ``ppo.py`` rollout loop over Gymnasium vector envs and EnvPool.

``raysim bench collect`` (``raysim/bench/collect.py``) imports this file from the source tree and
measures these rows beside raysim's own.
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.bench.collect import ENVPOOL, GYM_ID, NATIVE, SYNC, Results, Row


def rows(n: int, steps: int, seed: int, model, results: Results, net: str = "cleanrl") -> list[Row]:
    """The peers' rows for N = ``n`` rows: Gymnasium's SyncVectorEnv and CartPoleVectorEnv, and EnvPool."""
    return _gym_rows(n, steps, seed, model, net) + _envpool_row(n, steps, seed, model, results, net)


class CleanRLLoop:
    """CleanRL ``ppo.py``'s rollout loop over a vector env with a Gymnasium-style API."""

    def __init__(self, envs, num_envs: int, model, steps: int, seed: int, net: str = "cleanrl"):
        self.envs, self.steps = envs, steps
        if net == "cleanrl":  # CleanRL's own networks (nn.Tanh), with raysim's weights
            self.actor, self.critic = cleanrl_net(model.actor.net), cleanrl_net(model.critic.net)
        else:  # raysim's modules themselves (its Tanh is 2*sigmoid(2x)-1)
            self.actor, self.critic = model.actor.net, model.critic.net
        obs_shape = envs.single_observation_space.shape
        self.obs = torch.zeros((steps, num_envs, *obs_shape))
        self.actions = torch.zeros((steps, num_envs))
        self.logprobs = torch.zeros((steps, num_envs))
        self.rewards = torch.zeros((steps, num_envs))
        self.dones = torch.zeros((steps, num_envs))
        self.values = torch.zeros((steps, num_envs))
        next_obs, _ = envs.reset(seed=seed)
        self.next_obs = torch.Tensor(next_obs)
        self.next_done = torch.zeros(num_envs)

    def __call__(self, version: int):
        next_obs, next_done = self.next_obs, self.next_done
        for step in range(self.steps):
            self.obs[step] = next_obs
            self.dones[step] = next_done
            with torch.no_grad():
                logits = self.actor(next_obs)
                probs = torch.distributions.Categorical(logits=logits)
                action = probs.sample()
                logprob = probs.log_prob(action)
                self.values[step] = self.critic(next_obs).flatten()
            self.actions[step] = action
            self.logprobs[step] = logprob
            next_obs, reward, terminations, truncations, _ = self.envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            self.rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
        with torch.no_grad():
            next_value = self.critic(next_obs).reshape(1, -1)
        self.next_obs, self.next_done = next_obs, next_done
        return next_value

    def close(self) -> None:
        self.envs.close()


def cleanrl_net(net: torch.nn.Sequential) -> torch.nn.Sequential:
    """The network as CleanRL's ppo.py builds it (``nn.Linear`` and ``nn.Tanh``), holding ``net``'s weights.

    raysim's ``Tanh`` module computes ``2*sigmoid(2x)-1`` (cheaper than ``torch.tanh`` on CPU builds);
    the baselines run what a CleanRL user runs: ``torch.tanh``.
    """
    layers = [torch.nn.Tanh() if not isinstance(m, torch.nn.Linear) else m for m in net]
    copy = torch.nn.Sequential(
        *[torch.nn.Linear(m.in_features, m.out_features) if isinstance(m, torch.nn.Linear) else m for m in layers]
    )
    copy.load_state_dict(net.state_dict())
    return copy


def _gym_rows(n: int, steps: int, seed: int, model, net: str = "cleanrl") -> list[Row]:
    import gymnasium as gym

    rows = []
    for name, mode in ((SYNC, "sync"), (NATIVE, "vector_entry_point")):
        loop = CleanRLLoop(gym.make_vec(GYM_ID, n, vectorization_mode=mode), n, model, steps, seed, net)
        rows.append(Row(name, loop, loop.close))
    return rows


def _envpool_row(n: int, steps: int, seed: int, model, results: Results, net: str = "cleanrl") -> list[Row]:
    if ENVPOOL in results.skipped:
        return []
    try:
        import envpool

        envs = envpool.make(GYM_ID, env_type="gymnasium", num_envs=n, seed=seed)
        loop = CleanRLLoop(envs, n, model, steps, seed, net)
    except Exception as error:  # usually: not installed
        results.skipped[ENVPOOL] = f"{type(error).__name__}: {error}"
        return []
    return [Row(ENVPOOL, loop, loop.close)]
