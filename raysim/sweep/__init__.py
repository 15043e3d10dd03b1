"""Hyperparameter sweeps: many raysim runs as Ray Tune trials (``raysim tune``, ``raysim.tune``)."""

from raysim.sweep.space import Param, parse_param, parse_spec
from raysim.sweep.sweep import resume, tune

__all__ = ["Param", "parse_param", "parse_spec", "resume", "tune"]
