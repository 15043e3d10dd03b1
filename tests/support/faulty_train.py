"""``raysim`` with a fault injected at one phase of one iteration (the crash-safety tests' driver).

    python -m tests.support.faulty_train update:3:kill train --run-dir RUN ...   # then raysim's own arguments

A fault is ``<phase>:<iteration>[:kill|term|int|learner]`` (phases: ``raysim.coordinator.faults``): it
fires once, the first time the trainer reaches that phase of that iteration, and SIGKILLs the process
(``kill``, the default), sends it SIGTERM (``term``) or SIGINT (``int``), or kills every learner rank
(``learner``). In a test's own process: ``with faults.registered(FaultAt("final_eval:6:learner")): ...``.
"""

from __future__ import annotations

import os
import signal
import sys

from raysim.cli import main as raysim_main
from raysim.coordinator import faults
from raysim.coordinator.session import Session

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}


class FaultAt:
    """A phase hook that injects the fault ``spec`` once (see the module docstring)."""

    def __init__(self, spec: str):
        phase, iteration, *action = spec.split(":")
        self.phase, self.iteration, self.action = phase, int(iteration), action[0] if action else "kill"
        if self.action not in (*SIGNALS, "learner"):
            raise ValueError(f"fault action must be one of kill, term, int, learner; got {self.action!r}")
        self.fired = False

    def __call__(self, phase: str, iteration: int, session: Session) -> None:
        if self.fired or (phase, iteration) != (self.phase, self.iteration):
            return
        self.fired = True
        if self.action == "learner":
            for handle in session.roles.learner.handles:
                session.backend.kill(handle)
            return
        os.kill(os.getpid(), SIGNALS[self.action])


def main(argv: list[str]) -> int:
    """Register the fault ``argv[0]``, then run ``raysim`` with the rest; its exit code."""
    faults.register(FaultAt(argv[0]))
    return raysim_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
