"""``RankGroup``: the learner's ranks as one torch.distributed group (data-parallel training).

Rendezvous, the collectives the algorithms use (``gather``, ``all_reduce``; see
``raysim.algos.collectives``) and the agreement on errors after a step that can fail on one rank
only. With one rank every collective is the identity and nothing is initialized, so a learner runs
in-process without torch.distributed.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class RankError(RuntimeError):
    """A step failed on at least one learner rank; every rank raises this same error."""


class RankGroup:
    """Rank ``rank`` of ``world_size`` (gloo on CPU, NCCL on GPU), on ``device``."""

    def __init__(self, rank: int, world_size: int, device: torch.device, timeout: float = 120.0):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.timeout = timedelta(seconds=timeout)
        self.store: dist.TCPStore | None = None

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0: its node's IP and the port of the rendezvous store it bound (and holds: no race for it)."""
        host = node_ip()
        self.store = dist.TCPStore(
            host, 0, self.world_size, is_master=True, timeout=self.timeout, wait_for_workers=False
        )
        return host, self.store.port

    def join(self, host: str, port: int) -> None:
        """Join the group at rank 0's ``host:port`` (a clear error when it cannot be reached in time)."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if backend == "gloo":  # gloo's data connections bind to an interface: the node IP's, not the hostname's
            interface = interface_of(node_ip())
            if interface:
                os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        try:
            store = self.store or dist.TCPStore(host, port, self.world_size, is_master=False, timeout=self.timeout)
            dist.init_process_group(
                backend, store=store, rank=self.rank, world_size=self.world_size, timeout=self.timeout
            )
        except (RuntimeError, OSError) as error:
            raise RankError(
                f"learner rank {self.rank} could not meet rank 0 at {host}:{port} within "
                f"{self.timeout.total_seconds():g} s ({str(error).splitlines()[0]}): can this node reach that "
                "address and port?"
            ) from error

    def gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``local`` (same shape on all ranks), in rank order: one all-gather."""
        if self.world_size == 1:
            return [local]
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return parts

    def gather_objects(self, local: Any) -> list[Any]:
        """Every rank's ``local`` (any picklable value), in rank order: one all-gather."""
        if self.world_size == 1:
            return [local]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, local)
        return gathered

    def all_reduce(self, flat: torch.Tensor) -> None:
        """Sum ``flat`` over the ranks, in place."""
        if self.world_size > 1:
            dist.all_reduce(flat)

    def agree(self, what: str, error: BaseException | None) -> None:
        """Agreement on errors after a step that can fail on one rank only.

        Every rank calls it with its own outcome; if any rank failed, all raise the same
        ``RankError`` naming the failing ranks and causes, so none waits in a later collective.
        """
        if self.world_size == 1:
            if error is not None:
                raise error
            return
        outcomes: list[str | None] = [None] * self.world_size
        dist.all_gather_object(outcomes, None if error is None else f"{type(error).__name__}: {error}")
        failed = [f"rank {r}: {cause}" for r, cause in enumerate(outcomes) if cause is not None]
        if failed:
            raise RankError(f"{what} failed on " + "; ".join(failed))


def node_ip() -> str:
    """This node's IP as Ray advertises it (other nodes reach it there), never a loopback address."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return sys.modules["ray"].util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # the interface of the default route
        probe.connect(("10.255.255.255", 1))  # no packet is sent
        return probe.getsockname()[0]


def interface_of(ip: str) -> str | None:
    """The network interface that holds ``ip`` (Linux; None elsewhere or when none does)."""
    try:
        import fcntl
        import struct
    except ImportError:
        return None
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None
