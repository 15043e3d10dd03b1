"""The algorithms, found by name: ``algorithm_class("ppo")``, or ``module.path:Class`` for your own.

A new algorithm is one file with a subclass of ``raysim.algos.base.Algorithm`` and its config
dataclass; ``register`` makes it available by a short name (or name it ``module:Class`` in a
config, which also works in Ray workers that never imported it).
"""

from __future__ import annotations

import difflib
import importlib

from raysim.algos.base import Algorithm
from raysim.algos.bc import BC, BCConfig
from raysim.algos.distill import Distill, DistillConfig
from raysim.algos.grpo import GRPO, GRPOConfig
from raysim.algos.optimizer import OptimizerConfig, missing_settings
from raysim.algos.ppo import PPO, PPOConfig
from raysim.algos.sac import SAC, SACConfig

_REGISTRY: dict[str, type[Algorithm]] = {"ppo": PPO, "grpo": GRPO, "bc": BC, "distill": Distill, "sac": SAC}


def register(algorithm: type[Algorithm]) -> None:
    """Make ``algorithm`` available as ``algo.name: <algorithm.name>``."""
    _REGISTRY[algorithm.name] = algorithm


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name``, or ``module.path:Class`` imported; a ``ValueError`` otherwise."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            found = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"algo.name {name!r}: cannot import {attribute} from {module}: {error}") from error
        if not (isinstance(found, type) and issubclass(found, Algorithm)):
            raise ValueError(f"algo.name {name!r} is not a subclass of raysim.algos.base.Algorithm")
        missing = missing_settings(found.Config)
        if missing:
            raise ValueError(
                f"algo.name {name!r}: its Config lacks {', '.join(missing)} (raysim.algos.optimizer.OptimizerConfig)"
            )
        return found
    close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"algo.name must be one of {sorted(_REGISTRY)} or 'module:Class', got {name!r}{hint}")


__all__ = [
    "BC",
    "BCConfig",
    "Distill",
    "DistillConfig",
    "GRPO",
    "PPO",
    "Algorithm",
    "GRPOConfig",
    "OptimizerConfig",
    "PPOConfig",
    "SAC",
    "SACConfig",
    "algorithm_class",
    "register",
]
