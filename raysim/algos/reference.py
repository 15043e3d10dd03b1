"""``Reference``: a frozen copy of the actor a run started from, and the KL pull toward it.

GRPO's KL penalty and fine-tuning's guard are one mechanism: the copy is taken when the algorithm is
constructed, after the learner loaded ``model.init_from`` (so it is the pretrained actor, or the random
initialisation of a run from scratch), and saved in checkpoints. The pull's weight is ``kl_coef``, falling
linearly to 0 over ``kl_decay_steps`` env steps (0: constant). The KL is the k3 estimator of
``KL(pi || pi_ref)`` on the minibatch's actions (Schulman's approximation, as GRPO's paper).

Feed-forward actors only: a recurrent reference would have to read each step with the state *its own* core reached
over the episode so far, and a chunk starts mid-episode, after steps the learner no longer has (the chunk's
``state0`` is the acting actor's state, not the reference's), so the config refuses ``kl_coef > 0`` with
``model.recurrent``.
"""

from __future__ import annotations

import copy

import torch

from raysim.models import Actor


class Reference:
    """The frozen actor and the pull's schedule."""

    def __init__(self, actor: Actor, kl_coef: float, kl_decay_steps: int):
        if actor.core is not None:
            raise ValueError(
                "a KL reference needs a feed-forward actor: a recurrent one's state is unknown mid-episode"
            )
        self.actor = copy.deepcopy(actor).requires_grad_(False).eval()
        self.kl_coef, self.kl_decay_steps = float(kl_coef), int(kl_decay_steps)

    def weight(self, env_steps: int) -> float:
        """The pull's weight after ``env_steps`` consumed env steps."""
        if not self.kl_decay_steps:
            return self.kl_coef
        return self.kl_coef * max(0.0, 1.0 - env_steps / self.kl_decay_steps)

    def kl(self, obs: dict[str, torch.Tensor], actions: torch.Tensor, logprob: torch.Tensor) -> torch.Tensor:
        """The k3 estimate of ``KL(pi || pi_ref)`` over the minibatch, ``logprob``: the actor's of ``actions``."""
        with torch.no_grad():
            ref_logprob, _ = self.actor.log_prob_entropy(obs, actions)
        diff = ref_logprob - logprob
        return (diff.exp() - diff - 1).mean()


def reference_of(actor: Actor, config) -> Reference | None:
    """The reference of an algorithm whose config has ``kl_coef`` and ``kl_decay_steps``; None when ``kl_coef`` is 0."""
    return Reference(actor, config.kl_coef, config.kl_decay_steps) if config.kl_coef > 0 else None
