"""Rewrites of the forward program before paddle2onnx converts it: ops the converter
cannot lower as they are (2.1, PIR), replaced by equivalent ops it lowers correctly.

- ``mean`` / ``sum`` over ``axis=[]`` (all axes: what ``F.cross_entropy(...,
  reduction="mean")`` produces) aborted the converter: an explicit list of axes;
- ``softplus`` with ``beta != 1`` or ``threshold != 20`` aborted it: the formula;
- ``interpolate`` with ``scale_factor`` failed (the scale is stored as doubles): the
  output size;
- adaptive pooling to a size that does not divide the input: averages over the bins
  Paddle uses, as a matmul;
- operators the converter has no converter for, in operators it has: ``accuracy``,
  ``identity_loss``, ``mean_all``, ``bce_loss``, ``kldiv_loss``;
- constants of a dtype its Constant helper aborts on (boolean ``assign_value``,
  float16 ``full``): made in float32 or int32, then cast;
- ``log1p``, which it writes as ``log(1 + x)``: an accurate formula;
- float16 ``assign`` and ``remainder``, whose lowering writes a float16 Constant;
- ``repeat_interleave`` with an int of repeats failed: unsqueeze, expand, reshape;
- ``tile`` with more repeats than the input has dimensions: the input unsqueezed;
- ``set_value`` (``x[slices] = v``) became an If node ONNX Runtime refuses (and a bool
  one aborted the converter): a mask of the region and a ``where``; with a tensor of
  values (``set_value_with_tensor``) the values padded to the input's shape too;
- ``unfold`` (im2col) had no static output shape: a depthwise convolution with
  one-hot kernels;
- a ``while`` loop's carried operands: copies, whose names the converter's Loop body
  cannot confuse with the values the body reads from the program;
- reads of a value after an in-place write into it (a loop body's ``buf[:, i:i + 1] =
  v``): reads of the written value;
- Paddle 1.x's ``gru`` and ``crf_decoding`` (:mod:`.sequence_rewrites`): an ONNX GRU
  and the Viterbi decode in loops.

They run on the blocks of control-flow operators (a loop's body, a branch) too.

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

from paddle_ipu.compiler.index_rewrites import (
    rewrite_repeat_interleave,
    rewrite_set_value,
    rewrite_set_value_with_tensor,
    rewrite_tile_rank,
    rewrite_unfold,
)
from paddle_ipu.compiler.pir_values import (
    PIR_OPS,
    copy_placement,
    dtype_name,
    is_real,
    op_int_attr,
    shape_of,
)
from paddle_ipu.compiler.sequence_rewrites import rewrite_crf_decoding, rewrite_gru
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
        copy_placement(block, op, before)
        old = op.result(0)
        replaced[old.id] = out
        old.replace_all_uses_with(out)
        block.remove_op(op)
    return replaced


def _scaled_size(size: int, scale: float) -> float:
    """``size * scale`` as Paddle computes the output size.  Paddle 3.3 keeps the
    ``scale`` attribute as doubles (1.4 reads back as 1.4); 3.0 to 3.2 keep floats (1.4
    reads back as 1.399999976...), whose product with the size is whole only in float32
    arithmetic, which is what Paddle's kernels use."""
    exact = size * scale
    if abs(exact - round(exact)) <= 1e-9 or float(np.float32(scale)) != scale:
        return exact
    return float(np.float32(size) * np.float32(scale))


def _interp_sized_in_graph(
    block: Any, op: Any, fmt: str, scale: list[int], replaced: dict[int, Any]
) -> None:
    """``op`` (an interpolation by whole ``scale`` factors) replaced by the same
    interpolation to the size ``shape(x)[spatial] * scale``, computed in the graph."""
    x = op.operand_source(0)
    attrs = op.attrs()
    before = {o.id() for o in block.ops}
    paddle.pir.set_insertion_point(op)
    first = 1 if fmt.endswith("C") and fmt != "NC" else 2
    spatial = paddle.slice(paddle.shape(x), [0], [first], [first + len(scale)])
    factors = paddle.assign(np.array(scale, np.int32))
    size = PIR_OPS.multiply(paddle.cast(spatial, "int32"), factors)
    fn = getattr(PIR_OPS, op.name().split(".", 1)[1])
    method = str(attrs.get("interp_method", ""))
    corners = bool(attrs.get("align_corners", False))
    new = fn(
        x, size, None, None, fmt, -1, -1, -1, [], method, corners, int(attrs.get("align_mode", 1))
    )
    copy_placement(block, op, before)
    old = op.result(0)
    replaced[old.id] = new
    old.replace_all_uses_with(new)
    block.remove_op(op)


