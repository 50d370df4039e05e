"""Packages compiled per input shape: the executor over every shape, and the runtime.

A package whose model leaves dimensions open besides the batch holds one graph per
input shape (:mod:`paddle_ipu.serving.package`).  :func:`shape_executor` gives the
:class:`~paddle_ipu.executor.specialised.SpecialisedExecutor` over it: a shape the
package holds is prepared from it; another is compiled from the saved model the
package came from and added to the package (and the compile cache).
:class:`ShapeRuntime` gives :class:`~paddle_ipu.serving.model_runtime.ModelRuntime`'s
interface over one model runtime per input shape (each batching its own requests).
A package without open dimensions is one shape (the key ``""``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from paddle_ipu.errors import NotSupportedError, RuntimeClosedError
from paddle_ipu.executor import executor_for, feeds
from paddle_ipu.executor.ipu_executor import IpuExecutor
from paddle_ipu.executor.shapes import ShapePolicy
from paddle_ipu.executor.specialised import SpecialisedExecutor
from paddle_ipu.serving.model_runtime import ModelRuntime
from paddle_ipu.serving.package import Package
from paddle_ipu.serving.runtime import (
    Route,
    Runtime,
    RuntimeKind,
    RuntimeStats,
    TensorSpec,
    v2_datatype,
)

__all__ = ["ShapeRuntime", "shape_executor"]


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

    policy = _policy(package)

    def make(key: str) -> tuple[IpuExecutor, str]:
        model = package.shapes.get(key) if package.per_shape else package.model
        how = "prepared from the package"
        if model is None:
            model = compile_shape(package, key)
            how = "compiled"
        return executor_for(model, package.strategy(**options), backend=backend), how

    return SpecialisedExecutor(
        policy,
        make,
        micro_batch_size=int(package.options["micro_batch_size"]),
        batches_per_step=int(package.options["batches_per_step"]),
        name=name or package.source or "the package",
        compiled=package.shapes if package.per_shape else (),
    )


class ShapeRuntime(Runtime):
    """:class:`ModelRuntime`'s interface over a package compiled per input shape: one
    model runtime per shape, made on a request's first use of it (keyword arguments
    are :class:`ModelRuntime`'s; ``executor_options`` are strategy options).  Served
    as a :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"handler"`` whose
    :meth:`routes` are its shapes' model runtimes."""

    kind: RuntimeKind = "handler"

    def __init__(
        self,
        package: Package,
        backend: str | None = None,
        *,
        executor_options: Mapping[str, Any] | None = None,
        **runtime_options: Any,
    ) -> None:
        self.package = package
        self.policy = _policy(package)
        self.shapes = shape_executor(package, backend, **dict(executor_options or {}))
        self._runtime_options = runtime_options
        self.runtimes: dict[str, ModelRuntime] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._watchers: list[Callable[[ModelRuntime], None]] = []

    def on_runtime(self, watcher: Callable[[ModelRuntime], None]) -> None:
        """Call ``watcher(runtime)`` for every shape's model runtime: those made
        already, now, and each new one once it is made (the inference server routes
        the requests of its shape to it without Python)."""
        with self._lock:
            self._watchers.append(watcher)
            made = list(self.runtimes.values())
        for runtime in made:
            watcher(runtime)

    def routes(self, route: Route) -> None:
        """Every shape's model runtime, as :meth:`on_runtime` gives them."""
        self.on_runtime(lambda runtime: route(runtime, None))

    @property
    def inputs(self) -> list[TensorSpec]:
        """The feeds as the package declares them (-1: open)."""
        return [TensorSpec(n, v2_datatype(d, n), tuple(s)) for n, d, s in self.tensor_specs()[0]]

    @property
    def outputs(self) -> list[TensorSpec]:
        """The outputs as the package declares them (see :meth:`tensor_specs`)."""
        return [TensorSpec(n, v2_datatype(d, n), tuple(s)) for n, d, s in self.tensor_specs()[1]]

    def _runtime(self, feed: Mapping[str, Any]) -> tuple[ModelRuntime, dict[str, np.ndarray]]:
        _, arrays = feeds.open_request(self.policy.declared, feed)
        key = self.policy.key({n: a.shape for n, a in arrays.items()})
        with self._lock:
            if self._closed:
                raise RuntimeClosedError("the model runtime is closed: no new requests")
            runtime = self.runtimes.get(key)
            made = runtime is None
            if runtime is None:
                runtime = ModelRuntime(self.shapes.executor(key), **self._runtime_options)
                self.runtimes[key] = runtime
            watchers = list(self._watchers) if made else []
        for watcher in watchers:
            watcher(runtime)
        return runtime, arrays

    @property
    def executor(self) -> IpuExecutor:
        """An executor of the package (the first shape's): names its inputs and outputs."""
        with self._lock:
            first = next(iter(self.runtimes.values()), None)
        if first is not None:
            return first.executor
        keys = self.shapes.specialisations() or list(self.package.shapes)
        if not keys:
            raise NotSupportedError("no input shape has been compiled for this package yet")
        return self.shapes.executor(keys[0])

    def tensor_specs(
        self,
    ) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
        """(name, numpy dtype name, declared shape) of the feeds and of the outputs, as
        the package declares them, before any shape is compiled: the outputs -1 on
        every axis when a feed leaves a dimension besides the batch open.  A package
        made before the outputs' ranks were recorded answers from its first compiled
        shape (a NotSupportedError when none is compiled)."""
        meta = self.package.meta
        fetches = meta.get("fetches") or []
        names = [str(f.get("name", "")) for f in fetches]
        usable = all(names) and len(set(names)) == len(names)  # PIR fetches may be unnamed
        if not usable or any("rank" not in f for f in fetches) or not meta.get("feeds"):
            model = self.executor.model
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
        outs = [
            [-1] * len(s.shape) if open_ else [-1, *s.shape[1:]]
            for s in self.executor.model.outputs
        ]
        return feeds_, outs

    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> list[np.ndarray]:
        runtime, arrays = self._runtime(feed)
        return runtime.run(arrays, timeout)

    def submit(
        self, feed: Mapping[str, Any], timeout: float | None = None
    ) -> Future[list[np.ndarray]]:
        runtime, arrays = self._runtime(feed)
        return runtime.submit(arrays, timeout)

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

    def __enter__(self) -> ShapeRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> RuntimeStats:
        """The shapes' counters, summed."""
        return RuntimeStats.total(r.stats() for r in list(self.runtimes.values()))
