"""The model runtime: serving a compiled inference graph with auto-batching.

A :class:`ModelRuntime` sits over a prepared inference :class:`~paddle_ipu.executor.IpuExecutor`.
Callers put requests on a queue -- synchronously with :meth:`ModelRuntime.run` (blocks
until the caller's outputs are filled) or asynchronously with :meth:`ModelRuntime.submit`
(returns a :class:`concurrent.futures.Future`) -- and one worker thread runs the graph,
one run (``batches_per_step`` micro-batches of ``micro_batch_size`` rows) at a time.

- ``timeout_ms > 0`` turns on auto-batching: requests of any number of rows are packed
  into micro-batches in arrival order; a request larger than a micro-batch is split
  across micro-batches (and runs); a run that is not full is flushed, zero-padded,
  ``timeout_ms`` after the oldest request waiting for it arrived.  Every caller gets
  exactly its own rows back, in order.  Every input and output must then have the batch
  dimension first (``shape[0] == micro_batch_size``); this is checked at start-up.
- ``timeout_ms == 0``: no auto-batching.  Every request is exactly one micro-batch (a
  :class:`~paddle_ipu.errors.FeedError` otherwise), and is run as soon as the worker is
  free, together with the other micro-batches already waiting (never waiting for more).
- ``num_buffers`` bounds the micro-batches in flight (queued or running).  A submit that
  would exceed it blocks until space frees up, or raises
  :class:`~paddle_ipu.errors.RuntimeBusyError` after its ``timeout``.  A request larger
  than the whole bound is admitted when nothing else is in flight.
- ``max_request_rows`` caps one request (default: :data:`MAX_REQUEST_RUNS` runs' worth
  of rows); a larger one is refused with a FeedError before anything is copied.

The queue itself is :class:`paddle_ipu._core.ServingQueue` (C++): a request holds
zero-copy views of its (validated) feeds and of the arrays it is answered in; the
worker packs rows straight into preallocated step buffers and scatters the outputs
back, without the GIL while it waits or copies.  :meth:`ModelRuntime.run` waits on
the request without the GIL; :meth:`ModelRuntime.submit` copies its feeds (the caller
may reuse them) and returns a future.

This is the role of the Poplar SDK's model runtime (ring buffers, a timeout that flushes
partial batches, a thread looping over the main program) in Paddle 2.x's executor, with
two of its limits removed: requests need not be full micro-batches when auto-batching
(they are packed and split here), and a partial batch is always flushed on time, even
while other data is readable.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from paddle_ipu import _core
from paddle_ipu.errors import (
    BackendError,
    IpuError,
    NotSupportedError,
    OptionError,
    RuntimeBusyError,
    RuntimeClosedError,
)
from paddle_ipu.executor.feeds import CheckedFeed, RequestChecks
from paddle_ipu.executor.ipu_executor import IpuExecutor
from paddle_ipu.options import OPTIONS, coerce
from paddle_ipu.serving.runtime import (
    PlanTensor,
    QueuePlan,
    QueueRuntime,
    RuntimeKind,
    RuntimeStats,
    TensorSpec,
    declared_specs,
    v2_datatype,
)

log = logging.getLogger("paddle_ipu")

__all__ = ["MAX_REQUEST_RUNS", "ModelRuntime", "RuntimeStats"]

_DONE = _core.RequestState.DONE

#: the default cap of one request, in runs: ``max_request_rows`` defaults to this many
#: runs of ``batches_per_step x micro_batch_size`` rows
MAX_REQUEST_RUNS = 64


class _RequestFuture(Future):
    """A future whose cancel() takes the request out of the queue while it has not
    started (the queue then never runs it)."""

    _request: Any = None
    _outs: list[np.ndarray] | None = None

    def cancel(self) -> bool:
        request = self._request
        if request is not None and not request.cancel():
            return False
        return super().cancel()


class _Closed:
    """What a closed runtime leaves as its executor's ``serving``
    (:class:`~paddle_ipu.executor.ipu_executor.Server`): closed, with no worker."""

    closed = True

    def is_worker_thread(self) -> bool:
        return False


_CLOSED = _Closed()


class ModelRuntime(QueueRuntime):
    """Queue-based serving over a prepared inference executor.

    Args:
        executor: a prepared inference :class:`~paddle_ipu.executor.IpuExecutor`.
        micro_batch_size, timeout_ms, num_buffers: override the executor's strategy.
        max_request_rows: the most rows one request may have when auto-batching
            (default: :data:`MAX_REQUEST_RUNS` runs' worth); a larger request is a
            FeedError, raised before the feed is cast or copied.
        start: start the worker thread now (default).

    The runtime is thread-safe: any number of threads may call :meth:`run` and
    :meth:`submit`.  Future callbacks run on the worker thread; keep them short.

    It is the :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"queue"``: the
    inference server's C++ front end admits requests into its queue (:attr:`queue`,
    :meth:`queue_plan`) without Python.
    """

    kind: RuntimeKind = "queue"

    def __init__(
        self,
        executor: IpuExecutor,
        *,
        micro_batch_size: int | None = None,
        timeout_ms: float | None = None,
        num_buffers: int | None = None,
        max_request_rows: int | None = None,
        start: bool = True,
    ) -> None:
        config = executor.config
        if config.is_training:
            raise OptionError(
                "the model runtime serves inference graphs only: compile with "
                "is_training=False (set_graph_config(is_training=False))"
            )
        if executor.session is None:
            raise BackendError("the executor is not prepared: call prepare() first")
        # The strategy's values were checked when its executor config was made; a value
        # given here is checked as the option is (the option table's one check).
        mbs = _option("micro_batch_size", micro_batch_size, config.micro_batch_size)
        timeout = _option("timeout_ms", timeout_ms, config.timeout_ms)
        buffers = _option("num_buffers", num_buffers, config.num_buffers)
        self.executor = executor
        self.micro_batch_size = mbs
        self.timeout_ms = timeout
        self.num_buffers = buffers
        self.auto_batch = timeout > 0.0
        model = executor.model
        self._inputs = list(model.inputs)
        self._outputs = list(model.outputs)
        self._micro_batches = executor.layout.micro_batches
        self._check_model(executor)
        # The unit of packing: a row when auto-batching, a micro-batch otherwise.
        per_mb = mbs if self.auto_batch else 1
        self._capacity = self._micro_batches * per_mb  # units per run
        self._limit = buffers * per_mb  # units in flight
        max_rows = (
            MAX_REQUEST_RUNS * self._micro_batches * mbs
            if max_request_rows is None
            else max_request_rows
        )
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise OptionError(f"max_request_rows must be an int >= 1, got {max_rows!r}")
        self.max_request_rows = max_rows
        if self.auto_batch:
            self._in_units = [tuple(s.shape[1:]) for s in self._inputs]
            self._out_units = [tuple(s.shape[1:]) for s in self._outputs]
        else:
            self._in_units = [tuple(s.shape) for s in self._inputs]
            self._out_units = [tuple(s.shape) for s in self._outputs]
        feed_shapes = [executor.layout.input_shape(s.shape) for s in self._inputs]
        #: the check of a request (the feed contract's: paddle_ipu.executor.feeds)
        self._checks = RequestChecks(
            self._inputs,
            auto_batch=self.auto_batch,
            micro_batch_size=mbs,
            max_request_rows=max_rows,
        )
        self._timeout_s = timeout / 1000.0
        # The step buffers the queue packs into, zeroed (padding), and the feed of a
        # run: views of them in the executor's step layout.
        self._steps = [
            np.zeros((self._capacity, *u), s.numpy_dtype)
            for u, s in zip(self._in_units, self._inputs)
        ]
        # Packed from checked requests (by the C++ request path, or by _checks): the
        # executor runs them without checking them again.
        self._run_feed = CheckedFeed(
            (spec.name, step.reshape(shape))
            for spec, step, shape in zip(self._inputs, self._steps, feed_shapes)
        )
        out_unit_bytes = [
            int(np.prod(u, dtype=np.int64)) * s.numpy_dtype.itemsize
            for u, s in zip(self._out_units, self._outputs)
        ]
        self._run_out_shapes = [(self._capacity, *u) for u in self._out_units]
        self._out_dtypes = [s.numpy_dtype for s in self._outputs]
        self._queue = _core.ServingQueue(
            self._steps,
            out_unit_bytes,
            self._capacity,
            self._limit,
            self._timeout_s,
            self.auto_batch,
        )
        feed_shapes_, out_shapes_ = self.request_shapes()
        #: the request's tensors as a server declares them (-1: the rows)
        self._specs = (
            declared_specs(self._inputs, feed_shapes_),
            declared_specs(self._outputs, out_shapes_),
        )
        self._lock = threading.Lock()  # start() and the failure below
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._worker_ident: int | None = None
        # The executor refuses direct runs once this runtime is closed (see
        # IpuExecutor._check_serving): they would be checked against the wrong shapes.
        executor.serving = self
        if start:
            self.start()

    # -- start-up checks --------------------------------------------------------
    def _check_model(self, executor: IpuExecutor) -> None:
        mbs = self.micro_batch_size
        if self._micro_batches > 1:
            anchors = executor.session_config().anchors
            for spec in self._outputs:
                art = anchors.get(spec.name)
                if art is not None and not (
                    art.kind == "ALL" or (art.kind == "EVERYN" and art.period == 1)
                ):
                    raise NotSupportedError(
                        f"the model runtime returns every micro-batch's output: output "
                        f"{spec.paddle_name or spec.name!r} has anchor return type {art.kind}; "
                        f"use ALL (set_anchor_config('ALL')) or batches_per_step=1"
                    )
        if not self.auto_batch:
            return
        for kind, specs in (("input", self._inputs), ("output", self._outputs)):
            for spec in specs:
                if not spec.shape or spec.shape[0] != mbs:
                    first = spec.shape[0] if spec.shape else "none (a scalar)"
                    raise NotSupportedError(
                        f"auto-batching (timeout_ms > 0) needs the batch dimension first in "
                        f"every input and output: {kind} {spec.paddle_name or spec.name!r} has "
                        f"shape {list(spec.shape)}, whose first dimension {first} is not "
                        f"micro_batch_size={mbs}. Check that micro_batch_size matches the "
                        f"program's batch dimension, or set timeout_ms=0 (no auto-batching)"
                    )

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> None:
        """Start the worker thread (done by the constructor unless ``start=False``)."""
        with self._lock:
            if self._queue.closed:
                raise RuntimeClosedError("the model runtime is closed; create a new one")
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._loop, name="paddle-ipu-model-runtime", daemon=True
            )
            self._thread.start()
        atexit.register(self.close)

    def request_shapes(self) -> tuple[list[list[int]], list[list[int]]]:
        """The feed and output shapes of one request, in compiled order; -1 marks
        the rows, any number of them, when auto-batching."""
        if self.auto_batch:
            return (
                [[-1, *s.shape[1:]] for s in self._inputs],
                [[-1, *s.shape[1:]] for s in self._outputs],
            )
        return [list(s.shape) for s in self._inputs], [list(s.shape) for s in self._outputs]

    def unit_shapes(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """The shape of one queue unit of every input and output (a row when
        auto-batching, else the whole micro-batch), in compiled order."""
        return list(self._in_units), list(self._out_units)

    # -- the Runtime protocol (paddle_ipu.serving.runtime) -------------------------
    @property
    def inputs(self) -> list[TensorSpec]:
        """The request's inputs (name, KServe v2 datatype, dims; -1: the rows)."""
        return list(self._specs[0])

    @property
    def outputs(self) -> list[TensorSpec]:
        """The request's outputs (name, KServe v2 datatype, dims; -1: the rows)."""
        return list(self._specs[1])

    @property
    def queue(self) -> Any:
        """The :class:`~paddle_ipu._core.ServingQueue` requests are admitted into."""
        return self._queue

    def queue_plan(self) -> QueuePlan:
        """What the C++ front end checks a request against before it admits it into
        :attr:`queue` (the checks of :meth:`run`)."""
        feed_shapes, out_shapes = self.request_shapes()
        in_units, out_units = self.unit_shapes()

        def tensors(
            specs: list[Any], shapes: list[list[int]], units: list[tuple[int, ...]], ranges: bool
        ) -> tuple[PlanTensor, ...]:
            out = []
            for spec, shape, unit in zip(specs, shapes, units):
                name = spec.paddle_name or spec.name
                dtype = np.dtype(spec.numpy_dtype)
                out.append(
                    PlanTensor(
                        name,
                        v2_datatype(dtype, name),
                        tuple(int(d) for d in shape),
                        int(np.prod(unit, dtype=np.int64)) * dtype.itemsize,
                        tuple(spec.ranges) if ranges else (),
                    )
                )
            return tuple(out)

        return QueuePlan(
            auto_batch=self.auto_batch,
            max_rows=self.max_request_rows,
            capacity=self._capacity,
            limit=self._limit,
            micro_batch_size=self.micro_batch_size,
            batch_timeout_us=self.timeout_ms * 1e3,
            # Triton's kinds: the host backend computes on the CPU; on IPUs the model
            # places itself (KIND_MODEL).
            instance_kind="KIND_CPU" if self.executor.backend == "host" else "KIND_MODEL",
            inputs=tensors(self._inputs, feed_shapes, in_units, True),
            outputs=tensors(self._outputs, out_shapes, out_units, False),
        )

    def warmup_feed(self) -> dict[str, np.ndarray]:
        """One full run of every input: zeros, or for an input that indexes, the lowest
        value valid for every range it has."""
        feed_shapes, _ = self.request_shapes()
        feed = {}
        for spec, shape in zip(self._inputs, feed_shapes):
            dims = [self._capacity if d == -1 else int(d) for d in shape]
            value = max((r.low for r in spec.ranges), default=0)
            feed[spec.paddle_name or spec.name] = np.full(dims, value, spec.numpy_dtype)
        return feed

    def routes(self, route: Any) -> None:
        """None: its requests are admitted into :attr:`queue` itself."""
        return None

    @property
    def queue_capacity(self) -> int:
        """Units (rows when auto-batching, else micro-batches) per graph run."""
        return self._capacity

    @property
    def queue_limit(self) -> int:
        """Units admitted at most at once (``num_buffers`` micro-batches' worth)."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """Units (rows when auto-batching, else micro-batches) admitted and not yet answered."""
        return int(self._queue.in_flight)

    @property
    def closed(self) -> bool:
        return bool(self._queue.closed)

    def is_worker_thread(self) -> bool:
        """Whether the caller is this runtime's worker thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Stop the runtime.  Requests already queued are run and answered; with
        ``cancel=True`` they fail with :class:`~paddle_ipu.errors.RuntimeClosedError`
        instead (a run already under way completes).  Later submits raise
        RuntimeClosedError.  Waits up to ``timeout`` seconds (default: no limit) for
        the worker to finish.  Idempotent."""
        with self._lock:
            self._queue.close(cancel)
            thread = self._thread
        if thread is None:
            self._fail_pending(RuntimeClosedError("the model runtime was closed before it started"))
        elif thread is not threading.current_thread():
            thread.join(timeout)
        atexit.unregister(self.close)
        # The executor keeps refusing direct runs, without a reference back here: the
        # runtime and the executor no longer hold each other, and both go (with the
        # queue's step buffers and the graph) when their owner drops them, not at the
        # garbage collector's next full pass
        if (thread is None or not thread.is_alive()) and self.executor.serving is self:
            self.executor.serving = _CLOSED

    def __enter__(self) -> ModelRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def buffer_bytes(self) -> int:
        """The bytes of the step buffers requests are packed into (held while it lives)."""
        return sum(int(step.nbytes) for step in self._steps)

    def stats(self) -> RuntimeStats:
        """A copy of the runtime's counters."""
        return RuntimeStats(**self._queue.stats())

    # -- entry points -----------------------------------------------------------
    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> list[np.ndarray]:
        """Run one request and wait for its outputs (in the compiled fetch order).

        The feeds are not copied: the queue reads them in place while the caller
        waits.  ``timeout`` bounds the wait for queue space (RuntimeBusyError), not
        the run."""
        if threading.get_ident() == self._worker_ident:
            raise IpuError(
                "ModelRuntime.run was called from the runtime's own worker thread (a future "
                "callback?): it would wait for itself; use submit() there"
            )
        arrays, units = self._check_request(feed, copy=False)
        if units == 0:
            return self._empty_outputs()
        outs = [np.empty((units, *u), d) for u, d in zip(self._out_units, self._out_dtypes)]
        request = self._enqueue(arrays, outs, units, timeout, None)
        request.wait()
        if request.state != _DONE:
            error = request.error
            if error is not None:
                raise error
            raise RuntimeClosedError(self._closed_message())  # cancelled: not by run()
        return outs if self.auto_batch else [o[0] for o in outs]

    def submit(
        self, feed: Mapping[str, Any], timeout: float | None = None
    ) -> Future[list[np.ndarray]]:
        """Queue one request; return a future of its outputs (in the compiled fetch
        order).  Feeds are validated here (FeedError) and copied, so the caller may
        reuse its arrays at once.  Blocks while ``num_buffers`` micro-batches are in
        flight, at most ``timeout`` seconds (then RuntimeBusyError)."""
        arrays, units = self._check_request(feed, copy=True)
        future = _RequestFuture()
        if units == 0:  # nothing to run
            future.set_running_or_notify_cancel()
            future.set_result(self._empty_outputs())
            return future
        outs = self._new_outputs(units)
        future._outs = outs if self.auto_batch else [o[0] for o in outs]
        future._request = self._enqueue(arrays, outs, units, timeout, future)
        return future

    def _empty_outputs(self) -> list[np.ndarray]:
        return [np.empty((0, *u), s.numpy_dtype) for u, s in zip(self._out_units, self._outputs)]

    def _new_outputs(self, units: int) -> list[np.ndarray]:
        return [np.empty((units, *u), d) for u, d in zip(self._out_units, self._out_dtypes)]

    def _enqueue(
        self,
        arrays: list[np.ndarray],
        outs: list[np.ndarray],
        units: int,
        timeout: float | None,
        token: Any,
    ) -> Any:
        if timeout is None:
            status, value = self._queue.submit(arrays, outs, units, -1.0, token)
        elif timeout >= 0:
            status, value = self._queue.submit(arrays, outs, units, float(timeout), token)
        else:
            raise OptionError(f"timeout must be None or a number >= 0, got {timeout!r}")
        if status == 0:
            return value
        if status == 1:
            raise RuntimeBusyError(
                f"the model runtime is full: {value} of {self._limit} {self._unit_name()} in "
                f"flight (num_buffers={self.num_buffers}) and no space freed within {timeout} "
                f"s; retry later, raise num_buffers, or submit with a longer timeout"
            )
        if status == 2:
            raise RuntimeClosedError(self._closed_message())
        return value

    # -- validation -------------------------------------------------------------
    def _check_request(self, feed: Mapping[str, Any], copy: bool) -> tuple[list[np.ndarray], int]:
        if self._queue.closed:
            raise RuntimeClosedError(self._closed_message())
        return self._checks.check(feed, copy)

    def _unit_name(self) -> str:
        return "rows" if self.auto_batch else "micro-batches"

    def _closed_message(self) -> str:
        failure = self._failure
        if failure is not None:
            return f"the model runtime stopped after an internal error: {failure!r}"
        return "the model runtime is closed: no new requests are accepted"

    # -- the worker -------------------------------------------------------------
    def _loop(self) -> None:
        self._worker_ident = threading.get_ident()
        queue = self._queue
        feed = self._run_feed
        executor = self.executor
        shapes = self._run_out_shapes
        try:
            while True:
                if queue.next_batch() < 0:
                    return
                t0 = time.perf_counter()
                try:
                    raw = executor.run(feed)  # looked up per run: tests wrap it
                    outputs = [
                        np.ascontiguousarray(o).reshape(shape) for o, shape in zip(raw, shapes)
                    ]
                except Exception as exc:
                    _fail(queue.fail(exc, time.perf_counter() - t0), exc)
                    continue
                # (a function: no local of this loop keeps the last answered future,
                # and its outputs, until the next run)
                _answer(queue.complete(outputs, time.perf_counter() - t0))
        except BaseException as exc:  # a bug here must not leave callers hanging
            log.exception("the model runtime's worker failed")
            with self._lock:
                self._failure = exc
                queue.close(False)
            error = RuntimeClosedError(self._closed_message())
            _fail(queue.fail(error, 0.0), error)
            self._fail_pending(RuntimeClosedError(self._closed_message()), exc)
        finally:
            if queue.cancelled:
                self._fail_pending(
                    RuntimeClosedError("the model runtime was closed with cancel=True")
                )

    def _fail_pending(self, error: BaseException, cause: BaseException | None = None) -> None:
        error.__cause__ = cause
        for future in self._queue.fail_pending(error):
            exc = type(error)(str(error))
            exc.__cause__ = cause
            _set_exception(future, exc)


def _option(name: str, given: Any, configured: Any) -> Any:
    """``given`` checked as IpuStrategy option ``name`` is, or ``configured``."""
    if given is None:
        return configured
    return coerce(OPTIONS[name], configured, given)


def _answer(futures: list[Any]) -> None:
    for future in futures:
        future._request = None
        if future.set_running_or_notify_cancel():
            future.set_result(future._outs)


def _fail(futures: list[Any], exc: BaseException) -> None:
    for future in futures:
        _set_exception(future, exc)


def _set_exception(future: Future[Any], exc: BaseException) -> None:
    if isinstance(future, _RequestFuture):
        future._request = None
    if not future.done() and future.set_running_or_notify_cancel():
        future.set_exception(exc)
