"""The per-step data of evaluation episodes, kept only when asked (``EvalEpisodes.trajectories``): what a dataset of
demonstrations is recorded from (``raysim demos record``).

``EvalEnding`` feeds it from its loop and hands each counted episode over whole::

    trajectories.observe(obs)                  # before acting: every row's observations
    trajectories.act(actions)                  # what the policy chose
    trajectories.record(step)                  # rewards and flags of the step
    record["trajectory"] = trajectories.take(row, step)   # a counted episode, as NumPy arrays
    trajectories.restart(rows)                 # rows that start their next episode at the next observe

The observations are those the env gave, before the shard's frame stack (``FrameStack.newest``), dtypes kept;
the actions are the policy's output (``EvalPolicy.act``), before the actor's mapping into the action space. The
steps are kept batched, one entry per step, and dropped once no playing row's episode reaches back to them, so
they hold at most the longest running episode of every row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from raysim.envs.contract import BatchedEnv, Obs, Step
from raysim.envs.frame_stack import FrameStack


class Trajectories:
    """Every row's running episode, step by step (see the module)."""

    def __init__(self, env: BatchedEnv):
        self.newest: Callable[[Obs], Obs] = env.newest if isinstance(env, FrameStack) else dict
        self.steps: list[dict] = []  # one entry per batched step, from step ``first`` on
        self.first = 0
        self.start = torch.zeros(env.num_envs, dtype=torch.int64)  # the step each row's running episode began

    def observe(self, obs: Obs) -> None:
        self.steps.append({"obs": {g: v.clone() for g, v in self.newest(obs).items()}})

    def act(self, actions: torch.Tensor) -> None:
        self.steps[-1]["action"] = actions.clone()

    def record(self, step: Step) -> None:
        self.steps[-1].update(reward=step.reward.clone(), terminated=step.terminated.clone())
        self.steps[-1]["truncated"] = step.truncated.clone()

    def restart(self, rows: list[int]) -> None:
        """``rows`` start an episode at the next ``observe``."""
        self.start[rows] = self.first + len(self.steps)

    def take(self, row: int, step: Step) -> dict:
        """``row``'s episode, which ended in ``step``: ``obs`` (each group [L+1, ...], its final observation last),
        ``actions`` [L, ...], ``reward`` [L], ``terminated`` [L], ``truncated`` [L]."""
        steps = self.steps[int(self.start[row]) - self.first :]
        done = int((step.done_rows == row).nonzero()[0, 0])
        final = {g: v[0] for g, v in self.newest({g: v[done : done + 1] for g, v in step.final_obs.items()}).items()}
        return {
            "obs": {g: torch.stack([s["obs"][g][row] for s in steps] + [final[g]]).numpy() for g in final},
            **{key: torch.stack([s[key][row] for s in steps]).numpy() for key in ("reward", "terminated", "truncated")},
            "actions": torch.stack([s["action"][row] for s in steps]).numpy(),
        }

    def forget(self, playing: torch.Tensor) -> None:
        """Drop the steps before every ``playing`` row's running episode (all of them when none plays)."""
        keep = int(self.start[playing].min()) if bool(playing.any()) else self.first + len(self.steps)
        del self.steps[: keep - self.first]
        self.first = keep
