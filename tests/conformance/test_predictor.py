"""Inference through IpuCompiledProgram on the emulated IPU, against Paddle's CPU."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import Built, build

import paddle_ipu
from paddle_ipu.errors import FeedError, NotSupportedError, OptionError, UnsupportedOpError

IPU = paddle.CustomPlace("ipu", 0)


def compile_model(
    built: Built,
    *,
    bps: int = 1,
    mbs: int = 1,
    fp16: bool = False,
    anchor: str = "ALL",
    period: int = 1,
) -> tuple[Any, Any]:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=mbs)
    s.set_pipelining_config(batches_per_step=bps)
    s.set_precision_config(enable_fp16=fp16)
    s.set_anchor_config(anchor, period)
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    return cp, cp.compile(built.feeds, built.fetches)


def reference(built: Built, feed: dict[str, np.ndarray], bps: int, mbs: int) -> np.ndarray:
    """Paddle CPU, one micro-batch at a time, stacked as [bps, mbs, ...]."""
    outs = []
    for b in range(bps):
        part = {k: v[b * mbs : (b + 1) * mbs] for k, v in feed.items()}
        outs.append(built.run_cpu(part)[0])
    return np.stack(outs)


MODELS = {name: None for name in ("mlp", "cnn", "transformer")}


@pytest.fixture(scope="module")
def models() -> dict[str, Built]:
    paddle.enable_static()
    return {name: build(name) for name in MODELS}


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize(("bps", "mbs"), [(1, 1), (1, 4), (3, 1), (3, 4)])
def test_matches_paddle_cpu_fp32(models: dict[str, Built], kind: str, bps: int, mbs: int) -> None:
    built = models[kind]
    cp, prog = compile_model(built, bps=bps, mbs=mbs)
    feed = built.random_feed(bps * mbs, np.random.default_rng(bps * 10 + mbs))
    ref = reference(built, feed, bps, mbs)
    exe = paddle.static.Executor(IPU)
    (out,) = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
    expected_shape = (bps, *ref.shape[1:]) if bps > 1 else ref.shape[1:]
    assert out.shape == expected_shape
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-6)
    cp.reset()


@pytest.mark.parametrize("kind", list(MODELS))
def test_matches_paddle_cpu_fp16(models: dict[str, Built], kind: str) -> None:
    built = models[kind]
    bps, mbs = 3, 4
    cp, prog = compile_model(built, bps=bps, mbs=mbs, fp16=True)
    assert all(cp.executor.session.get_info(w).dtype == "float16" for w in cp.model.weights)
    feed = built.random_feed(bps * mbs, np.random.default_rng(5))
    ref = reference(built, feed, bps, mbs)
    (out,) = paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=prog.fetch_names)
    assert out.dtype == np.float32
    # fp16 storage and compute: within 1e-2 relative of the fp32 CPU result
    scale = np.abs(ref).max()
    assert np.abs(out.reshape(ref.shape) - ref).max() <= 1e-2 * scale
    cp.reset()


def test_fp16_graph_carries_no_weights(models: dict[str, Built]) -> None:
    """With enable_fp16 the graph ONNX Runtime parses holds no weight bytes (the fp16
    pass runs on the weightless graph); the session holds the scope's weights in
    float16, rounded to nearest."""
    import onnx

    built = models["cnn"]
    cp, _ = compile_model(built, mbs=1, fp16=True)
    session = cp.executor.session
    graph = session._plan.proto
    inits = {i.name: i for i in graph.graph.initializer}
    for device_name, paddle_name in cp.model.weights.items():
        want = np.array(built.scope.find_var(paddle_name).get_tensor())
        assert inits[device_name].data_location == onnx.TensorProto.EXTERNAL
        assert not inits[device_name].raw_data
        if want.dtype == np.float32:
            assert inits[device_name].data_type == onnx.TensorProto.FLOAT16
            got = session.read_weights([device_name])[device_name]
            np.testing.assert_array_equal(got, want.astype(np.float16))
    cp.reset()


@pytest.mark.parametrize("place", [IPU, paddle.CPUPlace()], ids=["ipu", "cpu"])
@pytest.mark.parametrize("direct", ["1", "0"], ids=["direct", "paddle-executor"])
def test_exe_run_on_both_places_and_both_paths(
    models: dict[str, Built], place: Any, direct: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PADDLE_IPU_DIRECT_RUN", direct)
    built = models["cnn"]
    cp, prog = compile_model(built, mbs=2)
    feed = built.random_feed(2, np.random.default_rng(1))
    exe = paddle.static.Executor(place)
    (by_name,) = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
    np.testing.assert_allclose(by_name, built.run_cpu(feed)[0], rtol=1e-5, atol=1e-6)
    # no fetch_list: every fetch, in order
    (everything,) = exe.run(prog, feed=feed)
    np.testing.assert_array_equal(everything, by_name)
    assert prog.org_program is built.main
    cp.reset()


def test_fetch_by_original_value_and_name(models: dict[str, Built]) -> None:
    built = models["mlp"]
    cp, prog = compile_model(built, mbs=3)
    feed = built.random_feed(3, np.random.default_rng(2))
    exe = paddle.static.Executor(IPU)
    (by_value,) = exe.run(prog, feed=feed, fetch_list=built.fetches)
    (by_name,) = exe.run(prog, feed=feed, fetch_list=[prog.fetch_names[0]])
    np.testing.assert_array_equal(by_value, by_name)
    cp.reset()


def test_fetch_a_feed_by_its_original_name() -> None:
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        y = paddle.nn.functional.relu(x) * 2.0
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=False, micro_batch_size=2)
        cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
        prog = cp.compile(["x"], [y, "x"])
    assert "x" in prog.fetch_names
    feed = {"x": np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)}
    (xs,) = paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=["x"])
    np.testing.assert_array_equal(xs, feed["x"])


@pytest.mark.parametrize(
    ("anchor", "period"), [("ALL", 1), ("FINAL", 1), ("SUM", 1), ("EVERYN", 2)]
)
def test_anchor_return_types(models: dict[str, Built], anchor: str, period: int) -> None:
    built = models["mlp"]
    bps, mbs = 4, 2
    cp, prog = compile_model(built, bps=bps, mbs=mbs, anchor=anchor, period=period)
    feed = built.random_feed(bps * mbs, np.random.default_rng(3))
    ref = reference(built, feed, bps, mbs)  # [bps, mbs, 10]
    (out,) = paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=prog.fetch_names)
    expected = {
        "ALL": ref,
        "FINAL": ref[-1],
        "SUM": ref.sum(axis=0),
        "EVERYN": ref[period - 1 :: period],
    }[anchor]
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    cp.reset()


def test_everyn_period_must_divide_batches_per_step(models: dict[str, Built]) -> None:
    with pytest.raises(OptionError, match="period"):
        compile_model(models["mlp"], bps=3, anchor="EVERYN", period=2)


def test_replicas_each_take_their_slice(models: dict[str, Built]) -> None:
    built = models["mlp"]
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(num_ipus=2, is_training=False, micro_batch_size=2)
    s.set_pipelining_config(batches_per_step=3)
    s.set_options({"enable_replicated_graphs": True, "replicated_graph_count": 2})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    prog = cp.compile(built.feeds, built.fetches)
    feed = built.random_feed(3 * 2 * 2, np.random.default_rng(4))
    (out,) = paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=prog.fetch_names)
    assert out.shape == (3, 2, 2, 10)  # [bps, rf, mbs, classes]
    ref = built.run_cpu(feed)[0].reshape(3, 2, 2, 10)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    cp.reset()


def test_step_layout_feed_accepted(models: dict[str, Built]) -> None:
    built = models["mlp"]
    cp, prog = compile_model(built, bps=3, mbs=4)
    flat = built.random_feed(12, np.random.default_rng(6))
    layered = {"x": flat["x"].reshape(3, 4, 16)}
    exe = paddle.static.Executor(IPU)
    (a,) = exe.run(prog, feed=flat, fetch_list=prog.fetch_names)
    (b,) = exe.run(prog, feed=layered, fetch_list=prog.fetch_names)
    np.testing.assert_array_equal(a, b)
    cp.reset()


def test_executor_numpy_api(models: dict[str, Built]) -> None:
    built = models["transformer"]
    cp, _ = compile_model(built, mbs=2)
    feed = built.random_feed(2, np.random.default_rng(7))
    (out,) = cp.run(feed)
    np.testing.assert_allclose(out, built.run_cpu(feed)[0], rtol=1e-5, atol=1e-5)
    cp.reset()
    with pytest.raises(paddle_ipu.BackendError, match="not prepared"):
        cp.run(feed)


def test_int64_feed_cast_where_graph_takes_int32() -> None:
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        ids = paddle.static.data("ids", [-1, 3], "int32")
        emb = paddle.nn.Embedding(10, 4)
        out = paddle.sum(emb(ids), axis=1)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=False, micro_batch_size=2)
        cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
        prog = cp.compile(["ids"], [out])
        feed64 = {"ids": np.array([[1, 2, 3], [4, 5, 9]], np.int64)}
        (got,) = paddle.static.Executor(IPU).run(prog, feed=feed64, fetch_list=prog.fetch_names)
        (ref,) = paddle.static.Executor(paddle.CPUPlace()).run(
            main, feed={"ids": feed64["ids"].astype(np.int32)}, fetch_list=[out]
        )
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    with pytest.raises(FeedError, match="do not fit"):
        cp.run({"ids": np.array([[1, 2, 3], [4, 5, 2**40]], np.int64)})


# -- bad input ----------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled_mlp(models: dict[str, Built]) -> Any:
    cp, prog = compile_model(models["mlp"], bps=2, mbs=4)
    return cp, prog


def test_wrong_feed_name(compiled_mlp: Any) -> None:
    _, prog = compiled_mlp
    with pytest.raises(FeedError, match=r"unknown feed 'y'.*\['x'\]"):
        paddle.static.Executor(IPU).run(
            prog, feed={"y": np.zeros((8, 16), np.float32)}, fetch_list=prog.fetch_names
        )


def test_missing_feed(compiled_mlp: Any) -> None:
    cp, _ = compiled_mlp
    with pytest.raises(FeedError, match="missing feed 'x'"):
        cp.run({})


def test_wrong_rank(compiled_mlp: Any) -> None:
    _, prog = compiled_mlp
    with pytest.raises(FeedError, match=r"feed 'x': expected rank 3 .* received rank 1"):
        paddle.static.Executor(IPU).run(
            prog, feed={"x": np.zeros((16,), np.float32)}, fetch_list=prog.fetch_names
        )


@pytest.mark.parametrize("rows", [5, 4, 16, 1, 0])
def test_wrong_leading_dimension_never_broadcasts(compiled_mlp: Any, rows: int) -> None:
    _, prog = compiled_mlp
    with pytest.raises(FeedError, match=rf"feed 'x': dimension 0 must be 8, received {rows}"):
        paddle.static.Executor(IPU).run(
            prog, feed={"x": np.zeros((rows, 16), np.float32)}, fetch_list=prog.fetch_names
        )


def test_wrong_inner_dimension(compiled_mlp: Any) -> None:
    cp, _ = compiled_mlp
    with pytest.raises(FeedError, match=r"dimension 2 must be 16, received 15"):
        cp.run({"x": np.zeros((2, 4, 15), np.float32)})


def test_wrong_dtype(compiled_mlp: Any) -> None:
    _, prog = compiled_mlp
    with pytest.raises(FeedError, match="feed 'x': expected dtype float32, received int32"):
        paddle.static.Executor(IPU).run(
            prog, feed={"x": np.zeros((8, 16), np.int32)}, fetch_list=prog.fetch_names
        )


def test_error_through_paddle_executor_keeps_its_type(
    compiled_mlp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PADDLE_IPU_DIRECT_RUN", "0")
    _, prog = compiled_mlp
    with pytest.raises(FeedError, match="dimension 0 must be 8, received 5"):
        paddle.static.Executor(IPU).run(
            prog, feed={"x": np.zeros((5, 16), np.float32)}, fetch_list=prog.fetch_names
        )


def test_unsupported_op_is_named() -> None:
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        y = paddle.lgamma(x) + paddle.erfinv(paddle.tanh(x))
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    with pytest.raises(UnsupportedOpError, match=r"(?s)lgamma.*erfinv|erfinv.*lgamma"):
        paddle_ipu.IpuCompiledProgram(main, ipu_strategy=s).compile(["x"], [y])


def test_unknown_option_suggests() -> None:
    s = paddle_ipu.IpuStrategy()
    with pytest.raises(OptionError, match="micro_batch_size"):
        s.set_options({"micro_batch_sise": 4})


def test_option_that_changes_results_raises_on_host(models: dict[str, Built]) -> None:
    built = models["mlp"]
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    s.set_options({"synthetic_data_mode": "Zeros"})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    with pytest.raises(NotSupportedError, match="synthetic_data_mode"):
        cp.compile(built.feeds, built.fetches)


# -- artefacts and modes --------------------------------------------------------


def test_onnx_dump_and_save_model_proto(models: dict[str, Built], tmp_path: Any) -> None:
    import onnx
    import onnxruntime as ort

    built = models["cnn"]
    dump = tmp_path / "dump.onnx"
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=2)
    s.set_options({"onnx_dump_path": str(dump)})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    cp.compile(built.feeds, built.fetches)
    other = tmp_path / "saved.onnx"
    cp.save_model_proto(str(other))
    for path in (dump, other):
        onnx.checker.check_model(onnx.load(str(path)))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = built.random_feed(2, np.random.default_rng(8))
        out = sess.run(None, {sess.get_inputs()[0].name: feed["x"]})[0]
        np.testing.assert_allclose(out, built.run_cpu(feed)[0], rtol=1e-5, atol=1e-6)
    cp.reset()


def test_compile_only_exports_and_skips_run(
    models: dict[str, Built], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IPU_COMPILE_ONLY", "1")
    built = models["mlp"]
    _, prog = compile_model(built, mbs=2)
    assert os.path.exists(tmp_path / "offline_cache.popart")
    out = paddle.static.Executor(IPU).run(
        prog, feed=built.random_feed(2, np.random.default_rng(9)), fetch_list=prog.fetch_names
    )
    assert [o.size for o in out] == [0]


def test_random_seed_is_passed_to_the_session(models: dict[str, Built]) -> None:
    built = models["mlp"]
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    s.set_options({"random_seed": 1234})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    cp.compile(built.feeds, built.fetches)
    assert cp.executor.session._seed == 1234
    cp.reset()


def test_weights_copied_at_prepare(models: dict[str, Built]) -> None:
    """The device holds the scope's weights as they were at compile time."""
    built = models["mlp"]
    cp, _ = compile_model(built, mbs=1)
    session = cp.executor.session
    for device_name, paddle_name in cp.model.weights.items():
        tensor = built.scope.find_var(paddle_name).get_tensor()
        np.testing.assert_array_equal(
            session.read_weights([device_name])[device_name], np.array(tensor)
        )
    cp.reset()


