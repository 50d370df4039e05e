"""Valid ranges of integer feeds that index: labels, ids, gather indices.

An out-of-range label or id does not give a wrong number quietly on the CPU: Paddle's
kernels raise an IndexError for some values and read out of bounds for others (a
``2**40`` label takes the process down with SIGSEGV).  The executor checks every
such feed before it runs anything; this module finds, at compile time, which feeds
index and what their ranges are.

From each integer data op of the feeds, the walk follows value-preserving ops
(reshape, squeeze, unsqueeze, flatten, cast to an integer type, expand, transpose,
assign) to the operators that index with the value, and reads the range from the
operand they index.  The ranges match what Paddle 3.3's CPU kernels accept
(checked against each kernel):

==========================  =========================  ================================
operator (operand)           valid values               Paddle's CPU kernel
==========================  =========================  ================================
cross_entropy_with_softmax   ``[0, C)`` or ignore_index  cross_entropy.cc: ``lbl >= 0``
nll_loss (label)             ``[0, C)`` or ignore_index  nll_loss kernel
embedding (ids)              ``[0, rows)``              embedding_kernel.cc: ``ids >= 0``
one_hot (x)                  ``[0, depth)``             one_hot_kernel.cc
gather (index)               ``[-n, n)``                gather.h: ``>= -index_dim_size``
index_select (index)         ``[-n, n)``                index_select_impl.h
take_along_axis (indices)    ``[-n, n)``                ``>= -src_select_dim_size``
index_sample (index)         ``[0, n)``                 index_sample_kernel.cc
put_along_axis (indices)     ``[-n, n)``                scatter cpu kernel
scatter (index)              ``[-n, n)`` (rows of x)    scatter.h
gather_nd (index)            ``[-d_j, d_j)`` in column  gather.h (CPUGatherNd)
                             ``j`` (dimension j of x)
scatter_nd_add (index)       as gather_nd               scatter.h (ScatterNdAdd)
==========================  =========================  ================================

(``embedding``'s kernel reads out of bounds, without an error, for ``-1`` when no
padding_idx is set, and for every id outside ``[0, rows)`` once one is set; the range
refuses them all.)  A dimension that is not known at compile time gives no
range; an operand reached only through other ops (arithmetic, slicing) gives none
either, since its values are no longer the feed's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from paddle_ipu._util import dtypes
from paddle_ipu.compiler.model import IndexRange, TensorSpec

# Ops whose first operand reaches their first result with the same values (only
# the shape, layout or integer width changes).
_PASS_THROUGH = {
    "reshape",
    "squeeze",
    "unsqueeze",
    "flatten",
    "cast",
    "expand",
    "broadcast_to",
    "transpose",
    "assign",
}


def _base_name(op: Any) -> str:
    """``pd_op.reshape_`` -> ``reshape``."""
    name = str(op.name())
    name = name.split(".", 1)[1] if "." in name else name
    return name[:-1] if name.endswith("_") else name


def _dim(value: Any, axis: int) -> int | None:
    """``value``'s static size along ``axis`` (negative counts from the end)."""
    try:
        shape = list(value.shape)
    except Exception:  # a value without a dense type
        return None
    if not shape:
        return None
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        return None
    size = int(shape[axis])
    return size if size >= 0 else None


def _constant(value: Any) -> float | None:
    """The scalar of a ``full`` op's result (a gather axis, a one_hot depth)."""
    try:
        op = value.get_defining_op()
    except Exception:
        return None
    if op is None or _base_name(op) != "full":
        return None
    data = op.attrs().get("value")
    return float(data) if isinstance(data, (int, float)) else None


def _int_attr(op: Any, name: str, default: int) -> int:
    value = op.attrs().get(name, default)
    return int(value) if isinstance(value, (int, float)) else default


def _class_range(op: Any, what: str, axis: int) -> IndexRange | None:
    classes = _dim(op.operands_source()[0], axis)
    if classes is None:
        return None
    ignore = _int_attr(op, "ignore_index", -100)
    allowed = () if 0 <= ignore < classes else (ignore,)
    return IndexRange(0, classes, f"label of {what} with {classes} classes", allowed)


def _cross_entropy(op: Any) -> IndexRange | None:
    if op.attrs().get("soft_label"):
        return None  # the label is a distribution, not an index
    return _class_range(op, "cross_entropy", _int_attr(op, "axis", -1))


def _nll_loss(op: Any) -> IndexRange | None:
    return _class_range(op, "nll_loss", 1)


def _embedding(op: Any) -> IndexRange | None:
    rows = _dim(op.operands_source()[1], 0)
    if rows is None:
        return None
    return IndexRange(0, rows, f"ids of embedding with {rows} rows")


def _one_hot(op: Any) -> IndexRange | None:
    operands = op.operands_source()
    depth = _constant(operands[1]) if len(operands) > 1 else None
    if depth is None and "num_classes" in op.attrs():
        depth = float(_int_attr(op, "num_classes", -1))
    if depth is None or depth < 1:
        return None
    return IndexRange(0, int(depth), f"input of one_hot with depth {int(depth)}")


