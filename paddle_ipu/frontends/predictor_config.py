"""The predictor's Config: Paddle Inference's ``paddle.inference.Config`` for the IPU.

:class:`Config` holds every setting of the IPU predictor (its public home is
:mod:`paddle_ipu.inference`); ``paddle_config`` makes Paddle's own Config class
enable the IPU with the same methods, delegating each to a :class:`Config` (what
``import paddle_ipu`` puts in ``paddle.inference``: :mod:`paddle_ipu.compat`; that
class is made in :mod:`paddle_ipu.frontends.paddle_config`).  Each IPU method is
declared once, here, on :class:`Config`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from paddle.inference import Config as _PaddleConfig

from paddle_ipu.errors import NotSupportedError, OptionError
from paddle_ipu.executor.shapes import DEFAULT_SPECIALISATION_MEMORY_MB
from paddle_ipu.frontends.predictor import Predictor

__all__ = ["DECISIONS", "Config", "create_predictor"]


log = logging.getLogger("paddle_ipu")


def _int_option(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise OptionError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


class Config:
    """Where the saved model is and how to run it: ``Config(prefix)``,
    ``Config(model_dir)`` or ``Config(model_file, params_file)`` -- Paddle Inference's
    ``paddle.inference.Config``.

    Every public name of ``paddle.inference.Config`` is here, with one of three
    decisions (:data:`DECISIONS`, the table in docs/inference.md): it works; it is
    accepted, with one log line saying it has no effect on the IPU (a CPU or GPU tuning
    knob: the model runs as one compiled graph); or it raises
    :class:`~paddle_ipu.errors.NotSupportedError` naming what to use instead (another
    device, another precision).  ``enable_ipu()`` must be called before
    :func:`create_predictor`."""

    __module__ = "paddle_ipu.inference"  # its public home (what repr() names)

    Precision = _PaddleConfig.Precision
    Float32 = _PaddleConfig.Precision.Float32
    Half = _PaddleConfig.Precision.Half
    Int8 = _PaddleConfig.Precision.Int8
    Bfloat16 = _PaddleConfig.Precision.Bfloat16

    def __init__(self, model: Any = None, params: Any = None) -> None:
        self._prefix: str | None = None
        self._model_dir = ""
        self._prog_file = ""
        self._params_file = ""
        self._from_memory = False
        #: a model of the oldest format: (program file, combined parameters file or None)
        self._old_format: tuple[str, str | None] | None = None
        self._buffers: Any = None  # the temporary directory of set_model_buffer
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
        # Paddle Inference's settings a script reads back.  The thread count, when set,
        # is the host backend's (host_num_threads); unset, the host takes every core.
        self._threads = 1
        self.num_threads: int | None = None
        self._ir_optim = True
        self._feed_fetch_ops = True
        self._specify_input_names = False
        self._glog_disabled = False
        self._noted: set[str] = set()
        self.seq_buckets: list[int] = []
        #: input shapes compiled at create_predictor (a model with open dimensions)
        self.input_shapes: list[dict[str, list[int]]] = []
        #: IpuStrategy options of the predictor's executors (set_ipu_strategy_options)
        self.strategy_options: dict[str, Any] = {}
        #: the specialisations in memory at most (None: as many as the memory bound holds)
        self.max_specialisations: int | None = None
        #: the memory the specialisations hold at most, in MiB
        self.specialisation_memory_mb = DEFAULT_SPECIALISATION_MEMORY_MB
        #: grids of sizes open dimensions are padded up to (None: none; "auto": seeded)
        self.shape_buckets: Any = None
        #: bounds of the open dimensions (None: an inference.yml beside the model)
        self.shape_ranges: dict[str, list[list[int]]] | None = None
        self.pad_values: dict[str, float] = {}
        if model is not None:
            self.set_model(model, params)

    # -- the model ----------------------------------------------------------------
    def set_model(self, model: str | os.PathLike[str], params: Any = None) -> None:
        """``set_model(model_dir)`` or ``set_model(prog_file, params_file)``."""
        from paddle_ipu.serving import old_format

        path = str(model)
        self._from_memory = False
        self._old_format = None
        if old_format.is_old_format(path):  # __model__ and its parameters, Paddle 1.x/2.x
            given = str(params) if params is not None and str(params) != "" else None
            self._old_format = (path, given)
            self._prefix = None
            self._prog_file, self._params_file, self._model_dir = path, given or "", ""
            return
        if params is not None and str(params) != "":  # "": a model without parameters
            m, p = Path(path), Path(str(params))
            if m.with_suffix("") != p.with_suffix(""):
                raise NotSupportedError(
                    f"the model file {str(m)!r} and the parameters file {str(p)!r} must share "
                    f"their path prefix (as save_inference_model writes them)"
                )
            self._prefix = str(m.with_suffix(""))
            self._prog_file, self._params_file, self._model_dir = str(m), str(p), ""
        elif Path(path).is_dir() and old_format.find_model(path) is not None:
            self._old_format = (str(old_format.find_model(path)), None)
            self._prefix = None
            self._model_dir, self._prog_file, self._params_file = path, "", ""
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
            self._model_dir, self._prog_file, self._params_file = path, "", ""
        else:
            self._prefix = (
                str(Path(path).with_suffix("")) if path.endswith((".json", ".pdmodel")) else path
            )
            self._model_dir, self._prog_file, self._params_file = "", path, ""

    def set_prog_file(self, path: str) -> None:
        """The model file; its path prefix must be the parameters file's."""
        self.set_model(path, self._params_file or None)

    def set_params_file(self, path: str) -> None:
        """The parameters file, beside the model file set before."""
        if not self._prog_file:
            raise OptionError("set_params_file: call set_prog_file(model_file) first")
        self.set_model(self._prog_file, path)

    def prog_file(self) -> str:
        return self._prog_file

    def params_file(self) -> str:
        return self._params_file

    def model_dir(self) -> str:
        return self._model_dir

    def set_model_buffer(
        self, prog_buffer: Any, prog_size: int, params_buffer: Any, params_size: int
    ) -> None:
        """A model held in memory (the bytes of the model file and of the parameters
        file): written to a private temporary directory, which lives as long as the
        Config, and compiled from there."""
        import tempfile
        import weakref

        def as_bytes(buffer: Any, size: int, what: str) -> bytes:
            data = buffer.encode("latin-1") if isinstance(buffer, str) else bytes(buffer)
            if _is_int(size) and 0 <= size <= len(data):
                return data[: int(size)]
            raise OptionError(f"set_model_buffer: {what} size {size!r} for {len(data)} bytes")

        prog = as_bytes(prog_buffer, prog_size, "the model buffer's")
        params = as_bytes(params_buffer, params_size, "the parameters buffer's")
        self._buffers = tempfile.TemporaryDirectory(prefix="paddle_ipu_model_")
        weakref.finalize(self, self._buffers.cleanup)
        prefix = Path(self._buffers.name) / "model"
        # A PIR model file is JSON; a legacy one is a protobuf.
        suffix = ".json" if prog.lstrip()[:1] == b"{" else ".pdmodel"
        prefix.with_suffix(suffix).write_bytes(prog)
        prefix.with_suffix(".pdiparams").write_bytes(params)
        self._prefix = str(prefix)
        self._old_format = None
        self._from_memory = True
        self._model_dir, self._prog_file, self._params_file = "", "", ""

    def model_from_memory(self) -> bool:
        return self._from_memory

    def model_prefix(self) -> str | None:
        """The path prefix the model is compiled from (paddle_ipu's own).  A model of
        the oldest format (``__model__`` and its parameters) is saved again as a
        ``.pdmodel`` prefix the first time (:mod:`paddle_ipu.serving.old_format`)."""
        if self._prefix is None and self._old_format is not None:
            from paddle_ipu.serving.old_format import saved_prefix

            self._prefix = saved_prefix(*self._old_format)
        return self._prefix

    # -- the IPU ------------------------------------------------------------------
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
        from paddle_ipu.serving.saved_model import check_buckets

        self.seq_buckets, self.pad_values = check_buckets(buckets, pad_values)

    def set_ipu_input_shapes(self, shapes: Any) -> None:
        """The input shapes to compile at :func:`create_predictor`, for a model whose
        feeds leave dimensions open besides the batch (an image model's height and
        width): one dict of feed name -> shape per graph (a single dict is one graph;
        the batch may be -1).  Shapes a run brings later are compiled then, each once;
        these are compiled ahead (``paddle-ipu compile --input-shapes`` does the same
        for a package)."""
        items = [shapes] if isinstance(shapes, dict) else list(shapes)
        parsed = []
        for item in items:
            if not isinstance(item, dict) or not item:
                raise OptionError(
                    f"set_ipu_input_shapes: expected dicts of feed name -> shape, got {item!r}"
                )
            entry = {}
            for name, shape in item.items():
                if not isinstance(shape, (list, tuple)) or not all(_is_int(d) for d in shape):
                    raise OptionError(
                        f"set_ipu_input_shapes: the shape of {name!r} must be a list of ints, "
                        f"got {shape!r}"
                    )
                entry[str(name)] = [int(d) for d in shape]
            parsed.append(entry)
        self.input_shapes = parsed

    def set_ipu_strategy_options(self, options: dict[str, Any]) -> None:
        """IpuStrategy options for the executors the predictor runs (``set_options``'s
        names, see docs/strategy.md), beyond what Paddle Inference's IPU methods set:
        ``host_fp16_arithmetic`` (``"float16"``, the IPU's, by default; ``"float32"``
        keeps only weights and constants in float16), ``host_num_threads``,
        ``random_seed`` ...  Checked now: an unknown option or value raises here."""
        from paddle_ipu.strategy import IpuStrategy

        if not isinstance(options, dict):
            raise OptionError(f"set_ipu_strategy_options: expected a dict, got {options!r}")
        IpuStrategy.unpatched().set_options(dict(options))  # the check
        self.strategy_options = {**self.strategy_options, **options}

    def exp_disable_mixed_precision_ops(self, black_list: Any) -> None:
        """With ``set_ipu_config(ipu_enable_fp16=True)``: the Paddle operators that
        compute in float32 (Paddle Inference's name for its mixed-precision black list;
        the strategy option ``fp16_black_list``).  ``black_list``: operator names,
        ``"softmax"``, ``"pd_op.softmax"`` or a legacy type (``"elementwise_add"``);
        replaces the list of an earlier call, as Paddle's does."""
        from paddle_ipu.options.precision import op_keys

        if isinstance(black_list, (str, bytes)) or not hasattr(black_list, "__iter__"):
            raise OptionError(
                "exp_disable_mixed_precision_ops: expected a set of operator names, got "
                f"{black_list!r}"
            )
        self.strategy_options = {
            **self.strategy_options,
            "fp16_black_list": op_keys("exp_disable_mixed_precision_ops", black_list),
        }

    def set_ipu_shape_ranges(self, ranges: dict[str, Any]) -> None:
        """Bounds of the inputs' open dimensions: input name -> ``[min, max]`` or
        ``[min, opt, max]`` shapes (the form of ``set_trt_dynamic_shape_info`` and of a
        PaddleX export's ``trt_dynamic_shapes``).  A run whose input falls outside them
        raises a FeedError naming the input before anything compiles; the batch is not
        bounded (rows run in micro-batches).  Unset, the ranges of an ``inference.yml``
        beside the model are used when it has them; ``{}`` turns bounds off."""
        if not isinstance(ranges, dict) or not all(
            isinstance(v, (list, tuple))
            and len(v) in (2, 3)
            and all(isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s) for s in v)
            for v in ranges.values()
        ):
            raise OptionError(
                "set_ipu_shape_ranges: expected input name -> [min, max] or [min, opt, max] "
                f"shapes (lists of ints), got {ranges!r}"
            )
        self.shape_ranges = {str(k): [list(s) for s in v] for k, v in ranges.items()}

    def set_ipu_max_specialisations(self, count: int) -> None:
        """How many input shapes the model keeps compiled in memory at once (default:
        as many as :meth:`set_ipu_specialisation_memory` holds); beyond it the least
        recently used leaves memory and a run of its shape makes it again.  No run is
        refused for its shape."""
        self.max_specialisations = _int_option("max_specialisations", count)

    def set_ipu_specialisation_memory(self, megabytes: float) -> None:
        """The memory the model's input shapes hold at once, in MiB (default
        :data:`~paddle_ipu.executor.shapes.DEFAULT_SPECIALISATION_MEMORY_MB`); beyond
        it the least recently used shape leaves memory."""
        if (
            isinstance(megabytes, bool)
            or not isinstance(megabytes, (int, float))
            or not megabytes > 0
        ):
            raise OptionError(f"set_ipu_specialisation_memory: expected MiB > 0, got {megabytes!r}")
        self.specialisation_memory_mb = float(megabytes)

    def set_ipu_shape_buckets(
        self, buckets: Any, pad_values: dict[str, float] | None = None
    ) -> None:
        """Pad the open dimensions of a model compiled per input shape (an image's
        height and width) up to grids of sizes: ``{"x": {2: [736, 1024, 1536], 3: [...]}}``
        (per input, per axis: sizes, or ``{"min": a, "max": b, "step": s}``), or
        ``"auto"`` (seeded from :meth:`set_ipu_input_shapes` and the shape ranges of an
        ``inference.yml``).  A run is padded up to the smallest bucket that holds it,
        with ``pad_values`` (input -> a value, 0 by default, or ``"edge"``: the edge
        repeated) and its outputs are cut back
        to what the model gives at its own size; a size past a grid is its own
        specialisation.  None: no buckets."""
        from paddle_ipu.executor.shapes import ShapeBuckets, check_pad_values

        if buckets is not None and buckets != "auto":
            ShapeBuckets.parse(buckets, pad_values)  # the check
        pads = check_pad_values(pad_values)
        self.shape_buckets = buckets
        if pad_values is not None:
            self.pad_values = pads  # type: ignore[assignment]

    def use_ipu(self) -> bool:
        return self._ipu

    def enable_custom_device(
        self, device_type: str, device_id: int = 0, precision: Any = None
    ) -> None:
        """Paddle 3's way to pick a custom device: ``enable_custom_device("ipu")`` is
        :meth:`enable_ipu` (``precision=Config.Precision.Half`` also turns on float16);
        ``precision=Config.Precision.Bfloat16`` is :meth:`enable_onednn_bfloat16`; any
        other device is refused, as this predictor runs on the IPU only."""
        if device_type != "ipu":
            raise NotSupportedError(
                f"Config.enable_custom_device({device_type!r}): {_OTHER_DEVICE}"
            )
        _int_option("device_id", device_id, low=0)
        half = _PaddleConfig.Precision.Half
        bf16 = _PaddleConfig.Precision.Bfloat16
        if precision not in (None, _PaddleConfig.Precision.Float32, half, bf16):
            raise NotSupportedError(
                f"Config.enable_custom_device: precision {precision}: {_LOW_PRECISION}"
            )
        self.enable_ipu()
        if precision == half:
            self.enable_fp16 = True
        elif precision == _PaddleConfig.Precision.Bfloat16:
            self.enable_onednn_bfloat16()

    def load_ipu_config(self, config_path: str) -> None:
        """Read IPU settings from a file of ``key,value`` lines, as Paddle Inference
        does: ``ipu_device_num``, ``ipu_micro_batch_size``, ``ipu_enable_pipelining``,
        ``ipu_batches_per_step``, ``ipu_enable_fp16``, ``ipu_replica_num``,
        ``ipu_available_memory_proportion``, ``ipu_enable_half_partial``,
        ``ipu_enable_model_runtime_executor`` (booleans ``true``/``1``); the custom-op
        keys are refused as set_ipu_custom_info is."""
        try:
            lines = Path(config_path).read_text().splitlines()
        except OSError as exc:
            raise OptionError(f"load_ipu_config: cannot read {config_path!r}: {exc}") from None
        enable: dict[str, Any] = {
            "ipu_device_num": self.device_num,
            "ipu_micro_batch_size": self.micro_batch_size,
            "ipu_enable_pipelining": self.enable_pipelining,
            "ipu_batches_per_step": self.batches_per_step,
        }
        settings: dict[str, Any] = {
            "ipu_enable_fp16": self.enable_fp16,
            "ipu_replica_num": self.replica_num,
            "ipu_available_memory_proportion": self.available_memory_proportion,
            "ipu_enable_half_partial": self.enable_half_partial,
            "ipu_enable_model_runtime_executor": self.enable_model_runtime_executor,
        }
        for number, raw in enumerate(lines, 1):
            line = raw.replace(" ", "")
            if not line:
                continue
            key, _, value = line.partition(",")
            if key in ("ipu_custom_ops_info", "ipu_custom_patterns"):
                self.set_ipu_custom_info()
            target = enable if key in enable else settings if key in settings else None
            if target is None:
                raise OptionError(
                    f"load_ipu_config: {config_path!r} line {number}: unknown key {key!r} "
                    f"(expected one of {sorted([*enable, *settings])})"
                )
            current = target[key]
            try:
                if isinstance(current, bool):
                    target[key] = value.lower() in ("true", "1")
                elif isinstance(current, int):
                    target[key] = int(value)
                else:
                    target[key] = float(value)
            except ValueError:
                raise OptionError(
                    f"load_ipu_config: {config_path!r} line {number}: {key} takes a "
                    f"{type(current).__name__}, received {value!r}"
                ) from None
        self.enable_ipu(**enable)
        self.set_ipu_config(**settings)

    def set_ipu_custom_info(self, *args: Any, **kwargs: Any) -> None:
        raise NotSupportedError(
            "set_ipu_custom_info (custom ops) is not supported by the predictor: use "
            "IpuStrategy.add_custom_op with IpuCompiledProgram"
        )

    def enable_onednn_bfloat16(self) -> None:
        """Paddle Inference's CPU bfloat16: on the host backend (the emulated IPU), the
        model's matmuls and convolutions run in bfloat16 on OpenVINO, for CPU serving
        (the strategy option ``host_precision="bfloat16"``; the ``openvino`` extra and a
        CPU with AVX512-BF16 or AMX, else :func:`create_predictor` refuses it naming
        what is missing).  Not the IPU's arithmetic: the IPU computes float16
        (``set_ipu_config(ipu_enable_fp16=True)``); the two are not combined."""
        self.strategy_options = {**self.strategy_options, "host_precision": "bfloat16"}

    enable_mkldnn_bfloat16 = enable_onednn_bfloat16

    def disable_compile_cache(self) -> None:
        """Compile every time instead of using paddle-ipu's compile cache."""
        self.use_compile_cache = False

    # -- Paddle Inference's settings a script reads back ---------------------------
    def set_cpu_math_library_num_threads(self, num_threads: int) -> None:
        if not _is_int(num_threads) or num_threads < 1:
            raise OptionError(
                f"set_cpu_math_library_num_threads: expected an int >= 1, received {num_threads!r}"
            )
        self._threads = int(num_threads)
        self.num_threads = int(num_threads)

    def cpu_math_library_num_threads(self) -> int:
        return self._threads

    def switch_ir_optim(self, x: bool = True) -> None:
        self._note("switch_ir_optim", _NO_EFFECT_PASSES)
        self._ir_optim = bool(x)

    def ir_optim(self) -> bool:
        return self._ir_optim

    def switch_use_feed_fetch_ops(self, x: bool = True) -> None:
        self._note("switch_use_feed_fetch_ops", _NO_EFFECT_HANDLES)
        self._feed_fetch_ops = bool(x)

    def use_feed_fetch_ops_enabled(self) -> bool:
        return self._feed_fetch_ops

    def switch_specify_input_names(self, x: bool = True) -> None:
        self._note("switch_specify_input_names", _NO_EFFECT_HANDLES)
        self._specify_input_names = bool(x)

    def specify_input_name(self) -> bool:
        return self._specify_input_names

    def disable_glog_info(self) -> None:
        """Paddle Inference's switch for its INFO lines: the predictor's own (the notes of
        calls with no effect, the compile's progress) are left out too."""
        self._glog_disabled = True

    def glog_info_disabled(self) -> bool:
        return self._glog_disabled

    def summary(self) -> str:
        return (
            f"model {self._prefix}; ipu {self._ipu}: micro_batch_size {self.micro_batch_size}, "
            f"batches_per_step {self.batches_per_step}, fp16 {self.enable_fp16}, host precision "
            f"{self.strategy_options.get('host_precision', 'float32')}, model runtime "
            f"{self.enable_model_runtime_executor}"
        )

    def pass_builder(self) -> _PassBuilder:
        """A pass builder whose edits (``delete_pass``, ``append_pass``, ...) are
        accepted with a log line and change nothing: the IPU compiler runs its own
        passes."""
        self._note("pass_builder", _NO_EFFECT_PASSES)
        return _PassBuilder(self)

    def _note(self, name: str, why: str) -> None:
        """One log line (per Config and name) saying the call has no effect, unless the
        script turned Paddle's INFO lines off (:meth:`disable_glog_info`)."""
        if name in self._noted or self._glog_disabled:
            return
        self._noted.add(name)
        log.info("paddle_ipu.inference.Config.%s: accepted, no effect on the IPU (%s)", name, why)


