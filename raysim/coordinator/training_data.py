"""The dataset of demonstrations a run trains on (BC's ``algo.dataset``, RLPD's ``algo.demonstrations``), read once
by the driver before anything starts and handed to the learner ranks through the object store."""

from __future__ import annotations

from typing import Any

from raysim.algos import algorithm_class
from raysim.config import Config
from raysim.identity import current_form, differences


def read_demonstrations(config: Config, spaces: tuple, canonical_env: dict[str, Any]) -> Any:
    """The algorithm's dataset (``Algorithm.dataset``; None: it trains on none), read here (``raysim.demos``:
    Minari, an optional extra) and checked against the env and ``model.action_transform`` before anything starts;
    with their transitions for an off-policy algorithm. A line when it was recorded on another env than this run's
    (``canonical_env``), as ``model.init_from`` says it: another task's demonstrations are allowed where the spaces
    fit (the frame stack is not compared: a dataset keeps the env's own observations)."""
    algorithm = algorithm_class(config.algo.name)
    found = algorithm.dataset(config.algo)
    if found is None:
        return None
    from raysim.demos import load_demonstrations

    key, dataset = found
    transform, frame_stack = config.model.action_transform, config.env.frame_stack
    demonstrations = load_demonstrations(dataset, *spaces, frame_stack, transform, transitions=algorithm.off_policy)
    saved = demonstrations.metadata.get("canonical_env")
    if isinstance(saved, dict):
        saved = current_form(saved) if saved.get("id") == canonical_env["id"] else saved  # its id's defaults filled in
        unstacked = [{k: v for k, v in env.items() if k != "frame_stack"} for env in (saved, canonical_env)]
        lines = differences(*unstacked, prefix="env.", source="the dataset")
        if lines:
            more = f" (and {len(lines) - 3} more)" if len(lines) > 3 else ""
            print(
                f"raysim: {key}: {dataset} was recorded on another env than this run's: {'; '.join(lines[:3])}"
                f"{more} (allowed: its observations and actions fit this env)",
                flush=True,
            )
    return demonstrations
