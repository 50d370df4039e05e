"""The step layout of IPU buffers (PopART's documented one).

One run moves ``bps`` (batches per step) steps; each step is ``af`` (accumulation
factor) micro-batches on each of ``rf`` (replication factor) replicas.

- An input buffer and an ALL anchor: ``[bps, af, rf, *shape]``.
- An EVERYN(n) anchor: ``[bps // n, af, rf, *shape]`` (steps n-1, 2n-1, ...).
- FINAL and SUM anchors: ``[rf, *shape]`` (the last micro-batch of the last step,
  or the sum over all steps and micro-batches).

Size-1 factors are removed.  Paddle 2.x built output shapes as ``[rf, af, bps]``,
which agrees only when at most one factor exceeds 1; this module follows PopART.

Callers of Paddle 2.x's API also fed the steps flattened into the batch dimension
(``[bps * af * rf * micro_batch, ...]``); :func:`to_step_buffer` accepts both forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_ipu.errors import FeedError, OptionError


def check_everyn_period(
    period: int, batches_per_step: int | None = None, name: str = "the EVERYN anchor period"
) -> None:
    """The one check of an EVERYN anchor's period: an int >= 1 that divides
    ``batches_per_step`` (when it is known).  Raises OptionError naming ``name``."""
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise OptionError(f"{name} must be an int >= 1 for EVERYN, got {period!r}")
    if batches_per_step is not None and batches_per_step % period:
        raise OptionError(
            f"{name} ({period}) must divide batches_per_step ({batches_per_step}) for EVERYN"
        )


@dataclass(frozen=True)
class StepLayout:
    batches_per_step: int = 1
    accumulation_factor: int = 1
    replication_factor: int = 1

    def __post_init__(self) -> None:
        for name in ("batches_per_step", "accumulation_factor", "replication_factor"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise OptionError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def micro_batches(self) -> int:
        """Micro-batches in one run, over all steps and replicas."""
        return self.batches_per_step * self.accumulation_factor * self.replication_factor

    def factors(self) -> tuple[int, int, int]:
        return (self.batches_per_step, self.accumulation_factor, self.replication_factor)

    def full_view(self, name: str, array: Any, shape: tuple[int, ...]) -> np.ndarray:
        """``array``, an input the executor checked (:meth:`to_step_buffer` is the one
        feed check), viewed as ``[bps, af, rf, *shape]``.  A backend's session called
        directly with a wrong buffer gets that check's FeedError."""
        full = (*self.factors(), *shape)
        if isinstance(array, np.ndarray) and array.shape in (full, self.input_shape(shape)):
            return array.reshape(full)
        return self.to_step_buffer(name, np.asarray(array), shape)

    def input_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The buffer shape of an input whose one micro-batch has ``shape``."""
        return _squeeze(self.factors()) + tuple(shape)

    def anchor_shape(
        self, shape: tuple[int, ...], kind: str = "ALL", period: int = 1
    ) -> tuple[int, ...]:
        """The buffer shape of an anchor of return type ``kind``."""
        bps, af, rf = self.factors()
        if kind == "ALL":
            lead = (bps, af, rf)
        elif kind == "EVERYN":
            check_everyn_period(period, bps)
            lead = (bps // period, af, rf)
        elif kind in ("FINAL", "SUM"):
            lead = (1, 1, rf)
        else:
            raise OptionError(f"unknown anchor return type {kind!r}")
        return _squeeze(lead) + tuple(shape)

    def to_step_buffer(self, name: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """View ``array`` (a feed) as ``[bps, af, rf, *shape]`` without copying.

        Accepts the step layout (size-1 factors removed, or all kept) and the
        flattened form (``bps * af * rf * batch`` rows).  Anything else raises a
        FeedError naming the feed, the dimension, the expected and the received
        value.
        """
        full = (*self.factors(), *shape)
        got = tuple(array.shape)
        if got == self.input_shape(shape) or got == full:
            return array.reshape(full)
        n = self.micro_batches
        if shape and n > 1 and got[1:] == tuple(shape[1:]) and got and got[0] == n * shape[0]:
            return array.reshape(full)
        expected = self.input_shape(shape)
        flat = (n * shape[0], *shape[1:]) if shape and n > 1 else None
        if len(got) != len(expected) and flat is not None and len(got) == len(flat):
            # The flattened form: compare with it, it is what the caller meant.
            expected = flat
        if len(got) != len(expected):
            alt = f" or {list(flat)}" if flat is not None else ""
            raise FeedError(
                f"feed {name!r}: expected rank {len(expected)} with shape {list(expected)}"
                f"{alt}, received rank {len(got)} with shape {list(got)}"
            )
        for dim, (want, have) in enumerate(zip(expected, got)):
            if want != have:
                raise FeedError(
                    f"feed {name!r}: dimension {dim} must be {want}, received {have} "
                    f"(expected shape {list(expected)}, received {list(got)}; "
                    f"batches_per_step={self.batches_per_step}, "
                    f"accumulation_factor={self.accumulation_factor}, "
                    f"replication_factor={self.replication_factor}, "
                    f"micro-batch shape {list(shape)})"
                )
        raise FeedError(f"feed {name!r}: shape {list(got)} does not match {list(expected)}")


def _squeeze(lead: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x for x in lead if x != 1)
