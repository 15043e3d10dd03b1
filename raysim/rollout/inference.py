"""``inference(module)``: the one context for every forward pass outside the gradient step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def inference(module: nn.Module) -> Iterator[nn.Module]:
    """Run the block under ``torch.no_grad()`` with ``module`` in eval mode.

    Afterwards every submodule gets back its own ``training`` flag exactly (a root in train mode
    may hold a child in eval mode, or the reverse), also when the block raises. Acting in the
    shards, values for GAE, terminal values and evaluation all go through here, so dropout is off
    and BatchNorm uses its running statistics (a batch of one row works).
    """
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield module
    finally:
        for m, training in flags:
            m.training = training
