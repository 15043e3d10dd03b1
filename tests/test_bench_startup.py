"""The start-up benchmark's table (``raysim bench startup``; its measurements start Ray: run by hand)."""

import pytest

from raysim.bench.startup import main, report


def test_the_table_sets_raysims_start_up_beside_rays_floor_with_their_difference():
    floors = [{"init": 3.0, "actors": 1.5, "total": 4.5}, {"init": 3.2, "actors": 1.3, "total": 4.5}]
    runs = [
        {"preflight": 0.1, "train_startup": 4.7, "total": 4.8},
        {"preflight": 0.1, "train_startup": 5.1, "total": 5.2},
    ]
    out = report("cartpole_ppo", floors, runs)
    assert "| **Ray floor, total** | 4.50 (4.50-4.50) |" in out
    assert "| **raysim, total** | 5.00 (4.80-5.20) |" in out
    assert "| Ray floor: ray.init (as raysim starts it) | 3.10 (3.00-3.20) |" in out
    assert out.endswith("raysim - floor: +0.50 s (medians); raysim / floor: 1.11x")


def test_a_repeat_count_below_one_is_refused():
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])
