"""``op._set_attr(name, value)`` on PIR operations, as on Paddle 2.x's ``Operator``.

Paddle 2.x's IPU scripts set IPU hints on the operator they just built
(``out.block.ops[-1]._set_attr("__available_memory", 0.28)`` on a matmul,
``_set_attr("serialize_factor", 5)``); a ``pir.Operation`` has no ``_set_attr``.
:func:`install` (part of :func:`paddle_ipu.compat.install`, undone by
:func:`paddle_ipu.compat.disable`) gives it one:

- the IPU hints are checked here and recorded as attributes of the operation
  (``__available_memory`` in [0, 1], held as its text since PIR operations take no
  float attribute from Python; ``serialize_factor`` an int >= 1; ``serialize_mode``
  one of PopART's modes); the compiler carries them to the ONNX nodes PopART reads
  (``__available_memory``, ``__serialize_matmul_*``), and the host's memory report
  reads them there;
- any other attribute is set by its Python type (bool, int, str, a list of ints or of
  strs), as Paddle's own ``set_*_attr`` methods take it; a float, which they cannot
  hold, is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paddle_ipu.compiler.pir_values import (
    AVAILABLE_MEMORY_ATTR,
    SERIALIZE_FACTOR_ATTR,
    SERIALIZE_MODE_ATTR,
    SERIALIZE_MODES,
)
from paddle_ipu.errors import NotSupportedError, OptionError


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def set_attr(op: Any, name: str, value: Any) -> None:
    """``op._set_attr(name, value)`` for a PIR operation (see the module docstring)."""
    if not isinstance(name, str):
        raise OptionError(f"_set_attr: the attribute name must be a str, got {name!r}")
    where = f"_set_attr({name!r}) on {op.name()}"
    if name == AVAILABLE_MEMORY_ATTR:
        if not _number(value) or not 0.0 <= float(value) <= 1.0:
            raise OptionError(f"{where}: the proportion must be a number in [0, 1], got {value!r}")
        op.set_str_attr(name, repr(float(value)))
    elif name == SERIALIZE_FACTOR_ATTR:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OptionError(f"{where}: the factor must be an int >= 1, got {value!r}")
        op.set_int_attr(name, int(value))
    elif name == SERIALIZE_MODE_ATTR:
        if value not in SERIALIZE_MODES:
            raise OptionError(f"{where}: the mode must be one of {SERIALIZE_MODES}, got {value!r}")
        op.set_str_attr(name, str(value))
    elif isinstance(value, bool):
        op.set_bool_attr(name, value)
    elif isinstance(value, int):
        op.set_int_attr(name, value)
    elif isinstance(value, str):
        op.set_str_attr(name, value)
    elif isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        op.set_int_array_attr(name, list(value))
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        op.set_str_array_attr(name, list(value))
    else:
        raise NotSupportedError(
            f"{where}: a PIR operation takes bool, int, str and lists of ints or strs "
            f"from Python, not {type(value).__name__} ({value!r})"
        )


def _method(op: Any, name: str, value: Any) -> None:
    set_attr(op, name, value)


def install(replace: Callable[[Any, str, Any], None]) -> None:
    """Give ``paddle.pir.Operation`` the ``_set_attr`` above (``replace`` records the
    original, none, so that compat.disable() takes it away again)."""
    import paddle

    if "_set_attr" not in paddle.pir.Operation.__dict__:
        replace(paddle.pir.Operation, "_set_attr", _method)
