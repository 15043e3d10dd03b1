"""``raysim export``: a trained policy as a standalone TorchScript or ONNX file.

The exported module maps a batch of the actor's observations to the deterministic action batch
that ``raysim eval`` takes (``Actor.deterministic`` then ``Actor.env_action``): discrete tasks give
int64 ``argmax`` indices ``[B]``; continuous tasks the Gaussian mean (``Actor.mean_of``: the network's first
D outputs, of 2 D with ``model.log_std: state``), clipped to the action space (``model.action_transform: clip``)
or squashed into it (``squash``), float32 ``[B, *action_shape]``.
It needs torch (TorchScript) or an ONNX runtime, not raysim. An actor that reads one vector group
(``model.actor_inputs``, default ``[policy]``) takes one tensor ``[B, *obs_shape]`` (float32), as
before named inputs; any other (several groups, an image group with its CNN) takes a dict of its
groups (``Dict[str, Tensor]``; image groups uint8, as the env gives them), and its ONNX file has one
input per group, named after it, in the order of ``info["inputs"]``.

Observation normalization is baked in when the actor has it (``model.obs_norm: true``): the
module computes ``clamp((obs - mean) / sqrt(var + epsilon), -clip, clip)`` with the running
statistics of the checkpoint's actor (``actor.obs_norm.*`` buffers) on its vector groups before the
network, as the actor's own forward does; otherwise the observation goes to the network unchanged.

A recurrent actor (``model.recurrent``) exports ``(obs, state, starts) -> (action, next_state)``:
``state`` [B, state_size] float32 (LSTM: ``h`` then ``c``; GRU: ``h``; zeros at first), ``starts`` [B]
bool (the rows whose episode starts at this observation: their state is zeroed before it is read, as
``RowMemory.advance`` does); the caller feeds ``next_state`` back. Its step is the actor's own
``RecurrentCore`` on the exported features. ``torch.jit.script`` rejects the core (nested helper
functions, the row-wise option), so this module is traced, for TorchScript as for ONNX: no branch
of it depends on the input, so the trace is the same step for any batch. The ONNX file has inputs
``state`` and ``starts`` after the observation's, and outputs ``action`` and ``next_state`` (an ONNX
graph names each value once: not ``state`` twice).

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

from raysim.envs.spaces import group_dtype
from raysim.models import Actor, actor_state, to_action_space

FORMATS = ("torchscript", "onnx")
DEFAULT_EPSILON = 1e-8
DEFAULT_CLIP = 10.0


class ExportError(RuntimeError):
    """An export that cannot be done here (e.g. the ONNX package is missing)."""


class DeterministicPolicy(nn.Module):
    """observation batch -> deterministic env action batch, with optional baked-in normalization."""

    __constants__ = ["normalize", "discrete", "squash", "clip", "epsilon", "width"]  # TorchScript folds the branches

    def __init__(self, actor: Actor):
        super().__init__()
        self.net = actor.net
        self.discrete = bool(actor.discrete)
        self.squash = bool(getattr(actor, "squash", False))
        self.width = int(actor.sampling.width)  # the logits, or the mean: the first of the net's outputs
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
            low, high = torch.zeros(0), torch.zeros(0)  # two tensors: a traced module shares none
        else:
            low, high = actor.action_low.detach().clone(), actor.action_high.detach().clone()
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act(self.features(obs))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The network's input: the observation flattened, normalized."""
        return self.normalized(obs.to(torch.float32).flatten(1))

    def normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The vector input normalized by the baked-in statistics (unchanged without them)."""
        if self.normalize:
            x = torch.clamp((x - self.obs_mean) / self.obs_std, -self.clip, self.clip)
        return x

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """The network on its input, then argmax (discrete) or the mean into the action space."""
        out = self.net(x)[:, : self.width]
        if self.discrete:
            return out.argmax(-1)
        return to_action_space(out, self.action_low, self.action_high, self.squash)


class MultiInputPolicy(DeterministicPolicy):
    """A dict of observation groups -> the deterministic action batch: vector groups concatenated and
    normalized, each image group through its CNN (uint8 in, ``x / 255`` inside), as ``Actor.features``."""

    __constants__ = [*DeterministicPolicy.__constants__, "vector_groups"]  # a tuple: TorchScript unrolls the loop

    def __init__(self, actor: Actor):
        super().__init__(actor)
        self.vector_groups = tuple(actor.vector_groups)
        self.encoders = actor.encoders

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return self.act(self.features(obs))

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        """The network's input: the vector groups concatenated and normalized, then the image features."""
        vectors: list[torch.Tensor] = []
        for group in self.vector_groups:
            vectors.append(obs[group].to(torch.float32).flatten(1))
        parts: list[torch.Tensor] = [self.normalized(torch.cat(vectors, 1))] if len(vectors) > 0 else []
        for name, encoder in self.encoders.items():
            parts.append(encoder(obs[name]))
        return torch.cat(parts, 1)


