"""The activations of a compiled graph, for the memory report (:mod:`.memory`): tensor
sizes, what the backward pass reads, where recomputation checkpoints, what lives at
once.

What the backward pass reads (:data:`NEEDS`): a gradient operator reads some of its
forward operator's operands or results -- a matmul both operands, ReLU / sigmoid /
softmax / exp their result, an addition nothing.  A value no gradient reads (the
result of a matmul that a bias addition consumes in place) is not kept.

Cut points: in the graph's order, a place where one activation carries everything
the rest of the stage reads (a residual stream between two layers) is a checkpoint
recomputation can restart from; the values between two cuts are one segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

IN, OUT = "in", "out"
#: operator -> (operand indices, result indices) its gradient reads; not listed:
#: every float operand (the conservative choice)
NEEDS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "MatMul": ((0, 1), ()), "Gemm": ((0, 1), ()), "Conv": ((0, 1), ()),
    "ConvTranspose": ((0, 1), ()), "Mul": ((0, 1), ()), "Div": ((0, 1), ()),
    "Pow": ((0, 1), ()), "Max": ((0, 1), ()), "Min": ((0, 1), ()),
    "Relu": ((), (0,)), "Sigmoid": ((), (0,)), "Tanh": ((), (0,)), "Exp": ((), (0,)),
    "Sqrt": ((), (0,)), "Reciprocal": ((), (0,)), "Softmax": ((), (0,)),
    "LogSoftmax": ((), (0,)), "Log": ((0,), ()), "Erf": ((0,), ()), "Gelu": ((0,), ()),
    "LeakyRelu": ((0,), ()), "HardSigmoid": ((0,), ()), "HardSwish": ((0,), ()),
    "Softplus": ((0,), ()), "Sin": ((0,), ()), "Cos": ((0,), ()), "Clip": ((0,), ()),
    "Abs": ((0,), ()), "MaxPool": ((0,), (0,)), "GlobalMaxPool": ((0,), (0,)),
    "ReduceMax": ((0,), (0,)), "ReduceMin": ((0,), (0,)), "ReduceL2": ((0,), (0,)),
    "BatchNormalization": ((0,), ()), "LayerNormalization": ((0,), ()),
    "InstanceNormalization": ((0,), ()), "GroupNormalization": ((0,), ()),
    "Where": ((0,), ()), "Gather": ((1,), ()), "GatherElements": ((1,), ()),
    "GatherND": ((1,), ()), "Dropout": ((), (1,)), "Add": ((), ()), "Sub": ((), ()),
    "Neg": ((), ()), "Sum": ((), ()), "Reshape": ((), ()), "Transpose": ((), ()),
    "Concat": ((), ()), "Split": ((), ()), "Slice": ((), ()), "Squeeze": ((), ()),
    "Unsqueeze": ((), ()), "Flatten": ((), ()), "Identity": ((), ()),
    "ReduceSum": ((), ()), "ReduceMean": ((), ()), "AveragePool": ((), ()),
    "GlobalAveragePool": ((), ()), "Expand": ((), ()), "Tile": ((), ()), "Pad": ((), ()),
    "Cast": ((), ()), "CumSum": ((), ()), "Resize": ((), ()), "Shape": ((), ()),
    "Constant": ((), ()), "ConstantOfShape": ((), ()), "Range": ((), ()),
}  # fmt: skip
MATMULS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
NORMS = frozenset(
    {"BatchNormalization", "LayerNormalization", "InstanceNormalization",
     "GroupNormalization"}
)  # fmt: skip


@dataclass
class Graph:
    """A compiled graph's nodes with the static shape and element type of its tensors."""

    nodes: list[onnx.NodeProto]
    shapes: dict[str, tuple[int, ...]]
    types: dict[str, int]
    weights: dict[str, tuple[tuple[int, ...], int]]
    inputs: list[str]
    outputs: list[str]

    def nbytes(self, name: str, fp16: bool) -> int:
        shape = self.shapes.get(name)
        if shape is None:
            return 0
        return numel(shape) * itemsize(self.types.get(name, 0), fp16)

    def is_float(self, name: str) -> bool:
        return self.types.get(name) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)

    def activation(self, name: str) -> bool:
        """A float tensor the graph computes or is fed (not a weight)."""
        return bool(name) and name not in self.weights and self.is_float(name)


def numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def itemsize(elem: int, fp16: bool) -> int:
    if fp16 and elem in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        return 2
    if elem == 0:
        return 4
    return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize)


def needed(g: Graph, nodes: Sequence[onnx.NodeProto]) -> set[str]:
    """The activations the backward pass of ``nodes`` reads."""
    out: set[str] = set()
    for node in nodes:
        rule = NEEDS.get(node.op_type)
        if rule is None:
            names = list(node.input)
        else:
            names = [node.input[i] for i in rule[0] if i < len(node.input)]
            names += [node.output[i] for i in rule[1] if i < len(node.output)]
        out.update(n for n in names if g.activation(n))
    return out


def stage_inputs(g: Graph, nodes: Sequence[onnx.NodeProto]) -> set[str]:
    """The activations that enter ``nodes`` from outside them (feeds, other stages)."""
    made = {o for n in nodes for o in n.output}
    return {i for n in nodes for i in n.input if g.activation(i) and i not in made}


def cuts(g: Graph, nodes: Sequence[onnx.NodeProto]) -> list[tuple[str, int]]:
    """The cut points of ``nodes`` in their order: (the one activation live there, the
    position after which it is the only one), stage inputs left aside."""
    outside = stage_inputs(g, nodes)
    start, end = _intervals(g, nodes, outside)
    begins: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for name, k in start.items():
        begins.setdefault(k, []).append(name)
        ends.setdefault(end[name], []).append(name)
    live: set[str] = set()
    found: list[tuple[str, int]] = []
    for k in range(len(nodes) - 1):
        live.update(begins.get(k, ()))
        live.difference_update(ends.get(k, ()))
        if len(live) == 1:
            (only,) = live
            if not found or found[-1][0] != only:
                found.append((only, k))
    return found


def _intervals(
    g: Graph, nodes: Sequence[onnx.NodeProto], skip: set[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """Activation -> the position of the node that makes it, and of its last reader
    among ``nodes`` (the end of the list for a graph output)."""
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in node.output:
            if g.activation(name) and name not in skip:
                start.setdefault(name, k)
                end.setdefault(name, k)
        for name in node.input:
            if name in start:
                end[name] = k
    mine = {id(n) for n in nodes}
    read_elsewhere = {i for n in g.nodes if id(n) not in mine for i in n.input}
    for name in start:
        if name in g.outputs or name in read_elsewhere:
            end[name] = len(nodes)
    return start, end


def segments(
    nodes: Sequence[onnx.NodeProto], cut: list[tuple[str, int]]
) -> list[list[onnx.NodeProto]]:
    """``nodes`` split after each cut's position."""
    bounds = [k + 1 for _, k in cut]
    parts, begin = [], 0
    for b in [*bounds, len(nodes)]:
        parts.append(list(nodes[begin:b]))
        begin = b
    return [p for p in parts if p]


def peak_live(g: Graph, nodes: Sequence[onnx.NodeProto], fp16: bool) -> int:
    """The most bytes of activations live at once running ``nodes`` in order (a
    tensor lives from the node that makes it, or its first reader when it enters from
    outside, to its last reader)."""
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in (*node.input, *node.output):
            if name and name not in g.weights:
                start.setdefault(name, k)
                end[name] = k
    for name in g.outputs:
        if name in end:
            end[name] = len(nodes)
    events = np.zeros(len(nodes) + 2, dtype=np.int64)
    for name, s in start.items():
        nbytes = g.nbytes(name, fp16)
        events[s] += nbytes
        events[end[name] + 1] -= nbytes
    return int(np.cumsum(events).max()) if len(nodes) else 0
