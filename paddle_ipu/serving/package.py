"""Portable compiled packages: the format.

A *package* (``paddle-ipu compile MODEL_PREFIX -o model.pdipu``) is one zip file holding
one or more compiled graphs of one model and its weights, once:

- ``meta.json``: the model's inputs and outputs as declared (``-1``: open), the
  micro-batch size, the result-changing strategy options, the versions it was compiled
  with, and one entry per graph: its file, its SHA-256 (checked on load), its inputs and
  outputs (static), and which stored weight each of its initializers holds;
- ``model.onnx``, ``buckets/<length>.onnx``, ``shapes/<n>.onnx``: the graphs, their
  weight initializers without data;
- ``weights.safetensors``: every weight of every graph, once: graphs that hold the same
  array (the model's parameters) share it; what differs per shape (a constant folded
  for one size) is stored beside;
- ``tail.json`` (a model whose outputs have data-dependent sizes, such as a detector
  ending in non-maximum suppression): the operators from the first data-dependent one
  to the outputs, a PIR program that Paddle's CPU kernels run after the compiled graph
  (:mod:`paddle_ipu.serving.host_tail`); the graphs then compute what it reads.

The graphs are of three kinds:

- a model without open dimensions besides the batch: ``model.onnx``, the one graph;
- *buckets of sequence lengths* (``seq_buckets``): a text model whose feeds have a
  ``-1`` dimension besides the batch, compiled once per length; ``model.onnx`` is the
  longest, ``buckets/<length>.onnx`` the others (:class:`SequenceBuckets`).  A request
  of length ``L`` runs in the shortest bucket ``>= L``: its feeds are padded to that
  length, its outputs cut back to ``L``.  That is exact when what the outputs hold at
  positions ``< L`` does not depend on the padding (a causal decoder; a model whose
  attention mask feed is padded with the value that masks); the compile checks it on
  the host and refuses a model for which it is not (:mod:`paddle_ipu.serving.saved_model`);
- *specialisations per input shape*: any other model with open dimensions (an image
  model's height and width), one graph per input shape requests bring, made on first
  use or ahead of time (``--input-shapes``), bounded and logged
  (:mod:`paddle_ipu.executor.shapes`); ``shapes/<n>.onnx``, ``model.onnx`` the first.
  Such a package also holds its model's *open graph* (``open.onnx``) when the model
  converts with its dimensions open and the result was checked against a compile at
  one shape (:mod:`paddle_ipu.compiler.open_shapes`): every other shape is made from
  it by ONNX's shape inference, without compiling.

It holds no Paddle program: :func:`load_package` gives a :class:`Package` whose
:meth:`Package.executor` runs it on either backend (the host's ONNX Runtime, or
PopART, which reads the same ONNX).  Packages are made by
:func:`paddle_ipu.serving.saved_model.compile_model` and kept by the compile cache
(:mod:`paddle_ipu.serving.cache`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu._util.files import write_atomically
from paddle_ipu.compiler.model import CompiledModel, IndexRange, TensorSpec
from paddle_ipu.compiler.weights import serialize_with_weights, split_weights
from paddle_ipu.errors import NotSupportedError, PackageError
from paddle_ipu.executor.shapes import SequenceBuckets, ShapePolicy
from paddle_ipu.serving.host_tail import HostTail

__all__ = ["PACKAGE_FORMAT", "Package", "SequenceBuckets", "load_package"]

PACKAGE_FORMAT = 3
_WEIGHTS = "weights.safetensors"
_TAIL = "tail.json"


@dataclass
class Package:
    """A compiled model and how it was compiled (see the module docstring).

    ``model`` is the package's graph (a package of sequence buckets: the longest; a
    package compiled per input shape: the first, None before any is compiled).
    ``buckets``: one graph per sequence length, and how requests fit them
    (``sequence``).  ``shapes``: one graph per input shape, by
    :meth:`ShapePolicy.key`; ``policy``: the declared shapes of the model's feeds.
    ``source``: the saved model it was compiled from, which compiles more shapes."""

    model: CompiledModel | None
    # micro_batch_size, batches_per_step, enable_fp16 (and its fp16_black_list), seq_buckets
    options: dict[str, Any]
    meta: dict[str, Any]
    buckets: dict[int, CompiledModel] = field(default_factory=dict)
    sequence: SequenceBuckets | None = None
    shapes: dict[str, CompiledModel] = field(default_factory=dict)
    policy: ShapePolicy | None = None
    #: the operators run on the host after the graphs (None: the graphs give the outputs)
    tail: HostTail | None = None
    #: a package compiled per input shape: its model's open graph, when it has one
    #: (:mod:`paddle_ipu.compiler.open_shapes`)
    open: CompiledModel | None = None
    _open_graph: Any = field(default=None, repr=False, compare=False)

    def open_graph(self) -> Any:
        """The :class:`~paddle_ipu.compiler.open_shapes.OpenGraph` of :attr:`open`
        (parsed once), or None."""
        if self.open is None:
            return None
        if self._open_graph is None or self._open_graph.model is not self.open:
            from paddle_ipu.compiler.open_shapes import OpenGraph

            self._open_graph = OpenGraph(self.open)
        return self._open_graph

    @property
    def output_names(self) -> list[str]:
        """The model's outputs: the host tail's, else the graph's."""
        if self.tail is not None:
            return self.tail.output_names
        if self.model is None:
            return [str(f["name"]) for f in self.meta.get("fetches", [])]
        return [s.paddle_name or s.name for s in self.model.outputs]

    @property
    def per_shape(self) -> bool:
        """Whether the package is compiled per input shape (open dimensions besides the
        batch, and no buckets of sequence lengths)."""
        return self.sequence is None and self.policy is not None and self.policy.specialised

    @property
    def source(self) -> str:
        return str(self.meta.get("source", ""))

    def strategy(self, **overrides: Any) -> Any:
        """An inference IpuStrategy with the package's options (``overrides`` are
        passed to ``set_options``)."""
        from paddle_ipu.strategy import IpuStrategy

        s = IpuStrategy.unpatched()
        s.set_graph_config(is_training=False, micro_batch_size=self.options["micro_batch_size"])
        s.set_pipelining_config(batches_per_step=self.options["batches_per_step"])
        s.set_precision_config(enable_fp16=bool(self.options["enable_fp16"]))
        if self.options.get("fp16_black_list"):
            s.set_options({"fp16_black_list": list(self.options["fp16_black_list"])})
        if overrides:
            s.set_options(overrides)
        return s

    def executor(self, backend: str | None = None, **options: Any) -> Any:
        """A prepared :class:`~paddle_ipu.executor.IpuExecutor` of the package."""
        from paddle_ipu.executor import executor_for

        if self.sequence is not None:
            raise NotSupportedError(
                f"this package holds buckets of sequence lengths {list(self.sequence.lengths)}: "
                "run it through runtime_for(package) (or executors() for one executor per "
                "bucket)"
            )
        if self.per_shape or self.model is None:
            raise NotSupportedError(
                "this package is compiled per input shape (its feeds leave dimensions open: "
                f"{self.declared_shapes()}): run it through runtime_for(package), or "
                "shape_executor() for one executor over every shape"
            )
        return executor_for(self.model, self.strategy(**options), backend=backend)

    def executors(self, backend: str | None = None, **options: Any) -> dict[int, Any]:
        """One prepared executor per bucket of sequence lengths, by length."""
        from paddle_ipu.executor import executor_for

        if self.sequence is None:
            raise NotSupportedError("this package has no buckets of sequence lengths")
        return {
            length: executor_for(model, self.strategy(**options), backend=backend)
            for length, model in sorted(self.buckets.items())
        }

    def ahead(self) -> list[str]:
        """The input shapes (keys) compiled ahead: those the package holds, then those
        noted to be made from its open graph when its executors start."""
        noted = [str(k) for k in self.meta.get("input_shapes", [])]
        return list(dict.fromkeys([*self.shapes, *noted]))

    def declared_shapes(self) -> dict[str, list[int]]:
        """Feed -> its declared shape (-1: open)."""
        return {k: list(v) for k, v in (self.policy.declared if self.policy else {}).items()}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the package atomically (a temporary file renamed into place)."""
        target = Path(path)
        meta = dict(self.meta)
        meta["format"] = PACKAGE_FORMAT
        if self.policy is not None:
            meta["policy"] = self.policy.to_json()
        blobs: dict[str, np.ndarray] = {}
        files: dict[str, bytes] = {}
        entries = []
        for kind, key, file, model in self._graphs():
            graph, weights = _stored(model, blobs)
            files[file] = graph
            entries.append(
                {
                    "kind": kind,
                    "key": key,
                    "file": file,
                    "onnx_sha256": hashlib.sha256(graph).hexdigest(),
                    "opset": model.opset,
                    "inputs": [spec_json(s) for s in model.inputs],
                    "outputs": [spec_json(s) for s in model.outputs],
                    "weights": weights,
                    # the Paddle operator of each node (fp16_black_list)
                    "source_ops": list(model.source_ops),
                    "node_ops": dict(model.node_ops),
                    # an open graph: its parameters (never folded when a shape is made)
                    **({"parameters": sorted(model.weights)} if kind == "open" else {}),
                }
            )
        meta["graphs"] = entries
        if self.sequence is not None:
            meta["buckets"] = self.sequence.to_json()
        weights_file = _save_blobs(blobs)
        meta["weights_sha256"] = hashlib.sha256(weights_file).hexdigest()
        if self.tail is not None:
            meta["tail"] = dict(
                self.tail.to_json(), sha256=hashlib.sha256(self.tail.program).hexdigest()
            )
            files[_TAIL] = self.tail.program
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("meta.json", json.dumps(meta, indent=1, sort_keys=True))
            zf.writestr(_WEIGHTS, weights_file)
            for name, data in files.items():
                zf.writestr(name, data)
        write_atomically(target, buffer.getvalue(), what="package", make_dirs=True)
        return target

    def _graphs(self) -> list[tuple[str, str, str, CompiledModel]]:
        """(kind, key, file, graph) of every graph, the package's own first."""
        out: list[tuple[str, str, str, CompiledModel]] = []
        if self.sequence is not None:
            longest = self.sequence.lengths[-1]
            for length, model in sorted(self.buckets.items()):
                file = "model.onnx" if length == longest else f"buckets/{length}.onnx"
                out.append(("bucket", str(length), file, model))
            return out
        keys = list(self.shapes)
        if self.model is not None and not self.shapes and self.open is not self.model:
            out.append(("graph", "", "model.onnx", self.model))
        for n, key in enumerate(keys):
            file = "model.onnx" if n == 0 else f"shapes/{n}.onnx"
            out.append(("shape", key, file, self.shapes[key]))
        if self.open is not None:
            out.append(("open", "", "open.onnx", self.open))
        return out


