"""The IPU's floating-point checks on the host (``enable_floating_point_checks``).

On the IPU, PopART sets Poplar's ``FloatingPointBehaviour(inv, div0, oflo, esr=false,
nanoo)``: an invalid operation, a division by zero or an overflow traps, and a
float16 overflow gives NaN instead of saturating (NaN-on-overflow), so the run stops
at the first operator that makes an infinity or a NaN out of finite operands.

The host cannot trap, so it looks: every operator whose result is not a value of
its operands (:data:`.fp16_graph.EXACT` are not looked at) gets a flag, the sum of
its result times zero (0 when every element is finite, NaN otherwise), and the flags
come back with the outputs, in the order the operators run.  The first flag that is
NaN names the operator: the operators before it made only finite values, so its
operands were finite (the graph's inputs and weights are checked first).  Then the
operator's operands and result are read once more (a second session that returns
them, for that micro-batch) to say what happened: an overflow (an infinity), an
invalid operation (a NaN), a division by zero.  The training graph (Paddle's) is
checked the same way by :mod:`.fp16_program`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from paddle_ipu.backends.host.fp16_graph import _exact
from paddle_ipu.backends.host.onnx_edit import FLOAT, Editor
from paddle_ipu.errors import FloatingPointCheckError

#: the graph output holding the flags
FLAGS = "paddle_ipu::fp_checks"


@dataclass(frozen=True)
class Checked:
    """The operators a checked graph flags, in the order of its flags: (ONNX node
    name, operator type, the tensor looked at)."""

    nodes: tuple[tuple[str, str, str], ...]


def plan(model: onnx.ModelProto) -> Checked:
    """The operators of the compiled graph ``model`` to flag: every one whose float
    results are not values of its operands, with each such result."""
    ed = Editor(model)
    return Checked(
        tuple(
            (node.name, node.op_type, out)
            for node in model.graph.node
            if not _exact(node, ed.types)
            for out in node.output
            if out and ed.types.get(out) == FLOAT
        )
    )


def add_flags(model: onnx.ModelProto, checked: Checked) -> None:
    """Add the flags of ``checked`` to ``model`` (in place), reading each result under
    its compiled name (the float16 rewrites give a rounded result that name)."""
    if not checked.nodes:
        return
    ed = Editor(model, infer=False)
    ed.nodes.extend(model.graph.node)
    flags = []
    for _, _, looked in checked.nodes:
        zero = ed.emit("Mul", [looked, ed.limit(0.0)], f"{looked}::check")
        flags.append(_reduce_all(ed, zero, f"{looked}::flag"))
    ed.emit("Concat", flags, FLAGS, out=FLAGS, axis=0)
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(FLAGS, FLOAT, [len(checked.nodes)])
    )
    ed.commit()


def _reduce_all(ed: Editor, x: str, base: str) -> str:
    flat = ed.emit("Reshape", [x, ed.ints([-1], f"{base}.flat")], f"{base}.flat")
    return ed.reduce("ReduceSum", flat, [0], base, keepdims=1)


def first_failure(flags: np.ndarray, checked: Checked) -> tuple[str, str, str] | None:
    """The first operator whose flag is not finite, or None."""
    bad = np.flatnonzero(~np.isfinite(np.asarray(flags).reshape(-1)))
    if bad.size == 0:
        return None
    return checked.nodes[int(bad[0])]


def classify(op_type: str, operands: Sequence[np.ndarray], result: np.ndarray) -> str:
    """What the IPU's trap would report: a division by zero (a divisor holding zero
    where the result is not finite), an overflow (infinities from finite operands)
    or an invalid operation (NaN)."""
    bad = ~np.isfinite(result)
    if op_type in ("Div", "Reciprocal", "Divide") and operands:
        divisor = operands[-1]
        try:
            zero = np.broadcast_to(divisor == 0, result.shape)
        except ValueError:
            zero = np.zeros(result.shape, bool)
        if np.any(zero & bad):
            return "division by zero"
    if np.any(np.isnan(result)):
        return "invalid operation"
    return "overflow"


def raise_failure(
    *,
    node: str,
    op_type: str,
    paddle_op: str,
    kind: str,
    step: int,
    where: str,
    operands: Sequence[tuple[str, np.ndarray]] = (),
    result: np.ndarray | None = None,
) -> None:
    """Raise the :class:`~paddle_ipu.errors.FloatingPointCheckError` of one trap."""
    paddle = f" (Paddle operator {paddle_op})" if paddle_op else ""
    detail = ""
    if result is not None:
        finite = result[np.isfinite(result)]
        detail = (
            f"; its result holds {int(np.sum(np.isinf(result)))} infinities and "
            f"{int(np.sum(np.isnan(result)))} NaN of {result.size} values"
        )
        if finite.size:
            detail += f" (largest finite magnitude {float(np.abs(finite).max()):g})"
    operand_text = ""
    if operands:
        parts = []
        for name, value in operands:
            if value.size and value.dtype.kind == "f":
                parts.append(f"{name}: |max| {float(np.abs(value).max()):g}")
        if parts:
            operand_text = "; operands " + ", ".join(parts)
    subject = f"{op_type} node {node!r}{paddle}" if op_type != node.split(" #")[0] else node
    raise FloatingPointCheckError(
        f"floating-point check ({kind}): {subject} made values that are not finite from "
        f"finite operands at run {step} ({where}){detail}{operand_text}. With "
        "enable_floating_point_checks the IPU stops at this operator (Poplar's "
        "floating-point trap); in float16 a result beyond 65504 is an overflow",
        node=node,
        op_type=op_type,
        paddle_op=paddle_op,
        step=step,
        kind=kind,
    )
