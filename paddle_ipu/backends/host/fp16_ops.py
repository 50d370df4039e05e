"""Operators whose float16 arithmetic on the IPU has steps of its own, rewritten into
ONNX operators with the IPU's roundings between them (see :mod:`.numerics` for where
each rule comes from).

- ``Softmax`` (opset 13 and later): popnn's stable softmax.
- ``LayerNormalization``, ``InstanceNormalization``, ``GroupNormalization``:
  poplin's ``normStatistics`` (float32 sums, the mean and inverse standard deviation
  rounded) then ``normWhiten`` and ``normalise`` (four rounded steps).
  ``enable_stable_norm`` subtracts the mean before the squares (poplin's stable
  algorithm, ``x - mean`` rounded).
- ``MatMul``, ``Gemm``: with float16 partials, sums of :data:`~.numerics.AMP_PASS`
  products accumulated into a float16 partial, one rounding per pass; ``Gemm``'s
  ``alpha`` / ``beta`` / ``C`` as PopART's Gemm decomposition (matmul, scale, add).
- ``Conv``, ``ConvTranspose``: with float16 partials, the input channels in passes of
  :data:`~.numerics.AMP_PASS`; a bias operand is added after, as PopART's ConvBias
  pattern does.

Each rewrite replaces the node with nodes of the same outputs, rounding the last one;
:func:`rewrite` returns False for a node it leaves as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from paddle_ipu.backends.host.numerics import AMP_PASS, Fp16Arithmetic
from paddle_ipu.backends.host.onnx_edit import Editor
from paddle_ipu.errors import NotSupportedError


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def rewrite(
    ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic, *, stable_norm: bool = False
) -> bool:
    """Emit ``node`` as the IPU computes it, if it is one of the operators above."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return False
    if op == "Softmax" and ed.opset >= 13:
        _softmax(ed, node, arith)
        return True
    if op in ("LayerNormalization", "InstanceNormalization", "GroupNormalization"):
        _norm(ed, node, arith, stable_norm)
        return True
    if op == "Gemm":
        _gemm(ed, node, arith)
        return True
    if op == "MatMul" and arith.half_partials_matmul:
        out = _matmul_half(ed, node.input[0], node.input[1], node.name or node.output[0], arith)
        ed.emit("Identity", [out], node.output[0], out=node.output[0])
        ed.rounded.add(node.output[0])
        return True
    if op in ("Conv", "ConvTranspose") and (arith.half_partials_conv or len(node.input) > 2):
        _conv(ed, node, arith)
        return True
    return False


def _softmax(ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic) -> None:
    x, y = node.input[0], node.output[0]
    axis = int(_attrs(node).get("axis", -1))  # type: ignore[call-overload]
    base = node.name or y
    peak = ed.reduce("ReduceMax", x, [axis], f"{base}.max")
    shifted = ed.round_to(ed.emit("Sub", [x, peak], f"{base}.sub"), f"{base}.sub", arith)
    exp = ed.round_to(ed.emit("Exp", [shifted], f"{base}.exp"), f"{base}.exp", arith, bounded=True)
    total = ed.reduce("ReduceSum", exp, [axis], f"{base}.sum")  # float32 partials
    inverse = ed.round_to(ed.emit("Reciprocal", [total], f"{base}.inv"), f"{base}.inv", arith)
    ed.round_to(ed.emit("Mul", [exp, inverse], f"{base}.mul"), base, arith, out=y, bounded=True)


def _shape(ed: Editor, name: str, node: onnx.NodeProto) -> tuple[int, ...]:
    shape = ed.shapes.get(name)
    if shape is None:
        raise NotSupportedError(
            f"the IPU's float16 arithmetic of {node.op_type} node {node.name!r} needs the "
            f"static shape of {name!r}, which shape inference did not give"
        )
    return shape


