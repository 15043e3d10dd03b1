"""A ``ray start --head`` of a test's own: free ports, its own temp dir and token, stopped by its own pids.

    with RayHead(num_cpus=2) as head:
        subprocess.run([...], env=head.env)      # clients: RAY_ADDRESS not set; head.address to attach

``ray stop`` would end every Ray on the machine, other jobs' too; ``stop`` ends only this head's processes:
those whose command line or environment names its temp dir, and their children (``stop_processes``).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


_GIVEN: set[int] = set()  # ports free_port handed out in this process: never handed out twice


def free_port() -> int:
    """A port free now and not handed out before by this process, from a range of this pytest-xdist worker's own
    (20000-32767, split by worker: two workers never pick the same port between its probe and its use; Ray's
    worker ports are 10002-19999, the kernel's ephemeral ones from 32768)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; "" without xdist
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker.startswith("gw") else 0
    width = (32768 - 20000) // max(count, 1)
    low = 20000 + index * width
    for port in random.Random().sample(range(low, low + width), 200):
        if port in _GIVEN:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("", port))  # every address: a port another process holds on any is not free
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{low + width - 1}")


def process_table() -> dict[int, tuple[int, str, bytes]]:
    """Every live process but this one: pid -> (parent pid, start time, command line and environment); a zombie
    (ended, not yet reaped by its parent) is left out."""
    table = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            names = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        try:
            names += (proc / "environ").read_bytes()
        except OSError:
            pass
        if stat[0] != "Z":
            table[int(proc.name)] = (int(stat[1]), stat[19], names)
    return table


def processes(markers: list[str]) -> dict[int, str]:
    """Every live process whose command line or environment names one of ``markers``, and their descendants (the
    raylets' agents: titles in place of command lines): pid -> start time (a pid used again is another process)."""
    table = process_table()
    found = {pid: row[1] for pid, row in table.items() if any(m.encode() in row[2] for m in markers)}
    while children := {pid: row[1] for pid, row in table.items() if row[0] in found and pid not in found}:
        found.update(children)
    return found


def stop_processes(*markers: str, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL to what is left after ``grace`` seconds, every process of ``processes(markers)``
    (found before any is ended: the raylets' agents are found as their children, and can outlive them; the Ray
    client server ``ray start`` leaves names a head's temp dir only in its environment); each round returns once
    none is left."""
    found = processes(list(markers))

    def left() -> list[int]:
        alive = []
        for pid, start in found.items():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[0] != "Z" and stat[19] == start:
                alive.append(pid)
        return alive

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)


class RayHead:
    """A token-authenticated Ray head on free ports; ``env`` is what a client process needs."""

    def __init__(self, num_cpus: int = 2, dashboard: bool = False, resources: str | None = None, grace: float = 2.0):
        self.grace = grace  # seconds ``stop`` gives the processes after SIGTERM (the GCS and raylet take > 1 s)
        self.base = tempfile.mkdtemp(prefix="rsh", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.port, self.dashboard_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_TMPDIR=self.base)
        self.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), self.env.get("PATH", "")])
        self.command = [
            RAY,
            "start",
            "--head",
            "--port",
            str(self.port),
            "--num-cpus",
            str(num_cpus),
            "--temp-dir",
            os.path.join(self.base, "ray"),
            "--disable-usage-stats",
        ]
        if dashboard:
            self.command += ["--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port)]
        else:
            self.command += ["--include-dashboard=false"]
        if resources:
            self.command += ["--resources", resources]
        for flag in (
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
            "--ray-client-server-port",
        ):
            self.command += [flag, str(free_port())]  # no clash with another Ray on this machine

    def __enter__(self) -> RayHead:
        try:
            subprocess.run(self.command, check=True, capture_output=True, text=True, env=self.env, timeout=120)
        except BaseException:  # a start that failed or timed out (a loaded machine) leaves no processes behind
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End this head's processes only (``stop_processes`` by its temp dir), then remove its temp dir."""
        stop_processes(self.base, grace=self.grace)
        shutil.rmtree(self.base, ignore_errors=True)  # its sessions' logs and sockets
