"""The host backend's replicas in other processes (``enable_distribution``).

Paddle's launcher (``python -m paddle.distributed.launch``) starts the processes of a
data-parallel job, on one host or several; each process emulates its own IPU with
``replication_factor`` local replicas, so the job has processes x local replicas (popdist's
instances x replicas).  The processes meet in ``paddle.distributed``'s gloo process group:
every step each process sums the gradients of its own micro-batches, one all-reduce adds
the sums of all processes (one flat float32 buffer), and every process divides by the
job's micro-batch count (Mean) or not (Sum) and applies the same update.  The ranks hold
bitwise the same weights and optimizer state: they start from rank 0's (broadcast when
the weights are written) and compute the same update from the same reduced bits.

When a rank fails.  Gloo fails a collective at once when a peer's connection closes (its
process died), and after :data:`GLOO_TIMEOUT_S` (Paddle's gloo timeout, fixed) when a
peer does not come.  Either way the group then finds which rank it was, in the job's
store (which rank 0's process serves): each rank's heartbeat thread counts there every
:data:`HEARTBEAT_S`, with the number of collectives its rank has started, and a rank that
gives up leaves a note naming the rank it blames.  The error is a
:class:`~paddle_ipu.errors.DistributedError` naming the rank.  Barriers (the start, a
checkpoint) wait in the store instead, as long as ``PADDLE_IPU_BARRIER_TIMEOUT`` allows,
and fail when a missing rank's heartbeat stops for :data:`STALE_S`.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from paddle_ipu._internals import paddle_dist
from paddle_ipu._util import job as jobs
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.errors import DistributedError, NotSupportedError, OptionError

#: Paddle 3.3.1's gloo comm context fails a collective a peer does not join after 30 s
#: (measured: 30.0 s; gloo's default, not configurable through Paddle)
GLOO_TIMEOUT_S = 30.0
#: how often each rank counts its heartbeat in the store
HEARTBEAT_S = 1.0
#: at a barrier, a missing rank whose heartbeat has not moved for this long is gone
STALE_S = 15.0
#: a store operation taking longer means its server (rank 0's process) is stopped
STORE_ANSWER_S = 5.0
#: the default of ``PADDLE_IPU_BARRIER_TIMEOUT`` (Paddle's own store timeout)
BARRIER_TIMEOUT_S = 900.0
_KEY = "paddle_ipu"


def barrier_timeout() -> float:
    """``PADDLE_IPU_BARRIER_TIMEOUT``: seconds a barrier waits for every rank."""
    raw = os.environ.get("PADDLE_IPU_BARRIER_TIMEOUT", "").strip()
    if not raw:
        return BARRIER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise OptionError(
            f"environment variable PADDLE_IPU_BARRIER_TIMEOUT: expected a number of "
            f"seconds > 0, received {raw!r}"
        )
    return value


class _StoreGone(Exception):
    """The job's store did not answer (its server, in rank 0's process, is gone)."""


class _Store:
    """One client of the job's store, each operation bounded by :data:`STORE_ANSWER_S`
    (a client whose server is stopped waits forever)."""

    def __init__(self, world: int) -> None:
        self._world = world
        self._client: Any = None
        self._broken = ""

    def _bounded(self, fn: Callable[[], Any]) -> Any:
        if self._broken:
            raise _StoreGone(self._broken)
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # reported to the caller below
                box["error"] = exc

        thread = threading.Thread(target=call, daemon=True, name="paddle-ipu-store")
        thread.start()
        thread.join(STORE_ANSWER_S)
        if thread.is_alive():
            self._broken = f"no answer within {STORE_ANSWER_S:g} s"
            raise _StoreGone(self._broken)
        if "error" in box:
            self._broken = str(box["error"]).strip().splitlines()[0] if str(box["error"]) else ""
            raise _StoreGone(self._broken or type(box["error"]).__name__)
        return box["value"]

    def add(self, key: str, amount: int = 0) -> int:
        def op() -> int:
            if self._client is None:
                self._client = paddle_dist.store_client(self._world)
            return int(self._client.add(f"{_KEY}/{key}", int(amount)))

        return int(self._bounded(op))

    def close(self) -> None:
        self._client = None


class _Heartbeat:
    """A daemon thread counting this rank's heartbeat in the store, with the number of
    collectives it has started (its own client: the main thread's may be busy)."""

    def __init__(self, rank: int, world: int, progress: Callable[[], int]) -> None:
        self._rank = rank
        self._world = world
        self._progress = progress
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="paddle-ipu-heartbeat")
        self.thread.start()

    def _run(self) -> None:
        try:
            client = paddle_dist.store_client(self._world)
            published = 0
            while True:
                client.add(f"{_KEY}/hb/{self._rank}", 1)
                step = self._progress()
                if step != published:
                    client.add(f"{_KEY}/at/{self._rank}", step - published)
                    published = step
                if self._stop.wait(HEARTBEAT_S):
                    return
        except Exception:  # the store is gone: a diagnosis says so
            return

    def stop(self) -> None:
        self._stop.set()
        # joined, so that no thread is inside a store call while the interpreter ends
        self.thread.join(2 * HEARTBEAT_S)


