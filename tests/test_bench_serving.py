"""The serving benchmark's table (``raysim bench serving``): its in-process parts, tiny; the Ray ways run by hand."""

import json

import pytest

from raysim.bench.serving import INPROC, MEMCPY, main


def test_the_tiny_in_process_run_prints_a_row_per_way_and_split_and_writes_its_json_line(tmp_path, capsys):
    out = tmp_path / "serving.md"
    assert main(["--tiny", "--no-ray", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    rows = [line for line in printed.splitlines() if line.startswith("| ")][1:]  # below the column names
    assert [row.split(" | ")[1] for row in rows] == [
        MEMCPY,
        INPROC,
        MEMCPY,
        INPROC,
        "env.step",
        "Actor.sample (inference)",
        "pipelining ceiling (env + inference) / max",
    ]
    assert rows[0].startswith("| camera Reach, 4 rows (12.1 KiB obs) |")
    assert rows[-1].endswith(" x | |")
    line = json.loads((tmp_path / "serving.jsonl").read_text())
    assert line["bench"] == "serving" and len(line["rows"]) == len(rows)
    assert 1.0 <= line["rows"][-1]["value"] <= 2.0


def test_a_step_count_below_one_is_refused():
    with pytest.raises(SystemExit):
        main(["--steps", "0"])
