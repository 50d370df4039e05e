"""The fp16 compiler pass: a float32 ONNX graph rewritten to compute in float16.

Every backend receives ``enable_fp16`` as this one pass over the compiled graph, so
the host (ONNX Runtime) and the Poplar SDK (PopART) run the same fp16 graph: float32
initializers become float16, and casts keep the graph's inputs and outputs in
float32 (``keep_io_types``), which is what the executor feeds and fetches.

The rewrite is onnxconverter-common's ``convert_float_to_float16``; this module owns
its failure modes (it raises plain exceptions) and the options it is called with.

Trained weights (:func:`prepare`): values are rounded to float16 over its real range
(largest finite value 65504; onnxconverter-common's default clamps at 1e4, and lifts
tiny values to 1e-7), nothing is clamped.  First every inference BatchNorm whose
tensors are constants is folded into the convolution before it, in float32
(:mod:`paddle_ipu.compiler.conv_folds`, with the other constant per-channel
operators around convolutions: this removes variances near 1e8); then any
weight or constant still outside float16's range stays float32 and is reported
(:class:`Fp16Report`, one log line naming the tensors).  Training folds nothing (its
BatchNorms use batch statistics and its weights change) and refuses such a weight.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_ipu.errors import CompileError, NotSupportedError

log = logging.getLogger("paddle_ipu")

#: float16's largest finite value
FLOAT16_MAX = 65504.0
#: the smallest magnitude that does not round to zero in float16 (half the smallest
#: subnormal, 2**-24, rounds to even: to zero)
FLOAT16_TINY = 2.0**-25


def convert_proto(proto: Any, keep: Collection[str] = (), float32: Collection[str] = ()) -> Any:
    """Return ``proto`` (an ``onnx.ModelProto``) converted to float16 compute.

    ``keep``: tensors (initializers, Constant outputs) that stay float32
    (:attr:`Fp16Report.kept_names`); the nodes reading them compute in float32.
    ``float32``: nodes that compute in float32 (``fp16_black_list``, as
    :mod:`paddle_ipu.compiler.float32_ops` says; pass the weights they read in ``keep``).
    Values are rounded to nearest over float16's whole range (no clamp).

    Raises:
        CompileError: the converter refused the graph (its message included).
    """
    from onnxconverter_common import float16

    _separate_consumed_outputs(proto)
    if float32:
        # a graph output a listed node makes is float32 (and the Identity that now
        # makes it, when other nodes read the value, reads it in float32)
        producer = {out: node.name for node in proto.graph.node for out in node.output}
        float32 = set(float32) | {
            node.name
            for node in proto.graph.node
            if node.op_type == "Identity"
            and node.name.endswith("::out")
            and producer.get(node.input[0]) in float32
        }
    blocked = _readers_of(proto.graph, keep) | set(float32)
    try:
        converted = float16.convert_float_to_float16(
            proto,
            keep_io_types=True,
            disable_shape_infer=False,
            # float16's real range; values outside it are in ``keep`` (prepare)
            min_positive_val=0.0,
            max_finite_val=FLOAT16_MAX,
            node_block_list=sorted(blocked),
        )
    except Exception as exc:  # the converter raises plain exceptions
        raise CompileError(f"converting the graph to fp16 failed: {exc}") from exc
    _retype_float_casts(converted)
    if float32:
        from paddle_ipu.compiler.float32_ops import join_float32

        join_float32(converted, float32)
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


def _readers_of(graph: Any, keep: Collection[str]) -> set[str]:
    """The names of the nodes that read a tensor of ``keep``, and of the Constant
    nodes that make one: blocked from the float16 conversion."""
    wanted = set(keep)
    if not wanted:
        return set()
    return {
        node.name
        for node in graph.node
        if any(name in wanted for name in node.input)
        or (node.op_type == "Constant" and any(name in wanted for name in node.output))
    }


def convert_storage(proto: Any, keep: Collection[str] = ()) -> Any:
    """Return ``proto`` with its float32 constants held in float16 and its arithmetic
    left in float32.

    Every float32 initializer (weights included: a weight without data, which the
    session supplies, is retyped) becomes float16 and is read through a Cast to
    float32, which ONNX Runtime folds when it loads the graph; every float32
    ``Constant`` node's value is rounded to float16 (and stays typed float32).  The
    graph's inputs and outputs keep their types, as with :func:`convert_proto`.  What
    is rounded is what the IPU holds in float16; the operators' results are not
    rounded, so the errors are those of the weights and constants alone.  Values are
    rounded to nearest over float16's whole range, as :func:`convert_proto` rounds
    them; the tensors named in ``keep`` stay float32."""
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    taken = {n for node in graph.node for n in (*node.input, *node.output)}
    taken |= {i.name for i in graph.initializer} | {i.name for i in graph.input}
    renamed: dict[str, str] = {}
    casts = []
    kept = set(keep)
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.name in kept:
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
        if node.op_type == "Constant" and not kept.intersection(node.output):
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
    """float16 values as :func:`convert_proto` makes them: rounded to nearest even
    (a value outside float16's range is kept float32 by :func:`prepare` instead)."""
    return np.asarray(array, dtype=np.float32).astype(np.float16)


def convert_model(
    onnx_bytes: bytes, synced: Collection[str] = (), float32: Collection[str] = ()
) -> bytes:
    """:func:`prepare` and :func:`convert_proto` on a serialized model (weights
    included); returns the serialized result.  ``synced``: the weights the executor
    keeps in sync with the Paddle scope (never folded); ``float32``: the nodes that
    compute in float32 (``fp16_black_list``), whose weights stay float32."""
    import onnx

    from paddle_ipu.compiler.float32_ops import weights_read_by

    proto = onnx.load_from_string(onnx_bytes)
    report = prepare(proto, synced=synced)
    report.log()
    keep = report.kept_names | weights_read_by(proto, float32)
    return bytes(convert_proto(proto, keep, float32).SerializeToString())


# -- trained weights: float16's range, BatchNorm folded, what does not fit reported --


@dataclass(frozen=True)
class Float32Tensor:
    """A weight or constant that stays float32 in an fp16 graph, and why."""

    name: str
    #: the largest magnitude among its finite values
    largest: float
    #: "overflow": a value above float16's 65504; "underflow": a nonzero scalar that
    #: rounds to 0 in float16 (an epsilon, say)
    reason: str

    def describe(self) -> str:
        if self.reason == "overflow":
            return f"{self.name} (|value| up to {self.largest:.4g} > {FLOAT16_MAX:g})"
        return f"{self.name} ({self.largest:.3g}: float16 rounds it to 0)"


@dataclass(frozen=True)
class Fp16Report:
    """What the fp16 pass did to a graph's weights and constants beyond rounding them."""

    #: the BatchNorms folded into their convolution, as "BN node into conv node"
    folded: tuple[str, ...] = ()
    #: every constant operator folded into a convolution (BatchNorms included)
    folded_ops: int = 0
    #: the weights and constants kept in float32
    kept_float32: tuple[Float32Tensor, ...] = ()

    @property
    def kept_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.kept_float32)

    def log(self) -> None:
        """One log line per kind: the folds (INFO), the float32 tensors (WARNING: the
        graph is not all float16, as asked)."""
        if self.folded_ops:
            shown = ", ".join(self.folded[:3])
            more = f" and {len(self.folded) - 3} more" if len(self.folded) > 3 else ""
            log.info(
                "fp16: folded %d constant operator(s) into their convolution in float32 "
                "before rounding, %d BatchNorm(s) among them%s",
                self.folded_ops,
                len(self.folded),
                f" ({shown}{more})" if shown else "",
            )
        if self.kept_float32:
            log.warning(
                "fp16: %d weight(s)/constant(s) outside float16's range stay float32: %s",
                len(self.kept_float32),
                ", ".join(t.describe() for t in self.kept_float32),
            )


