"""compile_program: a Paddle static program -> CompiledModel (forward ONNX + specs).

Memory and files: the program is saved for the converter into anonymous in-memory
files (memfd) behind symlinks in a scratch folder named after this process
(:mod:`paddle_ipu.compiler.scratch`), so a killed compile leaves no weights on any
file system, and the next compile removes the folders of dead processes.  The
converter's result comes back without the weight
values (see :mod:`paddle_ipu.compiler.weights`); the graph passes and shape inference
run on that small graph, and the weights are written into the model once, straight
from the scope.  The converter itself gets the big float weights as one-element
placeholders (:func:`_placeholders`), so its process never holds them.  A compile's
peak memory is about 1.03x the weights (``bench/compile_memory.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler import (
    control_flow,
    converter_fixes,
    custom_regions,
    loop_bounds,
    onnx_passes,
)
from paddle_ipu.compiler.legacy_reader import LegacyReader, is_legacy
from paddle_ipu.compiler.lowering import check_opset, export_onnx
from paddle_ipu.compiler.model import CompiledModel, ShardSpec, TensorSpec
from paddle_ipu.compiler.ops import check_static_shapes, check_supported
from paddle_ipu.compiler.pir_reader import PirReader
from paddle_ipu.compiler.ranges import attach_ranges
from paddle_ipu.compiler.reader import ForwardGraph, ProgramReader
from paddle_ipu.compiler.scratch import check_working_dir, scratch_folder
from paddle_ipu.compiler.sequence_rewrites import LodLayout
from paddle_ipu.compiler.weights import serialize_with_weights
from paddle_ipu.errors import CompileError, NotSupportedError, OptionError

log = logging.getLogger("paddle_ipu")


def _weight_arrays(weights: Mapping[str, str], scope: Any) -> dict[str, np.ndarray]:
    """ONNX initializer name -> the parameter's value in the scope, without a copy."""
    import paddle

    from paddle_ipu._tensors.views import as_numpy

    scope = scope if scope is not None else paddle.static.global_scope()
    arrays: dict[str, np.ndarray] = {}
    for onnx_name, paddle_name in weights.items():
        var = scope.find_var(paddle_name)
        if var is None or not paddle_api.is_initialized(var.get_tensor()):
            raise CompileError(
                f"parameter {paddle_name!r} has no value in the scope (run the startup "
                "program first)"
            )
        arrays[onnx_name] = as_numpy(var.get_tensor(), readonly=True)
    return arrays


def compile_program(
    program: Any,
    feed_list: Sequence[Any],
    fetch_list: Sequence[Any],
    *,
    scope: Any = None,
    micro_batch_size: int = 1,
    sequence_length: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    opset: int | None = None,
    enable_manual_shard: bool = False,
    enable_pipelining: bool = False,
    onnx_dump_path: str = "",
    enable_fp16: bool = False,
    isolate: bool = True,
    lod: LodLayout | None = None,
) -> CompiledModel:
    """Compile the forward part of ``program`` into one ONNX graph.

    Args:
        program: a PIR ``paddle.static.Program``; it is not modified.
        feed_list: the feeds, as data op names or the ``pir.Value`` of
            ``paddle.static.data``; they become the graph inputs, in this order.
        fetch_list: the fetches, as ``pir.Value`` or names (of data ops,
            parameters, or fetch ops already in the program); they become the
            graph outputs, in this order.  Everything they do not depend on
            (backward, optimizer) is dropped.
        scope: the scope holding the parameter values (default: the global scope).
        micro_batch_size: the size given to a ``-1`` batch dimension.
        sequence_length: the size given to every other ``-1`` dimension of the
            feeds (one bucket of sequence lengths, see
            :mod:`paddle_ipu.serving.package`); None: such a dimension is an error.
        input_shapes: feed name -> the full shape to compile the program for, where
            its feeds leave dimensions open (``-1``); a ``-1`` left in the first
            dimension (the batch) is ``micro_batch_size``.  The program is made static
            for them before it is lowered (:mod:`.specialise`: Paddle's CPU kernels give
            every value its shape).
        opset: the ONNX opset (7..21); None picks 13, raised automatically when
            an operator needs a newer one.
        enable_manual_shard: put ``__ipu_number`` on nodes from the operators'
            ipu_index (see :func:`ipu_shard_guard`).
        enable_pipelining: put ``__pipeline_stage`` on nodes from ipu_stage;
            needs ``enable_manual_shard``.
        onnx_dump_path: when set, the compiled model is also written there.
        enable_fp16: not supported by this compiler; the executor converts.
        isolate: run the converter in a child process (keep True; False is for
            debugging the converter itself).
        lod: the rows of the LoD feeds it names are ``lod.sequences`` sequences padded
            to ``micro_batch_size / lod.sequences`` rows each; their lengths are one
            more input (:mod:`.sequence_rewrites`).  None: a LoD feed's rows are one
            sequence.

    Raises:
        UnsupportedOpError: the forward graph uses operators that do not lower;
            the message names all of them and where they are used.
        CompileError: anything else that stops the lowering, including a crash
            of the converter (which never takes the calling process down).
        WorkDirError: the working directory is gone, or $TMPDIR (when set) is not
            a writable directory.
    """
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int):
        raise OptionError(f"micro_batch_size must be an int >= 1, got {micro_batch_size!r}")
    if micro_batch_size < 1:
        raise OptionError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if sequence_length is not None and (
        isinstance(sequence_length, bool)
        or not isinstance(sequence_length, int)
        or sequence_length < 1
    ):
        raise OptionError(f"sequence_length must be an int >= 1, got {sequence_length!r}")
    if enable_pipelining and not enable_manual_shard:
        raise OptionError("enable_pipelining needs enable_manual_shard")
    if enable_fp16:
        raise NotSupportedError(
            "compile_program(enable_fp16=True) is not supported: compile in fp32; "
            "the fp16 conversion is done after compiling"
        )
    if lod is not None and (lod.sequences < 1 or micro_batch_size % lod.sequences):
        raise OptionError(
            f"a LoD layout of {lod.sequences} sequences needs a micro-batch of a multiple "
            f"of it (their padded rows), got {micro_batch_size}"
        )
    requested = check_opset(opset)
    check_working_dir()
    with static_mode():
        return _compile(
            program,
            feed_list,
            fetch_list,
            scope=scope,
            micro_batch_size=micro_batch_size,
            sequence_length=sequence_length,
            input_shapes=input_shapes,
            requested=requested,
            auto_upgrade=opset is None,
            enable_manual_shard=enable_manual_shard,
            enable_pipelining=enable_pipelining,
            onnx_dump_path=onnx_dump_path,
            isolate=isolate,
            lod=lod,
        )


