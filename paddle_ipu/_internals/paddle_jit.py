"""PaddlePaddle's private interfaces for dygraph Layers on the IPU (checked on 3.3.1).

Paddle 2.x's dy2static patch intercepts what ``paddle.jit.to_static`` makes of a Layer
method (``StaticFunction``: its ``__call__``, the Layer it is bound to, the function it
converts), and a Layer's loss is searched among the values a gradient reaches (whether a
PIR operator has a backward rule: ``core.has_vjp``).  None of these has a public API;
each is wrapped here, with its probe, beside :mod:`paddle_ipu._internals.paddle_api`.
"""

from __future__ import annotations

from typing import Any

from paddle_ipu._internals import interface
from paddle_ipu._internals.paddle_api import _DEP, CHECKED_ON, _missing, probe_mode

__all__ = [
    "CHECKED_ON",
    "op_has_gradient",
    "static_function_layer",
    "static_function_source",
    "static_function_type",
]


def static_function_type() -> Any:
    """The class of what ``paddle.jit.to_static`` makes of a function or Layer method
    (``paddle.jit.dy2static.program_translator.StaticFunction``); Paddle 2.x's
    dy2static patch on the IPU intercepts its ``__call__``."""
    try:
        from paddle.jit.dy2static.program_translator import StaticFunction
    except ImportError as exc:
        raise _missing("paddle.jit.dy2static.program_translator.StaticFunction", exc) from None
    return StaticFunction


def static_function_layer(function: Any) -> Any:
    """The Layer a ``StaticFunction`` is bound to (``StaticFunction._class_instance``,
    a weak reference), or None for a plain function or a Layer that is gone."""
    ref = getattr(function, "_class_instance", None)
    if ref is None:
        return None
    return ref()


def static_function_source(function: Any) -> Any:
    """The function a ``StaticFunction`` converts (``StaticFunction.dygraph_function``:
    bound to its Layer for a method)."""
    return function.dygraph_function


def op_has_gradient(op: Any) -> bool:
    """Whether a PIR operator has a backward rule (``paddle.base.core.has_vjp``): the
    loss of a dygraph Layer is searched among values a gradient reaches."""
    import paddle

    try:
        has_vjp = paddle.base.core.has_vjp
    except AttributeError as exc:
        raise _missing("paddle.base.core.has_vjp", exc) from None
    return bool(has_vjp(op))


# -- probes ---------------------------------------------------------------------------------


@interface(
    _DEP,
    "StaticFunction.__call__, _class_instance, dygraph_function; core.has_vjp",
    "Paddle 2.x dy2static on the IPU, finding a Layer's loss",
)
def _probe_dy2static() -> str:
    import paddle

    cls = static_function_type()
    assert callable(cls.__dict__.get("__call__")), "StaticFunction.__call__ moved"

    class Probe(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(2, 2)

        @paddle.jit.to_static(full_graph=True)
        def forward(self, x: Any) -> Any:
            return self.fc(x)

    with probe_mode(static=False):
        layer = Probe()
        bound = layer.forward
        assert isinstance(bound, cls), type(bound)
        assert static_function_layer(bound) is layer
        source = static_function_source(bound)
        assert not isinstance(source, cls) and source.__self__ is layer
        spec = paddle.static.InputSpec([1, 2], "float32", "x")
        concrete, _ = paddle.jit.to_static(source, full_graph=True).get_concrete_program(spec)
        ops = {op.name(): op for op in concrete.main_program.global_block().ops}
    assert op_has_gradient(ops["pd_op.matmul"]) and not op_has_gradient(ops["pd_op.data"])
    return "a decorated forward is a StaticFunction bound to its Layer; has_vjp answers"
