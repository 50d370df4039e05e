"""The KServe v2 HTTP server in Python (aiohttp), for packages whose request shapes vary
beyond the batch: buckets of sequence lengths (``paddle-ipu serve --seq-buckets``).

:class:`~paddle_ipu.serving.server.InferenceServer`'s request path is C++ and checks one
fixed shape per tensor; a bucketed package takes any sequence length up to its longest
bucket, pads a request to the shortest bucket that holds it and cuts the answer back
(:class:`~paddle_ipu.serving.BucketedRuntime`), so it is served here instead: HTTP only
(no gRPC), one process, a Python round trip per request (slower than the C++ path).

It speaks the KServe v2 / Triton HTTP inference protocol, so existing clients
(``tritonclient.http``, KServe's) work unchanged:

- ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2``;
- ``GET /v2/models/{name}[/versions/{v}]`` (metadata) and ``.../ready``;
- ``POST /v2/models/{name}[/versions/{v}]/infer`` with JSON tensors, or with the
  binary tensor extension (``Inference-Header-Content-Length``: a JSON header
  followed by the raw tensors; ``binary_data_size`` per input, ``binary_data`` /
  ``binary_data_output`` to get outputs as raw bytes);
- ``GET /metrics``: Prometheus text (requests, rows, runs and their fill, queue
  and compute time).

A bad request gets a 4xx whose message names the input; the server keeps serving.
:meth:`PythonInferenceServer.stop` is graceful: the listening socket closes, requests in
flight are answered, then the runtime is closed after answering what it has queued.

Needs the ``serve`` extra (``pip install paddle-ipu[serve]``: aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from paddle_ipu import _core
from paddle_ipu.errors import (
    FeedError,
    IpuError,
    NotSupportedError,
    RuntimeBusyError,
    RuntimeClosedError,
)

log = logging.getLogger("paddle_ipu")

__all__ = ["PythonInferenceServer"]

_HEADER_LENGTH = "Inference-Header-Content-Length"

# KServe v2 datatypes <-> numpy: the C++ front end's table (csrc/serving/dtypes.cc).
_V2_TO_NUMPY = {v2: np.dtype(numpy) for v2, numpy, _ in _core.kserve_datatypes()}
_NUMPY_TO_V2 = {v: k for k, v in _V2_TO_NUMPY.items()}

# The protocol's way of saying the service is overloaded or going away.
_BUSY_WAIT_S = 30.0


#: Triton's reserved request parameters, accepted at their default values.
_RESERVED = ("timeout", "priority", "sequence_id", "sequence_start", "sequence_end")


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _v2_dtype(dtype: np.dtype) -> str:
    name = _NUMPY_TO_V2.get(np.dtype(dtype))
    if name is None:
        raise NotSupportedError(f"dtype {dtype} has no KServe v2 datatype")
    return name


class _Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.success = 0
        self.failure: dict[int, int] = {}
        self.rows = 0
        self.duration = 0.0

    def done(self, status: int, rows: int, seconds: float) -> None:
        with self.lock:
            if status == 200:
                self.success += 1
                self.rows += rows
            else:
                self.failure[status] = self.failure.get(status, 0) + 1
            self.duration += seconds


class PythonInferenceServer:
    """Serve one model runtime over HTTP, in Python (see the module docstring).

    Args:
        runtime: a started :class:`~paddle_ipu.serving.BucketedRuntime` (or
            :class:`~paddle_ipu.serving.ModelRuntime`).
        name: the model's name in the URLs.
        host, port: where to listen (port 0: a free port, see :attr:`port`).
        version: the model version reported (any version in a URL is accepted only
            if it is this one).
    """

    def __init__(
        self,
        runtime: Any,
        name: str = "model",
        host: str = "127.0.0.1",
        port: int = 8000,
        version: str = "1",
    ) -> None:
        try:
            import aiohttp  # noqa: F401
        except ImportError as exc:
            raise NotSupportedError(
                "the HTTP server needs aiohttp: pip install 'paddle-ipu[serve]'"
            ) from exc
        self.runtime = runtime
        self.name = name
        self.host = host
        self.port = port
        self.version = version
        self.metrics = _Metrics()
        feed_shapes, out_shapes = runtime.request_shapes()
        model = runtime.executor.model
        self._inputs = [
            (s.paddle_name or s.name, np.dtype(s.dtype), shape)
            for s, shape in zip(model.inputs, feed_shapes)
        ]
        self._outputs = [
            (s.paddle_name or s.name, np.dtype(s.dtype), shape)
            for s, shape in zip(model.outputs, out_shapes)
        ]
        self._ready = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- lifecycle ---------------------------------------------------------------
    def _app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=1 << 30)
        r = app.router
        r.add_get("/v2/health/live", self._live)
        r.add_get("/v2/health/ready", self._ready_h)
        r.add_get("/v2", self._server_meta)
        r.add_get("/metrics", self._metrics)
        for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            r.add_get(base, self._model_meta)
            r.add_get(base + "/ready", self._model_ready)
            r.add_post(base + "/infer", self._infer)
        return app

    async def _start(self) -> None:
        from aiohttp import web

        self._runner = web.AppRunner(
            self._app(), handle_signals=False, shutdown_timeout=60.0, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        self._ready = True
        log.info("serving %r on http://%s:%d", self.name, self.host, self.port)

    async def _stop(self) -> None:
        self._ready = False
        if self._runner is not None:
            # Closes the listening socket, then waits for handlers in flight.
            await self._runner.cleanup()

    def start(self) -> PythonInferenceServer:
        """Serve on a background thread; returns once the port is open."""
        started = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._start())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._stop())
            loop.close()
            self._stopped.set()

        self._thread = threading.Thread(target=main, name="paddle-ipu-http", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self, timeout: float | None = 60.0) -> None:
        """Graceful stop: no new connections; requests in flight are answered; then
        the runtime answers what it has queued and closes."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        self.runtime.close()

    def serve_forever(self) -> None:
        """Serve in the calling thread until SIGINT or SIGTERM, then stop gracefully."""
        import signal

        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self._start())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, loop.stop)
        print(f"paddle-ipu: serving {self.name!r} on http://{self.host}:{self.port}", flush=True)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._stop())
            loop.close()
            self.runtime.close()
            print("paddle-ipu: stopped", flush=True)

    # -- handlers -----------------------------------------------------------------
    def _check_model(self, request: Any) -> None:
        name = request.match_info.get("name")
        if name != self.name:
            raise BadRequest(f"unknown model {name!r}: this server serves {self.name!r}", 404)
        version = request.match_info.get("version")
        if version not in (None, "", self.version):
            raise BadRequest(
                f"model {name!r} has no version {version!r}: it has version {self.version!r}",
                404,
            )

    @staticmethod
    def _error(message: str, status: int) -> Any:
        from aiohttp import web

        return web.json_response({"error": message}, status=status)

    async def _live(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"live": True})

    async def _ready_h(self, request: Any) -> Any:
        from aiohttp import web

        ok = self._ready and not self.runtime.closed
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def _server_meta(self, request: Any) -> Any:
        from aiohttp import web

        from paddle_ipu._version import __version__

        return web.json_response(
            {"name": "paddle-ipu", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    async def _model_meta(self, request: Any) -> Any:
        from aiohttp import web

        try:
            self._check_model(request)
        except BadRequest as exc:
            return self._error(str(exc), exc.status)
        return web.json_response(
            {
                "name": self.name,
                "versions": [self.version],
                "platform": "paddle_ipu",
                "inputs": [
                    {"name": n, "datatype": _v2_dtype(d), "shape": list(s)}
                    for n, d, s in self._inputs
                ],
                "outputs": [
                    {"name": n, "datatype": _v2_dtype(d), "shape": list(s)}
                    for n, d, s in self._outputs
                ],
            }
        )

    async def _model_ready(self, request: Any) -> Any:
        try:
            self._check_model(request)
        except BadRequest as exc:
            return self._error(str(exc), exc.status)
        return await self._ready_h(request)

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=self.prometheus(), content_type="text/plain", charset="utf-8")

    async def _infer(self, request: Any) -> Any:
        t0 = time.perf_counter()
        rows = 0
        try:
            self._check_model(request)
            body = await request.read()
            header_len = request.headers.get(_HEADER_LENGTH)
            feed, wanted, binary_out, request_id = self._parse(body, header_len)
            rows = _rows(feed)
            outputs = await self._run(feed)
            response = self._respond(outputs, wanted, binary_out, request_id)
            status = 200
        except BadRequest as exc:
            response, status = self._error(str(exc), exc.status), exc.status
        except (FeedError, NotSupportedError) as exc:
            response, status = self._error(str(exc), 400), 400
        except (RuntimeBusyError, RuntimeClosedError) as exc:
            response, status = self._error(str(exc), 503), 503
        except IpuError as exc:
            response, status = self._error(str(exc), 500), 500
        except Exception as exc:  # a failing run: the server keeps serving
            log.exception("inference failed")
            response, status = self._error(f"inference failed: {exc!r}", 500), 500
        self.metrics.done(status, rows, time.perf_counter() - t0)
        return response

    async def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        try:
            future: Future[list[np.ndarray]] = self.runtime.submit(feed, timeout=0.0)
        except RuntimeBusyError:
            # Full: wait for space off the event loop, so other requests proceed.
            future = await loop.run_in_executor(
                None, lambda: self.runtime.submit(feed, timeout=_BUSY_WAIT_S)
            )
        return await asyncio.wrap_future(future)

    # -- the protocol -------------------------------------------------------------
    def _parse(
        self, body: bytes, header_len: str | None
    ) -> tuple[dict[str, np.ndarray], list[tuple[str, bool]] | None, bool, str | None]:
        if header_len is not None:
            try:
                n = int(header_len)
            except ValueError:
                raise BadRequest(
                    f"{_HEADER_LENGTH} must be an integer, got {header_len!r}"
                ) from None
            if not 0 <= n <= len(body):
                raise BadRequest(f"{_HEADER_LENGTH} is {n}, but the body has {len(body)} bytes")
            head, blob = body[:n], memoryview(body)[n:]
        else:
            head, blob = body, memoryview(b"")
        try:
            doc = json.loads(head)
        except ValueError as exc:
            raise BadRequest(f"the request is not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
            raise BadRequest('the request must be a JSON object with an "inputs" list')
        known = {n: d for n, d, _ in self._inputs}
        feed: dict[str, np.ndarray] = {}
        offset = 0
        for item in doc["inputs"]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise BadRequest('every input must be an object with a "name"')
            name = item["name"]
            if name not in known:
                raise BadRequest(f"unknown input {name!r}: the model takes {sorted(known)}")
            if name in feed:
                raise BadRequest(f"input {name!r} is given twice")
            datatype = item.get("datatype")
            dtype = _V2_TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
            if dtype is None:
                raise BadRequest(
                    f"input {name!r}: datatype {datatype!r} is not supported; use "
                    f"{_v2_dtype(known[name])} (one of {sorted(_V2_TO_NUMPY)})"
                )
            shape = item.get("shape")
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise BadRequest(
                    f"input {name!r}: shape must be a list of ints >= 0, got {shape!r}"
                )
            count = int(np.prod(shape, dtype=np.int64))
            params = item.get("parameters") or {}
            size = params.get("binary_data_size") if isinstance(params, dict) else None
            if size is not None:
                if not isinstance(size, int) or size != count * dtype.itemsize:
                    raise BadRequest(
                        f"input {name!r}: binary_data_size is {size!r}, but shape {shape} of "
                        f"{datatype} takes {count * dtype.itemsize} bytes"
                    )
                if offset + size > len(blob):
                    raise BadRequest(
                        f"input {name!r}: the body ends {offset + size - len(blob)} bytes before "
                        f"this input's binary data"
                    )
                array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset)
                offset += size
            else:
                if "data" not in item:
                    raise BadRequest(f"input {name!r} has neither data nor binary_data_size")
                try:
                    array = np.asarray(item["data"], dtype=dtype)
                except (ValueError, TypeError) as exc:
                    raise BadRequest(f"input {name!r}: data is not {datatype}: {exc}") from None
                if array.size != count:
                    raise BadRequest(
                        f"input {name!r}: shape {shape} has {count} elements, data has {array.size}"
                    )
            feed[name] = array.reshape(shape)
        if offset != len(blob):
            raise BadRequest(
                f"the body has {len(blob) - offset} bytes of binary data that no input claims"
            )
        missing = [n for n in known if n not in feed]
        if missing:
            raise BadRequest(f"missing input {', '.join(map(repr, missing))}")
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f'"parameters" must be an object, got {params!r}')
        for key, value in params.items():
            # Only binary_data_output is implemented here; Triton's reserved parameters
            # pass at their defaults (0, "", false: what this server does).
            if key == "binary_data_output" or (key in _RESERVED and not value):
                continue
            raise BadRequest(
                f"parameter {key!r} is not implemented by the Python server (packages with "
                "buckets of sequence lengths): it implements 'binary_data_output' (and "
                f"{', '.join(map(repr, _RESERVED))} at their defaults)"
            )
        binary_default = bool(params.get("binary_data_output", False))
        wanted: list[tuple[str, bool]] | None = None
        outs = doc.get("outputs")
        if outs is not None:
            if not isinstance(outs, list):
                raise BadRequest('"outputs" must be a list')
            names = [n for n, _, _ in self._outputs]
            wanted = []
            for o in outs:
                oname = o.get("name") if isinstance(o, dict) else None
                if not isinstance(oname, str) or oname not in names:
                    raise BadRequest(f"unknown output {oname!r}: the model gives {names}")
                oparams = o.get("parameters") or {}
                wanted.append((oname, bool(oparams.get("binary_data", binary_default))))
        request_id = doc.get("id")
        return feed, wanted, binary_default, request_id if isinstance(request_id, str) else None

    def _respond(
        self,
        outputs: list[np.ndarray],
        wanted: list[tuple[str, bool]] | None,
        binary_default: bool,
        request_id: str | None,
    ) -> Any:
        from aiohttp import web

        by_name = {n: a for (n, _, _), a in zip(self._outputs, outputs)}
        if wanted is None:
            wanted = [(n, binary_default) for n, _, _ in self._outputs]
        items = []
        blobs = []
        for name, binary in wanted:
            array = np.ascontiguousarray(by_name[name])
            item: dict[str, Any] = {
                "name": name,
                "datatype": _v2_dtype(array.dtype),
                "shape": list(array.shape),
            }
            if binary:
                data = array.tobytes()
                item["parameters"] = {"binary_data_size": len(data)}
                blobs.append(data)
            else:
                item["data"] = array.reshape(-1).tolist()
            items.append(item)
        doc: dict[str, Any] = {
            "model_name": self.name,
            "model_version": self.version,
            "outputs": items,
        }
        if request_id is not None:
            doc["id"] = request_id
        head = json.dumps(doc).encode()
        if not blobs:
            return web.Response(body=head, content_type="application/json")
        return web.Response(
            body=b"".join([head, *blobs]),
            headers={_HEADER_LENGTH: str(len(head))},
            content_type="application/octet-stream",
        )

    # -- metrics ------------------------------------------------------------------
    def prometheus(self) -> str:
        """The server's and the runtime's counters in Prometheus' text format."""
        s = self.runtime.stats()
        m = self.metrics
        with m.lock:
            success, failure, rows, duration = m.success, dict(m.failure), m.rows, m.duration
        label = f'model="{self.name}",version="{self.version}"'
        lines = [
            "# HELP paddle_ipu_requests_total Inference requests by outcome.",
            "# TYPE paddle_ipu_requests_total counter",
            f'paddle_ipu_requests_total{{{label},status="200"}} {success}',
        ]
        for code, n in sorted(failure.items()):
            lines.append(f'paddle_ipu_requests_total{{{label},status="{code}"}} {n}')
        total_requests = success + sum(failure.values())
        lines += [
            "# HELP paddle_ipu_request_rows_total Rows of successful requests.",
            "# TYPE paddle_ipu_request_rows_total counter",
            f"paddle_ipu_request_rows_total{{{label}}} {rows}",
            "# HELP paddle_ipu_request_duration_seconds Time in the server per request.",
            "# TYPE paddle_ipu_request_duration_seconds summary",
            f"paddle_ipu_request_duration_seconds_sum{{{label}}} {duration:.6f}",
            f"paddle_ipu_request_duration_seconds_count{{{label}}} {total_requests}",
            "# HELP paddle_ipu_queue_seconds_total Time requests waited in the queue, summed.",
            "# TYPE paddle_ipu_queue_seconds_total counter",
            f"paddle_ipu_queue_seconds_total{{{label}}} {s.queue_seconds:.6f}",
            "# HELP paddle_ipu_compute_seconds_total Time the worker spent running the graph.",
            "# TYPE paddle_ipu_compute_seconds_total counter",
            f"paddle_ipu_compute_seconds_total{{{label}}} {s.busy_seconds:.6f}",
            "# HELP paddle_ipu_runs_total Graph runs (failed ones included).",
            "# TYPE paddle_ipu_runs_total counter",
            f"paddle_ipu_runs_total{{{label}}} {s.runs}",
            "# HELP paddle_ipu_failed_runs_total Graph runs that raised.",
            "# TYPE paddle_ipu_failed_runs_total counter",
            f"paddle_ipu_failed_runs_total{{{label}}} {s.failed_runs}",
            "# HELP paddle_ipu_padded_units_total Units of zero padding fed.",
            "# TYPE paddle_ipu_padded_units_total counter",
            f"paddle_ipu_padded_units_total{{{label}}} {s.padded_units}",
            "# HELP paddle_ipu_batch_size Units (rows) per graph run.",
            "# TYPE paddle_ipu_batch_size histogram",
        ]
        cumulative = 0
        total_units = 0
        for size, n in enumerate(s.fill_histogram):
            cumulative += n
            total_units += size * n
            lines.append(f'paddle_ipu_batch_size_bucket{{{label},le="{size}"}} {cumulative}')
        lines += [
            f'paddle_ipu_batch_size_bucket{{{label},le="+Inf"}} {cumulative}',
            f"paddle_ipu_batch_size_sum{{{label}}} {total_units}",
            f"paddle_ipu_batch_size_count{{{label}}} {cumulative}",
        ]
        return "\n".join(lines) + "\n"


def _rows(feed: dict[str, np.ndarray]) -> int:
    for array in feed.values():
        return int(array.shape[0]) if array.ndim else 1
    return 0
