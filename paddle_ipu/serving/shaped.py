"""Packages compiled per input shape: the executor over every shape, and the runtime.

A package whose model leaves dimensions open besides the batch is served one graph per
input shape (:mod:`paddle_ipu.serving.package`).  :func:`shape_executor` gives the
:class:`~paddle_ipu.executor.specialised.SpecialisedExecutor` over it, whose graphs
come from where :mod:`paddle_ipu.serving.shape_graphs` finds them (the package, the
open graph, the compile cache, a compile).  :class:`ShapeRuntime` gives
:class:`~paddle_ipu.serving.model_runtime.ModelRuntime`'s interface over one model
runtime per input shape (each batching its own requests):

- a request of a shape in memory goes to its runtime at once; a request of a new
  shape is answered once its specialisation is made on the executor's worker thread
  (one make per shape, whoever asks), and no request of another shape waits for it;
- with shape buckets a request is padded up to its bucket and its outputs cut back to
  what the model gives at its own size;
- when a specialisation leaves memory (the bound, see
  :mod:`paddle_ipu.executor.shapes`) its runtime answers what it has queued and closes,
  and the inference server stops routing its shape in C++ (:meth:`ShapeRuntime.on_runtime`);
  its counters stay in the model's statistics.

A package without open dimensions is one shape (the key ``""``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from paddle_ipu.errors import IpuError, IpuMemoryError, NotSupportedError, RuntimeClosedError
from paddle_ipu.executor import executor_for
from paddle_ipu.executor.ipu_executor import IpuExecutor
from paddle_ipu.executor.shapes import ShapePolicy
from paddle_ipu.executor.specialised import SpecialisationStats, SpecialisedExecutor, corners
from paddle_ipu.serving.model_runtime import ModelRuntime
from paddle_ipu.serving.package import Package
from paddle_ipu.serving.runtime import (
    Route,
    Runtime,
    RuntimeKind,
    RuntimeStats,
    TensorSpec,
    Unroute,
    v2_datatype,
)

log = logging.getLogger("paddle_ipu")

__all__ = ["ShapeRuntime", "shape_executor"]

#: what the inference server is told of a shape's runtime: made (True) or closed (False)
Watcher = Callable[[ModelRuntime, bool], None]
#: how many times a request makes its shape again when it leaves memory before it runs
_MAKE_TRIES = 8


def _policy(package: Package) -> ShapePolicy:
    if package.sequence is not None:
        raise NotSupportedError(
            "this package holds buckets of sequence lengths: run it through runtime_for()"
        )
    if package.policy is not None:
        return package.policy
    model = package.model
    assert model is not None
    return ShapePolicy({(s.paddle_name or s.name): (-1, *s.shape[1:]) for s in model.inputs})


def shape_executor(
    package: Package, backend: str | None = None, name: str = "", **options: Any
) -> SpecialisedExecutor:
    """The executor over every input shape of ``package`` (``options``: strategy
    options of each shape's executor)."""
    from paddle_ipu.serving.saved_model import compile_shape
    from paddle_ipu.serving.shape_graphs import graph_for, output_shapes

    policy = _policy(package)

    def make(key: str) -> tuple[IpuExecutor, str]:
        if package.per_shape:
            model, how = graph_for(package, key, compile_shape)
        else:
            assert package.model is not None
            model, how = package.model, "prepared from the package"
        return executor_for(model, package.strategy(**options), backend=backend), how

    return SpecialisedExecutor(
        policy,
        make,
        micro_batch_size=int(package.options["micro_batch_size"]),
        batches_per_step=int(package.options["batches_per_step"]),
        name=name or package.source or "the package",
        output_shapes=output_shapes(package) if package.per_shape else None,
    )


class ShapeRuntime(Runtime):
    """:class:`ModelRuntime`'s interface over a package compiled per input shape (see
    the module docstring; keyword arguments are :class:`ModelRuntime`'s,
    ``executor_options`` strategy options).  Served as a
    :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"handler"`` whose
    :meth:`routes` are its shapes' model runtimes (the inference server also watches
    them leave: :meth:`on_runtime`)."""

    kind: RuntimeKind = "handler"

    def __init__(
        self,
        package: Package,
        backend: str | None = None,
        *,
        executor_options: Mapping[str, Any] | None = None,
        name: str = "",
        **runtime_options: Any,
    ) -> None:
        self.package = package
        self.policy = _policy(package)
        self.shapes = shape_executor(package, backend, name, **dict(executor_options or {}))
        self.shapes.on_evict(self._evicted)
        self.shapes.on_usage(self._used)
        self._runtime_options = runtime_options
        self.runtimes: dict[str, ModelRuntime] = {}
        self._seen: dict[str, int] = {}  # requests of each runtime at the last usage probe
        self._retired = RuntimeStats()  # the counters of runtimes closed since
        self._lock = threading.Lock()
        self._closed = False
        self._watchers: list[Watcher] = []

    def on_runtime(self, watcher: Watcher) -> None:
        """Call ``watcher(runtime, True)`` for every shape's model runtime: those made
        already, now, and each new one once it is made; ``watcher(runtime, False)``
        once one has closed after its specialisation left memory (the inference
        server routes the requests of a shape to its runtime without Python while it
        lives)."""
        with self._lock:
            self._watchers.append(watcher)
            made = list(self.runtimes.values())
        for runtime in made:
            watcher(runtime, True)

    def routes(self, route: Route) -> None:
        """Every shape's model runtime, as :meth:`on_runtime` gives them made."""
        self.on_runtime(lambda runtime, made: route(runtime, None) if made else None)

    def unroutes(self, unroute: Unroute) -> None:
        """Every shape's model runtime that closes (its graph left memory)."""
        self.on_runtime(lambda runtime, made: None if made else unroute(runtime))

    @property
    def inputs(self) -> list[TensorSpec]:
        """The feeds as the package declares them (-1: open)."""
        return [TensorSpec(n, v2_datatype(d, n), tuple(s)) for n, d, s in self.tensor_specs()[0]]

    @property
    def outputs(self) -> list[TensorSpec]:
        """The outputs as the package declares them (see :meth:`tensor_specs`)."""
        return [TensorSpec(n, v2_datatype(d, n), tuple(s)) for n, d, s in self.tensor_specs()[1]]

    # -- the runtimes ---------------------------------------------------------------
    def _runtime(self, key: str, executor: IpuExecutor) -> ModelRuntime | None:
        """The runtime of ``key`` over ``executor`` (made now if there is none); None
        when ``executor`` is no longer the one in memory (its shape just left)."""
        with self._lock:
            if self._closed:
                raise RuntimeClosedError("the model runtime is closed: no new requests")
            runtime = self.runtimes.get(key)
            if runtime is not None and runtime.executor is executor and not runtime.closed:
                return runtime
            if self.shapes.resident(key) is not executor:
                return None
            runtime = ModelRuntime(executor, **self._runtime_options)
            self.runtimes[key] = runtime
            self._seen[key] = 0
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher(runtime, True)
        # the runtime's buffers are the shape's too: counted in what it holds
        self.shapes.charge(key, executor, runtime.buffer_bytes)
        return runtime

    def _evicted(self, key: str) -> None:
        """A specialisation leaves memory: its runtime answers its queue and closes,
        then the server forgets its route."""
        with self._lock:
            runtime = self.runtimes.pop(key, None)
            self._seen.pop(key, None)
            watchers = list(self._watchers)
        if runtime is None:
            return
        runtime.close()
        with self._lock:
            self._retired = RuntimeStats.total([self._retired, runtime.stats()])
        for watcher in watchers:
            watcher(runtime, False)

    def _used(self) -> list[str]:
        """The shapes whose runtimes took requests since the last call (requests the
        server routes in C++ never pass here)."""
        with self._lock:
            runtimes = list(self.runtimes.items())
        used = []
        for key, runtime in runtimes:
            count = runtime.stats().requests
            with self._lock:
                if self._seen.get(key, count) != count:
                    used.append(key)
                if key in self._seen:
                    self._seen[key] = count
        return used

    def warm_up(self, shapes: list[Mapping[str, Any]] | None = None) -> list[str]:
        """Make specialisations and their runtimes now: of ``shapes`` (feed -> full
        shape; the batch may be -1), or of the declared shapes -- those compiled ahead,
        then every bucket, smallest first -- as many as the memory bound holds.  The
        keys made.  A bucket of the grid that does not fit an IPU ends the warm-up there,
        with a warning (a request brought to it is refused by that name); a declared
        shape that does not fit fails it."""
        grid_from: int | None = None  # where the grid's buckets start among the keys
        if shapes is None:
            keys = self.package.ahead()
            grid_from = len(keys)
            if self.policy.buckets is not None:
                keys += [
                    self.policy.key(b) for b in self.policy.buckets.every(self.policy.declared)
                ]
        else:
            keys = [
                self.policy.route({n: tuple(int(d) for d in v) for n, v in s.items()})[0]
                for s in shapes
            ]
        if self.policy.buckets is not None:
            # a padded request's cut sizes from formulas, found now, not on its path
            graph = self.package.open_graph()
            if graph is not None:
                graph.size_formulas(wait=True)
            self.shapes.prepare_cut()
        made: list[str] = []
        declared = set(keys[:grid_from]) if grid_from is not None else set(keys)
        evicted = self.shapes.stats().evicted
        for key in dict.fromkeys(keys):
            stats = self.shapes.stats()
            # a warm-up's shape that made an earlier one leave memory would undo it:
            # the smallest (most often asked) buckets, made first
            full = bool(made) and (
                stats.resident_bytes + self._expected_bytes(key) > stats.bound_bytes
                or stats.evicted > evicted
            )
            if made and (full or (stats.max_count and stats.resident >= stats.max_count)):
                log.info(
                    "%s: warm-up stops after %d of %d shapes: the memory bound holds no more",
                    self.shapes.name,
                    len(made),
                    len(keys),
                )
                break
            try:
                executor = self.shapes.executor(key)
            except IpuMemoryError as exc:
                if key in declared:
                    raise
                log.warning(
                    "%s: warm-up stops after %d of %d shapes: %s",
                    self.shapes.name,
                    len(made),
                    len(keys),
                    str(exc).split("\n", 1)[0],
                )
                break
            self._runtime(key, executor)
            made.append(key)
        if made:
            self._first_run(made)
            # the first made (the declared shapes, then the smallest buckets) leave
            # memory last when requests bring new shapes: most recently used
            for key in reversed(made):
                self.shapes.resident(key)
        return made

    def _expected_bytes(self, key: str) -> int:
        """What shape ``key`` will count against the memory bound once made with its
        runtime: the typical graph of a shape made so far and the runtime's step
        buffers (a run's rows of its inputs at that shape)."""
        try:
            dtypes = {name: np.dtype(dtype) for name, dtype, _ in self.tensor_specs()[0]}
        except NotSupportedError:  # a package that declares no dtypes: its graph alone
            dtypes = {}
        shapes = self.policy.input_shapes(key, self.shapes.rows_per_run)
        buffers = sum(
            int(np.prod(shape, dtype=np.int64)) * dtypes[name].itemsize
            for name, shape in shapes.items()
            if name in dtypes
        )
        return self.shapes.typical_bytes() + buffers

    def _first_run(self, made: Sequence[str]) -> None:
        """Run the largest shape made once, on zeros, outside its runtime (no request
        counted): a session's first run sets up the engine and grows its memory arena
        to that shape, which otherwise the first request pays (1.3 s more than later
        runs for PP-OCRv4's detector at 736 x 5216 on the host)."""

        def elements(key: str) -> int:
            shapes = self.policy.input_shapes(key, self.shapes.rows_per_run)
            return sum(int(np.prod(s)) for s in shapes.values())

        key = max(made, key=elements)
        executor = self.shapes.resident(key)
        if executor is None:
            return
        rows = self.shapes.rows_per_run
        feed = {
            spec.paddle_name or spec.name: np.zeros((rows, *spec.shape[1:]), spec.numpy_dtype)
            for spec in executor.model.inputs
        }
        start = time.perf_counter()
        try:
            executor.run(feed)
        except Exception as exc:  # a model that zeros do not suit: the first request sets up
            log.warning(
                "%s: the warm-up's run of input shape %s on zeros failed (%s): the first "
                "request of a shape sets the session up",
                self.shapes.name,
                key,
                exc,
            )
            return
        log.info(
            "%s: warm-up ran input shape %s once, on zeros, in %.2f s",
            self.shapes.name,
            key,
            time.perf_counter() - start,
        )

    # -- requests -------------------------------------------------------------------
    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> list[np.ndarray]:
        return self.submit(feed, timeout).result()

    def submit(
        self, feed: Mapping[str, Any], timeout: float | None = None
    ) -> Future[list[np.ndarray]]:
        """Queue one request of any admitted shape (see the module docstring); a future
        of its outputs.  The feed is checked (FeedError) before this returns."""
        if self._closed:
            raise RuntimeClosedError("the model runtime is closed: no new requests")
        _, key, arrays, real = self.shapes.fit(feed)
        inner = self._resident_submit(key, arrays, timeout)
        if inner is not None and real is None:
            return inner
        outer = _Chained(None)
        if inner is None:
            self._after_make(key, arrays, timeout, outer, 0)
        if inner is not None:
            outer.follow(inner)
        # what a padded request is cut back to, found while it runs (or is made)
        try:
            outer.set_cut(self.shapes.cut_shapes(real) if real is not None else None)
        except BaseException as exc:
            outer.fail(exc)
        return outer

    def _resident_submit(
        self, key: str, arrays: Mapping[str, np.ndarray], timeout: float | None
    ) -> Future[list[np.ndarray]] | None:
        """The request queued on the runtime of ``key`` if its shape is in memory;
        None when it is not (or just left)."""
        executor = self.shapes.resident(key)
        runtime = self._runtime(key, executor) if executor is not None else None
        if runtime is None:
            return None
        try:
            return runtime.submit(arrays, timeout)
        except RuntimeClosedError:
            if self._closed:
                raise
            return None  # it left memory as this request came: made again

    def _after_make(
        self,
        key: str,
        arrays: Mapping[str, np.ndarray],
        timeout: float | None,
        outer: _Chained,
        tries: int,
    ) -> None:
        """Queue the request once the specialisation of ``key`` is made (on the worker
        thread that made it)."""

        def made(f: Future[IpuExecutor]) -> None:
            if outer.done():
                return
            try:
                f.result()
                inner = self._resident_submit(key, arrays, timeout)
                if inner is None and tries >= _MAKE_TRIES:
                    raise RuntimeClosedError(
                        f"input shape {key} left memory {tries} times before its request "
                        "ran: the memory bound holds fewer shapes than the requests in flight"
                    )
            except BaseException as exc:
                if outer.set_running_or_notify_cancel():
                    outer.set_exception(exc)
                return
            if inner is None:
                self._after_make(key, arrays, timeout, outer, tries + 1)
            else:
                outer.follow(inner)

        self.shapes.make_async(key).add_done_callback(made)

    @property
    def executor(self) -> IpuExecutor:
        """An executor of the package (a shape in memory, else the first compiled, else
        one made at a small probe shape): names its inputs and outputs."""
        with self._lock:
            first = next(iter(self.runtimes.values()), None)
        if first is not None:
            return first.executor
        keys = self.shapes.specialisations() or list(self.package.shapes)
        if keys:
            return self.shapes.executor(keys[0])
        from paddle_ipu.serving.shape_graphs import probe_shapes

        why: Exception | None = None
        for shapes in probe_shapes(self.policy, []):
            try:
                key, _ = self.policy.route(shapes)
                return self.shapes.executor(key)
            except IpuError as exc:
                why = exc
        raise NotSupportedError(f"no input shape of this package compiles: {why}")

    def tensor_specs(
        self,
    ) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
        """(name, numpy dtype name, declared shape) of the feeds and of the outputs, as
        the package declares them, before any shape is compiled: the outputs -1 on
        every axis when a feed leaves a dimension besides the batch open.  A package
        made before the outputs' ranks were recorded answers from its open graph, or
        its first compiled shape (a NotSupportedError when it has neither)."""
        meta = self.package.meta
        fetches = meta.get("fetches") or []
        names = [str(f.get("name", "")) for f in fetches]
        usable = all(names) and len(set(names)) == len(names)  # PIR fetches may be unnamed
        if not usable or any("rank" not in f for f in fetches) or not meta.get("feeds"):
            model = self.package.open or self.executor.model
            feed_shapes, out_shapes = self.request_shapes()
            return (
                [
                    (s.paddle_name or s.name, np.dtype(s.numpy_dtype).name, list(shape))
                    for s, shape in zip(model.inputs, feed_shapes)
                ],
                [
                    (s.paddle_name or s.name, np.dtype(s.numpy_dtype).name, list(shape))
                    for s, shape in zip(model.outputs, out_shapes)
                ],
            )
        feeds_ = [
            (name, str(f["dtype"]), [int(d) for d in f["shape"]])
            for name, f in meta["feeds"].items()
        ]
        # a package compiled per input shape: its outputs' sizes follow the input shape
        outs = [(str(f["name"]), str(f["dtype"]), [-1] * int(f["rank"])) for f in fetches]
        return feeds_, outs

    def request_shapes(self) -> tuple[list[list[int]], list[list[int]]]:
        """The declared shapes of the feeds (-1: open); the outputs' are -1 on every
        axis when a feed leaves a dimension besides the batch open (their sizes follow
        the input shape), else those of the first shape with -1 where the batch is."""
        feeds_ = [list(shape) for shape in self.policy.declared.values()]
        open_ = any(d < 0 for shape in feeds_ for d in shape[1:])
        model = self.package.open or self.executor.model
        outs = [[-1] * len(s.shape) if open_ else [-1, *s.shape[1:]] for s in model.outputs]
        return feeds_, outs

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in list(self.runtimes.values()))

    @property
    def closed(self) -> bool:
        return self._closed

    def is_worker_thread(self) -> bool:
        return any(r.is_worker_thread() for r in list(self.runtimes.values()))

    def start(self) -> None:
        for runtime in list(self.runtimes.values()):
            runtime.start()

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        with self._lock:
            self._closed = True
            runtimes = list(self.runtimes.values())
        for runtime in runtimes:
            runtime.close(cancel, timeout)
        self.shapes.close()

    def __enter__(self) -> ShapeRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> RuntimeStats:
        """The shapes' counters, summed (those that left memory included)."""
        with self._lock:
            retired = self._retired
            runtimes = list(self.runtimes.values())
        return RuntimeStats.total([retired, *(r.stats() for r in runtimes)])

    def specialisation_stats(self) -> SpecialisationStats:
        """What the model holds in memory and what its shapes cost so far."""
        return self.shapes.stats()


