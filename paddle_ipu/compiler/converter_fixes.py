"""Fixes of what paddle2onnx gets wrong in the ONNX it writes (2.1, PIR programs).

- Attribute corrections (:func:`correct_lowerings`): the lowering of some Paddle ops
  ignores or misreads an attribute (hardtanh's bounds, leaky_relu's slope, gelu's
  approximation, cross_entropy without softmax, thresholded_relu, group_norm, pad3d's
  pad_value) or a type (float16 batch_norm / instance_norm with float32 statistics); each
  correction rewrites that op's ONNX nodes from the op's real attributes, checked
  against Paddle's CPU kernel in the conformance suite.
- Parameters as ``Constant`` nodes (:func:`constants_to_initializers`): they become
  initializers named after the Paddle parameter.
- Empty optional inputs of ``Resize`` (:func:`omit_empty_resize_inputs`), which ONNX
  Runtime refuses in some forms.
- Fetch names the converter aliases (:func:`repair_fetch_aliases`).

The rewrites of the Paddle program before conversion (ops the converter cannot lower
as they are) are in :mod:`paddle_ipu.compiler.program_rewrites`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from paddle_ipu.compiler.onnx_passes import all_names, unique_name
from paddle_ipu.compiler.reader import FetchInfo, OpInfo
from paddle_ipu.compiler.sequence_rewrites import GRU_MARK
from paddle_ipu.errors import CompileError


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every node a unique name (the converter leaves Constant nodes unnamed)."""
    taken = {n.name for n in graph.node if n.name}
    counter = 0
    for node in graph.node:
        if node.name:
            continue
        while f"{node.op_type}.anon{counter}" in taken:
            counter += 1
        node.name = f"{node.op_type}.anon{counter}"
        taken.add(node.name)


def constants_to_initializers(
    graph: onnx.GraphProto, parameters: dict[str, tuple[tuple[int, ...], str]]
) -> dict[str, str]:
    """Move the Constant nodes holding Paddle parameters into initializers."""
    weights: dict[str, str] = {}
    keep: list[onnx.NodeProto] = []
    for node in graph.node:
        out = node.output[0] if len(node.output) == 1 else ""
        if node.op_type != "Constant" or out not in parameters:
            keep.append(node)
            continue
        attr = next((a for a in node.attribute if a.name == "value"), None)
        if attr is None:
            keep.append(node)
            continue
        tensor = attr.t
        shape, _ = parameters[out]
        if tuple(tensor.dims) != tuple(shape) and int(np.prod(shape, dtype=np.int64)) != int(
            np.prod(tuple(tensor.dims), dtype=np.int64)
        ):
            raise CompileError(
                f"parameter {out!r}: the converter emitted shape {list(tensor.dims)}, "
                f"the program declares {list(shape)}"
            )
        init = onnx.TensorProto()
        init.CopyFrom(tensor)
        init.name = out
        graph.initializer.append(init)
        weights[out] = out
    del graph.node[:]
    graph.node.extend(keep)
    return weights


def _empty_tensors(graph: onnx.GraphProto) -> set[str]:
    """Names of the zero-element constants (Constant nodes and initializers)."""
    empty = {i.name for i in graph.initializer if 0 in i.dims}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            for attr in node.attribute:
                if attr.name == "value" and 0 in attr.t.dims:
                    empty.add(node.output[0])
    return empty


def omit_empty_resize_inputs(graph: onnx.GraphProto) -> None:
    """Leave out a Resize's empty ``roi`` and ``scales`` operands when it has ``sizes``.

    The converter passes them as empty float constants.  ONNX reads an empty
    ``scales`` as absent, but a graph rewrite that routes it through a node (the
    fp16 conversion casts every float constant) makes it a computed tensor, and
    ONNX Runtime then refuses the Resize for having both sizes and scales.  An
    omitted optional operand (an empty name) means the same and survives that."""
    empty = _empty_tensors(graph)
    for node in graph.node:
        if node.op_type != "Resize" or len(node.input) < 4 or not node.input[3]:
            continue
        for k in (1, 2):
            if node.input[k] in empty:
                node.input[k] = ""


