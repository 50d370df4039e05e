"""Dynamic models: what the inference server serves through a Python handler.

A *fixed* model (a :class:`~paddle_ipu.serving.ModelRuntime`) is served without Python
per request: the C++ front end writes a request's rows into the runtime's step
buffers.  A *dynamic* model takes requests of any shape (within its declared dims,
``-1`` open) and any KServe v2 datatype, BYTES included: the C++ front end parses and
checks the request on its IO thread into numpy arrays, and hands them to the model's
:meth:`DynamicModel.submit` on a worker thread; the answer is written from C++.

The interface (:class:`DynamicModel`) is small:

- ``inputs`` / ``outputs``: sequences of :class:`TensorSpec` (name, KServe v2
  datatype such as ``"FP32"`` or ``"BYTES"``, dims with ``-1`` where open);
- ``submit(feed)``: ``feed`` is ``{input name: numpy array}`` (BYTES: an object array
  of ``bytes``); returns a :class:`concurrent.futures.Future` of the outputs, either
  ``{output name: numpy array}`` or a list in the order of ``outputs``.  The future
  may be cancelled by the server (the request timed out, or its client went away).
  ``submit`` (or the future) may raise: a ``ValueError``, ``KeyError``, ``TypeError``
  or ``IndexError`` (:class:`~paddle_ipu.errors.FeedError` among them) is answered
  400 with its message (name the input), a closed or busy runtime 503, anything else
  500;
- ``close()`` (optional): called once the model is unloaded or the server stops.

:class:`FunctionModel` makes one from a plain callable ``{name: array} -> {name:
array}`` (run on a small thread pool); :func:`runtime_model` from a runtime with
``submit(feed)`` and ``request_shapes()`` (:class:`~paddle_ipu.serving.shaped.ShapeRuntime`,
:class:`~paddle_ipu.serving.bucketed_runtime.BucketedRuntime`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from paddle_ipu import _core
from paddle_ipu.errors import NotSupportedError

__all__ = [
    "DynamicModel",
    "FunctionModel",
    "Outputs",
    "RuntimeModel",
    "TensorSpec",
    "runtime_model",
]

# What a dynamic model's future gives: by output name, or in the order of `outputs`.
Outputs = Mapping[str, np.ndarray] | Sequence[np.ndarray]


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
    """One input or output of a dynamic model: its KServe v2 ``datatype`` ("FP32",
    "INT64", "UINT8", "BYTES", ...) and ``dims`` (-1: any size on that axis)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@runtime_checkable
class DynamicModel(Protocol):
    """What :meth:`InferenceServer.add_model <paddle_ipu.serving.server.InferenceServer.add_model>`
    serves as a dynamic model (see the module's docstring)."""

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    def submit(self, feed: dict[str, np.ndarray]) -> Future[Any]: ...


class FunctionModel:
    """A dynamic model over ``fn({name: array}) -> {name: array}`` (or a list in the
    order of ``outputs``), run on ``workers`` threads of its own."""

    def __init__(
        self,
        fn: Callable[[dict[str, np.ndarray]], Outputs],
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        *,
        workers: int = 1,
    ) -> None:
        self.fn = fn
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="paddle-ipu-handler")

    def submit(self, feed: dict[str, np.ndarray]) -> Future[Any]:
        return self._pool.submit(self.fn, feed)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RuntimeModel:
    """A dynamic model over a runtime whose ``submit(feed)`` returns a future of the
    outputs in its model's order and whose ``request_shapes()`` gives the declared
    shapes (-1: open): :class:`~paddle_ipu.serving.shaped.ShapeRuntime`,
    :class:`~paddle_ipu.serving.bucketed_runtime.BucketedRuntime`."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        if hasattr(runtime, "tensor_specs"):  # declared by the package: nothing compiled yet
            feeds, fetches = runtime.tensor_specs()
            self.inputs = [
                TensorSpec(n, v2_datatype(np.dtype(d), n), tuple(s)) for n, d, s in feeds
            ]
            self.outputs = [
                TensorSpec(n, v2_datatype(np.dtype(d), n), tuple(s)) for n, d, s in fetches
            ]
            return
        model = runtime.executor.model
        feed_shapes, out_shapes = runtime.request_shapes()

        def specs(tensors: Any, shapes: Any) -> list[TensorSpec]:
            out = []
            for spec, shape in zip(tensors, shapes):
                name = spec.paddle_name or spec.name
                datatype = v2_datatype(spec.numpy_dtype, name)
                out.append(TensorSpec(name, datatype, tuple(int(d) for d in shape)))
            return out

        self.inputs = specs(model.inputs, feed_shapes)
        self.outputs = specs(model.outputs, out_shapes)

    def submit(self, feed: dict[str, np.ndarray]) -> Future[Any]:
        return self.runtime.submit(feed)

    def close(self) -> None:
        self.runtime.close()


def runtime_model(runtime: Any) -> DynamicModel:
    """The dynamic model of ``runtime``: itself when it has ``inputs`` / ``outputs`` /
    ``submit``, else a :class:`RuntimeModel` over it."""
    if isinstance(runtime, DynamicModel):
        return runtime
    return RuntimeModel(runtime)
