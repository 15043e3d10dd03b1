"""Ray for a run: attach to a cluster or start an embedded one, and make sure every role fits before any starts.

``start_backend`` follows Ray's convention: ``--address`` (or ``RAY_ADDRESS``) attaches there; without
one, a cluster already running on this machine is attached to, and otherwise an embedded local Ray
is started, large enough for every role of the run (``--address local`` forces that), once the run's
least memory (``memory.py``) is known to fit in this machine's. An address is asked whether a Ray GCS
answers there before ``ray.init``, which would retry for minutes. Then ``wait_for_room`` compares
what every role asks for (shards, evaluation shards, learner ranks: CPUs, GPUs, custom resources)
with what the cluster has (and the least memory with the cluster's): a run that can never fit is an
error with the numbers and the keys to change; one that fits once the autoscaler adds nodes (or
other work frees room) waits with a line every few seconds, up to ``resources_timeout``.

Ray's own messages to the driver (its ``ray`` logger: a token warning on every embedded start, "Started a
local Ray instance"; what the raylet reports, such as its six-line "A worker died" beside raysim's one-line
fault line) go to ``raysim-driver.log`` in Ray's session log directory (``ray_logs_dir``: e.g.
``/tmp/ray/session_latest/logs/``, beside Ray's own logs of its workers), not to the console, while a Ray
this process started or attached to runs (``stop_ray`` gives them back); a Ray that fails to start says them.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from urllib.parse import urlparse

from raysim.actors import Backend, LocalBackend, RayBackend
from raysim.config import Config, training_shards
from raysim.coordinator.memory import MemoryNeed, cluster_memory, machine_memory
from raysim.coordinator.servers import server_request


class ResourceError(RuntimeError):
    """The cluster cannot give the run what its roles ask for (or cannot be reached): what to change."""


@dataclass(frozen=True)
class Need:
    """``count`` actors of one role, each asking Ray for ``each``; ``keys``: the config keys that set it."""

    role: str
    count: int
    each: dict[str, float]
    keys: str


def needs(config: Config) -> list[Need]:
    """What every role of the run asks Ray for."""
    cfg = config
    shard = {"CPU": cfg.shards.num_cpus, **cfg.shards.resources}
    learner = {"CPU": cfg.learner.num_cpus, "GPU": cfg.learner.num_gpus, **cfg.learner.resources}
    found = [Need("shards", training_shards(cfg), shard, "shards.count, shards.num_cpus, shards.resources")]
    if cfg.eval.episodes or cfg.eval.every or cfg.eval.every_steps:
        found.append(Need("evaluation shards", cfg.eval.shards, shard, "eval.shards, shards.num_cpus"))
    if cfg.shards.placement == "servers":
        keys = "servers.count, servers.num_cpus, servers.num_gpus, servers.resources"
        found.append(Need("policy servers", cfg.servers.count, server_request(cfg), keys))
    found.append(
        Need(
            "learner ranks",
            cfg.learner.ranks,
            learner,
            "learner.ranks, learner.num_cpus, learner.num_gpus, learner.resources",
        )
    )
    return [n for n in found if n.count]


def total(found: list[Need]) -> dict[str, float]:
    """The resources every role together asks for."""
    sums: dict[str, float] = {}
    for need in found:
        for name, amount in need.each.items():
            if amount > 0:
                sums[name] = sums.get(name, 0.0) + need.count * amount
    return sums


def shortfall(wanted: dict[str, float], have: dict[str, float]) -> dict[str, float]:
    """What ``have`` lacks of ``wanted``, per resource."""
    return {k: v - have.get(k, 0.0) for k, v in wanted.items() if v - have.get(k, 0.0) > 1e-9}


def describe_needs(found: list[Need]) -> str:
    """Each role's request, one line each."""
    lines = []
    for need in found:
        each = ", ".join(f"{amount:g} {name}" for name, amount in need.each.items() if amount > 0) or "nothing"
        lines.append(f"  {need.role}: {need.count} x ({each})  [{need.keys}]")
    return "\n".join(lines)


def amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items()))


# -- starting or attaching ----------------------------------------------------------------------


