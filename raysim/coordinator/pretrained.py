"""``model.init_from``: the weights a new run starts from, read once by the driver and checked before any work.

A new run (its own directory, identity, optimizer and counters: not a resume) starts from another run's
actor, and from its critic where it fits; it never writes into the run it reads. The checkpoint is found
as ``raysim eval`` finds one (``locate_checkpoint``: a run directory's newest intact checkpoint, or one
checkpoint directory; local or a URI). The learner loads the weights (``raysim.models.load_pretrained``).
"""

from __future__ import annotations

from typing import Any

import torch

from raysim.checkpoint import CheckpointError, locate_checkpoint
from raysim.composition import ConfigError
from raysim.config import Config
from raysim.models import ActorCritic
from raysim.models.pretrained import fitting_critic, mismatched_actor


def read_pretrained(config: Config, spaces: tuple[Any, Any], identity: str) -> dict[str, torch.Tensor] | None:
    """The model weights ``config.model.init_from`` names (None when unset); a ``ConfigError`` (one line) when
    they cannot be read or their actor does not fit this config's model; a line when the env they were trained
    on differs from this run's (``identity``), or when the critic is not taken."""
    source = config.model.init_from
    if not source:
        return None
    try:
        _, checkpoint, state, meta = locate_checkpoint(source)
    except (CheckpointError, FileNotFoundError, OSError) as error:
        raise ConfigError(f"model.init_from {source}: {str(error).splitlines()[0]}") from error
    saved = state.get("model") or {}
    model = ActorCritic(*spaces, config.model)
    problems = mismatched_actor(model, saved)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError(
            f"model.init_from {source}: its actor does not fit this config's model: {'; '.join(problems[:3])}{more} "
            "(the saved shape vs this model's): use the same model settings and env as that run"
        )
    where = f"raysim: model.init_from: starting from {source} (checkpoint {checkpoint.name})"
    if meta.get("identity") not in (None, identity):
        where += "; it was trained on another env identity than this run's (allowed: fine-tuning on a new task)"
    if model.critic is not None and fitting_critic(model, saved) is None:
        where += "; its critic does not fit (or it has none): the critic starts new"
    print(where, flush=True)
    return saved