def _signed(op: Any, what: str, axis: int | None) -> IndexRange | None:
    if axis is None:
        return None
    size = _dim(op.operands_source()[0], axis)
    if size is None:
        return None
    return IndexRange(-size, size, f"index of {what} along axis {axis} of size {size}")


def _gather(op: Any) -> IndexRange | None:
    operands = op.operands_source()
    axis = _constant(operands[2]) if len(operands) > 2 else None
    if axis is None and len(operands) <= 2:
        axis = float(_int_attr(op, "axis", 0))
    return _signed(op, "gather", None if axis is None else int(axis))


def _index_select(op: Any) -> IndexRange | None:
    return _signed(op, "index_select", _int_attr(op, "axis", 0))


def _take_along_axis(op: Any) -> IndexRange | None:
    return _signed(op, "take_along_axis", _int_attr(op, "axis", 0))


def _index_sample(op: Any) -> IndexRange | None:
    size = _dim(op.operands_source()[0], 1)
    if size is None:
        return None
    return IndexRange(0, size, f"index of index_sample over {size} columns")


def _put_along_axis(op: Any) -> IndexRange | None:
    return _signed(op, "put_along_axis", _int_attr(op, "axis", 0))


def _scatter(op: Any) -> IndexRange | None:
    return _signed(op, "scatter", 0)


def _nd(what: str) -> Callable[[Any], tuple[IndexRange, ...]]:
    """gather_nd, scatter_nd_add: column ``j`` of the index's last axis indexes
    dimension ``j`` of x, from ``-d_j`` (negative counts from the end)."""

    def rule(op: Any) -> tuple[IndexRange, ...]:
        operands = op.operands_source()
        columns = _dim(operands[1], -1)
        if columns is None:
            return ()
        found = []
        for j in range(columns):
            size = _dim(operands[0], j)
            if size is not None:
                use = f"column {j} of the index of {what}, into dimension {j} of size {size}"
                found.append(IndexRange(-size, size, use, column=j))
        return tuple(found)

    return rule


_Rule = Callable[[Any], "IndexRange | tuple[IndexRange, ...] | None"]

# op -> (the operand that indexes, its ranges)
_RULES: dict[str, tuple[int, _Rule]] = {
    "cross_entropy_with_softmax": (1, _cross_entropy),
    "nll_loss": (1, _nll_loss),
    "embedding": (0, _embedding),
    "one_hot": (0, _one_hot),
    "gather": (1, _gather),
    "index_select": (1, _index_select),
    "take_along_axis": (1, _take_along_axis),
    "index_sample": (1, _index_sample),
    "put_along_axis": (1, _put_along_axis),
    "scatter": (1, _scatter),
    "gather_nd": (1, _nd("gather_nd")),
    "scatter_nd_add": (1, _nd("scatter_nd_add")),
}


def _consumers(block: Any) -> dict[int, list[tuple[Any, int]]]:
    """value id -> (op, operand index) of every use in ``block``."""
    uses: dict[int, list[tuple[Any, int]]] = {}
    for op in block.ops:
        for k, value in enumerate(op.operands_source()):
            try:
                key = value.id
            except Exception:  # an empty optional operand
                continue
            uses.setdefault(key, []).append((op, k))
    return uses


def _is_integer(value: Any) -> bool:
    return dtypes.is_integer(value.dtype)


def feed_ranges(program: Any, feed_names: Sequence[str]) -> dict[str, tuple[IndexRange, ...]]:
    """For each named integer feed of ``program``, the ranges its values must lie in."""
    block = program.global_block()
    uses = _consumers(block)
    wanted = set(feed_names)
    result: dict[str, tuple[IndexRange, ...]] = {}
    for op in block.ops:
        if _base_name(op) != "data":
            continue
        name = op.attrs().get("name")
        if name not in wanted or not _is_integer(op.result(0)):
            continue
        found: list[IndexRange] = []
        seen: set[int] = set()
        stack = [op.result(0)]
        while stack:
            value = stack.pop()
            if value.id in seen:
                continue
            seen.add(value.id)
            for user, k in uses.get(value.id, []):
                kind = _base_name(user)
                if kind in _PASS_THROUGH and k == 0:
                    out = user.result(0)
                    if _is_integer(out):
                        stack.append(out)
                    continue
                rule = _RULES.get(kind)
                if rule is None or rule[0] != k:
                    continue
                got = rule[1](user)
                for found_range in got if isinstance(got, tuple) else (got,):
                    if found_range is not None and found_range not in found:
                        found.append(found_range)
        if found:
            result[str(name)] = tuple(found)
    return result


def attach_ranges(program: Any, inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """``inputs`` with the ranges of their integer feeds set (see :func:`feed_ranges`)."""
    names = [spec.paddle_name or spec.name for spec in inputs]
    ranges = feed_ranges(program, names)
    return [
        replace(spec, ranges=ranges[name]) if name in ranges else spec
        for spec, name in zip(inputs, names)
    ]
