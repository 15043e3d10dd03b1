"""A CleanRL-style single-file SAC on MuJoCo (the peer of raysim's SAC).

It follows CleanRL's ``sac_continuous_action.py`` and its defaults: one env, a replay buffer of 1M
transitions, batch 256, gamma 0.99, tau 0.005, 5,000 steps of uniform random actions (the action
space's own sampler, seeded), then one update per env step from step 5,001 on. The critics are twin Q
networks [256, 256] ReLU on (obs, action), trained together by one Adam (lr 1e-3) on the sum of their
MSEs to the target ``r + gamma (1 - terminated) (min of the two target Qs - alpha log pi)``; the target
networks follow by Polyak averaging every step. The actor is an MLP [256, 256] ReLU with a mean and a
state-dependent log-std squashed into [-5, 2], a tanh-squashed Gaussian scaled to the action bounds,
Adam lr 3e-4; it and the temperature are updated every second env step, twice on that step's batch
(CleanRL's ``policy_frequency`` 2), the temperature automatic (target entropy -dim(A), Adam lr 1e-3 on
log alpha). Rewards and observations raw; one torch thread, seeded.

Where this differs from CleanRL's script, and why:

- CleanRL's replay buffer is Stable-Baselines3's; here it is a NumPy ring buffer with the same contents
  (observations as float32, ``next_obs``, actions, rewards, ``dones`` = terminated only) and the same
  uniform draw of rows (``np.random.randint``), without SB3's draw of an env index (one env); it holds
  min(1M, total steps) rows, the same buffer for any run that never fills 1M.
- CleanRL steps a ``SyncVectorEnv`` of one env written for gymnasium < 1.0 (same-step autoreset, the real
  final observation in ``infos["final_observation"]``); under Gymnasium 1.x's next-step autoreset that
  code would store a reset step as a transition. Here one ``gymnasium.make`` env is stepped and reset by
  hand: a step's returned observation is its real next observation whether the episode terminated or was
  truncated (a truncated transition bootstraps from it), and the env is reset after either.
- Acting runs under ``torch.no_grad()`` (CleanRL builds an autograd graph it never uses): the same
  actions, a little less work for the peer.
- Evaluation (CleanRL's script has none): every ``--eval-every`` env steps, ``--eval-episodes``
  deterministic episodes (the mean action through tanh) on a separate env seeded 10,000 + seed, episode i
  reset with that seed + i; it draws nothing from the training generators and its time is not counted.
- ``--update-cost`` with ``--critics`` above 2 times the same update with a Python loop over that many Q
  networks, the target the min over a random 2 of them (RLPD's; drawn by ``torch.randperm``) and the
  actor's objective their mean (RLPD's): a loop to compare a batched ensemble against, not CleanRL's.

Printed (and appended to ``--out`` as each is produced): one JSON line per evaluation point and one at
the end, with the env steps, the training seconds split into collection (acting, env step, buffer) and
updates (sampling and gradient steps), updates/s, env steps/s, the mean of the last 10 finished training
episodes' returns and the evaluation, with the load average.

    python benchmarks/cleanrl_sac_continuous.py --env-id Hopper-v5 --seed 1 --total-steps 50000 \\
        --eval-every 10000 --out sac_peer.jsonl
    python benchmarks/cleanrl_sac_continuous.py --update-cost --critics 10 --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -5, 2
EVAL_SEED_OFFSET = 10_000


class SoftQNetwork(nn.Module):
    """Q(obs, action): an MLP [256, 256] ReLU on their concatenation."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + act_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, a], 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Actor(nn.Module):
    """A tanh-squashed Gaussian with a state-dependent log-std in [LOG_STD_MIN, LOG_STD_MAX], scaled to the bounds."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        act_dim = low.shape[0]
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mean = nn.Linear(256, act_dim)
        self.fc_logstd = nn.Linear(256, act_dim)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        log_std = torch.tanh(self.fc_logstd(x))
        return self.fc_mean(x), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized sample in the env's bounds and its log-probability (tanh's log-determinant included)."""
        mean, log_std = self(x)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x_t = normal.rsample()
        y_t = torch.tanh(x_t)
        log_prob = normal.log_prob(x_t) - torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        return y_t * self.action_scale + self.action_bias, log_prob.sum(1, keepdim=True)

    def deterministic(self, x: torch.Tensor) -> torch.Tensor:
        """The mean action through tanh, in the env's bounds (no draw from any generator)."""
        return torch.tanh(self(x)[0]) * self.action_scale + self.action_bias


