"""``raysim export``: a trained policy as a standalone TorchScript or ONNX file.

The exported module maps a batch of ``policy`` observations ``[B, *obs_shape]`` (float32) to the
deterministic action batch that ``raysim eval`` takes (``Actor.deterministic`` then
``Actor.env_action``): discrete tasks give int64 ``argmax`` indices ``[B]``; continuous tasks the
Gaussian mean, clipped to the action space (``model.action_transform: clip``) or squashed into it
(``squash``), float32 ``[B, *action_shape]``. It needs torch (TorchScript) or an ONNX runtime,
not raysim.

Observation normalization is baked in when the actor has it (``model.obs_norm: true``): the
module computes ``clamp((obs - mean) / sqrt(var + epsilon), -clip, clip)`` with the running
statistics of the checkpoint's actor (``actor.obs_norm.*`` buffers) before the network, as the
actor's own forward does; otherwise the observation goes to the network unchanged.

The model is built from the run's ``configs/train.yaml`` (``model`` section) and the env's spaces
(``raysim.envs.make(env.id, 1, **env.kwargs)``); the weights are the checkpoint's
``state["model"]`` entries under ``actor.``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raysim.models import Actor, actor_state, to_action_space

FORMATS = ("torchscript", "onnx")
DEFAULT_EPSILON = 1e-8
DEFAULT_CLIP = 10.0


class ExportError(RuntimeError):
    """An export that cannot be done here (e.g. the ONNX package is missing)."""


class DeterministicPolicy(nn.Module):
    """observation batch -> deterministic env action batch, with optional baked-in normalization."""

    __constants__ = ["normalize", "discrete", "squash", "clip", "epsilon"]  # TorchScript folds the branches

    def __init__(self, actor: Actor):
        super().__init__()
        self.net = actor.net
        self.discrete = bool(actor.discrete)
        self.squash = bool(getattr(actor, "squash", False))
        norm = getattr(actor, "obs_norm", None)
        self.normalize = norm is not None
        self.epsilon = float(norm.epsilon) if norm is not None else DEFAULT_EPSILON
        self.clip = float(norm.clip) if norm is not None else DEFAULT_CLIP
        dim = actor.net[0].in_features
        if norm is not None:  # the actor's own running statistics, baked in
            mean, std = norm.mean.detach().clone(), norm.std().detach().clone()
        else:
            mean, std = torch.zeros(dim), torch.ones(dim)
        self.register_buffer("obs_mean", mean.to(torch.float32).reshape(-1))
        self.register_buffer("obs_std", std.to(torch.float32).reshape(-1))
        if self.discrete:
            low = high = torch.zeros(0)
        else:
            low, high = actor.action_low.detach().clone(), actor.action_high.detach().clone()
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32).flatten(1)
        if self.normalize:
            x = torch.clamp((x - self.obs_mean) / self.obs_std, -self.clip, self.clip)
        out = self.net(x)
        if self.discrete:
            return out.argmax(-1)
        return to_action_space(out, self.action_low, self.action_high, self.squash)


def load_policy(path: str | Path) -> tuple[DeterministicPolicy, dict[str, Any]]:
    """The deterministic policy of a run directory (newest checkpoint) or a checkpoint directory.

    Returns the module (eval mode, CPU) and a description: env id, spaces, checkpoint, normalization.
    """
    import raysim.envs
    from raysim.checkpoint import CheckpointError, locate_checkpoint
    from raysim.config import load_run_config

    storage, checkpoint, state, meta = locate_checkpoint(path)  # past damaged checkpoints
    try:
        config = load_run_config(storage)
        env = raysim.envs.make(config.env.id, 1, **config.env.kwargs)
    finally:
        storage.close()  # the local copy of a remote run's configs
    try:
        actor = Actor(env.observation_spaces, env.action_space, config.model)
        observation_space, action_space = env.observation_spaces["policy"], env.action_space
    finally:
        env.close()
    weights = actor_state(state.get("model", {}))
    if not weights:
        raise CheckpointError(f"checkpoint {checkpoint} has no actor weights (state['model'] 'actor.*')")
    actor.load_state_dict(weights)
    policy = DeterministicPolicy(actor).eval()
    info = {
        "env_id": config.env.id,
        "checkpoint": storage.path(checkpoint.rel),
        "iteration": meta.get("iteration"),
        "observation_shape": list(observation_space.shape),
        "action_space": str(action_space),
        "discrete": policy.discrete,
        "normalized": policy.normalize,
    }
    return policy, info


def export_policy(path: str | Path, out: str | Path, format: str = "torchscript") -> dict[str, Any]:
    """Write the deterministic policy of ``path`` (run or checkpoint directory) to ``out``.

    ``format``: ``torchscript`` (``torch.jit.load(out)``) or ``onnx`` (input ``obs`` [batch, ...],
    output ``action``; needs the ``onnx`` package: ``pip install "raysim[export]"``).
    Returns the description of the exported policy.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if format == "onnx":  # before any work: the extra is missing, not the run
        try:
            import onnx  # noqa: F401  (torch's exporter needs it)
        except ImportError as error:
            raise ExportError(
                'ONNX export needs the onnx package, which is not installed: pip install "raysim[export]"'
            ) from error
    policy, info = load_policy(path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(2, *info["observation_shape"])
    if format == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's notice; the format stays loadable
            scripted = torch.jit.script(policy)
            torch.jit.save(scripted, str(out), _extra_files={"raysim.json": json.dumps(info)})
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation notice
            torch.onnx.export(
                policy,
                (example,),
                str(out),
                dynamo=False,
                input_names=["obs"],
                output_names=["action"],
                dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
                opset_version=17,
            )
    return {**info, "format": format, "out": str(out)}
