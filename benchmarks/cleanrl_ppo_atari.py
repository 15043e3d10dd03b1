"""A CleanRL-style single-file PPO on Atari (the peer of ``raysim bench atari``).

It follows CleanRL's ``ppo_atari.py`` and its defaults: 8 ``SyncVectorEnv`` envs of
``BreakoutNoFrameskip-v4`` (no sticky actions), 128 steps per rollout, 4 minibatches, 4 epochs,
Adam lr 2.5e-4 (eps 1e-5) annealed linearly, gamma 0.99, GAE lambda 0.95, clip 0.1 (also the
value loss), entropy 0.01, value 0.5, max grad norm 0.5, normalized advantages, the Nature CNN
(32 8x8/4, 64 4x4/2, 64 3x3/1, 512) shared by the actor and critic heads, orthogonal init. The
env is wrapped as CleanRL wraps it (its wrappers are Stable-Baselines3's, written here):
RecordEpisodeStatistics innermost, then no-op reset (up to 30), frame skip 4 with the max of the
last two frames, episodic life, fire reset, reward clipping to its sign, 84x84 (resized with
``INTER_AREA``, then OpenCV's grayscale), a stack of 4 frames. A life loss ends a training
trajectory (a done for GAE); the reported return is the raw score of a whole game
(RecordEpisodeStatistics sees only game overs). One torch thread by default, as the other peers
here (``--threads``; CleanRL's script leaves torch's default, a thread per core).

Reported: every finished game's raw score, training seconds, and within them the seconds of
collection (acting and env steps, the rollout phase) and of the update (GAE and the epochs).
``Collection`` times the rollout phase alone, with the initial (fixed) policy; ``envpool=True``
steps CleanRL ``ppo_atari_envpool.py``'s envs instead (``make_envpool``: EnvPool's C++ Atari, same agent).

    python benchmarks/cleanrl_ppo_atari.py --total-timesteps 200000
    python benchmarks/cleanrl_ppo_atari.py --total-timesteps 10000000 --device cuda --env-id PongNoFrameskip-v4
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

ENV_ID = "BreakoutNoFrameskip-v4"
ENVPOOL_ID = "Breakout-v5"  # EnvPool's v5 ids: no sticky actions unless repeat_action_probability says so
ENVPOOL_THREADS = 1  # EnvPool's own C++ pool: one thread stepping the rows (the acting is torch's, one thread)


def sticky_actions(env_id: str) -> float:
    """The probability that the ALE repeats the previous action: 0.25 for ALE v5 ids, 0 for the v4 ids."""
    return 0.25 if env_id.endswith("-v5") else 0.0


class NoopResetEnv(gym.Wrapper):
    """Up to ``noop_max`` no-ops after a reset: random starting states."""

    def __init__(self, env: gym.Env, noop_max: int = 30):
        super().__init__(env)
        self.noop_max = noop_max
        assert env.unwrapped.get_action_meanings()[0] == "NOOP"

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.unwrapped.np_random.integers(1, self.noop_max + 1)):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class MaxAndSkipEnv(gym.Wrapper):
    """Repeat the action ``skip`` frames, sum the rewards, observe the max of the last two frames."""

    def __init__(self, env: gym.Env, skip: int = 4):
        super().__init__(env)
        self.buffer = np.zeros((2, *env.observation_space.shape), dtype=env.observation_space.dtype)
        self.skip = skip

    def step(self, action):
        total, terminated, truncated, info = 0.0, False, False, {}
        for i in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i >= self.skip - 2:
                self.buffer[i - (self.skip - 2)] = obs
            total += float(reward)
            if terminated or truncated:
                break
        return self.buffer.max(axis=0), total, terminated, truncated, info


class EpisodicLifeEnv(gym.Wrapper):
    """A life loss terminates (for the learner); the game is reset only when it is really over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.was_real_done = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:  # a no-op from the life-loss state: the game goes on
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireResetEnv(gym.Wrapper):
    """Press FIRE after a reset (games that wait for it)."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        _, _, terminated, truncated, _ = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, _ = self.env.step(2)
        if terminated or truncated:
            self.env.reset(**kwargs)
        return obs, {}


class ClipRewardEnv(gym.RewardWrapper):
    """The reward's sign: -1, 0 or 1."""

    def reward(self, reward):
        return np.sign(float(reward))


def gray(env: gym.Env) -> gym.Env:
    """Grayscale by OpenCV's RGB2GRAY, as the Gymnasium 0.29 CleanRL ran (1.x's weights differ slightly)."""
    import cv2

    space = gym.spaces.Box(0, 255, env.observation_space.shape[:2], np.uint8)
    return gym.wrappers.TransformObservation(env, lambda obs: cv2.cvtColor(obs, cv2.COLOR_RGB2GRAY), space)


