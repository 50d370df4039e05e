"""A Paddle Inference style predictor for saved inference models on the IPU.

It mirrors ``paddle.inference``'s API, as Paddle 2.x scripts used it on the IPU::

    from paddle_ipu import inference

    config = inference.Config("model/inference")          # prefix, or (model, params)
    config.enable_ipu(ipu_device_num=1, ipu_micro_batch_size=4)
    config.set_ipu_config(ipu_enable_fp16=False)
    predictor = inference.create_predictor(config)
    x = predictor.get_input_handle(predictor.get_input_names()[0])
    x.reshape([4, 3, 224, 224])
    x.copy_from_cpu(batch)
    predictor.run()
    out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()

The model is compiled once (through the compile cache, see
:mod:`paddle_ipu.serving.package`) into one whole graph.  Without the model runtime a run
takes exactly ``ipu_micro_batch_size x ipu_batches_per_step`` rows, as on Paddle
2.x; with ``set_ipu_config(ipu_enable_model_runtime_executor=True)`` a run takes any
number of rows, and predictors made by :meth:`Predictor.clone` share one runtime
that batches their concurrent runs together.

A text model saved with a ``-1`` sequence length runs through buckets of sequence
lengths (``config.set_ipu_sequence_buckets([16, 32, 64])``): one graph per length, a
request padded to the shortest that holds it and its outputs cut back (see
:mod:`paddle_ipu.serving.package`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu.errors import FeedError, FetchError, NotSupportedError, OptionError

__all__ = ["Config", "Predictor", "Tensor", "create_predictor"]


def _int_option(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise OptionError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


class Config:
    """Where the saved model is and how to run it: ``Config(prefix)``,
    ``Config(model_dir)`` or ``Config(model_file, params_file)``."""

    def __init__(self, model: str | os.PathLike[str] | None = None, params: Any = None) -> None:
        self._prefix: str | None = None
        self._ipu = False
        self.device_num = 1
        self.micro_batch_size = 1
        self.enable_pipelining = False
        self.batches_per_step = 1
        self.enable_fp16 = False
        self.replica_num = 1
        self.available_memory_proportion = 1.0
        self.enable_half_partial = False
        self.enable_model_runtime_executor = False
        self.timeout_ms = 2.0
        self.use_compile_cache = True
        self.seq_buckets: list[int] = []
        self.pad_values: dict[str, float] = {}
        if model is not None:
            self.set_model(model, params)

    def set_model(self, model: str | os.PathLike[str], params: Any = None) -> None:
        path = str(model)
        if params is not None:
            m, p = Path(path), Path(str(params))
            if m.with_suffix("") != p.with_suffix(""):
                raise NotSupportedError(
                    f"the model file {str(m)!r} and the parameters file {str(p)!r} must share "
                    f"their path prefix (as save_inference_model writes them)"
                )
            self._prefix = str(m.with_suffix(""))
        elif Path(path).is_dir():
            found = sorted(
                {f.with_suffix("") for ext in ("*.json", "*.pdmodel") for f in Path(path).glob(ext)}
            )
            if len(found) != 1:
                raise OptionError(
                    f"model directory {path!r} holds {len(found)} saved models "
                    f"({[f.name for f in found]}); give the path prefix of one"
                )
            self._prefix = str(found[0])
        else:
            self._prefix = (
                str(Path(path).with_suffix("")) if path.endswith((".json", ".pdmodel")) else path
            )

    def model_prefix(self) -> str | None:
        return self._prefix

    def enable_ipu(
        self,
        ipu_device_num: int = 1,
        ipu_micro_batch_size: int = 1,
        ipu_enable_pipelining: bool = False,
        ipu_batches_per_step: int = 1,
    ) -> None:
        """Run on the IPU (Paddle Inference's signature)."""
        self.device_num = _int_option("ipu_device_num", ipu_device_num)
        self.micro_batch_size = _int_option("ipu_micro_batch_size", ipu_micro_batch_size)
        self.batches_per_step = _int_option("ipu_batches_per_step", ipu_batches_per_step)
        self.enable_pipelining = bool(ipu_enable_pipelining)
        if self.device_num != 1 or self.enable_pipelining:
            raise NotSupportedError(
                f"ipu_device_num={ipu_device_num}, ipu_enable_pipelining="
                f"{ipu_enable_pipelining}: the predictor runs a saved inference model on one "
                f"IPU; shard a model with IpuCompiledProgram and ipu_shard_guard instead"
            )
        self._ipu = True

    def set_ipu_config(
        self,
        ipu_enable_fp16: bool = False,
        ipu_replica_num: int = 1,
        ipu_available_memory_proportion: float = 1.0,
        ipu_enable_half_partial: bool = False,
        ipu_enable_model_runtime_executor: bool = False,
    ) -> None:
        """IPU options (Paddle Inference's signature)."""
        replicas = _int_option("ipu_replica_num", ipu_replica_num)
        if replicas != 1:
            raise NotSupportedError(
                f"ipu_replica_num={ipu_replica_num}: the predictor runs one replica; use "
                f"IpuStrategy.set_graph_config(replicated_graph_count=...) with "
                f"IpuCompiledProgram for replicas"
            )
        proportion = float(ipu_available_memory_proportion)
        if not 0.0 < proportion <= 1.0:
            raise OptionError(
                f"ipu_available_memory_proportion must be in (0, 1], got "
                f"{ipu_available_memory_proportion!r}"
            )
        self.enable_fp16 = bool(ipu_enable_fp16)
        self.replica_num = replicas
        self.available_memory_proportion = proportion
        self.enable_half_partial = bool(ipu_enable_half_partial)
        self.enable_model_runtime_executor = bool(ipu_enable_model_runtime_executor)

    def set_ipu_sequence_buckets(
        self, buckets: Sequence[int], pad_values: dict[str, float] | None = None
    ) -> None:
        """Compile one graph per sequence length in ``buckets`` (the model's feeds have
        a ``-1`` dimension besides the batch); ``pad_values`` gives the padding of a
        feed that masks it (an attention mask: 0), the others pad with 0."""
        from paddle_ipu.serving.package import _check_buckets

        self.seq_buckets, self.pad_values = _check_buckets(buckets, pad_values)

    def use_ipu(self) -> bool:
        return self._ipu

    def load_ipu_config(self, path: str) -> None:
        raise NotSupportedError(
            "load_ipu_config is not supported: call enable_ipu() and set_ipu_config()"
        )

    def set_ipu_custom_info(self, *args: Any, **kwargs: Any) -> None:
        raise NotSupportedError(
            "set_ipu_custom_info (custom ops) is not supported by the predictor: use "
            "IpuStrategy.add_custom_op with IpuCompiledProgram"
        )

    def disable_compile_cache(self) -> None:
        """Compile every time instead of using paddle-ipu's compile cache."""
        self.use_compile_cache = False

    def summary(self) -> str:
        return (
            f"model {self._prefix}; ipu {self._ipu}: micro_batch_size {self.micro_batch_size}, "
            f"batches_per_step {self.batches_per_step}, fp16 {self.enable_fp16}, model runtime "
            f"{self.enable_model_runtime_executor}"
        )


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
    """What clones of one predictor share: the package, the executor, the runtime."""

    def __init__(self, config: Config) -> None:
        from paddle_ipu.serving.package import compile_model

        prefix = config.model_prefix()
        if prefix is None:
            raise OptionError("the Config names no model: Config(prefix) or set_model(...)")
        self.package, _ = compile_model(
            prefix,
            micro_batch_size=config.micro_batch_size,
            batches_per_step=config.batches_per_step,
            enable_fp16=config.enable_fp16,
            cache=config.use_compile_cache,
            seq_buckets=config.seq_buckets,
            pad_values=config.pad_values,
        )
        options: dict[str, Any] = {
            "available_memory_proportion": config.available_memory_proportion
        }
        if config.enable_half_partial:
            options["enable_half_partial"] = True
        self.sequence = self.package.sequence
        self.runtime: Any = None
        #: one executor per bucket of sequence lengths (without the model runtime)
        self.executors: dict[int, Any] = {}
        if config.enable_model_runtime_executor:
            from paddle_ipu.serving.model_runtime import runtime_for

            self.runtime = runtime_for(
                self.package, executor_options=options, timeout_ms=config.timeout_ms
            )
            self.executor = self.runtime.executor
        elif self.sequence is not None:
            self.executors = self.package.executors(**options)
            self.executor = self.executors[self.sequence.lengths[-1]]
        else:
            self.executor = self.package.executor(**options)
        self.lock = threading.Lock()

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.runtime is not None:
            return list(self.runtime.run(feed))
        if self.sequence is None:
            return list(self.executor.run(feed))
        length = self.sequence.length_of(feed)
        bucket = self.sequence.bucket_for(length)
        outputs = self.executors[bucket].run(self.sequence.pad(feed, bucket))
        names = [s.paddle_name or s.name for s in self.package.model.outputs]
        return self.sequence.unpad(names, outputs, length)

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
        for executor in {id(e): e for e in [self.executor, *self.executors.values()]}.values():
            executor.reset()


class Predictor:
    """Runs a saved inference model compiled for the IPU (see the module docstring)."""

    def __init__(self, config: Config, shared: _Shared | None = None) -> None:
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
        the outputs as Paddle 2.5+'s ``run(list)`` does)."""
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


def create_predictor(config: Config) -> Predictor:
    """Compile the Config's model for the IPU and return a :class:`Predictor`."""
    return Predictor(config)
