"""One conversion for every input shape.

A program whose feeds leave dimensions open besides the batch (an image model's height
and width) is converted once with them open: the converter keeps them symbolic, and the
passes that do not read a size run once (:func:`compile_open`).  The result is an *open
graph*: a :class:`~paddle_ipu.compiler.model.CompiledModel` whose input and output
specs hold ``-1`` where a size is open (the batch is the micro-batch size).  It is made
static for one input shape by ONNX's own shape inference on it
(:meth:`OpenGraph.specialise`): the sizes set on the inputs, the shape arithmetic folded
into constants, every output's static shape inferred.  No Paddle program is read or run
per shape -- the per-shape compile of :mod:`.specialise` runs Paddle's kernels over the
whole program at that size -- and the weights are the open graph's, written in as they
are.

Not every program converts with open sizes: a lowering that needs a size (an
interpolation by a scale that is not a whole number, adaptive pooling to bins that do
not divide an unknown size) refuses it by name, and such a model is compiled per shape.
Whether an open graph gives what the per-shape compile gives is checked by its owner on
one shape (:func:`paddle_ipu.serving.saved_model.compile_model`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from paddle_ipu._util import dtypes
from paddle_ipu.compiler import converter_fixes, onnx_passes
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.weights import serialize_with_weights, split_weights
from paddle_ipu.errors import CompileError

__all__ = ["OpenGraph", "compile_open", "open_dim_name"]


def open_dim_name(feed: str, axis: int) -> str:
    """The symbolic name of a feed's open dimension in an open graph."""
    return f"{feed}:{axis}"


def compile_open(
    program: Any,
    feed_list: Sequence[Any],
    fetch_list: Sequence[Any],
    *,
    scope: Any = None,
    micro_batch_size: int = 1,
    opset: int | None = None,
    isolate: bool = True,
) -> CompiledModel:
    """The open graph of ``program`` (see the module docstring); raises what the
    compile raises, an UnsupportedOpError naming a lowering that needs a size among
    them."""
    from paddle_ipu.compiler.compile import lower, static_mode
    from paddle_ipu.compiler.lowering import check_opset
    from paddle_ipu.compiler.scratch import check_working_dir

    requested = check_opset(opset)
    check_working_dir()
    with static_mode():
        lowered = lower(
            program, feed_list, fetch_list, scope=scope, micro_batch_size=micro_batch_size,
            input_shapes=None, requested=requested, auto_upgrade=opset is None,
            isolate=isolate,
        )  # fmt: skip
        model, fg = lowered.model, lowered.graph
        inputs = _open_inputs(model.graph, fg.feeds, micro_batch_size)
        if not any(d < 0 for spec in inputs for d in spec.shape):
            raise CompileError("the program has no open dimension besides the batch")
        weights = dict(lowered.weights)
        # what does not depend on the open sizes folds now, the rest per shape
        onnx_passes.fold_shape_arithmetic(model, set(weights))
        converter_fixes.omit_empty_resize_inputs(model.graph)
        converter_fixes.concat_scalars(model)
        onnx_passes.drop_dead_nodes(model.graph)
        onnx_passes.drop_unused_weights(model.graph, weights)
        outputs = _open_outputs(model, lowered.names, fg.fetches)
        return lowered.compiled(model, inputs, outputs, weights, scope)


def _open_inputs(
    graph: onnx.GraphProto, feeds: Sequence[Any], micro_batch_size: int
) -> list[TensorSpec]:
    """Every feed an input in feed order: an open batch is ``micro_batch_size``, any
    other open dimension stays symbolic (:func:`open_dim_name`; -1 in its spec)."""
    existing = {i.name: i for i in graph.input}
    ordered: list[onnx.ValueInfoProto] = []
    specs: list[TensorSpec] = []
    for feed in feeds:
        vi = existing.pop(feed.name, None)
        if vi is None:  # fed but unused by the fetches: kept so feeds line up with inputs
            elem = dtypes.onnx_type(feed.dtype)
            vi = helper.make_tensor_value_info(feed.name, elem, list(feed.shape))
        shape: list[int] = []
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(int(dim.dim_value))
                continue
            dim.Clear()
            if axis == 0:
                dim.dim_value = micro_batch_size
                shape.append(micro_batch_size)
            else:
                dim.dim_param = open_dim_name(feed.name, axis)
                shape.append(-1)
        ordered.append(vi)
        dtype = dtypes.from_onnx(vi.type.tensor_type.elem_type)
        specs.append(TensorSpec(feed.name, dtype, tuple(shape), feed.name))
    if existing:
        raise CompileError(f"the converted graph has inputs that are not feeds: {sorted(existing)}")
    del graph.input[:]
    graph.input.extend(ordered)
    return specs


