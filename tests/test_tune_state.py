"""Tune's state in an experiment directory cut short by a killed driver: mended from Ray's staging copy, or the
resume refused in one line (``raysim.sweep.tune_state``). The kill itself, on a real sweep: tests/test_sweep.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from raysim.storage import LocalStorage
from raysim.sweep.tune_state import TuneStateError, mend

STATE = "experiment_state-2026-12-06_23-30-21.json"
SEARCHER = "basic-variant-state-2026-12-06_23-30-21.json"


def experiment(root: Path, cut: str) -> Path:
    """An experiment directory with Tune's three files, ``cut`` left empty (a copy the kill cut short)."""
    folder = root / "runs" / "asha"
    folder.mkdir(parents=True)
    whole = {
        STATE: json.dumps({"trial_data": []}).encode(),
        SEARCHER: pickle.dumps({"n": 4}),
        "tuner.pkl": pickle.dumps(["tuner"]),
    }
    for name, data in whole.items():
        (folder / name).write_bytes(b"" if name == cut else data)
    return folder


def staging(ray_temp: Path, name: str, data: bytes) -> None:
    folder = ray_temp / "session_2026-12-06_23-30-00_1" / "artifacts" / "2026-12-06_23-30-20" / "asha"
    (folder / "driver_artifacts").mkdir(parents=True)
    (folder / "driver_artifacts" / name).write_bytes(data)


@pytest.mark.parametrize("cut", [STATE, SEARCHER])
def test_a_state_file_cut_short_is_replaced_by_rays_staging_copy_and_the_others_are_left_alone(tmp_path, cut):
    folder = experiment(tmp_path, cut)
    whole = json.dumps({"trial_data": [["a", "b"]]}).encode() if cut == STATE else pickle.dumps({"n": 4})
    staging(tmp_path / "ray", cut, whole)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != cut}
    assert mend(LocalStorage(folder), tmp_path / "ray") == [cut]
    assert (folder / cut).read_bytes() == whole
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != cut} == before


def test_an_intact_experiment_is_not_touched(tmp_path):
    folder = experiment(tmp_path, cut="")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert mend(LocalStorage(folder), None) == []
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


def test_a_cut_file_without_an_intact_copy_refuses_the_resume_naming_the_file(tmp_path):
    folder = experiment(tmp_path, SEARCHER)
    staging(tmp_path / "ray", SEARCHER, b"\x80\x04")  # Ray's copy is cut too: not used
    with pytest.raises(TuneStateError) as refused:
        mend(LocalStorage(folder), tmp_path / "ray")
    assert f"{folder / SEARCHER} is cut short" in str(refused.value)
    assert "start it again in a new --dir" in str(refused.value) and (folder / SEARCHER).read_bytes() == b""
