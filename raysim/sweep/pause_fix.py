"""A Ray Tune bug that ends a PBT trial early, and raysim's fix for it (``keep_paused_trials_alive``).

Synchronous PBT pauses the trial it exploits without a checkpoint (``pause_trial(trial, should_checkpoint=False)``).
When that trial is still saving (its own pause was just asked for, with a checkpoint), Tune's stop of its actor
caches a STOP decision for "after the save", and drops the save: the STOP waits for the trial's next save, which
comes after it was restored from the donor's checkpoint, and terminates it there, before its end, without an
error (ray-project/ray#57906; the fix proposed upstream, #61448, is not in a release). A trial stopped to be
paused has no save left to wait for, so the fix drops that decision.
"""

from __future__ import annotations

from typing import Any

PATCHED = "_raysim_keeps_paused_trials_alive"  # marks the patched method (applied once per process)


def keep_paused_trials_alive() -> None:
    """Patch Tune's controller (in this process: the sweep's driver) so that pausing a saving trial without a
    checkpoint leaves no STOP behind; a Ray whose controller lacks what the patch touches is left as it is."""
    try:
        from ray.tune.execution.tune_controller import TuneController
    except ImportError:
        return
    original = getattr(TuneController, "_schedule_trial_pause", None)
    if original is None or getattr(original, PATCHED, False):
        return

    def _schedule_trial_pause(self: Any, trial: Any, should_checkpoint: bool = True) -> None:
        original(self, trial, should_checkpoint=should_checkpoint)
        decisions = getattr(self, "_cached_trial_decisions", None)
        if not should_checkpoint and isinstance(decisions, dict):
            decisions.pop(trial.trial_id, None)  # the STOP cached for a save that the stop itself dropped

    setattr(_schedule_trial_pause, PATCHED, True)
    TuneController._schedule_trial_pause = _schedule_trial_pause
