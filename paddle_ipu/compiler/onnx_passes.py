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
  from (see :func:`attribute_nodes`), whose ipu_index / ipu_stage it receives,
  and its matmul and convolution nodes the operator's IPU hints
  (:func:`apply_hints`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from paddle_ipu._util import dtypes
from paddle_ipu.compiler.model import ShardSpec, TensorSpec
from paddle_ipu.compiler.pir_values import (
    AVAILABLE_MEMORY_ATTR,
    SERIALIZE_FACTOR_ATTR,
    SERIALIZE_MODE_ATTR,
)
from paddle_ipu.compiler.reader import FeedInfo, FetchInfo, OpInfo
from paddle_ipu.errors import CompileError

log = logging.getLogger("paddle_ipu")

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


#: PopART's node attributes for Paddle 2.x's operator hints
#: (willow/include/popart/names.hpp; read by PopART's MatMul and Conv op creators)
AVAILABLE_MEMORY_NODE_ATTR = "__available_memory"
SERIALIZE_MODE_NODE_ATTR = "__serialize_matmul_mode"
SERIALIZE_FACTOR_NODE_ATTR = "__serialize_matmul_factor"
SERIALIZE_PRECISION_NODE_ATTR = "__serialize_matmul_precision"
_AMP_NODES = frozenset({"MatMul", "Conv", "ConvTranspose"})


def apply_hints(graph: onnx.GraphProto, ops: Sequence[OpInfo], owner: dict[str, int]) -> None:
    """Put the IPU hints of each Paddle operator (``op._set_attr``, see
    :mod:`paddle_ipu.compat.op_attrs`) on its matmul and convolution nodes, as Paddle
    2.x's IPU compiler did: ``__available_memory`` when above 0
    (``setAvailableMemoryProportion``), and for a matmul with ``serialize_factor`` the
    serialisation mode (``serialize_mode``, default ``output_channels``), factor and
    precision kept (``setSerializeMatMul(ids, mode, factor, true)``).  A hint on an
    operator without such a node has no effect, as on Paddle 2.x (logged)."""
    hinted = {i for i, info in enumerate(ops) if info.hints}
    if not hinted:
        return
    reached: set[int] = set()
    for node in graph.node:
        idx = owner.get(node.name, -1)
        if idx not in hinted or node.op_type not in _AMP_NODES:
            continue
        hints = ops[idx].hints
        reached.add(idx)
        amp = hints.get(AVAILABLE_MEMORY_ATTR)
        if amp is not None and amp > 0:
            node.attribute.append(helper.make_attribute(AVAILABLE_MEMORY_NODE_ATTR, float(amp)))
        factor = hints.get(SERIALIZE_FACTOR_ATTR)
        if factor is not None and node.op_type == "MatMul":
            mode = hints.get(SERIALIZE_MODE_ATTR, "output_channels")
            node.attribute.extend(
                [
                    helper.make_attribute(SERIALIZE_MODE_NODE_ATTR, str(mode)),
                    helper.make_attribute(SERIALIZE_FACTOR_NODE_ATTR, int(factor)),
                    helper.make_attribute(SERIALIZE_PRECISION_NODE_ATTR, 1),
                ]
            )
    for idx in sorted(hinted - reached):
        log.info(
            "%s: its IPU hints %s apply to matmuls and convolutions only; they have no "
            "effect on this operator (as on Paddle 2.x)",
            ops[idx].use.describe(),
            sorted(ops[idx].hints),
        )


def _marked(node: onnx.NodeProto) -> bool:
    """A node of a custom op's region (compiler.custom_regions), kept as it is."""
    return any(a.name == "__ipu_custom_op" for a in node.attribute)


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


def _defined(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        names.update(node.output)
    return names


def outer_reads(graph: onnx.GraphProto) -> list[str]:
    """The names a subgraph (a Loop's body, an If's branch) reads from the graphs
    around it, nested subgraphs included."""
    defined = _defined(graph)
    out: list[str] = []
    for node in graph.node:
        for name in node_reads(node):
            if name and name not in defined and name not in out:
                out.append(name)
    for o in graph.output:
        if o.name not in defined and o.name not in out:
            out.append(o.name)
    return out


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The names ``node`` reads: its inputs, and what its subgraphs read from around
    them (a Loop body's weights)."""
    names = [i for i in node.input if i]
    for sub in _subgraphs(node):
        names += [n for n in outer_reads(sub) if n not in names]
    return names


def _rename_reads(node: onnx.NodeProto, mapping: dict[str, str]) -> None:
    """Rename what ``node``'s subgraphs read from around them (``mapping``: old ->
    new), where a subgraph does not define the name itself."""
    for sub in _subgraphs(node):
        defined = _defined(sub)
        for inner in sub.node:
            for i, n in enumerate(inner.input):
                if n in mapping and n not in defined:
                    inner.input[i] = mapping[n]
            _rename_reads(inner, {k: v for k, v in mapping.items() if k not in defined})
        for o in sub.output:
            if o.name in mapping and o.name not in defined:
                o.name = mapping[o.name]


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
        if alias:
            _rename_reads(node, alias)
        # (a custom op's marked Identity stays: custom_regions reads its marks)
        if node.op_type == "Identity" and node.output[0] not in outputs and not _marked(node):
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
            needed.update(node_reads(node))
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(reversed(keep))


def drop_unused_weights(graph: onnx.GraphProto, weights: dict[str, str]) -> None:
    """Remove parameter initializers that no node reads, and their weight entries.

    ``paddle.nn.LSTM`` / ``GRU`` pass an empty ``dropout_state`` parameter that the
    converter does not use.  ONNX Runtime drops an unused initializer while it
    loads the graph and then fails to find it when the session supplies its value."""
    used = {i for node in graph.node for i in node_reads(node)} | {o.name for o in graph.output}
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
        _rename_reads(node, {old: new})
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


def constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor of a ``Constant`` node that holds one (its ``value`` attribute), None
    for any other node.  PopART's own attributes (``__ipu_number``, ``__pipeline_stage``
    under manual sharding, ...) may stand beside ``value``: they place the node, they do
    not change its value."""
    if node.op_type != "Constant":
        return None
    value: onnx.TensorProto | None = None
    for attr in node.attribute:
        if attr.name == "value":
            value = attr.t
        elif not attr.name.startswith("__"):
            return None  # value_float, sparse_value ...: not read here
    return value


def constants_as_initializers(graph: onnx.GraphProto) -> None:
    keep: list[onnx.NodeProto] = []
    for node in graph.node:
        value = constant_value(node)
        if value is not None:
            init = onnx.TensorProto()
            init.CopyFrom(value)
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
    constants_as_initializers(probe.graph)
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
        value = constant_value(node)
        if value is not None:
            shapes[node.output[0]] = tuple(int(d) for d in value.dims)
    return shapes


def fold_shape_arithmetic(
    model: onnx.ModelProto, weights: set[str], max_rounds: int | None = None
) -> None:
    """Replace nodes computing small constants (from static shapes) by Constant nodes.

    Each round folds what one shape inference resolves; a folded Reshape target can
    make the next shape static, so the rounds go on until nothing changes (a chain
    of channel shuffles needs one round per shuffle).  ``max_rounds`` caps them
    (None: every node can fold at most once, so at most one round per node).  Then
    the subgraphs' constant-only nodes fold (:func:`fold_subgraph`)."""
    graph = model.graph
    rounds = max_rounds if max_rounds is not None else len(graph.node) + 1
    # the constants found so far (a round only adds to them)
    const: dict[str, np.ndarray] = {
        i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name not in weights
    }
    for _ in range(rounds):
        wanted = {n.input[0] for n in graph.node if n.op_type == "Shape"}
        if not fold_nodes(graph, const, _static_shapes(model, wanted)):
            break
    for node in graph.node:
        for sub in _subgraphs(node):
            fold_subgraph(sub, const)


def fold_nodes(
    graph: onnx.GraphProto,
    const: dict[str, np.ndarray],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> bool:
    """One pass over ``graph``'s nodes: each whose inputs are small constants (in
    ``const``, which gains every Constant node's value and each fold's), or a Shape of a
    value of static shape (``shapes``), becomes a Constant node.  Whether any did."""
    changed = False
    for pos, node in enumerate(graph.node):
        if node.op_type == "Constant":
            value_t = constant_value(node)
            if value_t is not None:
                const[node.output[0]] = numpy_helper.to_array(value_t)
            continue
        if node.op_type not in _FOLDABLE or len(node.output) != 1 or _marked(node):
            continue
        value: np.ndarray | None = None
        if node.op_type == "Shape":
            shape = (shapes or {}).get(node.input[0])
            if shape is None:
                continue
            attrs = {a.name: a.i for a in node.attribute}
            start = attrs.get("start", 0)
            end = attrs.get("end", len(shape))
            value = np.array(shape[start:end] if "end" in attrs else shape[start:], np.int64)
        else:
            value = _evaluate(node, const)
            if value is None:
                continue
        out = node.output[0]
        const[out] = value
        folded = helper.make_node(
            "Constant", [], [out], name=node.name, value=numpy_helper.from_array(value, out)
        )
        graph.node[pos].CopyFrom(folded)
        changed = True
    return changed


def fold_subgraph(
    sub: onnx.GraphProto,
    outer: Mapping[str, np.ndarray],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> bool:
    """Fold a subgraph's nodes (a Loop's body, an If's branch; :func:`fold_nodes`) that
    compute from small constants -- its own, or those of the graphs around it
    (``outer``) -- or take the Shape of a value of static shape (``shapes``), its own
    subgraphs' too: a body's Squeeze axes cast from a constant, which ONNX shape
    inference reads only as a constant.  Whether any did."""
    const = {k: v for k, v in outer.items() if k not in _defined(sub)}
    const.update({i.name: numpy_helper.to_array(i) for i in sub.initializer})
    changed = fold_nodes(sub, const, shapes)
    for node in sub.node:
        for inner in _subgraphs(node):
            changed = fold_subgraph(inner, const, shapes) or changed
    return changed


def _evaluate(node: onnx.NodeProto, const: dict[str, np.ndarray]) -> np.ndarray | None:
    """``node``'s output when every input is a small constant (else None)."""
    from onnx.reference import ReferenceEvaluator

    ins = [n for n in node.input if n]
    if not ins or any(n not in const for n in ins):
        return None
    if any(const[n].size > _FOLD_LIMIT for n in ins):
        return None
    feeds: dict[str, Any] = {n: const[n] for n in ins}
    if node.op_type == "Concat" and all(v.ndim <= 1 for v in feeds.values()):
        # The converter builds a reshape's target of an open size from scalars (0-d) and
        # 1-d pieces, which ONNX's Concat refuses: their concatenation as 1-d is the
        # target it means.
        feeds = {n: np.atleast_1d(v) for n, v in feeds.items()}
    try:
        results: Any = ReferenceEvaluator(node).run(None, feeds)
        value = np.asarray(results[0])
    except Exception:
        return None
    return None if value.size > _FOLD_LIMIT else value


#: doc_string of a value_info whose shape a pass declared that ONNX shape inference
#: cannot find (a Loop's carried value: :mod:`.control_flow`); infer_outputs keeps it
DECLARED_SHAPE = "paddle_ipu: loop-carried shape"


def infer_outputs(
    model: onnx.ModelProto, names: Sequence[str], fetches: Sequence[FetchInfo]
) -> list[TensorSpec]:
    """Run ONNX shape inference and read every output's static shape."""
    graph = model.graph
    for out in graph.output:
        out.type.tensor_type.ClearField("shape")
    # the Loops' carried values keep the shapes control_flow.type_loops declared
    kept = [v for v in graph.value_info if v.doc_string == DECLARED_SHAPE]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    # Shape inference reads constant operands (Reshape targets, Slice bounds)
    # from initializers more reliably than from Constant nodes: infer on a copy
    # whose constants are initializers, and keep the model itself as it is.
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    constants_as_initializers(probe.graph)
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
