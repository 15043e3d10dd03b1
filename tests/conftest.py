"""Shared test setup: the package on ``sys.path`` and one embedded Ray for the tests that ask for it."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # a checkout that was not pip-installed
    sys.path.insert(0, ROOT)

torch.set_num_threads(1)

# The suite starts hundreds of Python processes (drivers, Ray's workers, heads): each compiles raysim's modules again
# where no bytecode is kept (PYTHONDONTWRITEBYTECODE, set on some CI machines): ~0.15 CPU-s a process. Keep it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


# Tests that start clusters, heads or sweeps of their own: many CPU-bound processes each. Two of them at once on two
# cores run ~2-3.5x slower each (measured: docs/testing.md), so under pytest-xdist they run one after the other, on
# one worker, while the other worker runs the rest.
ONE_AT_A_TIME = (
    "tests/test_autoscaling.py",
    "tests/test_cluster.py",
    "tests/test_multinode.py",
    "tests/test_resources.py",
    "tests/test_second_host.py",
    "tests/test_sweep.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``-n 2``), what runs together on one worker: see ``WorkUnits``."""
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    together = "tests started one at a time"

    class OneAtATimeFirst(OrderedDict):
        """The work queue, in the collection's order but for the one-at-a-time unit, the longest: first."""

        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            if key == together:
                self.move_to_end(key, last=False)

    class WorkUnits(LoadScopeScheduling):
        """The work units the workers take one at a time: the tests of ``ONE_AT_A_TIME`` as one unit, first; a
        module with a module-scoped fixture (a trained run, a cluster, a sweep) as one, so the fixture is built
        once; every other test alone (the finest balance)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = OneAtATimeFirst()
            config.option.loadscopereorder = False  # not by test count: the order above

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in ONE_AT_A_TIME:
                return together
            return module if shares_module_fixture(config.rootpath / module) else nodeid

    return WorkUnits(config, log)


def shares_module_fixture(path: Path) -> bool:
    """Whether the test module at ``path`` defines a module-scoped fixture."""
    return 'scope="module"' in path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def ray_session():
    """The one Ray of the test session (4 CPUs, no dashboard); shut down after the last test."""
    import ray

    # Ray's workers inherit the environment: let them import raysim from this checkout too.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, saved) if p)
    try:
        # address="local": a Ray of its own, never one another job on this machine started
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(autouse=True)
def ray_session_left_empty(request):
    """After a test that used the session's Ray: its actors are gone and every CPU is free again.

    An actor lives as long as a handle to it: a handle caught in a reference cycle (a frame kept by a
    traceback, e.g. ``pytest.raises``) would hold its CPUs until the next full garbage collection, and a
    later test would wait for them. The cycle is collected here; a test that still holds CPUs fails by name.
    """
    yield
    if "ray_session" not in request.fixturenames:
        return
    import ray

    if not ray.is_initialized():
        return
    gc.collect()
    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < total and time.monotonic() < deadline:
        time.sleep(0.1)
    free = ray.available_resources().get("CPU", 0.0)
    assert free == total, f"{request.node.nodeid} left Ray actors holding {total - free:g} of {total:g} CPUs"


@pytest.fixture
def ray_never_starts(monkeypatch):
    """No Ray in this process as far as raysim can tell (the test session's may run), and ``ray.init`` replaced:
    a call is recorded (and fails), so a test can assert that Ray was never started or attached to."""
    import ray

    calls = []

    def refuse(*args, **kwargs):
        calls.append((args, kwargs))
        raise RuntimeError("this test expects the command to stop before Ray starts")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    return calls


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (mounting needs root); skipped, saying why, where it is not permitted."""
    from tests.support.tmpfs import mounted_tmpfs  # the checkout is on sys.path from here on

    with mounted_tmpfs(tmp_path, "size=1m", "a small tmpfs") as mount:
        yield mount
