"""Where roles become Ray actors, or stay in-process: the one place that makes and calls them.

The coordinator writes its loop once against ``Backend``, calling methods by reference (a typo is
an ``AttributeError`` at import, and a type checker sees the arguments)::

    shard = backend.create(EnvShard, env_id, num_envs, seed=1, options={"num_cpus": 1})
    ref = shard.call(EnvShard.rollout, weights, FixedSteps(T))   # Ray: an ObjectRef; local: the value
    chunk = backend.get(ref)

``RayBackend`` applies ``ray.remote`` to the plain class; ``LocalBackend`` calls it directly
(tests, debugging, the latency benchmark).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from raysim.rollout.arrays import plain

P = ParamSpec("P")
R = TypeVar("R")

WAIT_SLICE = 0.5  # seconds: the driver waits in Ray in slices this long, and handles a signal between two


class HeldSignals:
    """What a signal handler raises while the main thread waits in Ray, held until the wait's slice ends.

    Ray's C code runs Python's signal handlers while it waits, but loses what they raise (the error
    surfaces later as a ``SystemError``, or never while the wait lasts). So every wait of the driver
    waits in slices of ``WAIT_SLICE`` seconds (``RayBackend``), and a handler that finds the main
    thread in such a wait hands its error over (``hold``): the wait raises it between two slices.
    """

    def __init__(self):
        self.depth = 0  # sliced waits of the main thread in progress (nested ones included)
        self.error: BaseException | None = None

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A sliced wait: a held error is raised when it ends (in place of its result or its error)."""
        main = threading.current_thread() is threading.main_thread()
        self.depth += int(main)
        try:
            yield
        finally:
            self.depth -= int(main)
            if main and self.depth == 0:
                self.raise_held()

    def hold(self, error: BaseException) -> bool:
        """For a signal handler: ``error`` is raised by the wait in progress (True), or there is none (False)."""
        if self.depth == 0:
            return False
        self.error = self.error or error
        return True

    def raise_held(self) -> None:
        """Raise the error a handler held, if any (between two slices of a wait)."""
        error, self.error = self.error, None
        if error is not None:
            raise error


held_signals = HeldSignals()


def method_name(method: Callable) -> str:
    """The name of a role's method, given as the function itself (``EnvShard.rollout``), never a string."""
    if isinstance(method, str) or not callable(method):
        raise TypeError(f"call a role's method by reference (e.g. EnvShard.rollout), got {method!r}")
    return method.__name__


class InputLost(RuntimeError):
    """A role could not read an input of its call: the object's owner (e.g. the learner with its weights) died."""


class RoleDied(RuntimeError):
    """A role's process died before it started (its node went), and nothing was to replace it."""


class ValuesLost(RuntimeError):
    """Values handed to a role by reference could not be read: lost with their node (``positions``: which)."""

    def __init__(self, positions: list[int], detail: str = ""):
        super().__init__(positions, detail)
        self.positions, self.detail = positions, detail

    def __str__(self) -> str:
        return f"the values at positions {self.positions} were lost with their node ({self.detail})"


def fetch(values: list[Any]) -> list[Any]:
    """Values handed to a role by reference inside a list (Ray resolves only a call's own arguments, before the
    call runs), fetched by the role: one lost with its node is the role's own error, ``ValuesLost``, naming
    which. Values that are not references (in-process roles) are returned as they are."""
    ray = sys.modules.get("ray")
    refs = [j for j, value in enumerate(values) if ray is not None and isinstance(value, ray.ObjectRef)]
    if not refs:
        return list(values)
    fetched = list(values)
    try:
        for j, value in zip(refs, ray.get([values[j] for j in refs]), strict=True):  # fetched in parallel
            fetched[j] = value
        return fetched
    except ray.exceptions.ObjectLostError as error:
        detail = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    lost = []
    for j in refs:  # which ones: one at a time
        try:
            ray.get(values[j])
        except ray.exceptions.ObjectLostError:
            lost.append(j)
    raise ValuesLost(lost, detail)


