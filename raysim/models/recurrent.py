"""The recurrent core (``model.recurrent``): an LSTM or GRU cell between the actor's features and its MLP.

One core serves actor and critic (CleanRL's ``ppo_atari_lstm.py``): the actor owns it and the critic's MLP
reads its output beside the critic's own features. The shards hold only the actor, so the one state a
chunk needs is one they compute (docs/algorithms.md, "Recurrent policies").

A row's state is one tensor ``[state_size]`` (LSTM: ``h`` then ``c``; GRU: ``h``), zeroed where the row
starts an episode, before the episode's first observation is read. The cell is written with two
``nn.Linear`` layers (input and recurrent weights, PyTorch's gate order: LSTM ``i f g o``, GRU ``r z n``)
so that evaluation computes each row alone (``by_row``, ``raysim.models.rowwise``) and a row's
episode does not depend on the rows beside it; export traces it too. A shard's training collection steps its rows
in place instead (``CellInference``, ``RowMemory(fused=True)``): the same weights, fewer calls a step,
equal to the written-out cell within float32 rounding, not bitwise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raysim.models.rowwise import elementwise_by_row, linear_by_row

RECURRENT = ("none", "lstm", "gru")
MINUS_ONE = torch.tensor(-1.0)  # the addend of ``2 s - 1`` (one tensor: ``torch.add``'s alpha scales the other)


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
        self.state_size = state_size(kind, self.size)

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


def state_size(kind: str, size: int) -> int:
    """The width of a row's state: an LSTM's ``h`` and ``c``, a GRU's ``h``."""
    return 2 * size if kind == "lstm" else size


def restarted(state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """``state`` [B, S] with the rows where ``starts`` [B] (an episode starts) zeroed: the one reset rule."""
    return state.masked_fill(starts.unsqueeze(1), 0.0)


class CellInference:
    """A core's batched step in place on one ``state`` [N, S], for inference: its views and the step's buffers made
    once, a dozen in-place calls a step (the shards' acting; ``MLPInference`` does the same for the MLP).

    ``forward``'s arithmetic on the live weights (loaded in place, they are seen), with tanh computed as
    ``2 sigmoid(2z) - 1`` (``raysim.models.networks.Tanh``: torch's tanh, ``torch.lstm_cell``'s too, is not
    vectorized on some CPU builds and costs several sigmoids): equal to ``forward`` within float32 rounding (a few
    ulps a step), not bitwise.
    """

    def __init__(self, core: RecurrentCore, state: torch.Tensor):
        self.core, self.state = core, state
        size, rows, width = core.size, state.shape[0], (4 if core.kind == "lstm" else 3) * core.size
        self.weights = (core.input.bias, core.input.weight.t(), core.recurrent.bias, core.recurrent.weight.t())
        self.h, self.c = state[:, :size], state[:, size:]  # a GRU's c is empty
        self.projected, self.recurrent = state.new_empty(rows, width), state.new_empty(rows, width)
        self.gates = self.projected.split(size, 1)  # LSTM: i f g o; GRU: r z n
        self.reset_update, self.recurrent_split = self.projected[:, : 2 * size], self.recurrent.split(2 * size, 1)
        self.squashed = state.new_empty(rows, size)

    def __call__(self, x: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """Step ``state`` from ``x`` [N, F], zeroed first where ``starts`` [N]; the output, a view of the state."""
        input_bias, input_weight, recurrent_bias, recurrent_weight = self.weights
        h, projected = self.h, self.projected
        self.state.masked_fill_(starts.unsqueeze(1), 0.0)
        torch.addmm(input_bias, x, input_weight, out=projected)
        torch.addmm(recurrent_bias, h, recurrent_weight, out=self.recurrent)
        if self.core.kind == "lstm":
            i, f, g, o = self.gates
            projected.add_(self.recurrent)
            g.mul_(2)  # exact: its sigmoid is then tanh's
            projected.sigmoid_()
            self.c.mul_(f).addcmul_(i, unsquash(g))
            torch.mul(self.c, 2, out=self.squashed).sigmoid_()
            return torch.mul(o, unsquash(self.squashed), out=h)
        reset, update, candidate = self.gates
        recurrent_reset_update, recurrent_candidate = self.recurrent_split
        self.reset_update.add_(recurrent_reset_update).sigmoid_()
        unsquash(candidate.addcmul_(reset, recurrent_candidate).mul_(2).sigmoid_())
        return h.sub_(candidate).mul_(update).add_(candidate)


def unsquash(sigmoid: torch.Tensor) -> torch.Tensor:
    """``tanh(z)`` from ``sigmoid(2z)``, in place: ``2 s - 1`` (the factor 2 is exact)."""
    return torch.add(MINUS_ONE, sigmoid, alpha=2, out=sigmoid)


class RowMemory:
    """The recurrent state of a batch of rows (a shard's, an evaluation's): ``state`` [N, S], and ``starting`` [N]:
    the rows whose next observation starts an episode (their state is zeroed before it is read).

    ``fused``: batched steps are taken in place (``CellInference``: a shard's training collection); a step
    ``by_row`` (evaluation) is always the written-out cell. ``output`` is the core's output at the observation last
    read (a training chunk keeps it: ``RolloutChunk.memory``; fused, the next step overwrites it).
    """

    def __init__(self, core: RecurrentCore, rows: int, fused: bool = False):
        self.size = core.size  # the core's output width
        self.state = torch.zeros(rows, core.state_size)
        self.starting = torch.ones(rows, dtype=torch.bool)
        self.fused = fused
        self.output: torch.Tensor | None = None
        self._step: CellInference | None = None  # fused: the step in place on ``state`` (made again for a new one)

    @classmethod
    def served(cls, kind: str, size: int, rows: int) -> RowMemory:
        """The rows' state on an env worker of the ``servers`` placement: no core here, its server steps the state
        (``raysim.rollout.server``) and the worker keeps what it returns (``state``, ``output``)."""
        memory = cls.__new__(cls)
        memory.size, memory.fused, memory.output, memory._step = size, False, None, None
        memory.state = torch.zeros(rows, state_size(kind, size))
        memory.starting = torch.ones(rows, dtype=torch.bool)
        return memory

    def advance(self, core: RecurrentCore, x: torch.Tensor, by_row: bool = False) -> torch.Tensor:
        """The core's output for the rows' features ``x``; the rows' state moves on."""
        if self.fused and not by_row:
            if self._step is None or self._step.state is not self.state or self._step.core is not core:
                self._step = CellInference(core, self.state)
            self.output = self._step(x, self.starting)
        else:
            self.output, self.state = core(x, self.state, self.starting, by_row)
        self.starting.fill_(False)
        return self.output

    def peek(self, core: RecurrentCore, x: torch.Tensor) -> torch.Tensor:
        """The output ``advance`` would give for ``x``, the rows' state left as it is (a chunk's last observation)."""
        if self.fused:
            return CellInference(core, self.state.clone())(x, self.starting)
        return core(x, self.state, self.starting)[0]

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
