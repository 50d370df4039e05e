"""The inference server over the model runtime (``paddle-ipu serve``).

It speaks the KServe v2 / Triton inference protocol over HTTP and, with ``grpc_port``,
over gRPC (``inference.GRPCInferenceService``), so existing clients
(``tritonclient.http``, ``tritonclient.grpc``, KServe's) work unchanged:

- ``GET /v2/health/live``, ``GET /v2/health/ready`` (``{"live": true}``,
  ``{"ready": true}``; 503 while warming up or draining), ``GET /v2``;
- ``GET /v2/models/{name}[/versions/{v}]`` (metadata), ``.../ready``, ``.../config``
  (Triton's model configuration: ``max_batch_size``, the dynamic batching and queue
  policy in force), ``.../stats`` and ``GET /v2/models/stats`` (Triton's statistics);
- Triton's model repository extension: ``POST /v2/repository/index`` (every model
  version the server knows, with its state and reason), ``POST
  /v2/repository/models/{name}/load`` and ``.../unload`` (with a
  :class:`~paddle_ipu.serving.repository.ModelRepository` in control mode
  ``explicit``);
- ``POST /v2/models/{name}[/versions/{v}]/infer`` with JSON tensors, or with the
  binary tensor extension (``Inference-Header-Content-Length``: a JSON header
  followed by the raw tensors; ``binary_data_size`` per input, ``binary_data`` /
  ``binary_data_output`` to get outputs as raw bytes);
- ``GET /metrics``: Prometheus text (requests by status, rows, histograms of request,
  queue and compute time per request, runs and their fill, refusals, timeouts,
  disconnects, requests in flight).

Request parameters: ``timeout`` and ``binary_data_output``; Triton's reserved
``priority`` and ``sequence_*`` only at their defaults; any other is refused (400 /
INVALID_ARGUMENT) by name.  ``access_log`` writes a JSON line per inference request
from C++ (with the W3C ``traceparent`` trace id).

Every error, on every route (unknown ones included), is a JSON ``{"error": ...}``.

One server serves several models (:meth:`InferenceServer.add_model`, or a model
repository): each model version has its own runtime, queue, plan and counters, and the
models share the server's IO threads and ports; a request goes to its model by its URL
(HTTP) or its ``model_name`` / ``model_version`` (gRPC), to the newest ready version
when it names none.

The request path is C++ (``paddle_ipu._core.ServingServer`` routing to one
``ServingFrontEnd`` per model version, csrc/serving): an IO
thread (Boost.Beast) parses and checks a request, and admits it to the runtime's queue
without the GIL; the queue reads its inputs from the request body and writes its
outputs into the response body; the runtime's worker takes the GIL once per graph run.
No Python runs per request, over HTTP or gRPC (the gRPC port is served by the same
IO threads, through nghttp2; only gRPC's control-plane RPCs reach Python).

Dynamic models (request shapes that vary beyond the rows, BYTES tensors, Python code:
:mod:`paddle_ipu.serving.dynamic`) take the same routes and policies; their requests
are parsed and checked in C++ (each input against its declared dims, -1 open) and a
worker thread of the front end hands them to the model's handler, so Python runs once
per request for them.  The handler interface:

- ``inputs`` / ``outputs``: sequences of
  :class:`~paddle_ipu.serving.dynamic.TensorSpec` (``name``, KServe v2 ``datatype``
  such as ``"FP32"``, ``"UINT8"`` or ``"BYTES"``, ``dims`` with -1 where open);
- ``submit(feed: dict[str, np.ndarray]) -> concurrent.futures.Future`` of
  ``dict[str, np.ndarray]`` or a list in the order of ``outputs`` (BYTES: object
  arrays of ``bytes``); the server may cancel the future (timeout, client gone);
- ``close()`` (optional), once the model is unloaded.

:class:`~paddle_ipu.serving.dynamic.FunctionModel` wraps a plain callable;
:class:`~paddle_ipu.serving.shaped.ShapeRuntime` and
:class:`~paddle_ipu.serving.bucketed_runtime.BucketedRuntime` are served as they are.

Policies:

- the queue is bounded (the runtime's ``num_buffers``): a request that does not fit
  gets 503 (gRPC UNAVAILABLE) with ``Retry-After`` at once, instead of waiting;
- a request not started within its timeout (``request_timeout_ms``, or the request's
  own ``timeout`` parameter in microseconds, or a gRPC deadline) is taken out of the
  queue and answered 504 (gRPC DEADLINE_EXCEEDED);
- a request whose client closed its connection (or cancelled its gRPC call) is taken
  out of the queue before it is computed;
- ``warmup`` runs keep readiness at 503 until they are done;
- :meth:`InferenceServer.stop` (SIGTERM under :meth:`serve_forever`) turns readiness
  503 at once, serves ``drain_grace_s`` more seconds, then drains: the listening
  sockets and idle connections close, requests in flight are answered, then the
  runtime closes after answering what it has queued;
- bad input (a malformed binary header, a body over ``max_body_mb``, a wrong
  datatype or shape, a truncated tensor, an unknown model or output) gets a 4xx
  (gRPC INVALID_ARGUMENT / NOT_FOUND) whose message names the input, and the server
  keeps serving.

gRPC needs the ``serve`` extra (``pip install paddle-ipu[serve]``: tritonclient's
generated protocol messages, for the control-plane RPCs); HTTP needs nothing beyond
the package.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from paddle_ipu import _core
from paddle_ipu.errors import NotSupportedError, OptionError
from paddle_ipu.serving.bucketed_runtime import BucketedRuntime
from paddle_ipu.serving.dynamic import runtime_model, v2_datatype

if TYPE_CHECKING:
    from paddle_ipu.serving.repository import ModelRepository

log = logging.getLogger("paddle_ipu")

__all__ = ["InferenceServer"]


def _plan(
    runtime: Any,
    name: str,
    version: str,
    request_timeout_ms: float,
    max_body: int,
    instances: int = 1,
) -> dict[str, Any]:
    """What the C++ front end checks a request against (the runtime's own checks)."""
    from paddle_ipu._version import __version__

    rt = runtime
    model = rt.executor.model
    feed_shapes, out_shapes = rt.request_shapes()

    def tensors(specs: Any, shapes: Any, units: Any, ranges: bool) -> list[dict[str, Any]]:
        out = []
        for spec, shape, unit in zip(specs, shapes, units):
            tname = spec.paddle_name or spec.name
            dtype = np.dtype(spec.numpy_dtype)
            out.append(
                {
                    "name": tname,
                    "datatype": v2_datatype(dtype, tname),
                    "shape": [int(d) for d in shape],
                    "unit_bytes": int(np.prod(unit, dtype=np.int64)) * dtype.itemsize,
                    "ranges": [
                        {
                            "low": int(r.low),
                            "high": int(r.high),
                            "allowed": [int(v) for v in r.allowed],
                            "column": r.column,
                            "describe": r.describe(),
                        }
                        for r in (spec.ranges if ranges else ())
                    ],
                }
            )
        return out

    return {
        "name": name,
        "version": version,
        "server_version": __version__,
        "auto_batch": bool(rt.auto_batch),
        "max_rows": int(rt.max_request_rows),
        "capacity": int(rt.queue_capacity),
        "limit": int(rt.queue_limit),
        "micro_batch_size": int(rt.micro_batch_size),
        "batch_timeout_us": float(rt.timeout_ms) * 1e3,
        "request_timeout_s": request_timeout_ms / 1e3,
        "max_body": max_body,
        "instance_count": instances,
        # Triton's kinds: the host backend computes on the CPU; on IPUs the model places
        # itself (KIND_MODEL).
        "instance_kind": "KIND_CPU" if rt.executor.backend == "host" else "KIND_MODEL",
        "inputs": tensors(model.inputs, feed_shapes, rt.unit_shapes()[0], True),
        "outputs": tensors(model.outputs, out_shapes, rt.unit_shapes()[1], False),
    }


def _is_fixed(runtime: Any) -> bool:
    """A fixed model: a runtime over one ServingQueue (its step buffers are fed from
    C++); anything else is served as a dynamic model."""
    return hasattr(runtime, "_queue") and getattr(runtime, "sequence", None) is None


def _check_servable(runtime: Any) -> None:
    if _is_fixed(runtime):
        return
    if not (
        hasattr(runtime, "submit")
        and (hasattr(runtime, "inputs") or hasattr(runtime, "request_shapes"))
    ):
        raise NotSupportedError(
            f"{type(runtime).__name__} is no model this server serves: a ModelRuntime, or a "
            "dynamic model (paddle_ipu.serving.dynamic.DynamicModel: inputs, outputs, "
            "submit(feed) -> Future), or a runtime with submit(feed) and request_shapes()"
        )


def _dynamic_plan(
    model: Any,
    name: str,
    version: str,
    request_timeout_ms: float,
    max_body: int,
    queue_limit: int,
    workers: int,
) -> dict[str, Any]:
    """The plan of a dynamic model: its declared tensors (-1: open) and its queue's
    bound."""
    from paddle_ipu._version import __version__

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": s.name,
                "datatype": s.datatype,
                "shape": [int(d) for d in s.dims],
                "unit_bytes": 0,
            }
            for s in specs
        ]

    return {
        "name": name,
        "version": version,
        "server_version": __version__,
        "auto_batch": False,
        "max_rows": 0,
        "capacity": 1,
        "limit": int(queue_limit),
        "micro_batch_size": 0,
        "batch_timeout_us": 0.0,
        "request_timeout_s": request_timeout_ms / 1e3,
        "max_body": max_body,
        "inputs": tensors(model.inputs),
        "outputs": tensors(model.outputs),
        "dynamic": True,
        "workers": int(workers),
    }


