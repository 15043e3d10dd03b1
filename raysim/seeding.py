"""Seeds and noise that depend on their keys alone.

``derive_seed(seed, *keys)`` is the one way raysim splits a seed into independent seeds;
``keyed_uniform`` / ``keyed_normal`` are the one source of noise that must not depend on how rows
are batched: every value is a hash of a row's key, a counter (the step) and its column, so a row
draws the same noise in any batch, on any shard, at any batch size (counter-based noise: no
generator per row).
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: Purpose tags: the first key of a ``derive_seed`` whose purpose must not share a namespace with another.
#: Taken elsewhere: 1 a shard's sampling generator, 2 row restarts, 3 initial weights, 4 a learner rank's
#: generator, 6 GRPO group starts and fresh episodes, 10 / 11 training / evaluation shards, 12 benchmark
#: shards.
EVAL_EPISODE = 5  # (eval seed, tag, episode index j): the reset seed of evaluation episode j
EVAL_ACTION_NOISE = 7  # (eval seed, tag, episode index j): a stochastic or random evaluation's action noise
EVAL_BATCH = 8  # (eval seed, tag, first global row): a shard's rows when its env cannot reset one row
DEMONSTRATIONS = 13  # (run seed, tag): the evaluation seed demonstrations are recorded with, never eval.seed
SERVER_LOST = 14  # (tag, losses, steps done): the key of a worker's fresh episodes after its policy server died
PIPELINE_GROUP = 15  # (worker seed, tag, group): the seed of a pipelined worker's group of rows (servers.pipeline)

_MASK32 = 0xFFFFFFFF


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed determined by ``seed`` and ``keys`` alone (e.g. shard index, row, episode).

    Uses NumPy's ``SeedSequence`` hashing, so nearby inputs give unrelated streams and the result
    does not depend on how many seeds were derived before it. The number of keys is hashed too: a
    derivation never equals one with another number of keys.
    """
    words = [int(x) & 0xFFFFFFFFFFFFFFFF for x in (seed, len(keys), *keys)]
    state = np.random.SeedSequence(words).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``x * constant mod 2**32`` for ``x`` in [0, 2**32), in int64 without overflow (16-bit halves)."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash (Wellons' ``lowbias32``) of int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniform(key: torch.Tensor, counter: torch.Tensor, width: int) -> torch.Tensor:
    """Uniform draws in (0, 1), float64 ``[N, width]``: value ``[i, j]`` depends on ``(key[i], counter[i], j)`` alone.

    ``key``: int64 ``[N]`` (e.g. a ``derive_seed``); ``counter``: int64 ``[N]`` (e.g. the row's step).
    The key enters last, so two keys never share a stream; values have 32 random bits, 0 and 1 excluded.
    """
    columns = torch.arange(width, dtype=torch.int64, device=key.device)
    h = _mix32(columns + 0x9E3779B9).unsqueeze(0)
    for word in (counter & _MASK32, (key >> 32) & _MASK32, key & _MASK32):
        h = _mix32(h ^ word.unsqueeze(1))
    return (h.double() + 0.5) * 2.0**-32


def keyed_normal(
    key: torch.Tensor, counter: torch.Tensor, width: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Standard normal draws ``[N, width]`` with the keys of ``keyed_uniform`` (by inversion of its values)."""
    return (math.sqrt(2.0) * torch.erfinv(2.0 * keyed_uniform(key, counter, width) - 1.0)).to(dtype)
