"""``derive_seed(seed, *keys)``: the one way raysim splits a seed into independent seeds."""

from __future__ import annotations

import numpy as np


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed determined by ``seed`` and ``keys`` alone (e.g. shard index, row, episode).

    Uses NumPy's ``SeedSequence`` hashing, so nearby inputs give unrelated streams and the result
    does not depend on how many seeds were derived before it.
    """
    words = [int(x) & 0xFFFFFFFFFFFFFFFF for x in (seed, len(keys), *keys)]
    state = np.random.SeedSequence(words).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))
