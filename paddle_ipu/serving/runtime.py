"""The one interface every served model implements: :class:`Runtime`.

The inference server (:mod:`paddle_ipu.serving.server`), the model repository and
pipelines reach a model through this protocol and nothing else:

- ``kind``: how the C++ front end reaches it.  ``"queue"``: a
  :class:`QueueRuntime` (:class:`~paddle_ipu.serving.ModelRuntime`), whose
  :class:`~paddle_ipu._core.ServingQueue` the front end writes requests into without
  Python (:meth:`QueueRuntime.queue_plan` says how).  ``"handler"``: the front end
  parses and checks a request against ``inputs`` in C++ and hands it to ``submit`` on
  one of its worker threads (shapes that vary beyond the rows, BYTES, Python code);
- ``inputs`` / ``outputs``: :class:`TensorSpec` (name, KServe v2 datatype, dims with
  -1 where open), what clients see in the model's metadata;
- ``submit(feed)``: a :class:`concurrent.futures.Future` of the outputs (by name, or a
  list in the order of ``outputs``);
- ``routes(route)``: the queue runtimes that serve some of a handler's requests
  without Python (one per compiled input shape or sequence bucket), given to
  ``route`` now and as they are made;
- ``stats()``: the :class:`RuntimeStats` since it started;
- ``close()``: no new requests; those queued are answered.

A new runtime kind implements these (subclassing :class:`Runtime` gives the
defaults of ``routes`` and of the statistics), and the server serves it unchanged.
A model written against the smaller :class:`DynamicModel`
interface (``inputs``, ``outputs``, ``submit``) is served through :func:`as_runtime`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from paddle_ipu import _core
from paddle_ipu.errors import NotSupportedError

__all__ = [
    "Answers",
    "DynamicModel",
    "Handler",
    "PlanTensor",
    "QueuePlan",
    "QueueRuntime",
    "Route",
    "Runtime",
    "RuntimeKind",
    "RuntimeStats",
    "TensorSpec",
    "Unroute",
    "as_runtime",
    "declared_specs",
    "v2_datatype",
]

#: how the C++ front end reaches a runtime (see the module docstring)
RuntimeKind = Literal["queue", "handler"]

# KServe v2 datatypes of numpy dtypes: the C++ front end's table (csrc/serving/dtypes.cc).
_NUMPY_TO_V2 = {np.dtype(numpy): v2 for v2, numpy, _ in _core.kserve_datatypes()}


def v2_datatype(dtype: Any, name: str) -> str:
    """The KServe v2 datatype of numpy ``dtype`` (tensor ``name``, for the error)."""
    v2 = _NUMPY_TO_V2.get(np.dtype(dtype))
    if v2 is None:
        raise NotSupportedError(f"tensor {name!r}: dtype {dtype} has no KServe v2 datatype")
    return v2


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a served model: its KServe v2 ``datatype`` ("FP32",
    "INT64", "UINT8", "BYTES", ...) and ``dims`` (-1: any size on that axis)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


def declared_specs(tensors: Iterable[Any], shapes: Iterable[Sequence[int]]) -> list[TensorSpec]:
    """The :class:`TensorSpec` of compiled tensors (``paddle_ipu.compiler`` specs, named
    by their Paddle names) with the request ``shapes`` a runtime declares for them."""
    out = []
    for spec, shape in zip(tensors, shapes):
        name = spec.paddle_name or spec.name
        out.append(
            TensorSpec(name, v2_datatype(spec.numpy_dtype, name), tuple(int(d) for d in shape))
        )
    return out


@dataclass
class RuntimeStats:
    """Counters of a runtime since it started."""

    #: graph runs (each ``batches_per_step`` micro-batches); a handler: calls answered
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
    #: seconds requests waited in the queue, summed (arrival to their first run)
    queue_seconds: float = 0.0
    #: runs by units filled: ``fill_histogram[k]`` runs carried k units (0..capacity)
    fill_histogram: list[int] = field(default_factory=list)

    @staticmethod
    def total(parts: Iterable[RuntimeStats]) -> RuntimeStats:
        """The counters of several runtimes (one model's buckets or shapes), summed."""
        total = RuntimeStats()
        for s in parts:
            total.runs += s.runs
            total.requests += s.requests
            total.units += s.units
            total.padded_units += s.padded_units
            total.failed_runs += s.failed_runs
            total.busy_seconds += s.busy_seconds
            total.queue_seconds += s.queue_seconds
            hist = total.fill_histogram
            hist.extend([0] * (len(s.fill_histogram) - len(hist)))
            for k, n in enumerate(s.fill_histogram):
                hist[k] += n
        return total


@dataclass(frozen=True)
class PlanTensor:
    """One tensor of a queue's requests: what the C++ front end checks it against."""

    name: str
    datatype: str
    #: the request's shape, -1 where the rows are (auto-batching)
    shape: tuple[int, ...]
    #: bytes of one queue unit (a row when auto-batching, else a micro-batch)
    unit_bytes: int
    #: index ranges of an input that indexes (``paddle_ipu.compiler.ranges``)
    ranges: tuple[Any, ...] = ()


@dataclass(frozen=True)
class QueuePlan:
    """What a :class:`QueueRuntime` tells the C++ front end about its queue: made once
    from the runtime's settings, which were checked when it was made."""

    auto_batch: bool
    max_rows: int
    capacity: int
    limit: int
    micro_batch_size: int
    batch_timeout_us: float
    #: Triton's instance kind: KIND_CPU (the host backend), KIND_MODEL (an IPU)
    instance_kind: str
    inputs: tuple[PlanTensor, ...]
    outputs: tuple[PlanTensor, ...]


#: what a handler's ``routes`` is given: ``route(queue runtime, bucket)``, the bucket
#: None or a sequence bucket's description (``BucketedRuntime.buckets``)
Route = Callable[["QueueRuntime", "dict[str, Any] | None"], None]
#: what a handler's ``unroutes`` is given: ``unroute(queue runtime)`` once a runtime it
#: routed has closed while the model is served (a shape's graph that left memory)
Unroute = Callable[["QueueRuntime"], None]


@runtime_checkable
class Runtime(Protocol):
    """What the inference server, the model repository and pipelines serve (see the
    module docstring)."""

    @property
    def kind(self) -> RuntimeKind: ...

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    def submit(self, feed: Mapping[str, Any]) -> Future[Any]: ...

    def stats(self) -> RuntimeStats: ...

    def close(self) -> None: ...

    def routes(self, route: Route) -> None:
        """Give ``route`` every queue runtime that serves some of this model's requests
        without Python, now and as they are made (default: none)."""
        return None

    def unroutes(self, unroute: Unroute) -> None:
        """Give ``unroute`` each queue runtime :meth:`routes` gave that closes while the
        model is served (default: none close)."""
        return None

    def warm_up(self) -> list[str]:
        """Make what the model declares it serves, before the server is ready (a model
        compiled per input shape: its declared shapes); what was made (default:
        nothing; a queue runtime is warmed up with :meth:`QueueRuntime.warmup_feed`)."""
        return []

    def specialisation_stats(self) -> Any:
        """The statistics of the graphs made per input shape (with ``to_json()``), or
        None for a model of fixed graphs (default)."""
        return None


@runtime_checkable
class QueueRuntime(Runtime, Protocol):
    """A runtime of kind ``"queue"``: one :class:`~paddle_ipu._core.ServingQueue` that
    the C++ front end admits requests into, and a worker that runs the graph."""

    @property
    def queue(self) -> Any: ...

    def queue_plan(self) -> QueuePlan: ...

    def warmup_feed(self) -> dict[str, np.ndarray]:
        """One full run's feed of valid values (zeros, or the lowest valid index)."""
        ...

    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> list[np.ndarray]: ...


@runtime_checkable
class DynamicModel(Protocol):
    """The smaller interface a user's own model may implement instead of
    :class:`Runtime` (``close()`` optional): it is served through a :class:`Handler`
    (see :mod:`paddle_ipu.serving.dynamic`)."""

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    def submit(self, feed: dict[str, np.ndarray]) -> Future[Any]: ...


class Answers:
    """The statistics of a handler: requests answered, and those that failed."""

    def __init__(self) -> None:
        self.requests = 0
        self.failed = 0

    def count(self, future: Future[Any]) -> None:
        """A future's done callback (run under the GIL: the counters of a report)."""
        self.requests += 1
        if future.cancelled() or future.exception() is not None:
            self.failed += 1

    def stats(self) -> RuntimeStats:
        return RuntimeStats(runs=self.requests, requests=self.requests, failed_runs=self.failed)


class Handler(Runtime):
    """A model written against :class:`DynamicModel` (``inputs``, ``outputs``,
    ``submit``; ``close`` optional) as a :class:`Runtime` of kind ``"handler"``; it
    counts the requests it answered."""

    kind: RuntimeKind = "handler"

    def __init__(self, model: Any) -> None:
        self.model = model
        self._answers = Answers()

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return list(self.model.inputs)

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return list(self.model.outputs)

    def submit(self, feed: Mapping[str, Any]) -> Future[Any]:
        future: Future[Any] = self.model.submit(feed)
        future.add_done_callback(self._answers.count)
        return future

    def stats(self) -> RuntimeStats:
        return self._answers.stats()

    def close(self) -> None:
        close = getattr(self.model, "close", None)  # optional in DynamicModel
        if close is not None:
            close()

    def routes(self, route: Route) -> None:
        return None


def as_runtime(model: Any) -> Runtime:
    """``model`` as a :class:`Runtime`: itself when it is one, a :class:`Handler` over
    a :class:`DynamicModel`; else a NotSupportedError
    saying what the server serves."""
    if isinstance(model, Runtime):
        return model
    if isinstance(model, DynamicModel):
        return Handler(model)
    raise NotSupportedError(
        f"{type(model).__name__} is no model this server serves: a paddle_ipu.serving."
        "runtime.Runtime (ModelRuntime, ShapeRuntime, BucketedRuntime, Pipeline, "
        "FunctionModel), or a dynamic model (paddle_ipu.serving.dynamic.DynamicModel: "
        "inputs, outputs, submit(feed) -> Future)"
    )
