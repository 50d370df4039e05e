"""Reading PIR values: dtype, static shape and attributes, as the readers and the
program rewrites need them."""

from __future__ import annotations

from typing import Any

from paddle_ipu._internals import paddle_api
from paddle_ipu._util import dtypes

PIR_OPS: Any = paddle_api.pir_ops()


IPU_INDEX_ATTR = "ipu_index"


IPU_STAGE_ATTR = "ipu_stage"

#: compiler.custom_ops.REGION_ATTR
CUSTOM_REGION_ATTR = "__ipu_custom_op"


def is_dense(value: Any) -> bool:
    """True for a value of a dense tensor type; False for the list values of
    ``builtin.combine`` / ``builtin.split``, tensor arrays and null types, whose
    ``dtype`` and ``shape`` Paddle refuses with a bare ValueError."""
    try:
        return bool(value.is_dense_tensor_type())
    except Exception:
        return False


def type_text(value: Any) -> str:
    try:
        return str(value.type())
    except Exception:
        return "?"


def dtype_name(value: Any) -> str:
    """numpy spelling of a PIR value's dtype (``paddle.float32`` -> ``float32``)."""
    if not is_dense(value):
        return type_text(value)
    return dtypes.name_of(value.dtype)


def shape_of(value: Any) -> tuple[int, ...]:
    if not is_dense(value):
        return ()
    try:
        return tuple(int(d) for d in value.shape)
    except Exception:
        return ()


def dense_type(value: Any) -> tuple[str, tuple[int, ...]] | None:
    if not is_real(value) or not is_dense(value):
        return None
    return dtype_name(value), shape_of(value)


def type_desc(value: Any) -> str:
    """``float32[3, 4]`` for a dense tensor, Paddle's own type text otherwise."""
    if not is_dense(value):
        return type_text(value)
    return f"{dtype_name(value)}{list(shape_of(value))}"


# Attribute values that are not plain data (places, dtypes, op call stacks)
# are kept as their text; the checks and corrections only read numbers,
# booleans and strings.
_SKIPPED_ATTRS = frozenset({"op_callstack", "stop_gradient", "struct_name", "persistable"})


def plain_attrs(op: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        attrs = op.attrs()
    except Exception:
        return out
    for key, value in attrs.items():
        if key in _SKIPPED_ATTRS:
            continue
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(
            isinstance(v, (bool, int, float, str)) for v in value
        ):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


def has_name(value: Any) -> bool:
    try:
        return bool(value.has_name)
    except Exception:
        return False


def is_real(value: Any) -> bool:
    """False for the null value PIR puts in an optional operand left empty."""
    try:
        return bool(value.initialized())
    except Exception:
        return False


def op_int_attr(op: Any, name: str) -> int:
    if not op.has_attr(name):
        return -1
    try:
        return int(op.attrs()[name])
    except Exception:
        return -1


def copy_placement(block: Any, op: Any, before: set[int]) -> None:
    """Give the ops of ``block`` not in ``before`` (a rewrite's new ops) the IPU
    placement (ipu_index, ipu_stage) of the op they replace."""
    for new_op in block.ops:
        if new_op.id() in before:
            continue
        for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR):
            if op.has_attr(attr):
                new_op.set_int_attr(attr, op_int_attr(op, attr))
        # a rewritten operator of a custom op's region stays in the region
        if op.has_attr(CUSTOM_REGION_ATTR) and not new_op.has_attr(CUSTOM_REGION_ATTR):
            new_op.set_str_attr(CUSTOM_REGION_ATTR, str(op.attrs()[CUSTOM_REGION_ATTR]))


#: Paddle 2.x's IPU hints on an operator (``op._set_attr(name, value)``): the available
#: memory proportion of a matmul or convolution (a float in [0, 1]; PIR operations take
#: no float attribute from Python, so it is held as its text), and the serialisation
#: of a matmul (factor, mode).
AVAILABLE_MEMORY_ATTR = "__available_memory"
SERIALIZE_FACTOR_ATTR = "serialize_factor"
SERIALIZE_MODE_ATTR = "serialize_mode"
HINT_ATTRS = (AVAILABLE_MEMORY_ATTR, SERIALIZE_FACTOR_ATTR, SERIALIZE_MODE_ATTR)
#: PopART's matmul serialisation modes (willow/include/popart/names.hpp)
SERIALIZE_MODES = ("none", "input_channels", "reducing_dim", "output_channels")


def op_hints(op: Any) -> dict[str, Any]:
    """The IPU hints set on ``op`` (:data:`AVAILABLE_MEMORY_ATTR` as a float,
    :data:`SERIALIZE_FACTOR_ATTR` as an int, :data:`SERIALIZE_MODE_ATTR` as a str)."""
    hints: dict[str, Any] = {}
    try:
        attrs = op.attrs()
    except Exception:
        return hints
    if AVAILABLE_MEMORY_ATTR in attrs:
        hints[AVAILABLE_MEMORY_ATTR] = float(attrs[AVAILABLE_MEMORY_ATTR])
    if SERIALIZE_FACTOR_ATTR in attrs:
        hints[SERIALIZE_FACTOR_ATTR] = int(attrs[SERIALIZE_FACTOR_ATTR])
    if SERIALIZE_MODE_ATTR in attrs:
        hints[SERIALIZE_MODE_ATTR] = str(attrs[SERIALIZE_MODE_ATTR])
    return hints


def nested_ops(op: Any) -> list[Any]:
    """Every operator inside ``op``'s blocks (a ``pd_op.while`` body, a ``pd_op.if``
    branch), at any depth, in program order."""
    out: list[Any] = []
    for block in op.blocks():
        for inner in block.ops:
            out.append(inner)
            out.extend(nested_ops(inner))
    return out


def reads(op: Any) -> list[Any]:
    """The values ``op`` reads: its operands, and for a control-flow operator the
    values of the enclosing program its blocks use directly (PIR captures them
    without listing them as operands: a loop body's weights, a branch's inputs)."""
    values = [v for v in op.operands_source() if is_real(v)]
    inner = nested_ops(op)
    if not inner:
        return values
    defined = {id_ for o in inner for id_ in (r.id for r in o.results())}
    for block in op.blocks():
        defined.update(a.id for a in block.args())
    seen = {v.id for v in values}
    for o in inner:
        for v in o.operands_source():
            if is_real(v) and v.id not in defined and v.id not in seen:
                seen.add(v.id)
                values.append(v)
    return values
