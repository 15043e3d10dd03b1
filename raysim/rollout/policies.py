"""What acts in an evaluation: the learned actor, uniform random actions, or the env's scripted expert.

``EvalEnding`` asks its policy for every row's action before each step::

    actions = policy.act(obs, keys)              # keys: each row's episode key and its step in the episode
    step = env.step(policy.env_action(actions))

``keys`` are ``(key [N], counter [N])`` int64: episode ``j``'s key derives from the evaluation seed and ``j``
(``EvalEpisodes``), the counter is the episode's step, so a random or sampled action of episode ``j`` depends on
``(eval seed, j, step)`` alone and the records do not depend on the layout. ``EvalEpisodes.policy`` names the
policy: None is the learned actor, ``SCRIPTED`` the others, which need no weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import gymnasium as gym
import numpy as np
import torch

from raysim.envs.contract import BatchedEnv, Obs
from raysim.models import ActionSampling, Actor, RowMemory
from raysim.seeding import keyed_uniform

SCRIPTED = ("expert", "random")  # the policies that need no weights (``EvalEpisodes.policy``)

Keys = tuple[torch.Tensor, torch.Tensor]


class EvalPolicy(Protocol):
    """One action per row for the rows' observations (see the module)."""

    def act(self, obs: Obs, keys: Keys) -> torch.Tensor: ...

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The action the env receives for one of ``act``'s."""
        ...


class LearnedPolicy:
    """The shard's actor, each row computed alone (``by_row``): its mode, or (``deterministic`` False) a sample
    with the keys' noise; the env receives it mapped into the action space (``Actor.env_action``)."""

    def __init__(self, actor: Actor, memory: RowMemory | None, deterministic: bool):
        self.actor, self.memory, self.deterministic = actor, memory, deterministic
        self.env_action = actor.env_action

    def act(self, obs: Obs, keys: Keys) -> torch.Tensor:
        if self.deterministic:
            return self.actor.deterministic(obs, by_row=True, memory=self.memory)
        return self.actor.sample(obs, keys=keys, by_row=True, memory=self.memory)[0]


class ServedPolicy:
    """The learned actor on a policy server (``shards.placement: servers``): each row computed alone there, as
    ``LearnedPolicy`` computes it, from the draws made here (a stochastic evaluation's keyed noise). ``ask``: the
    shard's request for its rows' actions (``Served.ask``)."""

    def __init__(self, ask: Callable[..., torch.Tensor], sampling: ActionSampling, deterministic: bool):
        self.ask, self.sampling, self.deterministic = ask, sampling, deterministic
        self.env_action = sampling.env_action

    def act(self, obs: Obs, keys: Keys) -> torch.Tensor:
        draws = None if self.deterministic else self.sampling.draws(keys[0].shape[0], keys=keys)
        return self.ask(obs, draws, by_row=True)


class RandomPolicy:
    """Actions drawn uniformly over the env's action space (a bounded ``Box``, or ``Discrete``) from the keys'
    counter-based noise (``raysim.seeding.keyed_uniform``)."""

    def __init__(self, env_id: str, space: gym.Space):
        if isinstance(space, gym.spaces.Discrete):
            self.discrete, self.shape = True, ()
            self.low, self.span = int(space.start), int(space.n)
        elif isinstance(space, gym.spaces.Box) and space.is_bounded("both"):
            self.discrete, self.shape = False, tuple(space.shape)
            self.low = torch.as_tensor(np.asarray(space.low, np.float64).reshape(-1))
            self.span = torch.as_tensor(np.asarray(space.high, np.float64).reshape(-1)) - self.low
        else:
            raise ValueError(f"{env_id}: random actions need a bounded Box or a Discrete action space, got {space}")
        self.width = 1 if self.discrete else math.prod(self.shape)

    def act(self, obs: Obs, keys: Keys) -> torch.Tensor:
        uniform = keyed_uniform(*keys, self.width)  # [N, width] in (0, 1)
        if self.discrete:
            return self.low + (uniform[:, 0] * self.span).long()
        return (self.low + uniform * self.span).float().view(-1, *self.shape)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        return action


class ExpertPolicy:
    """The env's scripted expert (``expert_actions``: e.g. ``raysim/MetaWorld``'s, by each row's task), which
    reads the state the rows are in, privileged state included, so it ignores ``obs``."""

    def __init__(self, env: BatchedEnv):
        self.expert_actions = getattr(env, "expert_actions", None)
        if self.expert_actions is None:
            raise ValueError(
                f"{env.env_id} has no scripted expert: only envs with one (raysim/MetaWorld) play the expert policy"
            )

    def act(self, obs: Obs, keys: Keys) -> torch.Tensor:
        return self.expert_actions()

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        return action


def scripted_policy(name: str, env: BatchedEnv) -> EvalPolicy:
    """The scripted policy ``name`` (``SCRIPTED``) in ``env``; a ``ValueError`` in one line where ``env`` cannot
    play it (no scripted expert, an unbounded action space)."""
    if name == "random":
        return RandomPolicy(env.env_id, env.action_space)
    if name == "expert":
        return ExpertPolicy(env)
    raise ValueError(f"policy must be one of {list(SCRIPTED)}, or None for the learned actor; got {name!r}")
