"""The executor under threads, faults and bad feeds: concurrent runs equal a sequential
order, a training run is all or nothing, index feeds are range-checked as Paddle's CPU
kernels check them, shapes are checked before anything is cast, and the error messages
and files of the executor's other paths."""

from __future__ import annotations

import os
import re
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import paddle.nn.functional as F  # noqa: E402
from support.helpers import run_python  # noqa: E402

import paddle_ipu  # noqa: E402
from paddle_ipu.errors import (  # noqa: E402
    BackendError,
    FeedError,
    IpuError,
    RuntimeClosedError,
)
from paddle_ipu.serving.model_runtime import ModelRuntime  # noqa: E402

IPU = paddle.CustomPlace("ipu", 0)
MBS = 2
CLASSES = 4
IN = 6


# --------------------------------------------------------------------------- models


def _attr(name: str) -> Any:
    return paddle.ParamAttr(name=name)


class Net:
    """A classifier: x [-1, IN] -> fc -> cross_entropy(label), Adam, BatchNorm optional."""

    def __init__(
        self, seed: int = 5, bn: bool = False, place: Any = None, optimizer: bool = True
    ) -> None:
        paddle.enable_static()
        paddle.seed(seed)
        self.main, startup = paddle.static.Program(), paddle.static.Program()
        self.scope = paddle.static.Scope()
        with (
            paddle.utils.unique_name.guard(),
            paddle.static.scope_guard(self.scope),
            paddle.static.program_guard(self.main, startup),
        ):
            x = paddle.static.data("x", [-1, IN], "float32")
            label = paddle.static.data("label", [-1, 1], "int64")
            h = paddle.static.nn.fc(x, 8, weight_attr=_attr("w1"), bias_attr=_attr("b1"))
            if bn:
                h = paddle.nn.BatchNorm1D(
                    8, momentum=0.8, weight_attr=_attr("bw"), bias_attr=_attr("bb")
                )(h)
            logits = paddle.static.nn.fc(
                paddle.tanh(h), CLASSES, weight_attr=_attr("w2"), bias_attr=_attr("b2")
            )
            self.per_row = F.cross_entropy(logits, label, reduction="none")
            self.loss = paddle.mean(self.per_row)
            if optimizer:
                paddle.optimizer.Adam(0.01).minimize(self.loss)
            paddle.static.Executor(place or paddle.CPUPlace()).run(startup)

    def compile(
        self, bps: int = 1, training: bool = True, per_row: bool = False
    ) -> tuple[Any, Any]:
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=training, micro_batch_size=MBS)
        s.set_pipelining_config(batches_per_step=bps)
        cp = paddle_ipu.IpuCompiledProgram(self.main, scope=self.scope, ipu_strategy=s)
        return cp, cp.compile(["x", "label"], [self.per_row if per_row else self.loss])

    def persistables(self) -> dict[str, np.ndarray]:
        """Every weight and optimizer-state variable of the scope."""
        names = sorted(v.name for v in self.main.list_vars() if v.persistable)
        out = {}
        for name in names:
            var = self.scope.find_var(name)
            if var is not None and var.get_tensor()._is_initialized():
                out[name] = np.array(var.get_tensor())
        return out


def batch(rng: np.random.Generator, lead: tuple[int, ...] = (MBS,)) -> dict[str, np.ndarray]:
    x = rng.standard_normal((*lead, IN)).astype("float32")
    label = rng.integers(0, CLASSES, size=(*lead, 1)).astype("int64")
    return {"x": x, "label": label}


