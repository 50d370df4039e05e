"""Static shapes for the ONNX Loops the converter makes of ``pd_op.while``.

paddle2onnx lowers a PIR ``while`` to an ONNX ``Loop`` (no trip count: the loop's own
condition, computed by the model, ends it) and an ``if`` to an ONNX ``If``.  ONNX
shape inference gives an If's outputs the shapes its branches agree on, but drops the
shapes of a Loop's carried values, which the ONNX standard lets change from one
iteration to the next; without them nothing after the loop has a static shape, and
the IPU compiles static shapes.

:func:`type_loops` gives them back where they are the same in every iteration: each
Loop's body is inferred with its carried inputs of the shapes the loop starts from
(the values of the enclosing graph it reads typed as that graph's inference types
them); a carried value whose shape the body keeps gets it on the body's input and
output and on the Loop's result, which the later inference keeps.  A carried value
whose shape the body changes (a sequence grown by concatenation every step) is
refused by name: its size after the loop depends on how many steps the data asks for.

Before that, the body's shape arithmetic is folded (the Shapes of its values of static
shape, and what computes from constants: ONNX shape inference reads a Squeeze's axes or
a Reshape's target only as a constant), and the shapes the converter declared inside
the body's own subgraphs are dropped (it declares Paddle's 0-d where its lowering makes
``[1]``, a conflict ONNX Runtime refuses).  A carried value the body writes before it
reads it -- Paddle 2.x's dy2static started a decoder's outputs as placeholders of
another shape -- starts from zeros of the shape the body gives it: the loop's results
are Paddle's whenever the loop runs at least once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx
from onnx import helper

from paddle_ipu.compiler.onnx_passes import (
    DECLARED_SHAPE,
    constants_as_initializers,
    fold_subgraph,
    node_reads,
)
from paddle_ipu.errors import CompileError

__all__ = ["type_loops"]

#: value_info doc_string marking the types :func:`type_loops` declared (kept by the
#: final inference, which clears the rest)
DECLARED = DECLARED_SHAPE


def _static(info: onnx.ValueInfoProto | None) -> bool:
    if info is None or not info.type.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in info.type.tensor_type.shape.dim)


def _dims(info: onnx.ValueInfoProto) -> list[int]:
    return [int(d.dim_value) for d in info.type.tensor_type.shape.dim]


def _same_elements(a: list[int], b: list[int]) -> bool:
    """Shapes that differ only in dimensions of size 1 ([] and [1])."""
    return a != b and [d for d in a if d != 1] == [d for d in b if d != 1]


def _reshape_input(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    index: int,
    dims: list[int],
    start: onnx.ValueInfoProto,
) -> onnx.ValueInfoProto:
    """Input ``index`` of ``node`` reshaped to ``dims`` by a node inserted before it;
    returns the reshaped value's type."""
    import numpy as np
    from onnx import numpy_helper

    source = node.input[index]
    name = f"{source}.loop_shape.{node.name}.{index}"
    shape = numpy_helper.from_array(np.asarray(dims, np.int64), f"{name}.shape")
    at = list(graph.node).index(node)
    graph.node.insert(at, helper.make_node("Reshape", [source, shape.name], [name], name=name))
    graph.node.insert(at, helper.make_node("Constant", [], [shape.name], value=shape))
    node.input[index] = name
    typed = onnx.ValueInfoProto()
    typed.CopyFrom(start)
    typed.name = name
    del typed.type.tensor_type.shape.dim[:]
    for d in dims:
        typed.type.tensor_type.shape.dim.add().dim_value = d
    return typed


def _graph_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every typed name of the main graph after ONNX shape inference (initializers and
    Constant outputs included)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    constants_as_initializers(probe.graph)
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    graph = inferred.graph
    types = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
    for init in graph.initializer:
        types.setdefault(
            init.name, helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        )
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                name = node.output[0]
                types.setdefault(
                    name, helper.make_tensor_value_info(name, value.data_type, list(value.dims))
                )
    return types