class ReplayBuffer:
    """A ring buffer of transitions; ``dones`` holds terminations only, so a truncated transition bootstraps."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = np.zeros((capacity, act_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.capacity, self.pos, self.full = capacity, 0, False

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: float, terminated: bool) -> None:
        i = self.pos
        self.obs[i], self.next_obs[i], self.actions[i] = obs, next_obs, action
        self.rewards[i], self.dones[i] = reward, terminated
        self.pos = (i + 1) % self.capacity
        self.full = self.full or self.pos == 0

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """``batch_size`` rows drawn uniformly with replacement: obs, actions, rewards, next_obs, dones."""
        rows = np.random.randint(0, self.capacity if self.full else self.pos, size=batch_size)
        arrays = (self.obs, self.actions, self.rewards, self.next_obs, self.dones)
        return tuple(torch.from_numpy(array[rows]) for array in arrays)


class SAC:
    """CleanRL's SAC update over ``critics`` Q networks (2: CleanRL's twin critics exactly)."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, critics: int = 2, subset: int = 2, **hp):
        self.gamma, self.tau, self.policy_frequency = hp["gamma"], hp["tau"], hp["policy_frequency"]
        act_dim = low.shape[0]
        self.actor = Actor(obs_dim, low, high)
        self.qfs = [SoftQNetwork(obs_dim, act_dim) for _ in range(critics)]
        self.targets = [SoftQNetwork(obs_dim, act_dim) for _ in range(critics)]
        for qf, target in zip(self.qfs, self.targets, strict=True):
            target.load_state_dict(qf.state_dict())
        self.subset = min(subset, critics)
        self.q_optimizer = torch.optim.Adam([p for qf in self.qfs for p in qf.parameters()], lr=hp["q_lr"])
        self.actor_optimizer = torch.optim.Adam(list(self.actor.parameters()), lr=hp["policy_lr"])
        self.target_entropy = -float(act_dim)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha = self.log_alpha.exp().item()
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=hp["q_lr"])

    def update(self, batch: tuple[torch.Tensor, ...], global_step: int) -> None:
        """One critic step, on every ``policy_frequency``-th step that many actor and temperature steps, Polyak."""
        obs, actions, rewards, next_obs, dones = batch
        with torch.no_grad():
            next_actions, next_log_pi = self.actor.get_action(next_obs)
            targets = self.targets
            if self.subset < len(targets):
                targets = [targets[i] for i in torch.randperm(len(targets))[: self.subset].tolist()]
            min_q = torch.stack([t(next_obs, next_actions) for t in targets]).min(0).values
            next_q = rewards + (1 - dones) * self.gamma * (min_q - self.alpha * next_log_pi).view(-1)
        qf_loss = sum(F.mse_loss(qf(obs, actions).view(-1), next_q) for qf in self.qfs)
        self.q_optimizer.zero_grad()
        qf_loss.backward()
        self.q_optimizer.step()
        if global_step % self.policy_frequency == 0:
            for _ in range(self.policy_frequency):  # CleanRL compensates the delay by as many steps
                self.policy_step(obs)
        for qf, target in zip(self.qfs, self.targets, strict=True):
            for param, target_param in zip(qf.parameters(), target.parameters(), strict=True):
                target_param.data.copy_(self.tau * param.data + (1 - self.tau) * target_param.data)

    def policy_step(self, obs: torch.Tensor) -> None:
        """One actor step (min of twin Qs; an ensemble's mean, RLPD's) and one temperature step."""
        pi, log_pi = self.actor.get_action(obs)
        qs = torch.stack([qf(obs, pi) for qf in self.qfs])
        q_pi = qs.min(0).values if len(self.qfs) == 2 else qs.mean(0)
        actor_loss = (self.alpha * log_pi - q_pi).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        with torch.no_grad():
            _, log_pi = self.actor.get_action(obs)
        alpha_loss = (-self.log_alpha.exp() * (log_pi + self.target_entropy)).mean()
        self.a_optimizer.zero_grad()
        alpha_loss.backward()
        self.a_optimizer.step()
        self.alpha = self.log_alpha.exp().item()


