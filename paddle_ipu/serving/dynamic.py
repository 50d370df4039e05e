"""Dynamic models: what the inference server serves through a Python handler.

A model runtime (:class:`~paddle_ipu.serving.ModelRuntime`, a
:class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"queue"``) is served without
Python per request: the C++ front end writes a request's rows into the runtime's
step buffers.  A *dynamic* model (kind ``"handler"``) takes requests of any shape
(within its declared dims, ``-1`` open) and any KServe v2 datatype, BYTES included:
the C++ front end parses and checks the request on its IO thread into numpy arrays,
and hands them to the model's ``submit`` on a worker thread; the answer is written
from C++.

The interface a user's model implements (:class:`DynamicModel`) is small:

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

The server serves it as a :class:`~paddle_ipu.serving.runtime.Handler`
(:func:`~paddle_ipu.serving.runtime.as_runtime`).  :class:`FunctionModel` makes one
from a plain callable ``{name: array} -> {name: array}`` (run on a small thread pool);
:class:`RuntimeModel` serves any runtime's ``submit`` through Python (what a queue
runtime's requests cost through a handler: bench/serving_dynamic.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from paddle_ipu.serving.runtime import (
    Answers,
    DynamicModel,
    Handler,
    Runtime,
    RuntimeKind,
    RuntimeStats,
    TensorSpec,
    v2_datatype,
)

__all__ = [
    "DynamicModel",
    "FunctionModel",
    "Outputs",
    "RuntimeModel",
    "TensorSpec",
    "v2_datatype",
]

# What a dynamic model's future gives: by output name, or in the order of `outputs`.
Outputs = Mapping[str, np.ndarray] | Sequence[np.ndarray]


class FunctionModel(Runtime):
    """A dynamic model over ``fn({name: array}) -> {name: array}`` (or a list in the
    order of ``outputs``), run on ``workers`` threads of its own: a
    :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"handler"``."""

    kind: RuntimeKind = "handler"

    def __init__(
        self,
        fn: Callable[[dict[str, np.ndarray]], Outputs],
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        *,
        workers: int = 1,
    ) -> None:
        self.fn = fn
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="paddle-ipu-handler")
        self._answers = Answers()

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self._outputs

    def submit(self, feed: Mapping[str, Any]) -> Future[Any]:
        future = self._pool.submit(self.fn, feed)  # type: ignore[arg-type]
        future.add_done_callback(self._answers.count)
        return future

    def stats(self) -> RuntimeStats:
        return self._answers.stats()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RuntimeModel(Handler):
    """A dynamic model over any :class:`~paddle_ipu.serving.runtime.Runtime`'s
    ``submit``: its requests go through Python even when the runtime could take them
    in C++ (what that costs: bench/serving_dynamic.py)."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self.runtime = runtime