class RecurrentPolicy(nn.Module):
    """``(obs, state, starts) -> (action, next_state)``: the feed-forward policy's features, the actor's recurrent
    core from ``state`` zeroed where ``starts``, then its network and action mapping."""

    def __init__(self, actor: Actor):
        super().__init__()
        self.policy = feed_forward_policy(actor)
        self.core = actor.core
        self.discrete, self.normalize = self.policy.discrete, self.policy.normalize

    def forward(
        self, obs: torch.Tensor | dict[str, torch.Tensor], state: torch.Tensor, starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, next_state = self.core(self.policy.features(obs), state, starts)
        return self.policy.act(out), next_state


def deterministic_policy(actor: Actor) -> DeterministicPolicy | RecurrentPolicy:
    """The export module of ``actor``: one tensor for one vector group, a dict of groups otherwise; with a recurrent
    core, that input and the rows' ``state`` and ``starts``."""
    return RecurrentPolicy(actor) if actor.core is not None else feed_forward_policy(actor)


def feed_forward_policy(actor: Actor) -> DeterministicPolicy:
    """The observation-to-action module of ``actor`` without its recurrent core (if any)."""
    return DeterministicPolicy(actor) if len(actor.inputs) == 1 and not actor.image_groups else MultiInputPolicy(actor)


def load_policy(path: str | Path) -> tuple[DeterministicPolicy | RecurrentPolicy, dict[str, Any]]:
    """The deterministic policy of a run directory (newest checkpoint) or a checkpoint directory.

    Returns the module (eval mode, CPU) and a description: env id, spaces, checkpoint, normalization, ``recurrent``
    (``none``, ``lstm``, ``gru``) and ``state_size`` (0 without a core).
    """
    import raysim.envs
    from raysim.checkpoint import CheckpointError, locate_checkpoint
    from raysim.config import load_run_config

    storage, checkpoint, state, meta = locate_checkpoint(path)  # past damaged checkpoints
    try:
        config = load_run_config(storage)
        env = raysim.envs.stacked(raysim.envs.make(config.env.id, 1, **config.env.kwargs), config.env.frame_stack)
    finally:
        storage.close()  # the local copy of a remote run's configs
    try:
        actor = Actor(env.observation_spaces, env.action_space, config.model)
        observation_spaces, action_space = env.observation_spaces, env.action_space
    finally:
        env.close()
    weights = actor_state(state.get("model", {}))
    if not weights:
        raise CheckpointError(f"checkpoint {checkpoint} has no actor weights (state['model'] 'actor.*')")
    actor.load_state_dict(weights)
    policy = deterministic_policy(actor).eval()
    info = {
        "env_id": config.env.id,
        "checkpoint": storage.path(checkpoint.rel),
        "iteration": meta.get("iteration"),
        "inputs": list(actor.inputs),
        "observation_shape": list(observation_spaces[actor.inputs[0]].shape),
        "observation_shapes": {g: list(observation_spaces[g].shape) for g in actor.inputs},
        "observation_dtypes": {g: str(group_dtype(observation_spaces[g])) for g in actor.inputs},
        "action_space": str(action_space),
        "discrete": policy.discrete,
        "normalized": policy.normalize,
        "recurrent": config.model.recurrent,
        "state_size": actor.core.state_size if actor.core is not None else 0,
        "frame_stack": {"k": config.env.frame_stack.k, "groups": list(config.env.frame_stack.groups)},
    }
    return policy, info


def export_policy(path: str | Path, out: str | Path, format: str = "torchscript") -> dict[str, Any]:
    """Write the deterministic policy of ``path`` (run or checkpoint directory) to ``out``.

    ``format``: ``torchscript`` (``torch.jit.load(out)``) or ``onnx`` (input ``obs`` [batch, ...] or one per group,
    then ``state`` and ``starts`` for a recurrent policy; outputs ``action``, then ``next_state``; needs the ``onnx``
    package: ``pip install "raysim[export]"``).
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
    example = example_input(policy, info)
    names = list(example) if isinstance(example, dict) else ["obs"]
    outputs = ["action"]
    if isinstance(policy, RecurrentPolicy):  # two rows, one starting an episode
        args: tuple[Any, ...] = (example, torch.zeros(2, info["state_size"]), torch.tensor([True, False]))
        names, outputs = [*names, "state", "starts"], [*outputs, "next_state"]
    else:
        args = (example, {}) if isinstance(example, dict) else (example,)  # {}: the dict is an input, not kwargs
    if format == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's notice; the format stays loadable
            with torch.no_grad():
                module = (
                    torch.jit.trace(policy, args) if isinstance(policy, RecurrentPolicy) else torch.jit.script(policy)
                )
            torch.jit.save(module, str(out), _extra_files={"raysim.json": json.dumps(info)})
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation notice
            torch.onnx.export(
                policy,
                args,
                str(out),
                dynamo=False,
                input_names=names,
                output_names=outputs,
                dynamic_axes={name: {0: "batch"} for name in [*names, *outputs]},
                opset_version=17,
            )
    return {**info, "format": format, "out": str(out)}


def example_input(
    policy: DeterministicPolicy | RecurrentPolicy, info: dict[str, Any]
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Two rows of zeros in the exported module's input form (a tensor, or a dict of groups in their dtypes)."""
    if not isinstance(policy.policy if isinstance(policy, RecurrentPolicy) else policy, MultiInputPolicy):
        return torch.zeros(2, *info["observation_shape"])
    dtypes = {"torch.uint8": torch.uint8, "torch.float32": torch.float32}
    return {
        g: torch.zeros(2, *info["observation_shapes"][g], dtype=dtypes[info["observation_dtypes"][g]])
        for g in info["inputs"]
    }