class _PassBuilder:
    """What ``Config.pass_builder()`` returns: Paddle Inference's pass list is not what
    compiles the IPU graph, so edits are accepted (one log line each) and the list is
    empty."""

    def __init__(self, config: Config) -> None:
        self._config = config

    def _edit(self, name: str) -> None:
        self._config._note(f"pass_builder().{name}", _NO_EFFECT_PASSES)

    def delete_pass(self, *args: Any) -> None:
        self._edit("delete_pass")

    def append_pass(self, *args: Any) -> None:
        self._edit("append_pass")

    def insert_pass(self, *args: Any) -> None:
        self._edit("insert_pass")

    def turn_on_debug(self) -> None:
        self._edit("turn_on_debug")

    def all_passes(self) -> list[str]:
        return []

    def analysis_passes(self) -> list[str]:
        return []

    def debug_string(self) -> str:
        return ""


_NO_EFFECT_CPU = "the model runs as one compiled graph, not on Paddle's CPU kernels"
_NO_EFFECT_PASSES = "the IPU compiler runs its own passes over the whole graph"
_NO_EFFECT_HANDLES = "the predictor always works with input and output handles"
_NO_EFFECT_GPU = "there is no GPU in an IPU predictor"
_NO_EFFECT_MEMORY = "the compiled graph plans its own memory"
_NO_EFFECT_EXPERIMENT = "a Paddle Inference experiment the IPU graph does not go through"