class _Chained(Future):
    """A shape's request: answered from the runtime's request (or after its
    specialisation is made), its outputs cut back when it was padded -- once both the
    answer and what to cut it to are known, whichever comes last; cancelling it cancels
    the runtime's request."""

    def __init__(self, cut: list[tuple[int, ...]] | None) -> None:
        super().__init__()
        self._inner: Future[Any] | None = None
        self._lock = threading.Lock()
        self._cut = cut
        self._cut_known = cut is not None
        self._answer: list[np.ndarray] | None = None

    def set_cut(self, cut: list[tuple[int, ...]] | None) -> None:
        with self._lock:
            self._cut, self._cut_known = cut, True
            answer = self._answer
        if answer is not None:
            self._finish(answer)

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            self._cut_known = True
        if self.set_running_or_notify_cancel():
            self.set_exception(exc)

    def follow(self, inner: Future[Any]) -> None:
        self._inner = inner

        def done(f: Future[Any]) -> None:
            self._inner = None  # no cycle outer -> inner -> this callback -> outer
            if f.cancelled():
                self.cancel()
                return
            error = f.exception()
            if error is not None:
                if self.set_running_or_notify_cancel():
                    self.set_exception(error)
                return
            with self._lock:
                known = self._cut_known
                if not known:
                    self._answer = f.result()
            if known:
                self._finish(f.result())

        inner.add_done_callback(done)

    def _finish(self, answer: list[np.ndarray]) -> None:
        if self.done() or not self.set_running_or_notify_cancel():
            return
        try:
            self.set_result(answer if self._cut is None else corners(answer, self._cut))
        except Exception as exc:  # an output the model gives at another size
            self.set_exception(exc)

    def cancel(self) -> bool:
        inner = self._inner
        if inner is not None and not inner.cancel() and not inner.cancelled():
            return False
        return super().cancel()
