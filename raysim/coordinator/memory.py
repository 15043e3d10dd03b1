"""The least memory a run needs, from its spaces and config, and whether a machine or a Ray cluster has it.

A shard holds the chunk it collects: ``algo.num_steps`` steps (and one more observation) of
``env.num_envs`` rows, each step its observations, action, log-probability, reward and three flags;
on Ray each learner rank holds its shards' chunks again (copied out of the object store). That is a
lower bound (the envs, the networks and the update need more), so a run refused here could never
run, and ``env.num_envs=100000000`` is one line before Ray starts, not an allocation of 206 GB failing
minutes later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raysim.algos import algorithm_class
from raysim.algos.replay import transition_bytes
from raysim.config import Config
from raysim.envs.spaces import group_dtype
from raysim.models.inputs import critic_groups

#: Per row and step besides observations and actions: log-probability and reward (float32), terminated,
#: truncated and mask (bool).
STEP_BYTES = 4 + 4 + 1 + 1 + 1


@dataclass(frozen=True)
class MemoryNeed:
    """At least ``together`` bytes for every role of a run, and ``largest`` for its largest role (one node
    holds it); ``chunk``: one shard's chunk of ``steps`` x ``rows``."""

    together: float
    largest: float
    chunk: float
    steps: int
    rows: int
    again: bool  # the learner holds the chunks again (on Ray)
    replay: float = 0.0  # an off-policy learner rank's replay buffer
    capacity: int = 0  # its transitions (``replay.capacity``)

    def problem(self, have: float | None, largest_node: float | None, where: str) -> str | None:
        """Why the run cannot fit in ``have`` bytes (its largest role in ``largest_node``); None when it may."""
        if have is not None and self.together > have:
            said = f"this run needs at least {gb(self.together)} of memory and {where} has {gb(have)}"
        elif largest_node is not None and self.largest > largest_node:
            said = (
                f"a role of this run needs at least {gb(self.largest)} of memory and no node of {where} has "
                f"more than {gb(largest_node)}"
            )
        else:
            return None
        if self.replay > self.chunk:
            return (
                f"{said}: a learner rank's replay buffer of replay.capacity={self.capacity:,} transitions takes "
                f"{gb(self.replay)}; lower replay.capacity"
            )
        held = ", held by the shard and again by the learner" if self.again else ""
        return (
            f"{said}: a shard's chunk of algo.num_steps={self.steps} x env.num_envs={self.rows:,} rows takes "
            f"{gb(self.chunk)}{held}; lower env.num_envs or algo.num_steps"
        )


def memory_need(config: Config, spaces: tuple[dict[str, Any], Any]) -> MemoryNeed:
    """The least memory the roles of ``config`` hold at once, with the env's ``(observation spaces, action space)``."""
    plan = algorithm_class(config.algo.name).collection(config.algo)
    if plan is None:  # no shards (BC): no chunks in flight
        return MemoryNeed(0.0, 0.0, 0.0, 0, config.env.num_envs, config.backend != "local")
    steps = plan.steps_per_row or plan.max_steps  # a round of episodes is bounded by max_steps
    observations, action = spaces
    obs = sum(math.prod(s.shape) * group_dtype(s).itemsize for s in observations.values())  # images: uint8
    act = math.prod(action.shape or (1,)) * 4
    rows = config.env.num_envs
    chunk = float(rows * ((steps + 1) * obs + steps * (act + STEP_BYTES)))
    shards, on_ray = config.shards.count, config.backend != "local"
    ranks = config.learner.ranks
    per_rank = math.ceil(shards / ranks) * chunk
    replay = replay_bytes(config, observations, action)
    together = shards * chunk + (ranks * per_rank if on_ray else 0.0) + ranks * replay
    largest = per_rank + replay if on_ray else together
    return MemoryNeed(together, largest, chunk, steps, rows, on_ray, replay, config.replay.capacity)


def replay_bytes(config: Config, observations: dict[str, Any], action: Any) -> float:
    """The bytes of one learner rank's replay buffer (an off-policy algorithm's; 0 otherwise): ``replay.capacity``
    transitions of the groups its networks read (``transition_bytes``)."""
    if not algorithm_class(config.algo.name).off_policy:
        return 0.0
    model = config.model
    groups = dict.fromkeys([*model.actor_inputs, *critic_groups(observations, model.critic_inputs, model.actor_inputs)])
    shapes = {g: (observations[g].shape, group_dtype(observations[g])) for g in groups if g in observations}
    return float(config.replay.capacity * transition_bytes(shapes, action.shape or (1,)))


def machine_memory() -> float | None:
    """The memory available on this machine (its container's limit counted), in bytes; None if unknown."""
    try:
        from ray._private.utils import estimate_available_memory

        return float(estimate_available_memory())
    except Exception:  # noqa: BLE001 - Ray moved its helper: no check rather than a wrong one
        return None


def cluster_memory(ray) -> tuple[float | None, float | None]:
    """The memory of a Ray cluster (its ``memory`` and ``object_store_memory`` resources) and of its largest node."""
    total = ray.cluster_resources()
    if "memory" not in total:
        return None, None
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    largest = max((r.get("memory", 0.0) + r.get("object_store_memory", 0.0) for r in nodes), default=None)
    return total["memory"] + total.get("object_store_memory", 0.0), largest


def gb(amount: float) -> str:
    """Bytes as GB (or MB), for a message."""
    return f"{amount / 1e9:,.1f} GB" if amount >= 1e8 else f"{amount / 1e6:,.1f} MB"
