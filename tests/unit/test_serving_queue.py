"""The serving queue of paddle_ipu._core (C++): packing, padding, splitting, scatter,
backpressure, cancel, the GIL, and zero-copy requests of ModelRuntime.run."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import build

import paddle_ipu
from paddle_ipu import _core
from paddle_ipu.serving.model_runtime import ModelRuntime

WAIT = 60.0
S = _core.RequestState


def make_queue(capacity: int = 4, limit: int = 64, timeout_s: float = 60.0, width: int = 3):
    step = np.zeros((capacity, width), np.float32)
    q = _core.ServingQueue([step], [width * 4], capacity, limit, timeout_s, True)
    return q, step


def submit(q: Any, x: np.ndarray, token: Any = None, timeout: float = -1.0) -> tuple[Any, Any]:
    out = np.full(x.shape, np.nan, np.float32)
    status, request = q.submit([x], [out], x.shape[0], timeout, token)
    assert status == 0
    return request, out


def test_packs_splits_pads_and_scatters() -> None:
    q, step = make_queue(capacity=4)
    a = np.arange(9, dtype=np.float32).reshape(3, 3)
    b = 100 + np.arange(18, dtype=np.float32).reshape(6, 3)
    ra, oa = submit(q, a, "a")
    rb, ob = submit(q, b, "b")
    q.close()  # closing flushes the last partial run at once (no 60 s timeout)
    seen = []
    while True:
        n = q.next_batch()
        seen.append((n, step.copy()))
        tokens = q.complete([step * 2], 0.001)
        if n < 4:
            break
    # runs: a + b[0:1], b[1:5], b[5:6] + 3 rows of zero padding
    assert [n for n, _ in seen] == [4, 4, 1]
    np.testing.assert_array_equal(seen[0][1], np.concatenate([a, b[:1]]))
    np.testing.assert_array_equal(seen[1][1], b[1:5])
    np.testing.assert_array_equal(seen[2][1][:1], b[5:])
    np.testing.assert_array_equal(seen[2][1][1:], 0)  # rows left from the fuller run are zeroed
    assert tokens == ["b"]
    np.testing.assert_array_equal(oa, a * 2)
    np.testing.assert_array_equal(ob, b * 2)
    assert ra.state == S.DONE and rb.state == S.DONE and ra.wait(0) and rb.wait(0)
    stats = q.stats()
    assert stats["runs"] == 3 and stats["units"] == 9 and stats["padded_units"] == 3
    assert stats["fill_histogram"] == [0, 1, 0, 0, 2]
    assert q.in_flight == 0


def test_the_partial_run_waits_for_the_oldest_requests_timeout() -> None:
    q, step = make_queue(capacity=4, timeout_s=0.15)
    t0 = time.monotonic()
    submit(q, np.ones((1, 3), np.float32))
    time.sleep(0.1)
    submit(q, np.ones((1, 3), np.float32))  # a newer request does not restart the clock
    assert q.next_batch() == 2
    waited = time.monotonic() - t0
    assert 0.15 <= waited < 0.24, waited
    q.complete([step], 0.0)


def test_fail_releases_the_rest_of_a_split_request() -> None:
    q, step = make_queue(capacity=4)
    r, _ = submit(q, np.ones((10, 3), np.float32), "big")
    _other, out = submit(q, np.full((2, 3), 7, np.float32), "other")
    assert q.next_batch() == 4
    error = ValueError("boom")
    assert q.fail(error, 0.0) == ["big"]
    assert r.state == S.FAILED and r.error is error
    # the 6 rows of "big" not yet run are dropped; "other" runs next
    assert q.in_flight == 2
    q.close()  # flush the partial run now
    assert q.next_batch() == 2
    np.testing.assert_array_equal(step[:2], 7)
    assert q.complete([step], 0.0) == ["other"]
    np.testing.assert_array_equal(out, 7)


def test_cancel_before_start_only() -> None:
    q, step = make_queue(capacity=4)
    first, _ = submit(q, np.ones((4, 3), np.float32))
    second, _ = submit(q, np.full((1, 3), 3, np.float32))
    assert second.cancel() and second.state == S.CANCELLED
    assert q.in_flight == 4
    assert q.next_batch() == 4
    assert not first.cancel()  # started
    q.complete([step], 0.0)
    q.close()
    assert q.next_batch() == -1  # the cancelled request never runs


def test_backpressure_close_and_input_checks() -> None:
    q, step = make_queue(capacity=4, limit=4)
    submit(q, np.ones((3, 3), np.float32))
    out = np.empty((2, 3), np.float32)
    t0 = time.monotonic()
    assert q.submit([np.ones((2, 3), np.float32)], [out], 2, 0.05, None) == (1, 3)
    assert time.monotonic() - t0 >= 0.05
    with pytest.raises(ValueError, match="input 0 holds 24 bytes, expected 36"):
        q.submit([np.ones((2, 3), np.float32)], [np.empty((3, 3), np.float32)], 3, 0.0, None)
    with pytest.raises(TypeError, match="C-contiguous"):
        q.submit([np.ones((3, 6), np.float32)[:, ::2]], [np.empty((3, 3), np.float32)], 3)
    q.close()
    assert q.submit([np.ones((1, 3), np.float32)], [np.empty((1, 3), np.float32)], 1)[0] == 2
    assert q.next_batch() == 3  # queued work is still run after close
    q.complete([step], 0.0)
    assert q.next_batch() == -1


def test_many_threads_random_sizes_and_cancels() -> None:
    """Every answered request gets exactly f(its rows); cancelled ones never run."""
    q, step = make_queue(capacity=8, limit=40, timeout_s=0.001, width=5)

    def worker() -> None:
        while (n := q.next_batch()) >= 0:
            assert n > 0
            q.complete([np.ascontiguousarray(step * 3 + 1)], 0.0)

    w = threading.Thread(target=worker)
    w.start()
    failures: list[str] = []

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(60):
            rows = int(rng.integers(1, 20))
            x = rng.standard_normal((rows, 5)).astype(np.float32)
            request, out = submit(q, x)
            if rng.random() < 0.2 and request.cancel():
                if request.state != S.CANCELLED:
                    failures.append("cancel")
                continue
            if not request.wait(WAIT) or request.state != S.DONE:
                failures.append(f"state {request.state}")
            elif not np.array_equal(out, x * 3 + 1):
                failures.append("rows")

    clients = [threading.Thread(target=client, args=(s,)) for s in range(8)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(WAIT)
    q.close()
    w.join(WAIT)
    assert not failures, failures[:5]
    assert q.in_flight == 0 and q.pending_units == 0


def test_every_caller_of_a_run_is_woken_though_none_comes_back() -> None:
    """The callers of a finished run are woken one at a time (each as the previous one
    gives up the GIL in its next wait); callers that never wait again, or wait only
    later, are still all answered, and close() wakes any still in line."""
    q, step = make_queue(capacity=8, timeout_s=60.0, width=2)
    waited: list[float] = []

    def caller(i: int) -> None:
        request, out = submit(q, np.full((1, 2), i, np.float32))
        t = time.perf_counter()
        assert request.wait(WAIT) and request.state == S.DONE
        waited.append(time.perf_counter() - t)
        assert out[0, 0] == 2 * i + 1  # and this thread ends: it passes nothing on

    callers = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for c in callers:
        c.start()
    while q.pending_units < 8:
        time.sleep(0.001)
    time.sleep(0.05)  # every caller is waiting
    assert q.next_batch() == 8
    q.complete([np.ascontiguousarray(step * 2 + 1)], 0.0)

    def worker() -> None:
        while q.next_batch() >= 0:  # waits for work, passing the callers on
            q.complete([np.ascontiguousarray(step)], 0.0)

    w = threading.Thread(target=worker)
    w.start()
    for c in callers:
        c.join(WAIT)
    assert len(waited) == 8 and max(waited) < 5.0, waited
    q.close()
    w.join(WAIT)
    assert not w.is_alive()


# --- through ModelRuntime ----------------------------------------------------------


@pytest.fixture(scope="module")
def compiled() -> Any:
    paddle.enable_static()
    built = build("mlp")
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=8)
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    cp.compile(built.feeds, built.fetches)
    yield built, cp
    cp.reset()


def gate_runs(runtime: ModelRuntime) -> tuple[threading.Event, threading.Event]:
    gate, entered = threading.Event(), threading.Event()
    run = runtime.executor.run

    def slow(feed: Any) -> Any:
        entered.set()
        assert gate.wait(WAIT)
        return run(feed)

    runtime.executor.run = slow  # type: ignore[method-assign]
    return gate, entered


def test_run_waits_without_the_gil_and_reads_the_feed_in_place(compiled: Any) -> None:
    built, cp = compiled
    rt = ModelRuntime(cp.executor, micro_batch_size=8, timeout_ms=0.5)
    try:
        gate, entered = gate_runs(rt)
        blocker = rt.submit(built.random_feed(8, np.random.default_rng(0)))
        assert entered.wait(WAIT)  # the worker is inside a run
        feed = built.random_feed(3, np.random.default_rng(1))
        result: list[Any] = []
        caller = threading.Thread(target=lambda: result.append(rt.run(feed)[0]))
        caller.start()
        deadline = time.monotonic() + WAIT
        while rt.in_flight < 11 and time.monotonic() < deadline:
            time.sleep(0.001)
        # The caller and the worker both wait in C++: this thread runs Python freely.
        spins, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.1:
            spins += 1
        assert spins > 10_000
        # run() queued a view of the caller's array, not a copy
        feed["x"] *= -1.0
        gate.set()
        caller.join(WAIT)
        blocker.result(WAIT)
        np.testing.assert_allclose(result[0], built.run_cpu(feed)[0], rtol=1e-5, atol=1e-6)
    finally:
        rt.close()
    # closed, the runtime leaves the executor a closed server (direct runs are refused)
    # that does not refer back to it
    assert cp.executor.serving is not None and cp.executor.serving.closed
    assert cp.executor.serving is not rt


def test_queue_overhead_per_request_is_small(compiled: Any) -> None:
    """runtime.run of a whole micro-batch against executor.run of it, interleaved.
    The bound is loose (shared CI machines); bench/serving.py measures it."""
    built, cp = compiled
    feed = built.random_feed(8, np.random.default_rng(0))
    rt = ModelRuntime(cp.executor, micro_batch_size=8, timeout_ms=1.0)
    try:
        direct, queued = [], []
        for _ in range(300):
            t = time.perf_counter()
            cp.executor.run(feed)
            direct.append(time.perf_counter() - t)
            t = time.perf_counter()
            rt.run(feed)
            queued.append(time.perf_counter() - t)
        extra = float(np.median(queued) - np.median(direct))
        assert extra < 500e-6, extra
    finally:
        rt.close()


def test_a_wait_ends_when_its_request_is_answered_or_at_its_timeout() -> None:
    # A wait that timed out, its request answered afterwards, leaves the thread's next
    # wait as exact as its first; a caller woken by the queue's close gets its answer.
    q, step = make_queue(capacity=1)
    ra, oa = submit(q, np.ones((1, 3), np.float32))
    start = time.perf_counter()
    assert not ra.wait(0.05)  # not run yet
    assert time.perf_counter() - start >= 0.045
    assert q.next_batch() == 1
    q.complete([step * 2], 0.001)
    assert ra.wait(0) and ra.state == S.DONE
    np.testing.assert_array_equal(oa, 2)
    rb, ob = submit(q, np.ones((1, 3), np.float32))
    start = time.perf_counter()
    assert not rb.wait(0.05)
    assert time.perf_counter() - start >= 0.045

    def answer() -> None:  # the worker: a run, then the queue closes (its callers woken)
        assert q.next_batch() == 1
        q.complete([step * 3], 0.001)
        q.close()

    later = threading.Timer(0.05, answer)
    later.start()
    assert rb.wait(WAIT) and rb.state == S.DONE
    later.join()
    np.testing.assert_array_equal(ob, 3)
