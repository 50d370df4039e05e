"""The shape policy: how a request of open shape fits a model compiled for static ones.

The IPU runs static shapes.  A model whose feeds leave dimensions open is run as a set
of *specialisations*, one graph per input shape, each made once and kept while memory
allows:

- the batch (an open first dimension) never makes a specialisation: a request's rows
  are run in micro-batches of the compiled size, the last one padded, and the outputs
  cut back to the request's rows (:class:`ShapePolicy`, run by
  :class:`paddle_ipu.executor.specialised.SpecialisedExecutor`);
- any other open dimension is compiled for the sizes requests bring, or, with
  :class:`ShapeBuckets`, for the smallest size of a declared grid that holds them: the
  request is padded up to it with the pad value its feed declares and the outputs are
  cut back to what the model gives at the request's own size;
- no request is refused for its size: the specialisations a model holds are bounded in
  memory (``memory_mb``, and at most ``max_specialisations`` of them when that is set),
  and beyond the bound the least recently used leaves memory (its graph stays where it
  came from -- the open graph or the compile cache -- and comes back without a
  compile); every specialisation made or dropped is logged with its cost;
- declared ranges (:data:`ShapeRanges`: per feed a smallest and a largest shape, as
  TensorRT's shape profiles and the ``trt_dynamic_shapes`` of a PaddleX export's
  ``inference.yml``) refuse a request whose open dimensions fall outside them before
  anything compiles; the batch is not bounded by them (it runs in micro-batches).

Buckets of sequence lengths (:class:`SequenceBuckets`): a request of any length runs in
a model compiled for the shortest bucket that holds it, padded to that length, its
outputs cut back (see :mod:`paddle_ipu.serving.package`; the compile's check that the
padding cannot change the answer at the real positions is
:func:`paddle_ipu.serving.saved_model.check_padding`).  The request's own checks are the
feed contract's (:func:`paddle_ipu.executor.feeds.sequence_length`,
:func:`~paddle_ipu.executor.feeds.bucket_for`)."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_ipu.errors import OptionError
from paddle_ipu.executor import feeds as feed_contract

__all__ = [
    "DEFAULT_SPECIALISATION_MEMORY_MB",
    "EDGE",
    "SequenceBuckets",
    "ShapeBuckets",
    "ShapePolicy",
    "ShapeRanges",
    "check_pad_values",
    "read_inference_yml",
]

#: the memory the specialisations of one model hold at most by default, in MiB: see
#: docs/usage.md (Open input shapes) for what one costs
DEFAULT_SPECIALISATION_MEMORY_MB = 1024.0


#: feed -> (its smallest shape, its largest shape), the batch included
ShapeRanges = Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]


def _check_bound(name: str, value: Any, kind: type, low: float) -> None:
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or not value >= low or (kind is float and not np.isfinite(value)):
        what = "an int" if kind is int else "a number"
        raise OptionError(f"{name} must be {what} >= {low:g}, got {value!r}")


@dataclass(frozen=True)
class ShapePolicy:
    """The open dimensions of a model's feeds and how requests meet them (see the module
    docstring).  ``declared`` maps each feed to its declared shape (``-1``: open; an
    open first dimension is the batch); ``ranges`` bounds the open dimensions
    (:meth:`with_ranges`); ``memory_mb`` bounds the memory the specialisations hold,
    ``max_specialisations`` (None: no count) their number; ``buckets`` pads requests up
    to a grid of sizes (None: every size its own specialisation)."""

    declared: Mapping[str, tuple[int, ...]]
    max_specialisations: int | None = None
    ranges: ShapeRanges = field(default_factory=dict)
    memory_mb: float = DEFAULT_SPECIALISATION_MEMORY_MB
    buckets: ShapeBuckets | None = None

    def __post_init__(self) -> None:
        if self.max_specialisations is not None:
            _check_bound("max_specialisations", self.max_specialisations, int, 1)
        _check_bound("the specialisations' memory (MiB)", self.memory_mb, float, 0)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mb * (1 << 20))

    @property
    def batched(self) -> tuple[str, ...]:
        """The feeds whose first dimension is the batch."""
        return tuple(n for n, s in self.declared.items() if s and s[0] < 0)

    @property
    def open_axes(self) -> dict[str, tuple[int, ...]]:
        """Feed -> its open dimensions besides the batch (feeds without any left out)."""
        out = {}
        for name, shape in self.declared.items():
            axes = tuple(a for a, d in enumerate(shape) if d < 0 and a > 0)
            if axes:
                out[name] = axes
        return out

    @property
    def specialised(self) -> bool:
        """Whether the model is compiled per input shape (it has open dimensions
        besides the batch)."""
        return bool(self.open_axes)

    def with_ranges(self, ranges: Mapping[str, Sequence[Sequence[int]]]) -> ShapePolicy:
        """This policy bounded by ``ranges``: feed -> ``[min, max]`` or ``[min, opt,
        max]`` full shapes (``trt_dynamic_shapes``' form), checked against the declared
        shapes (an OptionError naming the feed otherwise); ``{}`` removes the bounds."""
        checked: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        for name, spec in ranges.items():
            declared = self.declared.get(name)
            if declared is None:
                raise OptionError(
                    f"shape ranges: no feed {name!r} (the feeds: {sorted(self.declared)})"
                )
            shapes = [tuple(int(d) for d in s) for s in spec]
            if len(shapes) not in (2, 3) or any(len(s) != len(declared) for s in shapes):
                raise OptionError(
                    f"shape ranges of {name!r}: expected [min, max] or [min, opt, max] "
                    f"shapes of rank {len(declared)} (declared {list(declared)}), got "
                    f"{[list(s) for s in spec]}"
                )
            low, high = shapes[0], shapes[-1]
            for axis, (d, lo, hi) in enumerate(zip(declared, low, high)):
                if not 1 <= lo <= hi or (d >= 0 and not lo <= d <= hi):
                    raise OptionError(
                        f"shape ranges of {name!r}: dimension {axis} ranges {lo}..{hi}, "
                        f"which does not hold the declared {list(declared)}"
                    )
            checked[name] = (low, high)
        return dataclasses.replace(self, ranges=checked)

    def with_buckets(self, buckets: ShapeBuckets | None) -> ShapePolicy:
        """This policy padding requests up to ``buckets`` (checked against the declared
        shapes and ranges: an OptionError naming the feed and axis); None: no buckets."""
        if buckets is not None:
            buckets.check(self.declared, self.ranges)
        return dataclasses.replace(self, buckets=buckets)

    def check_ranges(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """A FeedError naming the feed, the dimension, its range and the size received
        when an open dimension of ``shapes`` is outside the declared ranges (the batch
        is not bounded: rows run in micro-batches)."""
        for name, (low, high) in self.ranges.items():
            if name not in shapes:
                continue
            declared = self.declared[name]
            batch = name in self.batched
            axes = [a for a, d in enumerate(declared) if d < 0 and not (a == 0 and batch)]
            feed_contract.check_shape_range(name, shapes[name], low, high, axes)

    def key(self, shapes: Mapping[str, Sequence[int]]) -> str:
        """The specialisation a request of ``shapes`` (feed -> its shape, checked by
        :func:`paddle_ipu.executor.feeds.open_request`) runs in, without buckets: the
        feeds with open dimensions and their shapes besides the batch, as
        ``x=3x736x1632`` (``;`` between feeds); ``""`` for a model without open
        dimensions besides the batch.  Shapes outside the declared ranges raise a
        FeedError (:meth:`check_ranges`)."""
        self.check_ranges(shapes)
        return ";".join(
            f"{name}={'x'.join(str(int(d)) for d in shapes[name][1:])}"
            for name in sorted(self.open_axes)
        )

    def route(self, shapes: Mapping[str, Sequence[int]]) -> tuple[str, dict[str, tuple[int, ...]]]:
        """The specialisation a request of ``shapes`` runs in, and the shapes it is
        padded to there (its own where no bucket holds it, or without buckets)."""
        self.check_ranges(shapes)
        target = {n: tuple(int(d) for d in s) for n, s in shapes.items()}
        if self.buckets is not None:
            target = self.buckets.fit(target)
        return self.key(target), target

    def input_shapes(self, key: str, rows: int = -1) -> dict[str, tuple[int, ...]]:
        """The full input shapes of specialisation ``key`` (the batch is ``rows``; -1
        keeps it open), for :func:`paddle_ipu.compiler.compile_program`."""
        given: dict[str, tuple[int, ...]] = {}
        for part in key.split(";") if key else ():
            name, _, dims = part.partition("=")
            given[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
        out = {}
        for name, declared in self.declared.items():
            rest = given.get(name, tuple(declared[1:]))
            if declared and declared[0] < 0:
                out[name] = (rows, *rest)
            elif name in given:
                out[name] = (int(declared[0]), *rest)
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "declared": {k: list(v) for k, v in self.declared.items()},
            "max_specialisations": self.max_specialisations,
            "memory_mb": self.memory_mb,
            "ranges": {k: [list(lo), list(hi)] for k, (lo, hi) in self.ranges.items()},
        }
        if self.buckets is not None:
            out["buckets"] = self.buckets.to_json()
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ShapePolicy:
        count = d.get("max_specialisations")
        policy = ShapePolicy(
            {str(k): tuple(int(x) for x in v) for k, v in d["declared"].items()},
            None if count is None else int(count),
            memory_mb=float(d.get("memory_mb", DEFAULT_SPECIALISATION_MEMORY_MB)),
        )
        policy = policy.with_ranges(d.get("ranges", {}))
        if d.get("buckets"):
            policy = policy.with_buckets(ShapeBuckets.from_json(d["buckets"]))
        return policy


@dataclass(frozen=True)
class ShapeBuckets:
    """Grids of sizes that open dimensions are padded up to (an image's height and
    width), so that requests of many sizes run in a few specialisations.

    ``grids`` maps a feed to its bucketed axes (open, not the batch) and each axis to
    its sizes, ascending.  A request's size on such an axis is raised to the smallest
    size of the grid that holds it; a size past the grid's largest is left as it is (a
    specialisation of its own, never a refusal).  ``pad_values``: what each feed is
    padded with: a number (0 when not given: a normalised image's mean), or ``"edge"``:
    the edge's values repeated, as an image's background goes on past it.  The outputs are cut
    back by the owner of the model, to what the model gives at the request's own size
    (:mod:`paddle_ipu.serving.shaped`)."""

    grids: Mapping[str, Mapping[int, tuple[int, ...]]]
    pad_values: Mapping[str, float | str] = field(default_factory=dict)

    def fit(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """The shapes a request of ``shapes`` is padded to."""
        out = dict(shapes)
        for name, axes in self.grids.items():
            shape = shapes.get(name)
            if shape is None:
                continue
            fitted = list(shape)
            for axis, sizes in axes.items():
                at = bisect.bisect_left(sizes, fitted[axis])
                if at < len(sizes):
                    fitted[axis] = sizes[at]
            out[name] = tuple(fitted)
        return out

    def every(self, declared: Mapping[str, Sequence[int]]) -> list[dict[str, tuple[int, ...]]]:
        """Every bucket (the grids' sizes crossed), smallest first, as full shapes
        with the batch -1; feeds whose open axes are not all bucketed are left out."""
        open_feeds = {
            n: [a for a, d in enumerate(s) if d < 0 and a > 0] for n, s in declared.items()
        }
        names = [n for n in self.grids if set(open_feeds.get(n, ())) <= set(self.grids[n])]
        choices: list[list[tuple[str, int, int]]] = [
            [(n, a, size) for size in self.grids[n][a]]
            for n in names
            for a in sorted(self.grids[n])
        ]
        out = []
        for combo in itertools.product(*choices):
            shapes = {n: [int(d) for d in declared[n]] for n in names}
            for n, a, size in combo:
                shapes[n][a] = size
            out.append({n: tuple(s) for n, s in shapes.items()})
        out.sort(key=lambda s: sum(int(np.prod([d for d in v if d > 0])) for v in s.values()))
        return out

    def pad(
        self, arrays: Mapping[str, np.ndarray], target: Mapping[str, Sequence[int]]
    ) -> dict[str, np.ndarray]:
        """``arrays`` padded at the end of each bucketed axis up to ``target`` (feed ->
        shape; the batch as the array's), with each feed's pad value."""
        out = dict(arrays)
        for name, array in arrays.items():
            want = target.get(name)
            if want is None or tuple(array.shape[1:]) == tuple(want[1:]):
                continue
            widths = [(0, 0)] + [(0, int(w) - int(d)) for d, w in zip(array.shape[1:], want[1:])]
            pad = self.pad_values.get(name, 0.0)
            if pad == EDGE:
                out[name] = np.pad(array, widths, mode="edge")
            else:
                out[name] = np.pad(array, widths, constant_values=array.dtype.type(pad))
        return out

    def check(self, declared: Mapping[str, Sequence[int]], ranges: ShapeRanges) -> None:
        """An OptionError naming the feed and axis when a grid is not of an open axis
        besides the batch, or a pad value is not of a bucketed feed."""
        for name, axes in self.grids.items():
            shape = declared.get(name)
            if shape is None:
                raise OptionError(
                    f"shape buckets: no feed {name!r} (the feeds: {sorted(declared)})"
                )
            for axis, sizes in axes.items():
                if not 0 < axis < len(shape) or shape[axis] >= 0:
                    raise OptionError(
                        f"shape buckets of {name!r}: axis {axis} is not an open dimension "
                        f"besides the batch (declared {list(shape)})"
                    )
                if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                    raise OptionError(
                        f"shape buckets of {name!r}, axis {axis}: expected ascending sizes "
                        f">= 1, got {list(sizes)}"
                    )
                if name in ranges:
                    low, high = ranges[name]
                    outside = [n for n in sizes if not low[axis] <= n <= high[axis]]
                    if outside:
                        raise OptionError(
                            f"shape buckets of {name!r}, axis {axis}: sizes {outside} are "
                            f"outside the declared range {low[axis]}..{high[axis]}"
                        )
        unknown = sorted(set(self.pad_values) - set(self.grids))
        if unknown:
            raise OptionError(
                f"pad values of {unknown}, which are not bucketed feeds (those are "
                f"{sorted(self.grids)})"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "grids": {
                n: {str(a): list(s) for a, s in axes.items()} for n, axes in self.grids.items()
            },
            "pad_values": dict(self.pad_values),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ShapeBuckets:
        return ShapeBuckets.parse(d.get("grids", {}), d.get("pad_values"))

    @staticmethod
    def parse(
        spec: Any, pad_values: Mapping[str, Any] | None = None, where: str = "shape buckets"
    ) -> ShapeBuckets:
        """Buckets from their declaration: feed -> axis -> sizes, where the sizes are a
        list or ``{"min": a, "max": b, "step": s}`` (``a, a+s, ...`` up to the first
        ``>= b``); or feed -> a list of full shapes (each open size is one of its
        axis's sizes).  An OptionError naming what is wrong."""
        if not isinstance(spec, Mapping) or not spec:
            raise OptionError(
                f"{where}: expected a non-empty mapping of feed -> axis -> sizes, got {spec!r}"
            )
        grids: dict[str, dict[int, tuple[int, ...]]] = {}
        for name, axes in spec.items():
            if isinstance(axes, (list, tuple)):  # full shapes
                by_axis: dict[int, set[int]] = {}
                for shape in axes:
                    if not isinstance(shape, (list, tuple)) or not all(_is_int(d) for d in shape):
                        raise OptionError(
                            f"{where} of {name!r}: expected shapes (lists of ints), got {shape!r}"
                        )
                    for axis, d in enumerate(shape):
                        if axis > 0 and int(d) > 0:
                            by_axis.setdefault(axis, set()).add(int(d))
                grids[str(name)] = {a: tuple(sorted(v)) for a, v in by_axis.items()}
                continue
            if not isinstance(axes, Mapping) or not axes:
                raise OptionError(f"{where} of {name!r}: expected axis -> sizes, got {axes!r}")
            grid: dict[int, tuple[int, ...]] = {}
            for axis, sizes in axes.items():
                try:
                    a = int(axis)
                except (TypeError, ValueError):
                    raise OptionError(f"{where} of {name!r}: axis {axis!r} is not an int") from None
                grid[a] = _sizes(sizes, f"{where} of {name!r}, axis {a}")
            grids[str(name)] = grid
        return ShapeBuckets(grids, check_pad_values(pad_values))

    @staticmethod
    def seed(
        declared: Mapping[str, Sequence[int]],
        *,
        shapes: Sequence[Mapping[str, Sequence[int]]] = (),
        ranges: ShapeRanges | None = None,
        ratio: float = 1.25,
    ) -> ShapeBuckets | None:
        """Buckets from what a model declares: the sizes of ``shapes`` (the shapes to
        compile ahead, ``set_ipu_input_shapes``), and for each open axis with a range
        (an ``inference.yml``'s ``trt_dynamic_shapes``) a ladder from its smallest to
        its largest size, each ``ratio`` times the last, rounded up to the largest power
        of two that divides the smallest.  None when neither declares anything."""
        grids: dict[str, dict[int, set[int]]] = {}
        for given in shapes:
            for name, shape in given.items():
                for axis, d in enumerate(shape):
                    if axis > 0 and int(declared.get(name, shape)[axis]) < 0 and int(d) > 0:
                        grids.setdefault(name, {}).setdefault(axis, set()).add(int(d))
        for name, (low, high) in (ranges or {}).items():
            for axis, d in enumerate(declared.get(name, ())):
                if axis == 0 or d >= 0:
                    continue
                lo, hi = int(low[axis]), int(high[axis])
                align = lo & -lo
                ladder, size = {lo, hi}, float(lo)
                while size < hi:
                    size *= ratio
                    ladder.add(min(hi, -(-int(np.ceil(size)) // align) * align))
                grids.setdefault(name, {}).setdefault(axis, set()).update(ladder)
        if not grids:
            return None
        return ShapeBuckets(
            {n: {a: tuple(sorted(v)) for a, v in axes.items()} for n, axes in grids.items()}
        )


#: the pad "value" that repeats the edge (:class:`ShapeBuckets`)
EDGE = "edge"


def check_pad_values(pad_values: Mapping[str, Any] | None) -> dict[str, float | str]:
    """Shape buckets' pad values checked: feed -> a number or ``"edge"`` (an
    OptionError naming the feed otherwise)."""
    pads: dict[str, float | str] = {}
    for name, value in (pad_values or {}).items():
        if value == EDGE:
            pads[str(name)] = EDGE
        elif isinstance(value, bool) or not isinstance(
            value, (int, float, np.integer, np.floating)
        ):
            raise OptionError(f"pad value of {name!r} must be a number or {EDGE!r}, got {value!r}")
        else:
            pads[str(name)] = float(value)
    return pads


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _sizes(spec: Any, where: str) -> tuple[int, ...]:
    if isinstance(spec, Mapping):
        if set(spec) != {"min", "max", "step"} or not all(_is_int(spec[k]) for k in spec):
            raise OptionError(
                f"{where}: expected {{'min', 'max', 'step'}} ints, got {dict(spec)!r}"
            )
        lo, hi, step = int(spec["min"]), int(spec["max"]), int(spec["step"])
        if not 1 <= lo <= hi or step < 1:
            raise OptionError(
                f"{where}: expected 1 <= min <= max and step >= 1, got {dict(spec)!r}"
            )
        return (
            tuple(range(lo, hi + step, step))
            if (hi - lo) % step
            else tuple(range(lo, hi + 1, step))
        )
    if not isinstance(spec, (list, tuple)) or not spec or not all(_is_int(d) for d in spec):
        raise OptionError(f"{where}: expected a list of sizes, got {spec!r}")
    sizes = tuple(int(d) for d in spec)
    if list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
        raise OptionError(f"{where}: expected ascending sizes >= 1, got {list(sizes)}")
    return sizes


def read_inference_yml(path: str) -> dict[str, list[list[int]]]:
    """The ``trt_dynamic_shapes`` of a PaddleX export's ``inference.yml`` (under
    ``Hpi.backend_configs.paddle_infer``: feed -> ``[min, opt, max]`` shapes); ``{}``
    when the file has none.  An OptionError naming the file when it cannot be read."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise OptionError(f"{path}: cannot be read as YAML ({exc})") from None
    node: Any = config
    for part in ("Hpi", "backend_configs", "paddle_infer", "trt_dynamic_shapes"):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return {}
    if not isinstance(node, dict) or not all(
        isinstance(v, list) and all(isinstance(s, list) for s in v) for v in node.values()
    ):
        raise OptionError(
            f"{path}: trt_dynamic_shapes must map each input to [min, opt, max] shapes, "
            f"got {node!r}"
        )
    return {str(k): [[int(d) for d in s] for s in v] for k, v in node.items()}


@dataclass(frozen=True)
class SequenceBuckets:
    """The buckets of sequence lengths a package was compiled for, and how a request
    of any length is fitted into one (see the module docstring).

    ``feeds`` and ``outputs`` map a name (the feed's, the fetch's) to its sequence
    axes: the ``-1`` dimensions besides the batch that the model declares.
    ``pad_values`` gives each sequence feed's padding; ``explicit`` names the feeds
    whose value was given (an attention mask), which the compile's padding check
    keeps at that value."""

    lengths: tuple[int, ...]
    feeds: Mapping[str, tuple[int, ...]]
    outputs: Mapping[str, tuple[int, ...]]
    pad_values: Mapping[str, float] = field(default_factory=dict)
    explicit: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "lengths": list(self.lengths),
            "feeds": {k: list(v) for k, v in self.feeds.items()},
            "outputs": {k: list(v) for k, v in self.outputs.items()},
            "pad_values": dict(self.pad_values),
            "explicit": list(self.explicit),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SequenceBuckets:
        return SequenceBuckets(
            tuple(int(n) for n in d["lengths"]),
            {str(k): tuple(int(a) for a in v) for k, v in d["feeds"].items()},
            {str(k): tuple(int(a) for a in v) for k, v in d["outputs"].items()},
            {str(k): float(v) for k, v in d.get("pad_values", {}).items()},
            tuple(str(n) for n in d.get("explicit", ())),
        )

    def length_of(self, feed: Mapping[str, Any]) -> int:
        """The sequence length of a request (a FeedError naming the feed when its
        sequence axes disagree)."""
        return feed_contract.sequence_length(feed, self.feeds)

    def bucket_for(self, length: int) -> int:
        """The shortest compiled length that holds ``length``."""
        return feed_contract.bucket_for(length, self.lengths)

    def pad(self, feed: Mapping[str, Any], bucket: int) -> dict[str, Any]:
        """``feed`` with every sequence feed padded to ``bucket`` (the others as given)."""
        out = dict(feed)
        for name, axes in self.feeds.items():
            if name not in feed:
                continue
            array = np.asarray(feed[name])
            widths = [(0, 0)] * array.ndim
            for axis in axes:
                widths[axis] = (0, bucket - array.shape[axis])
            if any(w for _, w in widths):
                value = array.dtype.type(self.pad_values.get(name, 0.0))
                out[name] = np.pad(array, widths, constant_values=value)
        return out

    def unpad(self, names: Sequence[str], outputs: Sequence[Any], length: int) -> list[Any]:
        """The outputs cut back to ``length`` on their sequence axes."""
        cut: list[Any] = []
        for name, value in zip(names, outputs):
            axes = self.outputs.get(name, ())
            if axes:
                index = [slice(None)] * np.ndim(value)
                for axis in axes:
                    index[axis] = slice(0, length)
                value = np.ascontiguousarray(np.asarray(value)[tuple(index)])
            cut.append(value)
        return cut
