"""The CPU of a test run, process by process, from Linux's process accounting (``docs/testing.md``):

    apt-get install -y acct && touch /tmp/pacct && accton /tmp/pacct  # as root
    python -m pytest -q -n 2
    accton off && python -m tests.support.suite_processes /tmp/pacct

Every process that ended while accounting was on is one record (its own CPU time, its parent). Ray's worker
processes (the actors) are the children of a raylet but its agents; the pytest workers are the long-lived children
of the process that started the busiest one; the rest is Ray's own processes and the tests' subprocesses.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass

RAY_AGENTS = ("ray::RuntimeEnv", "ray::DashboardA")  # a raylet's children that are not workers (names cut at 15)


@dataclass(frozen=True)
class Process:
    command: str
    cpu: float  # seconds, user and system
    wall: float  # seconds
    pid: int
    ppid: int


def parse(dump: str) -> list[Process]:
    """The records ``dump-acct`` printed (``comm|v3|utime|stime|etime|uid|gid|mem|io|pid|ppid|...``; 1/100 s)."""
    processes = []
    for line in dump.splitlines():
        f = [field.strip() for field in line.split("|")]
        cpu, wall = (float(f[2]) + float(f[3])) / 100, float(f[4]) / 100
        processes.append(Process(f[0], cpu, wall, int(f[9]), int(f[10])))
    return processes


def roles(processes: list[Process]) -> dict[str, tuple[int, float]]:
    """Processes and CPU seconds of each role."""
    raylets = {p.ppid for p in processes if p.command.startswith("ray::") and not p.command.startswith(RAY_AGENTS)}
    controller = max(processes, key=lambda p: p.cpu).ppid
    children = [p for p in processes if p.ppid == controller]
    workers = {p.pid for p in children if p.wall > 0.8 * max(c.wall for c in children)}
    found: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for p in processes:
        if p.ppid in raylets and not p.command.startswith(RAY_AGENTS):
            role = "Ray's worker processes (actors)"
        elif p.pid in workers:
            role = "the pytest workers"
        else:
            role = "the rest (Ray's own processes, subprocesses)"
        found[role][0] += 1
        found[role][1] += p.cpu
    return {role: (count, cpu) for role, (count, cpu) in found.items()}


def main(path: str) -> None:
    dump = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True).stdout
    found = roles(parse(dump))
    total = sum(cpu for _, cpu in found.values())
    for role, (count, cpu) in sorted(found.items(), key=lambda item: -item[1][1]):
        print(f"{role:48} {count:5d} processes {cpu:8.1f} CPU-s {cpu / total:6.1%}")
    print(f"{'total':48} {sum(count for count, _ in found.values()):5d} processes {total:8.1f} CPU-s")


if __name__ == "__main__":
    main(sys.argv[1])