#: Accepted, one log line: name -> why it has no effect on the IPU.
NO_EFFECT: dict[str, str] = {
    "enable_memory_optim": _NO_EFFECT_MEMORY,
    "disable_gpu": _NO_EFFECT_GPU,
    "enable_mkldnn": _NO_EFFECT_CPU,
    "disable_mkldnn": _NO_EFFECT_CPU,
    "enable_onednn": _NO_EFFECT_CPU,
    "disable_onednn": _NO_EFFECT_CPU,
    "disable_mkldnn_fc_passes": _NO_EFFECT_CPU,
    "disable_onednn_fc_passes": _NO_EFFECT_CPU,
    "set_mkldnn_cache_capacity": _NO_EFFECT_CPU,
    "set_onednn_cache_capacity": _NO_EFFECT_CPU,
    "set_mkldnn_op": _NO_EFFECT_CPU,
    "set_onednn_op": _NO_EFFECT_CPU,
    "disable_onnxruntime": "ONNX Runtime is not one of its engines here",
    "enable_new_executor": "the graph runs on the IPU executor, not Paddle's",
    "enable_new_ir": "the model is always read as PIR",
    "switch_ir_debug": _NO_EFFECT_PASSES,
    "delete_pass": _NO_EFFECT_PASSES,
    "enable_custom_passes": _NO_EFFECT_PASSES,
    "set_optimization_level": _NO_EFFECT_PASSES,
    "use_optimized_model": _NO_EFFECT_PASSES,
    "enable_save_optim_model": "the compile cache keeps the compiled graph (PADDLE_IPU_CACHE_DIR)",
    "set_optim_cache_dir": "the compile cache is PADDLE_IPU_CACHE_DIR",
    "enable_profile": "Paddle Inference's profiler does not see the IPU graph",
    "exp_enable_use_cutlass": _NO_EFFECT_GPU,
    "exp_sparse_conv_using_buffer": _NO_EFFECT_EXPERIMENT,
    "enable_ort_optimization": "ONNX Runtime is not one of its engines here",
}