class _Rewriter:
    """Replaces the nodes attributed to one operator by new ones."""

    def __init__(
        self,
        graph: onnx.GraphProto,
        ops: Sequence[OpInfo],
        owner: dict[str, int],
        fetches: Sequence[FetchInfo],
    ) -> None:
        self.graph = graph
        self.ops = ops
        self.owner = owner
        self.taken = {n.name for n in graph.node} | all_names(graph)
        # (operator index, result index) -> the ONNX tensor holding it.  A fetched
        # result is named after the fetch (``fetch_name_N``), the others after
        # the converter's ``p2o.<op>.<k>.<j>`` scheme.
        self.results: dict[tuple[int, int], str] = {
            (i, j): name for i, info in enumerate(ops) for j, name in enumerate(info.onnx_names)
        }
        for out, fetch in zip(graph.output, fetches):
            if fetch.producer >= 0:
                self.results[(fetch.producer, fetch.result)] = out.name

    def fresh(self, base: str) -> str:
        name = unique_name(base, self.taken)
        self.taken.add(name)
        return name

    def operand(self, idx: int, k: int) -> str:
        info = self.ops[idx]
        src = info.use.sources[k] if k < len(info.use.sources) else None
        name = self.results.get(src, "") if isinstance(src, tuple) else src or ""
        if not name or name == "?" or name not in self.taken:
            raise CompileError(
                f"cannot correct the lowering of {info.use.describe()}: operand {k} has no "
                "tensor in the converted graph"
            )
        return name

    def result(self, idx: int, j: int) -> str:
        return self.results[(idx, j)]

    def const(self, nodes: list[onnx.NodeProto], value: Any, dtype: str, base: str) -> str:
        name = self.fresh(base)
        array = np.asarray(value, dtype=np.dtype(dtype))
        nodes.append(
            helper.make_node(
                "Constant", [], [name], name=name, value=numpy_helper.from_array(array, name)
            )
        )
        return name

    def node(
        self,
        nodes: list[onnx.NodeProto],
        op_type: str,
        inputs: list[str],
        out: str = "",
        **attrs: Any,
    ) -> str:
        out = out or self.fresh(f"{op_type}.fix")
        nodes.append(
            helper.make_node(op_type, inputs, [out], name=self.fresh(f"{op_type}.fix"), **attrs)
        )
        return out

    def replace(self, idx: int, nodes: list[onnx.NodeProto]) -> None:
        """Put ``nodes`` where operator ``idx``'s nodes were; they must produce
        every tensor of those nodes that anything else still reads."""
        graph = self.graph
        mine = [i for i, n in enumerate(graph.node) if self.owner.get(n.name) == idx]
        info = self.ops[idx]
        if not mine:
            raise CompileError(
                f"cannot correct the lowering of {info.use.describe()}: the converter "
                "emitted no node for it"
            )
        removed = {o for i in mine for o in graph.node[i].output}
        produced = {o for n in nodes for o in n.output}
        mine_set = set(mine)
        read_elsewhere = {
            name
            for i, n in enumerate(graph.node)
            if i not in mine_set
            for name in n.input
            if name in removed
        } | {o.name for o in graph.output if o.name in removed}
        missing = read_elsewhere - produced
        if missing:
            raise CompileError(
                f"cannot correct the lowering of {info.use.describe()}: the converted graph "
                f"reads {sorted(missing)} from it"
            )
        kept = [n for i, n in enumerate(graph.node) if i not in mine_set]
        at = mine[0]
        for n in nodes:
            self.owner[n.name] = idx
        new = kept[:at] + nodes + kept[at:]
        del graph.node[:]
        graph.node.extend(new)


