"""``RunState``: where a run stands after its last completed iteration; the one thing a checkpoint saves.

It advances only when an iteration completes (``advanced``); every counter anywhere (a
checkpoint's meta.json, the metrics rows, the learner's version, the shards' states) agrees with
it, and a restart or resume rebuilds it from a checkpoint (``from_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    seconds: float = 0.0  # the run's training seconds (every process's, evaluation excluded): the metrics' time
    unlogged: dict[str, float] = field(default_factory=dict)  # evaluation metrics the next metrics row carries
    # shards started after the run's first ones (replacements, elastic additions), every process's: the next one's
    # generation (its seed) is one more, so one started after a resume never replays an earlier one's episodes
    shards_started: int = 0

    def advanced(self, env_steps: int, version: int, seconds: float, shards_started: int = 0) -> RunState:
        """The state after one more completed iteration that collected ``env_steps``, at ``seconds`` of training,
        with ``shards_started`` shards started so far (never fewer than before)."""
        return replace(
            self,
            iteration=self.iteration + 1,
            env_steps=self.env_steps + env_steps,
            version=version,
            seconds=seconds,
            shards_started=max(self.shards_started, shards_started),
        )

    def scored(self, mean_return: float | None, metrics: dict[str, float] | None = None) -> RunState:
        """The state with an evaluation of this iteration's weights; its ``metrics`` wait for the next row."""
        unlogged = {**self.unlogged, **(metrics or {})}
        return replace(self, evaluation=Scored(self.iteration, mean_return), unlogged=unlogged)

    def logged(self) -> RunState:
        """The state once a metrics row carried its evaluation metrics."""
        return replace(self, unlogged={})

    def meta(self) -> dict[str, Any]:
        """The counters a checkpoint's meta.json records."""
        meta: dict[str, Any] = {"iteration": self.iteration, "env_steps": self.env_steps, "version": self.version}
        meta.update({"seconds": self.seconds, "unlogged": self.unlogged, "shards_started": self.shards_started})
        if self.evaluation is not None:
            meta["eval_return"] = self.evaluation.mean_return
            meta["evaluated_iteration"] = self.evaluation.iteration
        return meta

    @classmethod
    def from_checkpoint(cls, meta: dict[str, Any], state: dict[str, Any]) -> RunState:
        """The state a checkpoint saved (one saved before ``seconds``, ``unlogged`` and ``shards_started`` were: 0,
        none and 0)."""
        evaluation = None
        if meta.get("eval_return") is not None:
            evaluation = Scored(int(meta.get("evaluated_iteration", meta["iteration"])), meta["eval_return"])
        counters = (int(meta["iteration"]), int(meta["env_steps"]), int(state["version"]))
        seconds, unlogged = float(meta.get("seconds", 0.0)), dict(meta.get("unlogged", {}))
        return cls(*counters, evaluation, seconds, unlogged, int(meta.get("shards_started", 0)))
