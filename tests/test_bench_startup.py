"""Smoke test of the start-up benchmark (``raysim bench startup``): both kinds measured, the table printed."""

import re

import pytest

from raysim.bench.startup import main


def test_one_repeat_measures_the_floor_and_raysim_and_prints_their_difference(capsys):
    assert main(["--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("Ray floor, total", "raysim, total"):
        match = re.search(rf"^\| \*\*{re.escape(row)}\*\* \| ([0-9.]+) \(", out, re.M)
        assert match and float(match.group(1)) > 0, f"no row {row}:\n{out}"
    assert re.search(r"^raysim - floor: [+-][0-9.]+ s \(medians\); raysim / floor: [0-9.]+x$", out, re.M), out


def test_a_repeat_count_below_one_is_refused():
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])
