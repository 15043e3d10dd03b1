"""``run_epochs``: the minibatch epochs of an update, shared by the algorithms that train on a batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from raysim.algos.collectives import Collectives
from raysim.algos.guard import GuardedStep
from raysim.rollout import RolloutChunk

Batch = dict[str, Any]  # tensors [B, ...] (observations: a dict of groups), one row per valid transition


def run_epochs(
    loss_fn: Callable[[Batch], tuple[torch.Tensor, dict]],
    loss_terms: tuple[str, ...],
    step: GuardedStep,
    batch: Batch,
    config: Any,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """``config.update_epochs`` passes over ``batch``, each in exactly ``config.num_minibatches`` shuffled minibatches.

    The remainder of an uneven split is left out of that epoch (a new shuffle each epoch). The
    minibatch count never depends on the batch size, so learner ranks with different batch sizes
    take the same number of (collective) steps; each rank's gradient weighs with its minibatch size.
    ``loss_terms`` name the metrics whose non-finiteness the guard reports. ``config.target_kl``
    stops the epochs early by CleanRL's rule (``kl_exceeded``). Returns the metrics averaged over the
    applied steps (tensors).
    """
    size = batch["actions"].shape[0]
    if size == 0:
        raise ValueError(
            "every transition of this iteration's batch was masked (the env gave non-finite values on every row, "
            "env.on_nonfinite: mask): there is nothing to train on; fix the env"
        )
    if size < config.num_minibatches:
        raise ValueError(f"a batch of {size} transitions cannot be split into {config.num_minibatches} minibatches")
    minibatch_size = size // config.num_minibatches
    target_kl = getattr(config, "target_kl", None)
    totals: dict[str, torch.Tensor] = {}
    applied = 0
    for _ in range(config.update_epochs):
        order = torch.randperm(size, generator=generator).to(batch["actions"].device)
        for i in range(config.num_minibatches):
            index = order[i * minibatch_size : (i + 1) * minibatch_size]
            loss, metrics = loss_fn(select(batch, index))
            last_kl = metrics["approx_kl"].detach() if target_kl is not None else None
            grad_norm = step(loss, {k: metrics[k] for k in loss_terms}, minibatch_size)
            if grad_norm is None:
                continue
            metrics["grad_norm"] = grad_norm
            applied += 1
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value.detach()
        if target_kl is not None and kl_exceeded(last_kl, minibatch_size, target_kl, step.ranks):
            break
    return {name: value / max(applied, 1) for name, value in totals.items()}


def kl_exceeded(approx_kl: torch.Tensor, samples: int, target_kl: float, ranks: Collectives | None) -> bool:
    """CleanRL's early stop, checked after each epoch: the epoch's last minibatch's ``approx_kl`` above ``target_kl``.

    With several learner ranks it is the sample-weighted mean over the ranks (one all-reduce), the
    ``approx_kl`` of the union minibatch: every rank takes the same decision, as one rank would.
    """
    if ranks is not None and ranks.world_size > 1:
        flat = torch.stack([approx_kl.double() * samples, approx_kl.new_tensor(samples, dtype=torch.float64)])
        ranks.all_reduce(flat)
        approx_kl = flat[0] / flat[1]
    return bool(approx_kl > target_kl)


def select(batch: Batch, index: torch.Tensor) -> Batch:
    """The rows ``index`` of every tensor in a (nested) batch."""
    return {k: select(v, index) if isinstance(v, dict) else v.index_select(0, index) for k, v in batch.items()}


def concat(parts: list[Batch]) -> Batch:
    """Concatenate a list of (nested) batches along the first dimension; one batch is returned as it is (its
    tensors are already the learner's own copies, ``transitions``: a second copy of a chunk's images costs)."""
    if len(parts) == 1:
        return parts[0]
    return {
        k: concat([p[k] for p in parts]) if isinstance(parts[0][k], dict) else torch.cat([p[k] for p in parts])
        for k in parts[0]
    }


def transitions(chunk: RolloutChunk) -> Batch:
    """The valid transitions of a chunk: ``obs`` (every group), ``actions``, ``logprobs``; copies (the boolean
    mask copies), so the learner's batch is its own, never a read-only view of the object store."""
    valid = chunk.mask
    return {
        "obs": {k: v[:-1][valid] for k, v in chunk.obs.items()},
        "actions": chunk.actions[valid],
        "logprobs": chunk.logp[valid],
    }
