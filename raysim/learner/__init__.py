"""The learner role: the ``Learner`` (model, optimizer, the algorithm's update), its ranks, its group."""

from raysim.learner.group import LearnerGroup
from raysim.learner.learner import Learner
from raysim.learner.ranks import RankError, RankGroup
from raysim.models import resolve_device

__all__ = ["Learner", "LearnerGroup", "RankError", "RankGroup", "resolve_device"]
