"""``Schedule``: a run's iterations planned from its config: when its budget is reached, when it logs.

A run stops on the env steps it counted (a chunk's valid transitions). With fixed batches every iteration plays
rows x steps per row, so the budget ``train.total_steps`` is rounded up to whole iterations (``planned``), whose
steps are the learner's horizon; where some steps do not count (a native Gymnasium vector env's reset
transitions, Atari's FIRE presses, rows masked for a non-finite value) the run goes on past ``planned`` until
its counted steps reach that horizon. Otherwise (grouped episodes, elastic shards, batches of the first chunks
to arrive) the batch varies and the horizon is the budget itself. An algorithm without shards (BC) plans its
own iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raysim.algos import algorithm_class
from raysim.config import Config
from raysim.coordinator.run_state import RunState


@dataclass(frozen=True)
class Schedule:
    fixed_batches: bool  # every iteration plays the same rows x steps per row
    planned: int  # the iterations the budget takes where every step counts (the most, for varying batches)
    horizon: int  # the env steps the run counts to, the learner's schedule: the planned iterations', else the budget
    total_steps: int  # ``train.total_steps``
    log_every: int  # ``train.log_every``
    shardless: bool = False  # no shards (BC): the budget is the planned iterations

    @classmethod
    def of(cls, config: Config) -> Schedule:
        planned, total = planned_iterations(config), config.train.total_steps
        plan = algorithm_class(config.algo.name).collection(config.algo)
        if plan is None:  # no shards (BC): the algorithm's own iterations, no env steps
            return cls(True, planned, planned, total, config.train.log_every, shardless=True)
        rows = config.shards.count * config.env.num_envs
        fixed = plan.steps_per_row is not None and not config.shards.max and config.shards.wait_fraction >= 1
        horizon = planned * rows * plan.steps_per_row if fixed else total
        return cls(fixed, planned, horizon, total, config.train.log_every)

    def budget_reached(self, state: RunState) -> bool:
        """The env steps counted reach the horizon (``train.total_steps``, rounded up to whole iterations of fixed
        batches); without shards (BC), the planned iterations."""
        return state.iteration >= self.planned if self.shardless else state.env_steps >= self.horizon

    def log_due(self, iteration: int) -> bool:
        """A log step every ``train.log_every`` iterations, and at the run's last iteration where it is known
        ahead. A process stopped earlier (``train.stop_after``, a signal) writes no row of its own: its
        metric windows are saved, and the resumed run's rows are the uninterrupted run's."""
        return iteration % self.log_every == 0 or (self.fixed_batches and iteration == self.planned)


def planned_iterations(config: Config) -> int:
    """The iterations ``train.total_steps`` takes at rows x steps per row each (the most, for varying batches; the
    fewest, where some steps do not count), or the algorithm's own count (no shards: BC)."""
    algorithm = algorithm_class(config.algo.name)
    planned = algorithm.planned_iterations(config.algo)
    if planned is not None:
        return planned
    per_row = algorithm.collection(config.algo).steps_per_row
    rows = config.shards.count * config.env.num_envs
    return max(1, math.ceil(config.train.total_steps / (rows * (per_row or 1))))


def nothing_to_train(config: Config, state: RunState, run_dir: str) -> str:
    """What a resumed run that already reached its budget says: where it is, the budget, how to train longer."""
    if algorithm_class(config.algo.name).collection(config.algo) is None:  # no shards (BC): gradient steps
        at, budget, key = f"iteration {state.iteration}", f"algo.updates={config.algo.updates:,}", "algo.updates"
    else:
        total = config.train.total_steps
        at, budget, key = f"{state.env_steps:,} env steps", f"train.total_steps={total:,}", "train.total_steps"
    return (
        f"nothing to train: the run is at {at} and the config's budget is {budget}; to train longer: "
        f"raysim resume {run_dir} --set {key}=<more>"
    )
