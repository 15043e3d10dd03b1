"""A fake ``wandb`` module: what raysim's W&B sink uses of it, every call kept in order (``tests/test_wandb.py``);
in a training process of its own, every call's name also written to a file as it is made (``CallFile``)."""

from __future__ import annotations

import types
from pathlib import Path


class FakeRun:
    """What the sink uses of a ``wandb.Run``; every call kept in ``calls``."""

    def __init__(self, calls: list, **kwargs):
        self.calls, self.id = calls, kwargs["id"] or "fake-id"
        self.project, self.entity = kwargs["project"] or "fake-project", kwargs["entity"] or "fake-entity"

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.calls.append(("define_metric", name, step_metric))

    def log(self, row: dict) -> None:
        self.calls.append(("log", row))

    def finish(self, exit_code: int | None = None) -> None:
        self.calls.append(("finish", exit_code))


class FakeVideo:
    def __init__(self, data, caption: str | None = None, format: str | None = None):
        self.data, self.caption, self.format = data.read(), caption, format


class CallFile(list):
    """The calls, each call's name also appended to the file ``path`` (one line, flushed) as it is made: what
    another process counts."""

    def __init__(self, path: str | Path):
        super().__init__()
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - open while the process logs

    def append(self, call: tuple) -> None:
        super().append(call)
        self.file.write(f"{call[0]}\n")


def fake_wandb_module(calls: list) -> types.ModuleType:
    """A ``wandb`` module whose ``init`` returns a ``FakeRun`` keeping its calls (``init`` first) in ``calls``."""
    module = types.ModuleType("wandb")

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun(calls, **kwargs)

    module.init, module.Video = init, FakeVideo
    return module
