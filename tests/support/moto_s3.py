"""An S3 endpoint on localhost for tests: moto's server in a subprocess, and the variables every client needs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.ray_head import free_port

#: moto's server serving one request at a time: S3's conditional writes are atomic, while moto's threaded
#: server checks the condition and writes in two steps.
SERVE_ONE_AT_A_TIME = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
run_simple("127.0.0.1", int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False,
           request_handler=MotoRequestHandler)
"""


@contextmanager
def moto_server(one_at_a_time: bool = False) -> Iterator[tuple[int, dict[str, str]]]:
    """``(port, env)``: a running moto S3 server and the ``AWS_*`` variables that reach it; stopped at the end."""
    port = free_port()
    if one_at_a_time:
        command = [sys.executable, "-c", SERVE_ONE_AT_A_TIME, str(port)]
    else:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield port, env
    finally:
        server.terminate()
        server.wait(timeout=10)
