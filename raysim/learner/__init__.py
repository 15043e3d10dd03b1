"""The learner role: the ``Learner`` (model, optimizer, the algorithm's update), its ranks, its group."""

from raysim.learner.group import LearnerGroup
from raysim.learner.learner import Learner, resolve_device
from raysim.learner.ranks import RankError, RankGroup

__all__ = ["Learner", "LearnerGroup", "RankError", "RankGroup", "resolve_device"]
