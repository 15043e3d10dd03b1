"""Smoke tests of ``raysim bench metaworld``: three contestants side by side and their ratios (no times asserted)."""

import re

import pytest
import torch

pytest.importorskip("metaworld")

from raysim.bench.metaworld import main  # noqa: E402
from raysim.cli import main as cli_main  # noqa: E402


def test_a_tiny_run_prints_each_contestants_env_steps_per_second_and_raysims_ratios_to_both(capsys):
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    assert main(["--envs", "2", "--steps", "4", "--chunks", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out

    header = "| repeat | raysim env steps/s | bare loop env steps/s | CleanRL-style env steps/s "
    assert header + "| raysim / bare loop | raysim / CleanRL-style |" in re.sub(r" +\|", " |", out), out
    # a table of wall-clock figures, then one per CPU second: a row per repeat and the medians, each with both ratios
    for label in ("1", "median"):
        lines = re.findall(rf"^\| {label} +(?:\| [0-9,]+ +){{3}}(?:\| [0-9.]+x +){{2}}\|$", out, re.M)
        assert len(lines) == 2, out
    assert "| repeat | raysim env steps per CPU s |" in re.sub(r" +\|", " |", out), out
    assert "MuJoCo 3." in out and "(1 thread)" in out and "load average at the start" in out
    # the benchmark leaves the process as it found it
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_an_unknown_task_is_refused_in_one_line_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["bench", "metaworld", "--task", "reach-v9"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--task reach-v9: raysim/MetaWorld: unknown task 'reach-v9'; did you mean 'reach-v3'?" in err
    assert "Traceback" not in err
