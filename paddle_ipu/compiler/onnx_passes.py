"""ONNX passes that turn the converter's model into the one the executor runs.

- Parameters: the converter emits every Paddle parameter as a ``Constant`` node
  whose output is named after the parameter.  Those become initializers with the
  same name, so the executor writes and reads weights by Paddle name; the value
  shape is checked against the program's parameter shape.
- Feeds and fetches: a ``-1`` batch dimension becomes ``micro_batch_size``;
  outputs are renamed from ``fetch_name_N`` to the fetch's own name (or a name
  made from the operator that computes it); a 0-D fetch is reshaped to the 0-D
  tensor Paddle returns (the converter produces shape ``[1]`` under a rank-0
  declaration); ONNX shape inference then gives every output a static shape.
- Sharding: each node is attributed to the Paddle operator it was converted
  from (see :func:`attribute_nodes`), whose ipu_index / ipu_stage it receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from paddle_ipu._util import dtypes
from paddle_ipu.compiler.model import ShardSpec, TensorSpec
from paddle_ipu.compiler.reader import FeedInfo, FetchInfo, OpInfo
from paddle_ipu.errors import CompileError

IPU_NUMBER_ATTR = "__ipu_number"
PIPELINE_STAGE_ATTR = "__pipeline_stage"


def attribute_nodes(
    graph: onnx.GraphProto, ops: Sequence[OpInfo], output_producers: dict[str, int]
) -> dict[str, int]:
    """ONNX node name -> index of the Paddle operator it was converted from.

    The converter turns operators one at a time, in program order, and names
    each operator's results ``p2o.<op>.<k>.<j>`` (the k-th operator of that
    type) or, for fetched results, after the fetch.  A node that produces such a
    name belongs to that operator, and so do the helper nodes emitted just
    before it.  A helper node emitted after an operator's last named result
    (rare) belongs to it when it reads one of that operator's unnamed
    intermediates, else to the next operator.  Exact for every node that
    computes an operator's result; the helper attribution relies on the
    converter's emission order.
    """
    marker: dict[str, int] = dict(output_producers)
    for idx, info in enumerate(ops):
        for name in info.onnx_names:
            marker.setdefault(name, idx)
    owner: dict[str, int] = {}
    internal: dict[str, int] = {}
    pending: list[onnx.NodeProto] = []
    current = -1

    def assign(node: onnx.NodeProto, idx: int) -> None:
        owner[node.name] = idx
        for out in node.output:
            if out not in marker:
                internal[out] = idx

    for node in graph.node:
        hits = [marker[o] for o in node.output if o in marker]
        if hits:
            idx = hits[0]
            for p in pending:
                assign(p, idx)
            pending = []
            assign(node, idx)
            current = idx
        elif current >= 0 and any(internal.get(i) == current for i in node.input):
            assign(node, current)
        else:
            pending.append(node)
    for p in pending:
        if current >= 0:
            assign(p, current)
    return owner


def apply_shards(
    graph: onnx.GraphProto,
    ops: Sequence[OpInfo],
    owner: dict[str, int],
    *,
    manual_shard: bool,
    pipelining: bool,
) -> dict[str, ShardSpec]:
    """Set PopART's sharding attributes on the nodes; return the shard table."""
    shards: dict[str, ShardSpec] = {}
    if not (manual_shard or pipelining):
        return shards
    for node in graph.node:
        idx = owner.get(node.name, -1)
        if idx < 0:
            continue
        info = ops[idx]
        index = info.ipu_index if manual_shard else -1
        stage = info.ipu_stage if pipelining else -1
        if index < 0 and stage < 0:
            continue
        if index >= 0:
            node.attribute.append(helper.make_attribute(IPU_NUMBER_ATTR, index))
        if stage >= 0:
            node.attribute.append(helper.make_attribute(PIPELINE_STAGE_ATTR, stage))
        shards[node.name] = ShardSpec(ipu_index=index, ipu_stage=stage)
    return shards


def drop_identities(graph: onnx.GraphProto) -> None:
    """Remove Identity nodes whose output is not a graph output.

    The converter routes many results through Identity nodes; they hide
    constant shape operands (a Reshape's target shape) from ONNX shape inference.
    """
    outputs = {o.name for o in graph.output}
    alias: dict[str, str] = {}
    keep: list[onnx.NodeProto] = []
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n in alias:
                node.input[i] = alias[n]
        if node.op_type == "Identity" and node.output[0] not in outputs:
            alias[node.output[0]] = node.input[0]
            continue
        keep.append(node)
    if alias:
        del graph.node[:]
        graph.node.extend(keep)


def drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes none of whose outputs is used (left over after folding)."""
    needed = {o.name for o in graph.output}
    keep: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(reversed(keep))


def drop_unused_weights(graph: onnx.GraphProto, weights: dict[str, str]) -> None:
    """Remove parameter initializers that no node reads, and their weight entries.

    ``paddle.nn.LSTM`` / ``GRU`` pass an empty ``dropout_state`` parameter that the
    converter does not use.  ONNX Runtime drops an unused initializer while it
    loads the graph and then fails to find it when the session supplies its value."""
    used = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    unused = [i.name for i in graph.initializer if i.name in weights and i.name not in used]
    if not unused:
        return
    keep = [init for init in graph.initializer if init.name not in unused]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    for name in unused:
        del weights[name]


def all_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        names.update(node.output)
    return names


def rename_tensor(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n == old:
                node.input[i] = new
        for i, n in enumerate(node.output):
            if n == old:
                node.output[i] = new
    for out in graph.output:
        if out.name == old:
            out.name = new


def unique_name(base: str, taken: set[str]) -> str:
    name = base
    n = 1
    while name in taken:
        name = f"{base}_{n}"
        n += 1
    return name


def rename_outputs(graph: onnx.GraphProto, fetches: Sequence[FetchInfo]) -> list[str]:
    """Rename the outputs after the fetches; make 0-D fetches 0-D.  Returns the new names."""
    if len(graph.output) != len(fetches):
        raise CompileError(
            f"the converter produced {len(graph.output)} outputs for {len(fetches)} fetches"
        )
    inputs = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    taken = all_names(graph)
    names: list[str] = []
    for out, fetch in zip(list(graph.output), fetches):
        old = out.name
        wanted = fetch.paddle_name or fetch.default_name
        new = wanted if wanted == old else unique_name(wanted, taken)
        if old in inputs:
            # A feed or parameter fetched as is: the output needs its own tensor.
            new = unique_name(f"{wanted}.out" if wanted == old else new, taken)
            graph.node.append(helper.make_node("Identity", [old], [new], name=f"{new}.identity"))
            out.name = new
        elif new != old:
            rename_tensor(graph, old, new)
        taken.add(new)
        if fetch.shape == () and new not in inputs:
            pre = unique_name(f"{new}.as_tensor", taken)
            taken.add(pre)
            rename_tensor(graph, new, pre)
            out.name = new
            shape_name = unique_name(f"{new}.scalar_shape", taken)
            taken.add(shape_name)
            graph.initializer.append(
                numpy_helper.from_array(np.zeros((0,), dtype=np.int64), shape_name)
            )
            graph.node.append(
                helper.make_node("Reshape", [pre, shape_name], [new], name=f"{new}.to_scalar")
            )
        names.append(new)
    return names


def fix_inputs(
    graph: onnx.GraphProto,
    feeds: Sequence[FeedInfo],
    micro_batch_size: int,
    sequence_length: int | None = None,
) -> list[TensorSpec]:
    """Make every feed an input with a static shape, in feed order: a dynamic batch
    dimension gets ``micro_batch_size``, any other dynamic dimension
    ``sequence_length`` (an error when it is None)."""
    existing = {i.name: i for i in graph.input}
    ordered: list[onnx.ValueInfoProto] = []
    specs: list[TensorSpec] = []
    for feed in feeds:
        vi = existing.pop(feed.name, None)
        if vi is None:
            # Fed but unused by the fetches: keep it so feeds line up with inputs.
            elem = dtypes.onnx_type(feed.dtype)
            vi = helper.make_tensor_value_info(feed.name, elem, list(feed.shape))
        dims = vi.type.tensor_type.shape.dim
        shape: list[int] = []
        for axis, dim in enumerate(dims):
            static = dim.HasField("dim_value") and dim.dim_value > 0
            if static:
                shape.append(int(dim.dim_value))
                continue
            if axis != 0 and sequence_length is None:
                raise CompileError(
                    f"feed {feed.name!r} has a dynamic dimension {axis} "
                    f"(declared shape {list(feed.shape)}); only the batch dimension (0) may be "
                    "-1: give the other dimensions fixed sizes, or compile buckets of "
                    "sequence lengths (seq_buckets)"
                )
            size = micro_batch_size if axis == 0 else int(sequence_length or 0)
            dim.Clear()
            dim.dim_value = size
            shape.append(size)
        elem_type = vi.type.tensor_type.elem_type
        dtype = dtypes.from_onnx(elem_type)
        ordered.append(vi)
        specs.append(
            TensorSpec(name=feed.name, dtype=dtype, shape=tuple(shape), paddle_name=feed.name)
        )
    if existing:
        raise CompileError(f"the converted graph has inputs that are not feeds: {sorted(existing)}")
    del graph.input[:]
    graph.input.extend(ordered)
    return specs


def _constants_as_initializers(graph: onnx.GraphProto) -> None:
    keep: list[onnx.NodeProto] = []
    for node in graph.node:
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if node.op_type == "Constant" and attr is not None and attr.name == "value":
            init = onnx.TensorProto()
            init.CopyFrom(attr.t)
            init.name = node.output[0]
            graph.initializer.append(init)
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)


# Small integer computations on constants and static shapes that the converter
# emits for reshape targets and the like; folded so shape inference sees
# constants (and the IPU gets static shapes).
_FOLDABLE = frozenset(
    {
        "Add", "Cast", "Concat", "ConstantOfShape", "Div", "Equal", "Expand", "Gather",
        "Identity", "Less", "Greater", "Max", "Min", "Mul", "Range", "ReduceProd", "Reshape",
        "Shape", "Size", "Slice", "Squeeze", "Sub", "Tile", "Unsqueeze", "Where", "Not",
        # integer division and rounding of sizes (floor_divide, remainder, ceil)
        "Floor", "Ceil", "Mod", "Neg", "Abs", "And", "Or", "GreaterOrEqual", "LessOrEqual",
        "ReduceMax", "ReduceMin", "ReduceSum",
    }
)  # fmt: skip
_FOLD_LIMIT = 4096  # elements: shape arithmetic only, never real tensors


def _static_shapes(
    model: onnx.ModelProto, wanted: set[str] | None = None
) -> dict[str, tuple[int, ...]]:
    """The static shapes ONNX shape inference gives the model's values (only those in
    ``wanted``, when given), and the constants'."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    _constants_as_initializers(probe.graph)
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if wanted is not None and vi.name not in wanted:
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = tt.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    shapes.update(_constant_shapes(model.graph))
    return shapes