@contextlib.contextmanager
def static_mode() -> Iterator[None]:
    """Paddle's static-graph APIs refuse to run in dygraph mode; a program can be
    compiled (or a saved model loaded) from either, and the process's mode is the same
    afterwards."""
    import paddle

    dynamic = paddle.in_dynamic_mode()
    if dynamic:
        paddle.enable_static()
    if paddle.in_dynamic_mode():  # a thread other than paddle's first: enable_static did nothing
        with paddle_api.thread_static_mode():
            yield
        return
    try:
        yield
    finally:
        if dynamic:
            paddle.disable_static()


#: A float32 parameter of at least this many elements goes to the converter as a
#: placeholder of one element: the converter's process then holds no copy of the
#: weights, and nothing is spent writing and reading them.
PLACEHOLDER_MIN_ELEMENTS = 1024


def _placeholders(parameters: Mapping[str, tuple[tuple[int, ...], str]]) -> frozenset[str]:
    return frozenset(
        name
        for name, (shape, dtype) in parameters.items()
        if dtype == "float32" and int(np.prod(shape, dtype=np.int64)) >= PLACEHOLDER_MIN_ELEMENTS
    )


def _convert(
    fg: Any, requested: int, auto_upgrade: bool, isolate: bool, placeholders: frozenset[str]
) -> onnx.ModelProto:
    """The converter's graph of ``fg``, its parameters' Constant nodes emptied."""
    with scratch_folder() as scratch:
        model_path, params_path = fg.write_inference_model(scratch.directory, placeholders)
        if params_path and scratch.size(params_path) == 0:
            params_path = ""  # a program without parameters writes none
        raw = export_onnx(
            model_path,
            params_path,
            requested,
            auto_upgrade=auto_upgrade,
            log_path=scratch.log_path,
            isolate=isolate,
            strip=frozenset(fg.parameters),
        )
    try:
        return onnx.load_from_string(raw)
    except Exception as exc:
        raise CompileError(f"the converter returned an unreadable ONNX model: {exc}") from exc


def _restore_placeholders(
    model: onnx.ModelProto,
    parameters: Mapping[str, tuple[tuple[int, ...], str]],
    placeholders: frozenset[str],
) -> bool:
    """Give each placeholder's Constant node the parameter's declared shape.  False,
    with ``model`` unchanged, unless every placeholder is the output of exactly one
    Constant node, float32 with every dimension 1 (the converter, whose graph
    optimisation is off, carried each through as it was given)."""
    found: dict[str, onnx.TensorProto] = {}
    for node in model.graph.node:
        outputs = [o for o in node.output if o in placeholders]
        if not outputs:
            continue
        if node.op_type != "Constant" or len(node.output) != 1 or outputs[0] in found:
            return False
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        shape = parameters[outputs[0]][0]
        if (
            value is None
            or value.data_type != onnx.TensorProto.FLOAT
            or tuple(value.dims) != (1,) * len(shape)
        ):
            return False
        found[outputs[0]] = value
    if len(found) != len(placeholders):
        return False
    for name, value in found.items():
        del value.dims[:]
        value.dims.extend(parameters[name][0])
    return True


