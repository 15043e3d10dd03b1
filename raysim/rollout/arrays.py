"""Tensors through pickle as NumPy arrays: Ray's zero-copy path for chunks, shard states and weights.

With pickle protocol 5 (Ray's) a NumPy array hands its memory out of band: Ray writes it into the
object store once and a reader maps it without a copy, where torch's own pickling copies every
tensor through a bytes object on both sides. ``to_arrays`` turns the tensors of a nested structure
(dicts, lists, tuples) into arrays, ``from_arrays`` turns them back, bitwise, dtype kept (a dtype
NumPy lacks, such as bfloat16, travels as its bits). The rebuilt tensors are read-only views of the
object store: copy what you keep before writing to it. ``RolloutChunk`` pickles this
way; ``ArrayDict`` gives any dict (a shard's state, the weights, a learner snapshot) the same path.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

#: Integer dtypes of each width: the bits of a tensor whose dtype NumPy lacks travel as these.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class _TensorArray:
    """A tensor as a NumPy array (and its torch dtype when NumPy has none); marks it as a tensor to rebuild."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: torch.dtype | None = None):
        self.array, self.dtype = array, dtype

    def __reduce__(self):
        return _TensorArray, (self.array, self.dtype)

    def tensor(self) -> torch.Tensor:
        with warnings.catch_warnings():  # Ray's buffers are read-only: the documented contract
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensor = torch.from_numpy(self.array)
        return tensor if self.dtype is None else tensor.view(self.dtype)


def to_arrays(value: Any) -> Any:
    """``value`` with every CPU tensor (strided, no grad) at any depth of dicts, lists and tuples as an array."""
    if _followed(value):
        return _each(to_arrays, value)
    if (
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
    ):
        try:
            return _TensorArray(value.numpy())
        except TypeError:  # a dtype NumPy lacks: its bits, as integers of the same width
            return _TensorArray(value.view(_BITS[value.element_size()]).numpy(), value.dtype)
    return value  # anything else pickles as it would have


def from_arrays(value: Any) -> Any:
    """The inverse of ``to_arrays``: every array that was a tensor is that tensor again (sharing its memory)."""
    if _followed(value):
        return _each(from_arrays, value)
    if isinstance(value, _TensorArray):
        return value.tensor()
    return value


def _followed(value: Any) -> bool:
    """The containers followed: dicts (an ``ArrayDict``, a ``state_dict``'s OrderedDict), lists and tuples, not
    their other subclasses (``torch.Size``, named tuples, ``defaultdict`` pickle as they would have)."""
    return type(value) in (dict, ArrayDict, OrderedDict, list, tuple)


def _each(function, value: dict | list | tuple) -> Any:
    """``function`` applied to each item of a followed container, rebuilt as its kind (an OrderedDict with its
    attributes: a ``state_dict``'s ``_metadata``; an ``ArrayDict`` as a plain dict)."""
    if isinstance(value, dict):
        items = {k: function(v) for k, v in value.items()}
        if type(value) is not OrderedDict:
            return items
        rebuilt = OrderedDict(items)
        rebuilt.__dict__.update(vars(value))
        return rebuilt
    return type(value)(function(v) for v in value)


class ArrayDict(dict):
    """A dict whose tensors, at any depth, pickle as NumPy arrays (``to_arrays``); it unpickles as a plain dict.

    Roles return their large states as one (``EnvShard.get_state``, ``Learner.get_weights``,
    ``Learner.snapshot``): through Ray the reader gets the plain dict, in-process ``plain`` gives it.
    """

    def __reduce__(self):
        return from_arrays, (to_arrays(dict(self)),)


def plain(value: Any) -> Any:
    """``value`` as a reader through Ray receives it: every ``ArrayDict`` (at any depth of dicts, lists and
    tuples) a plain dict, the tensors untouched (what the in-process backend hands its caller)."""
    return _each(plain, value) if _holds_array_dict(value) else value


def _holds_array_dict(value: Any) -> bool:
    if isinstance(value, ArrayDict):
        return True
    if not _followed(value):
        return False
    return any(_holds_array_dict(v) for v in (value.values() if isinstance(value, dict) else value))