def _constant_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """The shapes of the constants (Constant nodes and initializers, the weights
    included): ONNX shape inference lists only computed values, and a Shape of a
    constant (a Llama mask's ``Expand(arange, Max(.., Shape(arange)))``, a tile's
    repeats) must fold too."""
    shapes = {i.name: tuple(int(d) for d in i.dims) for i in graph.initializer}
    for node in graph.node:
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if node.op_type == "Constant" and attr is not None and attr.name == "value":
            shapes[node.output[0]] = tuple(int(d) for d in attr.t.dims)
    return shapes


def fold_shape_arithmetic(
    model: onnx.ModelProto, weights: set[str], max_rounds: int | None = None
) -> None:
    """Replace nodes computing small constants (from static shapes) by Constant nodes.

    Each round folds what one shape inference resolves; a folded Reshape target can
    make the next shape static, so the rounds go on until nothing changes (a chain
    of channel shuffles needs one round per shuffle).  ``max_rounds`` caps them
    (None: every node can fold at most once, so at most one round per node)."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    rounds = max_rounds if max_rounds is not None else len(graph.node) + 1
    # the constants found so far (a round only adds to them)
    const: dict[str, np.ndarray] = {
        i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name not in weights
    }
    for _ in range(rounds):
        shapes = _static_shapes(model, {n.input[0] for n in graph.node if n.op_type == "Shape"})
        changed = False
        for pos, node in enumerate(graph.node):
            if node.op_type == "Constant":
                attr = node.attribute[0] if len(node.attribute) == 1 else None
                if attr is not None and attr.name == "value" and node.output[0] not in const:
                    const[node.output[0]] = numpy_helper.to_array(attr.t)
                continue
            if node.op_type not in _FOLDABLE or len(node.output) != 1:
                continue
            value: np.ndarray | None = None
            if node.op_type == "Shape":
                shape = shapes.get(node.input[0])
                if shape is None:
                    continue
                attrs = {a.name: a.i for a in node.attribute}
                start = attrs.get("start", 0)
                end = attrs.get("end", len(shape))
                value = np.array(shape[start:end] if "end" in attrs else shape[start:], np.int64)
            else:
                ins = [n for n in node.input if n]
                if not ins or any(n not in const for n in ins):
                    continue
                if any(const[n].size > _FOLD_LIMIT for n in ins):
                    continue
                feeds: dict[str, Any] = {n: const[n] for n in ins}
                if node.op_type == "Concat" and all(v.ndim <= 1 for v in feeds.values()):
                    # The converter builds a reshape's target of an open size from
                    # scalars (0-d) and 1-d pieces, which ONNX's Concat refuses: their
                    # concatenation as 1-d is the target it means.
                    feeds = {n: np.atleast_1d(v) for n, v in feeds.items()}
                try:
                    results: Any = ReferenceEvaluator(node).run(None, feeds)
                    value = np.asarray(results[0])
                except Exception:
                    continue
                if value.size > _FOLD_LIMIT:
                    continue
            out = node.output[0]
            const[out] = value
            folded = helper.make_node(
                "Constant", [], [out], name=node.name, value=numpy_helper.from_array(value, out)
            )
            graph.node[pos].CopyFrom(folded)
            changed = True
        if not changed:
            return


def infer_outputs(
    model: onnx.ModelProto, names: Sequence[str], fetches: Sequence[FetchInfo]
) -> list[TensorSpec]:
    """Run ONNX shape inference and read every output's static shape."""
    graph = model.graph
    for out in graph.output:
        out.type.tensor_type.ClearField("shape")
    del graph.value_info[:]
    # Shape inference reads constant operands (Reshape targets, Slice bounds)
    # from initializers more reliably than from Constant nodes: infer on a copy
    # whose constants are initializers, and keep the model itself as it is.
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    _constants_as_initializers(probe.graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise CompileError(f"ONNX shape inference failed on the converted graph: {exc}") from exc
    by_name = {o.name: o for o in inferred.graph.value_info}
    for o in inferred.graph.output:
        if o.type.tensor_type.HasField("shape"):
            by_name[o.name] = o
    # An output computed from constants only (``fill_constant(...) + ...``) is folded
    # into a Constant, an initializer of the probe, for which inference writes no
    # value_info: its type is the initializer's.
    for init in probe.graph.initializer:
        if init.name not in by_name:
            by_name[init.name] = helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)
            )
    specs: list[TensorSpec] = []
    for out, name, fetch in zip(graph.output, names, fetches):
        info = by_name.get(name)
        if info is None or not info.type.tensor_type.HasField("shape"):
            raise CompileError(f"could not infer a static shape for fetch {name!r}")
        shape: list[int] = []
        for dim in info.type.tensor_type.shape.dim:
            if not (dim.HasField("dim_value") and dim.dim_value >= 0):
                raise CompileError(
                    f"fetch {name!r} has no static shape after shape inference "
                    f"({info.type.tensor_type.shape}); its size must not depend on data"
                )
            shape.append(int(dim.dim_value))
        out.type.CopyFrom(info.type)
        dtype = dtypes.from_onnx(info.type.tensor_type.elem_type)
        specs.append(
            TensorSpec(
                name=name,
                dtype=dtype,
                shape=tuple(shape),
                paddle_name=fetch.paddle_name or name,
            )
        )
    return specs


# -- corrections of the converter's lowering -----------------------------------
#
# paddle2onnx 2.1 misreads some PIR operators' attributes: it reads hardtanh's
# bounds and leaky_relu's slope under their legacy names (and so gets the
# defaults), always emits gelu's exact
# (erf) formula, and lowers cross_entropy_with_softmax(use_softmax=False) as if
# the softmax were still to be applied; it ignores thresholded_relu's value and
# group_norm's epsilon.  For each of these the nodes the
# converter made for the operator are replaced by a lowering of our own, built
# from the attributes the reader recorded; the conformance suite
# (tests/conformance) checks every one against Paddle's CPU kernels.