def assert_same_state(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# --------------------------------------------------------------------------- item 3: threads


def _input_name(cp: Any, feed_name: str) -> str:
    return next(s.name for s in cp.executor.model.inputs if (s.paddle_name or s.name) == feed_name)


def test_concurrent_training_runs_equal_a_sequential_replay() -> None:
    threads, runs = 4, 5
    net = Net()
    cp, prog = net.compile()
    rng = np.random.default_rng(0)
    batches = [batch(rng) for _ in range(threads * runs)]
    x_name = _input_name(cp, "x")

    # The order in which runs reached the session (inside the executor's lock).
    order: list[int] = []
    session = cp.executor.session
    real_run = session.run

    def recording_run(inputs: Any, outputs: Any = None) -> Any:
        x = np.asarray(inputs[x_name]).reshape(MBS, IN)
        order.append(next(i for i, b in enumerate(batches) if np.array_equal(b["x"], x)))
        return real_run(inputs, outputs)

    session.run = recording_run
    losses: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        try:
            exe = paddle.static.Executor(IPU)
            start.wait()
            for k in range(runs):
                i = t * runs + k
                out = exe.run(prog, feed=batches[i], fetch_list=prog.fetch_names)
                losses[i] = np.asarray(out[0])
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(120)
    assert not errors, errors
    assert sorted(order) == list(range(threads * runs))
    cp.weights_to_host()
    concurrent = net.persistables()

    # Replay the same runs, one after the other, in the order they took the lock.
    ref = Net()
    ref_cp, ref_prog = ref.compile()
    exe = paddle.static.Executor(IPU)
    for i in order:
        loss = np.asarray(exe.run(ref_prog, feed=batches[i], fetch_list=ref_prog.fetch_names)[0])
        np.testing.assert_array_equal(losses[i], loss, err_msg=f"loss of run {i}")
    ref_cp.weights_to_host()
    assert_same_state(concurrent, ref.persistables())
    cp.reset()
    ref_cp.reset()


def test_concurrent_inference_from_threads_matches_paddle_cpu() -> None:
    net = Net(optimizer=False)
    cp, prog = net.compile(training=False)
    rng = np.random.default_rng(1)
    batches = [batch(rng) for _ in range(24)]
    cpu = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(net.scope):
        want = [np.asarray(cpu.run(net.main, feed=b, fetch_list=[net.loss])[0]) for b in batches]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            exe = paddle.static.Executor(IPU)
            for i in range(t, len(batches), 4):
                out = exe.run(prog, feed=batches[i], fetch_list=prog.fetch_names)
                got[i] = np.asarray(out[0])
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(120)
    assert not errors, errors
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[i], w, rtol=1e-5, atol=1e-6, err_msg=f"batch {i}")
    cp.reset()


# --------------------------------------------------------------------------- item 4: all or nothing


def _run_state(cp: Any, net: Net) -> dict[str, np.ndarray]:
    cp.weights_to_host()
    return net.persistables()


def test_a_bad_label_in_the_second_step_updates_nothing() -> None:
    net = Net()
    cp, prog = net.compile(bps=2)
    before = _run_state(cp, net)
    feed = batch(np.random.default_rng(2), (2, MBS))
    feed["label"][1, 0, 0] = CLASSES  # step 2
    exe = paddle.static.Executor(IPU)
    with pytest.raises(FeedError, match=r"'label'.*value 4 .*\[0, 4\)"):
        exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
    assert_same_state(_run_state(cp, net), before)
    cp.reset()


@pytest.mark.parametrize("bn", [False, True], ids=["mlp", "batchnorm"])
def test_a_failure_inside_a_run_restores_weights_and_optimizer_state(bn: bool) -> None:
    net = Net(bn=bn)
    cp, prog = net.compile(bps=2)
    rng = np.random.default_rng(3)
    exe = paddle.static.Executor(IPU)
    exe.run(prog, feed=batch(rng, (2, MBS)), fetch_list=prog.fetch_names)  # moves the state
    before = _run_state(cp, net)

    # The second step of the next run fails inside the backend, after the first
    # step's update (and, with BatchNorm, after the step's statistics moved).
    trainer = cp.executor.session._trainer.trainer
    real = trainer.compute_gradients
    calls = []

    def failing(feeds: Any) -> Any:
        out = real(feeds)
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected device failure")
        return out

    trainer.compute_gradients = failing
    feed = batch(rng, (2, MBS))
    with pytest.raises(RuntimeError, match="injected"):
        exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
    assert len(calls) == 2
    assert_same_state(_run_state(cp, net), before)

    # And the next run continues from there exactly as if the failed run never was.
    trainer.compute_gradients = real
    (loss,) = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
    after = _run_state(cp, net)
    ref = Net(bn=bn)
    ref_cp, ref_prog = ref.compile(bps=2)
    ref_rng = np.random.default_rng(3)
    exe.run(ref_prog, feed=batch(ref_rng, (2, MBS)), fetch_list=ref_prog.fetch_names)
    (ref_loss,) = exe.run(ref_prog, feed=batch(ref_rng, (2, MBS)), fetch_list=ref_prog.fetch_names)
    np.testing.assert_array_equal(loss, ref_loss)
    assert_same_state(after, _run_state(ref_cp, ref))
    cp.reset()
    ref_cp.reset()