def _x_dtype(info: OpInfo, k: int = 0) -> str:
    types = info.use.operand_types
    t = types[k] if k < len(types) else None
    if t is None:
        raise CompileError(
            f"cannot correct the lowering of {info.use.describe()}: operand {k} "
            "is not a dense tensor"
        )
    return t[0]


def _fix_hardtanh(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    dtype = _x_dtype(info)
    a = info.use.attrs
    nodes: list[onnx.NodeProto] = []
    lo = rw.const(nodes, float(a.get("t_min", 0.0)), dtype, "hardtanh.fix.min")
    hi = rw.const(nodes, float(a.get("t_max", 24.0)), dtype, "hardtanh.fix.max")
    rw.node(nodes, "Clip", [rw.operand(idx, 0), lo, hi], rw.result(idx, 0))
    rw.replace(idx, nodes)


def _fix_leaky_relu(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    slope = float(info.use.attrs.get("negative_slope", 0.02))
    nodes: list[onnx.NodeProto] = []
    rw.node(nodes, "LeakyRelu", [rw.operand(idx, 0)], rw.result(idx, 0), alpha=slope)
    rw.replace(idx, nodes)


def _fix_gelu(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    if not info.use.attrs.get("approximate", False):
        return
    dtype = _x_dtype(info)
    nodes: list[onnx.NodeProto] = []
    x = rw.operand(idx, 0)
    # Paddle's kernel: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
    x3 = rw.node(nodes, "Mul", [rw.node(nodes, "Mul", [x, x]), x])
    inner = rw.node(
        nodes, "Add", [x, rw.node(nodes, "Mul", [x3, rw.const(nodes, 0.044715, dtype, "gelu.c")])]
    )
    k = rw.const(nodes, float(np.sqrt(2.0 / np.pi)), dtype, "gelu.k")
    t = rw.node(nodes, "Tanh", [rw.node(nodes, "Mul", [inner, k])])
    one_t = rw.node(nodes, "Add", [t, rw.const(nodes, 1.0, dtype, "gelu.one")])
    half_x = rw.node(nodes, "Mul", [x, rw.const(nodes, 0.5, dtype, "gelu.half")])
    rw.node(nodes, "Mul", [half_x, one_t], rw.result(idx, 0))
    rw.replace(idx, nodes)


def _fix_cross_entropy(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    a = info.use.attrs
    if a.get("use_softmax", True):
        return
    dtype = _x_dtype(info)
    xt = info.use.operand_types[0]
    lt = info.use.operand_types[1] if len(info.use.operand_types) > 1 else None
    if xt is None or lt is None or len(xt[1]) != len(lt[1]):
        raise CompileError(
            f"cannot lower {info.use.describe()}: use_softmax=False needs the label with "
            "the rank of the input"
        )
    axis = int(a.get("axis", -1))
    nodes: list[onnx.NodeProto] = []
    x = rw.operand(idx, 0)
    label = rw.operand(idx, 1)
    # Without the softmax, Paddle's kernel passes the input through as the
    # "softmax" result and takes the loss from it directly:
    # hard labels: -log(x[label]) (0 where label == ignore_index);
    # soft labels: -sum(label * log(x)) over the axis.
    rw.node(nodes, "Identity", [x], rw.result(idx, 0))
    logx = rw.node(nodes, "Log", [x])
    if a.get("soft_label", False):
        prod = rw.node(nodes, "Mul", [label, logx])
        axes = rw.const(nodes, [axis], "int64", "ce.axes")
        total = rw.node(nodes, "ReduceSum", [prod, axes], keepdims=1)
        rw.node(nodes, "Neg", [total], rw.result(idx, 1))
    else:
        index = rw.node(nodes, "Cast", [label], to=onnx.TensorProto.INT64)
        ignore = rw.const(nodes, int(a.get("ignore_index", -100)), "int64", "ce.ignore")
        skip = rw.node(nodes, "Equal", [index, ignore])
        safe = rw.node(nodes, "Where", [skip, rw.const(nodes, 0, "int64", "ce.zero_i"), index])
        picked = rw.node(nodes, "GatherElements", [logx, safe], axis=axis)
        loss = rw.node(nodes, "Neg", [picked])
        zero = rw.const(nodes, 0.0, dtype, "ce.zero")
        rw.node(nodes, "Where", [skip, zero, loss], rw.result(idx, 1))
    rw.replace(idx, nodes)


def _fix_thresholded_relu(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    dtype = _x_dtype(info)
    a = info.use.attrs
    nodes: list[onnx.NodeProto] = []
    x = rw.operand(idx, 0)
    # Paddle's kernel: x > threshold ? x : value
    thr = rw.const(nodes, float(a.get("threshold", 1.0)), dtype, "thresholded_relu.threshold")
    value = rw.const(nodes, float(a.get("value", 0.0)), dtype, "thresholded_relu.value")
    above = rw.node(nodes, "Greater", [x, thr])
    rw.node(nodes, "Where", [above, x, value], rw.result(idx, 0))
    rw.replace(idx, nodes)


def _fix_group_norm(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    # The converter normalises each group with an InstanceNormalization whose
    # epsilon it leaves at 0.
    eps = float(info.use.attrs.get("epsilon", 1e-5))
    found = False
    for node in rw.graph.node:
        if rw.owner.get(node.name) == idx and node.op_type == "InstanceNormalization":
            kept = [a for a in node.attribute if a.name != "epsilon"]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.attribute.append(helper.make_attribute("epsilon", eps))
            found = True
    if not found:
        raise CompileError(
            f"cannot correct the lowering of {info.use.describe()}: no InstanceNormalization "
            "node to carry its epsilon"
        )


def _fix_half_norm(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    """A float16 input normalised with float32 statistics and scale (Paddle's fp16
    BatchNorm / InstanceNorm kernels take them so; ``cast_model_to_fp16`` keeps them
    float32): ONNX's normalisation nodes take one type, so those inputs are cast to
    float16 in front of the node."""
    types = info.use.operand_types
    if not types or types[0] is None or types[0][0] != "float16":
        return
    if not any(t is not None and t[0] == "float32" for t in types[1:]):
        return
    graph = rw.graph
    taken = all_names(graph)
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if rw.owner.get(node.name) == idx and node.op_type in (
            "BatchNormalization",
            "InstanceNormalization",
        ):
            for i in range(1, len(node.input)):
                if not node.input[i]:
                    continue
                cast = unique_name(f"{node.input[i]}.fp16", taken)
                taken.add(cast)
                new_nodes.append(
                    helper.make_node(
                        "Cast", [node.input[i]], [cast], name=cast, to=onnx.TensorProto.FLOAT16
                    )
                )
                rw.owner[cast] = idx
                node.input[i] = cast
        new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)


# Paddle's pad3d modes -> ONNX Pad's; "circular" is refused before conversion
# (ops.attribute_problem).
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


def _fix_pad3d(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    # The converter splits the paddings and re-concatenates them in ONNX order
    # (right), but never reads pad_value: its Pad's constant_value is whatever
    # memory it read (0.0 in most runs; -2.8e15 and 7e27 seen).  One Pad from the
    # paddings operand, in ONNX order, with pad_value.
    a = info.use.attrs
    mode = _PAD_MODES.get(str(a.get("mode", "constant")))
    if mode is None:
        raise CompileError(f"cannot lower {info.use.describe()}: mode {a.get('mode')!r}")
    nodes: list[onnx.NodeProto] = []
    x = rw.operand(idx, 0)
    # Paddle: [left, right, top, bottom, front, back] for W, H, D; ONNX: the
    # begins of every axis, then the ends.
    paddings = rw.node(nodes, "Cast", [rw.operand(idx, 1)], to=onnx.TensorProto.INT64)
    zeros = rw.const(nodes, [0, 0], "int64", "pad3d.fix.zeros")
    zero = rw.const(nodes, [0], "int64", "pad3d.fix.zero")
    begin = rw.node(nodes, "Gather", [paddings, rw.const(nodes, [4, 2, 0], "int64", "pad3d.b")])
    end = rw.node(nodes, "Gather", [paddings, rw.const(nodes, [5, 3, 1], "int64", "pad3d.e")])
    if str(a.get("data_format", "NCDHW")) == "NCDHW":
        pads = rw.node(nodes, "Concat", [zeros, begin, zeros, end], axis=0)
    else:  # NDHWC
        pads = rw.node(nodes, "Concat", [zero, begin, zero, zero, end, zero], axis=0)
    inputs = [x, pads]
    if mode == "constant":
        inputs.append(rw.const(nodes, float(a.get("pad_value", 0.0)), _x_dtype(info), "pad3d.v"))
    rw.node(nodes, "Pad", inputs, rw.result(idx, 0), mode=mode)
    rw.replace(idx, nodes)


def _fix_gru(rw: _Rewriter, idx: int, info: OpInfo) -> None:
    """A ``pd_op.rnn`` standing in for Paddle 1.x's ``gru``
    (:mod:`paddle_ipu.compiler.sequence_rewrites`, whose mark holds the attributes):
    its ONNX GRU node gets the ``gru``'s semantics: the reset gate applied to the
    state before the candidate's matrix product, and the activations the mark names."""
    mark = info.use.attrs.get(GRU_MARK)
    if mark is None:
        return  # a paddle.nn.GRU: the converter's lowering is its own
    grus = [n for n in rw.graph.node if rw.owner.get(n.name) == idx and n.op_type == "GRU"]
    if len(grus) != 1:
        raise CompileError(
            f"cannot lower {info.use.describe()} (a gru): the converter emitted "
            f"{len(grus)} GRU nodes for it, expected 1"
        )
    (node,) = grus
    wanted = {"linear_before_reset": 0, **json.loads(str(mark))}
    keep = [a for a in node.attribute if a.name not in wanted]
    del node.attribute[:]
    node.attribute.extend(keep)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in wanted.items())


_CORRECTIONS = {
    "pd_op.rnn": _fix_gru,
    "pd_op.pad3d": _fix_pad3d,
    "pd_op.batch_norm": _fix_half_norm,
    "pd_op.batch_norm_": _fix_half_norm,
    "pd_op.instance_norm": _fix_half_norm,
    "pd_op.thresholded_relu": _fix_thresholded_relu,
    "pd_op.group_norm": _fix_group_norm,
    "pd_op.hardtanh": _fix_hardtanh,
    "pd_op.leaky_relu": _fix_leaky_relu,
    "pd_op.gelu": _fix_gelu,
    "pd_op.cross_entropy_with_softmax": _fix_cross_entropy,
}


def correct_lowerings(
    graph: onnx.GraphProto,
    ops: Sequence[OpInfo],
    owner: dict[str, int],
    fetches: Sequence[FetchInfo],
) -> None:
    """Replace the converter's lowering of the operators it gets wrong (see above)."""
    rw: _Rewriter | None = None
    for idx, info in enumerate(ops):
        fix = _CORRECTIONS.get(info.type)
        if fix is None:
            continue
        if rw is None:
            rw = _Rewriter(graph, ops, owner, fetches)
        fix(rw, idx, info)


def repair_fetch_aliases(
    graph: onnx.GraphProto, ops: Sequence[OpInfo], fetches: Sequence[FetchInfo]
) -> None:
    """Point each output back at the value the fetch asked for.

    Paddle's ``save_inference_model`` fetches ``scale(v, 1.0, bias)`` as ``v``
    itself when ``v`` has a name (a feed or a parameter): it takes such a scale
    for the one it appends to fetches, whatever the bias, so the bias is lost.
    The converter still lowers the scale, under its ``p2o`` name; a fetched
    result keeps that name only when the fetch was redirected like this.
    """
    produced = {o for n in graph.node for o in n.output}
    for out, fetch in zip(graph.output, fetches):
        if fetch.producer < 0:
            continue
        names = ops[fetch.producer].onnx_names
        own = names[fetch.result] if fetch.result < len(names) else ""
        if own and own != out.name and own in produced:
            out.name = own


def _elem_types(graph: onnx.GraphProto, out: dict[str, int]) -> dict[str, int]:
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.tensor_type.elem_type:
            out[info.name] = info.type.tensor_type.elem_type
    for init in graph.initializer:
        out[init.name] = init.data_type
    for node in graph.node:
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if node.op_type == "Constant" and attr is not None and attr.name == "value":
            out[node.output[0]] = attr.t.data_type
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _elem_types(a.g, out)
    return out


def boolean_where(model: onnx.ModelProto) -> int:
    """``Where`` over booleans -- the converter's lowering of ``select_input``, which
    merges a legacy ``conditional_block``'s result with its default -- has no kernel in
    ONNX Runtime: it becomes ``Or(And(c, x), And(Not(c), y))``, in every graph and
    subgraph.  Returns how many were rewritten."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False)
    types = _elem_types(inferred.graph, {})
    taken = set(types)
    boolean = onnx.TensorProto.BOOL

    def fix(graph: onnx.GraphProto) -> int:
        count = 0
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    count += fix(a.g)
            ins = list(node.input)
            if (
                node.op_type != "Where"
                or len(ins) != 3
                or any(types.get(n) != boolean for n in ins[1:])
            ):
                nodes.append(node)
                continue
            c, x, y = ins
            names = [unique_name(f"{node.name}.{part}", taken) for part in ("a", "not", "b")]
            taken.update(names)
            nodes += [
                helper.make_node("And", [c, x], [names[0]], name=names[0]),
                helper.make_node("Not", [c], [names[1]], name=names[1]),
                helper.make_node("And", [names[1], y], [names[2]], name=names[2]),
                helper.make_node("Or", [names[0], names[2]], list(node.output), name=node.name),
            ]
            count += 1
        del graph.node[:]
        graph.node.extend(nodes)
        return count

    return fix(model.graph)


def concat_scalars(model: onnx.ModelProto) -> int:
    """Make the scalars a Concat joins with vectors vectors (an Unsqueeze each); returns
    how many.

    The converter builds a shape from a list of sizes by squeezing a size read from
    ``Shape`` to a scalar and concatenating it with one-element vectors.  With every
    size static the shape folds into a constant and nothing runs it; in a graph whose
    sizes stay open ONNX Runtime refuses the Concat ("all inputs to Concat must have
    same rank")."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    rank: dict[str, int] = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        t = value.type.tensor_type
        if t.HasField("shape"):
            rank[value.name] = len(t.shape.dim)
    for init in model.graph.initializer:
        rank[init.name] = len(init.dims)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    rank[node.output[0]] = len(attr.t.dims)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    taken = {n.name for n in model.graph.node} | all_names(model.graph)
    nodes: list[onnx.NodeProto] = []
    fixed = 0
    for node in model.graph.node:
        ranks = [rank.get(i) for i in node.input]
        if node.op_type == "Concat" and 0 in ranks and 1 in ranks:
            for k, (name, r) in enumerate(zip(list(node.input), ranks)):
                if r != 0:
                    continue
                out = unique_name(f"{name}.as_vector", taken)
                taken.add(out)
                if opset >= 13:
                    axes = unique_name(f"{name}.axes", taken)
                    taken.add(axes)
                    zero = numpy_helper.from_array(np.array([0], np.int64))
                    nodes.append(helper.make_node("Constant", [], [axes], name=axes, value=zero))
                    nodes.append(helper.make_node("Unsqueeze", [name, axes], [out], name=out))
                else:
                    nodes.append(helper.make_node("Unsqueeze", [name], [out], name=out, axes=[0]))
                node.input[k] = out
                fixed += 1
        nodes.append(node)
    if fixed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return fixed
