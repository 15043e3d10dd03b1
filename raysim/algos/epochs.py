"""``run_epochs``: the minibatch epochs of an update, shared by the algorithms that train on a batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from raysim.algos.collectives import Collectives
from raysim.algos.guard import GuardedStep
from raysim.algos.optimizer import OptimizerConfig
from raysim.rollout import RolloutChunk

# tensors [B, ...] (observations: a dict of groups), one row per valid transition; or, for a recurrent model, one row
# per env row: its whole sequence [B, T, ...] (``sequences``)
Batch = dict[str, Any]


def run_epochs(
    loss_fn: Callable[[Batch], tuple[torch.Tensor, dict]],
    loss_terms: tuple[str, ...],
    step: GuardedStep,
    batch: Batch,
    config: OptimizerConfig,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """``config.update_epochs`` passes over ``batch``, each in exactly ``config.num_minibatches`` shuffled minibatches.

    An uneven split (``minibatches``) leaves the remainder of a batch of transitions out of that epoch (a new
    shuffle each epoch) and trains every row of a recurrent batch. The minibatch count never depends on
    the batch size, so learner ranks with different batch sizes take the same number of (collective)
    steps; each rank's gradient weighs with its minibatch size.
    ``loss_terms`` name the metrics whose non-finiteness the guard reports. ``config.target_kl``
    stops the epochs early by CleanRL's rule (``kl_exceeded``). Returns the metrics averaged over the
    applied steps (tensors).
    """
    check_batch(batch, config)
    size, rows = batch["actions"].shape[0], "sequences" in batch
    target_kl = getattr(config, "target_kl", None)
    totals: dict[str, torch.Tensor] = {}
    applied = 0
    for _ in range(config.update_epochs):
        order = torch.randperm(size, generator=generator).to(batch["actions"].device)
        for index in minibatches(order, config.num_minibatches, rows):
            minibatch_size = index.numel()
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


def minibatches(order: torch.Tensor, count: int, rows: bool) -> list[torch.Tensor]:
    """``order`` (a shuffled batch) in ``count`` minibatches. A recurrent batch's (``rows``) are one row apart and
    hold every row: a row is a whole sequence, and with elastic shards a rank's rows vary, so a remainder would
    leave out a large part. A batch of transitions is split equally, the remainder (fewer than ``count`` of its
    transitions) left out of this epoch."""
    if rows:
        return list(torch.tensor_split(order, count))
    size = order.numel() // count
    return [order[i * size : (i + 1) * size] for i in range(count)]


def check_batch(batch: Batch, config: OptimizerConfig) -> None:
    """``ValueError`` when ``batch`` cannot be split into ``config.num_minibatches`` minibatches (a recurrent
    batch counts rows, a minibatch being whole rows), or holds nothing to train on."""
    size = batch["actions"].shape[0]
    if size == 0:
        raise ValueError(
            "every transition of this iteration's batch was masked (the env gave non-finite values on every row, "
            "env.on_nonfinite: mask): there is nothing to train on; fix the env"
        )
    if size < config.num_minibatches:
        what = "rows (a recurrent model's minibatch is whole rows)" if "sequences" in batch else "transitions"
        raise ValueError(f"a batch of {size} {what} cannot be split into {config.num_minibatches} minibatches")


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
    return {
        "obs": {k: transition_steps(chunk, v[:-1]) for k, v in chunk.obs.items()},
        "actions": transition_steps(chunk, chunk.actions),
        "logprobs": transition_steps(chunk, chunk.logp),
    }


def transition_steps(chunk: RolloutChunk, value: torch.Tensor) -> torch.Tensor:
    """A per-step tensor [T, N, ...] of the chunk as ``transitions`` lays it out: its valid steps, flat."""
    return value[chunk.mask]


def sequences(chunk: RolloutChunk) -> Batch:
    """A recurrent model's batch of a chunk: every row's whole sequence, row-major ([N, T, ...], copies), the
    masked steps kept as padding for the replay; ``sequences`` holds each row's ``state0`` [N, S], ``starts`` and
    ``mask`` [N, T] (``Actor.replay``). Minibatches are sets of rows (CleanRL's ``ppo_atari_lstm.py``)."""
    return {
        "obs": {k: sequence_steps(chunk, v[:-1]) for k, v in chunk.obs.items()},
        "actions": sequence_steps(chunk, chunk.actions),
        "logprobs": sequence_steps(chunk, chunk.logp),
        "sequences": {
            "state0": chunk.state0.clone(),
            "starts": sequence_steps(chunk, chunk.starts[:-1]),
            "mask": sequence_steps(chunk, chunk.mask),
        },
    }


def sequence_steps(chunk: RolloutChunk, value: torch.Tensor) -> torch.Tensor:
    """A per-step tensor [T, N, ...] of the chunk as ``sequences`` lays it out: [N, T, ...], a copy."""
    return value.transpose(0, 1).clone(memory_format=torch.contiguous_format)


def valid_steps(batch: Batch) -> Batch:
    """A sequence batch's per-step tensors at its valid steps, flat, row by row (the order of ``ActorCritic.evaluate``'s
    results for it); a batch of transitions as it is."""
    if "sequences" not in batch:
        return batch
    valid = batch["sequences"]["mask"]
    return {k: v[valid] for k, v in batch.items() if isinstance(v, torch.Tensor)}