# --------------------------------------------------------------------------- item 6: index ranges


def _index_program(kind: str) -> tuple[Any, Any, list[str], Any, int]:
    """An inference program whose integer feed ``i`` indexes; returns (main, scope,
    feeds, fetch, n) with ``n`` the size the index ranges over."""
    paddle.enable_static()
    paddle.seed(1)
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    n = 5
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, n], "float32")
        if kind == "cross_entropy":
            i = paddle.static.data("i", [-1, 1], "int64")
            out = F.cross_entropy(x, i, reduction="none")
        elif kind in ("embedding", "embedding_padding"):
            i = paddle.static.data("i", [-1, 3], "int64")
            pad = 2 if kind == "embedding_padding" else None
            out = paddle.nn.Embedding(n, 4, padding_idx=pad)(i) + paddle.sum(x)
        elif kind == "gather":
            i = paddle.static.data("i", [2], "int64")
            out = paddle.gather(x, i, axis=1)
        elif kind == "index_select":
            i = paddle.static.data("i", [2], "int64")
            out = paddle.index_select(x, i, axis=1)
        elif kind == "one_hot":
            i = paddle.static.data("i", [-1], "int64")
            out = F.one_hot(paddle.reshape(i, [-1, 1]), n) + paddle.sum(x)
        elif kind == "take_along_axis":
            i = paddle.static.data("i", [-1, 1], "int64")
            out = paddle.take_along_axis(x, i, axis=1)
        elif kind == "put_along_axis":
            i = paddle.static.data("i", [-1, 1], "int64")
            out = paddle.put_along_axis(x, i, 1.5, axis=1)
        elif kind in ("scatter", "scatter_nd_add", "gather_nd_rows"):
            # the rows of x^T (n of them, a static dimension) are the ones indexed
            xt = paddle.transpose(x, [1, 0])
            if kind == "scatter":
                i = paddle.static.data("i", [2], "int64")
                out = paddle.scatter(xt, i, xt[0:2] * 2.0)
            elif kind == "scatter_nd_add":
                i = paddle.static.data("i", [2, 1], "int64")
                out = paddle.scatter_nd_add(xt, i, xt[0:2] * 2.0)
            else:
                i = paddle.static.data("i", [2, 1], "int64")
                out = paddle.gather_nd(xt, i)
        elif kind == "gather_nd":
            # column 1 of the index picks the column of x (size n)
            i = paddle.static.data("i", [3, 2], "int64")
            out = paddle.gather_nd(x, i)
        else:
            raise ValueError(kind)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, scope, ["x", "i"], out, n


