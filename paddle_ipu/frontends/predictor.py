"""The predictor of :mod:`paddle_ipu.inference` (Paddle Inference's ``Predictor`` and
its handles): a saved model compiled for the IPU, run on the handles' data.  The
:class:`~paddle_ipu.inference.Config` that makes it is in :mod:`paddle_ipu.inference`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from paddle_ipu.errors import FeedError, FetchError, OptionError

__all__ = ["Predictor", "Tensor"]

log = logging.getLogger("paddle_ipu")


class Tensor:
    """An input or output handle (``get_input_handle`` / ``get_output_handle``)."""

    def __init__(self, name: str, dtype: np.dtype, shape: Sequence[int], is_input: bool) -> None:
        self.name = name
        self._dtype = np.dtype(dtype)
        self._shape = list(shape)
        self._is_input = is_input
        self._value: np.ndarray | None = None

    def reshape(self, shape: Sequence[int]) -> None:
        if not self._is_input:
            raise FeedError(f"{self.name!r} is an output: only inputs can be reshaped")
        self._shape = [int(d) for d in shape]

    def copy_from_cpu(self, data: Any) -> None:
        if not self._is_input:
            raise FeedError(f"{self.name!r} is an output: copy_from_cpu is for inputs")
        array = np.asarray(data)
        self._value = np.array(array, copy=True)
        self._shape = list(array.shape)

    def copy_to_cpu(self) -> np.ndarray:
        if self._value is None:
            what = "call predictor.run() first" if not self._is_input else "copy_from_cpu first"
            raise FetchError(f"{self.name!r} holds no data: {what}")
        return np.array(self._value, copy=True)

    def shape(self) -> list[int]:
        return list(self._shape)

    def type(self) -> np.dtype:
        """The element type (a numpy dtype)."""
        return self._dtype


class _Shared:
    """What clones of one predictor share: the compiled graphs (one per row count a
    run brings; with buckets of sequence lengths, one per bucket), the runtime."""

    def __init__(self, config: Any) -> None:
        prefix = config.model_prefix()
        if prefix is None:
            raise OptionError("the Config names no model: Config(prefix) or set_model(...)")
        self.config = config
        self.prefix = prefix
        self.lock = threading.Lock()
        options: dict[str, Any] = {
            "available_memory_proportion": config.available_memory_proportion
        }
        if config.enable_half_partial:
            options["enable_half_partial"] = True
        self.options = options
        #: micro-batch size -> (its executor, its executor per bucket of sequence lengths)
        self.compiled: dict[int, tuple[Any, dict[int, Any]]] = {}
        self.package = self._compile(config.micro_batch_size)
        self.sequence = self.package.sequence
        self.runtime: Any = None
        if config.enable_model_runtime_executor:
            from paddle_ipu.serving.bucketed_runtime import runtime_for

            self.runtime = runtime_for(
                self.package, executor_options=options, timeout_ms=config.timeout_ms
            )
            self.executor = self.runtime.executor
        else:
            self.executor = self._executors(config.micro_batch_size, self.package)[0]

    def _compile(self, micro_batch_size: int) -> Any:
        from paddle_ipu.serving.saved_model import compile_model

        config = self.config
        package, _ = compile_model(
            self.prefix,
            micro_batch_size=micro_batch_size,
            batches_per_step=config.batches_per_step,
            enable_fp16=config.enable_fp16,
            cache=config.use_compile_cache,
            seq_buckets=config.seq_buckets,
            pad_values=config.pad_values,
        )
        return package

    def _executors(self, micro_batch_size: int, package: Any) -> tuple[Any, dict[int, Any]]:
        if package.sequence is not None:
            buckets = package.executors(**self.options)
            pair = (buckets[package.sequence.lengths[-1]], buckets)
        else:
            pair = (package.executor(**self.options), {})
        self.compiled[micro_batch_size] = pair
        return pair

    def executors_for(self, rows: int) -> tuple[Any, dict[int, Any]]:
        """The executors for a run of ``rows`` rows: the configured ones, or -- as Paddle
        Inference takes any batch -- ones compiled for ``rows / batches_per_step`` (kept
        for the next run of that size, with a log line the first time)."""
        bps = self.config.batches_per_step
        if rows == self.config.micro_batch_size * bps:
            return self.compiled[self.config.micro_batch_size]
        if rows < 1 or rows % bps:
            raise FeedError(
                f"a run of {rows} rows: with ipu_batches_per_step={bps} a run takes a "
                f"multiple of {bps} rows"
            )
        micro = rows // bps
        with self.lock:
            pair = self.compiled.get(micro)
            if pair is None:
                log.info(
                    "%s: a run of %d rows: compiling the model for micro-batches of %d",
                    self.prefix,
                    rows,
                    micro,
                )
                pair = self._executors(micro, self._compile(micro))
        return pair

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.runtime is not None:
            return list(self.runtime.run(feed))
        rows = {int(v.shape[0]) if v.ndim else -1 for v in feed.values()}
        executor, buckets = (
            self.executors_for(rows.pop())
            if len(rows) == 1
            else self.compiled[self.config.micro_batch_size]
        )
        if self.sequence is None:
            return list(executor.run(feed))
        length = self.sequence.length_of(feed)
        bucket = self.sequence.bucket_for(length)
        outputs = buckets[bucket].run(self.sequence.pad(feed, bucket))
        names = [s.paddle_name or s.name for s in self.package.model.outputs]
        return self.sequence.unpad(names, outputs, length)

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
        every = [self.executor]
        for executor, buckets in self.compiled.values():
            every += [executor, *buckets.values()]
        for executor in {id(e): e for e in every}.values():
            executor.reset()


class Predictor:
    """Runs a saved inference model compiled for the IPU (see the module docstring)."""

    def __init__(self, config: Any, shared: _Shared | None = None) -> None:
        if not config.use_ipu():
            raise OptionError(
                "paddle_ipu.inference runs on the IPU: call config.enable_ipu(...) first "
                "(use paddle.inference for the CPU)"
            )
        self._config = config
        self._shared = shared or _Shared(config)
        model = self._shared.package.model
        runtime = self._shared.runtime
        layout = self._shared.executor.layout
        self._inputs = {
            (s.paddle_name or s.name): Tensor(
                s.paddle_name or s.name, s.numpy_dtype, layout.input_shape(s.shape), True
            )
            for s in model.inputs
        }
        self._outputs = {
            (s.paddle_name or s.name): Tensor(
                s.paddle_name or s.name, s.numpy_dtype, s.shape, False
            )
            for s in model.outputs
        }
        if runtime is not None and runtime.auto_batch:
            for t in self._inputs.values():
                t._shape[0] = -1
        sequence = self._shared.sequence
        if sequence is not None:  # any compiled length goes
            for handles, axes in (
                (self._inputs, sequence.feeds),
                (self._outputs, sequence.outputs),
            ):
                for name, handle in handles.items():
                    for axis in axes.get(name, ()):
                        handle._shape[axis] = -1

    def get_input_names(self) -> list[str]:
        return list(self._inputs)

    def get_output_names(self) -> list[str]:
        return list(self._outputs)

    def get_input_handle(self, name: str) -> Tensor:
        try:
            return self._inputs[name]
        except KeyError:
            raise FeedError(
                f"unknown input {name!r}: the model takes {list(self._inputs)}"
            ) from None

    def get_output_handle(self, name: str) -> Tensor:
        try:
            return self._outputs[name]
        except KeyError:
            raise FetchError(
                f"unknown output {name!r}: the model gives {list(self._outputs)}"
            ) from None

    def run(self, inputs: Sequence[Any] | None = None) -> list[np.ndarray] | None:
        """Run on the input handles' data (or on ``inputs``, in input order, returning
        the outputs as Paddle 2.5+'s ``run(list)`` does).  A run of another number of
        rows than the configured batch compiles the model for it (see
        :meth:`_Shared.executors_for`).  The output handles are emptied first: after a
        run that fails, ``copy_to_cpu`` raises instead of returning older results."""
        for handle in self._outputs.values():
            handle._value = None
        if inputs is not None:
            if len(inputs) != len(self._inputs):
                raise FeedError(
                    f"run() got {len(inputs)} inputs, the model takes {len(self._inputs)}: "
                    f"{list(self._inputs)}"
                )
            feed = {name: np.asarray(v) for name, v in zip(self._inputs, inputs)}
        else:
            feed = {}
            for name, handle in self._inputs.items():
                if handle._value is None:
                    raise FeedError(f"input {name!r} has no data: call copy_from_cpu first")
                feed[name] = handle._value
        outputs = self._shared.run(feed)
        for handle, value in zip(self._outputs.values(), outputs):
            handle._value = np.asarray(value)
            handle._shape = list(handle._value.shape)
        return [np.array(v, copy=True) for v in outputs] if inputs is not None else None

    def clone(self) -> Predictor:
        """A predictor with its own handles over the same compiled model (and runtime)."""
        return Predictor(self._config, self._shared)

    def clear_intermediate_tensor(self) -> None:
        """Nothing to clear: the whole graph keeps no intermediates between runs."""

    def try_shrink_memory(self) -> int:
        return 0

    def close(self) -> None:
        """Stop the model runtime (if any) and release the device."""
        self._shared.close()
