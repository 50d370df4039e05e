"""Write docs/supported_ops.md from the operator conformance suite's results.

Runs the table of tests/conformance (every supported operator, over its
attributes, against Paddle's CPU kernel in fp32 and fp16), and writes the
outcome of every case, the operators refused and why, and the operators of
Paddle 2.x's in-tree IPU support set beside them.

Usage: python tools/gen_supported_ops.py [output path]
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Operators with a handler in Paddle 2.x's popart_canonicalization (legacy IR
# names), grouped by the source file that handled them.
PADDLE2_IPU_OPS: dict[str, list[str]] = {
    "activation": [
        "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "floor", "log",
        "reciprocal", "relu", "round", "sigmoid", "sign", "sin", "sinh", "softplus", "softsign",
        "sqrt", "tan", "tanh", "brelu", "gelu", "log_softmax", "elu", "hard_shrink",
        "hard_sigmoid", "hard_swish", "leaky_relu", "log10", "log1p", "log2", "logsigmoid",
        "mish", "prelu", "relu6", "rsqrt", "selu", "silu", "softshrink", "square", "swish",
        "tanh_shrink", "thresholded_relu",
    ],
    "elementwise": [
        "elementwise_add", "elementwise_sub", "elementwise_div", "elementwise_mul",
        "elementwise_min", "elementwise_max", "elementwise_pow", "elementwise_mod",
    ],
    "logic": ["equal"],
    "loss": [
        "identity_loss", "softmax_with_cross_entropy", "cross_entropy2",
        "sigmoid_cross_entropy_with_logits", "kldiv_loss", "bce_loss", "huber_loss", "warpctc",
        "rank_loss",
    ],
    "math": ["mean", "pow", "mul", "matmul", "sum", "softmax", "scale"],
    "reduce": ["reduce_mean", "reduce_min", "reduce_sum", "reduce_max", "reduce_prod"],
    "search": ["top_k", "top_k_v2", "argsort"],
    "nn": [
        "affine_channel", "pool2d", "max_pool2d_with_index", "batch_norm", "group_norm",
        "instance_norm", "layer_norm", "conv2d", "conv2d_transpose", "dropout",
        "bilinear_interp_v2", "nearest_interp_v2", "bicubic_interp_v2", "linear_interp_v2",
        "trilinear_interp_v2", "data_norm", "pad3d", "depthwise_conv2d",
        "depthwise_conv2d_transpose",
    ],
    "tensor": [
        "fill_constant", "gaussian_random", "uniform_random", "transpose2", "reshape2",
        "flatten2", "flatten_contiguous_range", "gather", "squeeze2", "cast", "lookup_table",
        "unsqueeze2", "concat", "stack", "shape", "slice", "strided_slice", "expand",
        "expand_v2", "expand_as_v2", "assign", "assign_value", "fill_any_like",
        "lookup_table_v2", "split", "one_hot", "one_hot_v2", "dot", "clip", "dist", "flip",
        "meshgrid", "p_norm", "share_data", "tile", "unstack", "where",
    ],
    "detection": ["yolo_box"],
    "other": [
        "custom_op", "print", "popart_optimizer", "checkpointoutput", "custom_nll_loss",
        "identity", "detach",
    ],
}  # fmt: skip

# Legacy operator -> the PIR operator a Paddle 3.x program holds for the same
# computation, where the names differ.
LEGACY_TO_PIR: dict[str, str] = {
    "elementwise_add": "add",
    "elementwise_sub": "subtract",
    "elementwise_div": "divide",
    "elementwise_mul": "multiply",
    "elementwise_min": "minimum",
    "elementwise_max": "maximum",
    "elementwise_pow": "elementwise_pow",
    "elementwise_mod": "remainder",
    "softmax_with_cross_entropy": "cross_entropy_with_softmax",
    "cross_entropy2": "cross_entropy_with_softmax",
    "reduce_mean": "mean",
    "reduce_min": "min",
    "reduce_sum": "sum",
    "reduce_max": "max",
    "reduce_prod": "prod",
    "mean": "mean",
    "mul": "matmul",
    "matmul": "matmul",
    "sum": "add_n",
    "top_k": "topk",
    "top_k_v2": "topk",
    "brelu": "hardtanh",
    "hard_shrink": "hardshrink",
    "hard_sigmoid": "hardsigmoid",
    "hard_swish": "hardswish",
    "fill_constant": "full",
    "gaussian_random": "gaussian",
    "uniform_random": "uniform",
    "transpose2": "transpose",
    "reshape2": "reshape",
    "flatten2": "flatten",
    "flatten_contiguous_range": "flatten",
    "squeeze2": "squeeze",
    "unsqueeze2": "unsqueeze",
    "lookup_table": "embedding",
    "lookup_table_v2": "embedding",
    "expand_v2": "expand",
    "expand_as_v2": "expand_as",
    "fill_any_like": "full_like",
    "one_hot_v2": "one_hot",
    "bilinear_interp_v2": "bilinear_interp",
    "nearest_interp_v2": "nearest_interp",
    "bicubic_interp_v2": "bicubic_interp",
    "linear_interp_v2": "linear_interp",
    "trilinear_interp_v2": "trilinear_interp",
    "bce_loss": "bce_loss",
    "sigmoid_cross_entropy_with_logits": "sigmoid_cross_entropy_with_logits",
}


def _call_text(fn: Any, inputs: list[str]) -> str:
    """The Paddle call a case makes, as written in the table."""
    if getattr(fn, "__name__", "") != "<lambda>":
        return f"{fn.__name__.lstrip('_')}({', '.join(inputs)})"
    try:
        text = " ".join(inspect.getsource(fn).split())
    except (OSError, TypeError):
        return "?"
    body = text[text.index("lambda") :]
    body = body[body.index(":") + 1 :].strip()
    depth = 0
    for k, ch in enumerate(body):  # cut at the parenthesis closing add(...)
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return body[:k].rstrip(", ")
    return body


def _conformance() -> tuple[list[str], dict[str, str]]:
    """Run the table; return the markdown lines and op -> outcome."""
    sys.path.insert(0, str(ROOT / "tests"))
    import paddle
    from support.cases import CASES, FP16_HOST_FAILS, NOT_COVERED, REFUSED
    from support.runner import FP16_TOL, FP32_TOL, build, run_case

    from paddle_ipu.compiler import compile_program
    from paddle_ipu.errors import UnsupportedOpError

    paddle.enable_static()
    lines = [
        "## Conformance",
        "",
        "Each case builds a static program (`paddle.static.data` inputs, the operator through",
        "its public Paddle API, fetches), runs it on Paddle's CPU executor and, compiled by",
        "`compile_program`, on the host backend, and compares every output: fp32 at",
        f"rtol = atol = {FP32_TOL:g}, fp16 (`enable_fp16=True`) at rtol = atol = {FP16_TOL:g}.",
        "The table is `tests/support/cases.py`; `pytest tests/conformance` checks it.",
        "",
        "| operator | case | call | fp32 | fp16 |",
        "|---|---|---|---|---|",
    ]
    per_op: dict[str, str] = {}
    refused_rows: list[str] = []
    for case in CASES:
        call = _call_text(case.fn, list(case.inputs)).replace("|", "\\|")
        if case.id in REFUSED:
            built = build(case)
            try:
                compile_program(built.main, built.feeds, built.fetches, scope=paddle.static.Scope())
                result = "**compiled, but listed as refused**"
            except UnsupportedOpError as exc:
                message = str(exc).splitlines()
                # the operator check lists one operator a line; a rewrite's is one line
                reason = (message[1] if len(message) > 1 else message[0]).split(": ", 1)[-1]
                result = f"refused: {reason}"
            refused_rows.append(f"| `{case.op}` | {case.id} | `{call}` | {result} |")
            continue
        out = run_case(case)
        fp32 = "matches" if not out.fp32 else f"**{out.fp32}**"
        if case.id in FP16_HOST_FAILS and out.fp16.startswith("BackendError"):
            fp16 = f"not run: {FP16_HOST_FAILS[case.id]}"
        else:
            fp16 = "matches" if not out.fp16 else f"**{out.fp16}**"
        lines.append(f"| `{case.op}` | {case.id} | `{call}` | {fp32} | {fp16} |")
        per_op.setdefault(case.op, "matches")
        if out.fp32:
            per_op[case.op] = "fails"
    lines += [
        "",
        "## Refused at compile time",
        "",
        "These raise `UnsupportedOpError` from `compile_program`, naming the operator (and the",
        "attribute value where only some values are refused), before anything is converted.",
        "",
        "| operator | case | call | outcome |",
        "|---|---|---|---|",
        *refused_rows,
        "",
        "Operators refused whatever their attributes (not listed by `supported_ops()`):",
        "",
    ]
    from paddle_ipu.compiler.ops import DENIED

    lines += [f"- `{op}`: {why}" for op, why in sorted(DENIED.items())]
    lines += [
        "",
        "## Listed operators without a case",
        "",
        *[f"- `{op}`: {why}" for op, why in sorted(NOT_COVERED.items())],
        "",
    ]
    return lines, per_op


def render() -> str:
    from paddle_ipu.compiler.ops import is_supported, supported_ops

    def lowers(legacy: str) -> tuple[str, bool]:
        pir = LEGACY_TO_PIR.get(legacy, legacy)
        return pir, is_supported("pd_op." + pir)

    conformance, per_op = _conformance()
    lines = [
        "# Supported operators",
        "",
        "Generated by `python tools/gen_supported_ops.py` from the conformance suite's",
        "results; do not edit by hand.",
        "",
        "`compile_program` lowers a program when every operator of its forward graph",
        "is listed by `paddle_ipu.compiler.supported_ops()` with attribute values that are",
        "not refused below; otherwise it raises one `UnsupportedOpError` naming all the",
        "others.",
        "",
        *conformance,
        "## Against Paddle 2.x's IPU support",
        "",
        "The operators Paddle 2.x's in-tree IPU support handled (legacy IR names), the",
        "PIR operator a Paddle 3.x program holds for the same computation, and whether",
        "it lowers here.",
        "",
        "| group | Paddle 2.x operator | PIR operator | lowers here |",
        "|---|---|---|---|",
    ]
    total = yes = 0
    missing: list[str] = []
    for group, names in PADDLE2_IPU_OPS.items():
        for legacy in names:
            pir, ok = lowers(legacy)
            total += 1
            yes += ok
            if not ok:
                missing.append(legacy)
            lines.append(f"| {group} | `{legacy}` | `{pir}` | {'yes' if ok else 'no'} |")
    lines += [
        "",
        f"{yes} of these {total} operators lower here. Not lowered: "
        + ", ".join(f"`{m}`" for m in missing)
        + ".",
        "",
        "## Every operator that lowers",
        "",
        "The operators whose cases above match Paddle's CPU kernel: PIR names (the",
        "`pd_op.` prefix left out); where paddle2onnx knows an operator under a different",
        "legacy name, both spellings are listed.  The operators listed without a case",
        "(above, with the reason) are accepted by the compile check but not listed here.",
        "",
    ]
    from paddle_ipu.compiler.ops import _pir_name

    verified = {op for op, outcome in per_op.items() if outcome == "matches"}
    ops = [n for n in supported_ops() if n in verified or _pir_name(n) in verified]
    cols = 4
    lines.append("| " + " | ".join([" "] * cols) + " |")
    lines.append("|" + "---|" * cols)
    for i in range(0, len(ops), cols):
        row = [f"`{o}`" for o in ops[i : i + cols]]
        row += [""] * (cols - len(row))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"{len(ops)} names.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "supported_ops.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
