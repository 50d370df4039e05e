"""The shape policy: how a request of open shape fits a model compiled for static ones.

The IPU runs static shapes.  A model whose feeds leave dimensions open is run as a set
of *specialisations*, one graph per input shape, each compiled once (and kept by the
compile cache, the weights once for all of them):

- the batch (an open first dimension) never makes a specialisation: a request's rows
  are run in micro-batches of the compiled size, the last one padded, and the outputs
  cut back to the request's rows (:class:`ShapePolicy`, run by
  :class:`paddle_ipu.executor.specialised.SpecialisedExecutor`);
- any other open dimension is compiled exactly for the sizes requests bring: padding an
  image or a feature map changes what a convolutional network computes at its border
  and what its global pooling averages (a trained OCR detector read other text with
  zero, white or edge padding), so no size is padded unless a padding is declared and
  checked to be exact; the number of specialisations is bounded
  (``max_specialisations``) and every one is logged with its cost.  Shapes can be
  compiled ahead of time (``paddle-ipu compile --input-shapes``);
- declared ranges (:class:`ShapeRanges`: per feed a smallest and a largest shape, as
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

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_ipu.errors import OptionError
from paddle_ipu.executor import feeds as feed_contract

__all__ = [
    "DEFAULT_MAX_SPECIALISATIONS",
    "SequenceBuckets",
    "ShapePolicy",
    "ShapeRanges",
    "read_inference_yml",
]

#: how many input shapes a model may be compiled for by default
DEFAULT_MAX_SPECIALISATIONS = 32


#: feed -> (its smallest shape, its largest shape), the batch included
ShapeRanges = Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True)
class ShapePolicy:
    """The open dimensions of a model's feeds and how requests meet them (see the module
    docstring).  ``declared`` maps each feed to its declared shape (``-1``: open; an
    open first dimension is the batch); ``ranges`` bounds the open dimensions
    (:meth:`with_ranges`)."""

    declared: Mapping[str, tuple[int, ...]]
    max_specialisations: int = DEFAULT_MAX_SPECIALISATIONS
    ranges: ShapeRanges = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_specialisations, bool)
            or not isinstance(self.max_specialisations, int)
            or self.max_specialisations < 1
        ):
            raise OptionError(
                f"max_specialisations must be an int >= 1, got {self.max_specialisations!r}"
            )

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
        :func:`paddle_ipu.executor.feeds.open_request`) runs in: the feeds with open
        dimensions and their shapes besides the batch, as ``x=3x736x1632`` (``;`` between
        feeds); ``""`` for a model without open dimensions besides the batch.  Shapes
        outside the declared ranges raise a FeedError (:meth:`check_ranges`)."""
        self.check_ranges(shapes)
        return ";".join(
            f"{name}={'x'.join(str(int(d)) for d in shapes[name][1:])}"
            for name in sorted(self.open_axes)
        )

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
        return {
            "declared": {k: list(v) for k, v in self.declared.items()},
            "max_specialisations": self.max_specialisations,
            "ranges": {k: [list(lo), list(hi)] for k, (lo, hi) in self.ranges.items()},
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ShapePolicy:
        policy = ShapePolicy(
            {str(k): tuple(int(x) for x in v) for k, v in d["declared"].items()},
            int(d.get("max_specialisations", DEFAULT_MAX_SPECIALISATIONS)),
        )
        return policy.with_ranges(d.get("ranges", {}))


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