def rewrite_interp_scale(block: Any) -> dict[int, Any]:
    """``interpolate(x, scale_factor=s)`` -> ``interpolate(x, size=in * s)``.

    paddle2onnx cannot read the ``scale`` attribute (stored as doubles, read as
    floats) and stops.  Paddle samples a scaled output at ``1 / s``; the size form
    samples at ``in / out``, which is the same number when ``in * s`` is a whole
    number.  On an unknown spatial size (a model converted with its dimensions open)
    a whole scale gives its size in the graph (``shape(x) * s``).  Any other case (a
    fractional ``in * s``, a fractional scale of an unknown size) is refused by name
    rather than approximated."""
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
        whole = all(s >= 1 and abs(s - round(s)) <= 1e-9 for s in scale)
        if bad and whole and len(scale) == len(spatial) and any(d < 0 for d in spatial):
            # An unknown size (a model converted with its dimensions open): the size
            # computed in the graph from the input's shape, ``in * s`` whole for any in.
            _interp_sized_in_graph(block, op, fmt, [round(s) for s in scale], replaced)
            continue
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
        copy_placement(block, op, before)
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
        # the converter's fixed window is exact, and so is its global pooling (a bin of
        # one over an unknown size: a model converted with its dimensions open)
        if all(
            (i >= 0 and o > 0 and i % o == 0) or (i < 0 and o == 1) for i, o in zip(in_hw, out_hw)
        ):
            continue
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
        copy_placement(block, op, before)
        old = op.result(0)
        replaced[old.id] = new
        old.replace_all_uses_with(new)
        block.remove_op(op)
        if size_op is not None and size_op.result(0).use_empty():
            block.remove_op(size_op)
    return replaced


def _dtype(value: Any) -> Any:
    """A value's dtype as Paddle's builders take it (``"float32"``)."""
    return dtype_name(value)


def _replace_results(block: Any, op: Any, new: list[Any], replaced: dict[int, Any]) -> None:
    for old, value in zip(op.results(), new):
        replaced[old.id] = value
        old.replace_all_uses_with(value)
    block.remove_op(op)


