"""Rewrites of the forward program before paddle2onnx converts it: ops the converter
cannot lower as they are (2.1, PIR), replaced by equivalent ops it lowers correctly.

- ``mean`` / ``sum`` over ``axis=[]`` (all axes: what ``F.cross_entropy(...,
  reduction="mean")`` produces) aborted the converter: an explicit list of axes;
- ``softplus`` with ``beta != 1`` or ``threshold != 20`` aborted it: the formula;
- ``interpolate`` with ``scale_factor`` failed (the scale is stored as doubles): the
  output size;
- adaptive pooling to a size that does not divide the input: averages over the bins
  Paddle uses, as a matmul.

Each runs on the clone the reader works on, and returns what it replaced (old value
id -> new value), so the fetches follow.  The fixes of the converter's output are in
:mod:`paddle_ipu.compiler.converter_fixes`; both are checked against Paddle's CPU
kernels in the conformance suite.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle

from paddle_ipu.compiler.pir_values import (
    IPU_INDEX_ATTR,
    IPU_STAGE_ATTR,
    PIR_OPS,
    dtype_name,
    is_real,
    op_int_attr,
    shape_of,
)
from paddle_ipu.errors import UnsupportedOpError

# Reductions whose "all axes" form (an empty axis list) the converter cannot
# read; the same reduction over every axis, spelled out, converts fine.
_REDUCTIONS = frozenset(
    {"pd_op.mean", "pd_op.sum", "pd_op.max", "pd_op.min", "pd_op.prod", "pd_op.all", "pd_op.any"}
)

_INTERPS = frozenset(
    {
        "pd_op.linear_interp",
        "pd_op.bilinear_interp",
        "pd_op.trilinear_interp",
        "pd_op.nearest_interp",
        "pd_op.bicubic_interp",
    }
)

_ADAPTIVE_POOLS = frozenset({"pd_op.pool2d", "pd_op.max_pool2d_with_index"})


@contextlib.contextmanager
def insertion_guard() -> Iterator[None]:
    try:
        yield
    finally:
        paddle.pir.reset_insertion_point_to_end()


def rewrite_empty_axis_reductions(block: Any) -> dict[int, Any]:
    """``mean(x, axis=[])`` -> ``mean(x, axis=[0, .., rank-1])`` (same for other reductions).

    A reduction of a 0-D tensor (``paddle.mean`` of a loss that is already a mean) is
    the tensor itself: its uses take the input instead.  Returns old value id -> the
    value that replaces it."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in _REDUCTIONS or op.num_operands() < 2:
            continue
        axis_op = op.operand_source(1).get_defining_op()
        if axis_op is None or axis_op.name() != "pd_op.full_int_array":
            continue
        if list(axis_op.attrs().get("value", [None])) != []:
            continue
        rank = len(shape_of(op.operand_source(0)))
        if rank == 0:
            source, result = op.operand_source(0), op.result(0)
            if dtype_name(source) == dtype_name(result) and not shape_of(result):
                replaced[result.id] = source
                result.replace_all_uses_with(source)
                block.remove_op(op)
                if axis_op.result(0).use_empty():
                    block.remove_op(axis_op)
            continue
        paddle.pir.set_insertion_point(op)
        axes = PIR_OPS.full_int_array(list(range(rank)), paddle.int64, paddle.CPUPlace())
        op.operand(1).set_source(axes)
        if axis_op.result(0).use_empty():
            block.remove_op(axis_op)
    return replaced


def rewrite_softplus(block: Any) -> dict[int, Any]:
    """``softplus(x, beta, threshold)`` -> the same formula in operators that lower.

    paddle2onnx aborts on every PIR softplus (it checks beta and threshold
    against attributes it cannot read).  Paddle's kernel computes
    ``x if beta * x > threshold else log(1 + exp(beta * x)) / beta``; so does
    this.  Returns old result id -> new value, for the fetches.
    """
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.softplus":
            continue
        attrs = op.attrs()
        beta = float(attrs.get("beta", 1.0))
        threshold = float(attrs.get("threshold", 20.0))
        x = op.operand_source(0)
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        xb = PIR_OPS.scale(x, beta, 0.0, True)
        soft = PIR_OPS.scale(
            PIR_OPS.log(PIR_OPS.scale(PIR_OPS.exp(xb), 1.0, 1.0, True)), 1.0 / beta, 0.0, True
        )
        limit = PIR_OPS.full_like(xb, threshold, x.dtype, paddle.CPUPlace())
        out = PIR_OPS.where(PIR_OPS.greater_than(xb, limit), x, soft)
        for new_op in block.ops:
            if new_op.id() in before:
                continue
            for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR):
                if op.has_attr(attr):
                    new_op.set_int_attr(attr, op_int_attr(op, attr))
        old = op.result(0)
        replaced[old.id] = out
        old.replace_all_uses_with(out)
        block.remove_op(op)
    return replaced


