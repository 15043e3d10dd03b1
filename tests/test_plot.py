"""``raysim plot``: a real PNG from a real run, the Wilson band from evaluation files, core imports no plotting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import raysim
from raysim.cli import main
from raysim.evaluation import wilson, write_records
from raysim.metrics import ParquetSink
from raysim.plot import metric_columns, plot_run, read_evaluations
from raysim.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"
TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=768",
    "eval.episodes=4",
    "eval.num_envs=2",
    "train.log_every=1",
    "train.sinks=[parquet]",
]


def assert_real_png(path: Path | str) -> None:
    import matplotlib.image

    assert Path(path).read_bytes()[:8] == PNG
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
    flat = pixels[..., :3].reshape(-1, 3)
    assert (flat != flat[0]).any(axis=1).mean() > 0.01  # drawn content, not one colour
    assert len(np.unique(flat, axis=0)) > 10


def test_raysim_plot_draws_a_png_from_a_real_run_with_evaluations(tmp_path, capsys):
    run_dir = tmp_path / "run"
    raysim.Trainer(raysim.load_config(None, [*TINY, "eval.every=2", f"run_dir={run_dir}"])).train()
    assert main(["plot", str(run_dir)]) == 0
    assert f"plot: {run_dir / 'plots.png'}" in capsys.readouterr().out
    assert_real_png(run_dir / "plots.png")

    storage = open_storage(run_dir)
    evaluations = read_evaluations(storage, metric_columns(storage), 0.95)
    assert [p.iteration for p in evaluations] == [2, 4, 6]  # eval.every=2, and the final one
    assert [p.env_steps for p in evaluations] == [256, 512, 768]
    assert all(p.completed == 4 and p.successes is None for p in evaluations)  # CartPole defines no success

    out = tmp_path / "elsewhere" / "curves.png"
    assert main(["plot", str(run_dir), "--out", str(out)]) == 0
    assert_real_png(out)


def test_the_success_rate_panel_uses_k_over_c_with_wilson_intervals(tmp_path):
    sink = ParquetSink(open_storage(tmp_path))
    for i in range(1, 5):
        sink.write(
            {
                "iteration": i,
                "env_steps": 100 * i,
                "episode_return": float(i),
                "pg_loss": -0.1 * i,
                "v_loss": 1.0 / i,
                "entropy": 0.5,
            }
        )
    outcomes = {2: [True, False, False, False], 4: [True, True, True, False, True]}
    for iteration, successes in outcomes.items():
        write_records(
            tmp_path / "eval" / f"{iteration}.parquet",
            [{"row": r, "episode": 0, "return": float(s), "length": 10, "success": s} for r, s in enumerate(successes)],
        )
    sink.close()
    points = read_evaluations(open_storage(tmp_path), metric_columns(open_storage(tmp_path)), 0.9)
    assert [(p.iteration, p.env_steps, p.successes, p.completed) for p in points] == [(2, 200, 1, 4), (4, 400, 4, 5)]
    assert points[1].interval == pytest.approx(wilson(4, 5, 0.9))
    assert_real_png(plot_run(tmp_path))


def test_plot_of_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no metrics rows: is it a raysim run directory?" in capsys.readouterr().err


def test_the_core_and_the_trainer_never_import_plotting():
    code = (
        "import sys, raysim, raysim.coordinator, raysim.envs, raysim.rollout.shard, raysim.algos.ppo, raysim.cli; "
        "print(sorted(m for m in sys.modules if m == 'raysim.plot' or m.split('.')[0] == 'matplotlib'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
