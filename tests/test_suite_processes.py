"""The tool behind docs/testing.md's CPU by process: records of ``dump-acct`` sorted into roles."""

from __future__ import annotations

from tests.support.suite_processes import parse, roles


def record(command: str, cpu: float, wall: float, pid: int, ppid: int) -> str:
    """One line as ``dump-acct`` prints it (times in 1/100 s, all as user time)."""
    times = f"{cpu * 100:9.2f}|     0.00|{wall * 100:9.2f}"
    return f"{command:16}|v3|{times}|     0|     0|  1000.00|     0.00|{pid:8d}|{ppid:8d}|     |       0|__      |-"


def test_actors_pytest_workers_and_the_rest_are_told_apart_by_their_parents():
    dump = "\n".join(
        [
            record("python", 5.0, 800.0, 10, 1),  # pytest's controller
            record("resolver-execut", 280.0, 790.0, 11, 10),  # worker gw0: its last thread's name
            record("default-executo", 100.0, 780.0, 12, 10),  # worker gw1
            record("python", 2.0, 30.0, 13, 10),  # a subprocess of the controller, short-lived
            record("raylet", 7.0, 700.0, 20, 11),  # gw0's session Ray
            record("ray::EnvShard", 3.0, 10.0, 21, 20),
            record("jemalloc_bg_thd", 3.5, 12.0, 22, 20),  # an actor recorded by its last thread's name
            record("ray::DashboardA", 8.0, 700.0, 23, 20),  # the raylet's agent: Ray's own
        ]
    )
    processes = parse(dump)
    assert processes[1].cpu == 280.0 and processes[1].ppid == 10
    found = roles(processes)
    assert found["Ray's worker processes (actors)"] == (2, 6.5)
    assert found["the pytest workers"] == (2, 380.0)
    assert found["the rest (Ray's own processes, subprocesses)"] == (4, 22.0)
