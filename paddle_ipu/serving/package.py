"""Portable compiled packages: the format.

A *package* (``paddle-ipu compile MODEL_PREFIX -o model.pdipu``) is one zip file:

- ``model.onnx``: the compiled forward graph, weights included (as initializers);
- ``meta.json``: the inputs and outputs (names, dtypes, shapes), the micro-batch
  size, the opset, the result-changing strategy options, the versions it was
  compiled with, and the SHA-256 of ``model.onnx`` (checked on load).

*Buckets of sequence lengths* (``seq_buckets``): a model whose feeds have a ``-1``
dimension besides the batch (a text model's sequence length) is compiled once per
length in ``seq_buckets`` (the IPU runs static shapes); ``model.onnx`` is the longest
bucket, ``buckets/<length>.onnx`` the others, and ``meta.json`` lists them under
``buckets`` with the axes that are sequence axes and each feed's padding value
(:class:`~paddle_ipu.executor.shapes.SequenceBuckets`).  A request of length ``L``
runs in the shortest bucket ``>= L``: its feeds are padded to that length, its
outputs cut back to ``L``.  That is exact when what the outputs hold at positions
``< L`` does not depend on the padding (a causal decoder; a model whose attention
mask feed is padded with the value that masks); the compile checks it on the host
and refuses a model for which it is not (:mod:`paddle_ipu.serving.saved_model`).
Each bucket is a whole graph with its weights: a package of ``k`` buckets holds the
weights ``k`` times.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paddle_ipu._util.files import write_atomically
from paddle_ipu.compiler.model import CompiledModel, IndexRange, TensorSpec
from paddle_ipu.errors import NotSupportedError, PackageError
from paddle_ipu.executor.shapes import SequenceBuckets

__all__ = ["PACKAGE_FORMAT", "Package", "SequenceBuckets", "load_package"]

PACKAGE_FORMAT = 1


@dataclass
class Package:
    """A compiled model and how it was compiled (see the module docstring).

    A package of sequence buckets holds one compiled model per length (``buckets``,
    by length; ``model`` is the longest) and how requests fit them (``sequence``)."""

    model: CompiledModel
    options: dict[str, Any]  # micro_batch_size, batches_per_step, enable_fp16, seq_buckets
    meta: dict[str, Any]
    buckets: dict[int, CompiledModel] = field(default_factory=dict)
    sequence: SequenceBuckets | None = None

    def strategy(self, **overrides: Any) -> Any:
        """An inference IpuStrategy with the package's options (``overrides`` are
        passed to ``set_options``)."""
        from paddle_ipu.strategy import IpuStrategy

        s = IpuStrategy.unpatched()
        s.set_graph_config(is_training=False, micro_batch_size=self.options["micro_batch_size"])
        s.set_pipelining_config(batches_per_step=self.options["batches_per_step"])
        s.set_precision_config(enable_fp16=bool(self.options["enable_fp16"]))
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

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the package atomically (a temporary file renamed into place)."""
        target = Path(path)
        meta = dict(self.meta)
        meta["onnx_sha256"] = hashlib.sha256(self.model.onnx).hexdigest()
        files: dict[str, bytes] = {"model.onnx": self.model.onnx}
        if self.sequence is not None:
            longest = self.sequence.lengths[-1]
            entries = []
            for length, model in sorted(self.buckets.items()):
                name = "model.onnx" if length == longest else f"buckets/{length}.onnx"
                files[name] = model.onnx
                entries.append(
                    {
                        "length": length,
                        "file": name,
                        "onnx_sha256": hashlib.sha256(model.onnx).hexdigest(),
                        "opset": model.opset,
                        "inputs": [spec_json(s) for s in model.inputs],
                        "outputs": [spec_json(s) for s in model.outputs],
                    }
                )
            meta["buckets"] = {**self.sequence.to_json(), "models": entries}
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("meta.json", json.dumps(meta, indent=1, sort_keys=True))
            for name, data in files.items():
                zf.writestr(name, data)
        write_atomically(target, buffer.getvalue(), what="package", make_dirs=True)
        return target


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
    extra: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(p) as zf:
            meta = json.loads(zf.read("meta.json"))
            onnx = zf.read("model.onnx")
            for entry in meta.get("buckets", {}).get("models", ()):
                if entry["file"] != "model.onnx":
                    extra[entry["file"]] = zf.read(entry["file"])
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
    digest = hashlib.sha256(onnx).hexdigest()
    if digest != meta.get("onnx_sha256"):
        raise PackageError(
            f"{str(p)!r}: model.onnx has SHA-256 {digest}, the package records "
            f"{meta.get('onnx_sha256')}: the file is damaged"
        )
    model = CompiledModel(
        onnx=onnx,
        inputs=[spec_from_json(d) for d in meta["inputs"]],
        outputs=[spec_from_json(d) for d in meta["outputs"]],
        weights={},  # the weights are the graph's initializers
        micro_batch_size=int(meta["options"]["micro_batch_size"]),
        opset=int(meta["opset"]),
    )
    if "buckets" not in meta:
        return Package(model, dict(meta["options"]), meta)
    buckets: dict[int, CompiledModel] = {}
    for entry in meta["buckets"]["models"]:
        data = onnx if entry["file"] == "model.onnx" else extra[entry["file"]]
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["onnx_sha256"]:
            raise PackageError(
                f"{str(p)!r}: {entry['file']} has SHA-256 {digest}, the package records "
                f"{entry['onnx_sha256']}: the file is damaged"
            )
        buckets[int(entry["length"])] = CompiledModel(
            onnx=data,
            inputs=[spec_from_json(d) for d in entry["inputs"]],
            outputs=[spec_from_json(d) for d in entry["outputs"]],
            weights={},
            micro_batch_size=int(meta["options"]["micro_batch_size"]),
            opset=int(entry["opset"]),
        )
    sequence = SequenceBuckets.from_json(meta["buckets"])
    return Package(buckets[sequence.lengths[-1]], dict(meta["options"]), meta, buckets, sequence)
