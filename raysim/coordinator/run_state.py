"""``RunState``: where a run stands after its last completed iteration; the one thing a checkpoint saves.

It advances only when an iteration completes (``advanced``); every counter anywhere (a
checkpoint's meta.json, the metrics rows, the learner's version, the shards' states) agrees with
it, and a restart or resume rebuilds it from a checkpoint (``from_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Scored:
    """An evaluation during training: the iteration whose weights it scored and their mean return."""

    iteration: int
    mean_return: float | None


@dataclass(frozen=True)
class RunState:
    iteration: int = 0
    env_steps: int = 0
    version: int = 0  # the learner's policy version
    evaluation: Scored | None = None  # the last evaluation

    def advanced(self, env_steps: int, version: int) -> RunState:
        """The state after one more completed iteration that collected ``env_steps``."""
        return replace(self, iteration=self.iteration + 1, env_steps=self.env_steps + env_steps, version=version)

    def scored(self, mean_return: float | None) -> RunState:
        """The state with an evaluation of this iteration's weights."""
        return replace(self, evaluation=Scored(self.iteration, mean_return))

    def meta(self) -> dict[str, Any]:
        """The counters a checkpoint's meta.json records."""
        meta: dict[str, Any] = {"iteration": self.iteration, "env_steps": self.env_steps, "version": self.version}
        if self.evaluation is not None:
            meta["eval_return"] = self.evaluation.mean_return
            meta["evaluated_iteration"] = self.evaluation.iteration
        return meta

    @classmethod
    def from_checkpoint(cls, meta: dict[str, Any], state: dict[str, Any]) -> RunState:
        evaluation = None
        if meta.get("eval_return") is not None:
            evaluation = Scored(int(meta.get("evaluated_iteration", meta["iteration"])), meta["eval_return"])
        return cls(int(meta["iteration"]), int(meta["env_steps"]), int(state["version"]), evaluation)
