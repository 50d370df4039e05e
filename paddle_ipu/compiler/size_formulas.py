"""An open graph's output sizes as formulas of its open input sizes.

A padded request's outputs are cut back to the model's sizes at the request's own
size (:mod:`paddle_ipu.executor.specialised`).  Folding the open graph at that size
(:meth:`~paddle_ipu.compiler.open_shapes.OpenGraph.output_shapes`) takes tens of
milliseconds per new size, on the request path.  ONNX Runtime's symbolic shape
inference (``onnxruntime.tools.symbolic_shape_infer``, with sympy) follows the open
sizes through the graph once, as formulas (PP-OCRv4's recogniser: its sequence is
``floor(floor(floor(w/2 - 1/2)/2)/2 - 1/2) + 1`` for a width ``w``); each size is then
a few evaluations.  ONNX Runtime's tool leaves ``ConvTranspose`` unsized; it is given
here the operator's own output formula.

Where two values must have one size (an ``Add`` of a map and its upsampled
neighbour), the tool assumes their formulas equal and records them: those are the
sizes the model can take.  A size that breaks one is refused by name
(:class:`~paddle_ipu.errors.CompileError`, with the nearest sizes that hold), where
the fold would fail without naming the size.

The formulas are an accelerator: without sympy, or when the tool fails or leaves an
output size unknown, there are none (:func:`formulas` returns None and says why in
the log) and every size is folded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
from onnx import helper

from paddle_ipu.compiler.model import TensorSpec
from paddle_ipu.errors import CompileError

__all__ = ["SizeFormulas", "formulas"]

log = logging.getLogger("paddle_ipu")

#: how far from a refused size :meth:`SizeFormulas.shapes` looks for sizes that hold
_NEAREST = 64


class SizeFormulas:
    """Every output's shape as integers and formulas of the open input sizes, and the
    equalities between formulas that the sizes must keep."""

    def __init__(
        self,
        outputs: list[list[Any]],
        symbols: dict[Any, tuple[str, int]],
        equal: list[tuple[Any, Any]],
    ) -> None:
        self._outputs = outputs
        self._symbols = symbols  # sympy symbol -> (feed, axis)
        self._equal = equal

    def shapes(self, sizes: Mapping[str, Sequence[int]]) -> list[tuple[int, ...]] | None:
        """The outputs' shapes at input ``sizes`` (feed -> full shape).  A CompileError
        when a size breaks one of the model's equalities; None when one side of one
        is 1 (a broadcast, which the formulas do not follow: the fold answers)."""
        values = self._values(sizes)
        for left, right in self._equal:
            a, b = _evaluate(left, values), _evaluate(right, values)
            if a != b:
                if 1 in (a, b):
                    return None
                raise CompileError(self._refusal(sizes, left, right, a, b))
        return [tuple(_evaluate(d, values) for d in shape) for shape in self._outputs]

    def _values(self, sizes: Mapping[str, Sequence[int]]) -> dict[Any, Any]:
        import sympy

        values = {}
        for symbol, (feed, axis) in self._symbols.items():
            shape = sizes.get(feed)
            if shape is None:
                raise CompileError(f"no input shape for feed {feed!r}")
            values[symbol] = sympy.Integer(int(shape[axis]))
        return values

    def _holds(self, sizes: Mapping[str, Sequence[int]]) -> bool:
        values = self._values(sizes)
        return all(
            _evaluate(a, values) == _evaluate(b, values)
            or 1 in (_evaluate(a, values), _evaluate(b, values))
            for a, b in self._equal
        )

    def _refusal(
        self, sizes: Mapping[str, Sequence[int]], left: Any, right: Any, a: int, b: int
    ) -> str:
        """What a refused size is told: which input sizes, and the nearest that hold."""
        import sympy

        free = (sympy.sympify(left) - sympy.sympify(right)).free_symbols
        parts = []
        for symbol in sorted(free, key=str):
            if symbol not in self._symbols:
                continue
            feed, axis = self._symbols[symbol]
            size = int(sizes[feed][axis])
            near = []
            for step in (-1, 1):
                for k in range(1, _NEAREST + 1):
                    trial = {n: list(s) for n, s in sizes.items()}
                    trial[feed][axis] = size + step * k
                    if trial[feed][axis] >= 1 and self._holds(trial):
                        near.append(size + step * k)
                        break
            hint = f" (the nearest it takes: {' and '.join(map(str, near))})" if near else ""
            parts.append(f"input {feed!r} axis {axis} size {size}{hint}")
        where = "; ".join(parts) or f"input shapes {dict(sizes)}"
        return (
            f"the model cannot take {where}: two of its values that must have one size "
            f"come to {a} and {b} there"
        )


def _evaluate(expr: Any, values: Mapping[Any, Any]) -> int:
    if isinstance(expr, int):
        return expr
    return int(expr.xreplace(values))


def formulas(model_bytes: bytes, inputs: Sequence[TensorSpec]) -> SizeFormulas | None:
    """The size formulas of the open graph ``model_bytes`` (its weights in it) whose
    inputs are ``inputs`` (-1 where a size is open); None when there are none (the log
    says why)."""
    try:
        import sympy
        from onnxruntime.tools import symbolic_shape_infer as ssi
    except ImportError as exc:
        log.info("output sizes are folded per size (no symbolic shape inference: %s)", exc)
        return None
    model = onnx.load_from_string(model_bytes)
    names: dict[str, tuple[str, int]] = {}
    by_name = {spec.name: spec for spec in inputs}
    for vi in model.graph.input:
        spec = by_name.get(vi.name)
        if spec is None:
            continue
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if dim.HasField("dim_param"):
                name = f"open_{len(names)}"
                names[name] = (spec.paddle_name or spec.name, axis)
                dim.dim_param = name
    if not names:
        return None
    try:
        inference = _inference(ssi)(2**31 - 1, True, False, 0)
        inference._preprocess(model)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
    except Exception as exc:  # the tool's own failures: folded per size
        log.info("output sizes are folded per size (symbolic shape inference failed: %s)", exc)
        return None
    # the tool's own symbols of the open sizes (their assumptions are its own)
    known = {
        n: inference.symbolic_dims_.get(n) or sympy.Symbol(n, integer=True, positive=True)
        for n in names
    }
    symbols = {known[n]: where for n, where in names.items()}

    def expression(text: str) -> Any:
        expr = inference.symbolic_dims_.get(text)
        if expr is None:
            expr = known.get(text)
        if expr is None or not (sympy.sympify(expr).free_symbols <= set(symbols)):
            return None
        return sympy.sympify(expr)

    outputs: list[list[Any]] = []
    for out in inference.out_mp_.graph.output:
        tt = out.type.tensor_type
        if not tt.HasField("shape"):
            log.info("output sizes are folded per size (%r has no symbolic shape)", out.name)
            return None
        shape: list[Any] = []
        for dim in tt.shape.dim:
            if dim.HasField("dim_value"):
                shape.append(int(dim.dim_value))
                continue
            expr = expression(dim.dim_param)
            if expr is None:
                log.info(
                    "output sizes are folded per size (%r: size %r is not a formula of the "
                    "open sizes)",
                    out.name,
                    dim.dim_param,
                )
                return None
            shape.append(int(expr) if expr.is_Integer else expr)
        outputs.append(shape)
    equal = []
    for left, right in inference.suggested_merge_.items():
        a = expression(str(left))
        b = sympy.Integer(int(right)) if ssi.is_literal(right) else expression(str(right))
        if a is None or b is None:
            log.info("output sizes are folded per size (an equality %s = %s)", left, right)
            return None
        equal.append((a, b))
    return SizeFormulas(outputs, symbols, equal)


def _inference(ssi: Any) -> Any:
    """ONNX Runtime's symbolic shape inference, with ConvTranspose sized."""

    class _Inference(ssi.SymbolicShapeInference):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.dispatcher_["ConvTranspose"] = self._conv_transpose

        def _conv_transpose(self, node: onnx.NodeProto) -> None:
            """ONNX's ConvTranspose without ``output_shape`` or ``auto_pad``: each
            spatial size is ``stride * (size - 1) + output_padding + (kernel - 1) *
            dilation + 1 - pad_begin - pad_end``."""
            x = self._get_sympy_shape(node, 0)
            w = self._get_sympy_shape(node, 1)
            rank = len(w) - 2

            def attr(name: str, default: Any) -> Any:
                return ssi.get_attribute(node, name, default)

            auto_pad = attr("auto_pad", b"NOTSET")
            if attr("output_shape", None) is not None or auto_pad not in (b"NOTSET", "NOTSET"):
                return  # left unsized: no formula, the fold answers
            strides = attr("strides", [1] * rank)
            dilations = attr("dilations", [1] * rank)
            extra = attr("output_padding", [0] * rank)
            pads = attr("pads", [0] * (2 * rank))
            shape = [x[0], w[1] * attr("group", 1)]
            for i in range(rank):
                shape.append(
                    strides[i] * (x[2 + i] - 1)
                    + extra[i]
                    + (w[2 + i] - 1) * dilations[i]
                    + 1
                    - pads[i]
                    - pads[rank + i]
                )
            self._update_computed_dims(shape)
            vi = self.known_vi_[node.output[0]]
            vi.CopyFrom(
                helper.make_tensor_value_info(
                    node.output[0],
                    self.known_vi_[node.input[0]].type.tensor_type.elem_type,
                    ssi.get_shape_from_sympy_shape(shape),
                )
            )

    return _Inference
