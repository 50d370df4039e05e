"""A small editor for the ONNX graphs the host backend rewrites: unique names, element
types, node construction and the rounding nodes of the IPU's float16 arithmetic.

Element types come from the graph's inputs, outputs, initializers and value_info
(ONNX's shape inference, when it knows the operators) and, for every other tensor,
from the operator that produces it (:func:`output_type`): ONNX Runtime's optimised
graphs carry no value_info, and its own operators (the blocked layout's
``com.microsoft.nchwc`` domain) are unknown to ONNX's inference.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from paddle_ipu.backends.host.numerics import FP16_MAX, FP16_TINY, Fp16Arithmetic, stream_seed

FLOAT = TensorProto.FLOAT
FLOAT16 = TensorProto.FLOAT16
BOOL = TensorProto.BOOL
INT64 = TensorProto.INT64
#: the prefix of the name of every node an Editor makes (ONNX Runtime keeps node names
#: through its optimisation: a later pass knows them)
MARK = "paddle_ipu::"

#: r times these, rounded to nearest, is the float16 value after / before r (r a float16
#: value: 11 significant bits, so the products are exact enough in float32)
_NEXT_UP = 1 + 2**-11 + 2**-20
_NEXT_DOWN = 1 - 2**-11 - 2**-20

#: operators whose outputs have a fixed element type
_FIXED_TYPES: dict[str, int] = {
    "Shape": INT64,
    "Size": INT64,
    "NonZero": INT64,
    "ArgMax": INT64,
    "ArgMin": INT64,
    "Equal": BOOL,
    "Less": BOOL,
    "LessOrEqual": BOOL,
    "Greater": BOOL,
    "GreaterOrEqual": BOOL,
    "Not": BOOL,
    "And": BOOL,
    "Or": BOOL,
    "Xor": BOOL,
    "IsNaN": BOOL,
    "IsInf": BOOL,
}
#: operators whose output takes the type of this input (default: the first)
_TYPE_FROM_INPUT: dict[str, int] = {"Where": 1, "Range": 0}


def output_type(node: onnx.NodeProto, k: int, types: dict[str, int]) -> int | None:
    """The element type of ``node``'s ``k``-th output, from its operator and inputs."""
    op = node.op_type
    attrs = {a.name: a for a in node.attribute}
    if op in _FIXED_TYPES:
        return _FIXED_TYPES[op]
    if op == "TopK" and k == 1:
        return INT64
    if op in ("MaxPool",) and k == 1:
        return INT64
    if op == "Cast" and "to" in attrs:
        return int(attrs["to"].i)
    if op in ("Constant",) and "value" in attrs:
        return int(attrs["value"].t.data_type)
    if op == "ConstantOfShape":
        return int(attrs["value"].t.data_type) if "value" in attrs else FLOAT
    if op in ("RandomUniformLike", "RandomNormalLike", "EyeLike") and "dtype" in attrs:
        return int(attrs["dtype"].i)
    if op in ("RandomUniform", "RandomNormal"):
        return int(attrs["dtype"].i) if "dtype" in attrs else FLOAT
    index = _TYPE_FROM_INPUT.get(op, 0)
    if len(node.input) > index and node.input[index]:
        return types.get(node.input[index])
    return None


def _small(dims: Iterable[int]) -> bool:
    return int(np.prod(list(dims), dtype=np.int64)) <= 4096


