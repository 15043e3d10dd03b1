"""``GuardedStep``: the one optimizer step of every algorithm, with a non-finite guard.

A non-finite loss term or gradient never reaches the weights: the step is skipped and counted.
After ``max_consecutive`` skipped steps in a row, training stops with an error that names the
quantity that went non-finite. With several learner ranks, the gradients are averaged across
ranks in one collective that also carries each rank's verdict, so all ranks skip together. The
average is weighted by each rank's samples, so ranks with unequal minibatches (GRPO's rounds, masked
transitions, shards not divisible by the ranks) give the gradient of the mean loss over their union.
"""

from __future__ import annotations

import torch

from raysim.algos.collectives import Collectives


class NonFiniteUpdateError(RuntimeError):
    """Training stopped: the loss or its gradients stayed non-finite."""


class GuardedStep:
    """Backward, gradient averaging across ranks, global grad-norm clipping and the optimizer step."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float,
        max_consecutive: int,
        ranks: Collectives | None = None,
    ):
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.max_grad_norm = max_grad_norm
        self.max_consecutive = max_consecutive
        self.ranks = ranks
        self.skipped = 0  # over the whole run
        self.consecutive = 0

    def __call__(self, loss: torch.Tensor, terms: dict[str, torch.Tensor], samples: int = 1) -> torch.Tensor | None:
        """Apply ``loss``; return the gradient norm before clipping, or None when skipped.

        ``terms`` are the named parts of the loss, used to say which one went non-finite; ``samples``:
        how many samples ``loss`` is the mean over (this rank's weight in the average across ranks).
        """
        self.optimizer.zero_grad(set_to_none=True)
        bad = []
        checked = torch.cat([v.detach().reshape(-1) for v in (loss, *terms.values())])
        if not bool(torch.isfinite(checked).all()):  # one host sync; the names only when something is wrong
            bad = [name for name, value in terms.items() if not bool(torch.isfinite(value).all())] or ["loss"]
        if not bad:
            loss.backward()
        if self.ranks is not None and self.ranks.world_size > 1 and self._average_across_ranks(bool(bad), samples):
            bad = bad or ["loss on another learner rank"]
        if not bad:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            if bool(torch.isfinite(grad_norm)):
                self.optimizer.step()
                self.consecutive = 0
                return grad_norm
            bad = ["grad_norm"]
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

    def _average_across_ranks(self, skipped_here: bool, samples: int) -> bool:
        """All-reduce the sample-weighted gradients, the sample counts and the skip verdicts in one collective;
        True if any rank skips."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        tail = torch.tensor([float(skipped_here), float(samples)], device=grads[0].device)
        flat = torch.cat([g.reshape(-1) * samples for g in grads] + [tail])
        self.ranks.all_reduce(flat)
        skipped_anywhere, total = bool(flat[-2] > 0), flat[-1]
        offset = 0
        for p, g in zip(self.params, grads, strict=True):
            p.grad = (flat[offset : offset + g.numel()] / total).view_as(p)
            offset += g.numel()
        return skipped_anywhere
