"""A model whose feeds leave dimensions open, run as one executor per input shape.

:class:`SpecialisedExecutor` is the shape policy of :mod:`paddle_ipu.executor.shapes`
at work: a request is checked (:func:`paddle_ipu.executor.feeds.open_request`), its
input shape picks a specialisation -- its bucket when the policy has buckets: the
request padded up to it and its outputs cut back to what the model gives at the
request's own size -- made on first use by the callback its owner gives (the owner
knows where the model comes from: an open graph, a saved model, a package), and its
rows run in micro-batches of the compiled size, the last one padded with zeros, the
outputs cut back to the request's rows.  No number of rows ever compiles again.

The specialisations are a resident set bounded in memory (``policy.memory_mb``, and
``policy.max_specialisations`` when set): a specialisation's bytes are measured while
it is made (the bytes the process holds from the C allocator before and after its graph
is had and its session built, one make at a time in the process: glibc's count, which a
session built in memory another one freed does not hide, as the resident memory did --
the bound then held 3-5 times the shapes it said; the resident memory where glibc's
count is not there), at least its graph's size and the median of the model's earlier
measurements; beyond the bound the least recently used leaves memory -- never one a run
is using -- and what glibc keeps of the memory freed is given back to the system
(``malloc_trim``), to be made again from where it came from when a request brings its
shape back.  Nothing is refused for its size.
Not counted: the activations of a run, which every session of the host backend takes
from one arena of the process (as large as the largest shape run needs, kept).

One make per shape at a time: concurrent first requests of one new shape wait for the
same make, and a make never holds up the runs of shapes already made (it runs outside
the lock that finds them; :meth:`SpecialisedExecutor.make_async` runs it on a worker
thread of its own).
"""

from __future__ import annotations

import collections
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_ipu._util import memory
from paddle_ipu.errors import CompileError, IpuMemoryError, NotSupportedError
from paddle_ipu.executor import feeds
from paddle_ipu.executor.ipu_executor import IpuExecutor
from paddle_ipu.executor.shapes import ShapePolicy

log = logging.getLogger("paddle_ipu")

__all__ = [
    "SpecialisationStats",
    "SpecialisedExecutor",
    "corners",
    "held_bytes",
    "resident_bytes",
]

#: make(key) -> (a prepared executor of that specialisation, how it was had: "compiled",
#: "specialised from the open graph", ...)
Maker = Callable[[str], tuple[IpuExecutor, str]]
#: output_shapes(feed -> full shape) -> each output's shape at those input shapes
OutputShapes = Callable[[Mapping[str, tuple[int, ...]]], list[tuple[int, ...]]]

# One make at a time in the process: the resident memory it adds is its own.
_measure_lock = threading.Lock()


def resident_bytes() -> int:
    """The process's resident memory (Linux: /proc/self/statm; 0 elsewhere)."""
    return memory.resident_bytes()


def held_bytes() -> int:
    """What the process holds now, as a specialisation's cost is measured: the bytes
    held from the C allocator where glibc says (:func:`paddle_ipu._util.memory.allocated_bytes`),
    else the resident memory."""
    held = memory.allocated_bytes()
    return resident_bytes() if held is None else held


@dataclass
class SpecialisationStats:
    """A model's specialisations: what is resident now and what happened so far."""

    #: specialisations in memory, and their measured bytes
    resident: int = 0
    resident_bytes: int = 0
    #: the bound in bytes, and in count (0: none)
    bound_bytes: int = 0
    max_count: int = 0
    #: specialisations made for the first time (compiled, or specialised from the
    #: open graph), made again after they left memory, and dropped from memory
    made: int = 0
    restored: int = 0
    evicted: int = 0
    #: seconds spent making them, all counted
    make_seconds: float = 0.0
    #: makes under way
    making: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class _Entry:
    executor: IpuExecutor
    bytes: int
    users: int = 0