def start_backend(config: Config, address: str | None = None, memory: MemoryNeed | None = None) -> tuple[Backend, bool]:
    """The backend of ``config`` (checked: every role fits, in ``memory`` too); ``started`` when this call
    started Ray."""
    if config.backend == "local":
        refuse_oversized(memory, machine_memory(), "this machine")
        return LocalBackend(), False
    import ray

    started = connect(config, address, memory=memory)
    from ray.util import get_current_placement_group

    try:
        if memory is not None and get_current_placement_group() is None:  # a Tune trial's bundles are reserved
            have, largest = cluster_memory(ray)
            refuse_oversized(memory, have, "the Ray cluster", largest, grows=lambda: can_grow(ray, settle=10.0))
        wait_for_room(config, ray)
    except BaseException:
        if started:  # a Ray this call started ends with it (a script that catches the error keeps no cluster)
            stop_ray()
        raise
    return RayBackend(), started


def refuse_oversized(
    memory: MemoryNeed | None,
    have: float | None,
    where: str,
    largest_node: float | None = None,
    grows: Callable[[], bool] = lambda: False,
) -> None:
    """Raise when the run's ``memory`` cannot fit in ``have`` bytes (its largest role in ``largest_node``)
    and no autoscaler can add nodes."""
    if memory is None:
        return
    problem = memory.problem(have, largest_node, where)
    if problem and not grows():
        raise ResourceError(problem)


def connect(
    config: Config,
    address: str | None = None,
    extra_cpus: float = 0.0,
    memory: MemoryNeed | None = None,
    keep_messages: bool = True,
) -> bool:
    """Attach to Ray, or start an embedded one sized for ``config``'s roles (and ``extra_cpus``: a sweep
    trial's coordinator; refused before it starts when the roles' ``memory`` exceeds this machine's);
    True when this call started it. ``keep_messages``: Ray's own messages go to its log directory
    (``ray_messages_kept``), not the console (a sweep keeps Tune's on the console)."""
    import ray

    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None:
            address = running_cluster()
            if address is not None:
                print(
                    f"raysim: attaching to the Ray cluster running on this machine at {address} "
                    "(--address local starts an embedded one instead)",
                    flush=True,
                )
        with ray_messages_kept() if keep_messages else nullcontext():
            if address in (None, "local"):
                refuse_oversized(memory, machine_memory(), "this machine")
                start_embedded(config, extra_cpus)
            else:
                attach(address)
        started = True
    return started


#: The file of Ray's own messages to the driver, in Ray's session log directory.
DRIVER_LOG = "raysim-driver.log"
#: Where Ray's messages went before they went to ``DRIVER_LOG`` (the ``ray`` logger's handlers, the function that
#: prints the raylet's reports), for ``stop_ray``; None while they go there.
_console: tuple[list[logging.Handler], Callable] | None = None


@contextmanager
def ray_messages_kept() -> Iterator[None]:
    """Ray's messages while the body starts Ray or attaches to it are held back, then written to ``DRIVER_LOG``, as
    every later one and the raylet's reports are until ``stop_ray``; they reach the console when the body fails
    (why Ray did not start)."""
    global _console
    import ray  # noqa: F401 - its ``ray`` logger is set up on import
    from ray._private import worker

    logger = logging.getLogger("ray")
    console = _console or (list(logger.handlers), worker.print_to_stdstream)
    held = logging.handlers.MemoryHandler(capacity=1 << 20, flushLevel=logging.CRITICAL + 1)
    logger.handlers, kept = [held], None
    try:
        yield
        kept = driver_log()
    finally:
        if kept is None:  # Ray did not start (they say why), or they can be written nowhere: on the console
            logger.handlers = console[0]
            for record in held.buffer:
                logger.handle(record)
    if kept is None:
        return
    held.setTarget(kept)
    held.flush()
    logger.handlers, _console = [kept], console
    worker.print_to_stdstream = raylet_report_kept


def raylet_report_kept(data: dict, ignore_prefix: bool) -> None:
    """A report the raylet sends the driver (Ray's ``listen_error_messages`` prints it), into ``DRIVER_LOG``."""
    for line in data.get("lines", []):
        logging.getLogger("ray").warning("(%s) %s", data.get("pid"), line)


def driver_log() -> logging.Handler | None:
    """``DRIVER_LOG`` in Ray's session log directory (in the temp dir when that is unknown or not writable here;
    None when neither is)."""
    folders = [ray_logs_dir(), tempfile.gettempdir()]
    for folder in [f for f in folders if f]:
        try:
            handler = logging.FileHandler(os.path.join(folder, DRIVER_LOG))
        except OSError:
            continue
        handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
        return handler
    return None


