"""A program with open input dimensions, made static for one set of input shapes.

Trained models as Paddle's libraries export them leave dimensions open (an OCR
detector's ``[-1, 3, -1, -1]``, a recogniser's ``[-1, 3, 48, -1]``); the IPU runs
static shapes, and several of the compiler's lowerings need the sizes they work on (a
scaled interpolation's output size, adaptive pooling's bins).  :func:`specialise` gives
the feeds of the compiler's pruned copy of the program the shapes asked for, and every
value of it the shape Paddle's own CPU kernels produce for them: the copy runs on zeros
of those shapes, in its own scope beside the weights, and each value whose declared
shape has an open dimension takes the shape it had.  Paddle is the oracle; nothing here
re-implements a shape rule.  The run fetches each value's shape, not the value: a
``shape`` operator right after the one that makes it, in a clone of the program, so that
Paddle frees every activation as it runs (fetching the activations themselves held all
of them at once: 3 GB for PP-OCRv5's detector at 320x640, past 24 GB at 960x3424).

The batch stays open in the program, as the converter is used to it (the compiler fixes
it to the micro-batch in the ONNX graph afterwards): the copy runs twice, with batches of
one and two rows, and a dimension that differs between the runs stays ``-1``.  A value
whose size depends on the data fed (not on its shape) keeps the size it had for zeros,
which is why the compiler's check for data-dependent sizes runs before the graph is
lowered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.pir_values import dtype_name, shape_of
from paddle_ipu.errors import CompileError

log = logging.getLogger("paddle_ipu")

__all__ = ["check_shapes", "specialise"]


def check_shapes(
    declared: Mapping[str, Sequence[int]], shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """``shapes`` checked against the feeds' ``declared`` shapes (``-1``: open): the same
    feeds, ranks and static sizes, every size >= 1.  Returns them as tuples; raises
    CompileError naming the feed, the declared and the given shape."""
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise CompileError(
            f"input shapes given for {unknown}, which are not feeds of the program "
            f"(its feeds: {sorted(declared)})"
        )
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        want = tuple(int(d) for d in declared[name])
        got = tuple(int(d) for d in shape)
        wrong = len(got) != len(want) or any(
            g < 1 or (w >= 0 and g != w) for g, w in zip(got, want)
        )
        if wrong:
            raise CompileError(
                f"input shape {list(got)} for feed {name!r}, declared {list(want)}: a shape "
                "must have the declared rank, keep its static sizes and give every open "
                "(-1) dimension a size >= 1"
            )
        out[name] = got
    return out


def specialise(
    block: Any,
    feeds: Mapping[str, Any],
    shapes: Mapping[str, Sequence[int]],
    scope: Any,
    batch: int,
) -> None:
    """Make ``block`` (the compiler's pruned copy of a PIR program) static for
    ``shapes`` (feed name -> full shape): see the module docstring.  ``feeds`` maps a
    feed name to its data op's value.  An open first dimension (the batch) is ``batch``
    where the shape leaves it ``-1`` or the feed has no shape; any other open dimension
    needs a shape."""

    declared = {name: shape_of(value) for name, value in feeds.items()}
    if not shapes and not any(any(d < 0 for d in s[1:]) for s in declared.values()):
        return  # static already (an open batch is the compiler's business)
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        check_shapes(declared, {n: shapes[n] for n in unknown})  # raises, naming them
    wanted: dict[str, list[int]] = {}
    for name, shape in declared.items():
        full = [int(d) for d in shapes.get(name, shape)]
        if full and int(shape[0]) < 0 and full[0] < 0:
            full[0] = batch
        wanted[name] = full
    still_open = [n for n, s in wanted.items() if any(d < 0 for d in s)]
    if still_open:
        raise CompileError(
            f"feeds {still_open} have open dimensions ({[declared[n] for n in still_open]}) "
            "and no input shape for them: the IPU compiles static shapes; compile with "
            "input_shapes (or run the saved model through paddle_ipu.inference or a "
            "package, which compile one graph per input shape)"
        )
    given = check_shapes(declared, wanted)
    # the batch (an open first dimension) stays open in the program
    batched = {name for name, shape in declared.items() if shape and int(shape[0]) < 0}
    for name, shape in given.items():
        value = feeds[name]
        typed = [-1, *shape[1:]] if name in batched else list(shape)
        paddle_api.set_static_shape(value, typed)
        op = value.get_defining_op()
        if op is not None and op.has_attr("shape"):
            op.set_int_array_attr("shape", typed)
    # Every value, whose declaration may be open or (rarely, in PIR) of another rank
    # than the kernel gives (legacy programs are specialised before their translation:
    # legacy_reader.specialised_copy).
    values = [
        r
        for op in block.ops
        if op.name() not in ("pd_op.data", "pd_op.feed", "builtin.parameter", "pd_op.fetch")
        for r in op.results()
        if r.is_dense_tensor_type()
    ]
    if not values:
        return
    start = time.perf_counter()
    probe, sizes = _shape_probe(block.program, values)
    runs = [_run(probe, feeds, given, batched, rows, sizes, scope) for rows in (1, 2)]
    changed = 0
    for value, one, two in zip(values, *runs):
        if len(two) != len(one):
            continue  # the rank follows the batch: leave the declaration
        filled = [a if a == b else -1 for a, b in zip(one, two)]
        if filled != [int(d) for d in value.shape]:
            paddle_api.set_static_shape(value, filled)
            changed += 1
    log.debug(
        "input shapes %s: %d values given their shapes by two CPU runs (%.2f s)",
        {n: list(s) for n, s in given.items()},
        changed,
        time.perf_counter() - start,
    )


def _shape_probe(program: Any, values: Sequence[Any]) -> tuple[Any, list[Any]]:
    """A clone of ``program`` with a ``shape`` operator right after the operator that
    makes each of ``values`` (in the clone), and those operators' results, in order."""
    import paddle

    mapping = paddle.pir.IrMapping()
    probe = program.clone(mapping)
    sizes = []
    with paddle.static.program_guard(probe):
        for value in values:
            copy = mapping.look_up(value)
            paddle.pir.set_insertion_point_after(copy.get_defining_op())
            sizes.append(paddle.shape(copy))
        paddle.pir.reset_insertion_point_to_end()
    return probe, sizes


def _run(
    program: Any,
    feeds: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    batched: set[str],
    rows: int,
    sizes: Sequence[Any],
    scope: Any,
) -> list[tuple[int, ...]]:
    """The shapes that ``sizes`` (the ``shape`` of each value: :func:`_shape_probe`)
    hold when ``program`` runs on zeros of ``shapes`` (the batched feeds with ``rows``
    rows) on Paddle's CPU kernels."""
    import paddle

    feed = {
        name: np.zeros(
            (rows, *shapes[name][1:]) if name in batched else shapes[name], _numpy_dtype(value)
        )
        for name, value in feeds.items()
    }
    try:
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(_run_scope(scope)):
            arrays = exe.run(program, feed=feed, fetch_list=list(sizes), return_numpy=True)
    except Exception as exc:
        shown = {n: list(s[1:]) if n in batched else list(s) for n, s in shapes.items()}
        raise CompileError(
            f"the program does not run on input shapes {shown} (the batch aside): Paddle's "
            f"CPU kernels refused them ({type(exc).__name__}: {str(exc).strip()[:600]}); "
            "give shapes the model takes"
        ) from exc
    return [tuple(int(d) for d in np.asarray(a).reshape(-1)) for a in arrays]


def _numpy_dtype(value: Any) -> np.dtype:
    name = dtype_name(value)
    return np.dtype("bool" if name == "bool" else name)


def _run_scope(scope: Any) -> Any:
    """A scope that sees ``scope``'s weights and keeps what the run leaves (its
    intermediate variables) out of it."""
    if scope is None:
        import paddle

        return paddle.static.global_scope().new_scope()
    return scope.new_scope()
