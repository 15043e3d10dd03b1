"""``resolve_device``: where a role's networks live (``learner.device``, ``servers.device``)."""

from __future__ import annotations

import torch


def resolve_device(device: str, key: str = "learner.device") -> torch.device:
    """``auto``: the GPU Ray assigned to this process when there is one, else the CPU; ``key`` names the setting in
    the error for a GPU that is not there."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        gpus = key.replace(".device", ".num_gpus")
        raise RuntimeError(f"{key} is {device!r} but no GPU is visible here ({gpus} > 0?)")
    return torch.device(device)