class Editor:
    """Builds a new node list for ``graph`` (``emit``), then puts it in place
    (:meth:`commit`).  ``types``: tensor name -> ONNX element type."""

    def __init__(self, model: onnx.ModelProto, *, infer: bool = True) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = next(
            (int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 13
        )
        g = self.graph
        self.taken: set[str] = {n.name for n in g.node}
        for node in g.node:
            self.taken.update(node.input)
            self.taken.update(node.output)
        self.taken.update(i.name for i in g.input)
        self.taken.update(i.name for i in g.initializer)
        self.types: dict[str, int] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        if infer:
            self._infer()
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.HasField("tensor_type"):
                self.types.setdefault(vi.name, vi.type.tensor_type.elem_type)
                dims = vi.type.tensor_type.shape.dim
                if dims and all(d.HasField("dim_value") for d in dims):
                    self.shapes.setdefault(vi.name, tuple(int(d.dim_value) for d in dims))
        #: small constants' values (initializers with data, Constant nodes)
        self.constants: dict[str, np.ndarray] = {}
        for init in g.initializer:
            self.types[init.name] = init.data_type
            self.shapes[init.name] = tuple(int(d) for d in init.dims)
            if init.data_location != TensorProto.EXTERNAL and _small(init.dims):
                self.constants[init.name] = numpy_helper.to_array(init)
        for node in g.node:
            value = node.attribute[0] if node.op_type == "Constant" and node.attribute else None
            if value is not None and value.name == "value" and _small(value.t.dims):
                self.constants[node.output[0]] = numpy_helper.to_array(value.t)
        for node in g.node:
            for k, out in enumerate(node.output):
                if out and out not in self.types:
                    t = output_type(node, k, self.types)
                    if t is not None:
                        self.types[out] = t
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        #: tensors that hold float16 values already (rounded by a node made here)
        self.rounded: set[str] = set()
        #: lazy saturation: operands whose finiteness a flag watches (fp16_graph)
        self.watched: list[str] = []
        self._count = 0

    def _infer(self) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
        except Exception:  # operators ONNX's inference does not know: types propagate
            return
        for vi in (*inferred.graph.value_info, *inferred.graph.output):
            if not vi.type.HasField("tensor_type"):
                continue
            self.types.setdefault(vi.name, vi.type.tensor_type.elem_type)
            dims = vi.type.tensor_type.shape.dim
            if dims and all(d.HasField("dim_value") for d in dims):
                self.shapes.setdefault(vi.name, tuple(int(d.dim_value) for d in dims))

    # -- names and nodes ----------------------------------------------------------
    def name(self, base: str) -> str:
        candidate = base
        while candidate in self.taken:
            self._count += 1
            candidate = f"{base}.{self._count}"
        self.taken.add(candidate)
        return candidate

    def node_name(self, base: str, op: str) -> str:
        return self.name(f"{MARK}{base}::{op}")

    def emit(
        self,
        op: str,
        inputs: Sequence[str],
        base: str,
        *,
        out: str | None = None,
        out_type: int | None = FLOAT,
        domain: str = "",
        **attrs: Any,
    ) -> str:
        """Append a node computing one output (``out``, or a new name from ``base``)."""
        output = out or self.name(base)
        self.taken.add(output)
        node = helper.make_node(
            op, list(inputs), [output], name=self.node_name(base, op), domain=domain, **attrs
        )
        self.nodes.append(node)
        if out_type is not None:
            self.types[output] = out_type
        return output

    def constant(self, value: Any, base: str, dtype: Any = np.float32) -> str:
        name = self.name(f"{MARK}{base}")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        self.types[name] = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return name

    def ints(self, values: Iterable[int], base: str) -> str:
        return self.constant(np.asarray(list(values), dtype=np.int64), base, np.int64)

    def commit(self) -> None:
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        self.graph.initializer.extend(self.initializers)
        self.nodes, self.initializers = [], []

    # -- reductions (their axes moved from an attribute to an input in opset 13/18) --
    def reduce(self, op: str, x: str, axes: Sequence[int], base: str, keepdims: int = 1) -> str:
        as_input = (op == "ReduceSum" and self.opset >= 13) or self.opset >= 18
        if as_input:
            return self.emit(op, [x, self.ints(axes, f"{base}.axes")], base, keepdims=keepdims)
        return self.emit(op, [x], base, axes=list(axes), keepdims=keepdims)

    # -- the IPU's rounding ---------------------------------------------------------
    def round_to(
        self,
        src: str,
        base: str,
        arith: Fp16Arithmetic,
        *,
        out: str | None = None,
        bounded: bool = False,
        stochastic: bool | None = None,
    ) -> str:
        """Emit the nodes that round float32 ``src`` to float16 values (held in
        float32) as ``arith`` says; return the rounded tensor.  ``bounded``: the value
        cannot exceed float16's range (no saturation needed)."""
        sr = arith.stochastic if stochastic is None else stochastic
        if sr:
            result = self._round_stochastic(src, base, arith, out)
        else:
            x = src
            if arith.saturate and not bounded and not arith.lazy_saturation:
                x = self.saturate(src, base)
            half = self.emit("Cast", [x], f"{base}.half", to=FLOAT16, out_type=FLOAT16)
            result = self.emit("Cast", [half], base, out=out, to=FLOAT)
        self.rounded.add(result)
        if src in self.shapes:
            self.shapes[result] = self.shapes[src]
        return result

    def saturate(self, src: str, base: str) -> str:
        """``src`` with its finite values clipped at +-65504: an overflow saturates,
        an infinity (a division by zero, an infinite operand) stays one."""
        clipped = self.emit("Clip", [src, self.limit(-FP16_MAX), self.limit(FP16_MAX)], base)
        inf = self.emit("IsInf", [src], f"{base}.isinf", out_type=BOOL)
        return self.emit("Where", [inf, src, clipped], f"{base}.sat")

    def limit(self, value: float) -> str:
        """A float32 scalar constant (named with :data:`MARK`: never rounded)."""
        key = f"{MARK}const::{value!r}"
        if key not in self.types:
            self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), key))
            self.types[key] = FLOAT
            self.taken.add(key)
        return key

    def _round_stochastic(self, src: str, base: str, arith: Fp16Arithmetic, out: str | None) -> str:
        """Stochastic rounding from float operations only (ONNX has no bit cast):
        ``r`` = |x| rounded to nearest; the float16 neighbours of r are r times
        (1 +- 2^-11 - 2^-20) rounded to nearest (exact: r has 11 significant bits);
        |x| goes up from ``lo`` by the spacing ``s`` when a uniform draw is below
        (|x| - lo) / s.  Every step is exact in float32 (powers of two, differences of
        neighbours), so the rounding is unbiased as the core's (csrc/core/rounding.cc).
        """
        lim = self.limit
        a = self.emit("Abs", [self.saturate(src, base) if arith.saturate else src], f"{base}.abs")
        r = self._rtn(a, f"{base}.r")
        d = self.emit("Sub", [a, r], f"{base}.d")
        up_r = self._rtn(self.emit("Mul", [r, lim(_NEXT_UP)], f"{base}.up"), f"{base}.up")
        dn_r = self._rtn(self.emit("Mul", [r, lim(_NEXT_DOWN)], f"{base}.dn"), f"{base}.dn")
        s_up = self.emit("Max", [self.emit("Sub", [up_r, r], f"{base}.su"), lim(FP16_TINY)], base)
        s_dn = self.emit("Max", [self.emit("Sub", [r, dn_r], f"{base}.sd"), lim(FP16_TINY)], base)
        above = self.emit("GreaterOrEqual", [d, lim(0.0)], f"{base}.above", out_type=BOOL)
        s = self.emit("Where", [above, s_up, s_dn], f"{base}.s")
        lo = self.emit("Where", [above, r, self.emit("Sub", [r, s_dn], f"{base}.lo")], base)
        frac = self.emit("Div", [self.emit("Sub", [a, lo], f"{base}.f"), s], f"{base}.frac")
        seed = stream_seed(arith.seed_or_random(), arith.replica_offset, len(self.nodes))
        u = self.emit("RandomUniformLike", [a], f"{base}.u", dtype=FLOAT, seed=float(seed % 2**24))
        step = self.emit(
            "Cast", [self.emit("Less", [u, frac], f"{base}.go", out_type=BOOL)], base, to=FLOAT
        )
        mag = self.emit("Add", [lo, self.emit("Mul", [step, s], f"{base}.step")], f"{base}.mag")
        signed = self.emit("Mul", [mag, self.emit("Sign", [src], f"{base}.sign")], base)
        # beyond float16's range (an infinity, or without saturation an overflow):
        # what rounding to nearest gives
        big = self.emit("Greater", [a, lim(FP16_MAX)], f"{base}.big", out_type=BOOL)
        return self.emit("Where", [big, self._rtn(src, f"{base}.inf"), signed], base, out=out)

    def _rtn(self, src: str, base: str) -> str:
        half = self.emit("Cast", [src], f"{base}.half", to=FLOAT16, out_type=FLOAT16)
        return self.emit("Cast", [half], base, to=FLOAT)