def cause(error: BaseException) -> BaseException:
    """The error a role raised, also when it reaches the driver wrapped by Ray (whose text carries the
    remote traceback)."""
    inner = getattr(error, "cause", None)
    return inner if isinstance(inner, BaseException) else error


def describe(error: BaseException) -> str:
    """``Type: message`` of the error a role raised, no traceback; a role's death in a line (what died, on which
    node, why: not Ray's whole account of the actor)."""
    error = cause(error)
    text = str(error).strip()
    if type(error).__module__.startswith("ray.") and "\n" in text:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line and " " not in line.split(": ", 1)[0])
        where = ", ".join(f"{k} {fields[k]}" for k in ("class_name", "ip") if k in fields)
        why = next((line for line in lines[1:] if line.split(": ", 1)[0] not in fields), "")
        why = why.split(". ")[0].rstrip(".") + "." if why else ""  # its first sentence
        text = " ".join(part for part in (lines[0], f"({where})" if where else "", why[:200]) if part)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Handle:
    """A role instance: ``call(Class.method, *args)`` returns a future (Ray) or the result (local)."""

    def call(self, method: Callable[Concatenate[Any, P], R], *args: P.args, **kwargs: P.kwargs) -> Any:
        raise NotImplementedError

    def call_split(self, method: Callable, *args: Any, returns: int, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method that returns a tuple of ``returns`` values, as one future each (Ray: separate objects,
        fetched separately)."""
        raise NotImplementedError

    def caller(self, method: Callable, lost: type[Exception]) -> Callable[..., Any]:
        """The role's ``method`` as a plain function that another role calls and waits for (a worker asking its
        policy server at each step): picklable, so it travels to that role; ``lost`` raised when this role's
        process is gone."""
        raise NotImplementedError


class Backend:
    name: str

    def create(self, cls: type, *args: Any, options: dict | None = None, **kwargs: Any) -> Handle:
        raise NotImplementedError

    def get(self, value: Any) -> Any:
        """The result of a ``call`` (or a list of them)."""
        raise NotImplementedError

    def wait(self, futures: list[Any], count: int, timeout: float | None = None) -> list[int]:
        """The indices (in order) of the first ``count`` of ``futures`` to be ready, or of those ready after
        ``timeout`` seconds (local: the first ones)."""
        return list(range(min(count, len(futures))))

    def put(self, value: Any) -> Any:
        """``value`` where every role can read it (Ray: one object in the object store, passed by ref)."""
        return value

    def kill(self, handle: Handle) -> None:
        """Stop the role's process, if it has one."""

    def discard(self, futures: list[Any]) -> None:
        """Results that will not be used: their errors are taken here (Ray would log each one later)."""

    def alive(self, handle: Handle, probe: Callable[[Any], Any]) -> bool:
        """Whether the role's process still answers a cheap call of its method ``probe``."""
        try:
            self.get(handle.call(probe))
            return True
        except Exception as error:
            if self.is_actor_failure(error):
                return False
            raise

    def is_actor_failure(self, error: BaseException) -> bool:
        """True when ``error`` says the role's process died (the role can be replaced)."""
        return False

    def is_lost(self, error: BaseException) -> bool:
        """True when ``error`` says a role's result was lost: with its node, or its role died before making it."""
        return self.is_actor_failure(error)

    def wait_started(
        self,
        handles: list[Handle],
        probe: Callable[[Any], Any],
        what: str,
        timeout: float,
        replace: Callable[[int], Handle] | None = None,
    ) -> list[Any]:
        """The answers of every role to ``probe``, once all started; a line every few seconds while some are
        still waiting for room on the cluster (``TimeoutError`` after ``timeout`` seconds).

        A role whose process dies before it answers (its node went) is ``replace(i)``-d in ``handles[i]``, with a
        line, as often as it happens within ``timeout``; without ``replace`` it is ``RoleDied``. A role whose
        constructor raised is that error (a replacement would fail the same way).
        """
        return self.get([h.call(probe) for h in handles])

    def room_for(self, request: dict[str, float]) -> int:
        """How many more actors asking for ``request`` fit in the resources free right now."""
        return 0

    def request_capacity(self, requests: list[tuple[dict[str, float], int]]) -> None:
        """Ask the cluster's autoscaler for room for every ``(request, count)``: ``count`` actors asking for
        ``request`` each (no-op without one). One call states the whole need (Ray's request replaces the last)."""


