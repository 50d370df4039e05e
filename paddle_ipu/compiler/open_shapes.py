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
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from paddle_ipu._util import dtypes
from paddle_ipu.compiler import converter_fixes, onnx_passes
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.size_formulas import SizeFormulas, formulas
from paddle_ipu.compiler.weights import serialize_with_weights, split_weights
from paddle_ipu.errors import CompileError

log = logging.getLogger("paddle_ipu")

__all__ = ["OpenGraph", "compile_open", "fold_static_shape_parts", "open_dim_name"]


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
        fold_static_shape_parts(model, set(weights))
        onnx_passes.fold_shape_arithmetic(model, set(weights))
        converter_fixes.omit_empty_resize_inputs(model.graph)
        converter_fixes.concat_scalars(model)
        onnx_passes.drop_dead_nodes(model.graph)
        onnx_passes.drop_unused_weights(model.graph, weights)
        outputs = _open_outputs(model, lowered.names, fg.fetches)
        return lowered.compiled(model, inputs, outputs, weights, scope)


def fold_static_shape_parts(model: onnx.ModelProto, weights: set[str]) -> int:
    """A Slice or Gather of a ``Shape`` that picks only sizes which are static in the open
    graph becomes a constant (how many did).  The converter builds a reshape's target
    from its input's shape (``Concat(Shape(x)[0:1], [4, -1])``): once the static part is
    a constant the target folds, and neither a fold per shape nor the size formulas
    (:mod:`.size_formulas`) have to follow it."""
    graph = model.graph
    shape_of = {n.output[0]: n for n in graph.node if n.op_type == "Shape"}
    if not shape_of:
        return 0
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    onnx_passes.constants_as_initializers(probe.graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception:  # nothing folds now; the fold per shape does it all, as before
        return 0
    wanted = {n.input[0] for n in shape_of.values()}
    dims: dict[str, list[int | None]] = {}  # the Shapes' inputs' sizes, None if open
    for vi in [*inferred.graph.input, *inferred.graph.value_info]:
        tt = vi.type.tensor_type
        if vi.name in wanted and tt.HasField("shape"):
            dims[vi.name] = [
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in tt.shape.dim
            ]
    const = {
        i.name: numpy_helper.to_array(i)
        for i in graph.initializer
        if i.name not in weights and int(np.prod(list(i.dims), dtype=np.int64)) <= _LARGE
    }
    for node in graph.node:
        value = onnx_passes.constant_value(node)
        if value is not None:
            const[node.output[0]] = numpy_helper.to_array(value)
    folded = 0
    for pos, node in enumerate(graph.node):
        source = shape_of.get(node.input[0]) if node.input else None
        if node.op_type not in ("Slice", "Gather") or source is None:
            continue
        sizes = dims.get(source.input[0])
        if sizes is None:
            continue
        attrs = {a.name: a.i for a in source.attribute}
        part = sizes[attrs.get("start", 0) : attrs.get("end", len(sizes))]
        # the node run on the sizes' positions tells which sizes it picks
        picked = _evaluate_on(node, {**const, node.input[0]: np.arange(len(part), dtype=np.int64)})
        if picked is None or any(part[int(k)] is None for k in picked.reshape(-1)):
            continue
        sizes_picked = np.array([part[int(k)] for k in picked.reshape(-1)], np.int64)
        out = node.output[0]
        graph.node[pos].CopyFrom(
            helper.make_node(
                "Constant",
                [],
                [out],
                name=node.name,
                value=numpy_helper.from_array(sizes_picked.reshape(picked.shape), out),
            )
        )
        folded += 1
    return folded


def _evaluate_on(node: onnx.NodeProto, const: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """``node``'s output on constant inputs; None when one is not constant or it fails."""
    from onnx.reference import ReferenceEvaluator

    ins = [n for n in node.input if n]
    if any(n not in const for n in ins):
        return None
    try:
        results: Any = ReferenceEvaluator(node).run(None, {n: const[n] for n in ins})
        return np.asarray(results[0])
    except Exception:
        return None


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
        self._lock = threading.Lock()
        self._found: object = _UNSET  # the size formulas, once found (or None)
        self._finding: threading.Thread | None = None
        self._agreed = 0  # answers of the formulas that agreed with the fold's; -1: one did not
        self._folds = 0  # shapes folded in this process (not answered from the memo)
        self._memo: FoldMemo | None = None

    def specialise(self, shapes: Mapping[str, Sequence[int]]) -> CompiledModel:
        """The static graph for ``shapes`` (feed -> full shape; the batch is the open
        graph's micro-batch size whatever it says).  A CompileError names the feed
        when a shape does not fit its declared one, and the size when the model cannot
        take it (by the size formulas, found then if not yet)."""
        try:
            model, inputs, outputs, weights = self._static(shapes)
        except CompileError as exc:
            # the fold fails without naming the size; the formulas name it when they can
            found = self.size_formulas(wait=True) if self._agreed >= 0 else None
            if found is not None:
                try:
                    found.shapes(shapes)
                except CompileError as named:
                    raise named from exc
            raise
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
        """The outputs' static shapes for input ``shapes``, without writing a graph.

        From the open graph's size formulas (:mod:`.size_formulas`: a few evaluations)
        once they are found (:meth:`size_formulas`) and their first answers agreed
        with the fold's; else the graph is folded at
        that shape as :meth:`specialise` folds it (tens of milliseconds).  A size the
        formulas refuse is a CompileError naming it.  After an answer that differs
        from the fold's, every shape is folded (a warning says so).

        The formulas are looked for once this process has folded the graph at two
        shapes: a process that runs one size (``paddle-ipu run``), or whose shapes the
        fold's memo answers (a bucketed run's cut, from the second run of its size on),
        folds or reads them without seconds of a thread beside its run finding formulas
        it will not use."""
        with self._lock:
            searching = self._finding is not None
        found = self.size_formulas(wait=False) if self._agreed >= 0 and searching else None
        if found is None:
            folded = self._folded(shapes)
            with self._lock:
                start = self._agreed >= 0 and self._finding is None and self._folds >= 2
            if start:
                self.size_formulas(wait=False)
            return folded
        quick: list[tuple[int, ...]] | None = None
        refused: CompileError | None = None
        try:
            quick = found.shapes(shapes)
        except CompileError as exc:
            if self._agreed >= _CHECKS:
                raise
            refused = exc
        except Exception:  # formulas that do not evaluate: folded from now on
            log.exception(
                "the open graph's size formulas failed at %s: every shape is folded", dict(shapes)
            )
            self._agreed = -1
            return self._folded(shapes)
        if quick is not None and self._agreed >= _CHECKS:
            return quick
        if quick is None and refused is None:  # a broadcast the formulas do not follow
            return self._folded(shapes)
        try:
            slow = self._folded(shapes)
        except CompileError:
            if refused is not None:
                raise refused from None
            raise
        with self._lock:
            if quick == slow:
                self._agreed += 1 if self._agreed >= 0 else 0
            elif self._agreed >= 0:
                self._agreed = -1
                log.warning(
                    "the open graph's size formulas gave outputs %s at %s, its fold %s: "
                    "every shape is folded",
                    quick if refused is None else f"a refusal ({refused})",
                    dict(shapes),
                    slow,
                )
        return slow

    def _folded(self, shapes: Mapping[str, Sequence[int]]) -> list[tuple[int, ...]]:
        """The fold's output shapes, kept on disk by open graph and input shapes
        (:class:`FoldMemo`): a process that runs one size (``paddle-ipu run``) folds
        each shape once per compile cache, not once per process."""
        with self._lock:
            if self._memo is None:
                self._memo = FoldMemo(self._bytes, self._arrays)
            memo = self._memo
        key = FoldMemo.key(shapes, self.model.inputs)
        found = memo.get(key)
        if found is not None:
            return found
        folded = [tuple(int(d) for d in spec.shape) for spec in self._static(shapes)[2]]
        with self._lock:
            self._folds += 1
        memo.put(key, folded)
        return folded

    def size_formulas(self, wait: bool = True) -> SizeFormulas | None:
        """The size formulas (None: there are none, every size is folded).  They are
        found once, on a thread of their own (seconds for a large graph); with
        ``wait=False``, None until they are found."""
        with self._lock:
            if self._finding is None:
                self._finding = threading.Thread(
                    target=self._find_formulas, name="paddle-ipu-size-formulas", daemon=True
                )
                self._finding.start()
            finding = self._finding
        if wait:
            finding.join()
        with self._lock:
            return None if self._found is _UNSET else self._found  # type: ignore[return-value]

    def _find_formulas(self) -> None:
        try:
            found = formulas(self.model.onnx, self.model.inputs)
        except Exception:  # folded per size, as without formulas
            log.exception("the open graph's size formulas failed: every size is folded")
            found = None
        with self._lock:
            self._found = found

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


#: answers of the size formulas checked against the fold's (OpenGraph.output_shapes)
_CHECKS = 2


class FoldMemo:
    """The fold's output shapes of one open graph, by input shapes, in memory and in
    a file of the compile cache's directory (``open-graph-shapes/<digest>.json``, the
    digest of the graph without its weights' values, the weights' names, dtypes and
    shapes, and :data:`FORMAT`).  A file that cannot be read is an empty memo; one that
    cannot be written is logged once and the memo stays in memory."""

    #: what the fold's answers are kept under: changed when the fold changes
    FORMAT = "fold-1"
    #: entries a file keeps (the newest)
    LIMIT = 4096
    #: the folder of the compile cache's directory the files are in
    FOLDER = "open-graph-shapes"

    def __init__(self, graph: bytes, arrays: Mapping[str, np.ndarray]) -> None:
        import hashlib

        h = hashlib.sha256(self.FORMAT.encode())
        h.update(graph)
        for name in sorted(arrays):
            a = arrays[name]
            h.update(f"{name}:{a.dtype.str}:{list(a.shape)};".encode())
        self.digest = h.hexdigest()
        self._lock = threading.Lock()
        self._entries: dict[str, list[list[int]]] | None = None
        self._warned = False

    @staticmethod
    def key(shapes: Mapping[str, Sequence[int]], inputs: Sequence[TensorSpec]) -> str:
        """The inputs' shapes in the graph's order, the batch left out (the fold takes
        the graph's)."""
        parts = []
        for spec in inputs:
            name = spec.paddle_name or spec.name
            given = shapes.get(name)
            dims = "-" if given is None else "x".join(str(int(d)) for d in list(given)[1:])
            parts.append(f"{name}={dims}")
        return ";".join(parts)

    def path(self) -> Any:
        from paddle_ipu._util.files import compile_cache_dir

        return compile_cache_dir() / self.FOLDER / f"{self.digest}.json"

    def _read(self) -> dict[str, list[list[int]]]:
        import json

        try:
            doc = json.loads(self.path().read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict):
            return {}
        return {
            k: v
            for k, v in doc.items()
            if isinstance(v, list) and all(isinstance(s, list) for s in v)
        }

    def get(self, key: str) -> list[tuple[int, ...]] | None:
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            found = self._entries.get(key)
        if found is None:
            return None
        try:
            return [tuple(int(d) for d in s) for s in found]
        except (TypeError, ValueError):  # a damaged entry: folded again
            return None

    def put(self, key: str, shapes: Sequence[Sequence[int]]) -> None:
        import json

        from paddle_ipu._util.files import write_atomically
        from paddle_ipu.errors import OutputFileError

        value = [[int(d) for d in s] for s in shapes]
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            doc = self._read()  # what other processes added since
            doc.update(self._entries)
            doc[key] = value
            if len(doc) > self.LIMIT:
                doc = dict(list(doc.items())[-self.LIMIT :])
            self._entries = doc
            try:
                write_atomically(self.path(), json.dumps(doc).encode(), make_dirs=True)
            except OutputFileError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("the open graph's folded shapes are not kept on disk: %s", exc)


_UNSET = object()

#: an initializer of more elements than this is a weight, never shape arithmetic
_LARGE = 4096


def _large_initializers(model_bytes: bytes) -> list[str]:
    model = onnx.load_from_string(model_bytes)
    return [
        i.name
        for i in model.graph.initializer
        if int(np.prod(list(i.dims), dtype=np.int64)) > _LARGE
    ]