def _body_reads(body: onnx.GraphProto) -> list[str]:
    """The names a body uses that it neither defines nor takes as inputs (values of
    the enclosing graph), nested graphs included."""
    defined = {i.name for i in body.input} | {init.name for init in body.initializer}
    used: list[str] = []

    def walk(nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            for name in node.input:
                if name and name not in defined and name not in used:
                    used.append(name)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    defined.update(i.name for i in attr.g.input)
                    walk(attr.g.node)
            defined.update(node.output)

    walk(body.node)
    return used


def _clear_nested_shapes(graph: onnx.GraphProto) -> None:
    """Drop the shapes the converter declared inside ``graph``'s subgraphs (value_info,
    the outputs of an If's branches; their element types stay): it declares Paddle's
    shapes, a 0-d value where its own lowering makes ``[1]``, which ONNX shape inference
    and ONNX Runtime then refuse as a conflict; they are inferred instead."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type != onnx.AttributeProto.GRAPH:
                continue
            sub = attr.g
            del sub.value_info[:]
            for out in sub.output:
                out.type.tensor_type.ClearField("shape")
            _clear_nested_shapes(sub)


def _probe(
    body: onnx.GraphProto,
    carried: list[onnx.ValueInfoProto],
    outer: dict[str, onnx.ValueInfoProto],
    opsets: Iterable[onnx.OperatorSetIdProto],
) -> onnx.GraphProto:
    """``body`` inferred with its carried inputs of the types ``carried`` and the values
    it reads from outside of the types ``outer`` gives them."""
    probe = onnx.GraphProto()
    probe.CopyFrom(body)
    for info, typed in zip(probe.input[2:], carried):
        info.type.CopyFrom(typed.type)
    for name in _body_reads(body):
        if name in outer:
            extra = probe.input.add()
            extra.CopyFrom(outer[name])
    for out in probe.output:
        out.type.tensor_type.ClearField("shape")
    del probe.value_info[:]
    _clear_nested_shapes(probe)
    model = helper.make_model(probe, opset_imports=list(opsets))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    return inferred.graph


def _static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """The static shapes inference found in ``graph`` and its subgraphs."""
    shapes: dict[str, tuple[int, ...]] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if _static(info):
            shapes[info.name] = tuple(_dims(info))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                shapes.update(_static_shapes(attr.g))
    return shapes


def _fold_body(
    body: onnx.GraphProto,
    carried: list[onnx.ValueInfoProto],
    outer: dict[str, onnx.ValueInfoProto],
    constants: dict[str, Any],
    opsets: list[onnx.OperatorSetIdProto],
) -> None:
    """Fold the body's shape arithmetic (:func:`.onnx_passes.fold_subgraph`): the
    Shapes of its values of static shape, with its carried inputs of the shapes the
    loop starts from, and what computes from constants, round after round.  Sound for
    the values whose shape the body keeps, by induction over the iterations; a value
    whose shape it changes is refused after (type_loops)."""
    for _ in range(len(body.node) + 1):
        shapes = _static_shapes(_probe(body, carried, outer, opsets))
        if not fold_subgraph(body, constants, shapes):
            return


def _infer_body(
    body: onnx.GraphProto,
    carried: list[onnx.ValueInfoProto],
    outer: dict[str, onnx.ValueInfoProto],
    opsets: Iterable[onnx.OperatorSetIdProto],
) -> dict[str, onnx.ValueInfoProto]:
    """The body's outputs' types when its carried inputs have the types ``carried``
    and the values it reads from outside the types ``outer`` gives them."""
    graph = _probe(body, carried, outer, opsets)
    types = {v.name: v for v in (*graph.value_info, *graph.output, *graph.input)}
    return {o.name: types.get(o.name, o) for o in body.output}


def _unread(body: onnx.GraphProto) -> set[str]:
    """The carried inputs of ``body`` that it never reads (nested graphs included): a
    value the loop writes before it reads it, whose start is a placeholder."""
    read = {n for node in body.node for n in node_reads(node)}
    read |= {o.name for o in body.output}
    return {i.name for i in body.input[2:] if i.name not in read}


def _zeros_input(
    graph: onnx.GraphProto, node: onnx.NodeProto, index: int, end: onnx.ValueInfoProto
) -> onnx.ValueInfoProto:
    """Input ``index`` of Loop ``node`` replaced by zeros of the type ``end``; returns
    the new value's type."""
    import numpy as np
    from onnx import numpy_helper

    name = f"{node.input[index]}.loop_start.{node.name}.{index}"
    shape = numpy_helper.from_array(np.asarray(_dims(end), np.int64), f"{name}.shape")
    dtype = helper.tensor_dtype_to_np_dtype(end.type.tensor_type.elem_type)
    zero = numpy_helper.from_array(np.zeros([1], dtype), f"{name}.zero")
    at = list(graph.node).index(node)
    graph.node.insert(at, helper.make_node("ConstantOfShape", [shape.name], [name], name=name,
                                           value=zero))  # fmt: skip
    graph.node.insert(at, helper.make_node("Constant", [], [shape.name], value=shape))
    node.input[index] = name
    typed = onnx.ValueInfoProto()
    typed.CopyFrom(end)
    typed.name = name
    return typed


def _outer_constants(graph: onnx.GraphProto) -> dict[str, Any]:
    """The values of the main graph's Constant nodes, for folding inside bodies."""
    from onnx import numpy_helper

    out: dict[str, Any] = {}
    for node in graph.node:
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if node.op_type == "Constant" and attr is not None and attr.name == "value":
            out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def type_loops(model: onnx.ModelProto, describe: dict[str, str] | None = None) -> int:
    """Declare the static shapes of the Loops' carried values in ``model`` (see the
    module docstring); returns how many Loops were typed.  ``describe`` maps a Loop's
    first output to a description of the Paddle operator it lowers, for errors."""
    graph = model.graph
    loops = [node for node in graph.node if node.op_type == "Loop"]
    if not loops:
        return 0
    declared: dict[str, onnx.ValueInfoProto] = {}
    opsets = list(model.opset_import)
    for node in loops:
        types = _graph_types(model)
        body = next(a.g for a in node.attribute if a.name == "body")
        starts = [types.get(name) for name in node.input[2:]]
        what = (describe or {}).get(node.output[0], f"the ONNX Loop {node.name!r}")
        for k, (name, start) in enumerate(zip(node.input[2:], starts)):
            if not _static(start):
                raise CompileError(
                    f"{what}: the shape of its carried value #{k} ({name!r}) is not static "
                    "where the loop starts; the IPU compiles static shapes"
                )
        typed = [s for s in starts if s is not None]
        _clear_nested_shapes(body)
        _fold_body(body, typed, types, _outer_constants(graph), opsets)
        ends = _infer_body(body, typed, types, opsets)
        scans = len(node.output) - (len(node.input) - 2)
        if scans:
            raise CompileError(
                f"{what}: a loop with {scans} scan output(s) (values stacked over the "
                "iterations) has a size that depends on the number of iterations; the "
                "IPU compiles static shapes"
            )
        unread = _unread(body)
        for k, (start, out) in enumerate(zip(starts, body.output[1:])):
            assert start is not None
            end = ends.get(out.name)
            if end is None or not _static(end):
                if not _compatible(end, start):
                    raise CompileError(
                        f"{what}: its carried value #{k} starts with shape {_dims(start)} "
                        f"and the loop's body makes it {_text(end)}: the shape it has after "
                        "an iteration could not be inferred as static; the IPU compiles "
                        "static shapes"
                    )
            elif body.input[2 + k].name in unread and _dims(end) != _dims(start):
                # a placeholder the body writes before it reads it (Paddle 2.x's
                # dy2static starts a decoder's outputs as 0-d values): the loop starts
                # from zeros of the shape the body gives it
                start = _zeros_input(graph, node, 2 + k, end)
            elif _same_elements(_dims(end), _dims(start)):
                # a 0-d value the body makes [1] (Paddle treats the two alike): the loop
                # starts from it reshaped, so its shape is the same in every iteration
                start = _reshape_input(graph, node, 2 + k, _dims(end), start)
            elif _dims(end) != _dims(start):
                raise CompileError(
                    f"{what}: its carried value #{k} starts with shape {_dims(start)} and "
                    f"the loop's body makes it {_dims(end)}: its size after the loop depends "
                    "on how many iterations the data asks for, and the IPU compiles static "
                    "shapes; give it its final size before the loop (a buffer written at the "
                    "step's index)"
                )
            body.input[2 + k].type.CopyFrom(start.type)
            out.type.CopyFrom(start.type)
            result = helper.make_value_info(node.output[k], start.type)
            result.doc_string = DECLARED
            declared[node.output[k]] = result
        cond = types.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if cond is not None and _static(cond):
            # the condition as the loop is given it ([1] where Paddle's is 0-d)
            body.input[1].type.CopyFrom(cond.type)
            body.output[0].type.tensor_type.ClearField("shape")
        existing = {v.name for v in graph.value_info}
        for name, info in declared.items():
            if name not in existing:
                graph.value_info.append(info)
    return len(loops)


def _compatible(end: onnx.ValueInfoProto | None, start: onnx.ValueInfoProto) -> bool:
    """Whether a shape inference left partly open (``end``) can be ``start``'s: no
    shape at all, or the same rank with the static dimensions equal."""
    if end is None or not end.type.tensor_type.HasField("shape"):
        return True
    dims = end.type.tensor_type.shape.dim
    if len(dims) != len(_dims(start)):
        return False
    return all(not d.HasField("dim_value") or d.dim_value == s for d, s in zip(dims, _dims(start)))


def _text(info: onnx.ValueInfoProto | None) -> str:
    if info is None or not info.type.tensor_type.HasField("shape"):
        return "of unknown shape"
    dims = info.type.tensor_type.shape.dim
    return str([d.dim_value if d.HasField("dim_value") else -1 for d in dims])
