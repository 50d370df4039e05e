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
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu._util import dtypes
from paddle_ipu.compiler.compile import static_mode
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.compiler.tail import split_tail
from paddle_ipu.errors import CompileError, IpuError, NotSupportedError, OptionError
from paddle_ipu.executor.shapes import (
    DEFAULT_SPECIALISATION_MEMORY_MB,
    SequenceBuckets,
    ShapeBuckets,
    ShapePolicy,
    check_pad_values,
    read_inference_yml,
)
from paddle_ipu.serving import cache as compile_cache
from paddle_ipu.serving.host_tail import HostTail
from paddle_ipu.serving.package import PACKAGE_FORMAT, Package, spec_json
from paddle_ipu.serving.shape_graphs import random_feed

log = logging.getLogger("paddle_ipu")

__all__ = [
    "STAGES",
    "cache_key",
    "check_buckets",
    "check_padding",
    "compile_model",
    "compile_shape",
]

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
        # packages compiled per input shape hold their open graph since this layout;
        # -2: its scalars joined with vectors made vectors (the host runs it)
        "shapes": "open-graph-3",
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
    seq_buckets: Sequence[int], pad_values: Mapping[str, Any] | None
) -> tuple[list[int], dict[str, float]]:
    """Sequence buckets and their pad values (numbers), checked."""
    lengths = list(seq_buckets)
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise OptionError(f"seq_buckets must be ints >= 1, got {list(seq_buckets)!r}")
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
    pad_values: Mapping[str, float | str] | None = None,
    input_shapes: Sequence[Mapping[str, Sequence[int]]] = (),
    max_specialisations: int | None = None,
    shape_ranges: Mapping[str, Sequence[Sequence[int]]] | None = None,
    fp16_black_list: Sequence[str] = (),
    shape_buckets: Any = None,
    memory_mb: float = DEFAULT_SPECIALISATION_MEMORY_MB,
) -> tuple[Package, bool]:
    """Compile the saved inference model at ``prefix`` (``prefix.json`` and
    ``prefix.pdiparams``) into a :class:`Package`; return it and whether it came
    from the compile cache.

    ``seq_buckets``: compile once per sequence length (see the module docstring);
    ``pad_values``: the padding of named sequence feeds (an attention mask's masking
    value), the others pad with 0.  A model whose feeds leave other dimensions open is
    compiled per input shape: ``input_shapes`` are the shapes to compile now (feed ->
    shape; the batch may be left -1: compiled into the package now, or, for a model with
    an open graph, made when its executors start), the others are made on first use
    (:mod:`paddle_ipu.serving.shape_graphs`), as many at once as ``memory_mb`` MiB hold
    (and at most ``max_specialisations``, when given); ``shape_ranges`` (feed -> ``[min,
    max]`` or ``[min, opt, max]`` shapes) bound the open dimensions a request may bring
    (None: the ``trt_dynamic_shapes`` of an ``inference.yml`` beside the model, as PaddleX
    exports ship it, if there is one; ``{}``: no bounds).  ``shape_buckets`` pads open
    dimensions up to grids of sizes (:class:`ShapeBuckets`, or its declaration for
    :meth:`ShapeBuckets.parse`; ``"auto"``: seeded from ``input_shapes`` and the shape
    ranges; None: none, except on ``popart``, where it is ``"auto"``), with
    ``pad_values`` (feed -> value; 0 otherwise).
    ``fp16_black_list``: with ``enable_fp16``, the Paddle operators the package's
    executors keep in float32 (the IpuStrategy option of that name)."""
    _check_options(micro_batch_size, batches_per_step)
    if seq_buckets:
        lengths, pads = check_buckets(seq_buckets, pad_values)
    else:  # shape buckets' pad values (a number, or "edge")
        lengths, pads = [], check_pad_values(pad_values)  # type: ignore[assignment]
    options: dict[str, Any] = {
        "micro_batch_size": micro_batch_size,
        "batches_per_step": batches_per_step,
        "enable_fp16": bool(enable_fp16),
    }
    if fp16_black_list:
        from paddle_ipu.options.precision import op_keys

        if not enable_fp16:
            raise OptionError(
                f"fp16_black_list {list(fp16_black_list)}: the operators it keeps in float32 "
                "are those of a float16 graph: compile with enable_fp16 (--fp16)"
            )
        options["fp16_black_list"] = op_keys("fp16_black_list", fp16_black_list)
    if lengths:
        options["seq_buckets"] = lengths
        options["pad_values"] = dict(sorted(pads.items()))
        if input_shapes:
            raise OptionError("input_shapes and seq_buckets cannot be given together")
        if shape_buckets is not None:
            raise OptionError("shape_buckets and seq_buckets cannot be given together")
    elif pads and shape_buckets is None:
        raise OptionError(
            "pad_values is given without seq_buckets or shape_buckets: it pads buckets"
        )
    ranges, source = _shape_ranges(prefix, shape_ranges)
    versions = _versions()
    key = cache_key(prefix, options, backend, versions) if cache else ""
    package = compile_cache.get(key) if cache else None
    hit = package is not None
    if package is None:
        package = _compile_package(
            prefix, options, backend, versions, lengths, pads, progress, ranges, input_shapes
        )
    else:
        # the same files may have been saved elsewhere since: more shapes compile from here
        package.meta["source"] = os.path.abspath(prefix)
        if progress:
            progress(len(STAGES), len(STAGES), "found in the compile cache")
    if package.tail is not None:  # said once per compile (or compile-cache hit)
        log.info("%s: %s", prefix, package.tail.note)
    policy = package.policy
    if policy is not None:
        policy = dataclasses.replace(
            policy, max_specialisations=max_specialisations, memory_mb=memory_mb, buckets=None
        )
        policy = policy.with_ranges(ranges or {})
        if policy.ranges:
            log.info("%s: input shape ranges from %s: %s", prefix, source, ranges)
        if package.per_shape:
            policy = policy.with_buckets(
                _shape_buckets(prefix, policy, shape_buckets, pads, input_shapes, backend)
            )
        package.policy = policy
    elif ranges and shape_ranges is not None:
        raise OptionError(
            f"shape ranges: {prefix!r} has no open dimensions besides the batch "
            f"(its feeds: {package.declared_shapes()}), which the ranges do not bound"
        )
    if shape_buckets is not None and not package.per_shape:
        raise OptionError(
            f"shape_buckets: {prefix!r} has no open dimensions besides the batch (its feeds: "
            f"{package.declared_shapes()}); it compiles one graph"
        )
    added = False
    for shapes in input_shapes:
        if policy is None or not package.per_shape:
            raise OptionError(
                f"input_shapes: {prefix!r} has no open dimensions besides the batch "
                f"(its feeds: {package.declared_shapes()}); it compiles one graph"
            )
        wanted, _ = policy.route(_full_shapes(policy, shapes))
        if package.open is not None:  # made from the open graph when asked: noted only
            ahead = package.meta.setdefault("input_shapes", [])
            if wanted not in ahead:
                ahead.append(wanted)
        elif wanted not in package.shapes:
            package.shapes[wanted] = compile_shape(package, wanted)
            if package.model is None:
                package.model = package.shapes[wanted]
            added = True
    if cache and (added or not hit):
        compile_cache.put(key, package)
    if cache:
        package.meta["cache_key"] = key
    return package, hit and not added


