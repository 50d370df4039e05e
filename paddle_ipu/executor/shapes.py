"""The shape policy: how a request of open shape fits a model compiled for static ones.

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

from paddle_ipu.executor import feeds as feed_contract

__all__ = ["SequenceBuckets"]


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
