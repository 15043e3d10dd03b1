"""``Summary``: what ``Trainer.train`` returns; ``FINISHED``: the stop reasons of a run that reached its end."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from raysim.checkpoint import Checkpoint
from raysim.coordinator.training_eval import eval_metrics
from raysim.evaluation import EvalReport

FINISHED = ("budget", "solved")  # the stop reasons of a run that reached its end


@dataclass
class Summary:
    """What ``Trainer.train`` returns."""

    env_steps: int
    iterations: int
    wall_time: float  # seconds of training, Ray start-up, actor creation and evaluation excluded
    startup_time: float  # seconds to start Ray (if needed) and create the actors
    run_dir: str
    metrics: dict[str, float] = field(default_factory=dict)  # the last log step's record
    evaluation: EvalReport | None = None
    interrupted: bool = False  # stopped before the end (a signal, train.stop_after, the reporter): resume continues
    steps_this_run: int = 0  # env steps collected by this process (a resumed run counts from its checkpoint)
    stopped_by: str = "budget"  # budget | solved | stop_after | reporter | SIGINT | SIGTERM
    checkpoint: Checkpoint | None = None  # the run's last checkpoint

    @property
    def final_metrics(self) -> dict[str, float]:
        """The last log step's record with the final evaluation's metrics."""
        return {**self.metrics, **(eval_metrics(self.evaluation) if self.evaluation else {})}

    @property
    def exit_code(self) -> int:
        """130 after SIGINT, 143 after SIGTERM, else 0 (also for ``train.stop_after``)."""
        return 128 + signal.Signals[self.stopped_by] if self.stopped_by.startswith("SIG") else 0