def _norm(ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic, stable: bool) -> None:
    """poplin's statistics, whitening and affine step, as LayerNormalization /
    InstanceNormalization / GroupNormalization compute them."""
    op = node.op_type
    attrs = _attrs(node)
    x, y = node.input[0], node.output[0]
    base = node.name or y
    shape = _shape(ed, x, node)
    rank = len(shape)
    eps = float(attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
    work = x
    if op == "LayerNormalization":
        axis = int(attrs.get("axis", -1))  # type: ignore[call-overload]
        axis = axis + rank if axis < 0 else axis
        axes = list(range(axis, rank))
        param_shape: tuple[int, ...] | None = None
    elif op == "InstanceNormalization":
        axes = list(range(2, rank))
        param_shape = (shape[1],) + (1,) * (rank - 2)
    else:  # GroupNormalization: [N, G, C/G * spatial]
        groups = int(attrs["num_groups"])  # type: ignore[call-overload]
        work = ed.emit("Reshape", [x, ed.ints([shape[0], groups, -1], f"{base}.g")], f"{base}.g")
        axes = [2]
        param_shape = (shape[1],) + (1,) * (rank - 2)
    if op == "GroupNormalization":
        count = shape[1] // int(attrs["num_groups"]) * _prod(shape[2:])  # type: ignore[call-overload]
    else:
        count = _prod([shape[a] for a in axes])
    n = ed.limit(float(count))
    mean_f = ed.emit("Div", [ed.reduce("ReduceSum", work, axes, f"{base}.sum"), n], f"{base}.m")
    mean = ed.round_to(mean_f, f"{base}.mean", arith, bounded=True)
    centred = ed.round_to(ed.emit("Sub", [work, mean], f"{base}.c"), f"{base}.centred", arith)
    if stable:
        square = ed.emit("Mul", [centred, centred], f"{base}.sq")
        var = ed.emit("Div", [ed.reduce("ReduceSum", square, axes, f"{base}.ss"), n], base)
    else:
        square = ed.emit("Mul", [work, work], f"{base}.sq")
        power = ed.emit("Div", [ed.reduce("ReduceSum", square, axes, f"{base}.ss"), n], base)
        var = ed.emit("Sub", [power, ed.emit("Mul", [mean, mean], f"{base}.m2")], f"{base}.v")
    std = ed.emit("Sqrt", [ed.emit("Add", [var, ed.limit(eps)], f"{base}.ve")], f"{base}.sd")
    inv = ed.round_to(ed.emit("Reciprocal", [std], f"{base}.isd"), f"{base}.isd", arith)
    white = ed.round_to(ed.emit("Mul", [centred, inv], f"{base}.w"), f"{base}.white", arith)
    if op == "GroupNormalization":
        white = ed.emit("Reshape", [white, ed.ints(shape, f"{base}.s")], f"{base}.back")
    scale = node.input[1] if len(node.input) > 1 else ""
    bias = node.input[2] if len(node.input) > 2 else ""
    if param_shape is not None:
        if scale:
            scale = ed.emit("Reshape", [scale, ed.ints(param_shape, f"{base}.p")], f"{base}.ga")
        if bias:
            bias = ed.emit("Reshape", [bias, ed.ints(param_shape, f"{base}.p")], f"{base}.be")
    out = white
    if scale:
        last = not bias
        out = ed.round_to(
            ed.emit("Mul", [out, scale], f"{base}.gamma"), base, arith, out=y if last else None
        )
    if bias:
        out = ed.round_to(ed.emit("Add", [out, bias], f"{base}.beta"), base, arith, out=y)
    if out != y:
        ed.emit("Identity", [out], base, out=y)
        ed.rounded.add(y)


def _prod(values: Sequence[int]) -> int:
    total = 1
    for v in values:
        total *= int(v)
    return total


def _accumulate(ed: Editor, parts: list[str], base: str, arith: Fp16Arithmetic) -> str:
    """A float16 partial: each pass's float32 sum added to it, rounded."""
    acc = ed.round_to(parts[0], f"{base}.acc", arith)
    for part in parts[1:]:
        acc = ed.round_to(ed.emit("Add", [acc, part], f"{base}.acc"), f"{base}.acc", arith)
    return acc


def _matmul_half(ed: Editor, a: str, b: str, base: str, arith: Fp16Arithmetic) -> str:
    """``a @ b`` with float16 partials; returns the rounded result."""
    sa, sb = ed.shapes.get(a), ed.shapes.get(b)
    if sa is None or sb is None or len(sa) < 2 or len(sb) < 2:
        raise NotSupportedError(
            f"float16 partials of MatMul {base!r} need static shapes of rank 2 or more for "
            f"both operands; shape inference gave {sa} and {sb}"
        )
    k = sa[-1]
    if k <= AMP_PASS:
        return ed.round_to(ed.emit("MatMul", [a, b], f"{base}.mm"), base, arith)
    passes = -(-k // AMP_PASS)
    pad = passes * AMP_PASS - k
    if pad:  # zero products change no sum
        zeros_a = [0] * (2 * len(sa))
        zeros_a[len(sa) - 1 + len(sa)] = pad
        a = ed.emit("Pad", [a, ed.ints(zeros_a, f"{base}.pa")], f"{base}.pa")
        zeros_b = [0] * (2 * len(sb))
        zeros_b[len(sb) - 2 + len(sb)] = pad
        b = ed.emit("Pad", [b, ed.ints(zeros_b, f"{base}.pb")], f"{base}.pb")
    # a: [..., M, K] -> [..., P, M, 16]; b: [..., K, N] -> [..., P, 16, N]
    ra = ed.emit("Reshape", [a, ed.ints([*sa[:-1], passes, AMP_PASS], f"{base}.ra")], base)
    rank = len(sa) + 1
    perm = [*range(rank - 3), rank - 2, rank - 3, rank - 1]
    ta = ed.emit("Transpose", [ra], f"{base}.ta", perm=perm)
    rb = ed.emit("Reshape", [b, ed.ints([*sb[:-2], passes, AMP_PASS, sb[-1]], f"{base}.rb")], base)
    sums = ed.emit("MatMul", [ta, rb], f"{base}.passes")  # [..., P, M, N], float32 partials
    axis = max(rank, len(sb) + 1) - 3
    parts = [ed.name(f"{base}.pass") for _ in range(passes)]
    ed.nodes.append(
        helper.make_node("Split", [sums], parts, name=ed.node_name(base, "Split"), axis=axis)
        if ed.opset < 13
        else helper.make_node(
            "Split",
            [sums, ed.ints([1] * passes, f"{base}.split")],
            parts,
            name=ed.node_name(base, "Split"),
            axis=axis,
        )
    )
    for p in parts:
        ed.types[p] = onnx.TensorProto.FLOAT
    acc = _accumulate(ed, parts, base, arith)
    squeeze_axes = ed.ints([axis], f"{base}.sq")
    if ed.opset >= 13:
        return ed.emit("Squeeze", [acc, squeeze_axes], f"{base}.out")
    return ed.emit("Squeeze", [acc], f"{base}.out", axes=[axis])


def _gemm(ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic) -> None:
    attrs = _attrs(node)
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 else ""
    y = node.output[0]
    base = node.name or y
    if attrs.get("transA"):
        a = ed.emit("Transpose", [a], f"{base}.at", perm=[1, 0])
        sa = ed.shapes.get(node.input[0])
        if sa:
            ed.shapes[a] = sa[::-1]
    if attrs.get("transB"):
        b = ed.emit("Transpose", [b], f"{base}.bt", perm=[1, 0])
        sb = ed.shapes.get(node.input[1])
        if sb:
            ed.shapes[b] = sb[::-1]
    if arith.half_partials_matmul:
        out = _matmul_half(ed, a, b, base, arith)
    else:
        out = ed.round_to(ed.emit("MatMul", [a, b], f"{base}.mm"), f"{base}.mm", arith)
    alpha = float(attrs.get("alpha", 1.0))  # type: ignore[arg-type]
    beta = float(attrs.get("beta", 1.0))  # type: ignore[arg-type]
    if alpha != 1.0:
        out = ed.round_to(ed.emit("Mul", [out, ed.limit(alpha)], f"{base}.alpha"), base, arith)
    if c:
        if beta != 1.0:
            c = ed.round_to(ed.emit("Mul", [c, ed.limit(beta)], f"{base}.beta"), base, arith)
        out = ed.round_to(ed.emit("Add", [out, c], f"{base}.c"), base, arith)
    ed.emit("Identity", [out], base, out=y)
    ed.rounded.add(y)


def _conv(ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic) -> None:
    """A convolution (or transposed one) with float16 partials and / or a bias."""
    attrs = {a.name: a for a in node.attribute}
    x, w = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 else ""
    y = node.output[0]
    base = node.name or y
    transposed = node.op_type == "ConvTranspose"
    group = int(_attrs(node).get("group", 1))  # type: ignore[call-overload]
    sx, sw = ed.shapes.get(x), ed.shapes.get(w)
    # input channels per group: W is [M, C/g, k...] (Conv) or [C, M/g, k...] (ConvTranspose)
    per_group = None
    if sx is not None:
        per_group = sx[1] // group
    conv_attrs = [a for name, a in attrs.items()]
    if not arith.half_partials_conv or per_group is None or per_group <= AMP_PASS:
        if arith.half_partials_conv and per_group is None:
            raise NotSupportedError(
                f"float16 partials of {node.op_type} {base!r} need the static shape of its "
                f"input {x!r}, which shape inference did not give"
            )
        out = _conv_node(ed, node.op_type, [x, w], conv_attrs, base)
        out = ed.round_to(out, base, arith)
    else:
        if sw is None:
            raise NotSupportedError(f"float16 partials of {base!r} need the shape of {w!r}")
        parts = []
        for start in range(0, per_group, AMP_PASS):
            stop = min(start + AMP_PASS, per_group)
            channels = [g * per_group + c for g in range(group) for c in range(start, stop)]
            xs = ed.emit("Gather", [x, ed.ints(channels, f"{base}.ch")], f"{base}.x", axis=1)
            if transposed:  # W [C, M/g, k...]: the input channels are W's first axis
                ws = ed.emit("Gather", [w, ed.ints(channels, f"{base}.wch")], f"{base}.w", axis=0)
            else:
                bounds = [ed.ints([start], f"{base}.s0"), ed.ints([stop], f"{base}.s1")]
                ws = ed.emit("Slice", [w, *bounds, ed.ints([1], f"{base}.ax")], f"{base}.w")
            parts.append(_conv_node(ed, node.op_type, [xs, ws], conv_attrs, f"{base}.pass"))
        out = _accumulate(ed, parts, base, arith)
    if bias:
        rank = len(sx) if sx is not None else 4
        shaped = ed.emit("Reshape", [bias, ed.ints([1, -1] + [1] * (rank - 2), f"{base}.b")], base)
        out = ed.round_to(ed.emit("Add", [out, shaped], f"{base}.bias"), base, arith)
    ed.emit("Identity", [out], base, out=y)
    ed.rounded.add(y)


def _conv_node(
    ed: Editor, op: str, inputs: list[str], attrs: list[onnx.AttributeProto], base: str
) -> str:
    out = ed.name(f"{base}.out")
    node = helper.make_node(op, inputs, [out], name=ed.node_name(base, op))
    node.attribute.extend(attrs)
    ed.nodes.append(node)
    ed.types[out] = onnx.TensorProto.FLOAT
    return out
