"""The model runtime of a package of sequence buckets, and the runtime of any package.

:class:`BucketedRuntime` gives :class:`~paddle_ipu.serving.model_runtime.ModelRuntime`'s
interface over one model runtime per compiled sequence length (the shape policy of
:class:`~paddle_ipu.executor.shapes.SequenceBuckets`); :func:`runtime_for` picks the
runtime a package needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paddle_ipu.errors import NotSupportedError
from paddle_ipu.serving.model_runtime import ModelRuntime
from paddle_ipu.serving.runtime import Route, Runtime, RuntimeKind, RuntimeStats, declared_specs

if TYPE_CHECKING:
    from paddle_ipu.serving.shaped import ShapeRuntime

__all__ = ["BucketedRuntime", "runtime_for"]


class BucketedRuntime(Runtime):
    """:class:`ModelRuntime`'s interface over a package of sequence buckets.

    One model runtime per compiled sequence length; a request of length ``L`` is padded
    to the shortest bucket ``>= L``, queued on that bucket's runtime (and batched with
    the other requests of that bucket), and its outputs are cut back to ``L`` (see
    :class:`~paddle_ipu.executor.shapes.SequenceBuckets`).  ``executor`` is the longest
    bucket's (its model names the inputs and outputs); :meth:`request_shapes` shows
    ``-1`` on the sequence axes.  Keyword arguments are :class:`ModelRuntime`'s.
    Served as a :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"handler"``
    whose :meth:`routes` are its buckets' model runtimes."""

    kind: RuntimeKind = "handler"

    def __init__(
        self,
        package: Any,
        backend: str | None = None,
        *,
        executor_options: Mapping[str, Any] | None = None,
        **runtime_options: Any,
    ) -> None:
        sequence = package.sequence
        if sequence is None:
            raise NotSupportedError("the package has no buckets of sequence lengths")
        self.sequence = sequence
        executors = package.executors(backend, **dict(executor_options or {}))
        self.runtimes: dict[int, ModelRuntime] = {}
        try:
            for length, executor in executors.items():
                self.runtimes[length] = ModelRuntime(executor, **runtime_options)
        except BaseException:
            for runtime in self.runtimes.values():
                runtime.close(cancel=True)
            raise
        longest = self.runtimes[sequence.lengths[-1]]
        self.executor = longest.executor
        self.micro_batch_size = longest.micro_batch_size
        self.timeout_ms = longest.timeout_ms
        self.num_buffers = longest.num_buffers
        self.auto_batch = longest.auto_batch
        self.max_request_rows = longest.max_request_rows
        model = longest.executor.model
        self._feed_names = [s.paddle_name or s.name for s in model.inputs]
        self._out_names = [s.paddle_name or s.name for s in model.outputs]

    def request_shapes(self) -> tuple[list[list[int]], list[list[int]]]:
        """As :meth:`ModelRuntime.request_shapes`, with ``-1`` on the sequence axes."""
        feeds, outs = self.runtimes[self.sequence.lengths[-1]].request_shapes()
        for names, shapes, axes in (
            (self._feed_names, feeds, self.sequence.feeds),
            (self._out_names, outs, self.sequence.outputs),
        ):
            for name, shape in zip(names, shapes):
                for axis in axes.get(name, ()):
                    shape[axis] = -1
        return feeds, outs

    @property
    def inputs(self) -> list[Any]:
        """The feeds (name, KServe v2 datatype, dims; -1 on the rows and sequence axes)."""
        return declared_specs(self.executor.model.inputs, self.request_shapes()[0])

    @property
    def outputs(self) -> list[Any]:
        """The outputs (name, KServe v2 datatype, dims; -1 on the rows and sequence axes)."""
        return declared_specs(self.executor.model.outputs, self.request_shapes()[1])

    def routes(self, route: Route) -> None:
        """Every bucket's model runtime with its description (:meth:`buckets`)."""
        for runtime, bucket in self.buckets():
            route(runtime, bucket)

    def buckets(self) -> list[tuple[ModelRuntime, dict[str, Any]]]:
        """Each bucket's model runtime and its sequence description, shortest first:
        ``{"length": n, "inputs": {feed: (sequence axes, one pad element's bytes in
        the feed's dtype)}, "outputs": {output: sequence axes}}`` (the inference
        server pads and cuts the requests of every length in C++ with it)."""
        model = self.executor.model
        inputs: dict[str, tuple[list[int], bytes]] = {}
        for spec in model.inputs:
            name = spec.paddle_name or spec.name
            axes = self.sequence.feeds.get(name)
            if axes:
                value = np.dtype(spec.numpy_dtype).type(self.sequence.pad_values.get(name, 0.0))
                inputs[name] = ([int(a) for a in axes], value.tobytes())
        outputs = {
            name: [int(a) for a in self.sequence.outputs[name]]
            for name in self._out_names
            if self.sequence.outputs.get(name)
        }
        return [
            (self.runtimes[n], {"length": n, "inputs": inputs, "outputs": outputs})
            for n in sorted(self.runtimes)
        ]

    def _route(self, feed: Mapping[str, Any]) -> tuple[int, ModelRuntime, dict[str, Any]]:
        length = self.sequence.length_of(feed)
        bucket = self.sequence.bucket_for(length)
        return length, self.runtimes[bucket], self.sequence.pad(feed, bucket)

    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> list[np.ndarray]:
        """Run one request of any compiled length; its outputs are cut to its length."""
        length, runtime, padded = self._route(feed)
        return self.sequence.unpad(self._out_names, runtime.run(padded, timeout), length)

    def submit(
        self, feed: Mapping[str, Any], timeout: float | None = None
    ) -> Future[list[np.ndarray]]:
        """Queue one request of any compiled length (see :meth:`ModelRuntime.submit`)."""
        length, runtime, padded = self._route(feed)
        inner = runtime.submit(padded, timeout)
        outer = _ChainedFuture(inner)

        def done(f: Future[list[np.ndarray]]) -> None:
            outer.release()  # no cycle outer -> inner -> this callback -> outer
            if f.cancelled():
                outer.cancel()
                return
            if not outer.set_running_or_notify_cancel():
                return
            error = f.exception()
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(self.sequence.unpad(self._out_names, f.result(), length))

        inner.add_done_callback(done)
        return outer

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.runtimes.values())

    @property
    def closed(self) -> bool:
        return all(r.closed for r in self.runtimes.values())

    def is_worker_thread(self) -> bool:
        return any(r.is_worker_thread() for r in self.runtimes.values())

    def start(self) -> None:
        for runtime in self.runtimes.values():
            runtime.start()

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Close every bucket's runtime (see :meth:`ModelRuntime.close`)."""
        for runtime in self.runtimes.values():
            runtime.close(cancel, timeout)

    def __enter__(self) -> BucketedRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> RuntimeStats:
        """The buckets' counters, summed."""
        return RuntimeStats.total(r.stats() for r in self.runtimes.values())


