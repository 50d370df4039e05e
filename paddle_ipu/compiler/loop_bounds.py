"""The largest number of iterations of each ONNX Loop, read off the model, as its trip
count.

paddle2onnx writes a ``while`` as a Loop without a trip count (input ``M`` empty): the
condition the body computes ends it.  ONNX Runtime runs such a Loop; PopART does not:
its importer (willow/src/op/loop.cpp) takes ``M`` as a constant, its trip count, and
lowers the Loop to a Poplar ``Repeat`` of that many iterations, each skipped once the
condition is false (willow/src/popx/op/loopx.cpp).  :func:`bound_loops` gives a Loop
its ``M`` where the model bounds its iterations: the condition requires a counter --
a carried value the body adds a positive constant to, or multiplies by a constant
above 1, from a constant start -- to stay below a constant (``i < n``, ``i + 1 <= n``,
either side of an ``And``); the bound is the number of iterations that condition
allows, found by counting them.  ``M`` is then the bound and the condition still ends
the loop, on every backend: the results are the same.  A Loop whose iterations the
model does not bound this way keeps no ``M``, and the popart backend refuses it by
name (:func:`unbounded`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["MAX_ITERATIONS", "bound_loops", "unbounded"]

#: counting stops here: a loop allowed more iterations is left without a bound
MAX_ITERATIONS = 1 << 24

# operators a counter or a bound passes through unchanged in value
_SAME = frozenset({"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})

#: (carried index or None for a constant, scale, offset): value = scale * carried + offset
Affine = tuple[int | None, float, float]


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The graph's small constants (Constant nodes, initializers holding data), and the
    values that only reshape or cast one."""
    out: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if int(np.prod(init.dims)) <= 16 and init.data_location != onnx.TensorProto.EXTERNAL:
            try:
                out[init.name] = numpy_helper.to_array(init)
            except Exception:  # a weight whose data the session supplies
                continue
    for node in graph.node:
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if node.op_type == "Constant" and attr is not None and attr.name == "value":
            out[node.output[0]] = numpy_helper.to_array(attr.t)
        elif node.op_type in _SAME and node.input and node.input[0] in out:
            out[node.output[0]] = out[node.input[0]]  # its value, whatever its shape
    return out


def _scalar(value: np.ndarray | None) -> float | None:
    if value is None or value.size != 1 or value.dtype.kind not in "biuf":
        return None
    return float(value.reshape(-1)[0])


class _Body:
    """What a Loop's body computes of its carried values, affinely."""

    def __init__(self, body: onnx.GraphProto, outer: dict[str, np.ndarray], starts: list) -> None:
        self.producer = {o: n for n in body.node for o in n.output}
        self.constants = {**outer, **_constants(body)}
        self.carried = {i.name: k for k, i in enumerate(body.input[2:])}
        self.starts = starts  # each carried value's start, a number or None
        self.body = body

    def affine(self, name: str, depth: int = 0) -> Affine | None:
        """``name`` as ``scale * carried[k] + offset`` (k None: a constant)."""
        if depth > 64:
            return None
        if name in self.carried:
            return self.carried[name], 1.0, 0.0
        number = _scalar(self.constants.get(name))
        if number is not None:
            return None, 0.0, number
        node = self.producer.get(name)
        if node is None:
            return None
        if node.op_type in _SAME:
            return self.affine(node.input[0], depth + 1)
        if node.op_type not in ("Add", "Sub", "Mul") or len(node.input) != 2:
            return None
        a, b = (self.affine(n, depth + 1) for n in node.input)
        if a is None or b is None or (a[0] is not None and b[0] is not None):
            return None
        if node.op_type == "Add":
            return (a[0] if a[0] is not None else b[0]), a[1] + b[1], a[2] + b[2]
        if node.op_type == "Sub":
            return (a[0] if a[0] is not None else b[0]), a[1] - b[1], a[2] - b[2]
        k, term, factor = (a[0], a, b[2]) if a[0] is not None else (b[0], b, a[2])
        return k, term[1] * factor, term[2] * factor  # Mul by a constant

    def value(self, expr: Affine, values: dict[int, float]) -> float | None:
        k, scale, offset = expr
        if k is None:
            return offset
        current = values.get(k)
        return None if current is None else scale * current + offset

    def condition(self, name: str, depth: int = 0) -> list[tuple[str, Affine, Affine]]:
        """The comparisons ``a < b`` / ``a <= b`` that must all hold for ``name`` (a
        condition) to be true."""
        if depth > 64:
            return []
        node = self.producer.get(name)
        if node is None:
            return []
        kind = node.op_type
        if kind in _SAME:
            return self.condition(node.input[0], depth + 1)
        if kind == "And":
            return [c for n in node.input for c in self.condition(n, depth + 1)]
        flips = {"Less": ("<", 0, 1), "LessOrEqual": ("<=", 0, 1), "Greater": ("<", 1, 0),
                 "GreaterOrEqual": ("<=", 1, 0)}  # fmt: skip
        if kind == "Not":
            inner = self.producer.get(node.input[0])
            negated = {"GreaterOrEqual": ("<", 0, 1), "Greater": ("<=", 0, 1),
                       "LessOrEqual": ("<", 1, 0), "Less": ("<=", 1, 0)}  # fmt: skip
            if inner is None or inner.op_type not in negated:
                return []
            node, (op, i, j) = inner, negated[inner.op_type]
        elif kind in flips:
            op, i, j = flips[kind]
        else:
            return []
        left, right = self.affine(node.input[i]), self.affine(node.input[j])
        return [] if left is None or right is None else [(op, left, right)]


