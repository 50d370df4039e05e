"""Paddle 2.x's IPU names on stock Paddle 3.x.

Paddle 3.x still ships the names of its in-tree IPU support, but they raise
(``paddle.static.IpuStrategy()``: "re-compile with WITH_IPU=ON",
``paddle.IPUPlace()``: "use wrong place", ...) or answer False
(``paddle.is_compiled_with_ipu()``), and ``paddle.base.core.IpuBackend`` is gone.
:func:`install` (called by ``import paddle_ipu`` unless ``PADDLE_IPU_COMPAT=0``)
points those public names at paddle_ipu, so a script written for Paddle 2.x's IPU
API runs unchanged; :func:`disable` puts every replaced name back.

Only public names are replaced.  Paddle's own code asks ``core.is_compiled_with_ipu()``
and ``core.IPUPlace`` (left alone), so none of its internal IPU branches -- which
need the C++ IPU backend Paddle 3.x does not have -- turn on.

Replaced (module: names):

- ``paddle``, ``paddle.device``: ``is_compiled_with_ipu`` (True), ``IPUPlace``
  (the ``ipu`` custom place);
- ``paddle.base``, ``paddle.framework``: ``IPUPlace``;
- ``paddle.static``, ``paddle.base``: ``IpuStrategy``, ``IpuCompiledProgram``,
  ``ipu_shard_guard``, ``set_ipu_shard``; ``paddle.base.compiler``: ``IpuStrategy``,
  ``IpuCompiledProgram``;
- ``paddle.base.core`` (also reached as ``paddle.framework.core``): ``IpuBackend``
  (new), and ``IpuCompiledProgram._backend`` (:mod:`.ipu_backend`);
- ``paddle.static.amp``: ``cast_model_to_fp16`` / ``cast_parameters_to_fp16`` (they
  fail on PIR programs; a PIR program is marked to compile in float16);
- ``paddle.pir.Program`` / legacy ``Program``: ``lr_sheduler``, 2.x's spelling of
  ``lr_scheduler``;
- ``paddle.inference``: ``Config`` (Paddle's own, with ``enable_ipu``,
  ``set_ipu_config``, ``load_ipu_config`` working) and ``create_predictor`` (the IPU
  predictor of :mod:`paddle_ipu.inference` for a Config whose ``enable_ipu()`` was
  called, Paddle's for every other);
- ``paddle.pir.Value.name``: an intermediate value, which has no name in PIR (Paddle
  raises), gets one on first read, so 2.x's ``fetch_list=[out.name]`` works (see
  :mod:`paddle_ipu.compat.names`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from paddle_ipu._internals import paddle_api
from paddle_ipu.compat import names
from paddle_ipu.compat.ipu_backend import IpuBackend, program_backend
from paddle_ipu.errors import NotSupportedError
from paddle_ipu.frontends.program import FP16_ATTR, IpuCompiledProgram
from paddle_ipu.strategy import IpuStrategy

_MISSING = object()
_lock = threading.Lock()
# (module, attribute) -> the value it had before install() (or _MISSING)
_saved: dict[tuple[Any, str], Any] = {}


# ----------------------------------------------------------------------------------
# sharding in either IR
# ----------------------------------------------------------------------------------


def ipu_shard_guard(index: int = -1, stage: int = -1) -> Any:
    """``paddle.static.ipu_shard_guard`` for PIR programs (paddle_ipu.ipu_shard_guard)
    and legacy-IR ones (op attributes as Paddle 2.x set them)."""
    import paddle

    from paddle_ipu.compiler import sharding

    if paddle.framework.in_pir_mode():
        return sharding.ipu_shard_guard(index=index, stage=stage)
    from paddle_ipu.compiler.legacy_reader import legacy_shard_guard

    sharding._check(index, stage)
    return legacy_shard_guard(index=index, stage=stage)


def set_ipu_shard(call_func: Any, index: int = -1, stage: int = -1) -> Any:
    """``paddle.static.set_ipu_shard`` in either IR (see :func:`ipu_shard_guard`)."""
    import paddle

    from paddle_ipu.compiler import sharding

    if paddle.framework.in_pir_mode():
        return sharding.set_ipu_shard(call_func, index=index, stage=stage)
    if isinstance(call_func, paddle.nn.Layer):
        # Layer hooks that open the guard of the program being built, legacy or PIR.
        return sharding.set_ipu_shard(call_func, index=index, stage=stage, guard=ipu_shard_guard)
    sharding._check(index, stage)

    @functools.wraps(call_func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with ipu_shard_guard(index=index, stage=stage):
            return call_func(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------------
# places and flags
# ----------------------------------------------------------------------------------


def is_compiled_with_ipu() -> bool:
    """True: paddle_ipu provides the IPU (Paddle's own ``core.is_compiled_with_ipu``
    stays False, since Paddle's C++ IPU backend is not there)."""
    return True


def _is_ipu_place(obj: Any) -> bool:
    import paddle

    try:
        # Paddle 3.0's CustomPlace (what Executor.place is) has no is_custom_place()
        if isinstance(obj, paddle.CustomPlace):
            return bool(obj.get_device_type() == "ipu")
        return bool(obj.is_custom_place()) and obj.get_device_type() == "ipu"
    except Exception:
        return False


class _IpuPlaceMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return _is_ipu_place(obj)


class IPUPlace(metaclass=_IpuPlaceMeta):
    """``paddle.IPUPlace()``: the ``ipu`` custom place (``CustomPlace("ipu", 0)``);
    ``isinstance(place, paddle.IPUPlace)`` is true for ipu places."""

    def __new__(cls, device_id: int = 0) -> Any:
        import paddle

        return paddle.CustomPlace("ipu", int(device_id))


# ----------------------------------------------------------------------------------
# the 2.x fp16 flow
# ----------------------------------------------------------------------------------


def _is_pir(program: Any) -> bool:
    import paddle

    return isinstance(program, paddle.pir.Program)


def _custom_black_list(amp_lists: Any) -> list[str]:
    """The operators ``amp_lists`` (Paddle AMP's lists) adds to Paddle's default black
    list."""
    if amp_lists is None:
        return []
    import paddle

    default = set(paddle.static.amp.CustomOpLists().black_list)
    return sorted(set(getattr(amp_lists, "black_list", ())) - default)


def _amp_wrappers(original_model: Any, original_params: Any) -> tuple[Any, Any]:
    def cast_model_to_fp16(program: Any, amp_lists: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Paddle 2.x's way to run a program in float16 on the IPU.  Paddle's own
        function rewrites legacy programs only (it fails on PIR ones); a PIR program
        is marked instead and compiled as with ``set_precision_config(enable_fp16=True)``
        (the executor converts the graph and the weights).  Returns the names of the
        parameters that run in float16."""
        if not _is_pir(program):
            return original_model(program, amp_lists, *args, **kwargs)
        custom = _custom_black_list(amp_lists)
        if custom:
            import logging

            logging.getLogger("paddle_ipu").warning(
                "cast_model_to_fp16 on a PIR program: every operator computes in float16 "
                "on the IPU, the black list %s is not applied; to keep operators in "
                "float32 in inference, set IpuStrategy's fp16_black_list",
                custom,
            )
        setattr(program, FP16_ATTR, True)
        return [
            str(op.attrs()["parameter_name"])
            for op in program.global_block().ops
            if op.name() == "builtin.parameter" and "float32" in str(op.result(0).dtype)
        ]

    def cast_parameters_to_fp16(place: Any, program: Any, *args: Any, **kwargs: Any) -> Any:
        """For a PIR program the scope keeps float32 parameters (the device holds
        float16 copies; weights_to_host converts back); legacy programs go to Paddle."""
        if not _is_pir(program):
            return original_params(place, program, *args, **kwargs)
        return None

    cast_model_to_fp16.__wrapped__ = original_model  # type: ignore[attr-defined]
    cast_parameters_to_fp16.__wrapped__ = original_params  # type: ignore[attr-defined]
    return cast_model_to_fp16, cast_parameters_to_fp16


def _lr_sheduler(program: Any) -> Any:
    """Paddle 2.x's spelling of ``program.lr_scheduler`` (its IPU tests step
    ``program.lr_sheduler``); AttributeError, so hasattr() is False, without one."""
    try:
        return program.__dict__["lr_scheduler"]
    except (AttributeError, KeyError):
        pass
    scheduler = getattr(program, "lr_scheduler", None)
    if scheduler is None:
        raise AttributeError("lr_sheduler")
    return scheduler


# ----------------------------------------------------------------------------------
# paddle.inference: Config.enable_ipu
# ----------------------------------------------------------------------------------


def _inference_wrappers(paddle_config: Any, paddle_create: Any) -> tuple[Any, Any]:
    """``paddle.inference.Config`` and ``create_predictor`` with Paddle 2.x's IPU
    methods working: Paddle 3.x's raise ("did not have the option -DWITH_IPU").

    The Config is Paddle's own (every CPU setting behaves as in Paddle); its IPU
    methods record the settings on a :class:`paddle_ipu.inference.Config` instead;
    ``create_predictor`` of a Config whose ``enable_ipu()`` was called compiles the
    model for the IPU (:func:`paddle_ipu.inference.create_predictor`), and hands
    every other Config to Paddle."""
    from paddle_ipu import inference

    class Config(paddle_config):
        __doc__ = paddle_config.__doc__

        def _ipu_settings(self) -> Any:
            settings = self.__dict__.get("_paddle_ipu_config")
            if settings is None:
                settings = self.__dict__["_paddle_ipu_config"] = inference.Config()
            return settings

        def enable_ipu(
            self,
            ipu_device_num: int = 1,
            ipu_micro_batch_size: int = 1,
            ipu_enable_pipelining: bool = False,
            ipu_batches_per_step: int = 1,
        ) -> None:
            self._ipu_settings().enable_ipu(
                ipu_device_num, ipu_micro_batch_size, ipu_enable_pipelining, ipu_batches_per_step
            )

        def set_ipu_config(self, *args: Any, **kwargs: Any) -> None:
            self._ipu_settings().set_ipu_config(*args, **kwargs)

        def load_ipu_config(self, config_path: str) -> None:
            self._ipu_settings().load_ipu_config(config_path)

        # paddle-ipu's own IPU settings, on Paddle's Config too
        def set_ipu_sequence_buckets(self, *args: Any, **kwargs: Any) -> None:
            self._ipu_settings().set_ipu_sequence_buckets(*args, **kwargs)

        def set_ipu_input_shapes(self, shapes: Any) -> None:
            self._ipu_settings().set_ipu_input_shapes(shapes)

        def set_ipu_max_specialisations(self, count: int) -> None:
            self._ipu_settings().set_ipu_max_specialisations(count)

        def set_ipu_shape_ranges(self, ranges: dict[str, Any]) -> None:
            self._ipu_settings().set_ipu_shape_ranges(ranges)

        def set_ipu_shape_buckets(self, buckets: Any, pad_values: Any = None) -> None:
            self._ipu_settings().set_ipu_shape_buckets(buckets, pad_values)

        def set_ipu_specialisation_memory(self, megabytes: float) -> None:
            self._ipu_settings().set_ipu_specialisation_memory(megabytes)

        def set_ipu_strategy_options(self, options: dict[str, Any]) -> None:
            self._ipu_settings().set_ipu_strategy_options(options)

        def exp_disable_mixed_precision_ops(self, black_list: Any) -> None:
            super().exp_disable_mixed_precision_ops(black_list)
            self._ipu_settings().exp_disable_mixed_precision_ops(black_list)

        def set_ipu_custom_info(self, *args: Any, **kwargs: Any) -> None:
            self._ipu_settings().set_ipu_custom_info(*args, **kwargs)

        def use_ipu(self) -> bool:
            settings = self.__dict__.get("_paddle_ipu_config")
            return settings is not None and settings.use_ipu()

        def enable_custom_device(
            self, device_type: str, device_id: int = 0, precision: Any = None
        ) -> None:
            # Paddle 3's way to pick a custom device: the ipu one runs the compiled
            # graph (Paddle's own predictor would run its kernels one by one there).
            if device_type == "ipu":
                self._ipu_settings().enable_custom_device(device_type, device_id, precision)
                return
            if precision is None:
                super().enable_custom_device(device_type, device_id)
            else:
                super().enable_custom_device(device_type, device_id, precision)

        # Settings Paddle's Config keeps that the IPU predictor honours too.
        def set_cpu_math_library_num_threads(self, num_threads: int) -> None:
            super().set_cpu_math_library_num_threads(num_threads)
            self._ipu_settings().set_cpu_math_library_num_threads(num_threads)

        def disable_glog_info(self) -> None:
            super().disable_glog_info()
            self._ipu_settings().disable_glog_info()

    def create_predictor(config: Any) -> Any:
        if not (isinstance(config, Config) and config.use_ipu()):
            return paddle_create(config)
        settings = config._ipu_settings()
        if config.model_from_memory():
            raise NotSupportedError(
                "a model set with set_model_buffer: use paddle_ipu.inference.Config, whose "
                "set_model_buffer the IPU predictor reads"
            )
        if config.model_dir():
            settings.set_model(config.model_dir())
        else:
            settings.set_model(config.prog_file(), config.params_file() or None)
        return inference.create_predictor(settings)

    create_predictor.__doc__ = paddle_create.__doc__
    return Config, create_predictor


# ----------------------------------------------------------------------------------
# install / disable
# ----------------------------------------------------------------------------------


def _replace(module: Any, name: str, value: Any) -> None:
    key = (module, name)
    if key not in _saved:
        _saved[key] = getattr(module, name, _MISSING)
    setattr(module, name, value)


def installed() -> bool:
    return bool(_saved)


def install() -> None:
    """Point Paddle 2.x's IPU names at paddle_ipu (idempotent)."""
    import paddle
    import paddle.base
    import paddle.device
    import paddle.framework
    import paddle.static

    with _lock:
        if _saved:
            return
        for module in (paddle, paddle.device):
            _replace(module, "is_compiled_with_ipu", is_compiled_with_ipu)
        for module in (paddle, paddle.device, paddle.base, paddle.framework):
            if hasattr(module, "IPUPlace"):
                _replace(module, "IPUPlace", IPUPlace)
        import paddle.base.compiler

        for module in (paddle.static, paddle.base):
            _replace(module, "IpuStrategy", IpuStrategy)
            _replace(module, "IpuCompiledProgram", IpuCompiledProgram)
        # 2.x scripts also reach the classes through the module that defines them
        # (``from paddle.base import compiler; compiler.IpuCompiledProgram(...)``).
        for name, value in (
            ("IpuStrategy", IpuStrategy),
            ("IpuCompiledProgram", IpuCompiledProgram),
        ):
            if hasattr(paddle.base.compiler, name):
                _replace(paddle.base.compiler, name, value)
        for module in (paddle.static, paddle.base):
            _replace(module, "ipu_shard_guard", ipu_shard_guard)
            _replace(module, "set_ipu_shard", set_ipu_shard)
        _replace(paddle_api.paddle_core(), "IpuBackend", IpuBackend)
        _replace(IpuCompiledProgram, "_backend", property(program_backend))
        for program_type in (paddle.pir.Program, paddle_api.legacy_program_type()):
            if not hasattr(program_type, "lr_sheduler"):
                _replace(program_type, "lr_sheduler", property(_lr_sheduler))
        import paddle.static.amp as amp

        model_fn, params_fn = _amp_wrappers(amp.cast_model_to_fp16, amp.cast_parameters_to_fp16)
        _replace(amp, "cast_model_to_fp16", model_fn)
        _replace(amp, "cast_parameters_to_fp16", params_fn)
        import paddle.inference

        config, create = _inference_wrappers(
            paddle.inference.Config, paddle.inference.create_predictor
        )
        _replace(paddle.inference, "Config", config)
        _replace(paddle.inference, "create_predictor", create)
        names.install(_replace)


def disable() -> None:
    """Give every name :func:`install` replaced its own value back."""
    with _lock:
        for (module, name), value in reversed(list(_saved.items())):
            if value is _MISSING:
                if hasattr(module, name):
                    delattr(module, name)
            else:
                setattr(module, name, value)
        _saved.clear()
        names.uninstalled()
