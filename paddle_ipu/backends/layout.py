"""The buffers of the Session protocol: PopART's step layout, and the check of a buffer
a session is handed.

One run moves ``bps`` (batches per step) steps; each step is ``af`` (accumulation
factor) micro-batches on each of ``rf`` (replication factor) replicas.

- An input buffer and an ALL anchor: ``[bps, af, rf, *shape]``.
- An EVERYN(n) anchor: ``[bps // n, af, rf, *shape]`` (steps n-1, 2n-1, ...).
- FINAL and SUM anchors: ``[rf, *shape]`` (the last micro-batch of the last step,
  or the sum over all steps and micro-batches).

Size-1 factors are removed.  Paddle 2.x built output shapes as ``[rf, af, bps]``,
which agrees only when at most one factor exceeds 1; this module follows PopART.

The executor checks every feed (:mod:`paddle_ipu.executor.feeds`, which also takes
the steps flattened into the batch as Paddle 2.x fed them) and hands a session buffers
of these shapes.  A session only views them in the full layout (:meth:`StepLayout.full_view`);
the Session protocol's own argument checks -- a buffer of another shape, an output
buffer or a weight that does not fit, called on a session directly -- raise here
(:func:`check_output_buffer`, :func:`check_weight_size`, :func:`buffer_error`), the one
place a backend words them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_ipu.errors import FeedError, OptionError
from paddle_ipu.options.spec import check_everyn_period


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
        """``array``, an input the executor checked, viewed as ``[bps, af, rf, *shape]``
        (it comes with the size-1 factors removed, or all kept).  A session called
        directly with a buffer of another shape gets a FeedError naming it."""
        full = (*self.factors(), *shape)
        got = tuple(np.shape(array))
        if got not in (full, self.input_shape(shape)):
            raise FeedError(
                f"feed {name!r}: the session takes shape {list(self.input_shape(shape))} "
                f"(or {list(full)}), received {list(got)}; the executor's feed check "
                "(paddle_ipu.executor.feeds) accepts other forms"
            )
        return np.asarray(array).reshape(full)

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


def check_output_buffer(
    name: str, buf: Any, shape: tuple[int, ...], dtype: np.dtype, kind: str
) -> np.ndarray:
    """The caller's buffer for the anchor ``name`` (of return type ``kind``): an ndarray of
    the anchor's ``shape`` and ``dtype``, C-contiguous and writable."""
    if not isinstance(buf, np.ndarray) or buf.shape != shape or buf.dtype != dtype:
        got = f"{buf.dtype}{list(buf.shape)}" if isinstance(buf, np.ndarray) else repr(buf)
        raise FeedError(
            f"output buffer {name!r} is {got}; the {kind} anchor needs {dtype}{list(shape)}"
        )
    if not buf.flags.c_contiguous or not buf.flags.writeable:
        raise FeedError(f"output buffer {name!r} must be C-contiguous and writable")
    return buf


def check_weight_size(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    """A weight written to a session holds as many elements as the session's ``shape``."""
    if array.size != int(np.prod(shape, dtype=np.int64)):
        raise FeedError(f"weight {name!r} has shape {array.shape}; the session holds {shape}")


def buffer_error(message: str) -> FeedError:
    """The error of any other buffer a session cannot take (a missing input, a PopEF
    input of another shape, an optimizer state out of range), for the caller to raise."""
    return FeedError(message)


def _squeeze(lead: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x for x in lead if x != 1)