def ray_logs_dir() -> str | None:
    """The log directory of the Ray session this process started or attached to (None: unknown)."""
    from ray._private import worker

    try:
        return worker._global_node.get_logs_dir_path()
    except AttributeError:
        return None


def stop_ray() -> None:
    """End the Ray this process started or attached to (``connect``); Ray's messages reach the console again."""
    global _console
    import ray
    from ray._private import worker

    ray.shutdown()
    if _console is not None:
        logger = logging.getLogger("ray")
        for handler in logger.handlers:
            handler.close()
        (logger.handlers, worker.print_to_stdstream), _console = _console, None


def running_cluster() -> str | None:
    """The address of a Ray cluster started on this machine with ``ray start`` that answers, if any."""
    from ray._private.services import find_bootstrap_address

    try:
        address = find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - no readable record: no cluster to attach to
        return None
    return address if address and reachable(address) is None else None


class RayStartFailed(RuntimeError):
    """The embedded Ray could not start: nothing of the run was created yet."""


def start_embedded(config: Config, extra_cpus: float = 0.0) -> None:
    """An embedded local Ray with room for every role (each rank's CPUs, GPUs and custom resources)."""
    import ray

    wanted = total(needs(config))
    wanted["CPU"] = wanted.get("CPU", 0.0) + extra_cpus
    gpus = wanted.get("GPU", 0.0)
    if gpus:
        import torch

        visible = torch.cuda.device_count()
        if gpus > visible:
            raise ResourceError(
                f"the learner ranks ask for {gpus:g} GPU(s) (learner.num_gpus x learner.ranks) and this machine has "
                f"{visible}: set learner.num_gpus=0 and learner.device=cpu, or attach to a cluster with GPUs"
            )
    custom = {k: math.ceil(v) for k, v in wanted.items() if k not in ("CPU", "GPU")}
    cpus = max(os.cpu_count() or 1, math.ceil(wanted.get("CPU", 0.0)))
    try:
        ray.init(
            address="local", num_cpus=cpus, num_gpus=math.ceil(gpus), resources=custom or None, include_dashboard=False
        )
    except Exception as error:  # e.g. Ray's "timed out during startup" on a machine too loaded to start it in time
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise RayStartFailed(
            f"the embedded Ray did not start ({first}): run again when the machine is less loaded, or start Ray "
            "yourself (`ray start --head`) and attach with --address"
        ) from error


def attach(address: str) -> None:
    """``ray.init(address)``, with a clear error when nothing answers there or it wants a token."""
    import ray

    problem = reachable(address)
    if problem:
        raise ResourceError(problem)
    try:
        ray.init(address=address)
    except Exception as error:  # ConnectionError, caused by an AuthenticationError: say what to do
        text = str(error)
        causes, cause = [], error
        while cause is not None:
            causes.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        if any("InvalidAuthToken" in c or "AuthenticationError" in c for c in causes):
            raise ResourceError(
                f"the Ray cluster at {address} requires token authentication: set RAY_AUTH_MODE=token (the token is "
                "read from ~/.ray/auth_token, or from RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)"
            ) from error
        raise ResourceError(f"cannot attach to the Ray cluster at {address}: {text.splitlines()[0]}") from error


def reachable(address: str, timeout: float = 3.0) -> str | None:
    """Why nothing usable answers at a Ray GCS ``address`` (None: something listens there)."""
    if address.startswith(("http://", "https://")):
        port = urlparse(address).port
        return (
            f"{address} is a dashboard / job-submission address{f' (port {port})' if port else ''}: attach "
            "with the cluster's GCS address host:port (`ray start --head` prints it, default port 6379), "
            "or submit the run with `ray job submit`"
        )
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"--address {address!r} must be host:port (e.g. 127.0.0.1:6379), 'local', or left out"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            why = not_a_gcs(address, timeout)
    except OSError as error:
        why = error.strerror or str(error)
    if why is None:
        return None
    return (
        f"no Ray cluster answers at {address} ({why}): start one with `ray start --head`, check the address "
        "(the head's GCS port, 6379 by default), or leave --address out for an embedded Ray"
    )