def _close(runtime: Any) -> None:
    close = getattr(runtime, "close", None)
    if close is not None:
        close()


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
    ) -> None:
        from paddle_ipu._version import __version__

        if runtime is not None:
            _check_servable(runtime)
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
        self.server = _core.ServingServer(__version__, self.max_body)
        if access_log is not None:
            try:
                self.server.open_access_log(str(access_log))
            except RuntimeError as exc:
                raise OSError(str(exc)) from None
        self._warmup_thread: threading.Thread | None = None
        #: The warm-up's exception, if it failed (the server then never turns ready).
        self.warmup_error: BaseException | None = None
        # (name, version) -> (runtime, front end): the models served.
        self._models: dict[tuple[str, str], tuple[Any, Any]] = {}
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

        ``runtime`` is a :class:`~paddle_ipu.serving.ModelRuntime` (a fixed model: no
        Python per request), or a dynamic model
        (:class:`~paddle_ipu.serving.dynamic.DynamicModel`, or a runtime with
        ``submit(feed)`` and ``request_shapes()`` such as
        :class:`~paddle_ipu.serving.shaped.ShapeRuntime` and
        :class:`~paddle_ipu.serving.bucketed_runtime.BucketedRuntime`): its requests
        are parsed in C++ and handed to ``submit`` by ``workers`` threads; at most
        ``queue_limit`` of them are in flight (503 beyond)."""
        _check_servable(runtime)
        if not name or "/" in name or not version or "/" in version:
            raise OptionError(
                f"a model's name and version must be non-empty and hold no '/': got "
                f"name {name!r}, version {version!r}"
            )
        with self._models_lock:
            if (name, version) in self._models:
                raise OptionError(f"model {name!r} version {version!r} is served already")
            if _is_fixed(runtime):
                plan = _plan(
                    runtime, name, version, self.request_timeout_ms, self.max_body, self.instances
                )
                front = _core.ServingFrontEnd(runtime._queue, plan)
            else:
                if queue_limit < 1 or workers < 1:
                    raise OptionError(
                        f"queue_limit and workers must be >= 1, got {queue_limit}, {workers}"
                    )
                model = runtime_model(runtime)
                plan = _dynamic_plan(
                    model,
                    name,
                    version,
                    self.request_timeout_ms,
                    self.max_body,
                    queue_limit,
                    workers,
                )
                plan["instance_count"] = self.instances
                front = _core.ServingFrontEnd(model, plan)
                if hasattr(runtime, "on_runtime"):  # one fixed runtime per input shape
                    runtime.on_runtime(self._shape_router(front, name, version, runtime))
                if isinstance(runtime, BucketedRuntime):  # one per bucket of sequence lengths
                    route = self._router(front, name, version)
                    for bucket_runtime, bucket in runtime.buckets():
                        route(bucket_runtime, bucket)
            self._models[(name, version)] = (runtime, front)
        self.server.add_model(front)

    def _router(self, front: Any, name: str, version: str) -> Any:
        """What routes a dynamic model's requests of one input shape to that shape's
        fixed runtime, in C++ (no Python per request from then on); with a bucket
        (:meth:`~paddle_ipu.serving.bucketed_runtime.BucketedRuntime.buckets`), the
        requests of every length it holds."""

        def route(runtime: Any, bucket: dict[str, Any] | None = None) -> None:
            shapes = [list(s.shape) for s in runtime.executor.model.inputs]
            try:
                plan = _plan(
                    runtime, name, version, self.request_timeout_ms, self.max_body, self.instances
                )
                why = front.add_route(runtime._queue, plan, bucket)
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

        return route

    def _shape_router(self, front: Any, name: str, version: str, owner: Any) -> Any:
        """What routes the requests of a shape to its runtime in C++ while it lives
        (:meth:`_router`), stops routing them once it has closed (its specialisation
        left memory), and keeps the model's statistics of its specialisations."""
        route = self._router(front, name, version)

        def publish() -> None:
            stats = getattr(owner, "specialisation_stats", None)
            if stats is not None:
                front.set_specialisations(stats().to_json())

        def watch(runtime: Any, added: bool) -> None:
            if added:
                route(runtime)
            else:
                try:
                    plan = _plan(
                        runtime,
                        name,
                        version,
                        self.request_timeout_ms,
                        self.max_body,
                        self.instances,
                    )
                    why = front.remove_route(runtime._queue, plan)
                except Exception as e:  # the route stays; its closed queue sends requests back
                    why = f"{type(e).__name__}: {e}"
                if why:
                    log.debug("model %r: a closed shape's route stays: %s", name, why)
            publish()

        publish()
        return watch

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
        for (n, v), (runtime, front) in taken:
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
            _close(runtime)
            if forget:
                self.server.forget(n, v)
            else:
                self.server.set_state(n, v, "UNAVAILABLE", reason)
        return [k[1] for k, _ in taken]

    def served(self) -> dict[tuple[str, str], Any]:
        """The runtimes served, by (name, version)."""
        with self._models_lock:
            return {k: rt for k, (rt, _) in self._models.items()}

    # -- the warm-up ---------------------------------------------------------------
    @staticmethod
    def _warmup_feed(rt: Any) -> dict[str, np.ndarray]:
        """One full micro-batch (or queue unit) of every input: zeros, or for an input
        that indexes, the lowest value valid for every range it has."""
        feed_shapes, _ = rt.request_shapes()
        feed = {}
        for spec, shape in zip(rt.executor.model.inputs, feed_shapes):
            dims = [rt.queue_capacity if d == -1 else int(d) for d in shape]
            value = max((r.low for r in spec.ranges), default=0)
            feed[spec.paddle_name or spec.name] = np.full(dims, value, spec.numpy_dtype)
        return feed

    def _warm_up(self) -> None:
        try:
            for rt in self.served().values():
                if hasattr(rt, "warm_up"):  # compiled per input shape: its declared shapes
                    rt.warm_up()
                    continue
                if not _is_fixed(rt):
                    continue  # a dynamic model: no one shape to warm up with
                feed = self._warmup_feed(rt)
                for _ in range(self.warmup):
                    if self._stopped:  # stopped while warming up: never ready
                        return
                    rt.run(feed)
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
        for runtime, front in served:
            front.close()
            front.stop_workers()
            _close(runtime)
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
            print(
                f"paddle-ipu: serving {self._what()} on http://{self.host}:{self.port}{grpc}",
                flush=True,
            )
            while not received:
                time.sleep(0.1)  # interrupted by the signal, which runs its handler
                if self.warmup_error is not None:
                    raise self.warmup_error
            grace = f" (serving {self.drain_grace_s:g} s more)" if self.drain_grace_s else ""
            print(f"paddle-ipu: draining{grace}", flush=True)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        print("paddle-ipu: stopped", flush=True)

    def prometheus(self) -> str:
        """Every model's counters and the server's in Prometheus' text format."""
        return str(self.server.prometheus())