class _ChainedFuture(Future):
    """The future of a bucketed request: cancelling it cancels the bucket's request."""

    def __init__(self, inner: Future[Any]) -> None:
        super().__init__()
        self._inner: Future[Any] | None = inner

    def release(self) -> None:
        """Forget the bucket's request (it is done)."""
        self._inner = None

    def cancel(self) -> bool:
        inner = self._inner
        if inner is not None and not inner.cancel() and not inner.cancelled():
            return False
        return super().cancel()


def runtime_for(
    package: Any,
    backend: str | None = None,
    *,
    executor_options: Mapping[str, Any] | None = None,
    compiled_outputs: bool = False,
    name: str = "",
    **runtime_options: Any,
) -> ModelRuntime | BucketedRuntime | ShapeRuntime:
    """The model runtime of a package: a :class:`ModelRuntime` over its executor, a
    :class:`BucketedRuntime` when it holds buckets of sequence lengths, or a
    :class:`~paddle_ipu.serving.shaped.ShapeRuntime` when it is compiled per input shape.
    ``executor_options`` are strategy options of the executors; the keyword arguments
    are :class:`ModelRuntime`'s (``name``: the model's, in the log lines of a package
    compiled per input shape).  A package with a host tail (outputs of data-dependent
    sizes: :mod:`paddle_ipu.serving.host_tail`) is refused unless ``compiled_outputs``
    says that the caller runs the tail on the runtime's outputs (what the compiled graph
    gives is what the tail reads, not the model's outputs)."""
    tail = getattr(package, "tail", None)
    if tail is not None and not compiled_outputs:
        raise NotSupportedError(
            f"the package's outputs {tail.output_names} have data-dependent sizes: its "
            "compiled graph gives what its host tail reads, not these outputs; run it "
            "through paddle_ipu.inference or paddle-ipu run (or runtime_for(..., "
            "compiled_outputs=True) and package.tail.run(feed, outputs))"
        )
    if getattr(package, "sequence", None) is not None:
        return BucketedRuntime(
            package, backend, executor_options=executor_options, **runtime_options
        )
    if package.per_shape:
        from paddle_ipu.serving.shaped import ShapeRuntime

        return ShapeRuntime(
            package, backend, executor_options=executor_options, name=name, **runtime_options
        )
    executor = package.executor(backend, **dict(executor_options or {}))
    return ModelRuntime(executor, **runtime_options)
