"""Which Paddle operators lower to ONNX, and the check run before lowering.

paddle2onnx registers its converters under the legacy (Paddle 2.x) operator
names (``matmul_v2``, ``reduce_mean``, ``elementwise_add``...), while a PIR
program names them ``pd_op.matmul``, ``pd_op.mean``, ``pd_op.add``.  The table
below translates a PIR name to the converter name the way paddle2onnx 2.1 does
internally, so the whole program can be checked up front and every offending
operator reported at once, instead of letting the converter abort the process
on the first one it meets.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from paddle_ipu._internals import p2o_api
from paddle_ipu.errors import CompileError, UnsupportedOpError

# PIR operator (without its dialect prefix) -> paddle2onnx converter name, where
# the two differ.
_PIR_TO_CONVERTER: dict[str, str] = {
    "add": "elementwise_add",
    "add_n": "sum",
    "all": "reduce_all",
    "any": "reduce_any",
    "arange": "range",
    "argmax": "arg_max",
    "argmin": "arg_min",
    "assign_value_": "assign_value",
    "batch_norm_": "batch_norm",
    "divide": "elementwise_div",
    "expand": "expand_v2",
    "flatten": "flatten_contiguous_range",
    "floor_divide": "elementwise_floordiv",
    "grid_sample": "grid_sampler",
    "hardsigmoid": "hard_sigmoid",
    "hardswish": "hard_swish",
    "matmul": "matmul_v2",
    "max": "reduce_max",
    "maximum": "elementwise_max",
    "mean": "reduce_mean",
    "min": "reduce_min",
    "minimum": "elementwise_min",
    "multiply": "elementwise_mul",
    "nonzero": "where_index",
    "numel": "size",
    "prod": "reduce_prod",
    "remainder": "elementwise_mod",
    "repeat_interleave_with_tensor_index": "repeat_interleave",
    "subtract": "elementwise_sub",
    "sum": "reduce_sum",
    "topk": "top_k_v2",
    "unsqueeze": "unsqueeze2",
}

# Operators paddle2onnx has no converter for that the program rewrites
# (paddle_ipu.compiler.program_rewrites) spell in operators it has, before the check.
REWRITTEN = frozenset(
    {"accuracy", "identity_loss", "mean_all", "bce_loss", "kldiv_loss", "gru", "crf_decoding"}
)

# Control flow: the converter lowers a ``pd_op.while`` to an ONNX Loop and a
# ``pd_op.if`` to an ONNX If, the operators of their blocks converted into the
# Loop's body and the If's branches (each checked as an operator of its own:
# OpUse.nested).
CONTROL_FLOW = frozenset({"pd_op.while", "pd_op.if"})

# Operators that carry the program's structure rather than computing anything:
# the converter handles them itself.
STRUCTURAL_OPS = frozenset(
    {"builtin.parameter", "pd_op.data", "pd_op.feed", "pd_op.fetch", "cf.yield"}
)

_NMS = (
    "non-maximum suppression keeps a number of boxes that depends on the data, and the IPU "
    "compiles static shapes (a saved model run through paddle_ipu.inference or a "
    "package runs it on the host after the compiled graph; a program compiled here does "
    "not): export the detector without it -- PaddleDetection's exporter takes "
    "-o exclude_nms=True -- and run NMS on the boxes and scores it then returns, after the "
    "predictor (on the CPU: paddle.vision.ops.nms, or Paddle's multiclass_nms3 kernel)"
)

# Operators paddle2onnx converts but that do not compile or do not match
# Paddle's CPU kernel (found by tests/conformance); refused up front.
_DATA_SIZED = (
    "its output size depends on the data; the IPU needs static shapes (a saved PIR or "
    "legacy model run through paddle_ipu.inference or a package runs it, and what follows "
    "it, on the host after the compiled graph)"
)

DENIED: dict[str, str] = {
    "unique": _DATA_SIZED,
    "nonzero": _DATA_SIZED,
    "masked_select": _DATA_SIZED,
    "repeat_interleave_with_tensor_index": (
        "its output size depends on the repeats tensor; the IPU needs static shapes"
    ),
    # Detection's post-processing (the data-dependent tail of an exported detector)
    **dict.fromkeys(("multiclass_nms3", "multiclass_nms", "matrix_nms", "nms"), _NMS),
}

# PIR operators the program rewrites (compiler.program_rewrites) replace before
# conversion, listed as supported although their converter spelling is denied
# (repeat_interleave with an int of repeats; the tensor form is refused).
REWRITTEN_OPS = frozenset({"repeat_interleave"})

_CONVS = frozenset(
    {
        "pd_op.conv2d", "pd_op.depthwise_conv2d", "pd_op.conv2d_transpose",
        "pd_op.depthwise_conv2d_transpose", "pd_op.conv3d", "pd_op.conv3d_transpose",
    }
)  # fmt: skip


_MASK_POOLS = frozenset({"pd_op.max_pool2d_with_index", "pd_op.max_pool3d_with_index"})


def attribute_problem(op: str, attrs: dict[str, Any], results_used: Sequence[bool] = ()) -> str:
    """Why ``op`` with these attribute values cannot be lowered ("" when it can)."""
    if op in _MASK_POOLS and len(results_used) > 1 and results_used[1]:
        return "its mask (return_mask=True) has no static shape after conversion"
    if op == "pd_op.pad3d" and attrs.get("mode") not in ("constant", "reflect", "replicate"):
        return f"mode={attrs.get('mode')!r} (constant, reflect and replicate lower)"
    if op in _CONVS:
        fmt = attrs.get("data_format", "NCHW")
        if fmt in ("NHWC", "NDHWC"):
            return f"data_format={fmt!r} (the converter handles channels-first only)"
        dil = attrs.get("dilations", [1])
        if attrs.get("padding_algorithm") == "SAME" and any(int(d) != 1 for d in dil):
            return f"padding='SAME' with dilations={list(dil)} (the converter needs dilation 1)"
    return ""


# Converter names whose PIR spelling is not simply the name itself, for the
# reverse direction (reports list PIR names).
_CONVERTER_TO_PIR: dict[str, str] = {v: k for k, v in _PIR_TO_CONVERTER.items()}


def converter_name(pir_op: str) -> str:
    """The converter name of a PIR operator (``pd_op.mean`` -> ``reduce_mean``)."""
    if pir_op.startswith("pd_op."):
        short = pir_op[len("pd_op.") :]
    elif pir_op.startswith("builtin."):
        short = "builtin_" + pir_op[len("builtin.") :]
    else:
        short = pir_op
    return _PIR_TO_CONVERTER.get(short, short)


@functools.lru_cache(maxsize=1)
def converter_ops() -> frozenset[str]:
    """The converter names paddle2onnx registers for PIR programs."""
    try:
        return p2o_api.supported_ops()
    except RuntimeError as exc:  # its package import can sys.exit; never let it
        raise CompileError(str(exc)) from None


def _pir_name(converter: str) -> str:
    if converter.startswith("builtin_"):
        return "builtin." + converter[len("builtin_") :]
    return _CONVERTER_TO_PIR.get(converter, converter)


def supported_ops() -> list[str]:
    """The Paddle operators (PIR names, without the ``pd_op.`` prefix) that lower.

    Both the PIR spelling and, where it differs, the converter's legacy spelling
    are listed, so either name can be looked up.
    """
    names: set[str] = set()
    for conv in converter_ops():
        names.add(conv)
        names.add(_pir_name(conv))
    names |= REWRITTEN
    denied = set(DENIED) | {_PIR_TO_CONVERTER.get(n, n) for n in DENIED}
    names = {n for n in names if not n.startswith("builtin.") and n not in denied}
    return sorted(names | REWRITTEN_OPS)


def _short(pir_op: str) -> str:
    return pir_op[len("pd_op.") :] if pir_op.startswith("pd_op.") else pir_op


def is_supported(pir_op: str) -> bool:
    if pir_op in STRUCTURAL_OPS or pir_op in CONTROL_FLOW:
        return True
    if _short(pir_op) in DENIED:
        return False
    return _short(pir_op) in REWRITTEN or converter_name(pir_op) in converter_ops()


def refusal(use: OpUse) -> str:
    """Why this use of an operator is refused ("" when it lowers)."""
    if use.op in STRUCTURAL_OPS or use.op in CONTROL_FLOW:
        return ""
    reason = DENIED.get(_short(use.op))
    if reason:
        return reason
    if converter_name(use.op) not in converter_ops():
        return "paddle2onnx has no converter for it"
    return attribute_problem(use.op, use.attrs, use.results_used)


@dataclass
class OpUse:
    """Where an operator sits in the program, for error messages."""

    index: int
    op: str
    operands: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    feeds_fetches: list[str] = field(default_factory=list)
    # The operator's attributes (plain Python values), for the attribute checks
    # and the corrections made after lowering.
    attrs: dict[str, Any] = field(default_factory=dict)
    # Where each operand comes from: ``(producer index, result index)`` for the
    # result of another forward operator, else the ONNX name (a feed or a
    # parameter), or None for an optional operand left empty.
    sources: list[tuple[int, int] | str | None] = field(default_factory=list)
    # (numpy dtype, shape) of each operand and result; None where it is not a
    # dense tensor (a list operand, an empty optional one).
    operand_types: list[tuple[str, tuple[int, ...]] | None] = field(default_factory=list)
    result_types: list[tuple[str, tuple[int, ...]] | None] = field(default_factory=list)
    # Whether anything (another operator or a fetch) reads each result.
    results_used: list[bool] = field(default_factory=list)
    # A control-flow operator's (CONTROL_FLOW) blocks' operators, in program order.
    nested: list[OpUse] = field(default_factory=list)
    # For an operator of such a block: the control-flow operator it is in.
    inside: str = ""

    def describe(self) -> str:
        where = f" (in the block of {self.inside})" if self.inside else ""
        text = f"op #{self.index}{where} {self.op}({', '.join(self.operands)})"
        if self.results:
            text += f" -> {', '.join(self.results)}"
        if self.feeds_fetches:
            text += f"; used by fetch {', '.join(self.feeds_fetches)}"
        return text


def _with_nested(uses: Iterable[OpUse]) -> Iterator[OpUse]:
    for use in uses:
        yield use
        yield from _with_nested(use.nested)


def check_supported(uses: Iterable[OpUse]) -> None:
    """Raise one UnsupportedOpError naming every operator that does not lower."""
    bad: dict[str, list[tuple[OpUse, str]]] = {}
    for use in _with_nested(uses):
        why = refusal(use)
        if why:
            bad.setdefault(use.op, []).append((use, why))
    if not bad:
        return
    lines = [
        f"{len(bad)} Paddle operator type(s) cannot be lowered to ONNX ({', '.join(sorted(bad))}):"
    ]
    for name in sorted(bad):
        for use, why in bad[name]:
            lines.append(f"  {use.describe()}: {why}")
    lines.append(
        "Rewrite these parts of the model with supported operators "
        "(see paddle_ipu.compiler.supported_ops())."
    )
    raise UnsupportedOpError("\n".join(lines))


# The operands that set the size of an operator's result (by position: PIR's input
# names, e.g. tile's ``repeat_times``).  The IPU needs static shapes: these must come
# from constants and from shapes (which the compile makes static from the feeds'),
# never from a feed's values.
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "pd_op.tile": (1,),  # repeat_times
    "pd_op.expand": (1,),  # shape
    "pd_op.reshape": (1,),  # shape
    "pd_op.full_with_tensor": (1,),  # shape
    "pd_op.slice": (1, 2),  # starts, ends
    "pd_op.strided_slice": (1, 2, 3),  # starts, ends, strides
    "pd_op.arange": (0, 1, 2),  # start, end, step
    "pd_op.split": (1, 2),  # sections, axis
    "pd_op.split_with_num": (1,),  # axis
    "pd_op.pad3d": (1,),  # paddings
    "pd_op.squeeze": (1,),  # axis
    "pd_op.unsqueeze": (1,),  # axis
    "pd_op.one_hot": (1,),  # num_classes
    "pd_op.topk": (1,),  # k
    "pd_op.linspace": (2,),  # num
    "pd_op.linear_interp": (1, 2, 3),  # out_size, size_tensor, scale_tensor
    "pd_op.bilinear_interp": (1, 2, 3),
    "pd_op.trilinear_interp": (1, 2, 3),
    "pd_op.nearest_interp": (1, 2, 3),
    "pd_op.bicubic_interp": (1, 2, 3),
}
# Operators whose results carry only the shape of their operand, never its values.
_SHAPE_OF = frozenset({"pd_op.shape", "pd_op.shape64"})


def data_dependent_shapes(uses: Sequence[OpUse], feeds: Collection[str]) -> list[str]:
    """One line per operand of :data:`SHAPE_OPERANDS` computed from a feed's values,
    naming the operator, the operand and the feeds it comes from."""
    from_feeds: list[frozenset[str]] = []  # per operator: the feeds its results read
    problems: list[str] = []
    for use in uses:
        reads: list[frozenset[str]] = []
        for src in use.sources:
            if isinstance(src, tuple):
                reads.append(from_feeds[src[0]] if 0 <= src[0] < len(from_feeds) else frozenset())
            elif isinstance(src, str) and src in feeds:
                reads.append(frozenset({src}))
            else:  # a parameter, an empty optional operand
                reads.append(frozenset())
        for k in SHAPE_OPERANDS.get(use.op, ()):
            if k < len(reads) and reads[k]:
                operand = use.operands[k] if k < len(use.operands) else f"#{k}"
                problems.append(
                    f"  {use.describe()}: operand {k} ({operand}) is computed from the values "
                    f"of feed {', '.join(repr(f) for f in sorted(reads[k]))}, so the result's "
                    "shape depends on the data"
                )
        if use.op in _SHAPE_OF:
            from_feeds.append(frozenset())
        else:
            from_feeds.append(frozenset().union(*reads))
    return problems


def check_static_shapes(uses: Sequence[OpUse], feeds: Collection[str]) -> None:
    """Raise UnsupportedOpError, before any conversion, when an operator's result
    size depends on a feed's values (see :data:`SHAPE_OPERANDS`)."""
    problems = data_dependent_shapes(uses, feeds)
    if problems:
        raise UnsupportedOpError(
            "the size of these results depends on the data fed, but the IPU needs static "
            "shapes:\n"
            + "\n".join(problems)
            + "\nCompute these sizes from constants or from shapes (paddle.shape), not from "
            "the feeds' values."
        )


def unsupported(names: Sequence[str]) -> list[str]:
    """The subset of ``names`` (PIR operator names) that do not lower."""
    return [n for n in names if not is_supported(n)]
