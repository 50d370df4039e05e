"""The KServe v2 inference server over the model runtimes (``paddle-ipu serve``).

:class:`InferenceServer` serves :class:`~paddle_ipu.serving.runtime.Runtime` objects
over HTTP and gRPC through the C++ front ends of ``paddle_ipu._core`` (csrc/serving):
a runtime of kind ``"queue"`` has its requests admitted into its queue from C++, one of
kind ``"handler"`` has them handed to its ``submit`` (and its ``routes`` served as
queues).  The routes, the policies and why the request path is C++ are in
docs/serving.md.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from paddle_ipu import _core
from paddle_ipu.errors import NotSupportedError, OptionError
from paddle_ipu.serving.runtime import QueuePlan, QueueRuntime, Runtime, as_runtime

if TYPE_CHECKING:
    from paddle_ipu.serving.repository import ModelRepository

log = logging.getLogger("paddle_ipu")

__all__ = ["InferenceServer"]


def _plan(
    queue: QueuePlan,
    name: str,
    version: str,
    request_timeout_ms: float,
    max_body: int,
    instances: int = 1,
) -> _core.ServingPlan:
    """What the C++ front end checks a request of a queue runtime against."""
    from paddle_ipu._version import __version__

    def tensors(specs: Any) -> list[_core.ServingTensor]:
        return [
            _core.ServingTensor(
                name=t.name,
                datatype=t.datatype,
                shape=list(t.shape),
                unit_bytes=t.unit_bytes,
                ranges=[
                    _core.ServingRange(
                        low=int(r.low),
                        high=int(r.high),
                        allowed=[int(v) for v in r.allowed],
                        column=r.column,
                        describe=r.describe(),
                    )
                    for r in t.ranges
                ],
            )
            for t in specs
        ]

    return _core.ServingPlan(
        name=name,
        version=version,
        server_version=__version__,
        auto_batch=queue.auto_batch,
        max_rows=queue.max_rows,
        capacity=queue.capacity,
        limit=queue.limit,
        micro_batch_size=queue.micro_batch_size,
        batch_timeout_us=queue.batch_timeout_us,
        request_timeout_s=request_timeout_ms / 1e3,
        max_body=max_body,
        instance_count=instances,
        instance_kind=queue.instance_kind,
        inputs=tensors(queue.inputs),
        outputs=tensors(queue.outputs),
    )


def _handler_plan(
    runtime: Runtime,
    name: str,
    version: str,
    request_timeout_ms: float,
    max_body: int,
    queue_limit: int,
    workers: int,
    instances: int,
) -> _core.ServingPlan:
    """The plan of a handler: its declared tensors (-1: open) and its queue's bound."""
    from paddle_ipu._version import __version__

    def tensors(specs: Any) -> list[_core.ServingTensor]:
        return [
            _core.ServingTensor(
                name=s.name, datatype=s.datatype, shape=[int(d) for d in s.dims], unit_bytes=0
            )
            for s in specs
        ]

    return _core.ServingPlan(
        name=name,
        version=version,
        server_version=__version__,
        auto_batch=False,
        max_rows=0,
        capacity=1,
        limit=int(queue_limit),
        micro_batch_size=0,
        batch_timeout_us=0.0,
        request_timeout_s=request_timeout_ms / 1e3,
        max_body=max_body,
        inputs=tensors(runtime.inputs),
        outputs=tensors(runtime.outputs),
        dynamic=True,
        workers=int(workers),
        instance_count=instances,
    )


