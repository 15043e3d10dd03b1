"""Seeds and counter-based noise: functions of their keys alone, whatever the batch."""

from __future__ import annotations

import torch

from raysim.seeding import EVAL_ACTION_NOISE, derive_seed, keyed_normal, keyed_uniform


def keys(rows: int, episode: int = 0) -> torch.Tensor:
    return torch.tensor([derive_seed(1, EVAL_ACTION_NOISE, r, episode) for r in range(rows)])


def test_a_rows_keyed_noise_depends_on_its_key_counter_and_column_alone_not_on_the_batch():
    key, counter = keys(64), torch.arange(64) * 3
    whole = keyed_uniform(key, counter, 3)
    for rows in ([5], [63, 0, 7], list(range(10, 40))):
        assert torch.equal(keyed_uniform(key[rows], counter[rows], 3), whole[rows])
    assert torch.equal(keyed_uniform(key, counter, 5)[:, :3], whole)  # more columns: the first ones unchanged
    assert torch.equal(keyed_normal(key[[9]], counter[[9]], 2), keyed_normal(key, counter, 2)[[9]])
    assert not torch.equal(keyed_uniform(key, counter + 1, 3), whole)  # the next step draws anew
    assert not torch.equal(keyed_uniform(keys(64, episode=1), counter, 3), whole)  # so does the next episode


def test_keyed_noise_is_uniform_and_normal_and_uncorrelated_across_keys_steps_and_columns():
    key = keys(1024).repeat_interleave(16)
    counter = torch.arange(16).repeat(1024)
    u = keyed_uniform(key, counter, 4)  # 65,536 x 4 draws
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    assert u.flatten().unique().numel() > u.numel() * 0.999
    assert abs(float(u.mean()) - 0.5) < 0.003 and abs(float(u.var()) - 1 / 12) < 0.002
    sorted_u = u.flatten().sort().values  # Kolmogorov-Smirnov distance to the uniform distribution
    assert float((sorted_u - torch.linspace(0, 1, sorted_u.numel(), dtype=torch.float64)).abs().max()) < 0.01
    grid = u[:, 0].reshape(1024, 16)
    for a, b in ((grid[:, :-1], grid[:, 1:]), (grid[:-1], grid[1:]), (u[:, 0], u[:, 1])):
        assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 0.02
    z = keyed_normal(key, counter, 4)
    assert z.dtype == torch.float32 and abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert abs(float((z.abs() > 1.959964).float().mean()) - 0.05) < 0.003  # the tails of N(0, 1)
