"""The model runtime: serving a compiled inference graph with auto-batching.

A :class:`ModelRuntime` sits over a prepared inference :class:`~paddle_ipu.executor.Executor`.
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
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_ipu.errors import (
    BackendError,
    FeedError,
    IpuError,
    NotSupportedError,
    OptionError,
    RuntimeBusyError,
    RuntimeClosedError,
)
from paddle_ipu.executor import Executor, check_ranges

log = logging.getLogger("paddle_ipu")

__all__ = ["MAX_REQUEST_RUNS", "ModelRuntime", "RuntimeStats"]

#: the default cap of one request, in runs: ``max_request_rows`` defaults to this many
#: runs of ``batches_per_step x micro_batch_size`` rows
MAX_REQUEST_RUNS = 64


@dataclass
class RuntimeStats:
    """Counters of a :class:`ModelRuntime` since it started."""

    #: graph runs (each ``batches_per_step`` micro-batches)
    runs: int = 0
    #: requests completed (with a result or an error)
    requests: int = 0
    #: units fed: rows when auto-batching, micro-batches otherwise
    units: int = 0
    #: units of zero padding fed
    padded_units: int = 0
    #: runs that raised
    failed_runs: int = 0
    #: seconds the worker spent inside the executor's run
    busy_seconds: float = 0.0


@dataclass(eq=False)
class _Request:
    arrays: list[np.ndarray]  # one per model input, in units along axis 0
    units: int
    future: Future[list[np.ndarray]]
    arrived: float
    taken: int = 0  # units already put into runs
    done_units: int = 0  # units whose outputs were filled
    outs: list[np.ndarray] | None = None
    started: bool = False


@dataclass
class _Piece:
    request: _Request
    start: int  # first unit of the request in this run
    offset: int  # its position in the run
    count: int


@dataclass
class _State:
    pending: deque[_Request] = field(default_factory=deque)
    pending_units: int = 0  # units queued, not yet in a run
    inflight_units: int = 0  # units admitted and not yet answered
    closed: bool = False
    cancel: bool = False
    failure: BaseException | None = None


class ModelRuntime:
    """Queue-based serving over a prepared inference executor.

    Args:
        executor: a prepared inference :class:`~paddle_ipu.executor.Executor`.
        micro_batch_size, timeout_ms, num_buffers: override the executor's strategy.
        max_request_rows: the most rows one request may have when auto-batching
            (default: :data:`MAX_REQUEST_RUNS` runs' worth); a larger request is a
            FeedError, raised before the feed is cast or copied.
        start: start the worker thread now (default).

    The runtime is thread-safe: any number of threads may call :meth:`run` and
    :meth:`submit`.  Future callbacks run on the worker thread; keep them short.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        micro_batch_size: int | None = None,
        timeout_ms: float | None = None,
        num_buffers: int | None = None,
        max_request_rows: int | None = None,
        start: bool = True,
    ) -> None:
        strategy = executor.strategy
        if strategy.is_training:
            raise OptionError(
                "the model runtime serves inference graphs only: compile with "
                "is_training=False (set_graph_config(is_training=False))"
            )
        if executor.session is None:
            raise BackendError("the executor is not prepared: call prepare() first")
        mbs = int(micro_batch_size if micro_batch_size is not None else strategy.micro_batch_size)
        timeout = float(timeout_ms if timeout_ms is not None else strategy.get("timeout_ms"))
        buffers = int(num_buffers if num_buffers is not None else strategy.get("num_buffers"))
        if mbs < 1:
            raise OptionError(f"micro_batch_size must be >= 1, got {mbs}")
        # threading's waits refuse longer timeouts (OverflowError in the worker).
        longest_ms = threading.TIMEOUT_MAX * 1e3
        if not 0.0 <= timeout <= longest_ms:
            raise OptionError(
                f"timeout_ms must be a finite number in [0, {longest_ms:g}], got {timeout}"
            )
        if buffers < 1:
            raise OptionError(f"num_buffers must be >= 1, got {buffers}")
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
        self._feed_shapes = [executor.layout.input_shape(s.shape) for s in self._inputs]
        self._feed_names = [s.paddle_name or s.name for s in self._inputs]
        self._timeout_s = timeout / 1000.0
        self._state = _State()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the worker waits here
        self._space = threading.Condition(self._lock)  # submitters wait here
        self._stats = RuntimeStats()
        self._thread: threading.Thread | None = None
        self._current: list[_Piece] = []  # the run under way
        # The executor refuses direct runs once this runtime is closed (see
        # Executor._check_serving): they would be checked against the wrong shapes.
        executor.serving = self
        if start:
            self.start()

    # -- start-up checks --------------------------------------------------------
    def _check_model(self, executor: Executor) -> None:
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
            if self._state.closed:
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

    @property
    def in_flight(self) -> int:
        """Units (rows when auto-batching, else micro-batches) admitted and not yet answered."""
        with self._lock:
            return self._state.inflight_units

    @property
    def closed(self) -> bool:
        return self._state.closed

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
            state = self._state
            state.closed = True
            state.cancel = state.cancel or cancel
            thread = self._thread
            self._work.notify_all()
            self._space.notify_all()
        if thread is None:
            self._fail_pending(RuntimeClosedError("the model runtime was closed before it started"))
        elif thread is not threading.current_thread():
            thread.join(timeout)
        atexit.unregister(self.close)

    def __enter__(self) -> ModelRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> RuntimeStats:
        """A copy of the runtime's counters."""
        with self._lock:
            return RuntimeStats(**vars(self._stats))

    # -- entry points -----------------------------------------------------------
    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> list[np.ndarray]:
        """Run one request and wait for its outputs (in the compiled fetch order).

        ``timeout`` bounds the wait for queue space (RuntimeBusyError), not the run."""
        if threading.current_thread() is self._thread:
            raise IpuError(
                "ModelRuntime.run was called from the runtime's own worker thread (a future "
                "callback?): it would wait for itself; use submit() there"
            )
        future = self._submit(feed, timeout, copy=False)
        return future.result()

    def submit(
        self, feed: Mapping[str, Any], timeout: float | None = None
    ) -> Future[list[np.ndarray]]:
        """Queue one request; return a future of its outputs (in the compiled fetch
        order).  Feeds are validated here (FeedError) and copied, so the caller may
        reuse its arrays at once.  Blocks while ``num_buffers`` micro-batches are in
        flight, at most ``timeout`` seconds (then RuntimeBusyError)."""
        return self._submit(feed, timeout, copy=True)

    # -- validation -------------------------------------------------------------
    def _check_request(self, feed: Mapping[str, Any], copy: bool) -> tuple[list[np.ndarray], int]:
        if not isinstance(feed, Mapping):
            raise FeedError(f"a feed must be a dict of name -> array, got {type(feed).__name__}")
        self.executor.check_feed_names(feed)
        arrays: list[np.ndarray] = []
        units = -1
        first = ""
        for name, spec in zip(self._feed_names, self._inputs):
            # Dtype and shape first, then the size cap; only then cast or copy.
            array = np.asarray(feed[name])
            cast = Executor.feed_cast(name, array, spec)
            if self.auto_batch:
                trailing = tuple(spec.shape[1:])
                if array.ndim != len(spec.shape) or tuple(array.shape[1:]) != trailing:
                    raise FeedError(
                        f"feed {name!r}: expected shape [rows, {', '.join(map(str, trailing))}]"
                        f" (any number of rows; auto-batching packs them into micro-batches of "
                        f"{self.micro_batch_size}), received {list(array.shape)}"
                    )
                rows = int(array.shape[0])
                if rows > self.max_request_rows:
                    raise FeedError(
                        f"feed {name!r}: a request may have at most {self.max_request_rows} "
                        f"rows (max_request_rows), received {rows}; split it into smaller "
                        f"requests"
                    )
                if units < 0:
                    units, first = rows, name
                elif rows != units:
                    raise FeedError(
                        f"feeds {first!r} and {name!r} have {units} and {rows} rows: every "
                        f"feed of a request must have the same number of rows"
                    )
            else:
                if tuple(array.shape) != tuple(spec.shape):
                    if array.ndim == len(spec.shape) and array.shape[1:] == spec.shape[1:]:
                        raise FeedError(
                            f"feed {name!r}: without auto-batching (timeout_ms=0) a request is "
                            f"exactly one micro-batch: expected {spec.shape[0]} rows, received "
                            f"{array.shape[0]} (shape {list(array.shape)}); set timeout_ms > 0 "
                            f"to auto-batch requests of any size"
                        )
                    raise FeedError(
                        f"feed {name!r}: expected shape {list(spec.shape)} (one micro-batch), "
                        f"received {list(array.shape)}"
                    )
                array = array.reshape((1, *spec.shape))
                units = 1
            if spec.ranges:
                check_ranges(name, array, spec.ranges)
            cast_array = cast(array)
            if copy and cast_array is array:  # the caller may reuse its arrays
                cast_array = np.array(array, copy=True)
            arrays.append(cast_array)
        return arrays, max(units, 0)

    def _submit(
        self, feed: Mapping[str, Any], timeout: float | None, copy: bool
    ) -> Future[list[np.ndarray]]:
        if self._state.closed:
            raise RuntimeClosedError(self._closed_message())
        arrays, units = self._check_request(feed, copy)
        future: Future[list[np.ndarray]] = Future()
        if units == 0:  # nothing to run
            future.set_running_or_notify_cancel()
            future.set_result(
                [np.empty((0, *u), s.numpy_dtype) for u, s in zip(self._out_units, self._outputs)]
            )
            return future
        request = _Request(arrays, units, future, time.monotonic())
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            state = self._state
            while (
                not state.closed
                and state.inflight_units > 0
                and state.inflight_units + units > self._limit
            ):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeBusyError(
                        f"the model runtime is full: {state.inflight_units} of "
                        f"{self._limit} {self._unit_name()} in flight (num_buffers="
                        f"{self.num_buffers}) and no space freed within {timeout} s; "
                        f"retry later, raise num_buffers, or submit with a longer timeout"
                    )
                self._space.wait(left)
            if state.closed:
                raise RuntimeClosedError(self._closed_message())
            request.arrived = time.monotonic()
            before = state.pending_units
            state.pending.append(request)
            state.pending_units += units
            state.inflight_units += units
            # The worker waits for a first request, or for the oldest one's timeout:
            # wake it only when that changes (a first request, a full run).
            if not self.auto_batch or before == 0 or before < self._capacity <= before + units:
                self._work.notify()
        return future

    def _unit_name(self) -> str:
        return "rows" if self.auto_batch else "micro-batches"

    def _closed_message(self) -> str:
        failure = self._state.failure
        if failure is not None:
            return f"the model runtime stopped after an internal error: {failure!r}"
        return "the model runtime is closed: no new requests are accepted"

    # -- the worker -------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                pieces = self._next_run()
                if pieces is None:
                    return
                if pieces:
                    self._execute(pieces)
        except BaseException as exc:  # a bug here must not leave callers hanging
            log.exception("the model runtime's worker failed")
            with self._lock:
                self._state.failure = exc
                self._state.closed = True
                self._space.notify_all()
            for piece in self._current:
                if not piece.request.future.done():
                    piece.request.future.set_exception(RuntimeClosedError(self._closed_message()))
            self._current = []
            self._fail_pending(RuntimeClosedError(self._closed_message()), exc)
        finally:
            if self._state.cancel:
                self._fail_pending(
                    RuntimeClosedError("the model runtime was closed with cancel=True")
                )

    def _next_run(self) -> list[_Piece] | None:
        """Wait for work; take up to one run of units.  None: stop."""
        with self._lock:
            state = self._state
            while True:
                self._drop_finished_heads()
                if state.closed and state.cancel:
                    return None
                if not state.pending:
                    if state.closed:
                        return None
                    self._work.wait()
                    continue
                if state.pending_units >= self._capacity or not self.auto_batch or state.closed:
                    break
                left = state.pending[0].arrived + self._timeout_s - time.monotonic()
                if left <= 0:
                    break
                self._work.wait(left)
            return self._take()

    def _drop_finished_heads(self) -> None:
        # Requests failed (a piece in an earlier run raised) or cancelled by their
        # caller while queued: release the units not yet put into a run.
        state = self._state
        while state.pending and state.pending[0].future.done():
            head = state.pending.popleft()
            left = head.units - head.taken
            state.pending_units -= left
            state.inflight_units -= left
            self._space.notify_all()

    def _take(self) -> list[_Piece]:
        state = self._state
        pieces: list[_Piece] = []
        filled = 0
        while state.pending and filled < self._capacity:
            request = state.pending[0]
            if not request.started:
                if not request.future.set_running_or_notify_cancel():
                    self._drop_finished_heads()
                    continue
                request.started = True
            elif request.future.done():
                self._drop_finished_heads()
                continue
            count = min(request.units - request.taken, self._capacity - filled)
            pieces.append(_Piece(request, request.taken, filled, count))
            request.taken += count
            filled += count
            state.pending_units -= count
            if request.taken == request.units:
                state.pending.popleft()
        self._current = pieces
        return pieces

    def _execute(self, pieces: list[_Piece]) -> None:
        filled = pieces[-1].offset + pieces[-1].count
        failed: BaseException | None = None
        outputs: list[np.ndarray] = []
        t0 = time.perf_counter()
        try:
            feed: dict[str, np.ndarray] = {}
            for i, (name, spec) in enumerate(zip(self._feed_names, self._inputs)):
                buffer = np.zeros((self._capacity, *self._in_units[i]), spec.numpy_dtype)
                for p in pieces:
                    buffer[p.offset : p.offset + p.count] = p.request.arrays[i][
                        p.start : p.start + p.count
                    ]
                feed[name] = buffer.reshape(self._feed_shapes[i])
            raw = self.executor.run(feed)
            outputs = [
                np.asarray(o).reshape((self._capacity, *u)) for o, u in zip(raw, self._out_units)
            ]
        except Exception as exc:
            failed = exc
        busy = time.perf_counter() - t0
        finished: list[_Request] = []
        for p in pieces:
            request = p.request
            if request.future.done():  # failed in an earlier run
                continue
            if failed is not None:
                finished.append(request)
                continue
            if p.count == request.units:  # the whole request in this run
                if self.auto_batch:
                    request.outs = [o[p.offset : p.offset + p.count].copy() for o in outputs]
                else:
                    request.outs = [o[p.offset].copy() for o in outputs]
            else:
                if request.outs is None:
                    request.outs = [
                        np.empty((request.units, *o.shape[1:]), o.dtype) for o in outputs
                    ]
                for dst, src in zip(request.outs, outputs):
                    dst[p.start : p.start + p.count] = src[p.offset : p.offset + p.count]
            request.done_units += p.count
            if request.done_units == request.units:
                finished.append(request)
        with self._lock:
            stats = self._stats
            stats.runs += 1
            stats.units += filled
            stats.padded_units += self._capacity - filled
            stats.busy_seconds += busy
            stats.requests += len(finished)
            if failed is not None:
                stats.failed_runs += 1
            # A failed request's units still queued are released when dropped.
            self._state.inflight_units -= filled
            self._current = []
            self._space.notify_all()
        for request in finished:
            if failed is not None:
                if not request.future.done():
                    request.future.set_exception(failed)
            elif request.outs is not None:
                request.future.set_result(request.outs)

    def _fail_pending(self, error: BaseException, cause: BaseException | None = None) -> None:
        with self._lock:
            state = self._state
            requests = list(state.pending)
            state.pending.clear()
            for r in requests:
                state.inflight_units -= r.units - r.taken
            state.pending_units = 0
            self._space.notify_all()
        for request in requests:
            if request.future.done():
                continue
            if not request.started and not request.future.set_running_or_notify_cancel():
                continue
            exc = type(error)(str(error))
            exc.__cause__ = cause
            request.future.set_exception(exc)