def not_a_gcs(address: str, timeout: float) -> str | None:
    """Why what listens at ``address`` is not a Ray GCS (None: one answers, maybe asking for a token).

    Asked before ``ray.init``, which would retry for minutes with a warning every few seconds."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    try:  # Ray's own channel: TLS (RAY_USE_TLS) and token authentication as ray.init would use them
        from ray._private.grpc_utils import init_grpc_channel

        channel = init_grpc_channel(address)
    except ImportError:  # an older Ray: a plain channel (a GCS that wants TLS then does not answer)
        channel = grpc.insecure_channel(address)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).CheckAlive(
            gcs_service_pb2.CheckAliveRequest(), timeout=timeout
        )
    except grpc.RpcError as error:
        silent = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED)
        if error.code() in silent:
            return f"something listens there but does not answer as a Ray GCS: {error.code().name.lower()}"
    finally:
        channel.close()
    return None


# -- room for the roles -------------------------------------------------------------------------


def autoscaling_status(ray) -> dict | None:
    """The autoscaler's status in the GCS (None: none published, or unreadable)."""
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        status = _internal_kv_get("__autoscaling_status")
        return json.loads(status) if status else None
    except Exception:  # noqa: BLE001 - an old or unusual cluster: no status
        return None


def can_grow(ray, settle: float = 0.0) -> bool:
    """Whether an autoscaler that can add nodes runs (as far as Ray shows): its status is in the GCS and
    names node types of its own (``ray start`` without an autoscaling config only mirrors its nodes).
    ``settle``: seconds to wait for a cluster just started to publish its first report."""
    deadline = time.monotonic() + settle
    while (status := autoscaling_status(ray)) is not None and not status.get("autoscaler_report"):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if status is None:
        return False
    report = status.get("autoscaler_report") or {}
    mapping = report.get("node_type_mapping") or {}
    return not (report.get("legacy") and all(str(v).startswith("node_") for v in mapping.values()))


def wait_for_room(config: Config, ray, interval: float = 5.0) -> None:
    """Return once the cluster has room for every role; wait (saying so) while it may get it; else raise.

    Inside a placement group (a Ray Tune trial) the roles are placed in its bundles, reserved already.
    """
    from ray.util import get_current_placement_group

    if get_current_placement_group() is not None:
        return
    found = needs(config)
    wanted = total(found)
    refuse_impossible(found, ray, settle=10.0)  # a cluster just started may not have reported its autoscaler yet
    deadline, requested, said = time.monotonic() + config.resources_timeout, False, 0.0
    while True:
        short_total = shortfall(wanted, ray.cluster_resources())
        short_free = shortfall(wanted, ray.available_resources())
        if not short_total and not short_free:
            return
        if short_total:  # more than the cluster has: only an autoscaler can add it
            refuse_impossible(found, ray)
        if short_total and not requested:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[dict(n.each) for n in found for _ in range(n.count)])
            requested = True
        if time.monotonic() > deadline:
            raise ResourceError(
                f"gave up after {config.resources_timeout:g} s (resources_timeout) waiting for {amounts(short_free)} "
                f"more:\n{describe_needs(found)}"
            )
        if time.monotonic() - said >= interval:
            why = "the autoscaler is adding nodes" if short_total else "other work holds them"
            print(
                f"raysim: waiting for {amounts(short_free)} more ({why}): the cluster has "
                f"{amounts(ray.available_resources())} free; this run needs {amounts(wanted)}",
                flush=True,
            )
            said = time.monotonic()
        time.sleep(0.5)


def refuse_impossible(found: list[Need], ray, what: str = "this run", settle: float = 0.0) -> None:
    """Raise when the roles can never fit (one larger than every node, or all together more than the cluster
    has) and no autoscaler can add nodes (``settle``: see ``can_grow``)."""
    biggest, wanted = largest_node(ray), total(found)
    have = {name: ray.cluster_resources().get(name, 0.0) for name in wanted}
    too_big = [need for need in found if shortfall(need.each, biggest)]
    if not (too_big or shortfall(wanted, have)) or can_grow(ray, settle):
        return
    for need in too_big:  # an actor larger than every node can only run on a node to come
        raise ResourceError(
            f"one of the {need.role} asks for {amounts(need.each)} and no node of this cluster has that much "
            f"(the largest: {amounts(biggest)}); change {need.keys}"
        )
    raise ResourceError(
        f"{what} needs {amounts(wanted)} and the cluster has {amounts(have)} with no autoscaler to add more; "
        f"lower what the roles ask for:\n{describe_needs(found)}"
    )


def largest_node(ray) -> dict[str, float]:
    """The most of each resource any one alive node has."""
    most: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("Alive"):
            for name, amount in node.get("Resources", {}).items():
                most[name] = max(most.get(name, 0.0), amount)
    return most
