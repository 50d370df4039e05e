"""The feed contract: what a feed must be for a compiled model to run, checked once.

Every route into a compiled model checks its feeds here, and only here:

- ``exe.run`` of a compiled program, the implicit and the dygraph front doors, the
  predictor: :meth:`paddle_ipu.executor.IpuExecutor.run` (:class:`FeedPlan`);
- a request of the model runtime (:class:`RequestChecks`); the runtime then runs
  the executor on step buffers it packed from checked requests, handed over as a
  :class:`CheckedFeed`, which is not checked again;
- a request the C++ serving path parsed: checked there (names, dtypes, shapes and
  index ranges, from the same specs), queued without Python, and run as a
  :class:`CheckedFeed` too.

What is checked, with a :class:`~paddle_ipu.errors.FeedError` naming the feed, the
expected and the received value:

- names: every compiled input, nothing else (:func:`check_names`);
- arrays: a feed read as an ndarray without a copy (:func:`as_array`);
- dtypes: the graph's, or a safe cast, int64 -> int32 range-checked (:func:`feed_cast`);
- shapes: PopART's step layout ``[bps, af, rf, *shape]`` (size-1 factors removed, or
  all kept), the steps flattened into the batch as Paddle 2.x fed them, or any shape
  of the same element count, as Paddle 2.x's IPU backend took a feed
  (:func:`to_step_buffer`);
- index ranges: every value an operator indexes with lies in its range
  (:func:`check_ranges`);
- model-runtime requests: any number of rows when auto-batching, exactly one
  micro-batch otherwise, at most ``max_request_rows`` (:class:`RequestChecks`);
- sequence buckets: one sequence length over every sequence feed, and a compiled
  bucket that holds it (:func:`sequence_length`, :func:`bucket_for`);
- open shapes: a request to a model compiled per input shape has each feed's rank and
  static sizes, open sizes >= 1 and the same rows in every batched feed
  (:func:`open_request`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu.backends.layout import StepLayout
from paddle_ipu.compiler.model import IndexRange, TensorSpec
from paddle_ipu.errors import FeedError

log = logging.getLogger("paddle_ipu")
#: feeds already logged as taken by their element count
_BY_COUNT_LOGGED: set[str] = set()

# Casts a feed may take silently: the graph's dtype from the fed dtype.
SAFE_CASTS = frozenset(
    {
        ("int64", "int32"),  # IPUs compute in int32; values are range-checked
        ("int32", "int64"),
        ("bool", "int32"),
        ("float64", "float32"),
        ("float16", "float32"),  # exact; Paddle 2.x's fp16 flow feeds float16
    }
)


class CheckedFeed(dict[str, np.ndarray]):
    """Step buffers (ONNX input name -> array in the step layout) built from feeds this
    module already checked: :meth:`FeedPlan.check` passes them through unchecked."""


# -- arrays, names, dtypes ----------------------------------------------------------


def as_array(value: Any, name: str = "") -> np.ndarray:
    """A feed as an ndarray, without copying one (a Paddle tensor through its
    ``numpy()``)."""
    if isinstance(value, np.ndarray):
        return value
    numpy = getattr(value, "numpy", None)
    try:
        if callable(numpy):
            return np.asarray(numpy())
        return np.asarray(value)
    except Exception as exc:
        what = f"feed {name!r}" if name else "a feed"
        raise FeedError(f"{what}: cannot read a {type(value).__name__} as an array: {exc}") from exc


def check_names(specs: Iterable[TensorSpec], feed: Mapping[str, Any]) -> dict[str, TensorSpec]:
    """Raise FeedError for unknown or missing feeds; return feed name -> spec."""
    expected = {spec.paddle_name or spec.name: spec for spec in specs}
    _check_name_set(expected, feed)
    return expected


def _check_name_set(expected: Mapping[str, Any], feed: Mapping[str, Any]) -> None:
    unknown = [name for name in feed if name not in expected]
    if unknown:
        raise FeedError(
            f"unknown feed {', '.join(repr(n) for n in unknown)}: the compiled program "
            f"takes {sorted(expected)}"
        )
    missing = [name for name in expected if name not in feed]
    if missing:
        raise FeedError(
            f"missing feed {', '.join(repr(n) for n in missing)}: the compiled program "
            f"takes {sorted(expected)}"
        )


def _identity(value: np.ndarray) -> np.ndarray:
    return value


def feed_cast(name: str, array: np.ndarray, spec: TensorSpec) -> Callable[[np.ndarray], np.ndarray]:
    """Check that ``array``'s dtype can be fed as the graph's; return the cast to
    apply (after the shape check): none, a byte swap of a non-native byte order, or a
    safe cast (int64 -> int32 range-checked).  FeedError names both dtypes otherwise."""
    want = spec.numpy_dtype
    have = array.dtype
    if have == want:
        return _identity
    native = have.newbyteorder("=") if have.byteorder not in ("=", "|") else have
    pair = (native.name, want.name)
    if native != want and pair not in SAFE_CASTS:
        order = "" if native is have else f" ({_byte_order(have)})"
        raise FeedError(f"feed {name!r}: expected dtype {want.name}, received {native.name}{order}")

    def cast(value: np.ndarray) -> np.ndarray:
        if pair == ("int64", "int32"):
            check_int32(name, value)
        return value.astype(want)  # also brings a big-endian feed to native order

    return cast


def check_int32(name: str, value: np.ndarray) -> None:
    """FeedError when integer values do not fit the graph's int32."""
    if not value.size or value.dtype.itemsize <= 4:
        return
    lo, hi = int(value.min()), int(value.max())
    info = np.iinfo(np.int32)
    if lo < info.min or hi > info.max:
        raise FeedError(
            f"feed {name!r}: {value.dtype.name} values in [{lo}, {hi}] do not fit the graph's int32"
        )