def _bound(body: _Body, cond_out: str) -> int | None:
    """How many iterations the body's condition allows (None: not bounded by it)."""
    outputs = [o.name for o in body.body.output[1:]]
    steps: dict[int, Affine] = {}
    for k, out in enumerate(outputs):
        expr = body.affine(out)
        if expr is not None and expr[0] == k:
            steps[k] = expr
    values = {k: s for k, s in enumerate(body.starts) if s is not None and k in steps}
    checks = [
        c for c in body.condition(cond_out)
        if any(e[0] is not None for e in c[1:]) and all(e[0] is None or e[0] in values
                                                       for e in c[1:])
    ]  # fmt: skip
    if not checks:
        return None
    for iteration in range(1, MAX_ITERATIONS + 1):
        # the condition the body computes in this iteration decides the next
        for op, left, right in checks:
            a, b = body.value(left, values), body.value(right, values)
            if a is None or b is None:
                return None
            if not (a < b if op == "<" else a <= b):
                return iteration
        before = dict(values)
        for k in values:
            _, scale, offset = steps[k]
            values[k] = scale * values[k] + offset
        if values == before:  # nothing counts: the condition never changes
            return None
    return None


def bound_loops(model: onnx.ModelProto) -> dict[str, int | None]:
    """Give each Loop of ``model`` (its subgraphs' too) without a trip count the bound
    its condition puts on its iterations (module docstring).  Returns each Loop's name
    and its bound (None: left without one)."""
    found: dict[str, int | None] = {}
    outer: dict[str, np.ndarray] = {}
    for graph in _graphs(model.graph):
        outer.update(_constants(graph))
        for node in list(graph.node):
            if node.op_type != "Loop" or (node.input and node.input[0]):
                continue
            body_graph = next(a.g for a in node.attribute if a.name == "body")
            starts = [_scalar(outer.get(n)) for n in node.input[2:]]
            body = _Body(body_graph, outer, starts)
            bound = _bound(body, body_graph.output[0].name)
            found[node.name] = bound
            if bound is None:
                continue
            name = f"{node.name}.trip_count"
            value = numpy_helper.from_array(np.asarray(bound, np.int64), name)
            index = list(graph.node).index(node)
            graph.node.insert(index, helper.make_node("Constant", [], [name], value=value))
            if node.input:
                node.input[0] = name
            else:
                node.input.append(name)
    return found


def unbounded(model: onnx.ModelProto) -> list[str]:
    """The Loops of ``model`` (its subgraphs' too) without a trip count."""
    return [
        node.name or "(unnamed)"
        for graph in _graphs(model.graph)
        for node in graph.node
        if node.op_type == "Loop" and not (node.input and node.input[0])
    ]
