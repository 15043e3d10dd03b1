"""A CleanRL-style single-file continuous PPO on MuJoCo (the peer of ``raysim bench mujoco``).

It follows CleanRL's ``ppo_continuous_action.py`` and its defaults: 1 ``SyncVectorEnv`` env, 2048
steps per rollout, 32 minibatches, 10 epochs, Adam lr 3e-4 (eps 1e-5) annealed linearly, gamma
0.99, GAE lambda 0.95, clip 0.2 (also the value loss), entropy 0, value 0.5, max grad norm 0.5,
normalized advantages per minibatch, networks [64, 64] Tanh with orthogonal init, a state-free
log-std. The env is wrapped as CleanRL wraps it: RecordEpisodeStatistics, ClipAction,
NormalizeObservation, observations clipped to [-10, 10], NormalizeReward, rewards clipped to
[-10, 10]; a truncated episode counts as done (no bootstrap), as in CleanRL.

Reported: the training episodes' returns (CleanRL's measure), training seconds, and a
deterministic evaluation (the Gaussian mean, observation statistics frozen) of the final policy.

    python benchmarks/cleanrl_ppo_continuous.py --env-id HalfCheetah-v5 --total-timesteps 100000
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal


def make_env(env_id: str, gamma: float):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        probs = Normal(action_mean, self.actor_logstd.expand_as(action_mean).exp())
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def evaluate(agent: Agent, train_env: gym.Env, env_id: str, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` deterministic episodes (the first episode of each of ``episodes`` rows),
    observations normalized by the training statistics, frozen."""
    stats = train_env.get_wrapper_attr("obs_rms")

    def thunk():
        env = gym.wrappers.FlattenObservation(gym.make(env_id))
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env.update_running_mean = False
        env.obs_rms = stats
        return gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)

    envs = gym.vector.SyncVectorEnv([thunk for _ in range(episodes)])
    obs, _ = envs.reset(seed=[seed + i for i in range(episodes)])
    returns, alive = np.zeros(episodes), np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while alive.any():
            action = agent.actor_mean(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            obs, reward, term, trunc, _ = envs.step(action)
            returns += reward * alive
            alive &= ~(term | trunc)
    envs.close()
    return returns.tolist()


def train(
    env_id: str = "HalfCheetah-v5",
    seed: int = 1,
    total_timesteps: int = 1_000_000,
    eval_episodes: int = 20,
    num_envs: int = 1,
    num_steps: int = 2048,
    num_minibatches: int = 32,
    update_epochs: int = 10,
    lr: float = 3e-4,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    clip_coef: float = 0.2,
    ent_coef: float = 0.0,
    vf_coef: float = 0.5,
    max_grad_norm: float = 0.5,
) -> dict:
    """CleanRL's training loop; returns the training curve, training seconds and the final evaluation."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // num_minibatches
    num_iterations = total_timesteps // batch_size
    # same-step autoreset: the semantics CleanRL's script was written for (gymnasium < 1.0)
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, gamma) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    agent = Agent(obs_dim, act_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    obs = torch.zeros((num_steps, num_envs, obs_dim))
    actions = torch.zeros((num_steps, num_envs, act_dim))
    logprobs = torch.zeros((num_steps, num_envs))
    rewards = torch.zeros((num_steps, num_envs))
    dones = torch.zeros((num_steps, num_envs))
    values = torch.zeros((num_steps, num_envs))

    global_step, curve = 0, []
    start = time.perf_counter()
    next_obs, _ = envs.reset(seed=seed)
    next_obs, next_done = torch.Tensor(next_obs), torch.zeros(num_envs)
    for iteration in range(1, num_iterations + 1):
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * lr
        for step in range(num_steps):
            global_step += num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
            if "final_info" in infos:  # the raw episodic return (RecordEpisodeStatistics is innermost)
                final = infos["final_info"]
                for i in np.flatnonzero(final.get("_episode", [])):
                    curve.append((global_step, float(final["episode"]["r"][i])))
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values
        b_obs, b_logprobs, b_actions = obs.reshape(-1, obs_dim), logprobs.reshape(-1), actions.reshape(-1, act_dim)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _ in range(update_epochs):
            np.random.shuffle(b_inds)
            for begin in range(0, batch_size, minibatch_size):
                mb = b_inds[begin : begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
                newvalue = newvalue.view(-1)
                v_unclipped = (newvalue - b_returns[mb]) ** 2
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -clip_coef, clip_coef)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
                optimizer.step()
    train_seconds = time.perf_counter() - start
    eval_returns = evaluate(agent, envs.envs[0], env_id, eval_episodes, seed=10_000 + seed) if eval_episodes else []
    envs.close()
    return {
        "seed": seed,
        "env_steps": global_step,
        "train_seconds": train_seconds,
        "curve": curve,
        "eval_returns": eval_returns,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=1_000_000)
    parser.add_argument("--eval-episodes", type=int, default=20)
    args = parser.parse_args(argv)
    result = train(args.env_id, args.seed, args.total_timesteps, args.eval_episodes)
    last = [r for _, r in result["curve"][-10:]]
    summary = {k: v for k, v in result.items() if k != "curve"}
    print(json.dumps({**summary, "last_10_training_returns": last}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
