"""What an env prints while it is built (a simulator's warnings on stderr, Python warnings), caught to say once.

Every shard builds the same env, so a simulator's start-up warning would reach the console once per
shard and per row through Ray's log forwarding. ``captured`` takes it instead; the driver, which
builds one row of the env before any work (``raysim.coordinator.preflight``), prints each message once.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def captured() -> Iterator[list[str]]:
    """Catch what the block writes to file descriptors 1 and 2 and the Python warnings it raises; the list
    it yields holds each distinct message once when the block ends."""
    messages: list[str] = []
    with tempfile.TemporaryFile() as sink:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield messages
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            lines = [line.strip() for line in sink.read().decode(errors="replace").splitlines()]
            lines += [f"{w.category.__name__}: {w.message}" for w in caught]
            messages.extend(dict.fromkeys(line for line in lines if line))