def out_of_range(name: str, array: np.ndarray) -> Float32Tensor | None:
    """A :class:`Float32Tensor` when float32 ``array`` does not fit float16: a finite
    value above 65504, or a nonzero scalar that rounds to zero."""
    if array.dtype != np.float32 or array.size == 0:
        return None
    # The extremes first (no temporary array: a VGG's weights took 7 s through
    # abs/isfinite/mask); only a tensor holding an inf or a nan is masked.
    low, high = float(array.min()), float(array.max())
    if np.isfinite(low) and np.isfinite(high):
        largest = max(-low, high)
    else:
        magnitude = np.abs(array)
        finite = magnitude[np.isfinite(magnitude)]
        if finite.size == 0:
            return None
        largest = float(finite.max())
    if largest > FLOAT16_MAX:
        return Float32Tensor(name, largest, "overflow")
    if array.size == 1 and 0.0 < largest < FLOAT16_TINY:
        # a scalar float16 rounds to zero: an epsilon, whose zero would divide by
        # zero; in a larger tensor (a bias of rounding noise) that is plain rounding
        return Float32Tensor(name, largest, "underflow")
    return None


def float32_tensors(
    proto: Any, weights: Mapping[str, np.ndarray] | None = None
) -> tuple[Float32Tensor, ...]:
    """The float32 initializers (with data), Constant nodes and ``weights`` (the
    values of initializers the graph holds without data) of ``proto`` that do not
    fit float16."""
    from onnx import TensorProto, numpy_helper

    found: dict[str, Float32Tensor] = {}
    graph = proto.graph
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.data_location == TensorProto.EXTERNAL:
            continue
        if not (init.raw_data or init.float_data):
            continue
        hit = out_of_range(init.name, numpy_helper.to_array(init))
        if hit is not None:
            found[init.name] = hit
    for node in graph.node:
        if node.op_type != "Constant" or len(node.output) != 1:
            continue
        attr = next((a for a in node.attribute if a.name == "value"), None)
        if attr is None or attr.t.data_type != TensorProto.FLOAT:
            continue
        hit = out_of_range(node.output[0], numpy_helper.to_array(attr.t))
        if hit is not None:
            found[hit.name] = hit
    for name, array in (weights or {}).items():
        hit = out_of_range(name, np.asarray(array))
        if hit is not None:
            found[name] = hit
    return tuple(found[name] for name in sorted(found))


