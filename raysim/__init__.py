"""raysim: Ray-based rollout collection and PPO / GRPO training for batched environments.

``import raysim`` registers the native tasks with Gymnasium (``raysim/CartPole-v0``, ...); the public names
below are imported on first use, so a shard's or a learner's Ray worker, which imports only its role's
modules (``raysim.rollout``, ``raysim.learner``), never loads the coordinator, storage or sweeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import raysim.envs  # noqa: F401 - registers the native tasks with Gymnasium

if TYPE_CHECKING:
    from raysim.config import Config, load_config
    from raysim.coordinator import Summary, Trainer, evaluate
    from raysim.evaluation import EvalReport
    from raysim.sweep import tune

__version__ = "0.1.0"
__all__ = ["Config", "EvalReport", "Summary", "Trainer", "evaluate", "load_config", "tune"]


def __getattr__(name: str) -> Any:
    """A public name, imported when first used (``raysim.Trainer``, ``from raysim import load_config``)."""
    if name in ("Config", "load_config"):
        import raysim.config as module
    elif name in ("Summary", "Trainer", "evaluate"):
        import raysim.coordinator as module
    elif name == "EvalReport":
        import raysim.evaluation as module
    elif name == "tune":
        import raysim.sweep as module
    else:
        raise AttributeError(f"module 'raysim' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