def _compile(
    program: Any,
    feed_list: Sequence[Any],
    fetch_list: Sequence[Any],
    *,
    scope: Any,
    micro_batch_size: int,
    sequence_length: int | None,
    input_shapes: Mapping[str, Sequence[int]] | None,
    requested: int,
    auto_upgrade: bool,
    enable_manual_shard: bool,
    enable_pipelining: bool,
    onnx_dump_path: str,
    isolate: bool,
    lod: LodLayout | None = None,
) -> CompiledModel:
    # Without sequence buckets (whose lengths are set after the conversion), a program
    # with open dimensions besides the batch is made static for input_shapes, or refused
    # by name before anything lowers.
    shapes = input_shapes if input_shapes is not None or sequence_length is not None else {}
    lowered = lower(
        program, feed_list, fetch_list, scope=scope, micro_batch_size=micro_batch_size,
        input_shapes=shapes, requested=requested, auto_upgrade=auto_upgrade,
        enable_manual_shard=enable_manual_shard, enable_pipelining=enable_pipelining,
        isolate=isolate, lod=lod,
    )  # fmt: skip
    model, fg = lowered.model, lowered.graph
    inputs = onnx_passes.fix_inputs(model.graph, fg.feeds, micro_batch_size, sequence_length)
    weights = dict(lowered.weights)
    outputs = fold_and_infer(model, weights, lowered.names, fg.fetches, _loop_names(fg))
    compiled = lowered.compiled(model, inputs, outputs, weights, scope)
    if onnx_dump_path:
        compiled.save_model_proto(onnx_dump_path)
    return compiled


