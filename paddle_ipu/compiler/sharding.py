"""ipu_shard_guard / set_ipu_shard for PIR programs.

Paddle 3.3 still ships ``paddle.static.ipu_shard_guard``, but it raises unless
Paddle was built with IPU support.  These replacements record the placement as
integer attributes ``ipu_index`` / ``ipu_stage`` on every PIR operator created
inside the guard (PIR lets Python set operator attributes, and program clones
keep them).  The compiler carries them onto the ONNX nodes as PopART's
``__ipu_number`` / ``__pipeline_stage`` when manual sharding / pipelining is on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import paddle

from paddle_ipu.compiler.pir_values import IPU_INDEX_ATTR, IPU_STAGE_ATTR
from paddle_ipu.errors import NotSupportedError, OptionError

F = TypeVar("F", bound=Callable[..., Any])

# Operators that hold values rather than compute: PopART places them by use.
_NOT_PLACED = frozenset({"builtin.parameter", "pd_op.data", "pd_op.feed", "pd_op.fetch"})


def _check(index: int, stage: int) -> None:
    for name, value in (("index", index), ("stage", stage)):
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise OptionError(f"ipu_shard_guard {name} must be an int >= -1, got {value!r}")


def _blocks(program: Any) -> list[Any]:
    return [program.global_block()]


@contextlib.contextmanager
def ipu_shard_guard(index: int = -1, stage: int = -1) -> Iterator[None]:
    """Place the operators created inside on IPU ``index`` and pipeline stage ``stage``.

    -1 leaves the setting alone.  Nested guards: the innermost guard that sets a
    value wins.  ``index`` takes effect with enable_manual_shard, ``stage`` with
    enable_pipelining.
    """
    _check(index, stage)
    if not paddle.framework.in_pir_mode():
        raise NotSupportedError(
            "ipu_shard_guard works on PIR static programs: call paddle.enable_static() "
            "and keep the default PIR API"
        )
    program = paddle.static.default_main_program()
    before = {op.id() for block in _blocks(program) for op in block.ops}
    try:
        yield
    finally:
        for block in _blocks(program):
            for op in block.ops:
                if op.id() in before or op.name() in _NOT_PLACED:
                    continue
                if index >= 0 and not op.has_attr(IPU_INDEX_ATTR):
                    op.set_int_attr(IPU_INDEX_ATTR, index)
                if stage >= 0 and not op.has_attr(IPU_STAGE_ATTR):
                    op.set_int_attr(IPU_STAGE_ATTR, stage)


def set_ipu_shard(
    call_func: F,
    index: int = -1,
    stage: int = -1,
    guard: Callable[..., contextlib.AbstractContextManager[None]] | None = None,
) -> F:
    """Run ``call_func`` (a function or a ``paddle.nn.Layer``) under ipu_shard_guard.

    A function is wrapped and the wrapper returned; a Layer gets forward hooks
    that open and close the guard around each call, and is returned itself.
    ``guard`` replaces :func:`ipu_shard_guard` (the compatibility layer passes the one
    that serves legacy-IR programs too).
    """
    _check(index, stage)
    if guard is None:
        guard = ipu_shard_guard
    if isinstance(call_func, paddle.nn.Layer):
        layer = call_func
        guards: list[contextlib.AbstractContextManager[None]] = []

        def pre_hook(_layer: Any, _inputs: Any) -> None:
            opened = guard(index=index, stage=stage)
            opened.__enter__()
            guards.append(opened)

        def post_hook(_layer: Any, _inputs: Any, _outputs: Any) -> None:
            if guards:
                guards.pop().__exit__(None, None, None)

        layer.register_forward_pre_hook(cast(Any, pre_hook))
        layer.register_forward_post_hook(cast(Any, post_hook))
        return call_func
    if not callable(call_func):
        raise OptionError(f"set_ipu_shard needs a callable or a Layer, got {call_func!r}")

    @functools.wraps(call_func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with guard(index=index, stage=stage):
            return call_func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
