"""The batched env contract: N rows that auto-reset in the same step.

A coordinator's shard drives every env the same way::

    obs = env.reset(seed=seed)
    for t in range(T):
        step = env.step(actions)          # actions: [N, ...]
        # step.obs      -> act on it next (finished rows: first obs of the new episode)
        # step.final_obs[g][i] is row step.done_rows[i] *before* its reset (owned copy)
        # step.episodes[k][i] is the env-owned report of that row's finished episode

Rules (the same as docs/concepts.md, "The step contract"):

- ``terminated`` means the episode reached a terminal state of the task: no bootstrap.
  ``truncated`` means it was cut short (step limit): bootstrap from ``final_obs``. Both may be
  true in the same step; then the row counts as terminated.
- ``final_obs`` holds only the finished rows (``done_rows``), as tensors that no later step, reset
  or in-place write of the env can change, sharing no storage with the env.
- ``obs`` may be a view of the env's state: read it (or copy it) before the next ``step``.
- ``episodes`` is a dict of columns aligned with ``done_rows``; at least ``return`` (float32)
  and ``length`` (int64), plus ``success`` (bool) where the task defines it, plus any task scalar.
  ``success`` is counted as ``success_count`` says: the flag at the episode's last step (``final``), or
  set at any step of it (``any``). An env with several tasks (``task_names``) reports ``task`` (int64), the index
  of the episode's task; evaluation records carry its name.
- A done is not always an episode: a row whose trajectory ends while its episode goes on (a life lost
  in an Atari game under episodic life: ``terminated`` for the bootstrap rule, the game continues)
  is in ``done_rows`` and ``final_obs`` but not in ``episode_rows``, the rows whose episode ended;
  then ``episodes`` is aligned with ``episode_rows`` instead. ``episode_rows`` None: every done row.
- A row's trajectory starts where its ``obs`` is the first of its next one: a recurrent state and a frame
  stack restart there (``Step.started_rows``). That is the done rows (same-step reset), except where an
  env shows the final observation once more and resets in its next step (a Gymnasium vector env
  vectorized ``native``: the row starts in that next step, the reset transition), and where a done the
  policy was trained with is not a done in evaluation (an Atari life under ``episodic_life``: the row
  restarts there too, as in training).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import gymnasium as gym
import torch

from raysim.envs.errors import CannotRender

Obs = dict[str, torch.Tensor]
#: The ways an episode's success is counted (``BatchedEnv.count_success``).
SUCCESS_COUNTS = ("any", "final")


@dataclass
class Step:
    """What ``BatchedEnv.step`` returns for all N rows."""

    obs: Obs
    reward: torch.Tensor  # [N] float32
    terminated: torch.Tensor  # [N] bool
    truncated: torch.Tensor  # [N] bool
    done_rows: torch.Tensor  # [K] int64, rows with terminated | truncated, ascending
    final_obs: Obs  # each [K, ...], owned copies of the pre-reset observation
    episodes: dict[str, torch.Tensor]  # each [K], the env-owned episode reports

    #: False for rows whose transition must not be trained on (a dropped reset transition);
    #: None when every row's transition is valid.
    valid: torch.Tensor | None = None
    #: [E] int64, the done rows whose episode ended (``episodes`` is aligned with them), ascending;
    #: None when every done row's episode ended (the usual case).
    episode_rows: torch.Tensor | None = None
    #: [S] int64, the rows whose ``obs`` starts a trajectory (see the module), ascending; None: the done rows.
    start_rows: torch.Tensor | None = None

    def ended_rows(self) -> torch.Tensor:
        """The rows whose episode ended in this step (``episodes`` is aligned with them)."""
        return self.done_rows if self.episode_rows is None else self.episode_rows

    def started_rows(self) -> torch.Tensor:
        """The rows whose ``obs`` is the first of a trajectory: their recurrent state and frame stack restart."""
        return self.done_rows if self.start_rows is None else self.start_rows

    # When no row finished (K == 0), ``final_obs`` and ``episodes`` are empty dicts.


class BatchedEnv:
    """Base of every batched env: N rows, same-step auto-reset, compact owned ``final_obs``.

    Subclasses set ``env_id``, ``num_envs``, ``observation_spaces`` (one space per observation
    group, per row), ``action_space`` (per row) and ``max_episode_steps``, and implement
    ``reset``, ``reset_rows`` and ``step``. Native torch tasks derive from ``TorchEnv``, which
    implements the contract once. An env with a scripted expert (``raysim/MetaWorld``) also has
    ``expert_actions()``: the expert's action ``[N, ...]`` for every row in the state it is in
    (``raysim.rollout.policies``, ``raysim eval --policy expert``).
    """

    env_id: str
    num_envs: int
    observation_spaces: dict[str, gym.Space]
    action_space: gym.Space
    max_episode_steps: int | None
    #: True when ``reset_rows`` with equal seeds gives equal initial observations.
    seeded_reset: bool = True
    #: False when ``reset_rows`` cannot start single rows (a Gymnasium vector env vectorized ``native``):
    #: evaluation episodes are then keyed by row, not by global index (``raysim.rollout.endings.EvalEnding``).
    resets_rows: bool = True
    #: Whether the episode reports carry ``success``: a property of the task, known before any episode
    #: ends (an evaluation with no completed episode still reports k/n); None: only the reports can tell.
    defines_success: bool | None = None
    #: How the reports count ``success``: ``final`` (the flag at the episode's last step) or ``any`` (set at any
    #: step of it, as Meta-World counts it); ``count_success`` sets it (``env.success``, reporting only).
    success_count: str = "final"
    #: The tasks the rows play, by index, where the env has several (``raysim/MetaWorld``): its episode reports
    #: then carry ``task``, the index of the episode's task in this list; empty: one task, no ``task`` column.
    task_names: tuple[str, ...] = ()
    #: How many distinct episodes (initial states) the reset seeds choose among per task, where they are few
    #: (``raysim/MetaWorld``'s ``goals: benchmark``: 50): different seeds then replay the same episodes, so
    #: demonstrations and evaluation share episodes (``raysim demos record`` says so); None: as many as seeds.
    distinct_episodes: int | None = None

    def count_success(self, how: str | None) -> None:
        """Count ``success`` in the episode reports as ``how`` says (``any`` or ``final``; None: the env's own).

        The base counts both the same: an env whose success ends its episode (the native tasks) or that defines
        none has nothing to tell apart; an env whose flag can come and go within an episode overrides this."""
        if how is not None and how not in SUCCESS_COUNTS:
            raise ValueError(f"{self.env_id}: success must be one of {list(SUCCESS_COUNTS)}, got {how!r}")
        if how is not None:
            self.success_count = how

    def reset(self, seed: int | None = None) -> Obs:
        """Start a new episode in every row; ``seed`` makes the whole batch reproducible."""
        raise NotImplementedError

    def reset_rows(self, rows: torch.Tensor, seeds: Sequence[int]) -> Obs:
        """Start a new episode in ``rows``, each from its own seed; returns the obs of all rows.

        Equal seeds give equal initial states (GRPO groups, evaluation episodes rely on it).
        The rows' running episode bookkeeping is discarded (no report is produced).
        """
        raise NotImplementedError

    def step(self, actions: torch.Tensor) -> Step:
        """Advance every row by one step, auto-resetting the rows that finished."""
        raise NotImplementedError

    def frames(self, size: int) -> torch.Tensor:
        """A picture of every row for people (videos): ``[N, H, W, 3]`` uint8 RGB of the state each row acts
        on next. ``size``: pixels per side for an env that draws its own pictures (native tasks); an env with a
        renderer of its own (Gymnasium's ``rgb_array``) gives its size. ``CannotRender`` when it draws none."""
        raise CannotRender(f"{self.env_id} draws no pictures of its rows (it has no frames method)")

    def get_state(self) -> dict | None:
        """The env's state as tensors and plain data, or None when it cannot be saved.

        A checkpoint stores it; on resume, ``set_state`` continues every row's episode exactly.
        Envs that return None (Gymnasium envs through the adapter) restart their episodes.
        """
        return None

    def set_state(self, state: dict) -> None:
        """Restore a ``get_state`` result."""
        raise NotImplementedError(f"{self.env_id} cannot restore a saved state")

    def close(self) -> None:
        """Release what the env holds (processes, files); a no-op for native envs."""


def check_num_envs(num_envs: int) -> int:
    """Refuse a row count that is not a positive integer."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
        raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
    return int(num_envs)  # NumPy integers (e.g. from a split of rows over shards) count too


def check_actions(env: BatchedEnv, actions: torch.Tensor) -> None:
    """Refuse actions whose shape does not match ``[num_envs, *action_space.shape]``."""
    expected = (env.num_envs, *env.action_space.shape)
    if tuple(actions.shape) != expected:
        raise ValueError(
            f"{env.env_id}: actions must have shape {expected} (num_envs x action shape), got {tuple(actions.shape)}"
        )


def take_rows(obs: Mapping[str, torch.Tensor], rows: torch.Tensor) -> Obs:
    """Owned copies of ``rows`` of every observation group (advanced indexing copies)."""
    return {name: value.index_select(0, rows) for name, value in obs.items()}