def _open_outputs(
    model: onnx.ModelProto, names: Sequence[str], fetches: Sequence[Any]
) -> list[TensorSpec]:
    """The outputs' specs: their dtypes and ranks, -1 where a size is not static."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for out in probe.graph.output:
        out.type.tensor_type.ClearField("shape")
    del probe.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise CompileError(f"ONNX shape inference failed on the open graph: {exc}") from exc
    found = {o.name: o for o in [*inferred.graph.value_info, *inferred.graph.output]}
    specs = []
    for name, fetch in zip(names, fetches):
        info = found.get(name)
        tt = info.type.tensor_type if info is not None else None
        if tt is not None and tt.HasField("shape"):
            shape = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else -1
                for d in tt.shape.dim
            )
        else:  # what ONNX cannot follow with open sizes: the program's declared rank
            shape = tuple(-1 for _ in fetch.shape)
        dtype = dtypes.from_onnx(tt.elem_type) if tt is not None else fetch.dtype
        specs.append(TensorSpec(name, dtype, shape, fetch.paddle_name or name))
    return specs


@dataclass(frozen=True)
class _Fetch:
    paddle_name: str


class OpenGraph:
    """An open graph (:func:`compile_open`) and its static graphs per input shape."""

    def __init__(self, model: CompiledModel) -> None:
        self.model = model
        self.open_axes = {
            spec.paddle_name or spec.name: tuple(a for a, d in enumerate(spec.shape) if d < 0)
            for spec in model.inputs
            if any(d < 0 for d in spec.shape)
        }
        # The graph without its parameters and large initializers (never shape
        # arithmetic: not folded, as a compile does not fold them), parsed once; each
        # shape's graph gets them written back as they are.
        names = sorted({*_large_initializers(model.onnx), *model.weights})
        self._proto, self._arrays = split_weights(model.onnx, names)
        self._bytes = self._proto.SerializeToString()
        self._weights = {n: n for n in names}

    def specialise(self, shapes: Mapping[str, Sequence[int]]) -> CompiledModel:
        """The static graph for ``shapes`` (feed -> full shape; the batch is the open
        graph's micro-batch size whatever it says).  A CompileError names the feed
        when a shape does not fit its declared one."""
        model, inputs, outputs, weights = self._static(shapes)
        arrays = {n: a for n, a in self._arrays.items() if n in weights}
        return CompiledModel(
            onnx=serialize_with_weights(model, arrays),
            inputs=inputs,
            outputs=outputs,
            weights={},
            micro_batch_size=self.model.micro_batch_size,
            opset=self.model.opset,
            source_ops=list(self.model.source_ops),
            node_ops=dict(self.model.node_ops),
            origin=self,
        )

    def session_model(self) -> CompiledModel:
        """The open graph as one model for every shape, its weights in it and none kept
        in sync with a scope: what the host backend runs the shapes made from it on
        (:mod:`paddle_ipu.backends.host.session`)."""
        return dataclasses.replace(self.model, weights={}, origin=None)

    def output_shapes(self, shapes: Mapping[str, Sequence[int]]) -> list[tuple[int, ...]]:
        """The outputs' static shapes for input ``shapes``, without writing a graph."""
        return [spec.shape for spec in self._static(shapes)[2]]

    def _static(
        self, shapes: Mapping[str, Sequence[int]]
    ) -> tuple[onnx.ModelProto, list[TensorSpec], list[TensorSpec], dict[str, str]]:
        from paddle_ipu.compiler.compile import fold_and_infer

        model = onnx.load_from_string(self._bytes)
        inputs: list[TensorSpec] = []
        by_name = {i.name: i for i in model.graph.input}
        for spec in self.model.inputs:
            name = spec.paddle_name or spec.name
            given = shapes.get(name)
            if given is None:
                if any(d < 0 for d in spec.shape):
                    raise CompileError(f"no input shape for feed {name!r} ({list(spec.shape)})")
                inputs.append(spec)
                continue
            shape = [spec.shape[0], *(int(d) for d in list(given)[1:])]
            if len(shape) != len(spec.shape) or any(
                g < 1 or (d >= 0 and g != d) for g, d in zip(shape, spec.shape)
            ):
                raise CompileError(
                    f"input shape {list(given)} for feed {name!r}, declared {list(spec.shape)} "
                    "(the batch aside): a shape must have the declared rank, keep its static "
                    "sizes and give every open dimension a size >= 1"
                )
            for dim, size in zip(by_name[spec.name].type.tensor_type.shape.dim, shape):
                dim.Clear()
                dim.dim_value = size
            inputs.append(
                TensorSpec(spec.name, spec.dtype, tuple(shape), spec.paddle_name, spec.ranges)
            )
        weights = dict(self._weights)
        names = [s.name for s in self.model.outputs]
        fetches = [_Fetch(s.paddle_name) for s in self.model.outputs]
        outputs = fold_and_infer(model, weights, names, fetches)
        return model, inputs, outputs, weights


#: an initializer of more elements than this is a weight, never shape arithmetic
_LARGE = 4096


def _large_initializers(model_bytes: bytes) -> list[str]:
    model = onnx.load_from_string(model_bytes)
    return [
        i.name
        for i in model.graph.initializer
        if int(np.prod(list(i.dims), dtype=np.int64)) > _LARGE
    ]
