"""Buckets of sequence lengths: how a request of any length fits a package compiled
for a few lengths (padded to the shortest bucket that holds it, its outputs cut back),
and the compile's check that the padding cannot change the answer at the real
positions (see :mod:`paddle_ipu.serving.package`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import CompileError, FeedError

__all__ = ["SequenceBuckets", "check_padding"]


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
        """The sequence length of a request: every sequence axis of every sequence
        feed must have it (a FeedError naming the feed otherwise)."""
        found: tuple[str, int, int] | None = None
        for name, axes in self.feeds.items():
            if name not in feed:
                continue  # the runtime names a missing feed
            shape = np.shape(feed[name])
            for axis in axes:
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
            raise FeedError(f"the request has none of the sequence feeds {sorted(self.feeds)}")
        return found[2]

    def bucket_for(self, length: int) -> int:
        """The shortest compiled length that holds ``length``."""
        for bucket in self.lengths:
            if length <= bucket:
                if length < 1:
                    break
                return bucket
        raise FeedError(
            f"sequence length {length}: expected 1 to {self.lengths[-1]} (the compiled "
            f"buckets are {list(self.lengths)}); compile with a longer bucket (seq_buckets)"
        )

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
    from paddle_ipu.frontends.pipeline import executor_for
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
