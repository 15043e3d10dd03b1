"""Datasets of demonstrations, in Minari's format: episodes recorded through the evaluation path and read back.

``raysim demos record`` plays a policy's episodes as an evaluation does (balanced, seeded; a run's actor, the
scripted expert, random actions) and writes them as a Minari dataset (``raysim.demos.writing``; the driver side
is ``raysim.coordinator.demonstrations``); ``load_demonstrations`` reads one back as ``Demonstrations``, the
steps as the policy sees them, for behaviour cloning (``algo.name: bc``). Minari is an extra:
``pip install "raysim[demos]"``; importing this package does not need it.
"""

from raysim.demos.dataset import DatasetError, dataset_info, load_demonstrations
from raysim.demos.demonstrations import Demonstrations

__all__ = ["DatasetError", "Demonstrations", "dataset_info", "load_demonstrations"]
