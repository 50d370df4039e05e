"""Rewrites of the forward program before paddle2onnx converts it: ops the converter
cannot lower as they are (2.1, PIR), replaced by equivalent ops it lowers correctly.

- ``mean`` / ``sum`` over ``axis=[]`` (all axes: what ``F.cross_entropy(...,
  reduction="mean")`` produces) aborted the converter: an explicit list of axes;
- ``softplus`` with ``beta != 1`` or ``threshold != 20`` aborted it: the formula;
- ``interpolate`` with ``scale_factor`` failed (the scale is stored as doubles): the
  output size;
- adaptive pooling to a size that does not divide the input: averages over the bins
  Paddle uses, as a matmul;
- ``repeat_interleave`` with an int of repeats failed: unsqueeze, expand, reshape;
- ``tile`` with more repeats than the input has dimensions: the input unsqueezed;
- ``set_value`` (``x[slices] = v``) became an If node ONNX Runtime refuses (and a bool
  one aborted the converter): a mask of the region and a ``where``; with a tensor of
  values (``set_value_with_tensor``) the values padded to the input's shape too;
- ``unfold`` (im2col) had no static output shape: a depthwise convolution with
  one-hot kernels.

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
        sizes = [d * s for d, s in zip(spatial, scale)]
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


def _describe_operand(op: Any, k: int) -> str:
    """``operand k (float32[-1, 16, 64])`` and the data op it is, for messages."""
    value = op.operand_source(k)
    text = f"operand {k} ({dtype_name(value)}{list(shape_of(value))})"
    producer = value.get_defining_op()
    if producer is not None and producer.name() in ("pd_op.data", "pd_op.feed"):
        text += f", the feed {str(producer.attrs()['name'])!r}"
    return text


def _replace_result(block: Any, op: Any, new: Any, before: set[int]) -> dict[int, Any]:
    _copy_placement(block, op, before)
    old = op.result(0)
    old.replace_all_uses_with(new)
    block.remove_op(op)
    return {old.id: new}


def rewrite_repeat_interleave(block: Any) -> dict[int, Any]:
    """``repeat_interleave(x, repeats=r, axis)`` (an int ``r``) -> unsqueeze, expand,
    reshape: each element along ``axis`` repeated ``r`` times in place.

    paddle2onnx 2.1 fails on it ("cannot create std::vector larger than
    max_size()").  Dimensions of unknown size (-1) are kept by the expand (-1) and
    the reshape (0 copies a leading one, -1 takes the rest); a shape with more
    unknown dimensions than that can express is refused by name."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.repeat_interleave":
            continue
        attrs = op.attrs()
        x = op.operand_source(0)
        shape = list(shape_of(x))
        rank = len(shape)
        repeats = int(attrs.get("repeats", 1))
        axis = int(attrs.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        after = shape[axis + 1 :]
        unknown_after = sum(d < 0 for d in after)
        if rank == 0 or not 0 <= axis < rank or unknown_after > (0 if shape[axis] < 0 else 1):
            raise UnsupportedOpError(
                f"{op.name()}(repeats={repeats}, axis={attrs.get('axis')}) on "
                f"{_describe_operand(op, 0)}: more dimensions of unknown size than a reshape "
                "can keep; give the input a static shape"
            )
        expand_to = [*shape[: axis + 1], repeats, *shape[axis + 1 :]]
        target = [0 if d < 0 else d for d in shape[:axis]]
        target.append(-1 if shape[axis] < 0 else shape[axis] * repeats)
        target += [-1 if d < 0 else d for d in after]
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        y = PIR_OPS.unsqueeze(x, [axis + 1])
        y = PIR_OPS.expand(y, expand_to)
        y = PIR_OPS.reshape(y, target)
        replaced.update(_replace_result(block, op, y, before))
    return replaced


def rewrite_tile_rank(block: Any) -> dict[int, Any]:
    """``tile(x, repeat_times)`` with more repeats than ``x`` has dimensions: ``x``
    unsqueezed to that rank first.

    Paddle prepends dimensions of size 1 to ``x``; the converter pads the repeats
    but not ``x``, and ONNX's Tile refuses the rank mismatch."""
    for op in list(block.ops):
        if op.name() != "pd_op.tile":
            continue
        x = op.operand_source(0)
        repeats = shape_of(op.operand_source(1))
        rank = len(shape_of(x))
        if len(repeats) != 1 or repeats[0] <= rank:
            continue
        paddle.pir.set_insertion_point(op)
        op.operand(0).set_source(PIR_OPS.unsqueeze(x, list(range(repeats[0] - rank))))
    return {}


def _constant_ints(value: Any) -> list[int] | None:
    """The values of a ``full_int_array`` result; None for anything computed."""
    op = value.get_defining_op()
    if op is None or op.name() != "pd_op.full_int_array":
        return None
    return [int(v) for v in op.attrs().get("value", [])]


def _axis_mask(size: int, start: int, end: int, step: int) -> Any:
    """[size] bool: the positions Python's ``slice(start, end, step)`` selects."""
    mask = np.zeros((size,), dtype=bool)
    mask[start:end:step] = True
    return mask


def _dynamic_axis_mask(x: Any, axis: int, start: int, end: int, step: int) -> Any:
    """The same mask for an axis of unknown size: from ``arange(x.shape[axis])``
    (static once the feed shapes are; the compiler folds it)."""
    size = paddle.shape(x)[axis]
    index = paddle.arange(0, size, 1, dtype="int64")

    def bound(v: int) -> Any:
        # Python's slice bounds: a negative one counts from the end; both clamp.
        b = (size + v) if v < 0 else paddle.full([], v, "int64")
        return paddle.clip(b, 0, None) if v < 0 else b

    lo, hi = bound(start), bound(end)
    mask = paddle.logical_and(index >= lo, index < hi)
    if step != 1:
        stride = paddle.full([], step, "int64")
        mask = paddle.logical_and(mask, paddle.remainder(index - lo, stride) == 0)
    return mask


def rewrite_set_value(block: Any) -> dict[int, Any]:
    """``x[slices] = v`` (``set_value`` / ``set_value_`` with one scalar value and
    constant starts, ends and steps) -> a mask of the region, then ``where(mask, v,
    x)`` (``x | mask`` or ``x & ~mask`` for a bool ``x``).

    paddle2onnx lowers set_value to an If node ONNX Runtime refuses, and aborts on
    a bool one (Gemma-3's sliding-window mask).  The region is separable: one 1-D
    mask per sliced axis (a constant where the axis has a static size, computed from
    the shape where it has not), broadcast together.  Slices computed at run time,
    a negative step on an axis of unknown size and a tensor of values are refused
    by name."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in ("pd_op.set_value", "pd_op.set_value_"):
            continue
        attrs = op.attrs()
        x = op.operand_source(0)
        shape = list(shape_of(x))
        bounds = [_constant_ints(op.operand_source(k)) for k in (1, 2, 3)]
        values = list(attrs.get("values", []))
        axes = [int(a) for a in attrs.get("axes", [])]
        what = f"{op.name()}(axes={axes}) on {_describe_operand(op, 0)}"
        if any(b is None for b in bounds):
            raise UnsupportedOpError(
                f"{what}: its starts, ends or steps are computed at run time; only "
                "constant slices lower (x[a:b] with Python ints)"
            )
        starts, ends, steps = (b or [] for b in bounds)
        if len(values) != 1:
            raise UnsupportedOpError(
                f"{what}: assigns a tensor of {len(values)} values; only one scalar value "
                "lowers (x[...] = 0.5)"
            )
        if any(st == 0 for st in steps) or any(
            shape[a] < 0 and st < 0 for a, st in zip(axes, steps)
        ):
            raise UnsupportedOpError(
                f"{what}: steps {steps}; a negative step needs the axis's size to be static"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        mask = _region_mask(x, shape, axes, [starts, ends, steps])
        value = float(values[0])
        if x.dtype == paddle.bool:
            out = (
                paddle.logical_or(x, mask)
                if value
                else paddle.logical_and(x, paddle.logical_not(mask))
            )
        else:
            out = paddle.where(mask, paddle.full_like(x, value), x)
        replaced.update(_replace_result(block, op, out, before))
    return replaced


def _region_mask(x: Any, shape: list[int], axes: list[int], bounds: list[list[int]]) -> Any:
    """bool, broadcastable to ``x``: the positions ``x[slices]`` selects."""
    rank = len(shape)
    mask = None
    for axis, start, end, step in zip(axes, *bounds):
        if shape[axis] >= 0:
            # the converter has no bool constants: int32, then a cast
            constant = _axis_mask(shape[axis], start, end, step).astype(np.int32)
            axis_mask = paddle.cast(paddle.assign(constant), "bool")
        else:
            axis_mask = _dynamic_axis_mask(x, axis, start, end, step)
        broadcast = [1] * rank
        broadcast[axis] = -1
        axis_mask = paddle.reshape(axis_mask, broadcast)
        mask = axis_mask if mask is None else paddle.logical_and(mask, axis_mask)
    if mask is None:  # no axis sliced: the whole tensor
        mask = paddle.full([1] * rank, True, "bool")
    return mask


def rewrite_set_value_with_tensor(block: Any) -> dict[int, Any]:
    """``x[slices] = values`` with a tensor of values (``set_value_with_tensor``,
    constant slices of step 1 on axes of static size) -> the values broadcast to the
    region, padded with zeros to ``x``'s shape, and ``where(mask, padded, x)``.

    paddle2onnx lowers it to an If node ONNX Runtime refuses (a ViT's
    ``x[:, 1:] = patches``).  Slices computed at run time, other steps, a sliced axis
    of unknown size and new axes (None) are refused by name."""
    import paddle.nn.functional as F

    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in ("pd_op.set_value_with_tensor", "pd_op.set_value_with_tensor_"):
            continue
        attrs = op.attrs()
        x, values = op.operand_source(0), op.operand_source(1)
        shape = list(shape_of(x))
        axes = [int(a) for a in attrs.get("axes", [])]
        bounds = [_constant_ints(op.operand_source(k)) for k in (2, 3, 4)]
        what = f"{op.name()}(axes={axes}) on {_describe_operand(op, 0)}"
        if any(b is None for b in bounds):
            raise UnsupportedOpError(
                f"{what}: its starts, ends or steps are computed at run time; only "
                "constant slices lower (x[a:b] = v with Python ints)"
            )
        starts, ends, steps = (b or [] for b in bounds)
        if list(attrs.get("none_axes", [])) or any(st != 1 for st in steps):
            raise UnsupportedOpError(
                f"{what}: steps {steps}, new axes {list(attrs.get('none_axes', []))}; "
                "assigning a tensor lowers for slices of step 1 only"
            )
        if any(shape[a] < 0 for a in axes):
            raise UnsupportedOpError(
                f"{what}: a sliced axis has an unknown size; assigning a tensor needs "
                "the sliced axes' sizes static"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        begin = list(range(len(shape)))
        widths = [[0, 0] for _ in shape]
        region_starts, region_ends = [], []
        for axis, start, end in zip(axes, starts, ends):
            lo, hi, _ = slice(start, end, 1).indices(shape[axis])
            hi = max(hi, lo)
            widths[axis] = [lo, shape[axis] - hi]
            region_starts.append(lo)
            region_ends.append(hi)
        v = values
        for axis in sorted(int(a) for a in attrs.get("decrease_axes", [])):
            v = paddle.unsqueeze(v, axis)
        if v.dtype != x.dtype:
            v = paddle.cast(v, x.dtype)
        region = paddle.slice(x, axes, region_starts, region_ends) if axes else x
        v = paddle.expand_as(v, region)
        if any(w != [0, 0] for w in widths):
            v = F.pad(v, [w for axis in begin for w in widths[axis]], value=0.0)
        mask = _region_mask(x, shape, axes, [starts, ends, steps])
        replaced.update(_replace_result(block, op, paddle.where(mask, v, x), before))
    return replaced


def rewrite_unfold(block: Any) -> dict[int, Any]:
    """``unfold(x)`` (im2col) -> a depthwise convolution with one-hot kernels, reshaped.

    The converter's unfold has no static output shape.  Output channel
    ``c * kh * kw + i * kw + j`` of Paddle's unfold is channel ``c`` at kernel offset
    ``(i, j)``: exactly a convolution of groups ``C`` whose kernel for that channel is
    1 at ``(i, j)`` and 0 elsewhere, with unfold's strides, dilations and paddings
    (``[top, left, bottom, right]``).  An input of unknown channel count is refused."""
    import paddle.nn.functional as F

    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.unfold":
            continue
        attrs = op.attrs()
        x = op.operand_source(0)
        shape = list(shape_of(x))
        kh, kw = (int(k) for k in attrs["kernel_sizes"])
        channels = shape[1] if len(shape) == 4 else -1
        if channels < 0:
            raise UnsupportedOpError(
                f"{op.name()} on {_describe_operand(op, 0)}: the channel count must be static"
            )
        top, left, bottom, right = (int(p) for p in attrs["paddings"])
        kernel = np.zeros((channels * kh * kw, 1, kh, kw), dtype=dtype_name(x))
        for c in range(channels):
            for i in range(kh):
                for j in range(kw):
                    kernel[c * kh * kw + i * kw + j, 0, i, j] = 1
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        columns = F.conv2d(
            x,
            paddle.assign(kernel),
            stride=[int(v) for v in attrs["strides"]],
            padding=[[0, 0], [0, 0], [top, bottom], [left, right]],
            dilation=[int(v) for v in attrs["dilations"]],
            groups=channels,
        )
        out = paddle.reshape(columns, [0, channels * kh * kw, -1])
        replaced.update(_replace_result(block, op, out, before))
    return replaced


def rewrite_for_converter(block: Any) -> dict[int, Any]:
    """Every rewrite above, on ``block``; returns old value id -> new value."""
    with insertion_guard():
        replaced = rewrite_empty_axis_reductions(block)
        replaced.update(rewrite_softplus(block))
        replaced.update(rewrite_interp_scale(block))
        replaced.update(rewrite_adaptive_pools(block))
        replaced.update(rewrite_repeat_interleave(block))
        replaced.update(rewrite_tile_rank(block))
        replaced.update(rewrite_set_value(block))
        replaced.update(rewrite_set_value_with_tensor(block))
        replaced.update(rewrite_unfold(block))
    return replaced
