"""CleanRL ``ppo_continuous_action.py``'s collection phase on Meta-World MT1 (the peer of ``raysim bench metaworld``).

Gymnasium's ``SyncVectorEnv`` over ``gym.make("Meta-World/MT1", env_name=task)``, each env wrapped as CleanRL
wraps it (``make_env``), same-step autoreset; CleanRL's ``Agent`` ([64, 64] Tanh actor and critic, a
state-free log-std; ``cleanrl_ppo_continuous.py``'s) and storage tensors. One chunk is CleanRL's rollout:
``agent.get_action_and_value`` per step, ``envs.step``, the step written into the storage, then the value of
the next observation.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from raysim.bench.peers import peer_module

GAMMA = 0.99  # CleanRL's default; NormalizeReward's discount


def make_env(task: str, seed: int, gamma: float = GAMMA):
    """CleanRL's env thunk (``cleanrl_ppo_continuous.make_env``) on ``Meta-World/MT1``: ClipAction,
    NormalizeObservation, observations clipped to [-10, 10], NormalizeReward, rewards clipped to [-10, 10].
    Its RecordEpisodeStatistics is Meta-World's own: ``gym.make`` returns the env with one inside (a second
    one refuses to step)."""

    def thunk():
        env = gym.make("Meta-World/MT1", env_name=task, seed=seed, disable_env_checker=True)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


class Collection:
    """CleanRL's rollout over ``num_envs`` Meta-World envs of ``task``: ``collection()`` fills ``steps`` steps."""

    def __init__(self, task: str, num_envs: int, steps: int, seed: int):
        import metaworld  # noqa: F401 - registers the Meta-World/ ids

        torch.manual_seed(seed)
        self.envs = gym.vector.SyncVectorEnv(
            [make_env(task, seed + i) for i in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        obs_dim, act_dim = self.envs.single_observation_space.shape[0], self.envs.single_action_space.shape[0]
        self.agent = peer_module("cleanrl_ppo_continuous").Agent(obs_dim, act_dim)
        self.steps = steps
        self.obs = torch.zeros((steps, num_envs, obs_dim))
        self.actions = torch.zeros((steps, num_envs, act_dim))
        self.logprobs = torch.zeros((steps, num_envs))
        self.rewards = torch.zeros((steps, num_envs))
        self.dones = torch.zeros((steps, num_envs))
        self.values = torch.zeros((steps, num_envs))
        next_obs, _ = self.envs.reset(seed=seed)
        self.next_obs, self.next_done = torch.Tensor(next_obs), torch.zeros(num_envs)

    def __call__(self) -> torch.Tensor:
        """One rollout of ``steps`` steps into the storage; the value of the next observation (the bootstrap)."""
        agent, next_obs, next_done = self.agent, self.next_obs, self.next_done
        for step in range(self.steps):
            self.obs[step], self.dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                self.values[step] = value.flatten()
            self.actions[step], self.logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, infos = self.envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            self.rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
        self.next_obs, self.next_done = next_obs, next_done
        return next_value

    def close(self) -> None:
        self.envs.close()