def rewrite_accuracy(block: Any) -> dict[int, Any]:
    """``accuracy(topk_values, topk_indices, label)`` -> the same count in operators
    that lower (paddle2onnx has no converter for it).

    Paddle's kernel counts the rows whose label is among the row's top-k indices and
    divides by the row count: ``any(indices == label, axis=1)``, summed, scaled by
    ``1 / N``; ``correct`` and ``total`` are that count and ``N``, in the dtypes the
    op declares.  A row count unknown at compile time is left to the converter
    (and refused by name there)."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.accuracy":
            continue
        indices, label = op.operand_source(1), op.operand_source(2)
        rows = shape_of(indices)[0] if shape_of(indices) else -1
        if rows <= 0:
            continue
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if len(shape_of(label)) != 2:
            label = paddle.reshape(label, [-1, 1])
        if dtype_name(label) != dtype_name(indices):
            label = paddle.cast(label, _dtype(indices))
        hits = paddle.cast(paddle.any(paddle.equal(indices, label), axis=1), "float32")
        correct = paddle.sum(hits)
        accuracy = paddle.scale(correct, 1.0 / rows)
        results = [accuracy, correct, paddle.full([], float(rows), "float32")]
        results = [
            r if dtype_name(r) == dtype_name(old) else paddle.cast(r, _dtype(old))
            for r, old in zip(results, op.results())
        ]
        copy_placement(block, op, before)
        _replace_results(block, op, results, replaced)
    return replaced


def rewrite_identity_loss(block: Any) -> dict[int, Any]:
    """``identity_loss(x, reduction)`` (it marks a loss; paddle2onnx has no converter)
    -> what it computes: ``sum(x)`` (0), ``mean(x)`` (1) or ``x`` (2), as Paddle's
    kernel does."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.identity_loss":
            continue
        x = op.operand_source(0)
        reduction = op_int_attr(op, "reduction") if op.has_attr("reduction") else 1
        if reduction not in (0, 1, 2):
            raise UnsupportedOpError(
                f"identity_loss with reduction={reduction}: 0 (sum), 1 (mean) or 2 (none)"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if reduction == 2 or not shape_of(x):
            new = x
        elif reduction == 0:
            new = paddle.sum(x)
        else:
            new = paddle.mean(x)
        copy_placement(block, op, before)
        _replace_results(block, op, [new], replaced)
    return replaced


def rewrite_losses(block: Any) -> dict[int, Any]:
    """Loss operators paddle2onnx has no converter for, spelled in operators it has,
    with the formulas of Paddle's CPU kernels:

    - ``mean_all(x)`` (``paddle.mean`` of a legacy program, 2.x's ``margin_rank_loss``)
      -> ``mean(x)`` over every axis;
    - ``bce_loss(x, label)`` -> ``(label - 1) * max(log(1 - x), -100) - label *
      max(log(x), -100)``;
    - ``kldiv_loss(x, label, reduction, log_target)`` -> ``exp(label) * (label - x)``
      (log_target) or ``label * (log(label) - x)`` where ``label > 0``, else 0; then
      the reduction (``mean``, ``sum``, ``batchmean``: the sum over the first
      dimension's size, ``none``)."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        name = op.name()
        if name not in ("pd_op.mean_all", "pd_op.bce_loss", "pd_op.kldiv_loss"):
            continue
        x = op.operand_source(0)
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        half = dtype_name(x) in ("float16", "bfloat16", "uint16")
        if half and name != "pd_op.mean_all":
            # Paddle's builders refuse float16 for some of the operators below (their
            # CPU kernels): computed in float32, the result cast back.
            x = paddle.cast(x, "float32")
        dtype = _dtype(x)
        if name == "pd_op.mean_all":
            new = paddle.mean(x) if shape_of(x) else x
        elif name == "pd_op.bce_loss":
            label = op.operand_source(1)
            if half:
                label = paddle.cast(label, "float32")
            floor = paddle.full([], -100.0, dtype)
            term1 = paddle.maximum(paddle.log(x), floor)
            term2 = paddle.maximum(paddle.log(paddle.scale(x, -1.0, 1.0)), floor)
            new = paddle.subtract(
                paddle.multiply(paddle.scale(label, 1.0, -1.0), term2),
                paddle.multiply(label, term1),
            )
        else:
            label = op.operand_source(1)
            if half:
                label = paddle.cast(label, "float32")
            attrs = op.attrs()
            reduction = str(attrs.get("reduction", "mean"))
            if bool(attrs.get("log_target", False)):
                loss = paddle.multiply(paddle.exp(label), paddle.subtract(label, x))
            else:
                positive = paddle.greater_than(label, paddle.zeros_like(label))
                safe = paddle.where(positive, label, paddle.ones_like(label))
                loss = paddle.where(
                    positive,
                    paddle.multiply(label, paddle.subtract(paddle.log(safe), x)),
                    paddle.zeros_like(label),
                )
            if reduction == "none":
                new = loss
            elif reduction == "sum":
                new = paddle.sum(loss)
            elif reduction == "mean":
                new = paddle.mean(loss)
            elif reduction == "batchmean" and shape_of(x) and shape_of(x)[0] > 0:
                new = paddle.scale(paddle.sum(loss), 1.0 / shape_of(x)[0])
            elif reduction == "batchmean" and not shape_of(x):
                new = paddle.sum(loss)
            else:
                raise UnsupportedOpError(
                    f"kldiv_loss with reduction={reduction!r} on an input of shape "
                    f"{list(shape_of(x))}: only 'none', 'sum', 'mean' and 'batchmean' "
                    "(with a known batch size) lower"
                )
        if half and name != "pd_op.mean_all":
            new = paddle.cast(new, _dtype(op.result(0)))
        copy_placement(block, op, before)
        _replace_results(block, op, [new], replaced)
    return replaced


def rewrite_half_helpers(block: Any) -> dict[int, Any]:
    """Float16 operators whose lowering writes a float16 Constant, on which paddle2onnx's
    Constant helper aborts the process (a legacy program cast by Paddle's
    ``cast_model_to_fp16`` holds them): ``assign(x)`` -> ``x`` (a copy, in a graph that
    writes nothing back); ``remainder`` -> computed in float32 (the float16 operands are
    exact there), cast back to float16."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        name = op.name()
        if name not in ("pd_op.assign", "pd_op.remainder"):
            continue
        if dtype_name(op.result(0)) not in ("float16", "bfloat16", "uint16"):
            continue
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if name == "pd_op.assign":
            new = op.operand_source(0)
        else:
            x, y = (paddle.cast(op.operand_source(i), "float32") for i in (0, 1))
            new = paddle.cast(paddle.remainder(x, y), _dtype(op.result(0)))
        copy_placement(block, op, before)
        _replace_results(block, op, [new], replaced)
    return replaced


def rewrite_log1p(block: Any) -> dict[int, Any]:
    """``log1p(x)`` -> ``log(u) * x / (u - 1)`` with ``u = 1 + x`` (``x`` where ``u ==
    1``): the converter writes ``log(1 + x)``, which loses the low digits of a small
    ``x`` (1e-5 relative off Paddle's ``std::log1p`` in float32); the quotient
    cancels the rounding of ``1 + x`` (Goldberg's formula) and stays within a few
    units in the last place."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.log1p":
            continue
        x = op.operand_source(0)
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        u = paddle.scale(x, 1.0, 1.0)
        d = paddle.scale(u, 1.0, -1.0)
        exact = paddle.equal(d, paddle.zeros_like(d))
        safe = paddle.where(exact, paddle.ones_like(d), d)
        new = paddle.where(exact, x, paddle.divide(paddle.multiply(paddle.log(u), x), safe))
        copy_placement(block, op, before)
        _replace_results(block, op, [new], replaced)
    return replaced


# Constant dtypes paddle2onnx's Constant helper aborts on (assign_value takes float32,
# float64, int32 and int64 only; full adds bool).
_ASSIGN_OK = frozenset({"float32", "float64", "int32", "int64"})
_FULL_OK = _ASSIGN_OK | {"bool"}


def rewrite_constants(block: Any) -> dict[int, Any]:
    """Constants of a dtype the converter's Constant helper cannot write (it aborts
    the process): ``assign_value`` of booleans, float16 (``paddle.assign`` of a bool
    array, a legacy program cast to float16), ``full`` of float16 -> the same
    constant in float32 (or int32 for integers and booleans), then a cast."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        name = op.name()
        if name not in ("pd_op.full", "pd_op.assign_value_", "pd_op.assign_value"):
            continue
        result = op.result(0)
        dtype = dtype_name(result)
        if dtype in (_FULL_OK if name == "pd_op.full" else _ASSIGN_OK):
            continue
        attrs = op.attrs()
        shape = [int(d) for d in attrs.get("shape", [])]
        wide: Any = "float32" if dtype in ("float16", "bfloat16", "uint16") else "int32"
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if name == "pd_op.full":
            value = paddle.full(shape, float(attrs.get("value", 0.0)), wide)
        else:
            values = np.asarray([float(v) for v in attrs.get("values", [])], dtype=np.float64)
            value = paddle.assign(values.astype(wide).reshape(shape))
        new = paddle.cast(value, _dtype(result))
        copy_placement(block, op, before)
        operands = [v for v in op.operands_source() if v is not None]
        _replace_results(block, op, [new], replaced)
        for source in operands:  # assign_value_'s in-place target, now unread
            producer = source.get_defining_op()
            if producer is not None and source.use_empty() and producer.num_results() == 1:
                block.remove_op(producer)
    return replaced


