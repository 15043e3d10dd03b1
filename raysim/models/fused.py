"""``MLPInference``: the forward pass of an ``mlp()`` network for inference, without per-call allocation.

The shards run the actor once per env step and the learner runs the critic on every observation
of a chunk; at small batches the cost is Python and dispatch overhead per module and per
temporary tensor, at large ones the activation. This runs the same layers as fused, in-place
torch calls into buffers allocated once per batch size:

- ``Linear``: ``torch.addmm(bias, x, weight.t())``, the very call ``nn.Linear`` makes;
- ``Tanh`` (``raysim.models.networks.Tanh``, ``2 * sigmoid(2z) - 1``): the factor 2 folded into
  ``addmm`` (``alpha = beta = 2``), ``sigmoid_``, then ``2s - 1`` in one ``add``. Scaling by 2 is
  exact in floating point, so each value is bitwise what the module computes;
- ``ReLU``: ``relu_``; any other module is called as is;
- an input normalizer (``norm``, a ``RunningNorm``: ``model.obs_norm``) first, as the module
  does it: ``x - mean``, ``/ sqrt(var + epsilon)``, clamp, into a buffer (elementwise, so bitwise).
  With ``fixed`` its statistics are promised not to change while the instance is used (a shard's
  acting run): the divisor ``sqrt(var + epsilon)`` is computed once, not at every call.

The results are bitwise equal to ``net(x)`` (tests/test_fast_path.py checks it). The returned
tensor is a buffer that the next call with the same batch size overwrites (copy what you keep),
unless ``out`` is given. The layers are read from the module once: loading weights in place
(``load_state_dict``) is seen, replacing a module or parameter object needs a new instance.
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.models.networks import Tanh
from raysim.models.normalizer import RunningNorm


class MLPInference:
    """Inference-only forward of a ``nn.Sequential`` of ``Linear`` layers and activations."""

    def __init__(self, net: nn.Sequential, norm: RunningNorm | None = None, fixed: bool = False):
        self.net = net
        self.norm = norm  # its live buffers are read at every call (statistics loaded in place are seen)
        self._std = norm.std() if fixed and norm is not None else None  # the divisor, when the statistics are fixed
        self._norm_buffers: dict[int, torch.Tensor] = {}  # batch size -> normalized input
        self.plan = self._plan()  # views of the live parameters: load_state_dict (in place) is seen
        self._buffers: dict[int, list[torch.Tensor]] = {}  # batch size -> one output buffer per Linear
        self._minus_one = torch.tensor(-1.0)

    @staticmethod
    def supports(net: nn.Module) -> bool:
        """Whether ``net`` is a Sequential of Linear layers, each followed by at most one activation."""
        if not isinstance(net, nn.Sequential) or len(net) == 0 or not isinstance(net[0], nn.Linear):
            return False
        modules = list(net)
        return all(
            isinstance(m, nn.Linear) or isinstance(p, nn.Linear) for p, m in zip(modules, modules[1:], strict=False)
        ) and not any(isinstance(m, (nn.BatchNorm1d, nn.Dropout)) for m in modules)

    def _plan(self) -> list[tuple[torch.Tensor, torch.Tensor, nn.Module | None]]:
        """``(weight.t(), bias, activation after it)`` per Linear, read from the live parameters."""
        plan, modules = [], list(self.net)
        for i, module in enumerate(modules):
            if isinstance(module, nn.Linear):
                after = modules[i + 1] if i + 1 < len(modules) and not isinstance(modules[i + 1], nn.Linear) else None
                plan.append((module.weight.t(), module.bias, after))
            elif i == 0 or not isinstance(modules[i - 1], nn.Linear):
                raise TypeError(
                    f"MLPInference expects Linear layers each followed by at most one activation, got {self.net}"
                )
        return plan

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``net(x)`` for a 2-D ``x`` [B, in]; written into ``out`` [B, out] when given.

        Call it under ``torch.no_grad()`` / ``inference(...)`` (the ``out=`` calls refuse autograd).
        """
        plan = self.plan
        rows = x.shape[0]
        buffers = self._buffers.get(rows)
        if buffers is None or any(b.shape[1] != w.shape[1] for b, (w, _, _) in zip(buffers, plan, strict=True)):
            buffers = self._buffers[rows] = [x.new_empty((rows, w.shape[1])) for w, _, _ in plan]
        h = x
        norm = self.norm
        if norm is not None:
            normalized = self._norm_buffers.get(rows)
            if normalized is None or normalized.shape[1] != x.shape[1]:
                normalized = self._norm_buffers[rows] = x.new_empty((rows, x.shape[1]))
            torch.sub(x, norm.mean, out=normalized)
            torch.div(normalized, norm.std() if self._std is None else self._std, out=normalized)
            torch.clamp(normalized, -norm.clip, norm.clip, out=normalized)
            h = normalized
        for index, ((weight_t, bias, activation), buffer) in enumerate(zip(plan, buffers, strict=True)):
            target = out if out is not None and index == len(plan) - 1 and activation is None else buffer
            if isinstance(activation, Tanh):
                torch.addmm(bias, h, weight_t, beta=2, alpha=2, out=target)  # 2 * linear(h), exactly
                target.sigmoid_()
                torch.add(self._minus_one, target, alpha=2, out=target)  # 2s - 1 (2s is exact)
            else:
                torch.addmm(bias, h, weight_t, out=target)
                if isinstance(activation, nn.ReLU):
                    target.relu_()
                elif activation is not None:
                    target = activation(target)
            h = target
        if out is not None and h is not out:
            out.copy_(h)
            return out
        return h
