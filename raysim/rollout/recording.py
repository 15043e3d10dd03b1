"""A recorded evaluation: ``EvalEpisodes`` played in parts, with a picture of every row before every step.

The coordinator films an evaluation part by part, so that pictures stream from the shard to the video
writer and none of them waits for the evaluation to end (``raysim.recording`` is the driver's side)::

    part = shard.record(weights, plan, steps=16, size=128)      # starts the evaluation
    while part.result is None:
        writer.add(part.pictures)                               # [steps, rows, H, W, 3] uint8
        part = shard.record(weights, None, steps=16, size=128)  # continues it
    records, excluded, scoring = part.result                    # what ``EnvShard.evaluate`` returns

The episodes, records and report are those of ``EnvShard.evaluate`` with the same plan: filming only
looks. Picture ``t`` of a row is the state the row acts on at the evaluation's step ``t`` while the row
plays its quota, and blank (zeros) once it has played it: a played episode of length ``L`` fills ``L``
pictures (its last state is not shown: the row starts its next episode in the same step). ``size``
None plays the steps without pictures (a replacement shard catching up, a video past its frame cap);
``steps`` None plays to the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from raysim.envs.contract import Obs, Step
from raysim.rollout.endings import Ending, EvalEnding, EvalEpisodes, ShardView


@dataclass
class Part:
    """One part of a recorded evaluation, as the shard returns it."""

    steps: int  # steps played in this part
    pictures: np.ndarray | None  # [steps, rows, H, W, 3] uint8; None when no pictures were asked for
    result: tuple | None  # ``EnvShard.evaluate``'s (records, excluded, scoring) once the evaluation ended


class RecordedEval(Ending):
    """``EvalEnding`` in parts of a few steps each (``next_part``), drawing each row before each step."""

    def __init__(self, shard: ShardView, plan: EvalEpisodes):
        self.shard = shard
        self.evaluation = EvalEnding(shard, plan)
        self.t = 0  # steps of the evaluation played, over all parts
        self.obs: Obs | None = None  # where the next part starts
        self.stop: int | None = None
        self.size: int | None = None
        self.pictures: list[torch.Tensor] = []

    @property
    def ended(self) -> bool:
        return not self.evaluation.running(self.t)

    def next_part(self, steps: int | None, size: int | None) -> None:
        """The next act plays up to ``steps`` steps (None: to the end), drawn ``size`` pixels wide (None: not)."""
        self.stop = None if steps is None else self.t + int(steps)
        self.size, self.pictures = size, []

    def take_part(self, played: int) -> Part:
        pictures = torch.stack(self.pictures).numpy() if self.pictures else None
        self.pictures = []
        result = self.evaluation.result() if self.ended else None
        return Part(played, pictures, result)

    def begin(self) -> Obs:
        if self.obs is None:
            self.obs = self.evaluation.begin()
        return self.obs

    def running(self, t: int) -> bool:
        return (self.stop is None or self.t < self.stop) and self.evaluation.running(self.t)

    def observe(self, t: int, obs: Obs) -> None:
        if self.size is None:
            return
        idle = (self.evaluation.played >= self.evaluation.quota).view(-1, 1, 1, 1)  # rows past their quota: blank
        self.pictures.append(self.shard.rows.env.frames(self.size).cpu().masked_fill(idle, 0))

    def act(self, t: int, obs: Obs) -> torch.Tensor:
        return self.evaluation.act(self.t, obs)

    @property
    def env_action(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.evaluation.env_action

    def after_step(self, t: int, step: Step, bad: torch.Tensor | None) -> None:
        self.evaluation.after_step(self.t, step, bad)
        self.obs = step.obs  # the rows the evaluation restarted included
        self.t += 1
