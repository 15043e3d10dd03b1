"""The examples of the task pages: every ``examples/*.py`` runs in its quick mode and prints the lines its page
(docs/tasks/) shows, every example is the example of a page and every page names an existing one, so neither rots."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TASKS = ROOT / "docs" / "tasks"

#: What each example's quick run prints, as its task page shows it (numbers that vary are left out).
EXPECTED = {
    "train_from_script": [
        "env steps: 2048",
        "iterations: 2",
        "evaluation: 10/10 episodes",
        "initialized after train(): True",
    ],
    "train_from_camera": [
        "observation group camera: uint8 (3, 32, 32)",
        "actor reads camera, joints: the camera through the keypoints CNN (64 features)",
        "evaluation: success ",
        "/reach_camera_ppo/videos/2.mp4",
    ],
    "custom_env": [
        "observation group camera: uint8 (16, 16, 3)",
        "examples.custom_env:Spot: 1024 env steps",
        "gym:examples.custom_env:examples/Spot-v0: 1024 env steps",
        "evaluation: success ",
    ],
    "custom_algorithm": ["algo: ReinforceConfig, critic: False", "4096 env steps: pg_loss", "over 10 episodes"],
    "evaluate_and_film": [
        "requested n 8, completed c 8",
        "success k/n ",
        "(95% Wilson)",
        "episodes 0-3 as in the unfilmed evaluation: True",
        "obs [8] -> actions (3, 2)",
    ],
    "resume_and_recover": ["resumed == straight, bitwise: True", "records equal: True", "recovered: 4 iterations"],
    "finetune_from_demonstrations": ["recorded 2 expert episodes", "behaviour cloning: 2 ", "GRPO fine-tuned: 1 "],
    "cluster_job": ["cluster: 1 node(s)", "trained 1,024 env steps in 4 iterations", "run directory: "],
    "sweep": ["2 trials, 0 failed", "algo.lr 0.00100: eval_return", "best: algo.lr ", "best config: "],
    "read_and_plot": ["metrics: 8 rows", "eval/8.parquet: 10 episodes", "at step 4096", "/returns.png", "/plots.png"],
}
#: Examples marked slow: a quick run of more than ~5 s, or of more than ~4 s on Ray (the not-slow set keeps one test
#: of a user's module on Ray's workers: tests/test_gym_adapter.py).
SLOW: set[str] = {"finetune_from_demonstrations", "sweep", "cluster_job"}
#: Examples another test runs as a user would: train_from_script in a process of its own, on a Ray it sizes itself.
ELSEWHERE = {"train_from_script": "tests/test_train.py::test_a_users_own_script_runs_the_trainer_on_its_own_ray"}
#: Examples that start Ray themselves: they run on the test session's Ray, which they find initialized.
ON_RAY = {"train_from_script", "cluster_job", "sweep"}


def examples(on_ray: bool) -> list:
    """The examples as test parameters (those on Ray, or the others), slow ones marked."""
    names = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.name.startswith("_") and p.stem not in ELSEWHERE)
    return [
        pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [], id=name)
        for name in names
        if (name in ON_RAY) == on_ray
    ]


def run_quick(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """Load ``examples/<name>.py`` by its path, run ``main(["--quick", "--out", tmp_path])`` in ``tmp_path``, check
    its exit code and the lines of EXPECTED; what it printed."""
    assert name in EXPECTED, f"examples/{name}.py: add the lines its task page shows to EXPECTED in {__file__}"
    spec = importlib.util.spec_from_file_location(f"examples.{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # as `import examples.<name>` would (dataclasses need it)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    missing = [line for line in EXPECTED[name] if line not in printed]
    assert not missing, f"examples/{name}.py --quick did not print {missing}:\n{printed[-3000:]}"
    return printed


@pytest.mark.parametrize("name", examples(on_ray=False))
def test_an_example_runs_in_its_quick_mode_and_prints_what_its_task_page_shows(name, tmp_path, monkeypatch, capsys):
    run_quick(name, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("name", examples(on_ray=True))
def test_an_example_that_starts_ray_runs_on_the_ray_it_finds_in_its_quick_mode(
    name, ray_session, tmp_path, monkeypatch, capsys
):
    run_quick(name, tmp_path, monkeypatch, capsys)
    assert ray_session.is_initialized()  # the example did not shut down the Ray it did not start


def test_every_example_is_the_example_of_a_task_page_and_every_task_page_names_an_existing_one():
    on_disk = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    named = {page.name: set(re.findall(r"examples/(\w+\.py)", page.read_text())) for page in TASKS.glob("*.md")}
    assert named, "docs/tasks/ has no page"
    for page, names in named.items():
        assert names, f"docs/tasks/{page} names no example (examples/<name>.py)"
        assert names <= on_disk, f"docs/tasks/{page} names {sorted(names - on_disk)}, which examples/ does not hold"
    unpaired = on_disk - set().union(*named.values())
    assert not unpaired, f"{sorted(unpaired)}: no docs/tasks/ page names them"