_OTHER_DEVICE = "the IPU predictor runs on the IPU; use paddle.inference for other devices"
_TENSORRT = "TensorRT is a GPU engine; the IPU predictor compiles the whole graph for the IPU"
_LOW_PRECISION = (
    "the IPU predictor computes in float32, in float16 (set_ipu_config(ipu_enable_fp16=True)) "
    "or, on the host backend, with matmuls and convolutions in bfloat16 "
    "(enable_onednn_bfloat16())"
)

#: Raise NotSupportedError: name -> why, and what to use instead.
REFUSED: dict[str, str] = {
    "enable_use_gpu": _OTHER_DEVICE,
    "enable_xpu": _OTHER_DEVICE,
    "set_xpu_config": _OTHER_DEVICE,
    "set_xpu_device_id": _OTHER_DEVICE,
    "xpu_config": _OTHER_DEVICE,
    "enable_openvino_engine": _OTHER_DEVICE,
    "enable_onnxruntime": _OTHER_DEVICE,
    "enable_cinn": "CINN compiles for CPU and GPU; the IPU graph is compiled by paddle_ipu",
    "enable_tensorrt_engine": _TENSORRT,
    "enable_tensorrt_dla": _TENSORRT,
    "enable_tensorrt_memory_optim": _TENSORRT,
    "enable_tensorrt_varseqlen": _TENSORRT,
    "enable_tensorrt_explicit_quantization": _TENSORRT,
    "enable_tensorrt_inspector": _TENSORRT,
    "enable_tuned_tensorrt_dynamic_shape": _TENSORRT,
    "set_trt_dynamic_shape_info": _TENSORRT,
    "set_tensorrt_optimization_level": _TENSORRT,
    "mark_trt_engine_outputs": _TENSORRT,
    "exp_disable_tensorrt_ops": _TENSORRT,
    "exp_disable_tensorrt_subgraph": _TENSORRT,
    "exp_disable_tensorrt_dynamic_shape_ops": _TENSORRT,
    "exp_specify_tensorrt_subgraph_precision": _TENSORRT,
    "collect_shape_range_info": _TENSORRT,
    "enable_mkldnn_int8": _LOW_PRECISION,
    "enable_onednn_int8": _LOW_PRECISION,
    "set_bfloat16_op": _LOW_PRECISION,
    "exp_enable_mixed_precision_ops": _LOW_PRECISION,
    "enable_low_precision_io": (
        "inputs and outputs are float32 (the graph converts them when it runs in float16)"
    ),
    "to_native_config": "NativeConfig is Paddle Inference's own predictor's; it has no IPU",
}