def _byte_order(dtype: np.dtype) -> str:
    return "big-endian" if dtype.byteorder == ">" else "little-endian"


# -- shapes and ranges ----------------------------------------------------------------


def to_step_buffer(
    layout: StepLayout, name: str, array: np.ndarray, shape: tuple[int, ...]
) -> np.ndarray:
    """View ``array`` (a feed) as ``[bps, af, rf, *shape]`` without copying.

    Accepts the step layout (size-1 factors removed, or all kept), the flattened
    form (``bps * af * rf * batch`` rows), and -- as Paddle 2.x's IPU backend took
    every feed, by its element count, whatever shape it came in -- any array of
    ``bps * af * rf * prod(shape)`` elements, read in C order (a feed declared
    ``[micro_batch * seq_len]`` fed as ``[batch, seq_len]``; logged once per feed).
    Anything else raises a FeedError naming the feed, the dimension, the expected
    and the received value."""
    full = (*layout.factors(), *shape)
    got = tuple(array.shape)
    if got == layout.input_shape(shape) or got == full:
        return array.reshape(full)
    n = layout.micro_batches
    if shape and n > 1 and got[1:] == tuple(shape[1:]) and got and got[0] == n * shape[0]:
        return array.reshape(full)
    count = n * int(np.prod(shape, dtype=np.int64))
    if got and array.size == count:
        if name not in _BY_COUNT_LOGGED:
            _BY_COUNT_LOGGED.add(name)
            log.info(
                "feed %r of shape %s taken by its element count (%d) as %s, as Paddle 2.x's "
                "IPU backend took feeds",
                name,
                list(got),
                count,
                list(full),
            )
        return array.reshape(full)
    expected = layout.input_shape(shape)
    flat = (n * shape[0], *shape[1:]) if shape and n > 1 else None
    if len(got) != len(expected) and flat is not None and len(got) == len(flat):
        # The flattened form: compare with it, it is what the caller meant.
        expected = flat
    any_shape = f", or any shape of {count} elements"
    if len(got) != len(expected):
        alt = f" or {list(flat)}" if flat is not None else ""
        raise FeedError(
            f"feed {name!r}: expected rank {len(expected)} with shape {list(expected)}"
            f"{alt}{any_shape}, received rank {len(got)} with shape {list(got)} "
            f"({array.size} elements)"
        )
    for dim, (want, have) in enumerate(zip(expected, got)):
        if want != have:
            raise FeedError(
                f"feed {name!r}: dimension {dim} must be {want}, received {have} "
                f"(expected shape {list(expected)}{any_shape}, received {list(got)} "
                f"({array.size} elements); "
                f"batches_per_step={layout.batches_per_step}, "
                f"accumulation_factor={layout.accumulation_factor}, "
                f"replication_factor={layout.replication_factor}, "
                f"micro-batch shape {list(shape)})"
            )
    raise FeedError(f"feed {name!r}: shape {list(got)} does not match {list(expected)}")


