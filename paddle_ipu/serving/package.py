"""Portable compiled packages and the compile cache.

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
(:class:`~paddle_ipu.serving.buckets.SequenceBuckets`).  A request of length ``L``
runs in the shortest bucket ``>= L``: its feeds are padded to that length, its
outputs cut back to ``L``.  That is exact when what the outputs hold at positions
``< L`` does not depend on the padding (a causal decoder; a model whose attention
mask feed is padded with the value that masks); the compile checks it on the host
and refuses a model for which it is not.
Each bucket is a whole graph with its weights: a package of ``k`` buckets holds the
weights ``k`` times.

It holds no Paddle program: :func:`load_package` gives a :class:`Package` whose
:meth:`Package.executor` runs it on either backend (the host's ONNX Runtime, or
PopART, which reads the same ONNX).

The *compile cache* keeps packages by a content address: the SHA-256 of the saved
model's files, the result-changing options, the backend and the versions of
paddle-ipu, Paddle, paddle2onnx and ONNX Runtime.  It is a least-recently-used
store bounded in bytes (``PADDLE_IPU_CACHE_MAX_MB``, default 2048) in
``PADDLE_IPU_CACHE_DIR`` (default ``~/.cache/paddle_ipu/compile``); an entry whose
checksum does not match is removed and compiled again.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu._infra.files import write_atomically
from paddle_ipu.compiler.model import CompiledModel, IndexRange, TensorSpec
from paddle_ipu.errors import (
    CompileError,
    IpuError,
    NotSupportedError,
    OptionError,
    OutputFileError,
    PackageError,
)
from paddle_ipu.serving.buckets import SequenceBuckets, check_padding

log = logging.getLogger("paddle_ipu")

__all__ = [
    "CacheEntry",
    "Package",
    "SequenceBuckets",
    "cache_clear",
    "cache_dir",
    "cache_entries",
    "compile_model",
    "load_package",
]

PACKAGE_FORMAT = 1
_DEFAULT_CACHE_MB = 2048

#: the compile stages a progress callback hears about, in order
STAGES = ("reading the saved model", "lowering to ONNX", "writing the package")

Progress = Callable[[int, int, str], None]


def _versions() -> dict[str, str]:
    import onnxruntime
    import paddle
    import paddle2onnx

    from paddle_ipu._version import __version__

    return {
        "paddle_ipu": __version__,
        "paddle": paddle.__version__,
        "paddle2onnx": paddle2onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


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
        from paddle_ipu.frontends.pipeline import executor_for

        if self.sequence is not None:
            raise NotSupportedError(
                f"this package holds buckets of sequence lengths {list(self.sequence.lengths)}: "
                "run it through runtime_for(package) (or executors() for one executor per "
                "bucket)"
            )
        return executor_for(self.model, self.strategy(**options), backend=backend)

    def executors(self, backend: str | None = None, **options: Any) -> dict[int, Any]:
        """One prepared executor per bucket of sequence lengths, by length."""
        from paddle_ipu.frontends.pipeline import executor_for

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
                        "inputs": [_spec_json(s) for s in model.inputs],
                        "outputs": [_spec_json(s) for s in model.outputs],
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


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "dtype": spec.dtype,
        "shape": list(spec.shape),
        "paddle_name": spec.paddle_name,
        "ranges": [asdict(r) for r in spec.ranges],
    }


def _spec_from_json(d: dict[str, Any]) -> TensorSpec:
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
        inputs=[_spec_from_json(d) for d in meta["inputs"]],
        outputs=[_spec_from_json(d) for d in meta["outputs"]],
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
            inputs=[_spec_from_json(d) for d in entry["inputs"]],
            outputs=[_spec_from_json(d) for d in entry["outputs"]],
            weights={},
            micro_batch_size=int(meta["options"]["micro_batch_size"]),
            opset=int(entry["opset"]),
        )
    sequence = SequenceBuckets.from_json(meta["buckets"])
    return Package(buckets[sequence.lengths[-1]], dict(meta["options"]), meta, buckets, sequence)


# -- compiling --------------------------------------------------------------------


def _model_files(prefix: str) -> tuple[Path, Path | None]:
    """The program file (.json under PIR, .pdmodel under the legacy IR) and the
    parameters file (absent for a model without weights)."""
    for ext in (".json", ".pdmodel"):
        program = Path(prefix + ext)
        if program.is_file():
            params = Path(prefix + ".pdiparams")
            return program, params if params.is_file() else None
    raise CompileError(
        f"no saved inference model at {prefix!r}: expected {prefix}.json (or {prefix}.pdmodel) "
        f"and {prefix}.pdiparams, as paddle.static.save_inference_model writes them"
    )


def _check_options(micro_batch_size: int, batches_per_step: int) -> None:
    for name, value in (
        ("micro_batch_size", micro_batch_size),
        ("batches_per_step", batches_per_step),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OptionError(f"{name} must be an int >= 1, got {value!r}")


def cache_key(prefix: str, options: dict[str, Any], backend: str, versions: dict[str, str]) -> str:
    """The content address of a compile: model files, options, backend, versions."""
    program, params = _model_files(prefix)
    h = hashlib.sha256()
    for f in (program, params):
        h.update(b"\0file\0")
        if f is not None:
            with open(f, "rb") as stream:
                for chunk in iter(lambda: stream.read(1 << 20), b""):
                    h.update(chunk)
    h.update(json.dumps([options, backend, versions], sort_keys=True).encode())
    return h.hexdigest()


def _check_buckets(
    seq_buckets: Sequence[int], pad_values: Mapping[str, float] | None
) -> tuple[list[int], dict[str, float]]:
    lengths = list(seq_buckets)
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise OptionError(f"seq_buckets must be ints >= 1, got {list(seq_buckets)!r}")
    if pad_values and not lengths:
        raise OptionError("pad_values is given without seq_buckets: it pads sequence buckets")
    pads: dict[str, float] = {}
    for name, value in (pad_values or {}).items():
        try:
            pads[str(name)] = float(value)
        except (TypeError, ValueError):
            raise OptionError(f"pad_values[{name!r}] must be a number, got {value!r}") from None
    return sorted({int(n) for n in lengths}), pads


def compile_model(
    prefix: str,
    *,
    micro_batch_size: int = 1,
    batches_per_step: int = 1,
    enable_fp16: bool = False,
    backend: str = "host",
    cache: bool = True,
    progress: Progress | None = None,
    seq_buckets: Sequence[int] = (),
    pad_values: Mapping[str, float] | None = None,
) -> tuple[Package, bool]:
    """Compile the saved inference model at ``prefix`` (``prefix.json`` and
    ``prefix.pdiparams``) into a :class:`Package`; return it and whether it came
    from the compile cache.

    ``seq_buckets``: compile once per sequence length (see the module docstring);
    ``pad_values``: the padding of named sequence feeds (an attention mask's masking
    value), the others pad with 0."""
    _check_options(micro_batch_size, batches_per_step)
    lengths, pads = _check_buckets(seq_buckets, pad_values)
    options: dict[str, Any] = {
        "micro_batch_size": micro_batch_size,
        "batches_per_step": batches_per_step,
        "enable_fp16": bool(enable_fp16),
    }
    if lengths:
        options["seq_buckets"] = lengths
        options["pad_values"] = dict(sorted(pads.items()))
    versions = _versions()
    key = cache_key(prefix, options, backend, versions) if cache else ""
    if cache:
        hit = _cache_get(key)
        if hit is not None:
            if progress:
                progress(len(STAGES), len(STAGES), "found in the compile cache")
            return hit, True
    import paddle

    from paddle_ipu.compiler import compile_program

    step = 0

    def stage() -> None:
        nonlocal step
        step += 1
        if progress:
            progress(step, len(STAGES), STAGES[step - 1])

    stage()
    paddle.enable_static()
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    # A model saved by Paddle 2.x (or in the legacy IR) is a .pdmodel protobuf, which
    # loads as a legacy program (compiled through its PIR translation); Paddle 3's
    # PIR mode only looks for .json.
    legacy = not Path(prefix + ".json").exists() and Path(prefix + ".pdmodel").exists()
    guard = paddle.pir_utils.OldIrGuard() if legacy else contextlib.nullcontext()
    try:
        with guard, paddle.static.scope_guard(scope):
            program, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
            stage()
            if lengths:
                buckets, sequence = _compile_buckets(
                    program, feeds, fetches, scope, micro_batch_size, lengths, pads
                )
                model = buckets[lengths[-1]]
            else:
                buckets, sequence = {}, None
                model = compile_program(
                    program, feeds, fetches, scope=scope, micro_batch_size=micro_batch_size
                )
    except IpuError:
        raise
    except Exception as exc:
        raise CompileError(f"cannot load the saved inference model {prefix!r}: {exc}") from exc
    stage()
    meta = {
        "format": PACKAGE_FORMAT,
        "source": os.path.abspath(prefix),
        "created": time.time(),
        "versions": versions,
        "backend": backend,
        "options": options,
        "opset": model.opset,
        "inputs": [_spec_json(s) for s in model.inputs],
        "outputs": [_spec_json(s) for s in model.outputs],
        "source_ops": list(model.source_ops),
    }
    packaged = {length: _packaged(m, micro_batch_size) for length, m in buckets.items()}
    main = packaged[lengths[-1]] if lengths else _packaged(model, micro_batch_size)
    package = Package(main, options, meta, packaged, sequence)
    if sequence is not None:
        meta["buckets"] = sequence.to_json()
    if cache:
        _cache_put(key, package)
    return package, False


def _packaged(model: CompiledModel, micro_batch_size: int) -> CompiledModel:
    """A package's model: the graph and its feeds and fetches; the weights are its
    initializers (no Paddle names to keep in sync)."""
    return CompiledModel(
        onnx=model.onnx,
        inputs=list(model.inputs),
        outputs=list(model.outputs),
        weights={},
        micro_batch_size=micro_batch_size,
        opset=model.opset,
        source_ops=list(model.source_ops),
    )


def _dynamic_axes(value: Any) -> tuple[int, ...]:
    """The ``-1`` dimensions of a program value besides the batch (axis 0)."""
    return tuple(axis for axis, d in enumerate(value.shape) if axis > 0 and int(d) < 0)


def _value_name(value: Any, fallback: str) -> str:
    try:
        return str(value.name)
    except Exception:
        return fallback


def _compile_buckets(
    program: Any,
    feeds: Sequence[Any],
    fetches: Sequence[Any],
    scope: Any,
    micro_batch_size: int,
    lengths: Sequence[int],
    pads: Mapping[str, float],
) -> tuple[dict[int, CompiledModel], SequenceBuckets]:
    """One compiled model per length, the sequence axes found and checked."""
    from paddle_ipu.compiler import compile_program

    # load_inference_model gives the feeds by name: their data ops hold the shapes
    data = {
        str(op.attrs()["name"]): op.result(0)
        for op in program.global_block().ops
        if op.name() in ("pd_op.data", "pd_op.feed")
    }
    values = {str(f): data[str(f)] for f in feeds if str(f) in data}
    feed_axes = {name: _dynamic_axes(v) for name, v in values.items() if _dynamic_axes(v)}
    if not feed_axes:
        shapes = {name: list(v.shape) for name, v in values.items()}
        raise OptionError(
            f"seq_buckets={list(lengths)}: no feed has a -1 dimension besides the batch "
            f"(the feeds' shapes: {shapes}); buckets are for a sequence length the model "
            "leaves open"
        )
    unknown = sorted(set(pads) - set(feed_axes))
    if unknown:
        raise OptionError(
            f"pad_values names {unknown}, which are not sequence feeds (those are "
            f"{sorted(feed_axes)})"
        )
    buckets = {
        length: compile_program(
            program,
            feeds,
            fetches,
            scope=scope,
            micro_batch_size=micro_batch_size,
            sequence_length=length,
        )
        for length in lengths
    }
    first = buckets[lengths[0]]
    names = [s.paddle_name or s.name for s in first.outputs]
    out_axes: dict[str, tuple[int, ...]] = {}
    for value, name in zip(fetches, names):
        axes = _dynamic_axes(value)
        if not axes:
            continue
        out_axes[name] = axes
        for length, model in buckets.items():
            shape = model.output(name).shape
            wrong = [a for a in axes if a >= len(shape) or shape[a] != length]
            if wrong:
                raise CompileError(
                    f"output {name!r} (declared {list(value.shape)}) has shape {list(shape)} "
                    f"for sequence length {length}: its axis {wrong[0]} is not the sequence "
                    "length, so a padded request's output cannot be cut back to its length"
                )
    sequence = SequenceBuckets(
        tuple(lengths),
        feed_axes,
        out_axes,
        {name: float(pads.get(name, 0.0)) for name in feed_axes},
        tuple(sorted(pads)),
    )
    check_padding(buckets, sequence)
    return buckets, sequence


# -- the cache --------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("PADDLE_IPU_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "paddle_ipu" / "compile"


def _cache_limit() -> int:
    raw = os.environ.get("PADDLE_IPU_CACHE_MAX_MB", str(_DEFAULT_CACHE_MB))
    try:
        mb = float(raw)
    except ValueError:
        raise OptionError(f"PADDLE_IPU_CACHE_MAX_MB must be a number of MiB, got {raw!r}") from None
    if not mb >= 0:
        raise OptionError(f"PADDLE_IPU_CACHE_MAX_MB must be >= 0, got {raw!r}")
    return int(mb * (1 << 20))


@dataclass
class CacheEntry:
    key: str
    path: Path
    size: int
    last_used: float
    source: str


def cache_entries() -> list[CacheEntry]:
    """The cache's entries, most recently used first."""
    directory = cache_dir()
    out = []
    for path in _entry_paths(directory):
        try:
            st = path.stat()
            with zipfile.ZipFile(path) as zf:
                source = str(json.loads(zf.read("meta.json")).get("source", "?"))
        except (OSError, zipfile.BadZipFile, KeyError, ValueError):
            source = "(unreadable)"
            try:
                st = path.stat()
            except OSError:
                continue
        out.append(CacheEntry(path.stem, path, st.st_size, st.st_mtime, source))
    out.sort(key=lambda e: e.last_used, reverse=True)
    return out


