"""The IPU's float16 arithmetic in the ONNX graph the host runs (inference).

Every operator's float result is rounded to float16 (:mod:`.numerics`): the host
computes in float32 and puts a rounding after each operator -- a ``Cast`` to float16
and back (with a ``Clip`` at +-65504 before it where the result can overflow:
saturation), or the stochastic rounding of :meth:`.onnx_edit.Editor.round_to`.
Operators whose results are their operands' values (data movement, max/min, ReLU,
max pooling ...: :data:`EXACT`) need no rounding; operators with steps of their own
are rewritten by :mod:`.fp16_ops`.  Graph inputs are rounded where they enter, as
the IPU receives them in float16; weights and constants are held in float16.

Where the roundings go.  ONNX Runtime's blocked layout for convolutions (its NCHWc
transformer, about 3x faster on this CPU) only spans operators it knows, and a
``Cast`` is not one.  So by default (:func:`prepare` then ONNX Runtime's
optimisation, then :func:`finish`) the roundings go after the operators ONNX Runtime
runs once it has optimised the graph: a convolution or matmul and what it joins to
it -- a bias, a BatchNorm, an activation, a residual addition -- are one operator
with one rounding, as when the compiler folds them before converting to float16;
the IPU rounds each of them (each rounding moves a value by at most half a float16
ulp).  The fusions that would merge operators of several roundings into one kernel
(layer norm, GELU, attention, softmax with a bias ...) are disabled
(:data:`KEEP_APART`).  ``exact=True`` rounds after every operator of the compiled
graph instead (the floating-point checks use it: a trap names an operator of the
compiled graph).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from paddle_ipu.backends.host import fp16_ops
from paddle_ipu.backends.host.numerics import Fp16Arithmetic, round_fp16
from paddle_ipu.backends.host.onnx_edit import FLOAT, FLOAT16, MARK, Editor
from paddle_ipu.compiler.float32_ops import read_by

#: the results are values of the operands (or exactly representable from them)
EXACT = frozenset(
    {
        "Relu", "MaxPool", "GlobalMaxPool", "Reshape", "Transpose", "Concat", "Split",
        "Slice", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Gather", "GatherElements",
        "GatherND", "ScatterND", "ScatterElements", "Max", "Min", "Neg", "Abs", "Expand",
        "Tile", "Pad", "Where", "ReduceMax", "ReduceMin", "TopK", "Sign", "Floor", "Ceil",
        "Round", "Clip", "DepthToSpace", "SpaceToDepth", "Dropout", "Constant",
        "ConstantOfShape", "ReorderInput", "ReorderOutput", "Shape", "Size", "OneHot",
    }
)  # fmt: skip
#: results within float16's range whatever the (float16) operands: no saturation
BOUNDED = frozenset(
    {
        "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Erf", "Sin", "Cos", "HardSigmoid",
        "Sqrt", "Log", "ReduceMean", "GlobalAveragePool", "AveragePool", "LeakyRelu",
        "HardSwish", "Gelu", "Softsign",
    }
)  # fmt: skip
#: operators that can turn an infinity operand into a finite result other than the one
#: +-65504 gives (1 / inf, comparisons with 65504, ties of an arg-max, a cast to an
#: integer, IsInf): with lazy saturation a flag watches their float operands
ABSORBING = frozenset(
    {
        "Div", "Reciprocal", "Pow", "Greater", "Less", "GreaterOrEqual", "LessOrEqual",
        "Equal", "ArgMax", "ArgMin", "TopK", "IsInf", "Mod",
    }
)  # fmt: skip
#: lazy saturation's flag, a graph output (not finite: an operand that is not finite
#: reached an operator of ABSORBING, or an output is not finite)
WATCHED = "paddle_ipu::absorbed"
#: ONNX Runtime fusions that would compute several rounded operators in one kernel,
#: or merge the host's constants with the graph's
KEEP_APART = (
    "LayerNormFusionL1", "LayerNormFusionL2", "SimplifiedLayerNormFusion",
    "SkipLayerNormFusion", "BiasSkipLayerNormFusion", "EmbedLayerNormFusion",
    "AttentionFusion", "GroupQueryAttentionFusion", "GroupQueryAttentionPreNormFusion",
    "GeluFusionL1", "GeluFusionL2", "BiasGeluFusion", "FastGeluFusion", "QuickGeluFusion",
    "BiasSoftmaxFusion", "BiasDropoutFusion", "SwiGluFusion", "MatMulScaleFusion",
    "ConstantSharing", "CommonSubexpressionElimination",
)  # fmt: skip


#: float initializers of fewer elements stay in the graph
INLINE_ELEMENTS = 1024


def _exact(node: onnx.NodeProto, types: Mapping[str, int]) -> bool:
    op = node.op_type
    if op == "Cast":
        # float16 -> float32 is exact; anything else into float32 is rounded
        return bool(node.input) and types.get(node.input[0]) == FLOAT16
    if op in ("ScatterND", "ScatterElements"):
        reduction = [a.s for a in node.attribute if a.name == "reduction"]
        return not reduction or reduction[0] == b"none"
    if op in ("Upsample", "Resize"):
        modes = [a.s for a in node.attribute if a.name == "mode"]
        return bool(modes) and modes[0] == b"nearest"
    return op in EXACT


def _watch_operands(ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic) -> None:
    """Lazy saturation: note the operands of an operator of :data:`ABSORBING` (or of a
    cast to a non-float type) through which an infinity could become a finite value:
    a divisor, the base of a power to a negative or unknown exponent, every operand
    of a comparison (constants are finite: never noted)."""
    if not (arith.saturate and arith.lazy_saturation) or node.name.startswith(MARK):
        return
    op = node.op_type
    to_int = op == "Cast" and ed.types.get(node.output[0]) not in (FLOAT, FLOAT16)
    if op not in ABSORBING and not to_int:
        return
    operands = list(node.input)
    if op == "Div":
        operands = operands[1:2]
    elif op == "Pow":
        exponent = ed.constants.get(operands[1]) if len(operands) > 1 else None
        positive = exponent is not None and bool(np.all(exponent > 0))
        operands = [] if positive else operands[:1]
    ed.watched.extend(
        n for n in operands if n and ed.types.get(n) == FLOAT and n not in ed.constants
    )


def _add_watch(ed: Editor, arith: Fp16Arithmetic) -> None:
    """Lazy saturation's one flag, the graph output :data:`WATCHED`: the sum of the
    watched operands' values and of the graph's float outputs, not finite when one of
    them is not (they are float16 values or infinities: a sum of finite ones cannot
    overflow float32).  One scalar for the session to look at after a run."""
    if not (arith.saturate and arith.lazy_saturation):
        return
    outputs = [o.name for o in ed.graph.output if ed.types.get(o.name) == FLOAT]
    names = list(dict.fromkeys([*ed.watched, *outputs]))
    if not names:
        return
    # ReduceSum without axes reduces every axis, in every opset
    sums = [ed.emit("ReduceSum", [n], f"{n}::watch", keepdims=0) for n in names]
    ed.emit("Sum" if len(sums) > 1 else "Identity", sums, WATCHED, out=WATCHED)
    ed.graph.output.append(onnx.helper.make_tensor_value_info(WATCHED, FLOAT, []))


def _round_outputs(ed: Editor, node: onnx.NodeProto, arith: Fp16Arithmetic) -> list[str]:
    """Round ``node``'s float outputs (it is the last node emitted); returns the names
    its unrounded results now have."""
    if node.name.startswith(MARK) or _exact(node, ed.types):
        return []
    bounded = node.op_type in BOUNDED
    raws = []
    for k, out in enumerate(node.output):
        if not out or ed.types.get(out) != FLOAT or out in ed.rounded:
            continue
        raw = ed.name(f"{out}::raw")
        node.output[k] = raw
        ed.types[raw] = FLOAT
        ed.round_to(raw, out, arith, out=out, bounded=bounded)
        raws.append(raw)
    return raws


def _round_inputs(ed: Editor, arith: Fp16Arithmetic) -> dict[str, str]:
    """The graph's float inputs rounded as they arrive (to nearest: the host's
    conversion of a feed to float16); returns input -> rounded tensor."""
    initializers = {i.name for i in ed.graph.initializer}
    nearest = Fp16Arithmetic(saturate=arith.saturate)
    return {
        vi.name: ed.round_to(vi.name, f"{vi.name}::fp16", nearest)
        for vi in ed.graph.input
        if ed.types.get(vi.name) == FLOAT and vi.name not in initializers
    }


def prepare(
    model: onnx.ModelProto,
    arith: Fp16Arithmetic,
    *,
    exact: bool = False,
    stable_norm: bool = False,
    float32: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """Rewrite ``model`` (float32 arithmetic, float16 weights and constants) into the
    IPU's float16 arithmetic: the inputs rounded, the operators of :mod:`.fp16_ops`
    rewritten; with ``exact`` every other operator's result rounded too (else
    :func:`finish` does it after ONNX Runtime's optimisation).  In place.

    ``float32``: the nodes that compute in float32 (``fp16_black_list``): their results
    are not rounded, and an operator not among them reads a rounded copy (as the IPU
    casts a float32 result to float16 for a float16 operator); a float16 result they
    read is rounded where it is made, so that no fusion of ONNX Runtime's computes it
    unrounded inside theirs.  Returns the tensors :func:`finish` leaves as they are."""
    ed = Editor(model)
    renamed = _round_inputs(ed, arith)
    widened = read_by(model.graph.node, float32) if float32 else frozenset()
    unrounded: set[str] = set()
    copies: dict[str, str] = {}
    for node in list(model.graph.node):
        listed = node.name in float32
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
            elif name in unrounded and not listed:
                if name not in copies:
                    copies[name] = ed.round_to(name, f"{name}::fp16", arith)
                node.input[i] = copies[name]
        if listed:
            ed.nodes.append(node)
            unrounded.update(o for o in node.output if o)
            continue
        if fp16_ops.rewrite(ed, node, arith, stable_norm=stable_norm):
            continue
        if exact:
            _watch_operands(ed, node, arith)
        ed.nodes.append(node)
        if exact or widened.intersection(node.output):
            unrounded.update(_round_outputs(ed, node, arith))
    if exact:
        _add_watch(ed, arith)
    ed.commit()
    return frozenset(unrounded)


def finish(
    model: onnx.ModelProto, arith: Fp16Arithmetic, unrounded: frozenset[str] = frozenset()
) -> onnx.ModelProto:
    """Round the results of every operator of ONNX Runtime's optimised graph
    ``model`` that :func:`prepare` did not round (see the module's docstring), but
    for ``unrounded`` (what :func:`prepare` returned).  In place; returned."""
    ed = Editor(model, infer=False)
    ed.rounded.update(unrounded)
    for node in list(model.graph.node):
        _watch_operands(ed, node, arith)
        ed.nodes.append(node)
        _round_outputs(ed, node, arith)
    _add_watch(ed, arith)
    ed.commit()
    return model


def round_constants(
    arrays: Mapping[str, np.ndarray], keep: frozenset[str] = frozenset()
) -> dict[str, np.ndarray]:
    """Float32 initializers as the IPU holds them: float16 values (the host's own
    constants, named with :data:`MARK`, and those of ``keep``, which float16 cannot
    hold, kept as they are)."""
    return {
        name: round_fp16(a)
        if a.dtype == np.float32 and not name.startswith(MARK) and name not in keep
        else a
        for name, a in arrays.items()
    }


# -- ONNX Runtime's optimisation, between prepare and finish --------------------------
@contextlib.contextmanager
def _scratch() -> Iterator[str]:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="paddle_ipu_fp16_", dir=base) as d:
        yield d


def optimize(
    model: onnx.ModelProto, external: Mapping[str, Any], threads: int
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ONNX Runtime's optimisation of ``model`` (its fusions but :data:`KEEP_APART`,
    its constant folding and its blocked layout), as a graph and its initializers:
    ``external`` supplies the values of the initializers ``model`` marks external
    (name -> OrtValue or array).  Returns the optimised graph, whose initializers
    are marked external with their values in the returned dict."""
    import onnxruntime as ort

    with _scratch() as d:
        path = os.path.join(d, "optimized.onnx")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, threads)
        opts.log_severity_level = 3
        opts.optimized_model_filepath = path
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "optimized.data"
        )
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "0"
        )
        if external:
            names = list(external)
            values = [
                v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
                for v in external.values()
            ]
            opts.add_external_initializers(names, values)
        ort.InferenceSession(
            model.SerializeToString(),
            sess_options=opts,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=list(KEEP_APART),
        )
        optimized = onnx.load(path, load_external_data=False)
        arrays = _external_arrays(optimized, os.path.join(d, "optimized.data"))
    return optimized, arrays


