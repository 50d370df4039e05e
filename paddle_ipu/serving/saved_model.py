"""Compiling a saved inference model into a package.

:func:`compile_model` reads a model saved by ``paddle.static.save_inference_model``
(``prefix.json`` under PIR, ``prefix.pdmodel`` under the legacy IR, and
``prefix.pdiparams``), compiles it through the pipeline's compile
(:func:`paddle_ipu.pipeline.compile_model`, under the process's compile lock) and
returns a :class:`~paddle_ipu.serving.package.Package`, from the compile cache
(:mod:`paddle_ipu.serving.cache`) when the same model was compiled with the same
options and versions before.  With ``seq_buckets`` it compiles one model per sequence
length and checks that padding a request cannot change its answer
(:func:`check_padding`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import CompileError, IpuError, OptionError
from paddle_ipu.executor.shapes import SequenceBuckets
from paddle_ipu.serving import cache as compile_cache
from paddle_ipu.serving.package import PACKAGE_FORMAT, Package, spec_json

__all__ = ["STAGES", "cache_key", "check_buckets", "check_padding", "compile_model"]

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


def model_files(prefix: str) -> tuple[Path, Path | None]:
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
    program, params = model_files(prefix)
    h = hashlib.sha256()
    for f in (program, params):
        h.update(b"\0file\0")
        if f is not None:
            with open(f, "rb") as stream:
                for chunk in iter(lambda: stream.read(1 << 20), b""):
                    h.update(chunk)
    h.update(json.dumps([options, backend, versions], sort_keys=True).encode())
    return h.hexdigest()


def check_buckets(
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
    lengths, pads = check_buckets(seq_buckets, pad_values)
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
        hit = compile_cache.get(key)
        if hit is not None:
            if progress:
                progress(len(STAGES), len(STAGES), "found in the compile cache")
            return hit, True
    import paddle

    from paddle_ipu.pipeline import compile_model as compile_program

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
        "inputs": [spec_json(s) for s in model.inputs],
        "outputs": [spec_json(s) for s in model.outputs],
        "source_ops": list(model.source_ops),
    }
    packaged = {length: _packaged(m, micro_batch_size) for length, m in buckets.items()}
    main = packaged[lengths[-1]] if lengths else _packaged(model, micro_batch_size)
    package = Package(main, options, meta, packaged, sequence)
    if sequence is not None:
        meta["buckets"] = sequence.to_json()
    if cache:
        compile_cache.put(key, package)
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
    from paddle_ipu.pipeline import compile_model as compile_program

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


def _random_feed(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Valid random values for a feed: integers in the range its operators index
    (0 or 1 without one), floats normal."""
    dtype = spec.numpy_dtype
    if dtype.kind in "iu":
        low = max((r.low for r in spec.ranges), default=0)
        high = min((r.high for r in spec.ranges), default=2)
        return rng.integers(low, max(high, low + 1), spec.shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, spec.shape).astype(dtype)
    return rng.standard_normal(spec.shape).astype(dtype)


def _prefix(array: np.ndarray, axes: Sequence[int], n: int) -> np.ndarray:
    """``array``'s first ``n`` positions along ``axes``."""
    index = tuple(slice(0, n) if a in axes else slice(None) for a in range(array.ndim))
    return np.ascontiguousarray(array[index])


def check_padding(buckets: Mapping[int, CompiledModel], sequence: SequenceBuckets) -> None:
    """Refuse buckets whose outputs at the real positions depend on the padding.

    The shortest bucket longer than 1 runs twice on the host, on a request of about
    half its length: padded with the pad values, then with random values (feeds with
    an explicit pad value keep it); the outputs cut to that length must agree."""
    from paddle_ipu.executor import executor_for
    from paddle_ipu.strategy import IpuStrategy

    length = next((n for n in sorted(buckets) if n > 1), None)
    if length is None:
        return  # every bucket is one long: nothing is ever padded
    model = buckets[length]
    real = max(1, length // 2)
    rng = np.random.default_rng(0)
    strategy = IpuStrategy()
    strategy.set_graph_config(is_training=False, micro_batch_size=model.micro_batch_size)
    executor = executor_for(model, strategy, backend="host")
    try:
        names = [s.paddle_name or s.name for s in model.outputs]
        # random at full length; the request is its first `real` positions
        base = {s.paddle_name or s.name: _random_feed(s, rng) for s in model.inputs}
        request = {name: _prefix(v, sequence.feeds.get(name, ()), real) for name, v in base.items()}
        padded = sequence.pad(request, length)
        # the same request, padded with random values instead (masks keep their value)
        noisy = dict(padded)
        for name in sequence.feeds:
            if name in base and name not in sequence.explicit:
                noisy[name] = base[name]
        first = sequence.unpad(names, executor.run(padded), real)
        second = sequence.unpad(names, executor.run(noisy), real)
    finally:
        executor.reset()
    for name, a, b in zip(names, first, second):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-30)
        if not np.allclose(a, b, rtol=1e-5, atol=1e-6 * scale, equal_nan=True):
            err = float(np.max(np.abs(a - b))) / scale
            masks = [f for f in sorted(sequence.feeds) if "mask" in f.lower()]
            example = f"{{{masks[0]!r}: 0}}" if masks else "{'attention_mask': 0}"
            hint = (
                f"; if a feed masks the padding (an attention mask), give its pad value "
                f"(pad_values={example}, --pad-value)"
                if not sequence.explicit
                else ""
            )
            raise CompileError(
                f"sequence buckets: output {name!r} at the first {real} positions changes "
                f"(by {err:.2g} of its scale) with what the padding to {length} holds, so a "
                f"padded request would not get its own answer{hint}. Buckets are exact for "
                "causal models and for models that mask the padding"
            )
