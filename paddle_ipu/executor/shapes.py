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
  compiled ahead of time (``paddle-ipu compile --input-shapes``).

Buckets of sequence lengths (:class:`SequenceBuckets`): a request of any length runs in
a model compiled for the shortest bucket that holds it, padded to that length, its
outputs cut back (see :mod:`paddle_ipu.serving.package`; the compile's check that the
padding cannot change the answer at the real positions is
:func:`paddle_ipu.serving.saved_model.check_padding`).  The request's own checks are the
feed contract's (:func:`paddle_ipu.executor.feeds.sequence_length`,
:func:`~paddle_ipu.executor.feeds.bucket_for`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_ipu.errors import OptionError
from paddle_ipu.executor import feeds as feed_contract

__all__ = ["DEFAULT_MAX_SPECIALISATIONS", "SequenceBuckets", "ShapePolicy"]

#: how many input shapes a model may be compiled for by default
DEFAULT_MAX_SPECIALISATIONS = 32


@dataclass(frozen=True)
class ShapePolicy:
    """The open dimensions of a model's feeds and how requests meet them (see the module
    docstring).  ``declared`` maps each feed to its declared shape (``-1``: open; an
    open first dimension is the batch)."""

    declared: Mapping[str, tuple[int, ...]]
    max_specialisations: int = DEFAULT_MAX_SPECIALISATIONS

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

    def key(self, shapes: Mapping[str, Sequence[int]]) -> str:
        """The specialisation a request of ``shapes`` (feed -> its shape, checked by
        :func:`paddle_ipu.executor.feeds.open_request`) runs in: the feeds with open
        dimensions and their shapes besides the batch, as ``x=3x736x1632`` (``;`` between
        feeds); ``""`` for a model without open dimensions besides the batch."""
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
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ShapePolicy:
        return ShapePolicy(
            {str(k): tuple(int(x) for x in v) for k, v in d["declared"].items()},
            int(d.get("max_specialisations", DEFAULT_MAX_SPECIALISATIONS)),
        )


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