def _shape_buckets(
    prefix: str,
    policy: ShapePolicy,
    spec: Any,
    pads: Mapping[str, float],
    input_shapes: Sequence[Mapping[str, Sequence[int]]],
    backend: str,
) -> ShapeBuckets | None:
    """The buckets a model compiled per input shape is served with (see
    :func:`compile_model`)."""
    if spec is None and backend == "popart":
        spec = "auto"
    if spec is None:
        return None
    buckets: ShapeBuckets | None
    if isinstance(spec, ShapeBuckets):
        buckets = spec
    elif spec == "auto":
        buckets = ShapeBuckets.seed(
            policy.declared, shapes=[_full_shapes(policy, s) for s in input_shapes],
            ranges=policy.ranges,
        )  # fmt: skip
        if buckets is None:
            log.warning(
                "%s: no shape buckets: the model declares no input shapes and no shape "
                "ranges to seed them from; every input shape is a specialisation of its "
                "own (on the IPU, a compile of minutes): declare them",
                prefix,
            )
            return None
        log.info("%s: shape buckets seeded from its declared shapes: %s", prefix, buckets.grids)
    else:
        grids = spec.get("grids", spec) if isinstance(spec, Mapping) else spec
        declared_pads = spec.get("pad_values") if isinstance(spec, Mapping) else None
        buckets = ShapeBuckets.parse(grids, declared_pads)
    if pads:
        buckets = dataclasses.replace(buckets, pad_values={**buckets.pad_values, **pads})
    return buckets


