"""A model whose feeds leave dimensions open, run as one executor per input shape.

:class:`SpecialisedExecutor` is the shape policy of :mod:`paddle_ipu.executor.shapes`
at work: a request is checked (:func:`paddle_ipu.executor.feeds.open_request`), its
input shape picks a specialisation -- compiled on first use by the callback its owner
gives (the owner knows where the model comes from: a saved model, a package), at most
``max_specialisations`` of them, each logged with its cost -- and its rows run in
micro-batches of the compiled size, the last one padded with zeros, the outputs cut
back to the request's rows.  No number of rows ever compiles again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from paddle_ipu.errors import CompileError
from paddle_ipu.executor import feeds
from paddle_ipu.executor.ipu_executor import IpuExecutor
from paddle_ipu.executor.shapes import ShapePolicy

log = logging.getLogger("paddle_ipu")

__all__ = ["SpecialisedExecutor"]

#: make(key) -> (a prepared executor of that specialisation, how it was had: "compiled",
#: "from the compile cache", ...)
Maker = Callable[[str], tuple[IpuExecutor, str]]


class SpecialisedExecutor:
    """Runs requests of any input shape the policy admits (see the module docstring).

    Args:
        policy: the model's declared shapes and its bound on specialisations.
        make: the owner's way to a prepared executor of one specialisation (by key,
            :meth:`ShapePolicy.key`).
        micro_batch_size, batches_per_step: what every specialisation is compiled for.
        name: the model's name in log lines.
        executors: specialisations made already (by key).
        compiled: the keys of the specialisations compiled already (the model's package
            holds them: making one is no compile); they count in the bound.
    """

    def __init__(
        self,
        policy: ShapePolicy,
        make: Maker,
        *,
        micro_batch_size: int,
        batches_per_step: int = 1,
        name: str = "the model",
        executors: Mapping[str, IpuExecutor] | None = None,
        compiled: Iterable[str] = (),
    ) -> None:
        self.policy = policy
        self.micro_batch_size = int(micro_batch_size)
        self.batches_per_step = int(batches_per_step)
        self.name = name
        self._make = make
        self._executors: dict[str, IpuExecutor] = dict(executors or {})
        self._known: dict[str, None] = dict.fromkeys([*self._executors, *compiled])
        self._lock = threading.Lock()

    @property
    def rows_per_run(self) -> int:
        return self.micro_batch_size * self.batches_per_step

    def specialisations(self) -> list[str]:
        """The keys of the specialisations made so far, in the order they were made."""
        with self._lock:
            return list(self._executors)

    def executor(self, key: str) -> IpuExecutor:
        """The executor of specialisation ``key``, made on first use."""
        with self._lock:
            found = self._executors.get(key)
            if found is not None:
                return found
            bound = self.policy.max_specialisations
            if key not in self._known and len(self._known) >= bound:
                seen = ", ".join(repr(k) for k in self._known)
                raise CompileError(
                    f"{self.name}: input shape {key!r} would be specialisation {bound + 1}, "
                    f"over max_specialisations={bound} (compiled: {seen}). Each input shape "
                    "is a whole compile on the IPU: bring requests to fewer shapes (resize or "
                    "pad them before they are fed), or raise max_specialisations"
                )
            start = time.perf_counter()
            executor, how = self._make(key)
            self._check(executor, key)
            self._executors[key] = executor
            self._known[key] = None
            log.info(
                "%s: input shape %s %s in %.2f s (specialisation %d of %d, at most %d)",
                self.name,
                key or "(static)",
                how,
                time.perf_counter() - start,
                list(self._known).index(key) + 1,
                len(self._known),
                bound,
            )
            return executor

    def _check(self, executor: IpuExecutor, key: str) -> None:
        if executor.layout.accumulation_factor * executor.layout.replication_factor != 1:
            raise CompileError(
                f"{self.name}: a model compiled per input shape runs for inference on one "
                "replica (accumulation_factor and replication_factor 1)"
            )
        kinds = {a.kind for a in executor.session_config().anchors.values()}
        if self.batches_per_step > 1 and kinds - {"ALL"}:
            raise CompileError(
                f"{self.name}: with batches_per_step={self.batches_per_step} every output "
                f"must be an ALL anchor to give each row its answer (got {sorted(kinds)})"
            )

    def run(self, feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run one request of any admitted shape and number of rows; its outputs in the
        compiled fetch order, one row per request row."""
        rows, arrays = feeds.open_request(self.policy.declared, feed)
        key = self.policy.key({name: a.shape for name, a in arrays.items()})
        executor = self.executor(key)
        if rows < 0 or rows == self.rows_per_run:
            return self._whole(executor, arrays, rows)
        self._check_batch_outputs(executor)
        batched = set(self.policy.batched)
        chunks: list[list[np.ndarray]] = []
        step = self.rows_per_run
        for start in range(0, max(rows, 1), step):
            take = min(step, rows - start)
            part = {}
            for name, array in arrays.items():
                if name not in batched:
                    part[name] = array
                    continue
                piece = array[start : start + take]
                if take < step:  # the last micro-batches, padded with zeros
                    pad = np.zeros((step - take, *piece.shape[1:]), piece.dtype)
                    piece = np.concatenate([piece, pad])
                part[name] = piece
            chunks.append(self._whole(executor, part, step))
        out = [np.concatenate([c[i] for c in chunks])[:rows] for i in range(len(chunks[0]))]
        return out

    def _whole(
        self, executor: IpuExecutor, arrays: Mapping[str, np.ndarray], rows: int
    ) -> list[np.ndarray]:
        """One run of exactly ``rows_per_run`` rows (or of a model without a batch):
        outputs with the steps' rows flattened into the first dimension."""
        outputs = executor.run(arrays)
        if self.batches_per_step == 1 or rows < 0:
            return list(outputs)
        self._check_batch_outputs(executor)
        return [
            np.asarray(value).reshape(rows, *spec.shape[1:])
            for spec, value in zip(executor.model.outputs, outputs)
        ]

    def _check_batch_outputs(self, executor: IpuExecutor) -> None:
        feeds.check_row_split(
            self.name, executor.model.outputs, self.micro_batch_size, self.rows_per_run
        )

    def close(self) -> None:
        """Release every specialisation's device."""
        with self._lock:
            executors = list(self._executors.values())
        for executor in executors:
            executor.reset()
