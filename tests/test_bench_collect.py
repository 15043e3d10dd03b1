"""Smoke tests of the collection benchmark: the table without Ray (``--quick --no-ray``), and its Ray rows."""

import re

import pytest
import torch

from raysim.bench.collect import main


def test_quick_run_prints_the_table(capsys):
    threads = torch.get_num_threads()
    rng = torch.random.get_rng_state()
    assert main(["--quick", "--no-ray"]) == 0
    out = capsys.readouterr().out

    assert "# raysim collection benchmark" in out
    assert f"torch {torch.__version__}" in out
    rows = ("raysim in-process", "raysim in-process, LSTM", "Gymnasium SyncVectorEnv", "Gymnasium CartPoleVectorEnv")
    for row in rows:
        for n in (1, 64):
            # a Markdown row: name, N, a positive median in ms, min-max, ...
            match = re.search(rf"^\| {re.escape(row)} +\| {n} +\| ([0-9.]+) +\| [0-9.]+-[0-9.]+ +\|", out, re.M)
            assert match, f"no table row for {row} at N={n}:\n{out}"
            assert float(match.group(1)) > 0
    assert "raysim Ray actor" not in out
    # the LSTM row beside the feed-forward one, in the same run: steps/s of both and the time ratio
    for n in (1, 64):
        assert re.search(
            rf"^\| LSTM +\| {n} +\| [0-9,]+ +\| [0-9,]+ +\| [0-9.]+x +\| [0-9.]+ +\| [0-9.]+x +\|$", out, re.M
        ), out
    assert "GRU" not in out
    assert "Compute floor" in out and "Peak resident memory" in out
    # the sync baseline is its own reference
    assert re.search(r"^\| Gymnasium SyncVectorEnv +\| 1 +\|.*\| 1\.00x +\|", out, re.M)
    # the benchmark leaves the process as it found it
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_the_recurrent_rows_are_the_kinds_asked_for(capsys):
    assert (
        main(["--no-ray", "--envs", "2", "--steps", "4", "--warmups", "0", "--samples", "1", "--recurrent", "gru"]) == 0
    )
    out = capsys.readouterr().out
    assert re.search(r"^\| raysim in-process, GRU +\| 2 +\| [0-9.]+ +\|", out, re.M), out
    # feed-forward and recurrent steps/s, their ratio, the bare cell loop's ms and the ratio to that floor
    assert re.search(r"^\| GRU +\| 2 +\| [0-9,]+ +\| [0-9,]+ +\| [0-9.]+x +\| [0-9.]+ +\| [0-9.]+x +\|$", out, re.M), (
        out
    )
    assert "LSTM" not in out

    assert main(["--no-ray", "--envs", "2", "--steps", "4", "--warmups", "0", "--samples", "1", "--recurrent"]) == 0
    out = capsys.readouterr().out
    assert "raysim in-process " in out and "GRU" not in out and "LSTM" not in out and "## Recurrent" not in out


def test_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["--envs", "0", "--no-ray"])


@pytest.mark.slow  # Ray actors of a benchmark run: the full suite's
def test_the_ray_rows_include_the_steady_state_shard_and_leave_no_actor_behind(ray_session, capsys):
    assert main(["--quick", "--envs", "1", "--scale"]) == 0
    out = capsys.readouterr().out
    for row in ("raysim Ray actor", "raysim Ray actor, steady state"):
        match = re.search(rf"^\| {re.escape(row)} +\| 1 +\| ([0-9.]+) +\|", out, re.M)
        assert match and float(match.group(1)) > 0, f"no table row for {row}:\n{out}"
    assert ray_session.is_initialized()  # a Ray it did not start stays up (its actors go: ray_session_left_empty)


@pytest.mark.slow  # Ray actors of a benchmark run: the full suite's
def test_the_image_rows_time_a_camera_and_an_atari_chunk_against_numpy_and_memcpy(ray_session, capsys):
    args = ["--quick", "--envs", "1", "--steps", "4", "--images", "--image-envs", "2", "--samples", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "## Images" in out
    for payload, images in (("camera Reach", 5 * 2 * 3 * 32 * 32), ("Atari-sized 4x84x84", 5 * 2 * 4 * 84 * 84)):
        cells = re.search(rf"^\| {re.escape(payload)} +\|(.*)\|$", out, re.M).group(1).split("|")
        chunk_mib, image_mib = float(cells[0]), cells[1].split()
        assert float(image_mib[0]) == pytest.approx(images / 2**20, abs=0.06)  # uint8: a byte per pixel
        assert float(image_mib[1].strip("()")) == pytest.approx(4 * images / 2**20, abs=0.06)  # as float32
        assert chunk_mib >= float(image_mib[0])
        memcpy, _, numpy, chunk = (float(c.split()[0]) for c in cells[2:6])
        assert min(memcpy, numpy, chunk) > 0
        assert cells[6].strip().endswith("x") and "%" in cells[7]  # chunk speed vs NumPy; memcpy fractions
        assert re.search(rf"^\| {re.escape(payload)} +\| [0-9]+ +\| [0-9]+ +\|$", out, re.M)  # peak RSS of both
    assert re.search(r"driver [0-9]+", out)


def test_the_image_rows_need_ray(capsys):
    with pytest.raises(SystemExit):
        main(["--quick", "--no-ray", "--images"])
