"""``OptimizerConfig``: the settings of an algorithm's config that raysim reads outside the algorithm.

    self.optimizer = torch.optim.Adam(params, lr=algo.lr)                       # the learner
    step = GuardedStep(optimizer, algo.max_grad_norm, algo.max_nonfinite_updates)
    run_epochs(loss, terms, step, batch, algo, generator)                      # update_epochs x num_minibatches

Every algorithm's config dataclass (its ``algo`` section) declares these settings, with its own defaults
and help; ``algorithm_class`` refuses an algorithm whose config lacks one.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable


@runtime_checkable
class OptimizerConfig(Protocol):
    """What the learner, ``run_epochs`` and the coordinator read of every ``algo`` config."""

    lr: float  # Adam's learning rate, set at every update (a sweep's mutation wins over a checkpoint's)
    lr_schedule: str  # constant | linear: to 0 at the horizon (train.total_steps), on the env steps consumed
    max_grad_norm: float  # the global gradient-norm clip of every optimizer step
    max_nonfinite_updates: int  # consecutive skipped (non-finite) minibatches before training stops
    update_epochs: int  # run_epochs: passes over each update's batch
    num_minibatches: int  # run_epochs: minibatches per pass (the same on every learner rank)
    max_policy_lag: int  # the coordinator: policy versions a chunk may lag its update (0: lockstep; more: the
    # algorithm decouples a lagging chunk, raysim.algos.decoupled)


def missing_settings(config_class: type) -> list[str]:
    """The ``OptimizerConfig`` settings that the dataclass ``config_class`` does not declare."""
    declared = {field.name for field in dataclasses.fields(config_class)}
    return [name for name in OptimizerConfig.__annotations__ if name not in declared]
