"""``GuardedStep``: the one optimizer step of every algorithm, with a non-finite guard.

A non-finite loss term or gradient never reaches the weights: the step is skipped and counted.
After ``max_consecutive`` skipped steps in a row, training stops with an error that names the
quantity that went non-finite.
"""

from __future__ import annotations

import torch


class NonFiniteUpdateError(RuntimeError):
    """Training stopped: the loss or its gradients stayed non-finite."""


class GuardedStep:
    """Backward, global grad-norm clipping and the optimizer step, or a counted skip."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_grad_norm: float, max_consecutive: int):
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.max_grad_norm = max_grad_norm
        self.max_consecutive = max_consecutive
        self.skipped = 0  # over the whole run
        self.consecutive = 0

    def __call__(self, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Apply ``loss``; return the gradient norm before clipping, or None when skipped.

        ``terms`` are the named parts of the loss, used to say which one went non-finite.
        """
        self.optimizer.zero_grad(set_to_none=True)
        bad = [name for name, value in terms.items() if not bool(torch.isfinite(value).all())]
        if not bad and bool(torch.isfinite(loss)):
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            if bool(torch.isfinite(grad_norm)):
                self.optimizer.step()
                self.consecutive = 0
                return grad_norm
            bad = ["grad_norm"]
        else:
            bad = bad or ["loss"]
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteUpdateError(
                f"{self.consecutive} consecutive updates skipped: non-finite {', '.join(bad)}. "
                "Check the env's rewards and observations, lower the learning rate, or raise "
                "algo.max_nonfinite_updates."
            )
        return None
