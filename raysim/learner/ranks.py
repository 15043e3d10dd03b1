"""``RankGroup``: the learner's ranks as one torch.distributed group (data-parallel training).

Rendezvous, the collectives the algorithms use (``gather``, ``all_reduce``; see
``raysim.algos.collectives``) and the agreement on errors after a step that can fail on one rank
only. With one rank every collective is the identity and nothing is initialized, so a learner runs
in-process without torch.distributed.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist


class RankError(RuntimeError):
    """A step failed on at least one learner rank; every rank raises this same error."""


class RankGroup:
    """Rank ``rank`` of ``world_size`` (gloo on CPU, NCCL on GPU), on ``device``."""

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0: an address and a free port for the group's rendezvous."""
        host = socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind(("", 0))
            return host, probe.getsockname()[1]

    def join(self, host: str, port: int) -> None:
        """Join the group at rank 0's ``host:port``."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size)

    def gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``local`` (same shape on all ranks), in rank order: one all-gather."""
        if self.world_size == 1:
            return [local]
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return parts

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
