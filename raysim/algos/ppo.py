"""PPO (Schulman et al. 2017), read top to bottom: config, clipped objective, loss, update.

Names follow CleanRL's ppo.py, and the metrics carry the same names as the variables
(``pg_loss``, ``v_loss``, ``entropy``, ``approx_kl``, ``clipfrac``, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from raysim.algos.guard import GuardedStep
from raysim.algos.models import ActorCritic


@dataclass
class PPOConfig:
    """PPO hyperparameters (CleanRL's names and defaults unless noted)."""

    name: str = "ppo"
    num_steps: int = 32  # steps per shard per iteration (the chunk length T)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 3e-4
    lr_schedule: str = "constant"  # constant | linear (to 0 over the run)
    update_epochs: int = 4
    num_minibatches: int = 4
    clip_coef: float = 0.2
    clip_vloss: bool = False
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    norm_adv: bool = True
    max_grad_norm: float = 0.5
    target_kl: float | None = None  # stop the epochs early once approx_kl exceeds it
    max_nonfinite_updates: int = 3  # consecutive skipped minibatches before training stops
    reward_scale: bool = False  # divide rewards by the running std of the discounted return (VecNormalize)


def clipped_objective(logratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """PPO's clipped surrogate ``min(r A, clip(r, 1-eps, 1+eps) A)`` per sample, in log space.

    For ``A >= 0`` the classic form equals ``A * min(r, 1+eps)``, for ``A < 0`` it equals
    ``A * max(r, 1-eps)``. Comparing the log-ratio with ``log(1+eps)`` or ``log(1-eps)`` before
    exponentiating gives the same objective and gradients wherever the classic form is finite,
    and stays finite where the classic one overflows although the objective is bounded: a huge
    ratio with ``A > 0`` (classic: inf * 0 gradient paths) or ``A = 0`` (classic: inf * 0 = NaN).
    With ``A < 0`` and a huge ratio the objective ``A * r`` is unbounded below by definition: it
    becomes -inf here too, and the update's non-finite guard skips that minibatch.
    At an exact tie ``log r == log(1 +- eps)`` the unclipped branch is taken, so the gradient is
    ``A * r``, as in the classic form (whose clamp passes the gradient at its bounds).
    """
    positive = advantages >= 0
    # the bounds in the log-ratio's dtype (Python scalars alone would give float32 bounds)
    bound = torch.where(positive, logratio.new_tensor(math.log1p(clip_coef)), logratio.new_tensor(math.log1p(-clip_coef)))
    inside = torch.where(positive, logratio <= bound, logratio >= bound)
    return advantages * torch.exp(torch.where(inside, logratio, bound))


def ppo_loss(model: ActorCritic, batch: dict[str, torch.Tensor | dict], config: PPOConfig) -> tuple[torch.Tensor, dict]:
    """The PPO loss of one minibatch and its metrics (tensors, still on the device)."""
    newlogprob, entropy = model.actor.log_prob_entropy(batch["obs"]["policy"], batch["actions"])
    logratio = newlogprob - batch["logprobs"]
    with torch.no_grad():
        ratio = logratio.exp()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > config.clip_coef).float().mean()

    advantages = batch["advantages"]
    if config.norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -clipped_objective(logratio, advantages, config.clip_coef).mean()

    newvalue = model.critic(batch["obs"])
    if config.clip_vloss:
        v_clipped = batch["values"] + (newvalue - batch["values"]).clamp(-config.clip_coef, config.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - batch["returns"]).square(), (v_clipped - batch["returns"]).square()).mean()
    else:
        v_loss = 0.5 * (newvalue - batch["returns"]).square().mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - config.ent_coef * entropy_loss + config.vf_coef * v_loss
    metrics = {"pg_loss": pg_loss, "v_loss": v_loss, "entropy": entropy_loss, "approx_kl": approx_kl, "clipfrac": clipfrac}
    return loss, metrics


def ppo_update(
    model: ActorCritic,
    step: GuardedStep,
    batch: dict[str, torch.Tensor | dict],
    config: PPOConfig,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """PPO's epochs over one batch (see ``run_epochs``); the metrics averaged over applied steps."""
    return run_epochs(lambda minibatch: ppo_loss(model, minibatch, config), ("pg_loss", "v_loss", "entropy"),
                      step, batch, config, generator)


def run_epochs(
    loss_fn: Callable[[dict], tuple[torch.Tensor, dict]],
    loss_terms: tuple[str, ...],
    step: GuardedStep,
    batch: dict[str, torch.Tensor | dict],
    config: PPOConfig,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """``update_epochs`` passes over ``batch``, each in exactly ``num_minibatches`` shuffled minibatches.

    The remainder of an uneven split is left out of that epoch (a new shuffle each epoch). The
    minibatch count never depends on the batch size, so learner ranks with different batch sizes
    take the same number of (collective) steps. ``loss_terms`` name the metrics whose
    non-finiteness the guard reports. With ``target_kl``, the epochs stop early once the mean
    ``approx_kl`` exceeds it. Returns the metrics averaged over the applied steps (tensors).
    """
    size = batch["actions"].shape[0]
    if size < config.num_minibatches:
        raise ValueError(f"a batch of {size} transitions cannot be split into {config.num_minibatches} minibatches")
    minibatch_size = size // config.num_minibatches
    totals: dict[str, torch.Tensor] = {}
    applied = 0
    for _ in range(config.update_epochs):
        order = torch.randperm(size, generator=generator).to(batch["actions"].device)
        for i in range(config.num_minibatches):
            index = order[i * minibatch_size : (i + 1) * minibatch_size]
            loss, metrics = loss_fn(select(batch, index))
            grad_norm = step(loss, {k: metrics[k] for k in loss_terms})
            if grad_norm is None:
                continue
            metrics["grad_norm"] = grad_norm
            applied += 1
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value.detach()
        target_kl = getattr(config, "target_kl", None)
        if target_kl is not None and applied and totals["approx_kl"] / applied > target_kl:
            break
    return {name: value / max(applied, 1) for name, value in totals.items()}


def select(batch: dict, index: torch.Tensor) -> dict:
    """The rows ``index`` of every tensor in a (nested) batch."""
    return {k: select(v, index) if isinstance(v, dict) else v.index_select(0, index) for k, v in batch.items()}
