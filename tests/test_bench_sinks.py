"""The sinks benchmark's table (``raysim bench sinks``; its measurements train for minutes: run by hand)."""

import pytest

from raysim.bench.sinks import PARQUET, WANDB, parse, table


def test_the_table_sets_each_settings_steps_per_second_with_wandb_beside_parquet_alone():
    results = {
        5: {PARQUET: [1000.0, 1100.0, 900.0], WANDB: [950.0, 1000.0, 900.0]},
        1: {PARQUET: [800.0], WANDB: [400.0]},
    }
    lines = table(results, "header").splitlines()
    assert lines[0] == "header"
    assert lines[4].startswith("| 5 | 1,000 (900-1,100) | 950 (900-1,000) | 0.950x | 0.950x | -50 (")  # Welch's
    assert lines[5] == "| 1 | 800 (800-800) | 400 (400-400) | 0.500x | 0.500x | - |"  # one run: no interval


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--steps", "0"], ["--log-every", "5", "0"]])
def test_counts_below_one_are_refused(args):
    with pytest.raises(SystemExit):
        parse(args)
