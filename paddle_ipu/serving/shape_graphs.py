"""Where the graphs of a package compiled per input shape come from.

A shape's graph is, in this order: one the package holds (compiled ahead,
``--input-shapes``); made from the model's *open graph* (:mod:`paddle_ipu.compiler.
open_shapes`: the model converted once with its dimensions open, each shape made static
by ONNX's shape inference in a fraction of a second, nothing stored); one the compile
cache holds (a shape compiled earlier, each its own cache entry); or a compile of the
saved model at that shape (Paddle's kernels give every value its shape), stored in the
compile cache.  The graphs of shapes made at run time are never added to the package:
the package in memory does not grow with the shapes requests bring.

The open graph is made when the package is compiled and checked there against a
compile of the model at one shape (:func:`open_graph`): both graphs run on the host on
the same random feed and must agree; a model whose open graph does not convert or does
not agree is compiled per shape, and the package says why (``meta["open_graph"]``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import IpuError
from paddle_ipu.executor.shapes import ShapePolicy
from paddle_ipu.serving import cache as compile_cache

log = logging.getLogger("paddle_ipu")

__all__ = ["graph_for", "open_graph", "output_shapes", "random_feed"]


def random_feed(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
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


def probe_shapes(
    policy: ShapePolicy, given: Sequence[Mapping[str, Sequence[int]]]
) -> list[dict[str, tuple[int, ...]]]:
    """The shapes an open graph is checked at, first that compiles: the first shape
    given to compile ahead, the smallest of the declared ranges, then small distinct
    sizes on each open axis (so that a height and a width cannot be swapped unseen)."""
    out: list[dict[str, tuple[int, ...]]] = []
    for shapes in given[:1]:
        out.append({n: tuple(int(d) for d in v) for n, v in shapes.items()})
    if policy.ranges:
        low = {n: lo for n, (lo, _) in policy.ranges.items()}
        smallest: dict[str, tuple[int, ...]] = {}
        for n, s in policy.declared.items():
            smallest[n] = tuple(int(low.get(n, s)[a]) if d < 0 else int(d) for a, d in enumerate(s))
        out.append(smallest)
    for base in (64, 224, 640):
        probe: dict[str, tuple[int, ...]] = {}
        k = 0
        for name, declared in policy.declared.items():
            dims = []
            for axis, d in enumerate(declared):
                if d >= 0:
                    dims.append(int(d))
                elif axis == 0:
                    dims.append(1)
                else:
                    dims.append(base + 32 * k)
                    k += 1
            probe[name] = tuple(dims)
        out.append(probe)
    return out


def open_graph(
    loaded: Any,
    policy: ShapePolicy,
    micro_batch_size: int,
    given: Sequence[Mapping[str, Sequence[int]]] = (),
) -> tuple[CompiledModel | None, str]:
    """The open graph of a loaded saved model (``serving.saved_model._Loaded``),
    checked against a compile at a probe shape (:func:`probe_shapes`), and what the
    check found ("" when the graph is kept; else why there is none)."""
    from paddle_ipu.compiler.open_shapes import OpenGraph, compile_open
    from paddle_ipu.pipeline import compile_lock
    from paddle_ipu.pipeline import compile_model as compile_program

    try:
        with compile_lock, loaded.guard():
            model = compile_open(
                loaded.program, loaded.feeds, loaded.compiled_fetches, scope=loaded.scope,
                micro_batch_size=micro_batch_size,
            )  # fmt: skip
    except IpuError as exc:
        return None, f"the model does not convert with its dimensions open: {exc}"
    graph = OpenGraph(model)
    why = "no probe shape compiled"
    for shapes in probe_shapes(policy, given):
        full = {
            n: (micro_batch_size, *s[1:]) if policy.declared[n][0] < 0 else s
            for n, s in shapes.items()
        }
        try:
            with loaded.guard():
                reference = compile_program(
                    loaded.program, loaded.feeds, loaded.compiled_fetches, scope=loaded.scope,
                    micro_batch_size=micro_batch_size, input_shapes=full,
                )  # fmt: skip
        except IpuError as exc:
            why = f"no probe shape compiled (the last, {full}: {exc})"
            continue
        try:
            made = graph.specialise(full)
        except IpuError as exc:
            return None, f"the open graph does not take {full}: {exc}"
        # as a package holds it (its weights are the graph's own, as the open graph's)
        differs = _compare(made, dataclasses.replace(reference, weights={}))
        if differs:
            return None, f"the open graph differs from a compile at {full}: {differs}"
        log.info(
            "open graph checked against a compile at %s: every other shape is made from it",
            {n: list(s) for n, s in full.items()},
        )
        return model, ""
    return None, why


def _compare(made: CompiledModel, reference: CompiledModel) -> str:
    """ "" when both graphs give the same outputs on one random feed (host backend),
    else what differs."""
    from paddle_ipu.executor import executor_for
    from paddle_ipu.strategy import IpuStrategy

    if [s.shape for s in made.outputs] != [s.shape for s in reference.outputs]:
        return (
            f"output shapes {[list(s.shape) for s in made.outputs]} against "
            f"{[list(s.shape) for s in reference.outputs]}"
        )
    rng = np.random.default_rng(0)
    feed = {s.paddle_name or s.name: random_feed(s, rng) for s in reference.inputs}
    strategy = IpuStrategy.unpatched()
    strategy.set_graph_config(is_training=False, micro_batch_size=reference.micro_batch_size)
    answers = []
    for model in (made, reference):
        executor = executor_for(model, strategy, backend="host")
        try:
            answers.append(executor.run(feed))
        finally:
            executor.reset()
    for spec, a, b in zip(reference.outputs, *answers):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(float(np.max(np.abs(b64))) if b64.size else 0.0, 1e-30)
        if not np.allclose(a64, b64, rtol=1e-5, atol=1e-6 * scale, equal_nan=True):
            err = float(np.max(np.abs(a64 - b64))) / scale
            return f"output {spec.paddle_name or spec.name!r} by {err:.2g} of its scale"
    return ""


def _shape_entry(package: Any, key: str) -> str:
    """The compile cache's key of one shape of ``package`` compiled at run time."""
    return hashlib.sha256(f"{package.meta.get('cache_key', '')}\0{key}".encode()).hexdigest()