def _index_feed(kind: str, value: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(4).standard_normal((MBS, 5)).astype("float32")
    shape = {
        "cross_entropy": (MBS, 1),
        "embedding": (MBS, 3),
        "embedding_padding": (MBS, 3),
        "gather": (2,),
        "index_select": (2,),
        "one_hot": (MBS,),
        "take_along_axis": (MBS, 1),
        "put_along_axis": (MBS, 1),
        "scatter": (2,),
        "scatter_nd_add": (2, 1),
        "gather_nd_rows": (2, 1),
        "gather_nd": (3, 2),
    }[kind]
    i = np.zeros(shape, "int64")
    i.flat[-1] = value
    return {"x": x, "i": i}


def _cpu_reads_out_of_bounds(kind: str, value: int, n: int) -> bool:
    """Paddle's CPU embedding kernel returns garbage rows (no error) for ``-1``, and
    for every out-of-range id once a padding_idx is set: the range refuses those."""
    if kind == "embedding":
        return value == -1
    return kind == "embedding_padding" and not 0 <= value < n


@pytest.mark.parametrize(
    "kind",
    [
        "cross_entropy",
        "embedding",
        "embedding_padding",
        "gather",
        "index_select",
        "one_hot",
        "take_along_axis",
        "put_along_axis",
        "scatter",
        "scatter_nd_add",
        "gather_nd_rows",
        "gather_nd",
    ],
)
def test_index_feeds_are_refused_exactly_where_paddle_cpu_refuses(kind: str) -> None:
    main, scope, feeds, out, n = _index_program(kind)
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=MBS)
    cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    cp.compile(feeds, [out])
    cpu = paddle.static.Executor(paddle.CPUPlace())
    for value in (-n - 1, -n, -2, -1, 0, 2, n - 1, n, n + 1, -100):
        feed = _index_feed(kind, value)
        try:
            with paddle.static.scope_guard(scope):
                want = np.asarray(cpu.run(main, feed=feed, fetch_list=[out])[0])
        except Exception:
            want = None
        if _cpu_reads_out_of_bounds(kind, value, n):
            want = None
        if want is None:
            with pytest.raises(FeedError, match=rf"feed 'i': value {value} .*valid values"):
                cp.run(feed)
        else:
            (got,) = cp.run(feed)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"value {value}")
    # 2**40 takes Paddle's kernels down (SIGSEGV): it is refused before anything runs.
    with pytest.raises(FeedError, match=r"value 1099511627776"):
        cp.run(_index_feed(kind, 2**40))
    cp.reset()


def test_the_fast_path_checks_ranges_and_the_error_names_feed_value_and_range() -> None:
    net = Net()
    cp, _ = net.compile()
    feed = batch(np.random.default_rng(5))
    cp.run(feed)
    feed["label"][0, 0] = -1  # exact dtype and shape: the fast path
    with pytest.raises(FeedError) as info:
        cp.run(feed)
    message = str(info.value)
    assert "'label'" in message and "value -1" in message and "[0, 4)" in message
    cp.reset()