def _external_arrays(model: onnx.ModelProto, data_path: str) -> dict[str, np.ndarray]:
    """Read the external initializers of ``model`` from ``data_path``: the float ones of
    :data:`INLINE_ELEMENTS` elements or more come back as arrays (their initializers
    stay data-less, the session supplies them), the others go back into the graph
    (ONNX Runtime reads shapes and small constants when it loads a graph)."""
    arrays: dict[str, np.ndarray] = {}
    raw = np.fromfile(data_path, dtype=np.uint8) if os.path.exists(data_path) else None

    def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
        yield graph
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(attr.g)

    # a Loop's body or an If's branch keeps its constants inline: the session supplies
    # the main graph's only
    every = [(init, g is model.graph) for g in graphs(model.graph) for init in g.initializer]
    for init, main in every:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in init.external_data}
        offset, length = int(info.get("offset", 0)), int(info["length"])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        shape = tuple(int(d) for d in init.dims)
        assert raw is not None or not length
        array = (
            raw[offset : offset + length].view(dtype).reshape(shape).copy()  # type: ignore[index]
            if length
            else np.zeros(shape, dtype)
        )
        if main and dtype == np.float32 and array.size >= INLINE_ELEMENTS:
            arrays[init.name] = array
        else:
            init.CopyFrom(numpy_helper.from_array(array, init.name))
    return arrays


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The values of ``model``'s initializers that hold data (not external)."""
    return {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if init.data_location != onnx.TensorProto.EXTERNAL
    }