def graph_for(
    package: Any, key: str, compile_shape: Callable[[Any, str], CompiledModel]
) -> tuple[CompiledModel, str]:
    """The graph of ``package``'s input shape ``key`` and how it was had (see the
    module docstring); ``compile_shape(package, key)`` compiles it where nothing else
    has it (:func:`paddle_ipu.serving.saved_model.compile_shape`)."""
    found = package.shapes.get(key)
    if found is not None:
        return found, "prepared from the package"
    policy = package.policy
    shapes = policy.input_shapes(key, int(package.options["micro_batch_size"]))
    graph = package.open_graph()
    if graph is not None:
        return graph.specialise(shapes), "made from the open graph"
    cached = bool(package.meta.get("cache_key"))
    entry = _shape_entry(package, key)
    if cached:
        hit = compile_cache.get(entry)
        if hit is not None and key in hit.shapes:
            return hit.shapes[key], "from the compile cache"
    model = compile_shape(package, key)
    if cached:
        from paddle_ipu.serving.package import Package

        meta = {
            "source": package.source,
            "options": dict(package.options),
            "versions": package.meta.get("versions", {}),
            "shape": key,
        }
        single = Package(model, dict(package.options), meta, shapes={key: model}, policy=policy)
        compile_cache.put(entry, single)
    return model, "compiled"


def output_shapes(package: Any) -> Any:
    """The outputs' shapes at given input shapes, from the package's open graph (None
    without one)."""
    graph = package.open_graph()
    return None if graph is None else graph.output_shapes