class SpecialisedExecutor:
    """Runs requests of any input shape the policy admits (see the module docstring).

    Args:
        policy: the model's declared shapes, its buckets and its memory bound.
        make: the owner's way to a prepared executor of one specialisation (by key,
            :meth:`ShapePolicy.key`).
        micro_batch_size, batches_per_step: what every specialisation is compiled for.
        name: the model's name in log lines.
        executors: specialisations made already (by key).
        output_shapes: the outputs' shapes at given input shapes (without compiling):
            what a bucketed request's outputs are cut back to.  Needed with buckets.
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
        output_shapes: OutputShapes | None = None,
    ) -> None:
        self.policy = policy
        self.micro_batch_size = int(micro_batch_size)
        self.batches_per_step = int(batches_per_step)
        self.name = name
        self._make = make
        self._output_shapes = output_shapes
        self._lock = threading.Lock()
        # key -> entry, least recently used first
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        for key, executor in (executors or {}).items():
            self._entries[key] = _Entry(executor, 0)
        self._making: dict[str, Future[_Entry]] = {}
        self._ever: set[str] = set(self._entries)
        self._footprints: list[int] = []
        self._stats = SpecialisationStats()
        self._evict_hooks: list[Callable[[str], None]] = []
        self._usage_probes: list[Callable[[], Iterable[str]]] = []
        self._rules: list[list[tuple[str, int] | None]] | None = None
        self._sizes: dict[tuple[str, int, int], list[tuple[int, ...]]] = {}
        self._worker: ThreadPoolExecutor | None = None
        self._closed = False
        if policy.buckets is not None:
            if output_shapes is None:
                raise NotSupportedError(
                    f"{name}: shape buckets cut a request's outputs back to what the model "
                    "gives at the request's own size, which comes from the model's open "
                    "graph; this model has none (it does not convert with its dimensions "
                    "open), so its outputs cannot be cut back: serve it without buckets"
                )
            self._cut_rules()  # refused now, by name, where a cut cannot be derived

    @property
    def rows_per_run(self) -> int:
        return self.micro_batch_size * self.batches_per_step

    # -- the resident set -----------------------------------------------------------
    def on_evict(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(key)`` when a specialisation leaves memory, before its executor
        is reset (the owner of a runtime over it closes the runtime there)."""
        self._evict_hooks.append(hook)

    def on_usage(self, probe: Callable[[], Iterable[str]]) -> None:
        """``probe()`` names the keys used since it was last called, by runs this
        executor does not see (a serving runtime's requests routed in C++); asked
        before a specialisation is chosen to leave memory."""
        self._usage_probes.append(probe)

    def specialisations(self) -> list[str]:
        """The keys of the specialisations in memory, least recently used first."""
        with self._lock:
            return list(self._entries)

    def stats(self) -> SpecialisationStats:
        with self._lock:
            s = SpecialisationStats(**vars(self._stats))
            s.resident = len(self._entries)
            s.resident_bytes = sum(e.bytes for e in self._entries.values())
            s.bound_bytes = self.policy.memory_bytes
            s.max_count = self.policy.max_specialisations or 0
            s.making = len(self._making)
            return s

    def executor(self, key: str) -> IpuExecutor:
        """The executor of specialisation ``key``, made first when it is not in memory
        (waiting for a make of it under way)."""
        return self._get(key, pin=False)

    def acquire(self, key: str) -> IpuExecutor:
        """:meth:`executor`, kept in memory until :meth:`release`."""
        return self._get(key, pin=True)

    def release(self, key: str) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.users > 0:
                entry.users -= 1

    def resident(self, key: str) -> IpuExecutor | None:
        """The executor of ``key`` if it is in memory (marked as used), else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.executor

    def charge(self, key: str, executor: IpuExecutor, extra: int) -> None:
        """Count ``extra`` bytes its owner holds for specialisation ``key`` while
        ``executor`` is the one in memory (a serving runtime's buffers) in its
        measured bytes; others leave memory when that passes the bound."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.executor is not executor:
                return
            entry.bytes += int(extra)
        self._evict(keep=key)

    def make_async(self, key: str) -> Future[IpuExecutor]:
        """A future of the executor of ``key``: done at once when it is in memory, else
        made on this executor's worker thread (or joined to a make under way)."""
        out: Future[IpuExecutor] = Future()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                out.set_result(entry.executor)
                return out
            pending = self._making.get(key)
            if pending is None:
                pending = self._start(key)
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(
                        1, thread_name_prefix=f"paddle-ipu-specialise-{self.name}"
                    )
                self._worker.submit(self._run_make, key, pending)
        _chain(pending, out)
        return out

    def _get(self, key: str, pin: bool) -> IpuExecutor:
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    entry.users += pin
                    return entry.executor
                pending = self._making.get(key)
                mine = pending is None
                if pending is None:
                    pending = self._start(key)
            if mine:
                self._run_make(key, pending)
            pending.result()  # the make's error, to every caller waiting for it
            # then take it from memory (made again if it left before this caller got it)

    def _start(self, key: str) -> Future[_Entry]:
        if self._closed:
            raise CompileError(f"{self.name}: closed")
        pending: Future[_Entry] = Future()
        self._making[key] = pending
        return pending

    def _run_make(self, key: str, pending: Future[_Entry]) -> None:
        if pending.set_running_or_notify_cancel():
            self._make_into(key, pending)

    def _make_into(self, key: str, pending: Future[_Entry]) -> None:
        try:
            entry = self._new_entry(key)
        except BaseException as exc:
            with self._lock:
                self._making.pop(key, None)
            if isinstance(exc, IpuMemoryError):  # which shape does not fit
                named = IpuMemoryError(f"input shape {key}: {exc}", exc.report)
                named.__cause__ = exc
                exc = named
            pending.set_exception(exc)
            return
        with self._lock:
            self._making.pop(key, None)
            self._entries[key] = entry
            self._ever.add(key)
        pending.set_result(entry)
        self._evict(keep=key)

    def _new_entry(self, key: str) -> _Entry:
        with self._lock:
            again = key in self._ever
        self._evict(keep=key, incoming=1, incoming_bytes=self.typical_bytes())
        with _measure_lock:
            before = held_bytes()
            start = time.perf_counter()
            executor, how = self._make(key)
            try:
                self._check(executor, key)
            except BaseException:
                executor.reset()
                raise
            took = time.perf_counter() - start
            measured = max(0, held_bytes() - before)
        graph = len(executor.model.onnx)
        with self._lock:
            self._footprints.append(max(measured, graph))
            size = max(measured, graph, self._typical_locked())
            self._stats.make_seconds += took
            if again:
                self._stats.restored += 1
            else:
                self._stats.made += 1
            resident = len(self._entries) + 1
            total = sum(e.bytes for e in self._entries.values()) + size
        log.info(
            "%s: input shape %s %s in %.2f s (%.0f MB; %d in memory, %.0f of %.0f MB)",
            self.name,
            key or "(static)",
            "made again, " + how if again else how,
            took,
            size / 2**20,
            resident,
            total / 2**20,
            self.policy.memory_mb,
        )
        return _Entry(executor, size)

    def typical_bytes(self) -> int:
        """The median of the measured bytes of the specialisations made so far."""
        with self._lock:
            return self._typical_locked()

    def _typical_locked(self) -> int:
        return int(statistics.median(self._footprints)) if self._footprints else 0

    def _evict(self, keep: str, incoming: int = 0, incoming_bytes: int = 0) -> None:
        """Specialisations leave memory, least recently used first, until the resident
        set and ``incoming`` more of ``incoming_bytes`` fit the bound (those in use
        stay)."""
        for probe in self._usage_probes:
            used = list(probe())
            with self._lock:
                for k in used:
                    if k in self._entries:
                        self._entries.move_to_end(k)
        bound = self.policy.memory_bytes
        count = self.policy.max_specialisations
        victims: list[tuple[str, _Entry]] = []
        with self._lock:
            total = sum(e.bytes for e in self._entries.values()) + incoming_bytes
            number = len(self._entries) + incoming
            for k, e in list(self._entries.items()):
                over = total > bound or (count is not None and number > count)
                if not over:
                    break
                if k == keep or e.users > 0:
                    continue
                del self._entries[k]
                victims.append((k, e))
                total -= e.bytes
                number -= 1
            self._stats.evicted += len(victims)
            left = len(self._entries)
        for k, e in victims:
            for hook in self._evict_hooks:
                try:
                    hook(k)
                except Exception:  # the executor still goes; the owner logs its own
                    log.exception("%s: closing input shape %s failed", self.name, k)
            e.executor.reset()
            log.info(
                "%s: input shape %s left memory (least recently used, %.0f MB; %d in memory, "
                "%.0f of %.0f MB)",
                self.name,
                k,
                e.bytes / 2**20,
                left,
                total / 2**20,
                self.policy.memory_mb,
            )
        if victims:
            # glibc keeps what the sessions freed in its arenas: given back, the process
            # does not grow by the sessions of every size it has made and dropped
            start = time.perf_counter()
            if memory.trim():
                log.debug(
                    "%s: freed memory returned to the system in %.3f s",
                    self.name,
                    time.perf_counter() - start,
                )

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

    # -- buckets --------------------------------------------------------------------
    def fit(
        self, feed: Mapping[str, Any]
    ) -> tuple[int, str, dict[str, np.ndarray], dict[str, tuple[int, ...]] | None]:
        """A request checked and fitted to its specialisation: its rows, the key, its
        arrays (padded up to its bucket) and, when padded, its own shapes (what
        :meth:`cut` cuts the outputs back to); None when not padded."""
        rows, arrays = feeds.open_request(self.policy.declared, feed)
        real = {name: tuple(int(d) for d in a.shape) for name, a in arrays.items()}
        key, target = self.policy.route(real)
        if target == real or self.policy.buckets is None:
            return rows, key, arrays, None
        return rows, key, self.policy.buckets.pad(arrays, target), real

    def cut_shapes(self, real: Mapping[str, tuple[int, ...]]) -> list[tuple[int, ...]]:
        """What a padded request's outputs are cut back to: per output, on each axis
        that follows a bucketed input axis, the model's size there at the request's own
        size on that axis; -1 on the axes that follow none (kept as they are, the rows
        among them).  Each size is asked of the model's shape inference once."""
        rules = self._cut_rules()
        out = []
        for k, axes in enumerate(rules):
            shape = []
            for d, follows in enumerate(axes):
                if follows is None:
                    shape.append(-1)
                    continue
                name, axis = follows
                shape.append(self._size_at(name, axis, real[name][axis])[k][d])
            out.append(tuple(shape))
        return out

    def cut(
        self, outputs: Sequence[np.ndarray], real: Mapping[str, tuple[int, ...]] | None
    ) -> list[np.ndarray]:
        """A padded request's outputs cut back (:meth:`cut_shapes`; their leading corner)."""
        if real is None:
            return list(outputs)
        return corners(outputs, self.cut_shapes(real))

    def prepare_cut(self) -> None:
        """Find again, now, which output axes padded requests' outputs are cut back
        on (:meth:`cut_shapes`), by the model's shape inference as it stands: a
        warm-up does once the open graph's size formulas are found, so that their
        checks against the fold are not made on the path of a request."""
        if self.policy.buckets is not None and self._output_shapes is not None:
            with self._lock:
                self._rules = None
            self._cut_rules()

    def _cut_rules(self) -> list[list[tuple[str, int] | None]]:
        """Per output, per axis: the bucketed input axis (feed, axis) its size follows,
        or None; found once by the model's shape inference at the smallest bucket and
        with each bucketed axis grown.  A NotSupportedError for an output axis that
        follows several (a flattened image: its leading corner is not the request's
        part) or shrinks when its input grows."""
        with self._lock:
            if self._rules is not None:
                return self._rules
        buckets = self.policy.buckets
        assert buckets is not None and self._output_shapes is not None
        base = self._cut_base()
        at_base = self._output_shapes(base)
        rules: list[list[tuple[str, int] | None]] = [[None] * len(s) for s in at_base]
        names = self._output_names()
        for name, axes in buckets.grids.items():
            for axis, sizes in axes.items():
                grown = self._size_at(name, axis, sizes[1] if len(sizes) > 1 else sizes[0] + 32)
                for k, (a, b) in enumerate(zip(at_base, grown)):
                    for d, (x, y) in enumerate(zip(a, b)):
                        if d == 0 or x == y:
                            continue
                        if y < x or rules[k][d] is not None:
                            why = (
                                f"shrinks when input {name!r} axis {axis} grows ({x} -> {y})"
                                if y < x
                                else f"follows input {rules[k][d]} and input {(name, axis)}: a "
                                "padded request's part of it is not its leading corner"
                            )
                            raise NotSupportedError(
                                f"{self.name}: shape buckets: output {names[k]!r} axis {d} "
                                f"{why}, so it cannot be cut back; serve without buckets"
                            )
                        rules[k][d] = (name, axis)
        for k, axes_rule in enumerate(rules):
            if all(r is None for r in axes_rule):
                log.info(
                    "%s: shape buckets: output %r follows no bucketed axis: it is not cut "
                    "back, and its values see the padding",
                    self.name,
                    names[k],
                )
        with self._lock:
            self._rules = rules
        return rules

    def _cut_base(self) -> dict[str, tuple[int, ...]]:
        """Input shapes at the smallest bucket (open axes not bucketed: 64)."""
        buckets = self.policy.buckets
        assert buckets is not None
        base: dict[str, tuple[int, ...]] = {}
        for name, declared in self.policy.declared.items():
            dims = [
                self.micro_batch_size if (a == 0 and d < 0) else d for a, d in enumerate(declared)
            ]
            for axis, sizes in buckets.grids.get(name, {}).items():
                dims[axis] = sizes[0]
            base[name] = tuple(64 if d < 0 else d for d in dims)
        return base

    def _size_at(self, name: str, axis: int, size: int) -> list[tuple[int, ...]]:
        """The outputs' shapes with input ``name``'s ``axis`` at ``size`` (the others
        at the smallest bucket), remembered."""
        key = (name, axis, int(size))
        with self._lock:
            found = self._sizes.get(key)
        if found is not None:
            return found
        shapes = self._cut_base()
        dims = list(shapes[name])
        dims[axis] = int(size)
        shapes[name] = tuple(dims)
        assert self._output_shapes is not None
        found = [tuple(int(d) for d in s) for s in self._output_shapes(shapes)]
        with self._lock:
            self._sizes[key] = found
        return found

    def _output_names(self) -> list[str]:
        with self._lock:
            entry = next(iter(self._entries.values()), None)
        if entry is not None:
            return [s.paddle_name or s.name for s in entry.executor.model.outputs]
        return [f"#{k}" for k in range(len(self._output_shapes(self._cut_base())))]  # type: ignore[misc]

    # -- runs -----------------------------------------------------------------------
    def run(self, feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run one request of any admitted shape and number of rows; its outputs in the
        compiled fetch order, one row per request row."""
        rows, key, arrays, real = self.fit(feed)
        executor = self.acquire(key)
        try:
            return self.cut(self._rows(executor, arrays, rows), real)
        finally:
            self.release(key)

    def _rows(
        self, executor: IpuExecutor, arrays: Mapping[str, np.ndarray], rows: int
    ) -> list[np.ndarray]:
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
        return [np.concatenate([c[i] for c in chunks])[:rows] for i in range(len(chunks[0]))]

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
        """Release every specialisation's device (makes under way finish first)."""
        with self._lock:
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            entry.executor.reset()


def corners(outputs: Sequence[np.ndarray], shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Each output's leading corner of ``shapes`` (-1: the whole axis)."""
    out = []
    for value, shape in zip(outputs, shapes):
        array = np.asarray(value)
        index = tuple(slice(None) if n < 0 else slice(0, int(n)) for n in shape)
        if any(n > got for n, got in zip(shape, array.shape)):
            raise CompileError(
                f"an output of shape {list(array.shape)} cannot be cut back to {list(shape)}"
            )
        cut = array[index]
        out.append(array if cut.shape == array.shape else np.ascontiguousarray(cut))
    return out


def _chain(source: Future[_Entry], target: Future[IpuExecutor]) -> None:
    def done(f: Future[_Entry]) -> None:
        if not target.set_running_or_notify_cancel():
            return
        error = f.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(f.result().executor)

    source.add_done_callback(done)