def internal_resource(name: str) -> bool:
    """Ray's bookkeeping resources (memory, node, accelerator and placement-group markers), not what a role asks
    for."""
    return name in ("memory", "object_store_memory") or ":" in name or "_group_" in name


class _LocalHandle(Handle):
    """Results as a caller through Ray receives them: an ``ArrayDict`` (a state that travels as arrays) a dict."""

    def __init__(self, instance: Any):
        self.instance = instance

    def call(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        return plain(getattr(self.instance, method_name(method))(*args, **kwargs))

    def call_split(self, method: Callable, *args: Any, returns: int, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(plain(getattr(self.instance, method_name(method))(*args, **kwargs)))

    def caller(self, method: Callable, lost: type[Exception]) -> Callable[..., Any]:
        return getattr(self.instance, method_name(method))


class LocalBackend(Backend):
    """Everything in this process, no Ray."""

    name = "local"

    def create(self, cls: type, *args: Any, options: dict | None = None, **kwargs: Any) -> Handle:
        return _LocalHandle(cls(*args, **kwargs))

    def get(self, value: Any) -> Any:
        return value


class _RayHandle(Handle):
    def __init__(self, actor: Any):
        self.actor = actor

    def call(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.actor, method_name(method)).remote(*args, **kwargs)

    def call_split(self, method: Callable, *args: Any, returns: int, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(getattr(self.actor, method_name(method)).options(num_returns=returns).remote(*args, **kwargs))

    def caller(self, method: Callable, lost: type[Exception]) -> Callable[..., Any]:
        return _RayCaller(self.actor, method_name(method), lost)


class _RayCaller:
    """``Handle.caller`` on Ray: the call, then a wait for its result in the calling role's process."""

    def __init__(self, actor: Any, name: str, lost: type[Exception]):
        self.actor, self.name, self.lost = actor, name, lost

    def __call__(self, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self.actor, self.name).remote(*args))
        except ray.exceptions.RayActorError as error:
            raise self.lost(describe(error)) from None


class RayBackend(Backend):
    """Each role a Ray actor; ``options`` are Ray's actor options (num_cpus, num_gpus, resources)."""

    name = "ray"

    def __init__(self):
        import ray

        self.ray = ray

    def create(self, cls: type, *args: Any, options: dict | None = None, **kwargs: Any) -> Handle:
        actor_cls = self.ray.remote(cls)
        return _RayHandle(actor_cls.options(**(options or {})).remote(*args, **kwargs))

    def get(self, value: Any) -> Any:
        refs = list(dict.fromkeys(value if isinstance(value, list) else [value]))
        with held_signals.waiting():
            self._ready(refs, len(refs), None)  # computed somewhere: fetching it cannot wait for long
            return self.ray.get(value)

    def put(self, value: Any) -> Any:
        return self.ray.put(value)

    def wait(self, futures: list[Any], count: int, timeout: float | None = None) -> list[int]:
        chosen = set(self._ready(list(dict.fromkeys(futures)), count, timeout))
        return [j for j, future in enumerate(futures) if future in chosen]

    def _ready(self, refs: list[Any], count: int, timeout: float | None) -> list[Any]:
        """The first ``count`` of ``refs`` to be ready, or those ready after ``timeout`` seconds, waited for in
        slices of ``WAIT_SLICE``: a signal that arrives meanwhile is raised between two (``HeldSignals``)."""
        count = min(count, len(refs))
        if count == 0:
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        with held_signals.waiting():
            while True:
                left = WAIT_SLICE if deadline is None else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
                ready, _ = self.ray.wait(refs, num_returns=count, timeout=left, fetch_local=False)
                if len(ready) >= count or (deadline is not None and time.monotonic() >= deadline):
                    return ready
                held_signals.raise_held()

    def kill(self, handle: Handle) -> None:
        self.ray.kill(handle.actor)

    def wait_started(
        self,
        handles: list[Handle],
        probe: Callable[[Any], Any],
        what: str,
        timeout: float,
        replace: Callable[[int], Handle] | None = None,
    ) -> list[Any]:
        futures = [h.call(probe) for h in handles]
        deadline = time.monotonic() + timeout
        died = 0  # roles that died before they started, replaced
        while True:
            left = max(0.0, min(5.0, deadline - time.monotonic()))
            ready = self._ready(futures, len(futures), left)
            deaths = self._deaths(futures, ready)
            for i, error in deaths:
                which = what if len(futures) == 1 else f"{what} [{i}]"
                if replace is None:
                    raise RoleDied(f"{which} died before it started: {describe(error)}") from error
                died += 1
                print(f"raysim: fault: {which} died before it started ({describe(error)}); another starts", flush=True)
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # a dying node: Ray may place it there
                handles[i] = replace(i)
                futures[i] = handles[i].call(probe)
            pending = len(futures) - len(ready) + len(deaths)
            if not pending:
                return self.get(futures)
            if time.monotonic() >= deadline:
                lost = f"; {died} died before they started" if died else ""
                raise TimeoutError(
                    f"{pending} of {len(futures)} {what} did not start in {timeout:g} s "
                    f"(resources_timeout): the cluster has no room for them ({self._free()}{lost})"
                )
            if not deaths:
                print(f"raysim: waiting for {pending} of {len(futures)} {what} to start ({self._free()})", flush=True)

    def _deaths(self, futures: list[Any], ready: list[Any]) -> list[tuple[int, BaseException]]:
        """The positions of the ``ready`` probes whose role died before it answered, with the error (a role whose
        constructor raised: that error is raised here)."""
        deaths = []
        for i, future in enumerate(futures):
            if future not in ready:
                continue
            try:
                self.ray.get(future, timeout=0)
            except self.ray.exceptions.RayActorError as error:
                if getattr(error, "actor_init_failed", False):
                    raise
                deaths.append((i, error))
        return deaths

    def _free(self) -> str:
        """What the cluster (or the trial's placement group) has free now, in words."""
        if self.ray.util.get_current_placement_group() is not None:
            return "in the trial's placement group"
        free = self.ray.available_resources()
        kinds = ["CPU", "GPU", *sorted(k for k in free if k not in ("CPU", "GPU") and not internal_resource(k))]
        return "the cluster has " + ", ".join(f"{free.get(k, 0.0):g} {k}" for k in kinds) + " free"

    def discard(self, futures: list[Any]) -> None:
        done, _ = self.ray.wait(list(futures), num_returns=len(futures), timeout=0)
        for future in done:
            try:
                self.ray.get(future)
            except Exception:  # noqa: BLE001 - the failure is known and handled by the caller
                pass

    def is_actor_failure(self, error: BaseException) -> bool:
        return isinstance(error, self.ray.exceptions.RayActorError)

    def is_lost(self, error: BaseException) -> bool:
        return isinstance(error, (self.ray.exceptions.RayActorError, self.ray.exceptions.ObjectLostError))

    def room_for(self, request: dict[str, float]) -> int:
        free = self.ray.available_resources()
        return int(min(free.get(k, 0.0) // v for k, v in request.items() if v > 0))

    def request_capacity(self, requests: list[tuple[dict[str, float], int]]) -> None:
        from ray.autoscaler.sdk import request_resources

        request_resources(
            bundles=[{k: v for k, v in r.items() if v > 0} for r, count in requests for _ in range(count)]
        )