# Setters accepted with a log line whose value a script can read back (the reader works).
_READ_BACK = frozenset(
    {
        "switch_ir_optim",
        "switch_use_feed_fetch_ops",
        "switch_specify_input_names",
    }
)

#: Readers that answer the truth about the IPU predictor: name -> the answer.
FIXED_ANSWERS: dict[str, Any] = {
    "use_gpu": False,
    "use_xpu": False,
    "gpu_device_id": 0,
    "xpu_device_id": 0,
    "memory_pool_init_size_mb": 0,
    "fraction_of_gpu_memory_for_pool": 0.0,
    "mkldnn_enabled": False,
    "onednn_enabled": False,
    "mkldnn_int8_enabled": False,
    "onednn_int8_enabled": False,
    "onnxruntime_enabled": False,
    "openvino_engine_enabled": False,
    "tensorrt_engine_enabled": False,
    "tensorrt_dla_enabled": False,
    "tensorrt_dynamic_shape_enabled": False,
    "tensorrt_explicit_quantization_enabled": False,
    "tensorrt_inspector_enabled": False,
    "tensorrt_varseqlen_enabled": False,
    "tuned_tensorrt_dynamic_shape": False,
    "trt_allow_build_at_runtime": False,
    "tensorrt_optimization_level": 0,
    "tensorrt_precision_mode": _PaddleConfig.Precision.Float32,
    "shape_range_info_collected": False,
    "shape_range_info_path": "",
    "new_ir_enabled": True,
}