def make_env(env_id: str) -> gym.Env:
    """``gymnasium.make(env_id)``, refused in one line unless its spaces are 1-D Boxes (CleanRL's MLPs need them)."""
    env = gym.make(env_id)
    for name, space in (("observation", env.observation_space), ("action", env.action_space)):
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            env.close()
            raise ValueError(f"--env-id {env_id}: its {name} space is {space}; this SAC needs a 1-D Box")
    return env


def build_sac(env: gym.Env, critics: int = 2, **hp) -> SAC:
    """CleanRL's SAC for ``env``'s spaces."""
    defaults = {"q_lr": 1e-3, "policy_lr": 3e-4, "gamma": 0.99, "tau": 0.005, "policy_frequency": 2}
    space = env.action_space
    return SAC(env.observation_space.shape[0], space.low, space.high, critics=critics, **(defaults | hp))


def env_step(
    env: gym.Env, buffer: ReplayBuffer, obs: np.ndarray, action: np.ndarray
) -> tuple[np.ndarray, float | None]:
    """Steps ``env``, stores the transition and returns the observation to act on next and a finished episode's return.

    The stored next observation is the step's own (the real final one on a truncation); only a termination
    is a done. The env is reset after either end.
    """
    next_obs, reward, terminated, truncated, info = env.step(action)
    buffer.add(obs, next_obs, action, reward, terminated)
    if terminated or truncated:
        return env.reset()[0], float(info["episode"]["r"])
    return next_obs, None


