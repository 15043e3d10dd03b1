"""A ``ray start --head`` of a test's own: free ports, its own temp dir and token, stopped by its own pids.

    with RayHead(num_cpus=2) as head:
        subprocess.run([...], env=head.env)      # clients: RAY_ADDRESS not set; head.address to attach

``ray stop`` would end every Ray on the machine, other jobs' too; ``stop`` ends only this head's processes:
those whose command line or environment names its temp dir, and their children (``pids``).
"""

from __future__ import annotations

import os
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


class RayHead:
    """A token-authenticated Ray head on free ports; ``env`` is what a client process needs."""

    def __init__(self, num_cpus: int = 2, dashboard: bool = False, resources: str | None = None, grace: float = 2.0):
        self.grace = grace  # seconds ``stop`` gives the processes after SIGTERM (the GCS and raylet take > 1 s)
        self.seen: dict[int, str] = {}  # this head's pids and their start times (see ``pids``)
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

    def pids(self) -> list[int]:
        """This head's processes: those whose command line or environment names its temp dir, and their children
        (the Ray client server ``ray start`` leaves has it only in its environment; the raylets' agents,
        ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``, retitle themselves). Children are remembered while
        their parents run, since they can outlive them; a remembered pid whose start time changed is not ours."""
        table = process_table()
        self.seen = {pid: start for pid, start in self.seen.items() if table.get(pid, (0, ""))[1] == start}
        self.seen.update({pid: row[1] for pid, row in table.items() if self.base.encode() in row[2]})
        while children := {pid: row[1] for pid, row in table.items() if row[0] in self.seen and pid not in self.seen}:
            self.seen.update(children)
        return sorted(self.seen)

    def stop(self) -> None:
        """End this head's processes only (by the temp dir in their command lines): SIGTERM, then SIGKILL to what
        is left after ``grace`` seconds; each round returns as soon as none is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + self.grace
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.1)
        shutil.rmtree(self.base, ignore_errors=True)  # its sessions' logs and sockets