def _copy_placement(block: Any, op: Any, before: set[int]) -> None:
    for new_op in block.ops:
        if new_op.id() in before:
            continue
        for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR):
            if op.has_attr(attr):
                new_op.set_int_attr(attr, op_int_attr(op, attr))


def _scaled_size(size: int, scale: float) -> float:
    """``size * scale`` as Paddle computes the output size.  Paddle 3.3 keeps the
    ``scale`` attribute as doubles (1.4 reads back as 1.4); 3.0 to 3.2 keep floats (1.4
    reads back as 1.399999976...), whose product with the size is whole only in float32
    arithmetic, which is what Paddle's kernels use."""
    exact = size * scale
    if abs(exact - round(exact)) <= 1e-9 or float(np.float32(scale)) != scale:
        return exact
    return float(np.float32(size) * np.float32(scale))


def rewrite_interp_scale(block: Any) -> dict[int, Any]:
    """``interpolate(x, scale_factor=s)`` -> ``interpolate(x, size=in * s)``.

    paddle2onnx cannot read the ``scale`` attribute (stored as doubles, read as
    floats) and stops.  Paddle samples a scaled output at ``1 / s``; the size form
    samples at ``in / out``, which is the same number when ``in * s`` is a whole
    number.  Any other case (a fractional ``in * s``, an unknown spatial size) is
    refused by name rather than approximated."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in _INTERPS:
            continue
        attrs = op.attrs()
        scale = [float(v) for v in attrs.get("scale", [])]
        if not scale or any(is_real(op.operand_source(i)) for i in range(1, op.num_operands())):
            continue
        x = op.operand_source(0)
        shape = shape_of(x)
        fmt = str(attrs.get("data_format", "NCHW"))
        spatial = list(shape[1:-1] if fmt.endswith("C") and fmt != "NC" else shape[2:])
        if len(scale) == 1:
            scale = scale * len(spatial)
        sizes = [_scaled_size(d, s) for d, s in zip(spatial, scale)]
        # Paddle's own output size (it rounds in float32) must be that whole number.
        result_shape = shape_of(op.result(0))
        declared = list(result_shape[1:-1] if fmt.endswith("C") else result_shape[2:])
        bad = len(scale) != len(spatial) or any(
            d < 0 or s <= 0 or abs(v - round(v)) > 1e-9 or o != round(v)
            for d, s, v, o in zip(spatial, scale, sizes, declared)
        )
        if bad:
            raise UnsupportedOpError(
                f"{op.name()} with scale_factor={scale} on an input of spatial size "
                f"{spatial}: only a scale that gives a whole output size on a known input "
                "size lowers exactly; pass size= instead"
            )
        out = [round(v) for v in sizes]
        out_d, out_h, out_w = ([-1] * (3 - len(out)) + out)[-3:]
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        fn = getattr(PIR_OPS, op.name().split(".", 1)[1])
        new = fn(
            x,
            None,
            None,
            None,
            fmt,
            out_d,
            out_h,
            out_w,
            [],
            str(attrs.get("interp_method", "")),
            bool(attrs.get("align_corners", False)),
            int(attrs.get("align_mode", 1)),
        )
        _copy_placement(block, op, before)
        old = op.result(0)
        replaced[old.id] = new
        old.replace_all_uses_with(new)
        block.remove_op(op)
    return replaced


def _adaptive_bins(size_in: int, size_out: int) -> list[tuple[int, int]]:
    """Paddle's adaptive bins: ``[floor(i * in / out), ceil((i + 1) * in / out))``."""
    return [
        ((i * size_in) // size_out, -((-(i + 1) * size_in) // size_out)) for i in range(size_out)
    ]


def _adaptive_matrix(size_in: int, size_out: int) -> Any:
    """[size_out, size_in]: row i averages adaptive bin i."""

    m = np.zeros((size_out, size_in), dtype=np.float64)
    for i, (start, end) in enumerate(_adaptive_bins(size_in, size_out)):
        m[i, start:end] = 1.0 / (end - start)
    return m


def rewrite_adaptive_pools(block: Any) -> dict[int, Any]:
    """Adaptive average pooling whose output size does not divide the input size.

    paddle2onnx lowers every adaptive pool to a fixed-window pool with stride
    ``in // out``: right when ``out`` divides ``in``, wrong numbers otherwise, and
    a zero stride (a division by zero that kills the process in ONNX shape
    inference) when ``out > in``.  Paddle's bins overlap and vary in size there;
    an average over bins is separable, so it is two matrix products with constant
    bin matrices (rows, then columns); a maximum over bins is separable too (a
    slice and a reduction per bin).  Other layouts and unknown sizes are refused by
    name."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in _ADAPTIVE_POOLS or not bool(op.attrs().get("adaptive", False)):
            continue
        attrs = op.attrs()
        if op.name() == "pd_op.pool2d":
            size_op = op.operand_source(1).get_defining_op()
            if size_op is None or size_op.name() != "pd_op.full_int_array":
                continue
            out_hw = [int(v) for v in size_op.attrs().get("value", [])]
        else:  # max_pool2d_with_index: always max, the size is an attribute
            size_op = None
            out_hw = [int(v) for v in attrs.get("kernel_size", [])]
        x = op.operand_source(0)
        shape = shape_of(x)
        fmt = str(attrs.get("data_format", "NCHW"))
        if len(shape) != 4 or len(out_hw) != 2:
            continue
        in_hw = list(shape[1:3] if fmt == "NHWC" else shape[2:4])
        out_hw = [i if o == -1 else o for i, o in zip(in_hw, out_hw)]  # -1 keeps the size
        if all(i >= 0 and o > 0 and i % o == 0 for i, o in zip(in_hw, out_hw)):
            continue  # the converter's fixed window is exact
        kind = str(attrs.get("pooling_type", "max"))
        if op.name() == "pd_op.max_pool2d_with_index" and not op.result(1).use_empty():
            continue  # the mask is refused by name (ops.attribute_problem)
        if kind not in ("avg", "max") or fmt != "NCHW" or any(i < 0 for i in in_hw):
            raise UnsupportedOpError(
                f"{op.name()} with adaptive=True, pooling_type={kind!r}, "
                f"data_format={fmt!r}: output size {out_hw} does not divide the input size "
                f"{in_hw}; only adaptive pooling in NCHW with a known input size lowers "
                "exactly there"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if kind == "avg":
            dtype = dtype_name(x)
            rows = paddle.assign(_adaptive_matrix(in_hw[0], out_hw[0]).astype(dtype))
            cols = paddle.assign(_adaptive_matrix(in_hw[1], out_hw[1]).T.astype(dtype).copy())
            new = PIR_OPS.matmul(PIR_OPS.matmul(rows, x, False, False), cols, False, False)
        else:
            # A maximum over a rectangle is the maximum over its rows of the maxima
            # over its columns: one slice and reduction per bin, rows then columns.
            new = x
            for axis, size_in, size_out in ((2, in_hw[0], out_hw[0]), (3, in_hw[1], out_hw[1])):
                parts = [
                    paddle.max(paddle.slice(new, [axis], [lo], [hi]), axis=axis, keepdim=True)
                    for lo, hi in _adaptive_bins(size_in, size_out)
                ]
                new = paddle.concat(parts, axis=axis) if len(parts) > 1 else parts[0]
        _copy_placement(block, op, before)
        old = op.result(0)
        replaced[old.id] = new
        old.replace_all_uses_with(new)
        block.remove_op(op)
        if size_op is not None and size_op.result(0).use_empty():
            block.remove_op(size_op)
    return replaced


def rewrite_for_converter(block: Any) -> dict[int, Any]:
    """Every rewrite above, on ``block``; returns old value id -> new value."""
    with insertion_guard():
        replaced = rewrite_empty_axis_reductions(block)
        replaced.update(rewrite_softplus(block))
        replaced.update(rewrite_interp_scale(block))
        replaced.update(rewrite_adaptive_pools(block))
    return replaced