@dataclass
class Lowered:
    """A program converted to ONNX and through the passes that do not depend on the
    sizes of its open dimensions (:func:`lower`)."""

    model: onnx.ModelProto
    graph: ForwardGraph
    #: ONNX initializer -> Paddle parameter
    weights: dict[str, str]
    shards: dict[str, ShardSpec]
    owner: dict[str, int]
    #: the outputs' ONNX names, in fetch order
    names: list[str]
    program: Any
    micro_batch_size: int
    #: the opset asked of the converter (the model's own says if it raised it)
    requested: int

    def compiled(
        self,
        model: onnx.ModelProto,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        weights: dict[str, str],
        scope: Any,
    ) -> CompiledModel:
        """The CompiledModel of ``model`` (this lowering, its shape passes run: the
        ``weights`` it still reads), the weights written in from ``scope``."""
        fg = self.graph
        emptied = [
            node.output[0]
            for node in model.graph.node
            if node.op_type == "Constant" and node.output and node.output[0] in fg.parameters
        ]
        if emptied:
            raise CompileError(
                f"parameters {emptied} stayed Constant nodes in the converted graph; "
                "their values cannot be filled in"
            )
        # valid ranges of index feeds (compiler/ranges.py), read off the PIR program (a
        # legacy program's translation, see compiler/legacy_reader.py)
        inputs = attach_ranges(getattr(fg, "pir_source", self.program), inputs)
        actual_opset = next(
            (int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")),
            self.requested,
        )
        owner = self.owner
        return CompiledModel(
            onnx=serialize_with_weights(model, _weight_arrays(weights, scope)),
            inputs=inputs,
            outputs=outputs,
            weights=weights,
            micro_batch_size=self.micro_batch_size,
            opset=actual_opset,
            shards=self.shards,
            source_ops=[info.type for info in fg.ops],
            node_ops={
                node.name: owner[node.name] for node in model.graph.node if node.name in owner
            },
        )


def lower(
    program: Any,
    feed_list: Sequence[Any],
    fetch_list: Sequence[Any],
    *,
    scope: Any,
    micro_batch_size: int,
    input_shapes: Mapping[str, Sequence[int]] | None,
    requested: int,
    auto_upgrade: bool,
    enable_manual_shard: bool = False,
    enable_pipelining: bool = False,
    isolate: bool = True,
    lod: LodLayout | None = None,
) -> Lowered:
    """Read, check and convert ``program``, and run the passes over the converter's
    graph that do not depend on the sizes of the feeds' open dimensions.
    ``input_shapes``: as :func:`compile_program`'s; None leaves the open dimensions
    open (the converter keeps them symbolic).  ``lod``: the sequence layout of a LoD
    program's feeds (compiler/sequence_rewrites.py)."""
    reader = reader_for(program)
    fg = reader.read(
        program, list(feed_list), list(fetch_list), scope, input_shapes, micro_batch_size, lod
    )
    check_supported(info.use for info in fg.ops)
    check_static_shapes([info.use for info in fg.ops], {f.name for f in fg.feeds})

    # The converter hands back the graph only; the weights go into the model once,
    # from the scope, at the end.  It gets the big float weights as placeholders of
    # one element (_placeholders); where its graph does not carry each of them
    # through unchanged, it converts again from the real weights.
    placeholders = _placeholders(fg.parameters)
    model = _convert(fg, requested, auto_upgrade, isolate, placeholders)
    if placeholders and not _restore_placeholders(model, fg.parameters, placeholders):
        log.info(
            "the converter changed a weight it was given as a placeholder: "
            "converting again with the weights"
        )
        model = _convert(fg, requested, auto_upgrade, isolate, frozenset())
    weights, shards, owner, names = _prepare(
        model, fg, manual_shard=enable_manual_shard, pipelining=enable_pipelining
    )
    return Lowered(model, fg, weights, shards, owner, names, program, micro_batch_size, requested)


def _prepare(
    model: onnx.ModelProto,
    fg: ForwardGraph,
    *,
    manual_shard: bool,
    pipelining: bool,
) -> tuple[dict[str, str], dict[str, ShardSpec], dict[str, int], list[str]]:
    """The converter's ONNX model made the one the executor runs, up to its shapes: its
    mistakes fixed (:mod:`.converter_fixes`), then the generic passes
    (:mod:`.onnx_passes`) that do not read the feeds' sizes."""
    graph = model.graph
    converter_fixes.name_nodes(graph)
    weights = converter_fixes.constants_to_initializers(graph, fg.parameters)
    converter_fixes.repair_fetch_aliases(graph, fg.ops, fg.fetches)
    producers = {
        out.name: fetch.producer
        for out, fetch in zip(graph.output, fg.fetches)
        if fetch.producer >= 0
    }
    owner = onnx_passes.attribute_nodes(graph, fg.ops, producers)
    converter_fixes.correct_lowerings(graph, fg.ops, owner, fg.fetches)
    shards = onnx_passes.apply_shards(
        graph, fg.ops, owner, manual_shard=manual_shard, pipelining=pipelining
    )
    onnx_passes.apply_hints(graph, fg.ops, owner)
    custom_regions.mark(graph, fg.ops, owner)
    names = onnx_passes.rename_outputs(graph, fg.fetches)
    onnx_passes.drop_identities(graph)
    return weights, shards, owner, names


def fold_and_infer(
    model: onnx.ModelProto,
    weights: dict[str, str],
    names: Sequence[str],
    fetches: Sequence[Any],
    loops: Mapping[str, str] | None = None,
) -> list[TensorSpec]:
    """The passes that need the feeds' static shapes (set on ``model``'s inputs): shape
    arithmetic folded into constants, the loops typed and bounded, then every output's
    static shape.  ``weights`` (ONNX initializer -> Paddle parameter) loses the
    parameters no node reads; ``loops``: a Loop's first output -> its operator, for
    errors (:func:`_loop_names`)."""
    graph = model.graph
    onnx_passes.fold_shape_arithmetic(model, set(weights))
    converter_fixes.omit_empty_resize_inputs(graph)
    onnx_passes.drop_dead_nodes(graph)
    onnx_passes.drop_unused_weights(graph, weights)
    control_flow.type_loops(model, dict(loops or {}))
    loop_bounds.bound_loops(model)  # the trip counts PopART needs
    converter_fixes.boolean_where(model)
    outputs = onnx_passes.infer_outputs(model, names, fetches)
    model.producer_name = "paddle-ipu"
    return outputs


def _loop_names(fg: ForwardGraph) -> dict[str, str]:
    """The ONNX name of each ``pd_op.while``'s first result -> the operator, for errors."""
    return {
        info.onnx_names[0]: info.use.describe()
        for info in fg.ops
        if info.type == "pd_op.while" and info.onnx_names
    }


def reader_for(program: Any) -> ProgramReader:
    """The reader for ``program``'s IR (:mod:`.reader` is the interface; the readers
    are :mod:`.pir_reader` and :mod:`.legacy_reader`)."""
    import paddle

    if isinstance(program, paddle.pir.Program):
        return PirReader()
    if is_legacy(program):
        return LegacyReader()
    raise NotSupportedError(
        f"cannot compile a {type(program).__name__}: expected a paddle.static.Program "
        "(PIR, or a legacy-IR program)"
    )
