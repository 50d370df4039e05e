"""The fp16 compiler pass: a float32 ONNX graph rewritten to compute in float16.

Every backend receives ``enable_fp16`` as this one pass over the compiled graph, so
the host (ONNX Runtime) and the Poplar SDK (PopART) run the same fp16 graph: float32
initializers become float16, and casts keep the graph's inputs and outputs in
float32 (``keep_io_types``), which is what the executor feeds and fetches.

The rewrite is onnxconverter-common's ``convert_float_to_float16``; this module owns
its failure modes (it raises plain exceptions) and the options it is called with.
"""

from __future__ import annotations

from typing import Any

from paddle_ipu.errors import CompileError


def convert_proto(proto: Any) -> Any:
    """Return ``proto`` (an ``onnx.ModelProto``) converted to float16 compute.

    Raises:
        CompileError: the converter refused the graph (its message included).
    """
    from onnxconverter_common import float16

    _separate_consumed_outputs(proto)
    try:
        converted = float16.convert_float_to_float16(
            proto, keep_io_types=True, disable_shape_infer=False
        )
    except Exception as exc:  # the converter raises plain exceptions
        raise CompileError(f"converting the graph to fp16 failed: {exc}") from exc
    _retype_float_casts(converted)
    return converted


def _retype_float_casts(proto: Any) -> None:
    """Make every ``Cast(to=FLOAT)`` whose result the converter retyped to float16 cast
    to FLOAT16.

    onnxconverter-common retypes a Cast's result (its value_info) to float16 but keeps
    the Cast's ``to`` attribute (onnxconverter-common issue #320), and ONNX Runtime
    refuses the graph ("Type (tensor(float16)) of output arg ... does not match") --
    every decoder whose attention mask is cast to float.  The Cast's consumers were
    converted to read float16, so casting to float16 is what the graph means."""
    from onnx import TensorProto

    graph = proto.graph
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in (*graph.value_info, *graph.output)
        if vi.type.HasField("tensor_type")
    }
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type != "Cast" or node.output[0] in outputs:
            continue
        if types.get(node.output[0]) != TensorProto.FLOAT16:
            continue
        for attr in node.attribute:
            if attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16


def _separate_consumed_outputs(proto: Any) -> None:
    """Give every graph output that other nodes also read its own Identity node.

    onnxconverter_common's keep_io_types casts a graph output back to float32 under
    the output's name, but leaves the nodes that read the same tensor expecting
    float16, which ONNX Runtime refuses ("Type (tensor(float16)) of output arg ...
    does not match") -- the case of an intermediate value fetched and used further.
    """
    from onnx import helper

    graph = proto.graph
    read = {name for node in graph.node for name in node.input}
    produced = {name for node in graph.node for name in node.output}
    for output in graph.output:
        name = output.name
        if name not in read or name not in produced:
            continue
        inner = f"{name}::inner"
        for node in graph.node:
            for i, value in enumerate(node.output):
                if value == name:
                    node.output[i] = inner
            for i, value in enumerate(node.input):
                if value == name:
                    node.input[i] = inner
        graph.node.append(helper.make_node("Identity", [inner], [name], name=f"{name}::out"))


def convert_storage(proto: Any) -> Any:
    """Return ``proto`` with its float32 constants held in float16 and its arithmetic
    left in float32.

    Every float32 initializer (weights included: a weight without data, which the
    session supplies, is retyped) becomes float16 and is read through a Cast to
    float32, which ONNX Runtime folds when it loads the graph; every float32
    ``Constant`` node's value is rounded to float16 (and stays typed float32).  The
    graph's inputs and outputs keep their types, as with :func:`convert_proto`.  What
    is rounded is what the IPU holds in float16; the operators' results are not
    rounded, so the errors are those of the weights and constants alone.  Values are
    rounded as :func:`convert_proto` rounds them (onnxconverter-common's clamping to
    float16's range included)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    taken = {n for node in graph.node for n in (*node.input, *node.output)}
    taken |= {i.name for i in graph.initializer} | {i.name for i in graph.input}
    renamed: dict[str, str] = {}
    casts = []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT:
            continue
        if init.raw_data or init.float_data:
            half = numpy_helper.from_array(_to_half(numpy_helper.to_array(init)))
            init.ClearField("float_data")
            init.raw_data = half.raw_data
        init.data_type = TensorProto.FLOAT16
        name = f"{init.name}::fp32"
        while name in taken:
            name += "_"
        taken.add(name)
        renamed[init.name] = name
        casts.append(
            helper.make_node(
                "Cast", [init.name], [name], name=f"{name}::cast", to=TensorProto.FLOAT
            )
        )
    for node in graph.node:
        for i, value in enumerate(node.input):
            if value in renamed:
                node.input[i] = renamed[value]
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
                    rounded = _to_half(numpy_helper.to_array(attr.t))
                    attr.t.CopyFrom(
                        numpy_helper.from_array(rounded.astype(np.float32), attr.t.name)
                    )
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return proto


def _to_half(array: Any) -> Any:
    """float16 values as :func:`convert_proto` makes them (onnxconverter-common's
    rounding, clamped to float16's range); it refuses 0-d arrays, so via 1-d."""
    import numpy as np
    from onnxconverter_common.float16 import convert_np_to_float16

    return np.asarray(convert_np_to_float16(np.atleast_1d(array))).reshape(np.shape(array))


def convert_model(onnx_bytes: bytes) -> bytes:
    """:func:`convert_proto` on a serialized model; returns the serialized result."""
    import onnx

    return bytes(convert_proto(onnx.load_from_string(onnx_bytes)).SerializeToString())


__all__ = ["convert_model", "convert_proto", "convert_storage"]