def test_a_huge_label_in_training_is_a_feed_error_not_a_crash() -> None:
    code = """
import numpy as np, paddle, paddle_ipu
import paddle.nn.functional as F
from paddle_ipu.errors import FeedError
paddle.enable_static()
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 6], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    loss = paddle.mean(F.cross_entropy(paddle.static.nn.fc(x, 4), y, reduction="none"))
    paddle.optimizer.SGD(0.1).minimize(loss)
paddle.static.Executor(paddle.CPUPlace()).run(startup)
s = paddle_ipu.IpuStrategy()
s.set_graph_config(is_training=True, micro_batch_size=2)
cp = paddle_ipu.IpuCompiledProgram(main, ipu_strategy=s)
cp.compile(["x", "label"], [loss])
try:
    cp.run({"x": np.ones((2, 6), "float32"), "label": np.array([[1], [2**40]], "int64")})
except FeedError as exc:
    print("FEEDERROR", exc)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "FEEDERROR" in result.stdout and "1099511627776" in result.stdout


# --------------------------------------------------------------------------- item 7: shapes first


def _peak_bytes(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
    except FeedError:
        pass
    else:
        raise AssertionError("expected a FeedError")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_a_wrong_shaped_broadcast_feed_is_refused_before_any_cast() -> None:
    net = Net(optimizer=False)
    cp, _ = net.compile(training=False)
    rows = 10**6  # 48 MB once cast to float32
    x = np.broadcast_to(np.ones((1, IN), "float64"), (rows, IN))
    label = np.zeros((MBS, 1), "int64")
    peak = _peak_bytes(lambda: cp.run({"x": x, "label": label}))
    assert peak < 1 << 20, f"{peak} bytes allocated checking a wrong-shaped feed"
    cp.reset()


def test_serving_caps_request_rows_before_casting() -> None:
    net = Net(optimizer=False)
    cp, _ = net.compile(training=False, per_row=True)
    rt = ModelRuntime(cp.executor, micro_batch_size=MBS, timeout_ms=1.0, max_request_rows=8)
    try:
        rng = np.random.default_rng(6)
        (out,) = rt.run(batch(rng, (8,)))  # at the cap: served
        assert out.shape[0] == 8
        with pytest.raises(FeedError, match=r"at most 8 rows \(max_request_rows\), received 9"):
            rt.run(batch(rng, (9,)))
        x = np.broadcast_to(np.ones((1, IN), "float64"), (10**6, IN))
        label = np.broadcast_to(np.zeros((1, 1), "int64"), (10**6, 1))
        peak = _peak_bytes(lambda: rt.submit({"x": x, "label": label}))
        assert peak < 1 << 20, f"{peak} bytes allocated checking an oversized request"
        # Wrong trailing shape: refused before the cast as well.
        bad = np.broadcast_to(np.ones((1, IN + 1), "float64"), (4, IN + 1))
        with pytest.raises(FeedError, match="expected shape"):
            rt.submit({"x": bad, "label": np.zeros((4, 1), "int64")})
    finally:
        rt.close()
    # The default cap: MAX_REQUEST_RUNS runs' worth of rows.
    default = ModelRuntime(cp.executor, micro_batch_size=MBS, timeout_ms=1.0, start=False)
    assert default.max_request_rows == 64 * MBS
    default.close()
    cp.reset()


# --------------------------------------------------------------------------- item 13: messages


def test_a_big_endian_feed_runs_like_a_native_one() -> None:
    net = Net(optimizer=False)
    cp, _ = net.compile(training=False)
    feed = batch(np.random.default_rng(7))
    (want,) = cp.run(feed)
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in feed.items()}
    (got,) = cp.run(swapped)
    np.testing.assert_array_equal(got, want)
    # A big-endian dtype that does not convert says which it is.
    with pytest.raises(FeedError, match=r"expected dtype float32, received int16 \(big-endian\)"):
        cp.run({"x": feed["x"].astype(">i2"), "label": feed["label"]})
    cp.reset()


def test_runs_after_reset_say_to_compile_again() -> None:
    net = Net()
    cp, prog = net.compile()
    feed = batch(np.random.default_rng(8))
    cp.run(feed)
    cp.reset()
    with pytest.raises(BackendError, match=r"reset.*call compile\(\) again") as info:
        cp.run(feed)
    assert "prepare()" not in str(info.value)
    with pytest.raises(IpuError, match=r"call compile\(\) again"):
        paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=prog.fetch_names)


def test_a_closed_runtime_refuses_direct_runs_with_a_clear_error() -> None:
    net = Net(optimizer=False)
    cp, _ = net.compile(training=False, per_row=True)
    rt = ModelRuntime(cp.executor, micro_batch_size=MBS, timeout_ms=1.0)
    rng = np.random.default_rng(9)
    rt.run(batch(rng, (3,)))
    rt.close()
    # A request shaped for the runtime (3 rows) that reaches the executor once the
    # runtime is gone (a recompile under way) is told so, not given a shape error.
    with pytest.raises(RuntimeClosedError, match="model runtime serving this program is closed"):
        cp.executor.run(batch(rng, (3,)))
    cp.reset()


def test_weights_to_host_keeps_each_tensor_on_its_place() -> None:
    net = Net(place=IPU)
    name = "w1"
    assert net.scope.find_var(name).get_tensor()._place().is_custom_place()
    cp, prog = net.compile()
    exe = paddle.static.Executor(IPU)
    exe.run(prog, feed=batch(np.random.default_rng(10)), fetch_list=prog.fetch_names)
    cp.weights_to_host()
    device = cp.executor.session.read_weights()
    for var in ("w1", "b1", "w2", "b2"):
        tensor = net.scope.find_var(var).get_tensor()
        assert tensor._place().is_custom_place(), f"{var} moved to {tensor._place()}"
    onnx_of = {p: o for o, p in cp.executor.model.weights.items()}
    stored = np.array(net.scope.find_var(name).get_tensor())
    np.testing.assert_array_equal(stored, device[onnx_of[name]])
    cp.reset()


# --------------------------------------------------------------------------- items 9b, 10: files


def test_compile_only_exports_training_programs_and_skips_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx

    monkeypatch.setenv("IPU_COMPILE_ONLY", "1")
    monkeypatch.chdir(tmp_path)
    net = Net()
    before = net.persistables()
    cp, prog = net.compile()
    model = onnx.load(str(tmp_path / "offline_cache.popart"))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for onnx_name, paddle_name in cp.executor.model.weights.items():
        np.testing.assert_array_equal(inits[onnx_name], before[paddle_name])
    exe = paddle.static.Executor(IPU)
    out = exe.run(prog, feed=batch(np.random.default_rng(11)), fetch_list=prog.fetch_names)
    assert np.asarray(out[0]).size == 0  # skipped
    cp.weights_to_host()  # nothing to copy back: no error
    assert_same_state(net.persistables(), before)


def test_the_offline_cache_replaces_a_planted_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPU_COMPILE_ONLY", "1")
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("not to be touched")
    os.symlink(victim, tmp_path / "offline_cache.popart")
    Net(optimizer=False).compile(training=False)
    exported = tmp_path / "offline_cache.popart"
    assert not exported.is_symlink(), "the export went through the planted symlink"
    assert victim.read_text() == "not to be touched"
    assert exported.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offline_cache.popart", "victim"]


def test_an_unwritable_or_deleted_directory_is_an_ipu_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPU_COMPILE_ONLY", "1")
    net = Net(optimizer=False)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    # Refused by the compile's own check of the working directory, or by the export.
    with pytest.raises(IpuError, match=r"gone|offline_cache\.popart"):
        net.compile(training=False)

    from paddle_ipu._util.files import write_atomically

    with pytest.raises(IpuError, match=re.escape("/proc/offline_cache.popart")) as info:
        write_atomically("/proc/offline_cache.popart", lambda p: Path(p).write_bytes(b"x"))
    assert isinstance(info.value, OSError)  # still an OSError for callers that catch one
    os.chdir(tmp_path)
    with pytest.raises(IpuError, match=re.escape("not-a-dir/offline_cache.popart")):
        (tmp_path / "not-a-dir").write_text("")
        write_atomically(
            str(tmp_path / "not-a-dir/offline_cache.popart"), lambda p: Path(p).write_bytes(b"x")
        )


def _serving(net: Net) -> tuple[Any, Any]:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=MBS)
    s.set_options({"enable_model_runtime_executor": True, "timeout_ms": 1.0})
    cp = paddle_ipu.IpuCompiledProgram(net.main, scope=net.scope, ipu_strategy=s)
    return cp, cp.compile(["x", "label"], [net.per_row])


def test_serving_requests_during_a_recompile_wait_for_it() -> None:
    net = Net(optimizer=False)
    cp, _ = _serving(net)
    rng = np.random.default_rng(12)
    feed = batch(rng, (3,))  # a request shape only the runtime takes
    (want,) = cp.run(feed)
    stop = threading.Event()
    errors: list[BaseException] = []
    served = [0]

    def client() -> None:
        while not stop.is_set():
            try:
                (got,) = cp.run(feed)
                np.testing.assert_array_equal(got, want)
                served[0] += 1
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=client)
    thread.start()
    for _ in range(3):
        cp.compile(["x", "label"], [net.per_row])
    stop.set()
    thread.join(60)
    assert not errors, errors
    assert served[0] > 0
    cp.reset()
    # After reset(): both entry points say what to do.
    with pytest.raises(BackendError, match=r"call compile\(\) again"):
        cp.run(feed)
    with pytest.raises(BackendError, match=r"call compile\(\) again"):
        cp.submit(feed)
