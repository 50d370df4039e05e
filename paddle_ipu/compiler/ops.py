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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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

# Operators that carry the program's structure rather than computing anything:
# the converter handles them itself.
STRUCTURAL_OPS = frozenset(
    {"builtin.parameter", "pd_op.data", "pd_op.feed", "pd_op.fetch", "cf.yield"}
)

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
        from paddle2onnx import paddle2onnx_cpp2py_export as p2o
    except BaseException as exc:  # its package import can sys.exit; never let it
        raise CompileError(f"paddle2onnx is not usable: {exc!r}") from None
    return frozenset(str(name) for name in p2o.get_all_supported_operators_pir())


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
    return sorted(n for n in names if not n.startswith("builtin."))


def is_supported(pir_op: str) -> bool:
    if pir_op in STRUCTURAL_OPS:
        return True
    return converter_name(pir_op) in converter_ops()


@dataclass
class OpUse:
    """Where an operator sits in the program, for error messages."""

    index: int
    op: str
    operands: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    feeds_fetches: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = f"op #{self.index} {self.op}({', '.join(self.operands)})"
        if self.results:
            text += f" -> {', '.join(self.results)}"
        if self.feeds_fetches:
            text += f"; used by fetch {', '.join(self.feeds_fetches)}"
        return text


def check_supported(uses: Iterable[OpUse]) -> None:
    """Raise one UnsupportedOpError naming every operator that does not lower."""
    bad: dict[str, list[OpUse]] = {}
    for use in uses:
        if not is_supported(use.op):
            bad.setdefault(use.op, []).append(use)
    if not bad:
        return
    lines = [
        f"{len(bad)} Paddle operator type(s) cannot be lowered to ONNX by paddle2onnx "
        f"({', '.join(sorted(bad))}):"
    ]
    for name in sorted(bad):
        for use in bad[name]:
            lines.append("  " + use.describe())
    lines.append(
        "Rewrite these parts of the model with supported operators "
        "(see paddle_ipu.compiler.supported_ops())."
    )
    raise UnsupportedOpError("\n".join(lines))


def unsupported(names: Sequence[str]) -> list[str]:
    """The subset of ``names`` (PIR operator names) that do not lower."""
    return [n for n in names if not is_supported(n)]
