"""Rewrites of indexing and tiling operators before paddle2onnx converts them (part of
:func:`paddle_ipu.compiler.program_rewrites.rewrite_for_converter`):

- ``repeat_interleave`` with an int of repeats failed: unsqueeze, expand, reshape;
- ``tile`` with more repeats than the input has dimensions: the input unsqueezed;
- ``set_value`` (``x[slices] = v``) became an If node ONNX Runtime refuses (and a bool
  one aborted the converter): a mask of the region and a ``where``; with a tensor of
  values (``set_value_with_tensor``) the values padded to the input's shape too;
- ``unfold`` (im2col) had no static output shape: a depthwise convolution with
  one-hot kernels.

Each returns what it replaced (old value id -> new value); checked against Paddle's
CPU kernels in the conformance suite.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from paddle_ipu.compiler.pir_values import PIR_OPS, copy_placement, dtype_name, shape_of
from paddle_ipu.errors import UnsupportedOpError


def _describe_operand(op: Any, k: int) -> str:
    """``operand k (float32[-1, 16, 64])`` and the data op it is, for messages."""
    value = op.operand_source(k)
    text = f"operand {k} ({dtype_name(value)}{list(shape_of(value))})"
    producer = value.get_defining_op()
    if producer is not None and producer.name() in ("pd_op.data", "pd_op.feed"):
        text += f", the feed {str(producer.attrs()['name'])!r}"
    return text


def _replace_result(block: Any, op: Any, new: Any, before: set[int]) -> dict[int, Any]:
    copy_placement(block, op, before)
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
        if bounds[0] is None or bounds[1] is None:
            before = {o.id() for o in block.ops}
            out = _set_at_run_time_index(op, x, values, shape, axes, bounds[2], what)
            replaced.update(_replace_result(block, op, out, before))
            continue
        if any(b is None for b in bounds):
            raise UnsupportedOpError(
                f"{what}: its steps are computed at run time; only constant steps lower"
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


def _set_at_run_time_index(
    op: Any, x: Any, values: Any, shape: list[int], axes: list[int], steps: Any, what: str
) -> Any:
    """``x[..., start:end, ...] = values`` on one axis of static size whose bounds are
    computed at run time (a decoder loop writing step ``i``'s output at ``[:, i]``):
    ``where(start <= arange(size) < end, values, x)``, the values broadcast along the
    axis -- which holds them when they have one row there (the region one row long,
    as a step's index writes it); more rows at a run-time place are refused."""
    attrs = op.attrs()
    if len(axes) != 1 or list(attrs.get("none_axes", [])) or (steps or [1]) != [1]:
        raise UnsupportedOpError(
            f"{what}: slices computed at run time lower on one axis with step 1 only"
        )
    axis = axes[0]
    if shape[axis] < 0:
        raise UnsupportedOpError(
            f"{what}: the sliced axis has an unknown size; a slice computed at run time "
            "needs it static"
        )
    decrease = sorted(int(a) for a in attrs.get("decrease_axes", []))
    vshape = list(shape_of(values))
    if axis not in decrease and (len(vshape) != len(shape) or vshape[axis] != 1):
        raise UnsupportedOpError(
            f"{what}: assigns {vshape} at a place computed at run time; only one row along "
            "the axis lowers (x[:, i] = v)"
        )
    paddle.pir.set_insertion_point(op)
    size = shape[axis]

    def bound(k: int) -> Any:
        source = op.operand_source(k)
        maker = source.get_defining_op()
        if maker is not None and maker.name() == "builtin.combine":  # [tensor, ...]
            source = maker.operand_source(0)
        elif maker is not None and maker.name() == "pd_op.full_int_array":
            source = paddle.full([1], int(maker.attrs()["value"][0]), "int64")
        b = paddle.cast(paddle.reshape(source, [1]), "int64")
        return paddle.where(b < 0, b + size, b)  # a negative bound counts from the end

    index = paddle.arange(0, size, 1, dtype="int64")
    mask = paddle.logical_and(index >= bound(2), index < bound(3))
    view = [1] * len(shape)
    view[axis] = size
    mask = paddle.reshape(mask, view)
    v = values
    for a in decrease:
        v = paddle.unsqueeze(v, a)
    if v.dtype != x.dtype:
        v = paddle.cast(v, x.dtype)
    # where broadcasts the mask and the values through zeros_like (shapes read at run
    # time); expand_as would write x's declared shape, -1 in a batch left open, as a
    # constant target the converter cannot resolve
    return paddle.where(mask, v, x)


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
