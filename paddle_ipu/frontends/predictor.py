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

from paddle_ipu._util.logs import quiet_info
from paddle_ipu.errors import FeedError, FetchError, NotSupportedError, OptionError

__all__ = ["Predictor", "Tensor"]

log = logging.getLogger("paddle_ipu")


class Tensor:
    """An input or output handle (``get_input_handle`` / ``get_output_handle``)."""

    __module__ = "paddle_ipu.inference"  # its public home (what repr() names)

    def __init__(self, name: str, dtype: np.dtype, shape: Sequence[int], is_input: bool) -> None:
        self.name = name
        self._dtype = np.dtype(dtype)
        self._shape = list(shape)
        self._is_input = is_input
        self._value: np.ndarray | None = None
        self._lod: list[list[int]] = []

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

    def set_lod(self, lod: Sequence[Sequence[int]]) -> None:
        """The input's sequences (Paddle's LoD: offsets into the rows, level 1): a run
        pads them into buckets of lengths (:mod:`paddle_ipu.frontends.lod_runner`)."""
        if not self._is_input:
            raise FeedError(f"{self.name!r} is an output: set_lod is for inputs")
        self._lod = check_lod(self.name, lod)

    def lod(self) -> list[list[int]]:
        """The sequences' offsets: an input's as set, an output's after a run of
        sequences (where its rows come per sequence)."""
        return [list(level) for level in self._lod]

    def type(self) -> np.dtype:
        """The element type (a numpy dtype)."""
        return self._dtype


def check_lod(name: str, lod: Sequence[Sequence[int]]) -> list[list[int]]:
    """A LoD as Paddle's ``set_lod`` takes it, checked: one level of offsets from 0,
    non-decreasing (``[[0, 3, 5]]``: rows 0-2 and 3-4)."""
    try:
        levels = [[int(x) for x in level] for level in lod]
    except (TypeError, ValueError):
        raise FeedError(
            f"input {name!r}: set_lod takes a list of lists of row offsets ([[0, 3, 5]]), "
            f"received {lod!r}"
        ) from None
    if not levels:
        return []
    if len(levels) > 1:
        raise NotSupportedError(
            f"input {name!r}: a LoD of {len(levels)} levels; the predictor runs one level of "
            "sequences (a nested LoD is not supported)"
        )
    offsets = levels[0]
    if len(offsets) < 2 or offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise FeedError(
            f"input {name!r}: a LoD's offsets start at 0 and do not decrease ([[0, 3, 5]]), "
            f"received {levels}"
        )
    return levels


def sequence_offsets(feed: dict[str, np.ndarray], lods: dict[str, list[int]]) -> list[int]:
    """The offsets of a run's sequences (``lods``: input name -> its offsets, the same
    for every input that has them, covering its rows)."""
    offsets = next(iter(lods.values()))
    for name, other in lods.items():
        if other != offsets:
            raise FeedError(
                f"inputs with different sequences: {name!r} has LoD {[other]}, "
                f"{next(iter(lods))!r} {[offsets]}; the predictor runs one set of sequences"
            )
        rows = int(feed[name].shape[0]) if feed[name].ndim else -1
        if rows != offsets[-1]:
            raise FeedError(
                f"input {name!r}: its LoD {[offsets]} covers {offsets[-1]} rows, the data has "
                f"{rows}"
            )
    return list(offsets)


