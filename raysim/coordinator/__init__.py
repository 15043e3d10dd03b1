"""The coordinator role: the training loop (``Trainer``), its roles and collection, evaluating a saved run."""

from raysim.coordinator.evaluate import evaluate, evaluate_policy
from raysim.coordinator.recovery import ResumePoint
from raysim.coordinator.run_state import RunState
from raysim.coordinator.summary import Summary
from raysim.coordinator.trainer import Trainer

__all__ = ["ResumePoint", "RunState", "Summary", "Trainer", "evaluate", "evaluate_policy"]