def test_paddle_inference_still_works_after_compile() -> None:
    """Paddle 3.3.1 aborts creating its first predictor after a Python op exists;
    compile() guards against it."""
    from support.helpers import run_python

    code = (
        "import os, tempfile, numpy as np, paddle, paddle_ipu, paddle.inference as pi\n"
        "paddle.enable_static()\n"
        "main, startup = paddle.static.Program(), paddle.static.Program()\n"
        "with paddle.static.program_guard(main, startup):\n"
        "    x = paddle.static.data('x', [-1, 4], 'float32')\n"
        "    y = paddle.static.nn.fc(x, 3)\n"
        "exe = paddle.static.Executor(paddle.CPUPlace()); exe.run(startup)\n"
        "s = paddle_ipu.IpuStrategy(); s.set_graph_config(is_training=False)\n"
        "paddle_ipu.IpuCompiledProgram(main, ipu_strategy=s).compile(['x'], [y])\n"
        "d = tempfile.mkdtemp()\n"
        "paddle.static.save_inference_model(d + '/m', [x], [y], exe, program=main)\n"
        "c = pi.Config(d + '/m.json', d + '/m.pdiparams'); c.disable_glog_info()\n"
        "p = pi.create_predictor(c)\n"
        "h = p.get_input_handle(p.get_input_names()[0]); h.reshape([1, 4])\n"
        "h.copy_from_cpu(np.ones((1, 4), np.float32)); p.run()\n"
        "print('predictor ok')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "predictor ok" in proc.stdout


def test_model_runtime_serves_exe_run(models: dict[str, Built]) -> None:
    built = models["mlp"]
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=4)
    s.set_options({"enable_model_runtime_executor": True, "timeout_ms": 5.0})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    prog = cp.compile(built.feeds, built.fetches)
    assert cp.runtime is not None
    feed = built.random_feed(3, np.random.default_rng(0))  # not a whole micro-batch
    (out,) = paddle.static.Executor(IPU).run(prog, feed=feed, fetch_list=prog.fetch_names)
    np.testing.assert_allclose(out, built.run_cpu(feed)[0], rtol=1e-5, atol=1e-6)
    runtime = cp.runtime
    cp.reset()
    assert cp.runtime is None and runtime.closed


def test_compile_reports_progress(models: dict[str, Built]) -> None:
    built = models["mlp"]
    seen: list[tuple[int, int]] = []
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    s.set_options({"compilation_progress_logger": lambda p, t: seen.append((p, t))})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    cp.compile(built.feeds, built.fetches)
    assert seen[0] == (0, 100) and seen[-1] == (100, 100)
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)
    cp.reset()