def check_ranges(name: str, array: np.ndarray, ranges: Sequence[IndexRange]) -> None:
    """FeedError when a value of the index feed ``name`` is outside one of its
    ranges (see :mod:`paddle_ipu.compiler.ranges`): name, value, position and the
    valid range."""
    if not ranges or array.size == 0:
        return
    lo, hi = array.min(), array.max()
    for bound in ranges:
        if lo >= bound.low and hi < bound.high:
            continue
        part = array
        if bound.column is not None:
            if array.ndim == 0 or array.shape[-1] <= bound.column:
                continue  # the shape check reports a feed without that column
            part = array[..., bound.column]
        bad = (part < bound.low) | (part >= bound.high)
        if bound.allowed:
            bad &= ~np.isin(part, bound.allowed)
        count = int(np.count_nonzero(bad))
        if not count:
            continue
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        value = int(part[where])
        if bound.column is not None:
            where = (*where, bound.column)
        raise FeedError(
            f"feed {name!r}: value {value} at index {list(where)} is out of range; valid "
            f"values are {bound.describe()}; {count} value(s) of the feed are outside it"
        )


# -- the executor's feeds -------------------------------------------------------------


class FeedPlan:
    """The check of one executor's feeds: names, dtypes, shapes in the step layout and
    index ranges.  Returns ONNX input name -> array in the step layout, without a copy
    unless a dtype cast is needed."""

    def __init__(self, inputs: Sequence[TensorSpec], layout: StepLayout) -> None:
        self.inputs = list(inputs)
        self.layout = layout
        # Feeds that need no cast and already have the step layout's shape are passed
        # through as they are (the common case, checked first); index feeds are
        # range-checked on this path too.
        self._fast = [
            (
                spec.paddle_name or spec.name,
                spec.name,
                spec.numpy_dtype,
                layout.input_shape(spec.shape),
                spec.ranges,
            )
            for spec in self.inputs
        ]

    def check_names(self, feed: Mapping[str, Any]) -> dict[str, TensorSpec]:
        return check_names(self.inputs, feed)

    def check(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if type(feed) is CheckedFeed:
            return feed
        if len(feed) == len(self._fast):
            fast: dict[str, np.ndarray] = {}
            for feed_name, onnx_name, dtype, shape, ranges in self._fast:
                value = feed.get(feed_name)
                if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                    break
                if ranges:
                    check_ranges(feed_name, value, ranges)
                fast[onnx_name] = value
            else:
                return fast
        expected = self.check_names(feed)
        out: dict[str, np.ndarray] = {}
        for name, spec in expected.items():
            # Dtype and shape are checked before anything is cast or copied: a
            # wrong-shaped feed (a huge broadcast view, say) is refused as it is.
            array = as_array(feed[name], name)
            cast = feed_cast(name, array, spec)
            view = to_step_buffer(self.layout, name, array, spec.shape)
            if spec.ranges:
                if spec.numpy_dtype == np.int32:
                    check_int32(name, view)  # the overflow first: it says more
                check_ranges(name, view, spec.ranges)
            out[spec.name] = cast(view)
        return out


# -- the model runtime's requests -----------------------------------------------------


class RequestChecks:
    """The check of one model-runtime request (see :mod:`paddle_ipu.serving.model_runtime`):
    names and dtypes, then the rows -- any number, the same in every feed, at most
    ``max_request_rows`` when auto-batching; exactly one micro-batch otherwise -- then
    index ranges; only then a cast or a copy.  :meth:`check` returns the arrays in
    compiled order (C-contiguous, the graph's dtypes) and the request's units (rows
    when auto-batching, else 1)."""

    def __init__(
        self,
        inputs: Sequence[TensorSpec],
        *,
        auto_batch: bool,
        micro_batch_size: int,
        max_request_rows: int,
    ) -> None:
        self.inputs = list(inputs)
        self.names = [s.paddle_name or s.name for s in self.inputs]
        self.auto_batch = auto_batch
        self.micro_batch_size = micro_batch_size
        self.max_request_rows = max_request_rows
        # The common request, checked first: native arrays of the graph's dtype, C
        # order, the trailing shape, no index ranges to check.
        self._fast = (
            [
                (name, s.numpy_dtype, len(s.shape), tuple(s.shape[1:]))
                for name, s in zip(self.names, self.inputs)
            ]
            if auto_batch and not any(s.ranges for s in self.inputs)
            else None
        )

    def _fast_request(self, feed: Any) -> tuple[list[np.ndarray], int] | None:
        """The arrays and rows of a request that needs no cast, copy or range check;
        None sends it through the full check (which also words the errors)."""
        plan = self._fast
        if plan is None or type(feed) is not dict or len(feed) != len(plan):
            return None
        arrays = []
        units = -1
        for name, dtype, ndim, trailing in plan:
            a = feed.get(name)
            if (
                type(a) is not np.ndarray
                or a.dtype != dtype
                or a.ndim != ndim
                or a.shape[1:] != trailing
                or not a.flags.c_contiguous
            ):
                return None
            rows = a.shape[0]
            if units < 0:
                units = rows
            elif rows != units:
                return None
            arrays.append(a)
        if not 0 < units <= self.max_request_rows:
            return None
        return arrays, units

    def check(self, feed: Mapping[str, Any], copy: bool) -> tuple[list[np.ndarray], int]:
        fast = self._fast_request(feed)
        if fast is not None:
            if copy:  # the caller may reuse its arrays
                return [a.copy() for a in fast[0]], fast[1]
            return fast
        if not isinstance(feed, Mapping):
            raise FeedError(f"a feed must be a dict of name -> array, got {type(feed).__name__}")
        check_names(self.inputs, feed)
        arrays: list[np.ndarray] = []
        units = -1
        first = ""
        for name, spec in zip(self.names, self.inputs):
            # Dtype and shape first, then the size cap; only then cast or copy.
            array = as_array(feed[name], name)
            cast = feed_cast(name, array, spec)
            if self.auto_batch:
                trailing = tuple(spec.shape[1:])
                if array.ndim != len(spec.shape) or tuple(array.shape[1:]) != trailing:
                    raise FeedError(
                        f"feed {name!r}: expected shape [rows, {', '.join(map(str, trailing))}]"
                        f" (any number of rows; auto-batching packs them into micro-batches of "
                        f"{self.micro_batch_size}), received {list(array.shape)}"
                    )
                rows = int(array.shape[0])
                if rows > self.max_request_rows:
                    raise FeedError(
                        f"feed {name!r}: a request may have at most {self.max_request_rows} "
                        f"rows (max_request_rows), received {rows}; split it into smaller "
                        f"requests"
                    )
                if units < 0:
                    units, first = rows, name
                elif rows != units:
                    raise FeedError(
                        f"feeds {first!r} and {name!r} have {units} and {rows} rows: every "
                        f"feed of a request must have the same number of rows"
                    )
            else:
                if tuple(array.shape) != tuple(spec.shape):
                    if array.ndim == len(spec.shape) and array.shape[1:] == spec.shape[1:]:
                        raise FeedError(
                            f"feed {name!r}: without auto-batching (timeout_ms=0) a request is "
                            f"exactly one micro-batch: expected {spec.shape[0]} rows, received "
                            f"{array.shape[0]} (shape {list(array.shape)}); set timeout_ms > 0 "
                            f"to auto-batch requests of any size"
                        )
                    raise FeedError(
                        f"feed {name!r}: expected shape {list(spec.shape)} (one micro-batch), "
                        f"received {list(array.shape)}"
                    )
                array = array.reshape((1, *spec.shape))
                units = 1
            if spec.ranges:
                check_ranges(name, array, spec.ranges)
            cast_array = cast(array)
            if copy and cast_array is array:  # the caller may reuse its arrays
                cast_array = np.array(array, copy=True, order="C")
            elif not cast_array.flags.c_contiguous:  # the queue reads rows with memcpy
                cast_array = np.ascontiguousarray(cast_array)
            arrays.append(cast_array)
        return arrays, max(units, 0)


# -- sequence buckets -----------------------------------------------------------------


def sequence_length(feed: Mapping[str, Any], axes: Mapping[str, tuple[int, ...]]) -> int:
    """The sequence length of a request: every sequence axis (``axes``: feed name ->
    its sequence axes) of every sequence feed present must have it."""
    found: tuple[str, int, int] | None = None
    for name, feed_axes in axes.items():
        if name not in feed:
            continue  # the runtime names a missing feed
        shape = np.shape(feed[name])
        for axis in feed_axes:
            if axis >= len(shape):
                raise FeedError(
                    f"feed {name!r}: expected a sequence axis {axis} (rank "
                    f">= {axis + 1}), received shape {list(shape)}"
                )
            if found is None:
                found = (name, axis, int(shape[axis]))
            elif int(shape[axis]) != found[2]:
                raise FeedError(
                    f"feed {name!r}: expected sequence length {found[2]} on axis {axis} "
                    f"(that of feed {found[0]!r}, axis {found[1]}), received "
                    f"{int(shape[axis])} (shape {list(shape)})"
                )
    if found is None:
        raise FeedError(f"the request has none of the sequence feeds {sorted(axes)}")
    return found[2]


def bucket_for(length: int, lengths: Sequence[int]) -> int:
    """The shortest compiled length (``lengths``, ascending) that holds ``length``."""
    for bucket in lengths:
        if length <= bucket:
            if length < 1:
                break
            return bucket
    raise FeedError(
        f"sequence length {length}: expected 1 to {lengths[-1]} (the compiled "
        f"buckets are {list(lengths)}); compile with a longer bucket (seq_buckets)"
    )


# -- open shapes ------------------------------------------------------------------------


def open_request(
    declared: Mapping[str, Sequence[int]], feed: Mapping[str, Any]
) -> tuple[int, dict[str, np.ndarray]]:
    """The rows and arrays of a request to a model whose feeds leave dimensions open
    (``declared``: feed -> declared shape, ``-1`` open, an open first dimension is the
    batch): every feed present, of the declared rank, its static sizes as declared, its
    open sizes >= 1, the batched feeds with the same rows.  Rows are -1 when no feed is
    batched."""
    check_names(
        [
            TensorSpec(name, "float32", tuple(int(d) for d in shape))
            for name, shape in declared.items()
        ],
        feed,
    )
    arrays: dict[str, np.ndarray] = {}
    rows = -1
    first = ""
    for name, shape in declared.items():
        array = as_array(feed[name], name)
        want = [int(d) for d in shape]
        got = list(array.shape)
        if len(got) != len(want) or any(w >= 0 and g != w for g, w in zip(got, want)):
            raise FeedError(f"feed {name!r}: expected shape {want} (-1: any size), received {got}")
        if any(g < 1 for g, w in zip(got[1:], want[1:]) if w < 0):
            raise FeedError(f"feed {name!r}: an open dimension of size 0 in shape {got}")
        if want and want[0] < 0:
            if rows < 0:
                rows, first = got[0], name
            elif got[0] != rows:
                raise FeedError(
                    f"feeds {first!r} and {name!r} have {rows} and {got[0]} rows: every "
                    "batched feed of a request must have the same number of rows"
                )
        arrays[name] = array
    return rows, arrays


def check_shape_range(
    name: str, shape: Sequence[int], low: Sequence[int], high: Sequence[int], axes: Iterable[int]
) -> None:
    """A FeedError naming the input, the dimension, its range and the size received
    when one of ``axes`` of ``shape`` is outside ``low``..``high`` (a model's declared
    shape ranges, :class:`paddle_ipu.executor.shapes.ShapePolicy`)."""
    for axis in axes:
        size = int(shape[axis])
        if not low[axis] <= size <= high[axis]:
            raise FeedError(
                f"input {name!r}: dimension {axis} must be in {low[axis]}..{high[axis]} "
                f"(the model's declared shape ranges, from {list(low)} to {list(high)}), "
                f"got {size} in shape {[int(d) for d in shape]}"
            )


def check_row_split(
    model: str, outputs: Sequence[TensorSpec], micro_batch_size: int, rows_per_run: int
) -> None:
    """A request's rows are split over micro-batches only when every output has the
    micro-batch as its first dimension (each row its own answer); FeedError otherwise."""
    for spec in outputs:
        if not spec.shape or spec.shape[0] != micro_batch_size:
            raise FeedError(
                f"{model}: output {spec.paddle_name or spec.name!r} (shape "
                f"{list(spec.shape)}) has no batch dimension of the micro-batch "
                f"({micro_batch_size}), so a request must be exactly {rows_per_run} rows"
            )


def check_typed_request(
    owner: str,
    declared: Sequence[tuple[str, str, np.dtype, Sequence[int]]],
    feed: Mapping[str, Any],
) -> dict[str, np.ndarray]:
    """A request to a model that declares its inputs by KServe v2 datatype (a pipeline):
    ``declared`` holds (name, datatype, numpy dtype -- object for BYTES --, dims with -1
    open).  Every input present, no other, of its
    dtype and shape; FeedErrors name ``owner``, the input, the expected and the received."""
    names = [d[0] for d in declared]
    unknown = sorted(set(feed) - set(names))
    if unknown:
        raise FeedError(f"{owner}: unknown inputs {unknown} (its inputs: {names})")
    values: dict[str, np.ndarray] = {}
    for name, datatype, dtype, dims in declared:
        value = feed.get(name)
        if value is None:
            raise FeedError(f"{owner}: input {name!r} is missing (its inputs: {names})")
        array = np.asarray(value, dtype=object if dtype == np.dtype(object) else None)
        if array.dtype != dtype:
            raise FeedError(
                f"{owner}: input {name!r} must be {datatype} ({dtype}), got {array.dtype}"
            )
        if len(array.shape) != len(dims) or any(
            d not in (-1, s) for d, s in zip(dims, array.shape)
        ):
            raise FeedError(
                f"{owner}: input {name!r} must have shape {list(dims)} (-1: any), got "
                f"{list(array.shape)}"
            )
        values[name] = array
    return values


def check_tail_input(
    name: str, got: tuple[int, ...], declared: tuple[int, ...], compiled_prefix: str
) -> None:
    """An input of a package's host tail (serving/host_tail.py) of the shape its program
    declares (-1: any size); ``compiled_prefix`` begins the names of the compiled
    graph's outputs.  Those without the batch dimension (a decoder's step count) have
    the shape of one run: a request split into micro-batches hands over several."""
    if len(got) == len(declared) and all(d < 0 or d == g for d, g in zip(declared, got)):
        return
    what = (
        f"the compiled graph's output {name[len(compiled_prefix) :]}"
        if name.startswith(compiled_prefix)
        else f"feed {name!r}"
    )
    raise FeedError(
        f"the package's host tail reads {what} as shape {list(declared)} (-1: any size) "
        f"and got {list(got)}: a value without the batch dimension is computed once per "
        "run of the compiled graph, so a request to this model must be exactly one run's "
        "rows (its micro-batch size times batches_per_step)"
    )
