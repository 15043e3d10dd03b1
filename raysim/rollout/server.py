"""Policy servers: the actor's weights in one place, acting for the rows of env workers (``shards.placement: servers``).

In the ``servers`` placement a training or evaluation shard is an *env worker*: an ``EnvShard`` that keeps its env
rows, observation functors, episode bookkeeping, the rows' recurrent state and a teacher, but no actor weights. At
each step it draws its rows' noise from its own generator exactly as a collocated shard draws it
(``ActionSampling.draws``) and asks its server for the actions (``ActRequest``; ``raysim.rollout.acting.Served``); the
server answers with the actions, their log-probabilities and the rows' next recurrent state (``ActReply``). The
worker builds the chunk, so the chunk that reaches the learner is the same object in both placements, and a server
that serves one worker returns bitwise the chunks of a collocated shard (its batch is the worker's rows, computed by
the same operations).

A server is stateless but for the weights: it keeps the last ``keep`` versions, each known by ``(timeline,
version)`` (``Learner.get_weights``); the coordinator loads each version into every server once (``load``) and the
workers' requests name the version they act with. Any server can serve any worker; a dead server loses nothing
but the steps in flight.

``PolicyServer`` computes (in-process, and in ``BatchingServer``, the Ray actor that batches what is queued:
requests of several workers for the same version are concatenated into one forward pass, with results equal to
the per-worker ones to float tolerance).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch

from raysim.envs.contract import Obs
from raysim.models import Actor, MLPInference, ModelConfig, RowMemory, resolve_device
from raysim.rollout.arrays import from_arrays, to_arrays
from raysim.rollout.inference import inference

WeightsKey = tuple[str | None, int]  # (timeline, version) of a learner's weights


@dataclass
class ActRequest:
    """One step of a worker's rows: ``obs`` (the actor's groups [N, ...]), the ``draws`` of their samples
    (``ActionSampling.draws``; None: the mode, a deterministic evaluation), a recurrent actor's ``state`` [N, S] and
    ``starting`` [N] (the rows whose state is zeroed first: ``RowMemory``); ``by_row``: each row computed alone
    (evaluation); ``peek``: only the core's output, the state left as it is (a chunk's last observation)."""

    key: WeightsKey
    obs: Obs
    draws: torch.Tensor | None = None
    state: torch.Tensor | None = None
    starting: torch.Tensor | None = None
    by_row: bool = False
    peek: bool = False

    @property
    def rows(self) -> int:
        return next(iter(self.obs.values())).shape[0]

    def __reduce__(self):
        """Tensors as NumPy arrays through Ray (``raysim.rollout.arrays``: no copy through a bytes object)."""
        return _rebuild, (ActRequest, to_arrays(vars(self)))


@dataclass
class ActReply:
    """The rows' actions (as sampled, before the action transform), their log-probabilities (None for the mode); a
    recurrent actor's next state and its core's output (``RowMemory.state``, ``output``; None for a feed-forward
    one). A ``peek`` has the output only."""

    action: torch.Tensor | None
    logp: torch.Tensor | None
    state: torch.Tensor | None
    output: torch.Tensor | None = None

    def __reduce__(self):
        return _rebuild, (ActReply, to_arrays(vars(self)))


def _rebuild(cls: type, fields: dict[str, Any]) -> Any:
    return cls(**from_arrays(fields))


class ServerLost(RuntimeError):
    """The policy server a worker asked is gone (its process died): the worker's steps in flight are lost."""


class WeightsMissing(LookupError):
    """A request names weights the server does not hold (never loaded, or evicted)."""