class InferenceServer:
    """Serve model runtimes over HTTP (and gRPC with ``grpc_port``).

    One model: ``InferenceServer(runtime, name=...)``.  Several: :meth:`add_model`
    (before or after :meth:`start`) and :meth:`remove_model`, or a ``repository``
    (:class:`~paddle_ipu.serving.repository.ModelRepository`: Triton's layout, loaded
    at :meth:`start`, load / unload over HTTP and gRPC in its control mode).

    Args:
        runtime: a started :class:`~paddle_ipu.serving.ModelRuntime`, served as
            ``name`` / ``version``; None: no model yet.
        name: that model's name in the URLs.
        host, port: where to listen (port 0: a free port, see :attr:`port`).
        version: that model's version.
        grpc_port: also serve KServe v2 over gRPC on this port (0: a free port, see
            :attr:`grpc_port`; None: no gRPC).
        threads: IO threads, HTTP and gRPC (each accepts connections and parses requests).
        request_timeout_ms: a request not started within this time is answered 504
            (0: no limit; a request's ``timeout`` parameter overrides it).
        max_body_mb: the largest request body accepted (413 beyond).
        reuse_port: let other processes listen on the same ports (``--workers``).
        repository: a model repository whose models this server serves.
        instances: the server processes serving these models on these ports
            (``--workers``), reported as the configuration's ``instance_group`` count.
        access_log: write one JSON line per inference request (HTTP and gRPC, every
            model) to this file, appended to (``"-"``: standard error); None: none.
        warmup: graph runs of a full micro-batch of zeros made for every fixed model
            served at :meth:`start`, and a model compiled per input shape has its
            declared shapes and buckets made (as many as its memory bound holds; other
            dynamic models are left: their shapes are open), readiness answering 503
            until they are done.
        drain_grace_s: on :meth:`stop` (SIGTERM), readiness turns 503 at once, but the
            server goes on serving for this long before its listeners close (the time
            a load balancer, e.g. Kubernetes' endpoints, needs to stop sending).
        header_timeout_s: a request's headers must arrive within this time of its
            first byte (408 and closed; nginx's client_header_timeout).  0: none.
        idle_timeout_s: a connection with no request under way and nothing arriving
            for this long is closed (nginx's keepalive_timeout; gRPC: GOAWAY), as is
            one whose body, message or answer stalls this long (408 while reading).
            0: none.
        max_connections: open HTTP and gRPC connections at most; a new one past it
            is refused (HTTP: 503).  Keep it below the open-file limit (``ulimit -n``).
        max_header_kb: a request's header block at most (431; gRPC
            RESOURCE_EXHAUSTED).
        max_headers: a request's header fields at most (431; gRPC
            RESOURCE_EXHAUSTED; Envoy's max_headers_count).

    docs/serving.md#limits-and-timeouts lists every limit with its default.
    """

    def __init__(
        self,
        runtime: Any = None,
        name: str = "model",
        host: str = "127.0.0.1",
        port: int = 8000,
        version: str = "1",
        *,
        grpc_port: int | None = None,
        threads: int = 1,
        request_timeout_ms: float = 0.0,
        max_body_mb: float = 64.0,
        reuse_port: bool = False,
        repository: ModelRepository | None = None,
        instances: int = 1,
        access_log: str | None = None,
        warmup: int = 0,
        drain_grace_s: float = 0.0,
        header_timeout_s: float = 60.0,
        idle_timeout_s: float = 75.0,
        max_connections: int = 1024,
        max_header_kb: int = 64,
        max_headers: int = 100,
    ) -> None:
        from paddle_ipu._version import __version__

        if runtime is not None:
            as_runtime(runtime)  # what is served is checked before anything starts
        if threads < 1:
            raise OptionError(f"threads must be >= 1, got {threads}")
        if not request_timeout_ms >= 0:
            raise OptionError(f"request_timeout_ms must be >= 0, got {request_timeout_ms}")
        if not max_body_mb > 0:
            raise OptionError(f"max_body_mb must be > 0, got {max_body_mb}")
        if instances < 1:
            raise OptionError(f"instances must be >= 1, got {instances}")
        if warmup < 0:
            raise OptionError(f"warmup must be >= 0 runs, got {warmup}")
        if not drain_grace_s >= 0:
            raise OptionError(f"drain_grace_s must be >= 0, got {drain_grace_s}")
        for what, seconds in (
            ("header_timeout_s", header_timeout_s),
            ("idle_timeout_s", idle_timeout_s),
        ):
            if not seconds >= 0:
                raise OptionError(f"{what} must be >= 0 seconds (0: none), got {seconds}")
        for what, count in (
            ("max_connections", max_connections),
            ("max_header_kb", max_header_kb),
            ("max_headers", max_headers),
        ):
            if int(count) != count or count < 1:
                raise OptionError(f"{what} must be an integer >= 1, got {count}")
        if max_header_kb > 1 << 20:
            raise OptionError(f"max_header_kb must be at most 1048576 (1 GiB), got {max_header_kb}")
        self.runtime = runtime
        self.name = name
        self.host = host
        self.port = port
        self.version = version
        self.grpc_port = grpc_port
        self.threads = threads
        self.request_timeout_ms = float(request_timeout_ms)
        self.max_body = int(max_body_mb * (1 << 20))
        self.reuse_port = reuse_port
        self.repository = repository
        self.instances = int(instances)
        self.warmup = int(warmup)
        self.drain_grace_s = float(drain_grace_s)
        self.access_log = access_log
        self.server = _core.ServingServer(
            __version__,
            self.max_body,
            header_timeout_s=float(header_timeout_s),
            idle_timeout_s=float(idle_timeout_s),
            max_connections=int(max_connections),
            max_header_bytes=int(max_header_kb) << 10,
            max_headers=int(max_headers),
        )
        if access_log is not None:
            try:
                self.server.open_access_log(str(access_log))
            except RuntimeError as exc:
                raise OSError(str(exc)) from None
        self._warmup_thread: threading.Thread | None = None
        #: The warm-up's exception, if it failed (the server then never turns ready).
        self.warmup_error: BaseException | None = None
        # (name, version) -> (what was given, its Runtime, front end): the models served.
        self._models: dict[tuple[str, str], tuple[Any, Runtime, Any]] = {}
        self._models_lock = threading.Lock()
        self._grpc: Any = None
        self._control: threading.Thread | None = None
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()
        if runtime is not None:
            self.add_model(runtime, name, version)
        if repository is not None:
            repository.attach(self)

    # -- the models --------------------------------------------------------------
    def add_model(
        self,
        runtime: Any,
        name: str,
        version: str = "1",
        *,
        queue_limit: int = 64,
        workers: int = 1,
    ) -> None:
        """Serve a started runtime as ``name`` / ``version`` (READY at once; replaces
        nothing: that version must not be served already).

        ``runtime`` is a :class:`~paddle_ipu.serving.runtime.Runtime`, or a dynamic
        model (:class:`~paddle_ipu.serving.dynamic.DynamicModel`).  Of kind
        ``"queue"`` (:class:`~paddle_ipu.serving.ModelRuntime`) its requests are admitted
        into its queue from C++, without Python; of kind ``"handler"`` they are parsed
        in C++ and handed to ``submit`` by ``workers`` threads, at most ``queue_limit``
        of them in flight (503 beyond), and those its ``routes`` take go to their queues
        from C++."""
        served = as_runtime(runtime)
        if not name or "/" in name or not version or "/" in version:
            raise OptionError(
                f"a model's name and version must be non-empty and hold no '/': got "
                f"name {name!r}, version {version!r}"
            )
        with self._models_lock:
            if (name, version) in self._models:
                raise OptionError(f"model {name!r} version {version!r} is served already")
            if served.kind == "queue":
                queue = _queue_runtime(served)
                plan = _plan(
                    queue.queue_plan(),
                    name,
                    version,
                    self.request_timeout_ms,
                    self.max_body,
                    self.instances,
                )
                front = _core.ServingFrontEnd(queue.queue, plan)
            else:
                if queue_limit < 1 or workers < 1:
                    raise OptionError(
                        f"queue_limit and workers must be >= 1, got {queue_limit}, {workers}"
                    )
                plan = _handler_plan(
                    served,
                    name,
                    version,
                    self.request_timeout_ms,
                    self.max_body,
                    queue_limit,
                    workers,
                    self.instances,
                )
                front = _core.ServingFrontEnd(served, plan)
                route, unroute = self._router(front, name, version, served)
                served.routes(route)
                served.unroutes(unroute)
            self._models[(name, version)] = (runtime, served, front)
        self.server.add_model(front)

    def _router(self, front: Any, name: str, version: str, owner: Runtime) -> tuple[Any, Any]:
        """What a handler's :meth:`~paddle_ipu.serving.runtime.Runtime.routes` and
        :meth:`~paddle_ipu.serving.runtime.Runtime.unroutes` are given: the requests of
        one input shape (or, with a bucket, of every length the bucket holds:
        :meth:`~paddle_ipu.serving.bucketed_runtime.BucketedRuntime.buckets`) go to that
        queue runtime from C++, without Python, until it closes (a shape's graph that
        left memory); the model's statistics of its specialisations follow."""

        def publish() -> None:
            stats = owner.specialisation_stats()
            if stats is not None:
                front.set_specialisations(stats.to_json())

        def plan_of(runtime: QueueRuntime) -> _core.ServingPlan:
            return _plan(
                runtime.queue_plan(),
                name,
                version,
                self.request_timeout_ms,
                self.max_body,
                self.instances,
            )

        def route(runtime: QueueRuntime, bucket: dict[str, Any] | None = None) -> None:
            shapes = [list(t.dims) for t in runtime.inputs]
            try:
                why = front.add_route(runtime.queue, plan_of(runtime), bucket)
            except Exception as e:  # the handler keeps serving the shape
                why = f"{type(e).__name__}: {e}"
            if why:
                log.warning(
                    "model %r: requests of input shapes %s keep going through Python: %s",
                    name,
                    shapes,
                    why,
                )
            else:
                log.debug("model %r: input shapes %s served without Python", name, shapes)
            publish()

        def unroute(runtime: QueueRuntime) -> None:
            try:
                why = front.remove_route(runtime.queue, plan_of(runtime))
            except Exception as e:  # the route stays; its closed queue sends requests back
                why = f"{type(e).__name__}: {e}"
            if why:
                log.debug("model %r: a closed shape's route stays: %s", name, why)
            publish()

        publish()
        return route, unroute

    def models(self) -> list[tuple[str, str, str, str]]:
        """Every model version the server knows: (name, version, state, reason)."""
        return [tuple(e) for e in self.server.entries()]  # type: ignore[misc]

    def front_end(self, name: str, version: str = "") -> Any:
        """The C++ front end serving ``name`` (``version`` "": the newest ready one)."""
        fe, _status, message = self.server.find(name, version)
        if fe is None:
            raise OptionError(message)
        return fe

    def remove_model(
        self, name: str, version: str | None = None, *, timeout: float | None = 60.0
    ) -> list[str]:
        """Stop serving ``name`` (every version, or ``version``): new requests are
        refused (404), those in flight are answered, then its runtime closes.  Other
        models are not touched.  Returns the versions removed."""
        return self._unload(name, version, timeout, forget=True)

    def _unload(
        self,
        name: str,
        version: str | None,
        timeout: float | None,
        *,
        forget: bool,
        reason: str = "unloaded",
    ) -> list[str]:
        with self._models_lock:
            keys = [k for k in self._models if k[0] == name and version in (None, k[1])]
            if not keys:
                raise OptionError(
                    f"model {name!r}"
                    + (f" version {version!r}" if version else "")
                    + f" is not served (served: {sorted(self._models)})"
                )
            taken = [(k, self._models.pop(k)) for k in keys]
        wait = -1.0 if timeout is None else float(timeout)
        for (n, v), (_, runtime, front) in taken:
            self.server.set_state(n, v, "UNLOADING", "")
            front.close()
            if not front.drain(wait):
                log.warning(
                    "model %r version %r: %d request(s) still in flight %s s after its "
                    "unload began",
                    n,
                    v,
                    front.active,
                    timeout,
                )
            front.stop_workers()
            runtime.close()
            if forget:
                self.server.forget(n, v)
            else:
                self.server.set_state(n, v, "UNAVAILABLE", reason)
        return [k[1] for k, _ in taken]

    def served(self) -> dict[tuple[str, str], Any]:
        """The runtimes served, by (name, version)."""
        with self._models_lock:
            return {k: given for k, (given, _, _) in self._models.items()}

    # -- the warm-up ---------------------------------------------------------------
    def _warm_up(self) -> None:
        try:
            with self._models_lock:
                served = [rt for _, rt, _ in self._models.values()]
            for rt in served:
                if rt.kind != "queue":
                    rt.warm_up()  # what it declares (a model compiled per input shape's)
                    continue
                queue = _queue_runtime(rt)
                feed = queue.warmup_feed()
                for _ in range(self.warmup):
                    if self._stopped:  # stopped while warming up: never ready
                        return
                    queue.run(feed)
        except BaseException as exc:  # reported by serve_forever; never ready
            self.warmup_error = exc
            log.error("the warm-up failed: %s", exc)
            return
        log.info("warm-up done: %d run(s) per model", self.warmup)
        with self._lock:
            if not self._stopped:
                self.server.set_ready(True)

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait for the warm-up runs; True when done (or there are none)."""
        if self._warmup_thread is not None:
            self._warmup_thread.join(timeout)
            return not self._warmup_thread.is_alive() and self.warmup_error is None
        return True

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> InferenceServer:
        """Serve on background threads; returns once the ports are open (and the
        repository's models are loaded; readiness answers 503 until the ``warmup``
        runs are done)."""
        with self._lock:
            if self._started:
                raise OptionError("the server is already started")
            self._started = True
            if self.warmup:
                self.server.set_ready(False)
            if self.repository is not None:
                self.repository.start()
            try:
                self.port = int(
                    self.server.start_http(self.host, int(self.port), self.threads, self.reuse_port)
                )
            except RuntimeError as exc:
                raise OSError(str(exc)) from None
            if self.grpc_port is not None:
                from paddle_ipu.serving.grpc_service import GrpcService

                self._grpc = GrpcService(self, self.grpc_port)
                self.grpc_port = self._grpc.port
            if self.repository is not None:
                self.server.enable_control()
                self._control = threading.Thread(
                    target=self._control_loop, name="paddle-ipu-repository", daemon=True
                )
                self._control.start()
            if self.warmup:
                self._warmup_thread = threading.Thread(
                    target=self._warm_up, name="paddle-ipu-warmup", daemon=True
                )
                self._warmup_thread.start()
        log.info("serving %s on http://%s:%d", self._what(), self.host, self.port)
        return self

    def _what(self) -> str:
        if self.repository is not None:
            return f"the model repository {str(self.repository.path)!r}"
        names = sorted({n for n, _ in self._models})
        return repr(names[0]) if len(names) == 1 else f"models {names}"

    def _control_loop(self) -> None:
        """The HTTP load / unload requests, one at a time (gRPC's come through
        :meth:`control` directly)."""
        while True:
            job = self.server.next_control(-1.0)
            if job is None:
                return
            ident, action, model, body = job
            try:
                status, answer = self.control(action, model, bytes(body))
            except Exception as exc:  # answered: a client never waits for nothing
                log.exception("the %s of model %r failed", action, model)
                status, answer = 500, json.dumps({"error": f"{action} of {model!r}: {exc}"})
            self.server.control_done(ident, status, answer)

    def control(self, action: str, model: str, body: bytes | dict[str, Any]) -> tuple[int, str]:
        """A load or unload request of the repository extension: (HTTP status, JSON
        answer)."""
        if self.repository is None:
            return 400, json.dumps({"error": "this server has no model repository"})
        return self.repository.control(action, model, body)

    def stop(self, timeout: float | None = 60.0) -> None:
        """Graceful stop: readiness turns 503 at once; after ``drain_grace_s`` seconds
        of serving as before, no new connections (idle ones close); requests in flight
        are answered; then every runtime answers what it has queued and closes.  Waits
        at most ``timeout`` seconds for the requests in flight."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self.server.set_ready(False)
        wait = -1.0 if timeout is None else float(timeout)
        if self.drain_grace_s > 0:
            time.sleep(self.drain_grace_s)
        self.server.stop_accepting()
        self.server.close_control()
        if self._control is not None:
            self._control.join(timeout)
        if self._grpc is not None:
            self._grpc.stop(timeout)
        if not self.server.drain(wait):
            log.warning(
                "%d request(s) were still in flight %s s after the stop began",
                self.server.active,
                timeout,
            )
        if self._warmup_thread is not None:
            self._warmup_thread.join(timeout)
        with self._models_lock:
            served = list(self._models.values())
        for _, runtime, front in served:
            front.close()
            front.stop_workers()
            runtime.close()
        self.server.shutdown()
        self.server.flush_access_log()

    def serve_forever(self) -> None:
        """Serve until SIGINT or SIGTERM, then stop gracefully (see :meth:`stop`)."""
        # The handler only records the signal: a lock taken in a signal handler (as
        # threading.Event.set() takes its condition's) deadlocks when the signal lands
        # while the main thread holds that lock (inside Event.wait()).
        received: list[int] = []
        previous = {
            sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self.start()
            grpc = f" and grpc://{self.host}:{self.grpc_port}" if self._grpc is not None else ""
            _say(f"paddle-ipu: serving {self._what()} on http://{self.host}:{self.port}{grpc}")
            while not received:
                time.sleep(0.1)  # interrupted by the signal, which runs its handler
                if self.warmup_error is not None:
                    raise self.warmup_error
            grace = f" (serving {self.drain_grace_s:g} s more)" if self.drain_grace_s else ""
            _say(f"paddle-ipu: draining{grace}")
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        _say("paddle-ipu: stopped")

    def prometheus(self) -> str:
        """Every model's counters and the server's in Prometheus' text format."""
        return str(self.server.prometheus())


def _say(line: str) -> None:
    """One line on stdout in one write: ``--workers`` processes share the pipe, and
    print's text and newline, written apart (unbuffered or line-buffered), interleave
    with another process's line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _queue_runtime(runtime: Runtime) -> QueueRuntime:
    """A runtime of kind ``"queue"`` as the :class:`QueueRuntime` it declares itself."""
    if not isinstance(runtime, QueueRuntime):
        raise NotSupportedError(
            f"{type(runtime).__name__} declares kind 'queue' but lacks a QueueRuntime's "
            "queue, queue_plan(), warmup_feed() or run()"
        )
    return runtime