def _no_effect_method(name: str, why: str) -> Any:
    def method(self: Config, *args: Any, **kwargs: Any) -> None:
        self._note(name, why)

    method.__name__ = name
    method.__doc__ = f"Accepted; no effect on the IPU: {why}."
    return method


def _refused_method(name: str, why: str) -> Any:
    def method(self: Config, *args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError(f"Config.{name}: {why}")

    method.__name__ = name
    method.__doc__ = f"Refused (NotSupportedError): {why}."
    return method


def _fixed_method(name: str, answer: Any) -> Any:
    def method(self: Config) -> Any:
        return answer

    method.__name__ = name
    method.__doc__ = f"{answer!r} for the IPU predictor."
    return method


for _name, _why in NO_EFFECT.items():
    setattr(Config, _name, _no_effect_method(_name, _why))
for _name, _why in REFUSED.items():
    setattr(Config, _name, _refused_method(_name, _why))
for _name, _answer in FIXED_ANSWERS.items():
    setattr(Config, _name, _fixed_method(_name, _answer))

#: Every public name of ``paddle.inference.Config``, with its decision here:
#: "works", "no effect" (accepted, one log line) or "refused" (NotSupportedError).
DECISIONS: dict[str, str] = {
    name: (
        "refused"
        if name in REFUSED or name == "set_ipu_custom_info"
        else "no effect"
        if name in NO_EFFECT or name in _READ_BACK or name == "pass_builder"
        else "works"
    )
    for name in dir(_PaddleConfig)
    if not name.startswith("_")
}


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def create_predictor(config: Config) -> Predictor:
    """Compile the Config's model for the IPU and return a :class:`Predictor`."""
    return Predictor(config)
