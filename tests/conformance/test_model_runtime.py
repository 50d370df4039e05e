"""The model runtime (serving): auto-batching, futures, errors, close and backpressure."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import Built, build

import paddle_ipu
from paddle_ipu.errors import (
    FeedError,
    NotSupportedError,
    OptionError,
    RuntimeBusyError,
    RuntimeClosedError,
)
from paddle_ipu.serving.model_runtime import ModelRuntime

IPU = paddle.CustomPlace("ipu", 0)
WAIT = 60.0  # generous bound for anything that should happen "soon"


@pytest.fixture(scope="module")
def mlp() -> Built:
    paddle.enable_static()
    return build("mlp")


def compile_model(
    built: Built,
    *,
    mbs: int = 8,
    bps: int = 1,
    serving: bool = True,
    timeout_ms: float = 5.0,
    num_buffers: int = 10,
) -> tuple[Any, Any]:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=mbs)
    s.set_pipelining_config(batches_per_step=bps)
    s.set_options(
        {
            "enable_model_runtime_executor": serving,
            "timeout_ms": timeout_ms,
            "num_buffers": num_buffers,
        }
    )
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    return cp, cp.compile(built.feeds, built.fetches)


@pytest.fixture
def plain(mlp: Built) -> Iterator[Any]:
    """An inference program of micro-batch 8 compiled without the runtime, to put
    runtimes with chosen settings (and a stopped worker) over its executor."""
    cp, _ = compile_model(mlp, serving=False)
    yield cp
    cp.reset()


def check_rows(built: Built, feed: dict[str, np.ndarray], out: np.ndarray) -> None:
    ref = built.run_cpu(feed)[0]
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def gated(runtime: ModelRuntime) -> tuple[threading.Event, threading.Event]:
    """Make the runtime's graph runs wait for ``gate``; ``entered`` is set when a run
    has started."""
    gate, entered = threading.Event(), threading.Event()
    run = runtime.executor.run

    def slow_run(feed: Any) -> list[np.ndarray]:
        entered.set()
        assert gate.wait(WAIT)
        return run(feed)

    runtime.executor.run = slow_run  # type: ignore[method-assign]
    return gate, entered


def failing_when(runtime: ModelRuntime, marker: float) -> None:
    """Make a graph run raise when any fed value equals ``marker``."""
    run = runtime.executor.run

    def checked_run(feed: Any) -> list[np.ndarray]:
        if any(np.any(v == marker) for v in feed.values()):
            raise ValueError("injected failure")
        return run(feed)

    runtime.executor.run = checked_run  # type: ignore[method-assign]


# --- Paddle 2.x's model runtime test -----------------------------------------------


def test_threads_get_their_own_rows_through_exe_run(mlp: Built) -> None:
    cp, prog = compile_model(mlp, mbs=8, timeout_ms=2.0)
    assert cp.runtime is not None and cp.runtime.auto_batch
    exe = paddle.static.Executor(IPU)
    n_threads, per_thread = 4, 12
    feeds = {
        (t, i): mlp.random_feed(int(n), np.random.default_rng(100 * t + i))
        for t in range(n_threads)
        for i, n in enumerate(np.random.default_rng(t).integers(1, 8, size=per_thread))
    }
    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []

    def client(t: int) -> None:
        try:
            for i in range(per_thread):
                (out,) = exe.run(prog, feed=feeds[t, i], fetch_list=prog.fetch_names)
                results[t, i] = out
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(t,), daemon=True) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT)
    assert not errors and len(results) == n_threads * per_thread
    for key, feed in feeds.items():
        check_rows(mlp, feed, results[key])
    stats = cp.runtime.stats()
    assert stats.requests == n_threads * per_thread and stats.failed_runs == 0
    assert stats.units == sum(f["x"].shape[0] for f in feeds.values())
    assert cp.runtime.in_flight == 0
    cp.reset()
    assert cp.runtime is None


def test_packs_and_splits_requests(plain: Any, mlp: Built) -> None:
    # The worker starts with every request queued: the packing is deterministic.
    rt = ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=60_000.0, start=False)
    sizes = [3, 5, 2, 6, 20, 1, 7, 4]  # 48 rows: 6 full micro-batches
    feeds = [mlp.random_feed(n, np.random.default_rng(n)) for n in sizes]
    futures = [rt.submit(f) for f in feeds]
    rt.start()
    for feed, future in zip(feeds, futures):
        (out,) = future.result(WAIT)
        check_rows(mlp, feed, out)
    stats = rt.stats()
    assert stats.runs == 6 and stats.padded_units == 0 and stats.requests == len(sizes)
    # a partial micro-batch waits for the (long) timeout; close() flushes it
    last = mlp.random_feed(3, np.random.default_rng(99))
    future = rt.submit(last)
    rt.close()
    check_rows(mlp, last, future.result(WAIT)[0])
    stats = rt.stats()
    assert stats.runs == 7 and stats.units == 51 and stats.padded_units == 5


def test_batches_per_step_and_large_requests(mlp: Built) -> None:
    cp, _ = compile_model(mlp, mbs=4, bps=3, timeout_ms=2.0)
    for n in (1, 4, 7, 12, 13, 30):
        feed = mlp.random_feed(n, np.random.default_rng(n))
        (out,) = cp.submit(feed).result(WAIT)
        check_rows(mlp, feed, out)
    assert cp.runtime is not None and cp.runtime.stats().units == 67
    cp.reset()


def test_lone_partial_request_is_answered_after_the_timeout(mlp: Built) -> None:
    cp, _ = compile_model(mlp, mbs=8, timeout_ms=20.0)
    feed = mlp.random_feed(1, np.random.default_rng(0))
    cp.run(mlp.random_feed(8, np.random.default_rng(1)))  # warm up with a whole micro-batch
    start = time.monotonic()
    (out,) = cp.submit(feed).result(5.0)  # TimeoutError if the flush never comes
    assert time.monotonic() - start < 5.0
    check_rows(mlp, feed, out)
    cp.reset()


# --- without auto-batching -----------------------------------------------------------


def test_timeout_zero_takes_exactly_one_micro_batch(mlp: Built) -> None:
    cp, prog = compile_model(mlp, mbs=8, bps=2, timeout_ms=0.0)
    assert cp.runtime is not None and not cp.runtime.auto_batch
    exe = paddle.static.Executor(IPU)
    feed = mlp.random_feed(8, np.random.default_rng(1))
    (out,) = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)  # a lone micro-batch
    check_rows(mlp, feed, out)
    with pytest.raises(FeedError, match=r"'x'.*expected 8 rows, received 5"):
        exe.run(
            prog, feed=mlp.random_feed(5, np.random.default_rng(2)), fetch_list=prog.fetch_names
        )
    with pytest.raises(FeedError, match=r"'x'.*expected 8 rows, received 16"):
        cp.run(mlp.random_feed(16, np.random.default_rng(3)))
    cp.reset()


# --- validation --------------------------------------------------------------------


def test_feeds_are_checked_before_queueing(plain: Any) -> None:
    with ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=5.0) as rt:
        with pytest.raises(FeedError, match="unknown feed 'y'"):
            rt.submit({"x": np.zeros((2, 16), np.float32), "y": np.zeros(2)})
        with pytest.raises(FeedError, match="missing feed 'x'"):
            rt.submit({})
        with pytest.raises(FeedError, match=r"'x'.*\[rows, 16\].*received \[2, 15\]"):
            rt.submit({"x": np.zeros((2, 15), np.float32)})
        with pytest.raises(FeedError, match="expected dtype float32, received int16"):
            rt.submit({"x": np.zeros((2, 16), np.int16)})
        assert rt.in_flight == 0 and rt.stats().runs == 0
        (empty,) = rt.run({"x": np.zeros((0, 16), np.float32)})
        assert empty.shape == (0, 10)


def test_row_counts_must_agree_across_feeds() -> None:
    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        a = paddle.static.data("a", [-1, 4], "float32")
        b = paddle.static.data("b", [-1, 4], "float32")
        out = paddle.static.nn.fc(a + b, 3)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    built = Built(main, startup, scope, ["a", "b"], [out], {}, {})
    cp, _ = compile_model(built, mbs=4)
    with pytest.raises(FeedError, match="'a' and 'b' have 3 and 2 rows"):
        cp.submit({"a": np.ones((3, 4), np.float32), "b": np.ones((2, 4), np.float32)})
    feed = {"a": np.ones((6, 4), np.float32), "b": np.full((6, 4), 2.0, np.float32)}
    (got,) = cp.submit(feed).result(WAIT)
    check_rows(built, feed, got)
    cp.reset()


def test_outputs_without_batch_dimension_are_refused_when_auto_batching() -> None:
    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        out = paddle.mean(paddle.static.nn.fc(x, 3))
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    built = Built(main, startup, scope, ["x"], [out], {}, {})
    with pytest.raises(NotSupportedError, match=r"batch dimension.*micro_batch_size=4"):
        compile_model(built, mbs=4, timeout_ms=5.0)
    # without auto-batching a request is one micro-batch: any output works
    cp, _ = compile_model(built, mbs=4, timeout_ms=0.0)
    feed = {"x": np.ones((4, 4), np.float32)}
    (got,) = cp.run(feed)
    check_rows(built, feed, got)
    cp.reset()


def test_training_with_the_runtime_is_refused(mlp: Built) -> None:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=True)
    s.set_options({"enable_model_runtime_executor": True})
    cp = paddle_ipu.IpuCompiledProgram(mlp.main, scope=mlp.scope, ipu_strategy=s)
    with pytest.raises(OptionError, match="inference graphs only"):
        cp.compile(mlp.feeds, mlp.fetches)


# --- futures and errors --------------------------------------------------------------


def test_futures(mlp: Built) -> None:
    cp, _ = compile_model(mlp, mbs=8, timeout_ms=5.0)
    feeds = [mlp.random_feed(n, np.random.default_rng(n)) for n in (2, 9, 4)]
    futures = [cp.submit(f) for f in feeds]
    assert all(isinstance(f, Future) for f in futures)
    for feed, future in zip(feeds, futures):
        (out,) = future.result(WAIT)
        check_rows(mlp, feed, out)
    done = threading.Event()
    futures[0].add_done_callback(lambda _: done.set())
    assert done.is_set()
    cp.reset()
    plain_cp, _ = compile_model(mlp, serving=False)
    with pytest.raises(OptionError, match="enable_model_runtime_executor"):
        plain_cp.submit(feeds[0])
    plain_cp.reset()


def test_submit_copies_the_feeds(plain: Any, mlp: Built) -> None:
    rt = ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=60_000.0, start=False)
    feed = mlp.random_feed(8, np.random.default_rng(0))
    kept = feed["x"].copy()
    future = rt.submit(feed)
    feed["x"][:] = np.nan  # the caller reuses its buffer before the request ran
    rt.start()
    check_rows(mlp, {"x": kept}, future.result(WAIT)[0])
    rt.close()


def test_an_error_fails_only_the_requests_of_its_run(plain: Any, mlp: Built) -> None:
    rt = ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=60_000.0, start=False)
    failing_when(rt, 123.0)

    def feed(n: int, bad_row: int | None = None) -> dict[str, np.ndarray]:
        f = mlp.random_feed(n, np.random.default_rng(n))
        if bad_row is not None:
            f["x"][bad_row, 0] = 123.0
        return f

    # runs: [a] [b c] [d(0:8)] [d(8:12) e] [g]
    requests = {
        "a": feed(8),
        "b": feed(3),
        "c": feed(5, bad_row=4),
        "d": feed(12, bad_row=10),
        "e": feed(4),
        "g": feed(8),
    }
    futures = {k: rt.submit(v) for k, v in requests.items()}
    rt.start()
    for key in "bcde":
        with pytest.raises(ValueError, match="injected failure"):
            futures[key].result(WAIT)
    for key in "ag":
        check_rows(mlp, requests[key], futures[key].result(WAIT)[0])
    # the runtime keeps serving
    later = feed(8)
    check_rows(mlp, later, rt.run(later)[0])
    stats = rt.stats()
    assert stats.failed_runs == 2 and stats.requests == 7
    assert rt.in_flight == 0
    rt.close()


def test_cancelled_future_is_skipped(plain: Any, mlp: Built) -> None:
    rt = ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=60_000.0, start=False)
    first = rt.submit(mlp.random_feed(4, np.random.default_rng(0)))
    keep = mlp.random_feed(8, np.random.default_rng(1))
    second = rt.submit(keep)
    assert first.cancel()
    rt.start()
    check_rows(mlp, keep, second.result(WAIT)[0])
    assert rt.stats().units == 8 and rt.in_flight == 0
    rt.close()


# --- close ---------------------------------------------------------------------------


@pytest.mark.parametrize("cancel", [False, True])
def test_close_answers_every_queued_request(plain: Any, mlp: Built, cancel: bool) -> None:
    rt = ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=0.0)
    gate, entered = gated(rt)
    feeds = [mlp.random_feed(8, np.random.default_rng(i)) for i in range(4)]
    futures = [rt.submit(feeds[0])]
    assert entered.wait(WAIT)  # the first request is running, the others queue
    futures += [rt.submit(f) for f in feeds[1:]]
    closer = threading.Thread(target=rt.close, kwargs={"cancel": cancel})
    closer.start()
    deadline = time.monotonic() + WAIT
    while not rt.closed and time.monotonic() < deadline:
        time.sleep(0.001)
    with pytest.raises(RuntimeClosedError, match="closed"):
        rt.submit(feeds[0])
    gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    check_rows(mlp, feeds[0], futures[0].result(WAIT)[0])  # a started run completes
    for feed, future in zip(feeds[1:], futures[1:]):
        if cancel:
            with pytest.raises(RuntimeClosedError, match="cancel=True"):
                future.result(WAIT)
        else:
            check_rows(mlp, feed, future.result(WAIT)[0])
    assert rt.in_flight == 0


def test_submit_after_close_raises(mlp: Built) -> None:
    cp, prog = compile_model(mlp)
    runtime = cp.runtime
    assert runtime is not None
    with runtime:
        runtime.run(mlp.random_feed(8, np.random.default_rng(0)))
    with pytest.raises(RuntimeClosedError, match="closed"):
        runtime.submit(mlp.random_feed(2, np.random.default_rng(0)))
    cp.reset()
    # reset() closed the runtime: the program runs without it
    feed = mlp.random_feed(8, np.random.default_rng(1))
    with pytest.raises(Exception, match="not prepared"):
        paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=prog.fetch_names)


# --- backpressure --------------------------------------------------------------------


def test_backpressure_with_one_buffer(plain: Any, mlp: Built) -> None:
    rt = ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=1.0, num_buffers=1)
    gate, entered = gated(rt)
    feeds = [mlp.random_feed(n, np.random.default_rng(n)) for n in (8, 2, 3)]
    first = rt.submit(feeds[0])
    assert entered.wait(WAIT)
    with pytest.raises(RuntimeBusyError, match=r"num_buffers=1"):
        rt.submit(feeds[1], timeout=0.05)
    blocked: list[Future[list[np.ndarray]]] = []
    submitter = threading.Thread(target=lambda: blocked.append(rt.submit(feeds[2])))
    submitter.start()
    submitter.join(0.2)
    assert submitter.is_alive() and rt.in_flight == 8  # waiting for space
    gate.set()
    submitter.join(WAIT)
    assert not submitter.is_alive()
    check_rows(mlp, feeds[0], first.result(WAIT)[0])
    check_rows(mlp, feeds[2], blocked[0].result(WAIT)[0])
    rt.close()


def test_a_request_larger_than_the_bound_is_admitted_alone(plain: Any, mlp: Built) -> None:
    with ModelRuntime(plain.executor, micro_batch_size=8, timeout_ms=1.0, num_buffers=1) as rt:
        feed = mlp.random_feed(20, np.random.default_rng(0))
        check_rows(mlp, feed, rt.submit(feed, timeout=WAIT).result(WAIT)[0])


def test_a_requests_index_ranges_are_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request is checked where it enters (here ModelRuntime.run; the C++ parser for a
    served one), not again over the whole step buffer when the worker runs it: the
    runtime hands the executor a CheckedFeed."""
    from support.helpers import fresh_programs

    from paddle_ipu.executor import feeds

    with fresh_programs(11) as (main, startup, scope):
        ids = paddle.static.data("ids", [-1, 4], "int64")
        out = paddle.mean(paddle.nn.Embedding(10, 8)(ids), axis=1)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    built = Built(main, startup, scope, ["ids"], [out], {"ids": (4,)}, {"ids": "int64"})
    cp, _ = compile_model(built, mbs=4, serving=False)
    assert cp.executor.model.inputs[0].ranges  # the embedding's ids are range-checked
    calls: list[tuple[int, ...]] = []
    check = feeds.check_ranges

    def counting(name: str, array: np.ndarray, ranges: Any) -> None:
        calls.append(array.shape)
        check(name, array, ranges)

    monkeypatch.setattr(feeds, "check_ranges", counting)
    try:
        with ModelRuntime(cp.executor, micro_batch_size=4, timeout_ms=1.0) as rt:
            (got,) = rt.run({"ids": np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int64)})
            assert calls == [(2, 4)]  # the request's two rows, once
            with pytest.raises(FeedError, match=r"feed 'ids': value 12 at index \[0, 1\]"):
                rt.run({"ids": np.array([[1, 12, 3, 4]], np.int64)})
        want = built.run_cpu({"ids": np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int64)})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    finally:
        cp.reset()