class ReplicaGroup:
    """This process's part of a job's replicas: the collectives the host backend needs,
    each failing with a :class:`DistributedError` that names the rank at fault.

    One per process (:meth:`of_job`), made the first time a distributed session or
    :func:`paddle_ipu.distributed.barrier` needs it."""

    _instance: ClassVar[ReplicaGroup | None] = None
    _made = threading.Lock()

    @classmethod
    def joined(cls) -> bool:
        """Whether this process has joined its job's group (and runs its heartbeat)."""
        return cls._instance is not None

    @classmethod
    def of_job(cls) -> ReplicaGroup:
        job = jobs.current()
        if job.launcher != jobs.PADDLE:
            where = (
                "under poprun, popdist runs the replicas of every instance (the popart backend)"
                if job.launcher == jobs.POPRUN
                else "this process was not started by a launcher"
            )
            raise NotSupportedError(
                "enable_distribution on the host backend runs one process per instance, "
                f"started by Paddle's launcher: {where}. Start the script with python -m "
                "paddle.distributed.launch --nproc_per_node N train.py (see docs/distributed.md)"
            )
        with cls._made:
            if cls._instance is None:
                cls._instance = cls(job)
            elif cls._instance.job != job:
                raise DistributedError(
                    f"this process already joined {cls._instance.job.describe()}, not "
                    f"{job.describe()}"
                )
            return cls._instance

    def __init__(self, job: jobs.Job) -> None:
        self.job = job
        self.rank = job.index
        self.size = job.count
        #: collectives this rank has started (the heartbeat publishes it)
        self.collectives = 0
        #: seconds spent in them, packing and unpacking included (bench/distributed.py)
        self.seconds = 0.0
        self._barriers = 0
        self._flat: np.ndarray | None = None
        self._flat_tensor: Any = None
        self._ops: Any = None
        self._store = _Store(self.size)
        self._heartbeat: _Heartbeat | None = None
        if self.size > 1:
            self._ops = paddle_dist.Collectives(paddle_dist.gloo_group(self.size))
            self._heartbeat = _Heartbeat(self.rank, self.size, lambda: self.collectives)
            # the heartbeat thread and the store clients end before Paddle's objects do
            atexit.register(self.close)

    # -- collectives ------------------------------------------------------------------
    def all_reduce_sum(self, arrays: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
        """The element-wise sums over all ranks of ``arrays`` (float32), packed in one
        buffer and reduced by one all-reduce.  The results are views of that buffer,
        valid until the next call."""
        if self.size == 1:
            return [np.asarray(a, dtype=np.float32) for a in arrays]
        start = time.perf_counter()
        sizes = [int(np.size(a)) for a in arrays]
        total = sum(sizes)
        if self._flat is None or self._flat.size != total:
            # made (and exported to Paddle) once, reused every step
            self._flat = np.empty(total, dtype=np.float32)
            self._flat_tensor = paddle_dist.tensor_over(self._flat)
        flat, offset = self._flat, 0
        for array, n in zip(arrays, sizes):
            np.copyto(flat[offset : offset + n], np.reshape(array, -1), casting="same_kind")
            offset += n
        tensor = self._flat_tensor
        self._collective(what, lambda: self._ops.all_reduce_sum(tensor))
        out, offset = [], 0
        for array, n in zip(arrays, sizes):
            out.append(flat[offset : offset + n].reshape(np.shape(array)))
            offset += n
        self.seconds += time.perf_counter() - start
        return out

    def broadcast_from_first(
        self, arrays: Mapping[str, np.ndarray], what: str
    ) -> dict[str, np.ndarray]:
        """Rank 0's ``arrays`` on every rank (the same names, shapes and dtypes on every
        rank, checked first)."""
        if self.size == 1:
            return dict(arrays)
        names = sorted(arrays)
        # (not np.ascontiguousarray: it makes a 0-d array, the lr, 1-d)
        values = [np.asarray(arrays[n]) for n in names]
        values = [v if v.flags.c_contiguous else v.copy() for v in values]
        layout = ";".join(f"{n}:{v.dtype.str}:{list(v.shape)}" for n, v in zip(names, values))
        self.check_agreement(layout.encode(), f"the names, shapes and dtypes of {what}")
        total = sum(v.nbytes for v in values)
        buffer = np.empty(total, dtype=np.uint8)
        offset = 0
        for v in values:
            buffer[offset : offset + v.nbytes] = v.reshape(-1).view(np.uint8)
            offset += v.nbytes
        tensor = paddle_dist.tensor_over(buffer)
        self._collective(
            f"the broadcast of {what} from rank 0", lambda: self._ops.broadcast(tensor, 0)
        )
        out: dict[str, np.ndarray] = {}
        offset = 0
        for name, v in zip(names, values):
            chunk = buffer[offset : offset + v.nbytes]
            out[name] = chunk.view(v.dtype).reshape(v.shape).copy()
            offset += v.nbytes
        return out

    def check_agreement(self, data: bytes, what: str) -> None:
        """Raise a :class:`DistributedError` naming the ranks whose ``data`` differs
        from rank 0's (compared by a 63-bit digest, one all-reduce)."""
        if self.size == 1:
            return
        digest = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1
        slots = np.zeros(self.size, dtype=np.int64)
        slots[self.rank] = digest
        tensor = paddle_dist.tensor_over(slots)
        self._collective(f"the comparison of {what}", lambda: self._ops.all_reduce_sum(tensor))
        differ = tuple(r for r in range(self.size) if slots[r] != slots[0])
        if differ:
            raise DistributedError(
                f"rank {self.rank}: {what} differ between the ranks: rank(s) "
                f"{', '.join(map(str, differ))} hold other values than rank 0 (every rank "
                "must run the same program from the same state)",
                differ,
            )

    def _collective(self, what: str, run: Callable[[], None]) -> None:
        self.collectives += 1
        start = time.monotonic()
        try:
            run()
        except Exception as exc:  # gloo raises RuntimeError; diagnose whatever it is
            raise self._failure(what, exc, time.monotonic() - start) from exc

    # -- barrier ----------------------------------------------------------------------
    def barrier(self, what: str, timeout: float | None = None) -> None:
        """Wait until every rank reaches the same barrier (the store, not gloo: the
        wait may be as long as ``timeout``, default ``PADDLE_IPU_BARRIER_TIMEOUT``).
        Fails naming a missing rank whose heartbeat stopped for :data:`STALE_S`, or the
        missing ranks at the timeout."""
        if self.size == 1:
            return
        limit = barrier_timeout() if timeout is None else float(timeout)
        self._barriers += 1
        key = f"barrier/{self._barriers}"
        start = time.monotonic()
        try:
            self._store.add(f"{key}/{self.rank}", 1)
            arrived = self._store.add(key, 1)
            delay, checked = 0.02, start
            seen: dict[int, tuple[int, float]] = {}
            while arrived < self.size:
                time.sleep(delay)
                delay = min(0.5, delay * 2)
                arrived = self._store.add(key, 0)
                now = time.monotonic()
                due = now - checked >= HEARTBEAT_S * 5 or now - start >= limit
                if arrived >= self.size or not due:
                    continue
                checked = now
                missing = [r for r in range(self.size) if not self._store.add(f"{key}/{r}")]
                gone = []
                for r in missing:
                    beat = self._store.add(f"hb/{r}")
                    last = seen.get(r)
                    if last is None or last[0] != beat:
                        seen[r] = (beat, now)
                    elif beat and now - last[1] >= STALE_S:  # 0: it has not joined yet
                        gone.append(r)
                if gone:
                    raise DistributedError(
                        f"rank {self.rank}: rank(s) {_names(gone)} stopped answering (no "
                        f"heartbeat for {STALE_S:g} s: the process died or is stopped) while "
                        f"the job waited for every rank at {what}",
                        tuple(gone),
                    )
                if now - start >= limit and missing:
                    raise DistributedError(
                        f"rank {self.rank}: rank(s) {_names(missing)} did not reach {what} "
                        f"within {limit:g} s (PADDLE_IPU_BARRIER_TIMEOUT); they are alive",
                        tuple(missing),
                    )
        except _StoreGone as exc:
            raise self._store_gone(f"while waiting at {what}", exc) from None

    # -- diagnosis ----------------------------------------------------------------------
    def _store_gone(self, context: str, exc: BaseException) -> DistributedError:
        if self.rank == 0:
            return DistributedError(f"rank 0: {context}: the job's store failed ({exc})")
        return DistributedError(
            f"rank {self.rank}: {context}: rank 0 does not answer: its process, which "
            f"serves the job's store, died or is stopped ({exc})",
            (0,),
        )

    def _failure(self, what: str, exc: BaseException, elapsed: float) -> DistributedError:
        text = " ".join(str(exc).split())
        match = re.search(r"pair_rank = (-?\d+)", text)
        pair = int(match.group(1)) if match else -1
        # well before gloo's timeout: a connection closed, and gloo names its peer
        lost = pair if 0 <= pair < self.size and elapsed < GLOO_TIMEOUT_S * 0.8 else None
        try:
            ranks, why = self._diagnose(lost, pair)
            if ranks:
                self._store.add(f"failed/{self.rank}", ranks[0] + 1)
        except _StoreGone as gone:
            return self._store_gone(f"{what} failed after {elapsed:.1f} s", gone)
        return DistributedError(
            f"rank {self.rank}: {what} failed after {elapsed:.1f} s: {why} (gloo: {text[:300]})",
            ranks,
        )

    def _diagnose(self, lost: int | None, pair: int) -> tuple[tuple[int, ...], str]:
        store, others = self._store, [r for r in range(self.size) if r != self.rank]
        if lost is not None:
            why = (
                f"rank {lost} closed its connection: its process ended (killed, crashed, or "
                f"stopped on an error: see rank {lost}'s log)"
            )
            # with two ranks gloo's peer is the one; with more, it may have given up
            # because of another (its note says which)
            return ((lost,), why) if self.size == 2 else self._blame(lost, why)
        before = {r: store.add(f"hb/{r}") for r in others}
        time.sleep(2.5 * HEARTBEAT_S)
        stopped = tuple(r for r in others if store.add(f"hb/{r}") == before[r])
        if stopped:
            return stopped, (
                f"rank(s) {_names(stopped)} stopped answering (no heartbeat for "
                f"{2.5 * HEARTBEAT_S:g} s: the process died or is stopped)"
            )
        for r in others:
            note = store.add(f"failed/{r}")
            if note:
                return self._blame(r, f"rank {r} gave up first")
        behind = tuple(r for r in others if store.add(f"at/{r}") < self.collectives)
        if behind:
            return behind, (
                f"rank(s) {_names(behind)} are alive but did not reach it within gloo's "
                f"{GLOO_TIMEOUT_S:g} s; work only some ranks do between steps must take less, "
                "or be followed by paddle_ipu.distributed.barrier() on every rank"
            )
        if 0 <= pair < self.size and pair != self.rank:
            return (pair,), f"the connection with rank {pair} failed"
        return (), "every rank is alive and reached it: the network between them failed"

    def _blame(self, rank: int, why: str) -> tuple[tuple[int, ...], str]:
        """Follow the notes of ranks that gave up because of another, to the first."""
        seen = {rank}
        while True:
            note = self._store.add(f"failed/{rank}")
            if not note:
                return (rank,), why
            culprit = note - 1
            if culprit == self.rank:
                return (self.rank,), (
                    f"rank {rank} gave up on this rank: this process did not reach it in time"
                )
            if culprit in seen:
                return (culprit,), why
            seen.add(culprit)
            why = f"rank {culprit} failed first (rank {rank} gave up because of it)"
            rank = culprit

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        self._store.close()


def for_session(config: SessionConfig) -> ReplicaGroup | None:
    """The replica group a host session of ``config`` trains in: None without
    ``enable_distribution`` (or for inference, whose replicas share nothing).  Checks the
    job and the options that describe it: ``global_replication_factor`` (when set) must
    be processes x local replicas, ``global_replica_offset`` rank x local replicas, and
    none of them may be set without ``enable_distribution`` (a single process has no
    other instances)."""
    described = [
        name
        for name in (
            "enable_distributed_replicated_graphs",
            "global_replication_factor",
            "global_replica_offset",
        )
        if config.changed(name)
    ]
    if not config.option("enable_distribution"):
        if described:
            raise NotSupportedError(
                f"{', '.join(described)} describe the other instances of a distributed job: "
                "set enable_distribution too, and start one process per instance with python "
                "-m paddle.distributed.launch (see docs/distributed.md)"
            )
        return None
    group_job = _launched_job()
    local = max(1, config.replication_factor)
    for name, want in (
        ("global_replication_factor", group_job.total_replicas(local)),
        ("global_replica_offset", group_job.replica_offset(local)),
    ):
        given = name in config.explicit or config.changed(name)
        if given and int(config.option(name)) != want:
            raise OptionError(
                f"{name} is {int(config.option(name))}, but this job has {group_job.count} "
                f"process(es) x {local} local replica(s): expected {want} on rank "
                f"{group_job.index} (or leave it unset)"
            )
    return ReplicaGroup.of_job() if config.is_training else None


def _launched_job() -> jobs.Job:
    job = jobs.current()
    if job.launcher != jobs.PADDLE:
        ReplicaGroup.of_job()  # raises, saying how to launch
    return job


def _names(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)