class _Shared:
    """What clones of one predictor share: the compiled graphs and the runtime.

    A model runs through its shape policy (:mod:`paddle_ipu.executor.shapes`): any
    number of rows, in micro-batches of the configured size, never compiling again for
    a batch; a model whose feeds leave other dimensions open runs one graph per input
    shape requests bring (or ahead of time: ``set_ipu_input_shapes``; or per bucket:
    ``set_ipu_shape_buckets``), as many in memory as ``set_ipu_specialisation_memory``
    holds.  A model with buckets of sequence lengths runs one
    graph per length, and compiles again for a run of another number of rows."""

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
        if config.num_threads is not None:  # set_cpu_math_library_num_threads
            options["host_num_threads"] = config.num_threads
        options.update(config.strategy_options)  # set_ipu_strategy_options
        self.options = options
        #: the script turned Paddle's INFO lines off (disable_glog_info): ours too
        self.quiet = bool(config.glog_info_disabled())
        #: sequence buckets: micro-batch size -> (its executor, its executor per bucket)
        self.compiled: dict[int, tuple[Any, dict[int, Any]]] = {}
        self.shapes: Any = None
        #: runs of sequences (set_lod), made on the first
        self.lod: Any = None
        from paddle_ipu.frontends.lod_runner import sequence_operators

        #: the model's operators that need their input's sequences (a LoD)
        self.sequence_ops = sequence_operators(prefix)
        with quiet_info(self.quiet):
            self.package = self._compile(config.micro_batch_size)
            self.sequence = self.package.sequence
            self.runtime: Any = None
            if config.enable_model_runtime_executor:
                from paddle_ipu.serving.bucketed_runtime import runtime_for

                self.runtime = runtime_for(
                    self.package,
                    executor_options=options,
                    timeout_ms=config.timeout_ms,
                    compiled_outputs=True,  # run() runs the host tail, if any, after it
                )
            elif self.sequence is not None:
                self._executors(config.micro_batch_size, self.package)
            else:
                from paddle_ipu.serving.shaped import shape_executor

                self.shapes = shape_executor(self.package, name=prefix, **options)
                for key in self.package.ahead() if self.package.per_shape else [""]:
                    self.shapes.executor(key)  # what is compiled ahead is prepared now

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
            input_shapes=config.input_shapes,
            max_specialisations=config.max_specialisations,
            shape_ranges=config.shape_ranges,
            shape_buckets=config.shape_buckets,
            memory_mb=config.specialisation_memory_mb,
        )
        return package

    def _executors(self, micro_batch_size: int, package: Any) -> tuple[Any, dict[int, Any]]:
        buckets = package.executors(**self.options)
        pair = (buckets[package.sequence.lengths[-1]], buckets)
        self.compiled[micro_batch_size] = pair
        return pair

    def executors_for(self, rows: int) -> tuple[Any, dict[int, Any]]:
        """Sequence buckets: the executors for a run of ``rows`` rows: the configured
        ones, or ones compiled for ``rows / batches_per_step`` (kept for the next run of
        that size, with a log line the first time)."""
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

    def handles(self) -> tuple[list[Tensor], list[Tensor]]:
        """New input and output handles, with the shapes they report before a run: the
        inputs' as declared (-1: open, or any number of rows), the outputs' with -1
        where they follow an open dimension."""
        package = self.package
        model = package.model
        per_shape = package.per_shape and self.runtime is not None  # a ShapeRuntime
        if (self.shapes is not None or per_shape) and package.policy is not None:
            meta = package.meta
            inputs = [
                Tensor(name, np.dtype(feed["dtype"]), feed["shape"], True)
                for name, feed in meta["feeds"].items()
            ]
            if model is not None:
                outputs = [
                    Tensor(s.paddle_name or s.name, s.numpy_dtype, [-1, *s.shape[1:]], False)
                    for s in model.outputs
                ]
            else:
                outputs = [
                    Tensor(f["name"], np.dtype(f["dtype"]), [], False) for f in meta["fetches"]
                ]
            return inputs, self._tail_handles(outputs)
        assert model is not None
        if self.runtime is not None:
            executor = self.runtime.executor
        else:
            executor = self.compiled[self.config.micro_batch_size][0]
        layout = executor.layout
        inputs = [
            Tensor(s.paddle_name or s.name, s.numpy_dtype, layout.input_shape(s.shape), True)
            for s in model.inputs
        ]
        outputs = [
            Tensor(s.paddle_name or s.name, s.numpy_dtype, s.shape, False) for s in model.outputs
        ]
        if self.runtime is not None and self.runtime.auto_batch:
            for t in inputs:
                t._shape[0] = -1
        sequence = self.sequence
        if sequence is not None:  # any compiled length goes
            for handles, axes in ((inputs, sequence.feeds), (outputs, sequence.outputs)):
                for handle in handles:
                    for axis in axes.get(handle.name, ()):
                        handle._shape[axis] = -1
        return inputs, self._tail_handles(outputs)

    def _tail_handles(self, outputs: list[Tensor]) -> list[Tensor]:
        """The output handles: the host tail's outputs where the model has one (their
        declared shapes, -1 where the data decides), else ``outputs``."""
        tail = self.package.tail
        if tail is None:
            return outputs
        return [Tensor(name, np.dtype(dtype), shape, False) for name, dtype, shape in tail.outputs]

    def output_names(self) -> list[str]:
        """The compiled graph's outputs (what the host tail reads, where there is one)."""
        model = self.package.model
        if model is None:  # compiled per input shape, none yet: the saved model's fetches
            return [f["name"] for f in self.package.meta.get("fetches", [])]
        return [s.paddle_name or s.name for s in model.outputs]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The model's outputs: the compiled graph's, then the host tail's (a model
        whose outputs have data-dependent sizes; :mod:`paddle_ipu.serving.host_tail`)."""
        with quiet_info(self.quiet):
            outputs = self._run(feed)
            tail = self.package.tail
            return tail.run(feed, outputs) if tail is not None else outputs

    def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.runtime is not None:
            return list(self.runtime.run(feed))
        if self.shapes is not None:
            return list(self.shapes.run(feed))
        rows = {int(v.shape[0]) if v.ndim else -1 for v in feed.values()}
        _, buckets = (
            self.executors_for(rows.pop())
            if len(rows) == 1
            else self.compiled[self.config.micro_batch_size]
        )
        length = self.sequence.length_of(feed)
        bucket = self.sequence.bucket_for(length)
        outputs = buckets[bucket].run(self.sequence.pad(feed, bucket))
        return self.sequence.unpad(self.output_names(), outputs, length)

    def run_lod(
        self, feed: dict[str, np.ndarray], lods: dict[str, list[int]]
    ) -> tuple[list[np.ndarray], list[list[list[int]]]]:
        """A run of sequences (``lods``: the inputs with a LoD), padded into buckets
        (:mod:`paddle_ipu.frontends.lod_runner`): the outputs and their LoDs."""
        if self.package.tail is not None:
            raise NotSupportedError(
                "inputs with a LoD, and outputs of data-dependent sizes (a host tail): a "
                "run of sequences is not supported for such a model"
            )
        offsets = sequence_offsets(feed, lods)
        with self.lock:
            if self.lod is None:
                from paddle_ipu.frontends.lod_runner import LodRunner

                self.lod = LodRunner(self.prefix, self.config.micro_batch_size, (), self.options)
        with quiet_info(self.quiet):
            return self.lod.run(feed, offsets, list(lods))

    def close(self) -> None:
        if self.lod is not None:
            self.lod.close()
        if self.runtime is not None:
            self.runtime.close()
        if self.shapes is not None:
            self.shapes.close()
        every = []
        for executor, buckets in self.compiled.values():
            every += [executor, *buckets.values()]
        for executor in {id(e): e for e in every}.values():
            executor.reset()


class Predictor:
    """Runs a saved inference model compiled for the IPU (see the module docstring)."""

    __module__ = "paddle_ipu.inference"  # its public home (what type() names)

    def __init__(self, config: Any, shared: _Shared | None = None) -> None:
        if not config.use_ipu():
            raise OptionError(
                "paddle_ipu.inference runs on the IPU: call config.enable_ipu(...) first "
                "(use paddle.inference for the CPU)"
            )
        self._config = config
        self._shared = shared or _Shared(config)
        inputs, outputs = self._shared.handles()
        self._inputs = {t.name: t for t in inputs}
        self._outputs = {t.name: t for t in outputs}

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
        lods = {n: h._lod[0] for n, h in self._inputs.items() if h._lod and inputs is None}
        if lods:  # sequences (set_lod): padded into buckets, run as batches
            outputs, out_lods = self._shared.run_lod(feed, lods)
        elif self._shared.sequence_ops:
            raise FeedError(
                f"the model's {', '.join(self._shared.sequence_ops)} read(s) the input rows "
                "as sequences: give the inputs' sequence offsets with set_lod([offsets]) on "
                "the input handles (and run() without a list of inputs)"
            )
        else:
            outputs, out_lods = self._shared.run(feed), []
        for k, (handle, value) in enumerate(zip(self._outputs.values(), outputs)):
            handle._value = np.asarray(value)
            handle._shape = list(handle._value.shape)
            handle._lod = out_lods[k] if out_lods else []
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
