"""How a shard's rows get their actions: one small interface, ``Acting``, and its kinds.

An ``EnvShard`` is its rows (``raysim.rollout.rows``) and an ``OwnActor`` or a ``Served``: it loads their weights
(``set_weights``) and opens each acting run with ``run()``; the endings of its acting loop
(``raysim.rollout.endings``) ask the ``Acting`` for actions::

    action = acting.sample(obs, actions[t], logp[t])  # a training step's, sampled into the chunk's buffers
    chunk.memory[T] = acting.peek(obs[T])             # a recurrent actor's output at the chunk's last observation
    policy = acting.policy(deterministic)             # what an evaluation plays (raysim.rollout.policies)

- ``OwnActor``: the shard's own CPU copy of the actor (``shards.placement: collocated``);
- ``Served``: the actor on a policy server (``servers``): the draws made here, the actions computed there;
- ``UniformWarmUp``: actions drawn uniformly in the action space (an off-policy warm-up, ``FixedSteps.random_actions``);
- a scripted policy (``expert``, ``random``: ``raysim.rollout.policies``) plays an evaluation in place of
  ``acting.policy`` (``EvalEpisodes.policy``); it needs no weights.

The chunk and everything downstream do not know which acted: every kind writes the same buffers, its draws taken
from the rows' generator, and a server that serves one worker gives bitwise the chunks of ``OwnActor``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch

from raysim.envs.contract import Obs
from raysim.models import ActionSampling, Actor, MLPInference, RowMemory, sample_categorical
from raysim.rollout.inference import inference
from raysim.rollout.policies import EvalPolicy, LearnedPolicy, ServedPolicy
from raysim.rollout.rows import Rows
from raysim.rollout.server import ActReply, ActRequest


class Acting(Protocol):
    """What chooses a shard's actions (see the module). ``sample`` writes a sampled action [N] (or [N, D]) and its
    log-probability [N] into the chunk's buffers and returns the action, stored as sampled (``sampling.env_action``
    maps it into the action space); ``version``: the weights that act (a chunk's ``policy_version``)."""

    sampling: ActionSampling
    version: int

    def sample(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor: ...

    def peek(self, obs: Obs) -> torch.Tensor: ...

    def policy(self, deterministic: bool) -> EvalPolicy: ...


class OwnActor:
    """The shard's own CPU copy of the actor, loaded by (timeline, version) (``set_weights``). An MLP actor acts
    through ``FusedActing`` (``sample_discrete`` / ``sample_gaussian``), any other through ``Actor.sample``: bitwise
    the same (tests/test_fast_path.py)."""

    def __init__(self, actor: Actor, rows: Rows):
        self.actor, self.rows, self.sampling = actor, rows, actor.sampling
        self.version, self.timeline = -1, None
        self.fused: FusedActing | None = None  # the actor as this acting run samples it (``run`` resets it)
        # an attribute, not a method: a step calls the right one straight away
        self.sample = self.sample_discrete if self.sampling.discrete else self.sample_gaussian

    def set_weights(self, weights: dict) -> None:
        """Load ``{"version": v, "timeline": t, "actor": state_dict}`` unless already loaded.

        Weights are known by (timeline, version): after a rewind to an older checkpoint a version number comes
        round again with other weights (``timeline`` is optional: None for weights that name no timeline).
        """
        if (weights.get("timeline"), weights["version"]) != (self.timeline, self.version):
            self.actor.load_state_dict(weights["actor"])
            self.version, self.timeline = weights["version"], weights.get("timeline")

    @contextmanager
    def run(self) -> Iterator[None]:
        """One acting run, the actor in inference mode; its ``FusedActing`` is built at its first step, with the
        weights it acts with."""
        self.fused = None
        with inference(self.actor):
            yield

    def sample_discrete(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` for a discrete actor, bitwise, written into ``action`` [N] and ``logp`` [N]."""
        fused = self._fused()
        if fused is None:
            return self._sample_into(obs, action, logp)
        log_probs = fused.output(obs).log_softmax(-1)
        torch.exp(log_probs, out=fused.first)
        sample_categorical(fused.first, self.rows.generator, noise=fused.second, out=action)
        torch.gather(log_probs, 1, action.unsqueeze(1), out=logp.unsqueeze(1))
        return action

    def sample_gaussian(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` for a continuous actor, bitwise, written into ``action`` [N, D] and ``logp`` [N]: the same
        normal draws from the generator, then ``mean + noise * std`` and ``-0.5 * sum(noise^2) - sum(log_std)
        - D log(2 pi) / 2``, each operation as ``Actor.sample`` does it, in place. With a log-std per state
        (``model.log_std: state``) the fused net's output goes through ``Actor.act_with`` itself: the std is new at
        every step, so there is nothing to compute once."""
        fused = self._fused()
        if fused is None:
            return self._sample_into(obs, action, logp)
        out, noise = fused.output(obs), fused.first
        noise.normal_(generator=self.rows.generator)  # what torch.randn(noise.shape, generator=...) draws
        if fused.std is None:
            return write(action, logp, *self.actor.act_with(out, noise))
        torch.mul(noise, fused.std, out=action)
        torch.add(out, action, out=action)  # the net's output is the mean
        torch.sum(torch.square(noise, out=fused.second), -1, out=logp)
        logp.mul_(-0.5).sub_(fused.log_std_sum).sub_(0.5 * math.log(2 * math.pi) * noise.shape[-1])
        return action

    def peek(self, obs: Obs) -> torch.Tensor:
        """A recurrent actor's core output at ``obs``, its rows' state left as it is (a chunk's last observation)."""
        actor = self.actor
        with inference(actor):
            return self.rows.memory.peek(actor.core, actor.features(obs))

    def policy(self, deterministic: bool) -> EvalPolicy:
        """The actor as evaluation plays it: each row alone."""
        return LearnedPolicy(self.actor, self.rows.memory, deterministic)

    def _sample_into(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` through the actor's own forward (a CNN's), copied into ``action`` and ``logp``."""
        return write(action, logp, *self.actor.sample(obs, self.rows.generator, memory=self.rows.memory))

    def _fused(self) -> FusedActing | None:
        """This run's ``FusedActing``, built at its first step; None for an actor of image groups."""
        if self.fused is None:
            actor = self.actor
            if not (actor.fusable and MLPInference.supports(actor.net)):
                return None
            self.fused = FusedActing(actor, self.rows.memory, self.rows.env.num_envs)
        return self.fused


class FusedActing:
    """An MLP actor for one acting run: its net through ``MLPInference``, after its recurrent core where it has one,
    and two scratch buffers of the draws' shape; for a Gaussian actor with a log-std parameter ``exp(log_std)`` and
    ``sum(log_std)`` (None with a log-std per state).

    The weights do not change within a run, so what depends on them alone (those two and the input normalizer's
    divisor) is computed once, as ``Actor.sample`` computes it at every step.
    """

    def __init__(self, actor: Actor, memory: RowMemory | None, rows: int):
        self.actor, self.memory = actor, memory
        self.net = MLPInference(actor.net, actor.obs_norm if actor.core is None else None, fixed=True)
        width = actor.sampling.width  # the net's output is twice as wide with a log-std per state
        self.first, self.second = torch.empty(rows, width), torch.empty(rows, width)
        self.std = self.log_std_sum = None
        if actor.log_std is not None:
            self.std, self.log_std_sum = actor.log_std.exp(), actor.log_std.sum()

    def output(self, obs: Obs) -> torch.Tensor:
        """The net's output for ``obs`` (logits or the Gaussian's parameters): a buffer that the next step
        overwrites."""
        actor = self.actor
        if actor.core is None:
            return self.net(actor.vector_input(obs))
        return self.net(self.memory.advance(actor.core, actor.features(obs)))  # the core reads normalized features


class Served:
    """The actor on a policy server (``raysim.rollout.server``): this side holds no weights (its "weights" are the
    key of the version its server holds). It draws its rows' noise from their generator as ``OwnActor`` draws it,
    sends it with their observations and recurrent state, and writes the replies into the chunk's buffers."""

    actor = None  # the weights are on the server

    def __init__(
        self, server: Callable[[ActRequest], ActReply], sampling: ActionSampling, inputs: list[str], rows: Rows
    ):
        self.server, self.sampling, self.inputs, self.rows = server, sampling, inputs, rows
        self.version, self.timeline = -1, None

    def set_weights(self, key: tuple) -> None:
        """Take the key ``(timeline, version)`` of the weights the server holds."""
        self.timeline, self.version = key

    def run(self) -> AbstractContextManager:
        """One acting run: nothing to build here."""
        return torch.no_grad()

    def sample(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """``Actor.sample`` on the policy server: the draws made here from the generator, as the collocated shard
        makes them; the action and its log-probability written into ``action`` and ``logp``."""
        reply = self.ask(obs, self.sampling.draws(action.shape[0], self.rows.generator))
        return write(action, logp, reply.action, reply.logp)

    def ask(self, obs: Obs, draws: torch.Tensor | None, by_row: bool = False, peek: bool = False) -> ActReply:
        """The policy server's reply for the rows (``ActRequest``); their recurrent state moves on, unless ``peek``
        (the core's output at ``obs``, the state left as it is)."""
        memory = self.rows.memory
        request = ActRequest(
            (self.timeline, self.version),
            {g: obs[g] for g in self.inputs},
            draws,
            None if memory is None else memory.state,
            None if memory is None else memory.starting,
            by_row,
            peek,
        )
        reply = self.server(request)
        if memory is not None and not peek:
            memory.state, memory.output = reply.state, reply.output
            memory.starting.fill_(False)
        return reply

    def peek(self, obs: Obs) -> torch.Tensor:
        """A recurrent actor's core output at ``obs``, computed on the server, the rows' state left as it is."""
        return self.ask(obs, None, peek=True).output

    def policy(self, deterministic: bool) -> EvalPolicy:
        """The actor as evaluation plays it: each row alone, on the server."""
        return ServedPolicy(
            lambda obs, draws, by_row: self.ask(obs, draws, by_row).action, self.sampling, deterministic
        )


class UniformWarmUp:
    """Actions drawn uniformly in the action space from the rows' ``generator`` (``ActionSampling.uniform``), the
    policy not consulted: an off-policy warm-up (``FixedSteps.random_actions``). What else a run asks (the version
    a chunk names, a recurrent core's output, evaluation) is that of ``acting``, the kind it stands in for."""

    def __init__(self, acting: Acting, generator: torch.Generator):
        self.sampling, self.version, self.generator = acting.sampling, acting.version, generator
        self.peek, self.policy = acting.peek, acting.policy

    def sample(self, obs: Obs, action: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        return self.sampling.uniform(action.shape[0], self.generator, action, logp)


def write(action: torch.Tensor, logp: torch.Tensor, sampled: torch.Tensor, logp_now: torch.Tensor) -> torch.Tensor:
    """A sample and its log-probability copied into the chunk's ``action`` and ``logp``."""
    action.copy_(sampled)
    logp.copy_(logp_now)
    return action
