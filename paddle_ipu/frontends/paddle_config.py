"""Paddle's own ``paddle.inference.Config`` made to enable the IPU.

:func:`paddle_config` derives a class from Paddle's Config whose IPU methods
(:data:`IPU_METHODS`, declared once on :class:`paddle_ipu.frontends.predictor_config.Config`)
record the settings on a predictor Config it keeps, and whose shared settings
(:data:`SHARED_METHODS`) reach both; ``import paddle_ipu`` puts it in
``paddle.inference`` (:mod:`paddle_ipu.compat`).
"""

from __future__ import annotations

import functools
from typing import Any

from paddle_ipu.errors import NotSupportedError
from paddle_ipu.frontends.legacy_predictor import LegacyPredictor
from paddle_ipu.frontends.predictor_config import Config, create_predictor

__all__ = ["legacy_create", "paddle_config"]


#: The IPU methods of :class:`Config` that Paddle's own Config gets (:func:`paddle_config`),
#: each delegated to the :class:`Config` it keeps: declared once, on :class:`Config`.
IPU_METHODS = (
    "enable_ipu",
    "set_ipu_config",
    "load_ipu_config",
    "set_ipu_sequence_buckets",
    "set_ipu_input_shapes",
    "set_ipu_max_specialisations",
    "set_ipu_shape_ranges",
    "set_ipu_shape_buckets",
    "set_ipu_specialisation_memory",
    "set_ipu_strategy_options",
    "set_ipu_custom_info",
)
#: Settings Paddle's Config keeps that the IPU predictor honours too: both are told.
SHARED_METHODS = (
    "exp_disable_mixed_precision_ops",
    "set_cpu_math_library_num_threads",
    "disable_glog_info",
    "enable_onednn_bfloat16",
    "enable_mkldnn_bfloat16",
)


def _ipu_method(name: str) -> Any:
    ours = getattr(Config, name)

    @functools.wraps(ours)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._ipu_settings(), name)(*args, **kwargs)

    return method


def _shared_method(name: str, paddles: Any) -> Any:
    @functools.wraps(paddles)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        paddles(self, *args, **kwargs)
        getattr(self._ipu_settings(), name)(*args, **kwargs)

    return method


def paddle_config(paddle_config_type: Any, paddle_create: Any) -> tuple[Any, Any]:
    """``paddle.inference.Config`` and ``create_predictor`` with Paddle 2.x's IPU methods
    working (Paddle 3.x's raise "did not have the option -DWITH_IPU").

    The Config is Paddle's own (every CPU setting behaves as in Paddle); its IPU methods
    (:data:`IPU_METHODS`) record the settings on a :class:`Config` instead;
    ``create_predictor`` of a Config whose ``enable_ipu()`` was called compiles the
    model for the IPU (:func:`create_predictor`), and hands every other Config to
    Paddle."""

    def _ipu_settings(self: Any) -> Config:
        settings = self.__dict__.get("_paddle_ipu_config")
        if settings is None:
            settings = self.__dict__["_paddle_ipu_config"] = Config()
        return settings

    def use_ipu(self: Any) -> bool:
        settings = self.__dict__.get("_paddle_ipu_config")
        return settings is not None and settings.use_ipu()

    def enable_custom_device(
        self: Any, device_type: str, device_id: int = 0, precision: Any = None
    ) -> None:
        # Paddle 3's way to pick a custom device: the ipu one runs the compiled graph
        # (Paddle's own predictor would run its kernels one by one there).
        if device_type == "ipu":
            self._ipu_settings().enable_custom_device(device_type, device_id, precision)
        elif precision is None:
            paddle_config_type.enable_custom_device(self, device_type, device_id)
        else:
            paddle_config_type.enable_custom_device(self, device_type, device_id, precision)

    members: dict[str, Any] = {
        "__doc__": paddle_config_type.__doc__,
        "_ipu_settings": _ipu_settings,
        "use_ipu": use_ipu,
        "enable_custom_device": enable_custom_device,
    }
    members.update({name: _ipu_method(name) for name in IPU_METHODS})
    members.update(
        {name: _shared_method(name, getattr(paddle_config_type, name)) for name in SHARED_METHODS}
    )
    paddles_config = type("Config", (paddle_config_type,), members)

    def create(given: Any) -> Any:
        config: Any = given
        if not (isinstance(given, paddles_config) and config.use_ipu()):
            return paddle_create(given)
        return _ipu_predictor(config)

    create.__doc__ = paddle_create.__doc__
    create.__name__ = "create_predictor"
    return paddles_config, create


def _ipu_predictor(config: Any) -> Any:
    """The IPU predictor of a Paddle Config whose ``enable_ipu()`` was called."""
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
    return create_predictor(settings)


def legacy_create(config_type: Any, paddle_create: Any) -> Any:
    """``paddle.base.core.create_paddle_predictor`` (Paddle 1.x/2.x's
    ``paddle.fluid.core``): for a Config (``AnalysisConfig``, made by
    :func:`paddle_config`) whose ``enable_ipu()`` was called, the IPU predictor's
    ``run([PaddleTensor])`` form (:class:`~paddle_ipu.frontends.legacy_predictor.LegacyPredictor`);
    every other Config goes to Paddle."""

    def create_paddle_predictor(config: Any) -> Any:
        if not (isinstance(config, config_type) and config.use_ipu()):
            return paddle_create(config)
        return LegacyPredictor(_ipu_predictor(config))

    create_paddle_predictor.__doc__ = paddle_create.__doc__
    return create_paddle_predictor