def _stored(model: CompiledModel, blobs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """``model``'s graph without its weights' data, and initializer -> stored weight
    (by content: an array every graph holds is stored once)."""
    stripped, arrays = split_weights(model.onnx, None)
    refs: dict[str, str] = {}
    for name, array in arrays.items():
        digest = hashlib.sha256()
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
        key = digest.hexdigest()
        blobs.setdefault(key, array)
        refs[name] = key
    return bytes(stripped.SerializeToString()), refs


def _save_blobs(blobs: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return bytes(save({k: np.ascontiguousarray(v) for k, v in blobs.items()}))


def _load_blobs(data: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return dict(load(data))


def spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "dtype": spec.dtype,
        "shape": list(spec.shape),
        "paddle_name": spec.paddle_name,
        "ranges": [asdict(r) for r in spec.ranges],
    }


def spec_from_json(d: dict[str, Any]) -> TensorSpec:
    ranges = tuple(
        IndexRange(
            int(r["low"]),
            int(r["high"]),
            str(r["use"]),
            tuple(r.get("allowed", ())),
            None if r.get("column") is None else int(r["column"]),
        )
        for r in d.get("ranges", ())
    )
    return TensorSpec(
        str(d["name"]),
        str(d["dtype"]),
        tuple(int(x) for x in d["shape"]),
        str(d.get("paddle_name", "")),
        ranges,
    )


def load_package(path: str | os.PathLike[str]) -> Package:
    """Read a package; PackageError names the file if it is not one, or its
    checksum does not match."""
    p = Path(path)
    files: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(p) as zf:
            meta = json.loads(zf.read("meta.json"))
            if meta.get("format") == PACKAGE_FORMAT:
                files[_WEIGHTS] = zf.read(_WEIGHTS)
                for entry in meta["graphs"]:
                    files[entry["file"]] = zf.read(entry["file"])
                if "tail" in meta:
                    files[_TAIL] = zf.read(_TAIL)
    except FileNotFoundError as exc:
        raise PackageError(f"no package at {str(p)!r}") from exc
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise PackageError(
            f"{str(p)!r} is not a paddle-ipu package (paddle-ipu compile writes them): {exc}"
        ) from exc
    if meta.get("format") != PACKAGE_FORMAT:
        raise PackageError(
            f"{str(p)!r}: package format {meta.get('format')!r}, this paddle-ipu reads format "
            f"{PACKAGE_FORMAT}; compile the model again"
        )
    check = _checker(p)
    check(_WEIGHTS, files[_WEIGHTS], meta.get("weights_sha256"))
    try:
        blobs = _load_blobs(files[_WEIGHTS])
    except Exception as exc:
        raise PackageError(f"{str(p)!r}: {_WEIGHTS} cannot be read: {exc}") from exc
    mbs = int(meta["options"]["micro_batch_size"])
    policy = ShapePolicy.from_json(meta["policy"]) if "policy" in meta else None
    package = Package(None, dict(meta["options"]), meta, policy=policy)
    for entry in meta["graphs"]:
        data = files[entry["file"]]
        check(entry["file"], data, entry["onnx_sha256"])
        model = _graph(entry, data, blobs, mbs, p)
        if entry["kind"] == "open":
            package.open = model
            continue
        if entry["kind"] == "bucket":
            package.buckets[int(entry["key"])] = model
        elif entry["kind"] == "shape":
            package.shapes[str(entry["key"])] = model
        if package.model is None or entry["file"] == "model.onnx":
            package.model = model
    if "buckets" in meta:
        package.sequence = SequenceBuckets.from_json(meta["buckets"])
        package.model = package.buckets[package.sequence.lengths[-1]]
    if "tail" in meta:
        check(_TAIL, files[_TAIL], meta["tail"].get("sha256"))
        package.tail = HostTail.from_json(meta["tail"], files[_TAIL])
    return package


def _checker(path: Path) -> Callable[[str, bytes, Any], None]:
    def check(file: str, data: bytes, recorded: Any) -> None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != recorded:
            raise PackageError(
                f"{str(path)!r}: {file} has SHA-256 {digest}, the package records "
                f"{recorded}: the file is damaged"
            )

    return check


def _graph(
    entry: dict[str, Any], data: bytes, blobs: dict[str, np.ndarray], mbs: int, path: Path
) -> CompiledModel:
    import onnx

    try:
        proto = onnx.load_from_string(data)
        weights = {name: blobs[key] for name, key in entry["weights"].items()}
        graph = serialize_with_weights(proto, weights)
    except Exception as exc:
        raise PackageError(f"{str(path)!r}: {entry['file']} cannot be read: {exc}") from exc
    return CompiledModel(
        onnx=graph,
        inputs=[spec_from_json(d) for d in entry["inputs"]],
        outputs=[spec_from_json(d) for d in entry["outputs"]],
        # the weights are the graph's initializers (an open graph names its parameters)
        weights={str(n): str(n) for n in entry.get("parameters", ())},
        micro_batch_size=mbs,
        opset=int(entry["opset"]),
        source_ops=[str(op) for op in entry.get("source_ops", [])],
        node_ops={str(k): int(v) for k, v in entry.get("node_ops", {}).items()},
    )
