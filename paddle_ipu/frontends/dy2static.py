"""Paddle 2.x's dy2static flow: ``IpuStrategy`` + ``paddle.jit.to_static``.

An ``IpuStrategy`` made in dynamic mode, or ``IpuStrategy.register_patch()``, makes
every ``paddle.jit.to_static`` Layer method (a ``@paddle.jit.to_static`` forward, or
``paddle.jit.to_static(layer)``) run as an :class:`~paddle_ipu.frontends.dygraph.IpuModel`
of that Layer: trained by ``set_optimizer``'s optimizer when ``is_training`` and the
Layer is in train mode, for inference otherwise.  ``IpuBackend.get_instance()
.weights_to_host()`` copies back the weights of the model that ran last;
``release_patch()`` copies back every patched model's weights, releases their devices
and gives ``paddle.jit.to_static`` functions their own behaviour again.

The switch is spelled on IpuStrategy, as in 2.x, but it is this front door's work:
IpuStrategy calls it through the interface it declares
(:class:`~paddle_ipu.strategy.Dy2StaticSwitch`), which :func:`install` plugs in (the
patch registry, :mod:`paddle_ipu.patches`, does at ``import paddle_ipu``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from paddle_ipu._internals import paddle_jit
from paddle_ipu.errors import OptionError
from paddle_ipu.frontends.dygraph import IpuModel
from paddle_ipu.strategy import current_dy2static_switch as _dy2static_switch
from paddle_ipu.strategy import set_dy2static_switch

log = logging.getLogger("paddle_ipu")


class _PatchState:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.strategy: Any = None
        self.original_call: Callable[..., Any] | None = None
        # Layer -> {(method name, strategy id, optimizer id, training): IpuModel}
        self.models: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], IpuModel]] = (
            weakref.WeakKeyDictionary()
        )


_patch = _PatchState()


def _patched_model(layer: Any, function: Any, strategy: Any) -> IpuModel:
    optimizer = strategy.optimizer
    training = bool(strategy.is_training)
    if training and optimizer is None:
        raise OptionError(
            "IpuStrategy is_training=True: call ipu_strategy.set_optimizer(optimizer) before "
            f"calling {type(layer).__name__} (or set_graph_config(is_training=False) for "
            "inference)"
        )
    name = getattr(paddle_jit.static_function_source(function), "__name__", "forward")
    key = (name, id(strategy), id(optimizer) if training else None, training)
    models = _patch.models.setdefault(layer, {})
    model = models.get(key)
    if model is None:
        for other in models.values():  # one device copy of a Layer's weights at a time
            other.detach()
        models.clear()
        model = IpuModel(
            layer,
            strategy,
            optimizer=optimizer if training else None,
            training=training,
            function=function,
        )
        models[key] = model
    return model


def _intercept(original: Callable[..., Any]) -> Callable[..., Any]:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        import paddle

        strategy = _patch.strategy
        if strategy is None or not paddle.in_dynamic_mode():
            return original(self, *args, **kwargs)
        layer = paddle_jit.static_function_layer(self)
        if not isinstance(layer, paddle.nn.Layer):
            return original(self, *args, **kwargs)
        with _patch.lock:
            model = _patched_model(layer, self, strategy)
        return model(*args, **kwargs)

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


def register_patch(strategy: Any) -> None:
    """Make ``paddle.jit.to_static`` Layer methods run on the IPU, as Paddle 2.x's
    IpuDynamicPatcher did (see the module docstring): the last strategy registered
    is the one used."""
    cls = paddle_jit.static_function_type()
    with _patch.lock:
        if _patch.original_call is None:
            _patch.original_call = cls.__dict__["__call__"]
            cls.__call__ = _intercept(_patch.original_call)
        if _patch.strategy is not strategy:
            log.info(
                "paddle.jit.to_static Layers now run on the IPU (Paddle 2.x's dy2static "
                "patch); IpuStrategy.release_patch() undoes it"
            )
        _patch.strategy = strategy


def release_patch() -> None:
    """Undo :func:`register_patch`: every patched model's weights (and optimizer
    state) go back to its Layer (and optimizer) and its device is released."""
    cls = paddle_jit.static_function_type()
    with _patch.lock:
        for models in list(_patch.models.values()):
            for model in models.values():
                model.detach()
        _patch.models.clear()
        _patch.strategy = None
        if _patch.original_call is not None:
            cls.__call__ = _patch.original_call
            _patch.original_call = None


def patch_registered() -> bool:
    """Whether the dy2static patch is on."""
    return _patch.strategy is not None


class _Switch:
    """The :class:`~paddle_ipu.strategy.Dy2StaticSwitch` IpuStrategy calls."""

    def created(self, strategy: Any) -> None:
        import paddle

        if paddle.in_dynamic_mode():  # as 2.x's IpuStrategy did
            register_patch(strategy)

    def register(self, strategy: Any) -> None:
        register_patch(strategy)

    def release(self) -> None:
        release_patch()


_SWITCH = _Switch()


def install() -> None:
    """Make IpuStrategy's ``register_patch`` / ``release_patch`` (and a strategy made in
    dynamic mode) reach this patch (see :func:`paddle_ipu.strategy.set_dy2static_switch`;
    idempotent)."""
    set_dy2static_switch(_SWITCH)


def uninstall() -> None:
    """Release the patch, and take it out of IpuStrategy."""
    release_patch()
    set_dy2static_switch(None)


def installed() -> bool:
    return _dy2static_switch() is _SWITCH