class PolicyServer:
    """The actor of the last ``keep`` weight versions; ``serve`` answers requests, batching those that can be."""

    def __init__(
        self,
        observation_spaces: dict[str, gym.Space],
        action_space: gym.Space,
        model: ModelConfig | dict,
        device: str = "cpu",
        keep: int = 2,
    ):
        torch.set_num_threads(1)
        self.spaces, self.action_space = observation_spaces, action_space
        self.model = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        self.device, self.keep = resolve_device(device, "servers.device"), max(1, int(keep))
        self.versions: OrderedDict[WeightsKey, HeldActor] = OrderedDict()
        self.lock = threading.Lock()  # one batch at a time (a pipelined worker's groups ask from threads)

    def load(self, weights: dict[str, Any]) -> WeightsKey:
        """Hold ``weights`` (``Learner.get_weights``) unless held already, in place of the oldest once ``keep`` are
        held (its actor takes them: building and initializing a large network costs seconds, loading milliseconds).
        Returns their key, which the workers' requests name."""
        key = (weights.get("timeline"), int(weights["version"]))
        if key not in self.versions:
            if len(self.versions) >= self.keep:
                actor = self.versions.popitem(last=False)[1].actor
            elif self.versions:
                actor = copy.deepcopy(next(reversed(self.versions.values())).actor)
            else:
                actor = Actor(self.spaces, self.action_space, self.model).to(self.device).requires_grad_(False)
            actor.load_state_dict(weights["actor"])
            self.versions[key] = HeldActor(actor)
        return key

    def held(self) -> list[WeightsKey]:
        """The keys of the weights held, oldest first (a cheap call: is the server alive?)."""
        return list(self.versions)

    def serve(self, requests: list[ActRequest]) -> list[ActReply | WeightsMissing]:
        """Each request's reply, in order; requests for the same version and mode are computed as one batch."""
        with self.lock:
            return self._serve(requests)

    def _serve(self, requests: list[ActRequest]) -> list[ActReply | WeightsMissing]:
        replies: list[ActReply | WeightsMissing | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            mode = (request.key, request.by_row, request.peek, request.draws is None, request.state is None)
            groups.setdefault(mode, []).append(i)
        for (key, *_), members in groups.items():
            acting = self.versions.get(key)
            if acting is None:
                missing = WeightsMissing(f"weights {key} are not on this server (held: {list(self.versions)})")
                for i in members:
                    replies[i] = missing
                continue
            batch = [requests[i] for i in members]
            for i, reply in zip(members, acting.act(batch, self.device), strict=True):
                replies[i] = reply
        return replies

    def act(self, request: ActRequest) -> ActReply:
        """One request alone (an in-process worker's call); ``WeightsMissing`` raised."""
        reply = self.serve([request])[0]
        if isinstance(reply, WeightsMissing):
            raise reply
        return reply


class HeldActor:
    """One version's actor on a server: the fused MLP path where the collocated shard takes it (bitwise the same
    values), the actor's own forward otherwise (images, evaluation by row)."""

    def __init__(self, actor: Actor):
        self.actor = actor
        fusable = actor.fusable and MLPInference.supports(actor.net) and actor.net[0].weight.device.type == "cpu"
        self.fused = (
            MLPInference(actor.net, actor.obs_norm if actor.core is None else None, fixed=True) if fusable else None
        )

    def act(self, requests: list[ActRequest], device: torch.device) -> list[ActReply]:
        """The replies of requests of one mode (``PolicyServer.serve``), computed as one batch. A recurrent actor
        steps the rows' state as the collocated shard does (``RowMemory(fused=True)``; by row: the written-out
        cell)."""
        first, rows = requests[0], [r.rows for r in requests]
        obs = {g: cat([r.obs[g] for r in requests], device) for g in first.obs}
        actor, memory = self.actor, None
        with inference(actor):
            if first.state is not None:
                memory = RowMemory(actor.core, sum(rows), fused=True)
                memory.state = cat([r.state for r in requests], device).clone()  # stepped in place
                memory.starting = cat([r.starting for r in requests], device).clone()
            if first.peek:
                output = memory.peek(actor.core, actor.features(obs))
                return [ActReply(None, None, None, output[a:b].cpu()) for a, b in spans(rows)]
            out = self.output(obs, memory, first.by_row)
            if first.draws is None:
                action, logp = actor.mode_of(out), None
            else:
                action, logp = actor.act_with(out, cat([r.draws for r in requests], device))
        state, output = (None, None) if memory is None else (memory.state, memory.output)
        return [
            ActReply(*(None if x is None else x[a:b].cpu() for x in (action, logp, state, output)))
            for a, b in spans(rows)
        ]

    def output(self, obs: Obs, memory: RowMemory | None, by_row: bool) -> torch.Tensor:
        """The network's output (logits or the Gaussian's parameters: ``Actor.mean_log_std``) for the rows."""
        actor = self.actor
        if by_row or self.fused is None:
            return actor(obs, by_row, memory=memory)
        if actor.core is None:
            return self.fused(actor.vector_input(obs)).clone()
        return self.fused(memory.advance(actor.core, actor.features(obs))).clone()


def cat(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The parts along rows, on ``device`` (one part as it is: a single worker's batch is not copied)."""
    joined = parts[0] if len(parts) == 1 else torch.cat(parts)
    return joined.to(device)


def spans(rows: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each part of a concatenation of parts of ``rows`` rows."""
    ends = torch.tensor(rows).cumsum(0).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


class BatchingServer:
    """A ``PolicyServer`` as an async Ray actor: ``act`` calls queue, and one loop serves whatever is queued as one
    ``serve`` call (no waiting for more), in a thread so that the next requests queue meanwhile."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.server = PolicyServer(*args, **kwargs)
        self.queue: list[tuple[ActRequest, asyncio.Future]] = []
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.serving: asyncio.Task | None = None

    async def load(self, weights: dict[str, Any]) -> WeightsKey:
        """``PolicyServer.load`` (the coordinator's, once per version), in the serving thread: never beside a batch
        that reads the actor it may take over."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.server.load, weights)

    def held(self) -> list[WeightsKey]:
        return self.server.held()

    async def act(self, request: ActRequest) -> ActReply:
        future = asyncio.get_running_loop().create_future()
        self.queue.append((request, future))
        if self.serving is None or self.serving.done():
            self.serving = asyncio.ensure_future(self._serve())
        reply = await future
        if isinstance(reply, WeightsMissing):
            raise reply
        return reply

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while self.queue:
            batch, self.queue = self.queue, []
            try:
                replies = await loop.run_in_executor(self.pool, self.server.serve, [r for r, _ in batch])
            except Exception as error:  # noqa: BLE001 - every request of the batch receives it
                replies = [error] * len(batch)
            for (_, future), reply in zip(batch, replies, strict=True):
                if isinstance(reply, Exception) and not isinstance(reply, WeightsMissing):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
