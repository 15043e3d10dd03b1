"""Decoupled PPO (Hilton et al. 2021, as RLlib's APPO): how PPO and GRPO train on chunks of an older policy.

With ``max_policy_lag > 0`` a chunk may have been collected by a policy one whole update (many
epochs) behind the learner's: a ratio clipped around that acting policy leaves most samples outside
the clip range before the first step. So the ratio is taken to the learner's own policy at the start
of the update (the proximal policy: the batch's ``logprobs``), and each sample's objective is
weighted by the proximal policy's probability over the acting one's, truncated at ``max_is_weight``
(``is_weights``). A batch without a lagging chunk (every batch in lockstep) is left as it is: plain PPO.
"""

from __future__ import annotations

import torch

from raysim.algos.epochs import Batch
from raysim.models import Actor
from raysim.rollout import RolloutChunk
from raysim.rollout.inference import inference


def decouple(parts: list[Batch], chunks: list[RolloutChunk], version: int, actor: Actor, max_is_weight: float) -> None:
    """Give each chunk's part (its valid transitions) the proximal ``logprobs`` and its ``is_weights``, in place,
    when some chunk is older than ``version`` (the learner's): a chunk of the learner's own policy gets weight 1."""
    if all(chunk.policy_version >= version for chunk in chunks):
        return
    for part, chunk in zip(parts, chunks, strict=True):
        if chunk.policy_version < version:
            part.update(proximal(part, actor, max_is_weight))
        else:  # the acting policy is the proximal one
            part.update(is_weights=torch.ones_like(part["logprobs"]))


def proximal(part: Batch, actor: Actor, max_is_weight: float) -> Batch:
    """The ``logprobs`` of the learner's policy now (``actor``) and ``is_weights``: now over acting, truncated. A
    recurrent actor's from replaying the part's sequences with these weights (the padding steps keep theirs)."""
    sequences = part.get("sequences")
    with inference(actor):
        logprobs, _ = actor.log_prob_entropy(part["obs"], part["actions"], sequences=sequences)
    if sequences is not None:
        logprobs = part["logprobs"].masked_scatter(sequences["mask"], logprobs)
    is_weights = torch.exp(logprobs - part["logprobs"]).clamp(max=max_is_weight)
    return {"logprobs": logprobs, "is_weights": is_weights}


def importance_weighted(objective: torch.Tensor, minibatch: Batch) -> torch.Tensor:
    """The per-sample objective weighted by its ``is_weights`` where the batch was decoupled, else as it is."""
    return objective * minibatch["is_weights"] if "is_weights" in minibatch else objective