def _shape_ranges(
    prefix: str, given: Mapping[str, Sequence[Sequence[int]]] | None
) -> tuple[Mapping[str, Sequence[Sequence[int]]] | None, str]:
    """The ranges to bound a model's open dimensions with, and where they come from."""
    if given is not None:
        return given, "the caller"
    path = os.path.join(os.path.dirname(os.path.abspath(prefix)), "inference.yml")
    if not os.path.isfile(path):
        return None, ""
    return read_inference_yml(path), path


def _full_shapes(
    policy: ShapePolicy, shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """``shapes`` (feed -> shape, the batch may be -1) checked against the declared
    shapes: the feeds with open dimensions, with their shapes."""
    from paddle_ipu.compiler.specialise import check_shapes

    open_feeds = set(policy.open_axes)
    missing = sorted(open_feeds - set(shapes))
    if missing:
        raise OptionError(
            f"input shapes {dict(shapes)} leave out feeds {missing}, whose dimensions are "
            f"open ({ {n: list(policy.declared[n]) for n in missing} })"
        )
    given = {n: [int(d) for d in s] for n, s in shapes.items()}
    for name, shape in given.items():
        declared = policy.declared.get(name, ())
        if shape and declared and declared[0] < 0 and shape[0] < 0:
            shape[0] = 1
    try:
        return check_shapes(policy.declared, given)
    except CompileError as exc:
        raise OptionError(str(exc)) from None


def _compile_package(
    prefix: str,
    options: dict[str, Any],
    backend: str,
    versions: dict[str, str],
    lengths: list[int],
    pads: dict[str, float],
    progress: Progress | None,
    ranges: Mapping[str, Sequence[Sequence[int]]] | None = None,
    input_shapes: Sequence[Mapping[str, Sequence[int]]] = (),
) -> Package:
    step = 0

    def stage() -> None:
        nonlocal step
        step += 1
        if progress:
            progress(step, len(STAGES), STAGES[step - 1])

    micro_batch_size = int(options["micro_batch_size"])
    stage()
    loaded = _load(prefix)
    stage()
    if loaded.tail is not None and lengths:
        raise OptionError(
            f"seq_buckets with {prefix!r}, whose outputs have data-dependent sizes "
            f"({', '.join(loaded.tail.first)}): buckets cut outputs back to a request's "
            "length, which a data-dependent output does not have"
        )
    policy = ShapePolicy(loaded.declared)
    model: CompiledModel | None = None
    open_model: CompiledModel | None = None
    open_why = ""
    if policy.specialised and not lengths:
        from paddle_ipu.serving.shape_graphs import open_graph

        bounded = policy.with_ranges(ranges or {})
        given = [_full_shapes(bounded, s) for s in input_shapes]
        open_model, open_why = open_graph(loaded, bounded, micro_batch_size, given)
        if open_why:
            log.info("%s: compiled per input shape (%s)", prefix, open_why)
    buckets: dict[int, CompiledModel] = {}
    sequence = None
    with loaded.guard():
        if lengths:
            buckets, sequence = _compile_buckets(
                loaded.program, loaded.feeds, loaded.fetches, loaded.scope,
                micro_batch_size, lengths, pads,
            )  # fmt: skip
            model = buckets[lengths[-1]]
        elif not policy.specialised:
            from paddle_ipu.pipeline import compile_model as compile_program

            model = compile_program(
                loaded.program, loaded.feeds, loaded.compiled_fetches, scope=loaded.scope,
                micro_batch_size=micro_batch_size,
            )  # fmt: skip
    stage()
    meta: dict[str, Any] = {
        "format": PACKAGE_FORMAT,
        "source": os.path.abspath(prefix),
        "created": time.time(),
        "versions": versions,
        "backend": backend,
        "options": options,
    }
    meta["feeds"] = {
        name: {"shape": list(shape), "dtype": loaded.feed_dtypes.get(name, "float32")}
        for name, shape in loaded.declared.items()
    }
    meta["fetches"] = [
        {"name": name, "dtype": dtype, "rank": rank}
        for name, dtype, rank in zip(loaded.fetch_names, loaded.fetch_dtypes, loaded.fetch_ranks)
    ]
    if model is not None:
        meta["opset"] = model.opset
        meta["inputs"] = [spec_json(s) for s in model.inputs]
        meta["outputs"] = [spec_json(s) for s in model.outputs]
        meta["source_ops"] = list(model.source_ops)
    packaged = {length: _packaged(m, micro_batch_size) for length, m in buckets.items()}
    main = None
    if model is not None:
        main = packaged[lengths[-1]] if lengths else _packaged(model, micro_batch_size)
    package = Package(main, options, meta, packaged, sequence, policy=policy)
    if policy.specialised and not lengths:
        package.open = open_model
        meta["open_graph"] = open_why or "checked"
        if open_model is not None:  # no shape compiled: the open graph's operators
            meta.setdefault("source_ops", list(open_model.source_ops))
    if loaded.tail is not None:
        split = loaded.tail
        package.tail = HostTail(
            split.program, split.feeds, split.outputs, split.ops, split.describe()
        )
    if sequence is not None:
        meta["buckets"] = sequence.to_json()
    return package


def compile_shape(package: Package, key: str) -> CompiledModel:
    """Compile ``package``'s saved model for the input shape ``key``
    (:meth:`ShapePolicy.key`) and return the graph (the package is not changed)."""
    policy = package.policy
    if policy is None or not package.per_shape:
        raise NotSupportedError("this package is not compiled per input shape")
    if not package.source or not any(
        Path(package.source + ext).is_file() for ext in (".json", ".pdmodel")
    ):
        raise NotSupportedError(
            f"input shape {key!r} is not among the shapes this package was compiled for "
            f"({list(package.shapes)}), and the saved model it came from "
            f"({package.source!r}) is not there to compile it: compile the package with "
            "--input-shapes for every shape it must take"
        )
    loaded = _load(package.source)
    micro_batch_size = int(package.options["micro_batch_size"])
    from paddle_ipu.pipeline import compile_model as compile_program

    with loaded.guard():
        model = compile_program(
            loaded.program, loaded.feeds, loaded.compiled_fetches, scope=loaded.scope,
            micro_batch_size=micro_batch_size, input_shapes=policy.input_shapes(key),
        )  # fmt: skip
    package.meta.setdefault("source_ops", list(model.source_ops))
    return _packaged(model, micro_batch_size)


@dataclasses.dataclass
class _Loaded:
    """A saved inference model loaded into its own scope, and its feeds' declared shapes."""

    program: Any
    feeds: list[Any]
    fetches: list[Any]
    scope: Any
    legacy: bool
    declared: dict[str, tuple[int, ...]]
    #: the feeds' dtypes; the fetches' names and dtypes (what a predictor's handles show
    #: before anything is compiled for a model compiled per input shape)
    feed_dtypes: dict[str, str] = dataclasses.field(default_factory=dict)
    fetch_names: list[str] = dataclasses.field(default_factory=list)
    fetch_dtypes: list[str] = dataclasses.field(default_factory=list)
    #: the data-dependent tail split off (:mod:`paddle_ipu.compiler.tail`), or None
    tail: Any = None
    #: the fetches' ranks
    fetch_ranks: list[int] = dataclasses.field(default_factory=list)

    @property
    def compiled_fetches(self) -> list[Any]:
        """What the compiled graph computes: the fetches, or what the host tail reads."""
        return list(self.tail.static_fetches) if self.tail is not None else self.fetches

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Static mode, the model's IR and scope; the process's mode and IR are left as
        they were."""
        import paddle

        ir = paddle.pir_utils.OldIrGuard() if self.legacy else contextlib.nullcontext()
        with static_mode(), ir, paddle.static.scope_guard(self.scope):
            yield


_loaded: dict[str, _Loaded] = {}
_loaded_lock = threading.Lock()
#: saved models kept loaded in a process (for their next input shape)
_LOADED_MAX = 4


def _load(prefix: str) -> _Loaded:
    """The saved model at ``prefix``, loaded once per process (a few are kept)."""
    import paddle

    program_file, params = model_files(prefix)
    stamp = ":".join(
        [os.path.abspath(prefix)] + [str(f.stat().st_mtime_ns) for f in (program_file, params) if f]
    )
    with _loaded_lock:
        found = _loaded.get(stamp)
        if found is not None:
            return found
        scope = paddle.static.Scope()
        # A model saved by Paddle 2.x (or in the legacy IR) is a .pdmodel protobuf, which
        # loads as a legacy program (compiled through its PIR translation); Paddle 3's
        # PIR mode only looks for .json.
        legacy = program_file.suffix == ".pdmodel"
        loaded = _Loaded(None, [], [], scope, legacy, {})
        try:
            with loaded.guard():
                exe = paddle.static.Executor(paddle.CPUPlace())
                program, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
                values = _feed_values(program, feeds)
                declared = {n: tuple(int(d) for d in v.shape) for n, v in values.items()}
                feed_dtypes = {n: dtypes.name_of(v.dtype) for n, v in values.items()}
                fetch_names = [_fetch_name(program, f, legacy) for f in fetches]
                fetch_dtypes = [dtypes.name_of(f.dtype) for f in fetches]
                fetch_ranks = [len(f.shape) for f in fetches]
                tail = split_tail(program, list(values.values()), list(fetches), fetch_names)
        except IpuError:
            raise
        except Exception as exc:
            raise CompileError(f"cannot load the saved inference model {prefix!r}: {exc}") from exc
        loaded = _Loaded(
            program, list(feeds), list(fetches), scope, legacy, declared,
            feed_dtypes, fetch_names, fetch_dtypes, tail, fetch_ranks,
        )  # fmt: skip
        while len(_loaded) >= _LOADED_MAX:
            _loaded.pop(next(iter(_loaded)))
        _loaded[stamp] = loaded
        return loaded


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
        node_ops=dict(model.node_ops),
    )


def _dynamic_axes(value: Any) -> tuple[int, ...]:
    """The ``-1`` dimensions of a program value besides the batch (axis 0)."""
    return tuple(axis for axis, d in enumerate(value.shape) if axis > 0 and int(d) < 0)


def _fetch_name(program: Any, fetch: Any, legacy: bool) -> str:
    """The name a fetch of a loaded saved model is known by (its variable's, or its
    PIR value's as the compiler names outputs)."""
    if legacy:
        return str(fetch.name)
    from paddle_ipu.compiler.pir_reader import resolve_fetch

    return resolve_fetch(program.global_block(), fetch)[1]


def _feed_values(program: Any, feeds: Sequence[Any]) -> dict[str, Any]:
    """The values of the feeds load_inference_model names, whose shapes are the data
    ops': a PIR program's data ops, or a legacy program's feed variables."""
    block = program.global_block()
    if hasattr(block, "vars"):  # the legacy IR (a .pdmodel loaded as Paddle 2.x saved it)
        return {str(f): block.var(str(f)) for f in feeds if block.has_var(str(f))}
    data = {
        str(op.attrs()["name"]): op.result(0)
        for op in block.ops
        if op.name() in ("pd_op.data", "pd_op.feed")
    }
    return {str(f): data[str(f)] for f in feeds if str(f) in data}


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

    values = _feed_values(program, feeds)
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
        base = {s.paddle_name or s.name: random_feed(s, rng) for s in model.inputs}
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