_IN_PLACE_WRITES = frozenset({"pd_op.set_value_with_tensor_", "pd_op.set_value_"})


def rewrite_in_place_reads(block: Any, nested: bool = False) -> dict[int, Any]:
    """After an in-place write (``x[:, i:i + 1] = v``: ``set_value_with_tensor_``), the
    operators of the block that read ``x`` read the written value instead.

    Paddle's executor writes into ``x``'s memory, so a loop body that yields ``x`` (its
    state, which Python's ``x[...] = v`` leaves bound to the old value) yields what was
    written; ONNX has no memory to write into, and the yield would hand the next
    iteration the state from before the write."""
    ops = list(block.ops)
    own = {r.id for o in ops for r in o.results()} | {a.id for a in block.args()}
    for pos, op in enumerate(ops):
        if op.name() not in _IN_PLACE_WRITES:
            continue
        source, written = op.operand_source(0), op.result(0)
        if nested and source.id not in own:
            raise UnsupportedOpError(
                f"{op.name()} in the block of a while or if writes into a value of the "
                "program around it (a buffer the loop does not carry, written in place at "
                "each step): ONNX's loop has no memory to write into; carry the buffer "
                "through the loop (pass it in the loop's variables and return it)"
            )
        later = {o.id() for o in ops[pos + 1 :]}
        for user in list(source.all_used_ops()):
            if user.id() not in later:
                continue
            for k in range(user.num_operands()):
                if user.operand_source(k).id == source.id:
                    user.operand(k).set_source(written)
    return {}


