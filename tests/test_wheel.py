"""raysim works installed from a built wheel, outside the source tree."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def setuptools_major() -> int:
    return int(importlib.metadata.version("setuptools").split(".")[0])


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the raysim wheel; the dependencies come from this interpreter's site-packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Without the source tree on PYTHONPATH (the ray_session fixture puts it there for Ray's workers):
    # pip would find raysim already importable and install nothing.
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT)]
    if importlib.util.find_spec("setuptools") is not None and setuptools_major() >= 77:  # pyproject's build-system
        build.insert(4, "--no-build-isolation")
    subprocess.run(build, check=True, cwd=tmp, env=environ)
    wheels = list((tmp / "dist").glob("raysim-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # Dependencies: this interpreter's site-packages, after the venv's own (a path line, no .pth processing).
    Path(site, "outer_site.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheels[0])],
        check=True,
        cwd=tmp,
        env=environ,
    )
    return env_dir


def run(env_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    return subprocess.run(
        [str(env_dir / "bin" / a) if i == 0 else a for i, a in enumerate(args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environ,
        timeout=300,
    )


@pytest.mark.slow  # a wheel built and installed into a venv of its own (the module's)
def test_wheel_installs_a_raysim_that_imports_from_the_venv_not_the_source_tree(wheel_venv: Path, tmp_path: Path):
    packaged = "(c.PACKAGED_CONFIGS / 'cartpole_ppo.yaml').is_file()"
    code = f"import raysim, raysim.config as c; print(raysim.__file__, {packaged})"
    result = run(wheel_venv, "python", "-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(wheel_venv) in result.stdout and str(ROOT) not in result.stdout
    assert result.stdout.split()[-1] == "True"


@pytest.mark.slow  # a wheel built and installed into a venv of its own (the module's)
def test_wheel_cli_shows_help(wheel_venv: Path, tmp_path: Path):
    result = run(wheel_venv, "raysim", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout and "bench" in result.stdout


@pytest.mark.slow  # a wheel built and installed into a venv of its own (the module's)
def test_wheel_trains_briefly_with_its_packaged_default_config(wheel_venv: Path, tmp_path: Path):
    result = run(
        wheel_venv,
        "raysim",
        "train",
        "--local",
        "--set",
        "train.total_steps=2048",
        "--set",
        "eval.episodes=5",
        "--run-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "done: 2,048 env steps" in result.stdout
    assert (tmp_path / "run" / "configs" / "train.yaml").is_file()


@pytest.mark.slow  # a wheel built and installed into a venv of its own (the module's)
def test_wheel_runs_a_short_collection_benchmark(wheel_venv: Path, tmp_path: Path):
    result = run(wheel_venv, "raysim", "bench", "collect", "--quick", "--no-ray", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^\| raysim in-process +\| 1 +\|", result.stdout, re.M)  # raysim's own rows run anywhere
    assert "Gymnasium SyncVectorEnv |" not in result.stdout  # the peers are in the source tree only...
    assert "peers (Gymnasium, EnvPool): the peers live in the source tree's benchmarks/" in result.stdout  # ...said so


@pytest.mark.slow
def test_wheel_runs_the_solve_benchmark_with_raysims_rows_and_says_the_peers_are_skipped(
    wheel_venv: Path, tmp_path: Path
):
    result = run(
        wheel_venv,
        "raysim",
        "bench",
        "solve",
        "--seeds",
        "1",
        "--override",
        "train.total_steps=2048",
        "--override",
        "backend=local",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^\| raysim \| 1 \|", result.stdout, re.M)
    assert "Skipped cleanrl: the peers live in the source tree's benchmarks/" in result.stdout
