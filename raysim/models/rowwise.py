"""``rowwise``: an ``mlp()`` network's output for each row, bitwise the same in any batch.

torch's CPU matrix product rounds a row's result differently with the batch size and the row's
place in it (the BLAS picks its kernels by shape: ~1e-9 on a [64, 64] MLP), and an elementwise
kernel computes the values past the last full vector of a tensor with scalar code that rounds
differently (sigmoid, and so ``Tanh``; elu, gelu, silu). Either can flip a near-tied argmax or move
a continuous action in its last bits, so an evaluation episode would depend on the rows it was
batched with. Here a ``Linear`` is products summed per row, ``(x[:, None, :] * weight).sum(-1) +
bias`` (one reduction per output value, whose order depends on the layer's width alone), and every
other module, elementwise, runs on rows padded with zeros to a multiple of ``ALIGN`` values, so no
value falls in a kernel's scalar tail. With torch on one thread, as on every shard, a row's result
is then the same in any batch. Evaluation uses it (``EvalEnding``), training collection does not:
without a BLAS it costs about a matrix product for the shipped configs' [64, 64] networks on 10 to
25 rows, and tens of times one for wide networks on hundreds of rows (products are formed in
blocks of ``BLOCK`` values, so memory stays small).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

#: Rows of an activation are padded to a multiple of this many values: two vectors of the widest
#: SIMD registers (AVX-512, 16 float32 values) and more, so every value is computed by vector code.
ALIGN = 64
#: The products of a ``Linear`` are formed for as many rows at a time as make about this many values.
BLOCK = 1 << 18


def rowwise(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``net(x)`` for ``x`` [B, D], computed so that each row's result depends on that row alone."""
    for module in net:
        x = linear_by_row(module, x) if isinstance(module, nn.Linear) else elementwise_by_row(module, x)
    return x


def linear_by_row(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for ``x`` [B, D] as products summed per row: each row's result depends on that row alone."""
    rows = max(1, BLOCK // module.weight.numel())
    return torch.cat([(part.unsqueeze(1) * module.weight).sum(-1) for part in x.split(rows)]) + module.bias


def elementwise_by_row(function: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """An elementwise ``function`` on ``x`` [B, W] with each row padded with zeros to a multiple of ``ALIGN``."""
    width = x.shape[1]
    if width % ALIGN == 0 and x.is_contiguous():  # no value in a kernel's scalar tail already
        return function(x)
    wide = x.new_zeros(x.shape[0], -(-width // ALIGN) * ALIGN)
    wide[:, :width] = x
    return function(wide)[:, :width]
