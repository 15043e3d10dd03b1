"""``Collector``: every shard's chunk of an iteration, with dead shards replaced and elastic growth.

collector = Collector(backend, config, roles.shards, plan)
chunks = collector.collect(weights)      # futures the learner resolves; the driver reads receipts only
collector.grow()                         # elastic shards: add what the cluster has room for
"""

from __future__ import annotations

from typing import Any

from raysim.actors import Backend, Handle, InputLost
from raysim.config import Config
from raysim.coordinator.roles import create_shard, shard_request
from raysim.rollout import Collection, EnvShard


class Collector:
    """Drives the training shards (``shards`` is the roles' list, changed in place)."""

    def __init__(self, backend: Backend, config: Config, shards: list[Handle], plan: Collection):
        self.backend, self.config, self.shards, self.plan = backend, config, shards, plan
        self.faults = 0  # shards replaced after their process died
        self.next_index = config.shards.count  # elastic: the index (and seed) of the next new shard
        self.states: list[Any] = []  # each shard's state after its last chunk (futures), for a checkpoint

    def collect(self, weights: Any) -> list[Any]:
        """Every shard's chunk of this iteration, as futures the learner resolves.

        The driver reads only each shard's small receipt. A shard whose process died (killed,
        node lost) is replaced and its part collected again, so the iteration's batch has its
        configured size and nothing is counted twice.
        """
        futures = [self._launch(shard, weights) for shard in self.shards]
        chunks: list[Any] = [None] * len(futures)
        while True:
            for i, (chunk, receipt, _) in enumerate(futures):
                if chunks[i] is not None:
                    continue
                try:
                    self.backend.get(receipt)
                    chunks[i] = chunk
                except Exception as error:
                    self.backend.discard(list(futures[i]))
                    if not self.backend.is_actor_failure(error):
                        raise
                    try:
                        replaced = self._replace(i, error)
                    except InputLost:  # every shard's chunk of this iteration is lost with the weights
                        self.backend.discard([f for triple in futures for f in triple])
                        raise
                    if not replaced:
                        del futures[i], chunks[i]
                        break  # the indices moved: look at the receipts again
                    futures[i] = self._launch(self.shards[i], weights)
            if all(chunk is not None for chunk in chunks):
                self.states = [state for _, _, state in futures]
                return chunks

    def grow(self) -> None:
        """Elastic shards: at an iteration boundary, add shards for the room the cluster has now.

        The iteration's batch is then (current shards) x ``env.num_envs`` x ``algo.num_steps``: it
        grows and shrinks with the cluster, and the run stops once ``train.total_steps`` env steps
        were collected.
        """
        config = self.config
        add = min(self.backend.room_for(shard_request(config)), config.shards.max - len(self.shards))
        for _ in range(add):
            self.shards.append(create_shard(self.backend, config, self.next_index))
            self.next_index += 1
        if add > 0:
            print(f"raysim: elastic: added {add} shard(s) for new capacity; {len(self.shards)} shards now", flush=True)

    def _launch(self, shard: Handle, weights: Any) -> tuple[Any, Any, Any]:
        return shard.call_split(EnvShard.collect, weights, self.plan, returns=3)

    def _replace(self, i: int, error: Exception) -> bool:
        """Shard ``i`` died: replace it (True), or drop it when elastic and there is no room (False)."""
        config = self.config
        if self.backend.alive(self.shards[i], EnvShard.spaces):  # the shard is fine: its input, the weights, is lost
            raise InputLost(f"shard {i} could not read the learner's weights: {error}") from error
        if (
            config.shards.max
            and len(self.shards) > config.shards.count
            and self.backend.room_for(shard_request(config)) < 1
        ):
            print(
                f"raysim: elastic: shard {i} was lost with its node and there is no room for a "
                f"replacement; continuing with {len(self.shards) - 1} shards",
                flush=True,
            )
            del self.shards[i]
            return False
        self.faults += 1
        if self.faults > config.shards.max_restarts:
            raise RuntimeError(
                f"shard {i} died and {config.shards.max_restarts} shard restarts are used up "
                f"(shards.max_restarts): {error}"
            ) from error
        print(
            f"raysim: fault: shard {i} died during its rollout ({type(error).__name__}); "
            f"replaced it, collecting its part of the iteration again",
            flush=True,
        )
        self.shards[i] = create_shard(self.backend, config, i, generation=self.faults)
        return True
