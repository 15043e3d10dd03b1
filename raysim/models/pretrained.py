"""Starting a new model from another run's weights (``model.init_from``): the actor whole, the critic where it fits.

The driver reads the other run's checkpoint and checks it (``mismatched_actor``); the learner loads it into
its freshly built model before the algorithm is constructed (``load_pretrained``), so anything the algorithm
copies at construction (a KL reference) is the pretrained actor. The observation statistics
(``obs_norm``) come with the weights; the Gaussian's log-std starts again from ``model.init_log_std`` (with
``model.log_std: state``, in every state: ``Actor.reset_log_std``), so fine-tuning explores as the config says
rather than as narrowly as cloning left it. An actor of the other log-std kind does not fit (``mismatched_actor``:
the net's last layer is twice as wide with a log-std per state, and only the other has ``log_std``).
"""

from __future__ import annotations

import torch

from raysim.models.networks import ActorCritic, actor_state


def mismatched_actor(model: ActorCritic, saved: dict[str, torch.Tensor]) -> list[str]:
    """The actor's tensors that ``saved`` (an ``ActorCritic`` state_dict) lacks or holds in another shape."""
    return mismatched(model.state_dict(), saved, "actor.")


def mismatched(expected: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], prefix: str = "") -> list[str]:
    """The tensors of the state_dict ``expected`` (those named under ``prefix``) that ``saved`` lacks or holds in
    another shape, each as ``name [saved shape] vs [expected shape]`` (``missing`` for one it lacks)."""
    problems = []
    for name, tensor in expected.items():
        if not name.startswith(prefix):
            continue
        have = saved.get(name)
        if have is None:
            problems.append(f"{name} missing vs {list(tensor.shape)}")
        elif tuple(have.shape) != tuple(tensor.shape):
            problems.append(f"{name} {list(have.shape)} vs {list(tensor.shape)}")
    return problems


def fitting_critic(model: ActorCritic, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """``saved``'s critic (its own keys) when every tensor of ``model``'s critic is there in the same shape; None
    otherwise (no critic on either side, or another one: the critic then starts new)."""
    own = {k: v for k, v in model.state_dict().items() if k.startswith("critic.")}
    if not own or any(k not in saved or tuple(saved[k].shape) != tuple(v.shape) for k, v in own.items()):
        return None
    return {k[len("critic.") :]: saved[k] for k in own}


def load_pretrained(model: ActorCritic, saved: dict[str, torch.Tensor], init_log_std: float) -> None:
    """``saved``'s actor into ``model`` (it must fit: ``mismatched_actor``), its critic where every tensor fits
    (``fitting_critic``), the log-std reset to ``init_log_std`` (``Actor.reset_log_std``)."""
    model.actor.load_state_dict(actor_state(saved))
    critic = fitting_critic(model, saved)
    if critic is not None:
        model.critic.load_state_dict(critic)
    if not model.actor.discrete:
        model.actor.reset_log_std(init_log_std)
