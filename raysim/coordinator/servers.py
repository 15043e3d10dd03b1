"""The policy servers of a run (``shards.placement: servers``): started, given each version of the weights, replaced.

Shard ``i`` (training or evaluation; ``i`` the index it was created with, which it keeps after an elastic removal
moved it down and which its replacement takes: ``Roles.ids``) asks server ``i mod servers.count`` (``of``,
``caller``): the collector loads the weights and ``recover`` tells the shards by that index too. Before the shards
act with a version of the weights, every server loads it (``load``: one copy per server, where the collocated
placement sends one to every shard); the shards then receive only the version's key, the small ``(timeline,
version)`` pair that ``load`` returns. On Ray a server is ``BatchingServer`` (an async actor that batches the
requests queued), in process a ``PolicyServer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from raysim.actors import Backend, Handle
from raysim.config import Config
from raysim.rollout import EnvShard
from raysim.rollout.server import BatchingServer, PolicyServer, ServerLost


def server_request(config: Config) -> dict[str, float]:
    """The Ray resources one server asks for."""
    servers = config.servers
    return {"CPU": servers.num_cpus, "GPU": servers.num_gpus, **servers.resources}


class Servers:
    """The run's policy servers, in order; ``replace`` starts a new one in a dead one's place."""

    def __init__(self, backend: Backend, config: Config, spaces: tuple):
        self.backend, self.config, self.spaces = backend, config, spaces
        self.handles = [self.create() for _ in range(config.servers.count)]
        self.restarts = 0  # servers replaced over this process's run (``servers.max_restarts``)

    def create(self) -> Handle:
        """A new server (not yet one of ``handles``)."""
        cfg = self.config
        observation_spaces, action_space = self.spaces
        served = PolicyServer if self.backend.name == "local" else BatchingServer
        return self.backend.create(
            served,
            observation_spaces,
            action_space,
            cfg.model,
            device=cfg.servers.device,
            keep=cfg.algo.max_policy_lag + 2,  # every version a queued collection may still act with
            options={
                "num_cpus": cfg.servers.num_cpus,
                "num_gpus": cfg.servers.num_gpus,
                "resources": dict(cfg.servers.resources),
            },
        )

    def of(self, shard: int) -> int:
        """The server of the shard created as index ``shard`` (its identity, not its position)."""
        return shard % len(self.handles)

    def caller(self, shard: int) -> Callable[..., Any]:
        """What shard ``shard`` calls at each step (``PolicyServer.act`` of its server; ``ServerLost`` when it died)."""
        return self.handles[self.of(shard)].caller(PolicyServer.act, ServerLost)

    def wait_started(self) -> None:
        """Return once every server answers: a line every few seconds while one waits for room on the cluster,
        ``TimeoutError`` after ``resources_timeout``; one whose node went before it started is started again."""
        self.backend.wait_started(
            self.handles, PolicyServer.held, "policy servers", self.config.resources_timeout, lambda _: self.create()
        )

    def load(self, weights: Any) -> list[Any]:
        """Every server loads ``weights`` (a future, or the value in process); each one's key (futures)."""
        return [handle.call(PolicyServer.load, weights) for handle in self.handles]

    def recover(self, shard_groups: list[Sequence[tuple[int, Handle]]], why: str) -> bool:
        """Replace every server that died and point the shards it served (of each group, ``(identity, shard)``
        pairs: ``Roles.served``) to its replacement; whether one had died."""
        dead = [j for j, handle in enumerate(self.handles) if not self.backend.alive(handle, PolicyServer.held)]
        for j in dead:
            self.replace(j, why)
        told = [
            shard.call(EnvShard.use_server, self.caller(k))
            for shards in shard_groups
            for k, shard in shards
            if self.of(k) in dead
        ]
        self.backend.get(told)
        return bool(dead)

    def replace(self, index: int, why: str) -> None:
        """Server ``index`` died: a new one in its place (``RuntimeError`` once ``servers.max_restarts`` are used)."""
        self.restarts += 1
        if self.restarts > self.config.servers.max_restarts:
            raise RuntimeError(
                f"policy server {index} died and {self.config.servers.max_restarts} server restarts are used up "
                f"(servers.max_restarts): {why}"
            )
        self.backend.kill(self.handles[index])
        self.handles[index] = self.create()
        print(f"raysim: fault: policy server {index} died ({why}); replaced it", flush=True)