def rewrite_loop_operands(block: Any) -> dict[int, Any]:
    """Each loop-carried operand of a ``pd_op.while`` -> a copy of its own (``assign``).

    The converter names the Loop body's inputs after the operands the loop starts
    from: a body that also reads the first operand's value itself (``h = f(h) + x``
    started from ``h = x``), or a value carried twice, would read the body's input
    where it meant the program's value.  A copy has a name only the loop uses."""
    for op in list(block.ops):
        if op.name() != "pd_op.while":
            continue
        paddle.pir.set_insertion_point(op)
        for k in range(1, op.num_operands()):
            source = op.operand_source(k)
            if is_real(source) and source.is_dense_tensor_type():
                op.operand(k).set_source(PIR_OPS.assign(source))
    return {}


def rewrite_for_converter(block: Any, nested: bool = False, padded: Any = None) -> dict[int, Any]:
    """Every rewrite above (and those of :mod:`.index_rewrites`), on ``block`` and on
    the blocks of its control-flow operators; returns old value id -> new value.
    ``padded``: a LoD layout's sequences (:class:`.sequence_rewrites.Padded`)."""
    replaced = _rewrite_block(block, nested, padded)
    for op in list(block.ops):
        for inner in op.blocks():
            replaced.update(rewrite_for_converter(inner, nested=True))
    return replaced


def _rewrite_block(block: Any, nested: bool, padded: Any = None) -> dict[int, Any]:
    rewrite_in_place_reads(block, nested)
    with insertion_guard():
        # first: Paddle 1.x's sequence operators, in operators the rest rewrite further
        replaced = rewrite_gru(block, nested, padded)
        replaced.update(rewrite_crf_decoding(block, padded))
        # these add reductions over all axes, which the next one spells out
        replaced.update(rewrite_identity_loss(block))
        replaced.update(rewrite_losses(block))
        replaced.update(rewrite_empty_axis_reductions(block))
        replaced.update(rewrite_softplus(block))
        replaced.update(rewrite_interp_scale(block))
        replaced.update(rewrite_adaptive_pools(block))
        replaced.update(rewrite_accuracy(block))
        replaced.update(rewrite_constants(block))
        replaced.update(rewrite_log1p(block))
        replaced.update(rewrite_half_helpers(block))
        replaced.update(rewrite_repeat_interleave(block))
        replaced.update(rewrite_tile_rank(block))
        replaced.update(rewrite_set_value(block))
        replaced.update(rewrite_set_value_with_tensor(block))
        replaced.update(rewrite_unfold(block))
        replaced.update(rewrite_loop_operands(block))
    return replaced