def _entry_paths(directory: Path) -> Iterator[Path]:
    if directory.is_dir():
        yield from directory.glob("*.pdipu")


def cache_clear() -> int:
    """Remove every entry; return how many."""
    n = 0
    for path in list(_entry_paths(cache_dir())):
        with contextlib.suppress(OSError):
            path.unlink()
            n += 1
    return n


def _cache_get(key: str) -> Package | None:
    path = cache_dir() / f"{key}.pdipu"
    if not path.is_file():
        return None
    try:
        package = load_package(path)
    except PackageError as exc:
        log.warning("compile cache: dropping a damaged entry (%s); compiling again", exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used: the mtime is the last use
    return package


def _cache_put(key: str, package: Package) -> None:
    directory = cache_dir()
    try:
        package.save(directory / f"{key}.pdipu")
    except OutputFileError as exc:  # a cache that cannot be written is not an error
        log.warning("compile cache: %s; continuing without caching", exc)
        return
    _evict(_cache_limit())


def _evict(limit: int) -> None:
    entries = cache_entries()
    total = sum(e.size for e in entries)
    # Oldest first; the entry just written is the newest and goes last (and does
    # go when it alone exceeds the limit).
    for entry in reversed(entries):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            entry.path.unlink()
            total -= entry.size


# -- progress ---------------------------------------------------------------------


def progress_printer(stream: Any = None, width: int = 24) -> Progress:
    """A bar redrawn in place on a terminal; one log line per stage otherwise."""
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    start = time.perf_counter()

    def show(step: int, total: int, what: str) -> None:
        elapsed = time.perf_counter() - start
        if tty:
            filled = width * step // total
            bar = "#" * filled + "-" * (width - filled)
            end = "\n" if step == total else ""
            out.write(f"\r[{bar}] {step}/{total} {what:<28} {elapsed:6.2f} s{end}")
        else:
            out.write(f"paddle-ipu compile: [{step}/{total}] {what} ({elapsed:.2f} s)\n")
        out.flush()

    return show