def prepare(
    proto: Any,
    weights: Mapping[str, np.ndarray] | None = None,
    *,
    synced: Collection[str] = (),
    training: bool = False,
) -> Fp16Report:
    """Make ``proto`` ready for the float16 conversion, in place, and say what was done:
    BatchNorms folded into their convolution in float32 (inference only), then the
    weights and constants that still do not fit float16 found -- they stay float32
    (pass :attr:`Fp16Report.kept_names` to :func:`convert_storage` or
    :func:`convert_proto`; :meth:`Fp16Report.log` says it).

    ``weights``: values of initializers the graph holds without data (the weights the
    session supplies); ``synced``: weights the executor keeps in sync with the Paddle
    scope, which are never folded (a later write would miss the folded copy).

    Raises:
        NotSupportedError: ``training`` and a weight does not fit float16.  A trained
            weight cannot be folded (it changes every step, and BatchNorm uses batch
            statistics), and keeping one float32 needs a per-weight dtype in the
            training update, which the fp16 trainer does not have: the error names the
            weights instead of letting them become infinite.
    """
    from paddle_ipu.compiler.conv_folds import fold_batch_norms

    excluded = set(synced) | set(weights or {})
    folds = [] if training else fold_batch_norms(proto, excluded)
    report = Fp16Report(
        folded=tuple(f"{bn} into {f.conv}" for f in folds for bn in f.batch_norms),
        folded_ops=sum(len(f.nodes) for f in folds),
        kept_float32=float32_tensors(proto, weights),
    )
    if training and report.kept_float32:
        raise NotSupportedError(
            "enable_fp16 in training: "
            + "; ".join(t.describe() for t in report.kept_float32)
            + ": float16 cannot hold these values (they would become infinite or zero), "
            "and a trained weight cannot be folded away or kept float32 by the fp16 "
            "trainer; train in float32 (enable_fp16=False); in inference such a tensor "
            "stays float32 (and a BatchNorm of constants is folded into its convolution)"
        )
    return report


def report_for(model: Any, *, training: bool = False) -> Fp16Report:
    """The :class:`Fp16Report` the fp16 pass gives a CompiledModel (on a copy of its
    graph: the model is not changed)."""
    import onnx

    proto = onnx.load_from_string(model.onnx)
    return prepare(proto, synced=model.weights, training=training)


__all__ = [
    "FLOAT16_MAX",
    "Float32Tensor",
    "Fp16Report",
    "convert_model",
    "convert_proto",
    "convert_storage",
    "float32_tensors",
    "prepare",
    "report_for",
]