def evaluate(actor: Actor, env: gym.Env, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` deterministic episodes, episode i reset with ``seed + i``."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = actor.deterministic(torch.as_tensor(obs, dtype=torch.float32)[None])[0].numpy()
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def seed_everything(seed: int) -> None:
    """CleanRL's seeding, one torch thread."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)


def emit(record: dict, out: str | None) -> None:
    """Prints ``record`` as a JSON line and appends it to ``out`` at once (a killed run keeps its lines)."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        with Path(out).open("a") as f:
            f.write(line + "\n")


def train(
    env_id: str = "Hopper-v5",
    seed: int = 1,
    total_steps: int = 1_000_000,
    eval_every: int = 10_000,
    eval_episodes: int = 10,
    out: str | None = None,
    buffer_size: int = 1_000_000,
    batch_size: int = 256,
    learning_starts: int = 5_000,
) -> list[dict]:
    """CleanRL's training loop; emits and returns one record per evaluation point and one at the end."""
    seed_everything(seed)
    env = gym.wrappers.RecordEpisodeStatistics(make_env(env_id))
    env.action_space.seed(seed)
    eval_env = make_env(env_id)
    sac = build_sac(env)
    buffer = ReplayBuffer(min(buffer_size, total_steps), env.observation_space.shape[0], env.action_space.shape[0])
    run = {"env_id": env_id, "seed": seed, "batch_size": batch_size, "learning_starts": learning_starts}
    clock = {"collect_seconds": 0.0, "update_seconds": 0.0, "cpu_seconds": 0.0, "eval_seconds": 0.0}
    episodes, records, updates = [], [], 0
    obs, _ = env.reset(seed=seed)
    for global_step in range(total_steps):
        start, cpu = time.perf_counter(), time.process_time()
        if global_step < learning_starts:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = sac.actor.get_action(torch.as_tensor(obs, dtype=torch.float32)[None])[0][0].numpy()
        obs, finished = env_step(env, buffer, obs, action)
        collected = time.perf_counter()
        clock["collect_seconds"] += collected - start
        if finished is not None:
            episodes.append((global_step + 1, finished))
        if global_step > learning_starts:
            sac.update(buffer.sample(batch_size), global_step)
            updates += 1
            clock["update_seconds"] += time.perf_counter() - collected
        clock["cpu_seconds"] += time.process_time() - cpu
        steps = global_step + 1
        if (eval_every and steps % eval_every == 0) or steps == total_steps:
            started = time.perf_counter()
            returns = evaluate(sac.actor, eval_env, eval_episodes, EVAL_SEED_OFFSET + seed)
            clock["eval_seconds"] += time.perf_counter() - started
            record = report(run, steps, updates, clock, episodes, returns, sac.alpha)
            records.append(record)
            emit(record, out)
    env.close()
    eval_env.close()
    final = {**records[-1], "event": "end", "train_episodes_curve": episodes}
    records.append(final)
    emit(final, out)
    return records


def report(run: dict, steps: int, updates: int, clock: dict, episodes: list, returns: list, alpha: float) -> dict:
    """One evaluation point's record: timings, training and evaluation returns, the load average."""
    train_seconds = clock["collect_seconds"] + clock["update_seconds"]
    last = [r for _, r in episodes[-10:]]
    return {
        "event": "eval",
        **run,
        "env_steps": steps,
        "updates": updates,
        "train_seconds": round(train_seconds, 3),
        "collect_seconds": round(clock["collect_seconds"], 3),
        "update_seconds": round(clock["update_seconds"], 3),
        "train_cpu_seconds": round(clock["cpu_seconds"], 3),
        "eval_seconds": round(clock["eval_seconds"], 3),
        "updates_per_s": round(updates / clock["update_seconds"], 2) if updates else None,
        "env_steps_per_s": round(steps / train_seconds, 2),
        "collect_steps_per_s": round(steps / clock["collect_seconds"], 2),
        "train_episodes": len(episodes),
        "train_return_last10": float(np.mean(last)) if last else None,
        "eval_return_mean": float(np.mean(returns)) if returns else None,
        "eval_returns": [round(r, 2) for r in returns],
        "alpha": alpha,
        "torch_threads": torch.get_num_threads(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def update_cost(
    env_id: str = "Hopper-v5",
    critics: int = 2,
    steps: int = 200,
    warmup: int = 20,
    batch_size: int = 256,
    seed: int = 1,
    out: str | None = None,
) -> dict:
    """Gradient steps/s of the update alone on one random batch of ``env_id``'s shapes, after ``warmup`` steps.

    Steps alternate parity as in training, so on average each holds one critic step, one actor step and
    one temperature step (CleanRL's two of each every second step); ``steps`` is rounded up to even.
    """
    seed_everything(seed)
    env = make_env(env_id)
    sac = build_sac(env, critics=critics)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    batch = (
        torch.randn(batch_size, obs_dim),
        torch.rand(batch_size, act_dim) * 2 - 1,
        torch.randn(batch_size),
        torch.randn(batch_size, obs_dim),
        (torch.rand(batch_size) < 0.01).float(),
    )
    steps += steps % 2
    for step in range(warmup):
        sac.update(batch, step)
    load_before = [round(x, 2) for x in os.getloadavg()]
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        sac.update(batch, step)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    record = {
        "event": "update_cost",
        "env_id": env_id,
        "critics": critics,
        "critic_subset": sac.subset,
        "batch_size": batch_size,
        "warmup": warmup,
        "steps": steps,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "steps_per_s": round(steps / seconds, 2),
        "ms_per_step": round(1000 * seconds / steps, 3),
        "torch_threads": torch.get_num_threads(),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    emit(record, out)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="Hopper-v5")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations (0: at the end)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", help="a file the JSON lines are appended to as they are produced")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-starts", type=int, default=5_000)
    parser.add_argument("--buffer-size", type=int, default=1_000_000)
    parser.add_argument("--update-cost", action="store_true", help="time the update alone on random data")
    parser.add_argument("--critics", type=int, default=2, help="Q networks, for --update-cost (2: CleanRL's)")
    parser.add_argument("--steps", type=int, default=200, help="timed gradient steps, for --update-cost")
    parser.add_argument("--warmup", type=int, default=20, help="untimed gradient steps first, for --update-cost")
    args = parser.parse_args(argv)
    if args.critics < 2:
        parser.error(f"--critics {args.critics}: at least 2 (the target is the min over 2 of them)")
    if args.critics != 2 and not args.update_cost:
        parser.error("--critics is for --update-cost; training is CleanRL's, with twin critics")
    try:
        make_env(args.env_id).close()
    except (ValueError, gym.error.Error) as error:
        parser.error(str(error))
    if args.update_cost:
        update_cost(args.env_id, args.critics, args.steps, args.warmup, args.batch_size, args.seed, args.out)
    else:
        train(
            args.env_id,
            args.seed,
            args.total_steps,
            args.eval_every,
            args.eval_episodes,
            args.out,
            args.buffer_size,
            args.batch_size,
            args.learning_starts,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