def make_env(env_id: str = ENV_ID):
    def thunk():
        import ale_py

        gym.register_envs(ale_py)  # the ALE ids (Gymnasium 1.x no longer finds them by itself)
        env = gym.make(env_id, frameskip=1)  # the skip is MaxAndSkipEnv's (ALE v5 ids keep sticky actions 0.25)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        env = gray(env)
        return gym.wrappers.FrameStackObservation(env, 4)

    return thunk


def make_envs(num_envs: int, env_id: str = ENV_ID) -> gym.vector.SyncVectorEnv:
    # same-step autoreset: the semantics CleanRL's script was written for (gymnasium < 1.0)
    return gym.vector.SyncVectorEnv(
        [make_env(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def make_envpool(num_envs: int = 8, seed: int = 1, env_id: str = ENVPOOL_ID, threads: int = ENVPOOL_THREADS):
    """CleanRL ``ppo_atari_envpool.py``'s envs: EnvPool's C++ Atari with the same preprocessing built in
    (up to 30 no-ops, frame skip 4 with max pooling, episodic life, fire reset, reward clipping, 84x84
    gray by ``INTER_AREA``, 4 frames; no sticky actions), its rows stepped by a pool of ``threads`` C++
    threads, not pinned to cores. Its seeds are fixed here: EnvPool ignores ``reset(seed=...)``."""
    import envpool

    return envpool.make(  # num_envs, single_action_space, single_observation_space: EnvPool 1.x has them
        env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, episodic_life=True, reward_clip=True,
        repeat_action_probability=0.0, noop_max=30, num_threads=threads, thread_affinity_offset=-1,
    )  # fmt: skip


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


@dataclass
class Storage:
    """CleanRL's rollout buffers and the envs' current observation, kept across rollouts."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    values: torch.Tensor
    next_obs: torch.Tensor
    next_done: torch.Tensor

    @classmethod
    def start(cls, envs: gym.vector.SyncVectorEnv, num_steps: int, seed: int | None, device: str = "cpu") -> Storage:
        num_envs, shape = envs.num_envs, envs.single_observation_space.shape
        next_obs, _ = envs.reset(seed=seed)
        zeros = lambda: torch.zeros((num_steps, num_envs), device=device)  # noqa: E731
        return cls(
            torch.zeros((num_steps, num_envs, *shape), device=device), zeros(), zeros(), zeros(), zeros(), zeros(),
            torch.Tensor(next_obs).to(device), torch.zeros(num_envs, device=device),
        )  # fmt: skip


def rollout(agent: Agent, envs: gym.vector.SyncVectorEnv, s: Storage, global_step: int, games: list) -> int:
    """CleanRL's rollout phase: ``num_steps`` steps of every env into ``s``; each finished game's
    ``(global_step, raw score, length)`` appended to ``games``; returns the new global step."""
    device = s.obs.device
    for step in range(s.obs.shape[0]):
        global_step += envs.num_envs
        s.obs[step], s.dones[step] = s.next_obs, s.next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(s.next_obs)
            s.values[step] = value.flatten()
        s.actions[step], s.logprobs[step] = action, logprob
        next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
        next_done = np.logical_or(terminations, truncations)
        s.rewards[step] = torch.tensor(reward).to(device).view(-1)
        s.next_obs, s.next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
        if "final_info" in infos:  # a game over (RecordEpisodeStatistics is innermost: the raw score)
            final = infos["final_info"]
            for i in np.flatnonzero(final.get("_episode", [])):
                games.append((global_step, float(final["episode"]["r"][i]), int(final["episode"]["l"][i])))
    return global_step


def advantages_and_returns(agent: Agent, s: Storage, gamma: float, gae_lambda: float):
    """GAE over the rollout in ``s``, bootstrapped from its last observation."""
    num_steps = s.obs.shape[0]
    with torch.no_grad():
        next_value = agent.get_value(s.next_obs).reshape(1, -1)
        advantages = torch.zeros_like(s.rewards)
        lastgaelam = 0
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal, nextvalues = 1.0 - s.next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - s.dones[t + 1], s.values[t + 1]
            delta = s.rewards[t] + gamma * nextvalues * nextnonterminal - s.values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + s.values


def update(agent, optimizer, s: Storage, advantages, returns, epochs: int, minibatches: int, coefs: dict) -> None:
    """CleanRL's PPO epochs over the rollout (clipped policy and value losses, normalized advantages)."""
    b_obs = s.obs.reshape((-1, *s.obs.shape[2:]))
    b_logprobs, b_actions, b_values = s.logprobs.reshape(-1), s.actions.reshape(-1), s.values.reshape(-1)
    b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
    batch_size = b_obs.shape[0]
    minibatch_size = batch_size // minibatches
    clip_coef = coefs["clip_coef"]
    b_inds = np.arange(batch_size)
    for _ in range(epochs):
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
            loss = pg_loss - coefs["ent_coef"] * entropy.mean() + v_loss * coefs["vf_coef"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), coefs["max_grad_norm"])
            optimizer.step()


def train(
    seed: int = 1,
    total_timesteps: int = 10_000_000,
    threads: int | None = 1,
    device: str = "cpu",
    env_id: str = ENV_ID,
    num_envs: int = 8,
    num_steps: int = 128,
    num_minibatches: int = 4,
    update_epochs: int = 4,
    lr: float = 2.5e-4,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    clip_coef: float = 0.1,
    ent_coef: float = 0.01,
    vf_coef: float = 0.5,
    max_grad_norm: float = 0.5,
) -> dict:
    """CleanRL's training loop (``threads``: torch's threads, None leaves torch's default as CleanRL does;
    ``device``: the network's, ``cuda`` as CleanRL's ``--cuda``); the finished games, training seconds,
    and their collection and update seconds."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    if threads is not None:
        torch.set_num_threads(threads)
    num_iterations = total_timesteps // (num_envs * num_steps)
    envs = make_envs(num_envs, env_id)
    agent = Agent(envs.single_action_space.n).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    coefs = {"clip_coef": clip_coef, "ent_coef": ent_coef, "vf_coef": vf_coef, "max_grad_norm": max_grad_norm}
    global_step, games, collect_seconds, update_seconds = 0, [], 0.0, 0.0
    storage = Storage.start(envs, num_steps, seed, device)
    for iteration in range(1, num_iterations + 1):
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * lr
        start = time.perf_counter()
        global_step = rollout(agent, envs, storage, global_step, games)
        middle = time.perf_counter()
        advantages, returns = advantages_and_returns(agent, storage, gamma, gae_lambda)
        update(agent, optimizer, storage, advantages, returns, update_epochs, num_minibatches, coefs)
        end = time.perf_counter()
        collect_seconds, update_seconds = collect_seconds + middle - start, update_seconds + end - middle
    envs.close()
    return {
        "seed": seed,
        "env_steps": global_step,
        "train_seconds": collect_seconds + update_seconds,
        "collect_seconds": collect_seconds,
        "update_seconds": update_seconds,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "games": games,
    }


class Collection:
    """The rollout phase alone, with the initial policy fixed: ``collect()`` is one rollout of every env.

    ``envpool``: CleanRL ``ppo_atari_envpool.py``'s envs (``make_envpool``, ``env_id`` an EnvPool id such as
    ``ENVPOOL_ID``) stepped by the same agent and loop; its games are not reported (no final_info)."""

    def __init__(
        self,
        seed: int = 1,
        threads: int | None = 1,
        env_id: str = ENV_ID,
        num_envs: int = 8,
        num_steps: int = 128,
        envpool: bool = False,
    ):
        torch.manual_seed(seed)
        self.threads = threads or torch.get_num_threads()
        self.envs = make_envpool(num_envs, seed, env_id) if envpool else make_envs(num_envs, env_id)
        self.agent = Agent(self.envs.single_action_space.n)
        self.storage = Storage.start(self.envs, num_steps, None if envpool else seed)  # EnvPool's: at make
        self.global_step, self.games = 0, []
        self.steps_per_collect = num_envs * num_steps

    def collect(self) -> int:
        """One rollout phase; the env steps it took."""
        torch.set_num_threads(self.threads)  # torch's threads are the process's: another row may have set them
        self.global_step = rollout(self.agent, self.envs, self.storage, self.global_step, self.games)
        return self.steps_per_collect

    def close(self) -> None:
        self.envs.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=10_000_000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default, as CleanRL)")
    parser.add_argument("--device", default="cpu", help="the network's device (cuda: as CleanRL's --cuda)")
    parser.add_argument("--env-id", default=ENV_ID, help="a NoFrameskip-v4 id, or an ALE v5 id (sticky actions)")
    args = parser.parse_args(argv)
    result = train(args.seed, args.total_timesteps, args.threads or None, args.device, args.env_id)
    last = [score for _, score, _ in result["games"][-10:]]
    summary = {k: v for k, v in result.items() if k != "games"}
    print(json.dumps({**summary, "games_finished": len(result["games"]), "last_10_game_scores": last}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
