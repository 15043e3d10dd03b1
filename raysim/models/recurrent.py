"""The recurrent core (``model.recurrent``): an LSTM or GRU cell between the actor's features and its MLP.

One core serves actor and critic (CleanRL's ``ppo_atari_lstm.py``): the actor owns it and the critic's MLP
reads its output beside the critic's own features. The shards hold only the actor, so the one state a
chunk needs is one they compute (docs/algorithms.md, "Recurrent policies").

A row's state is one tensor ``[state_size]`` (LSTM: ``h`` then ``c``; GRU: ``h``), zeroed where the row
starts an episode, before the episode's first observation is read. The cell is written with two
``nn.Linear`` layers (input and recurrent weights, PyTorch's gate order: LSTM ``i f g o``, GRU ``r z n``)
so that evaluation computes each row alone (``by_row``, ``raysim.models.rowwise``) and a row's
episode does not depend on the rows beside it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raysim.models.rowwise import elementwise_by_row, linear_by_row

RECURRENT = ("none", "lstm", "gru")


class RecurrentCore(nn.Module):
    """``(features [B, F], state [B, S]) -> (output [B, size], next state [B, S])``, an LSTM or GRU step."""

    def __init__(self, kind: str, in_dim: int, size: int):
        super().__init__()
        if kind not in RECURRENT[1:]:
            raise ValueError(f"model.recurrent must be one of {list(RECURRENT)}, got {kind!r}")
        self.kind, self.size = kind, int(size)
        gates = 4 if kind == "lstm" else 3
        self.input = nn.Linear(in_dim, gates * self.size)
        self.recurrent = nn.Linear(self.size, gates * self.size)
        for layer in (self.input, self.recurrent):  # CleanRL's LSTM init: orthogonal, zero biases
            nn.init.orthogonal_(layer.weight, 1.0)
            nn.init.zeros_(layer.bias)
        self.state_size = 2 * self.size if kind == "lstm" else self.size

    def forward(
        self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None, by_row: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from ``state``, zeroed first where ``starts`` [B] (an episode starts at ``x``); ``by_row``: each row
        computed alone."""
        state = state if starts is None else restarted(state, starts)
        return self.cell(linear_by_row(self.input, x) if by_row else self.input(x), state, by_row)

    def replay(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps over a sequence: ``x`` [T, B, F] from ``state`` [B, S], the state zeroed where ``starts`` [T, B];
        returns every step's output [T, B, size] and the state after it [T, B, S]."""
        projected = self.input(x)  # the input weights on every step at once
        outputs, states = [], []
        for t in range(x.shape[0]):
            out, state = self.cell(projected[t], restarted(state, starts[t]))
            outputs.append(out)
            states.append(state)
        return torch.stack(outputs), torch.stack(states)

    def cell(
        self, projected: torch.Tensor, state: torch.Tensor, by_row: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step after the input weights (``projected`` [B, gates x size]): gates, then the next state."""

        def each(function: Any, value: torch.Tensor) -> torch.Tensor:
            return elementwise_by_row(function, value) if by_row else function(value)

        size = self.size
        h = state[:, :size]
        recurrent = linear_by_row(self.recurrent, h) if by_row else self.recurrent(h)
        if self.kind == "lstm":
            gates = projected + recurrent
            sigmoid = each(torch.sigmoid, gates)
            cell_input = each(torch.tanh, gates[:, 2 * size : 3 * size])
            c = sigmoid[:, size : 2 * size] * state[:, size:] + sigmoid[:, :size] * cell_input
            h = sigmoid[:, 3 * size :] * each(torch.tanh, c)
            return h, torch.cat([h, c], 1)
        reset_update = each(torch.sigmoid, projected[:, : 2 * size] + recurrent[:, : 2 * size])
        candidate = each(torch.tanh, projected[:, 2 * size :] + reset_update[:, :size] * recurrent[:, 2 * size :])
        h = candidate + reset_update[:, size:] * (h - candidate)
        return h, h


def restarted(state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """``state`` [B, S] with the rows where ``starts`` [B] (an episode starts) zeroed: the one reset rule."""
    return state.masked_fill(starts.unsqueeze(1), 0.0)


class RowMemory:
    """The recurrent state of a batch of rows (a shard's, an evaluation's): ``state`` [N, S], and ``starting`` [N]:
    the rows whose next observation starts an episode (their state is zeroed before it is read)."""

    def __init__(self, core: RecurrentCore, rows: int):
        self.state = torch.zeros(rows, core.state_size)
        self.starting = torch.ones(rows, dtype=torch.bool)

    def advance(self, core: RecurrentCore, x: torch.Tensor, by_row: bool = False) -> torch.Tensor:
        """The core's output for the rows' features ``x``; the rows' state moves on."""
        out, self.state = core(x, self.state, self.starting, by_row)
        self.starting.fill_(False)
        return out

    def restart(self, rows: torch.Tensor) -> None:
        """``rows`` (indices or a bool mask) start an episode at their next observation."""
        self.starting[rows] = True

    def get_state(self) -> dict[str, torch.Tensor]:
        """Copies of ``state`` and ``starting`` (a shard's checkpoint keeps them: exact resume)."""
        return {"state": self.state.clone(), "starting": self.starting.clone()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from ``get_state`` (copied: the tensors may be read-only views of the object store)."""
        self.state = state["state"].clone()
        self.starting = state["starting"].clone()
