"""A CleanRL-style single-file PPO on CartPole-v1 (the peer of ``benchmarks/solve.py``).

It follows CleanRL's ``ppo.py`` and its defaults: 4 ``SyncVectorEnv`` envs, 128 steps per
rollout, 4 minibatches, 4 epochs, Adam lr 2.5e-4 annealed linearly over ``--total-timesteps``
(500k), gamma 0.99, GAE lambda 0.95, clip 0.2 (also the value loss), entropy 0.01, value 0.5,
max grad norm 0.5, normalized advantages, networks [64, 64] Tanh with orthogonal init.

Time to solve: every ``--eval-every`` (10k) env steps, 100 deterministic (argmax) episodes on
separate envs; training stops at the first evaluation whose mean return is >= ``--target``
(475). Evaluation time is not counted in the training seconds.

    python benchmarks/cleanrl_ppo.py --seed 1
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = torch.distributions.Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def evaluate(agent: Agent, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` deterministic episodes, one per env row (the first episode of each)."""
    envs = gym.make_vec("CartPole-v1", episodes, vectorization_mode="vector_entry_point")
    obs, _ = envs.reset(seed=seed)
    returns, alive = np.zeros(episodes), np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while alive.any():
            action = agent.actor(torch.as_tensor(obs)).argmax(-1).numpy()
            obs, reward, term, trunc, _ = envs.step(action)
            returns += reward * alive
            alive &= ~(term | trunc)
    envs.close()
    return float(returns.mean())


def train(
    seed: int = 1,
    total_timesteps: int = 500_000,
    eval_every: int = 10_000,
    target: float = 475.0,
    eval_episodes: int = 100,
    max_steps: int | None = None,
    num_envs: int = 4,
    num_steps: int = 128,
    num_minibatches: int = 4,
    update_epochs: int = 4,
    lr: float = 2.5e-4,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    clip_coef: float = 0.2,
    ent_coef: float = 0.01,
    vf_coef: float = 0.5,
    max_grad_norm: float = 0.5,
) -> dict:
    """Train until an evaluation passes (or ``max_steps``); returns steps, training seconds and the evaluations."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // num_minibatches
    num_iterations = total_timesteps // batch_size
    # same-step autoreset: the semantics CleanRL's ppo.py was written for (gymnasium < 1.0); with
    # gymnasium 1.x's default NEXT_STEP mode, every reset would add a bogus transition to the batch
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    agent = Agent(4, 2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    obs = torch.zeros((num_steps, num_envs, 4))
    actions = torch.zeros((num_steps, num_envs))
    logprobs = torch.zeros((num_steps, num_envs))
    rewards = torch.zeros((num_steps, num_envs))
    dones = torch.zeros((num_steps, num_envs))
    values = torch.zeros((num_steps, num_envs))

    global_step, train_time, next_eval, evals = 0, 0.0, eval_every, []
    solved = False
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
            next_obs, reward, terminations, truncations, _ = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
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
        b_obs, b_logprobs, b_actions = obs.reshape(-1, 4), logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _ in range(update_epochs):
            np.random.shuffle(b_inds)
            for begin in range(0, batch_size, minibatch_size):
                mb = b_inds[begin : begin + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions.long()[mb])
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
        if global_step >= next_eval:  # evaluation time is not training time
            train_time += time.perf_counter() - start
            mean_return = evaluate(agent, eval_episodes, seed=10_000 + seed)
            evals.append({"env_steps": global_step, "train_seconds": train_time, "mean_return": mean_return})
            next_eval += eval_every
            start = time.perf_counter()
            if mean_return >= target:
                solved = True
                break
        if max_steps is not None and global_step >= max_steps:
            break
    envs.close()
    last = evals[-1] if evals else {"env_steps": global_step, "train_seconds": train_time + time.perf_counter() - start}
    return {
        "seed": seed,
        "solved": solved,
        "env_steps": last["env_steps"],
        "train_seconds": last["train_seconds"],
        "evals": evals,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max-steps", type=int, default=200_000, help="give up after this many env steps")
    args = parser.parse_args(argv)
    result = train(args.seed, args.total_timesteps, args.eval_every, args.target, max_steps=args.max_steps)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
