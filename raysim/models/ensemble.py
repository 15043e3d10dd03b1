"""``QEnsemble``: N action-value networks as one module, each layer's weights stacked ``[N, in, out]``.

One batched matrix product per layer computes every critic at once (``torch.baddbmm``), where a loop over N
``nn.Linear`` stacks runs N small products per layer: the cost of 10 critics stays well under 5x that of 2
(measured: ``raysim bench sac --rows update-cost``, against that loop, ``raysim.bench.sac.QLoop``). Each critic is
initialised as ``nn.Linear`` initialises a layer, from the caller's RNG, so an ensemble of one is an MLP. With
``layer_norm`` every hidden layer is followed by a layer normalisation (RLPD's critics), with a gain and bias per
critic.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from raysim.models.networks import ACTIVATIONS


class QEnsemble(nn.Module):
    """``critics`` MLPs ``in_dim -> hidden_sizes -> 1`` evaluated together: ``forward(x)`` is ``[critics, B]``."""

    def __init__(self, critics: int, in_dim: int, hidden_sizes: list[int], activation: str, layer_norm: bool):
        super().__init__()
        if critics < 1:
            raise ValueError(f"algo.critics must be >= 1, got {critics}")
        sizes = [in_dim, *hidden_sizes, 1]
        self.critics = critics
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            weight, bias = torch.empty(critics, fan_in, fan_out), torch.empty(critics, 1, fan_out)
            for c in range(critics):  # nn.Linear's initialisation of each critic's layer
                nn.init.kaiming_uniform_(weight[c].T, a=math.sqrt(5))
                nn.init.uniform_(bias[c], -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(bias))
        self.norms = nn.ParameterList()  # per hidden layer: gain and bias of each critic [critics, 2, width]
        if layer_norm:
            for width in hidden_sizes:
                self.norms.append(
                    nn.Parameter(torch.stack([torch.ones(critics, width), torch.zeros(critics, width)], 1))
                )
        self.activation = ACTIVATIONS[activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every critic's value of the inputs ``x`` [B, in] (the same for all) or [critics, B, in]: [critics, B]."""
        h = x.expand(self.critics, *x.shape) if x.dim() == 2 else x
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(bias, h, weight)
            if i < last:
                if self.norms:
                    gain, shift = self.norms[i].unbind(1)
                    h = nn.functional.layer_norm(h, h.shape[-1:]) * gain.unsqueeze(1) + shift.unsqueeze(1)
                h = self.activation(h)
        return h.squeeze(-1)
