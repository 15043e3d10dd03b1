"""Learner ranks as threads of one process, their collectives simulated in memory (no torch.distributed).

``ThreadedRanks(R).run(fn)`` runs ``fn(rank)`` for every rank in its own thread and returns the results
in rank order; inside, ``ranks.view(rank)`` is a ``raysim.algos.collectives.Collectives`` of that rank,
and with ``patch(monkeypatch)`` the ``torch.distributed`` calls of ``raysim.learner.ranks`` (``all_reduce``,
``all_gather``, ``all_gather_object``) go to the calling thread's rank. A rank that waits in a collective the
others never enter fails after ``timeout`` seconds (``threading.BrokenBarrierError``) instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class ThreadedRanks:
    def __init__(self, world_size: int, timeout: float = 20.0):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.posted: dict[int, torch.Tensor] = {}
        self.local = threading.local()

    def _exchange(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.posted[rank] = tensor.detach().clone()
        self.barrier.wait()
        parts = [self.posted[r] for r in range(self.world_size)]
        self.barrier.wait()  # nobody posts the next collective's tensor before every rank read this one's
        return parts

    def all_reduce(self, rank: int, tensor: torch.Tensor) -> None:
        tensor.copy_(torch.stack(self._exchange(rank, tensor)).sum(0))

    def all_gather(self, rank: int, parts: list[torch.Tensor], tensor: torch.Tensor) -> None:
        for part, value in zip(parts, self._exchange(rank, tensor), strict=True):
            part.copy_(value)

    def all_gather_object(self, rank: int, parts: list[Any], value: Any) -> None:
        self.posted[rank] = value
        self.barrier.wait()
        parts[:] = [self.posted[r] for r in range(self.world_size)]
        self.barrier.wait()

    def view(self, rank: int) -> Any:
        """Rank ``rank``'s collectives (what ``GuardedStep`` and ``run_epochs`` call)."""
        group = self

        class View:
            world_size, device = group.world_size, torch.device("cpu")

            def all_reduce(self, flat: torch.Tensor) -> None:
                group.all_reduce(rank, flat)

            def gather(self, local: torch.Tensor) -> list[torch.Tensor]:
                parts = [torch.empty_like(local) for _ in range(group.world_size)]
                group.all_gather(rank, parts, local)
                return parts

        return View()

    def patch(self, monkeypatch: Any) -> None:
        """Route ``torch.distributed.all_reduce`` / ``all_gather`` of ``raysim.learner.ranks`` to the thread's rank."""
        monkeypatch.setattr("raysim.learner.ranks.dist.all_reduce", lambda t: self.all_reduce(self.local.rank, t))
        monkeypatch.setattr(
            "raysim.learner.ranks.dist.all_gather", lambda parts, t: self.all_gather(self.local.rank, parts, t)
        )
        monkeypatch.setattr(
            "raysim.learner.ranks.dist.all_gather_object",
            lambda parts, value: self.all_gather_object(self.local.rank, parts, value),
        )

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(rank)`` on every rank at once; the results in rank order (the first error is raised)."""
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException] = []

        def main(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results
