"""``Schedule``: a run's iterations planned from its config: when its budget is reached, when it logs.

With fixed batches every iteration collects rows x steps per row, so the budget ``train.total_steps`` is
a number of iterations (``planned``); otherwise (grouped episodes, elastic shards, batches of the first
chunks to arrive) the batch varies and the run stops on the env steps it collected. An algorithm without
shards (BC) plans its own iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raysim.algos import algorithm_class
from raysim.config import Config
from raysim.coordinator.run_state import RunState


@dataclass(frozen=True)
class Schedule:
    fixed_batches: bool  # every iteration collects the same rows x steps per row
    planned: int  # the iterations the budget takes (the most, for varying batches)
    horizon: int  # the learner's schedule, in env steps: what the planned iterations collect, else the budget
    total_steps: int  # ``train.total_steps``
    log_every: int  # ``train.log_every``

    @classmethod
    def of(cls, config: Config) -> Schedule:
        planned, total = planned_iterations(config), config.train.total_steps
        plan = algorithm_class(config.algo.name).collection(config.algo)
        if plan is None:  # no shards (BC): the algorithm's own iterations, no env steps
            return cls(True, planned, planned, total, config.train.log_every)
        rows = config.shards.count * config.env.num_envs
        fixed = plan.steps_per_row is not None and not config.shards.max and config.shards.wait_fraction >= 1
        horizon = planned * rows * plan.steps_per_row if fixed else total
        return cls(fixed, planned, horizon, total, config.train.log_every)

    def budget_reached(self, state: RunState) -> bool:
        """``train.total_steps``: the planned iterations of fixed batches, else the env steps collected."""
        return state.iteration >= self.planned if self.fixed_batches else state.env_steps >= self.total_steps

    def log_due(self, iteration: int) -> bool:
        """A log step every ``train.log_every`` iterations, and at the run's last iteration where it is known
        ahead. A process stopped earlier (``train.stop_after``, a signal) writes no row of its own: its
        metric windows are saved, and the resumed run's rows are the uninterrupted run's."""
        return iteration % self.log_every == 0 or (self.fixed_batches and iteration == self.planned)


def planned_iterations(config: Config) -> int:
    """The iterations ``train.total_steps`` takes at rows x steps per row each (the most, for varying batches), or
    the algorithm's own count (no shards: BC)."""
    algorithm = algorithm_class(config.algo.name)
    planned = algorithm.planned_iterations(config.algo)
    if planned is not None:
        return planned
    per_row = algorithm.collection(config.algo).steps_per_row
    rows = config.shards.count * config.env.num_envs
    return max(1, math.ceil(config.train.total_steps / (rows * (per_row or 1))))
