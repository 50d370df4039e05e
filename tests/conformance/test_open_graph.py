"""A model with open input dimensions converted once with them open, each input shape
made from that graph by ONNX's shape inference (paddle_ipu.compiler.open_shapes):
every shape against Paddle's own CPU executor on the same feed, in both IRs; a model
that does not convert open is compiled per shape and says why; an open graph that
disagrees with a compile is not used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

import paddle_ipu
from paddle_ipu.compiler.open_shapes import OpenGraph, compile_open
from paddle_ipu.executor import executor_for

TOL = dict(rtol=2e-5, atol=2e-5)
SHAPES = ((2, 3, 32, 48), (2, 3, 20, 36), (2, 3, 64, 16))


def _image_net() -> tuple[Any, list[Any]]:
    """What an image model's open height and width meet: a strided convolution, a
    squeeze-excite block (adaptive average pooling to 1x1), an adaptive max pooling to
    1x1, nearest and bilinear upsampling by whole scales, a reshape from a shape."""
    F = paddle.nn.functional
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = F.relu(paddle.nn.Conv2D(3, 8, 3, stride=2, padding=1)(x))
    se = F.adaptive_avg_pool2d(h, [1, 1])
    h = h * F.hardsigmoid(paddle.nn.Conv2D(8, 8, 1)(se) + F.adaptive_max_pool2d(h, [1, 1]))
    up = F.interpolate(h, scale_factor=2.0, mode="nearest")
    smooth = F.interpolate(up, scale_factor=2, mode="bilinear", align_corners=False)
    flat = paddle.reshape(up, [paddle.shape(up)[0], 8, -1])
    return x, [smooth, flat]


def _build(legacy: bool) -> tuple[Any, Any, list[Any]]:
    guard = paddle.pir_utils.OldIrGuard() if legacy else paddle.pir_utils.IrGuard()
    with guard, fresh_programs(7) as (main, startup, scope):
        _, fetches = _image_net()
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, scope, fetches


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _run(model: Any, feed: np.ndarray) -> list[np.ndarray]:
    strategy = paddle_ipu.IpuStrategy()
    strategy.set_graph_config(is_training=False, micro_batch_size=2)
    executor = executor_for(model, strategy)
    try:
        return executor.run({"x": feed})
    finally:
        executor.reset()


@pytest.mark.parametrize("legacy", [False, True], ids=["pir", "legacy"])
def test_every_shape_made_from_the_open_graph_answers_as_paddle(legacy: bool) -> None:
    guard = paddle.pir_utils.OldIrGuard() if legacy else paddle.pir_utils.IrGuard()
    main, scope, fetches = _build(legacy)
    with guard, paddle.static.scope_guard(scope):
        model = compile_open(main, ["x"], fetches, scope=scope, micro_batch_size=2)
        assert model.inputs[0].shape == (2, 3, -1, -1)
        graph = OpenGraph(model)
        cpu = paddle.static.Executor(paddle.CPUPlace())
        for shape in SHAPES:
            feed = np.random.default_rng(sum(shape)).standard_normal(shape).astype("float32")
            want = cpu.run(main, feed={"x": feed}, fetch_list=fetches)
            static = graph.specialise({"x": shape})
            assert [s.shape for s in static.outputs] == [w.shape for w in want]
            assert graph.output_shapes({"x": shape}) == [w.shape for w in want]
            for got, w in zip(_run(static, feed), want):
                np.testing.assert_allclose(got, w, **TOL)


def test_the_shapes_of_one_open_graph_run_on_one_host_session() -> None:
    """On the host every shape made from one open graph runs on one ONNX Runtime session
    of that graph (backends/host/open_sessions): each shape builds none, and answers as
    Paddle.  A configuration whose graph is not the one compiled (here the
    floating-point checks' flags) builds a session per shape, with the same answers."""
    main, scope, fetches = _build(False)
    with paddle.pir_utils.IrGuard(), paddle.static.scope_guard(scope):
        graph = OpenGraph(compile_open(main, ["x"], fetches, scope=scope, micro_batch_size=2))
        cpu = paddle.static.Executor(paddle.CPUPlace())
        for options, shared in (({}, True), ({"enable_floating_point_checks": True}, False)):
            held = []
            for shape in SHAPES:
                feed = np.random.default_rng(sum(shape)).standard_normal(shape).astype("float32")
                want = cpu.run(main, feed={"x": feed}, fetch_list=fetches)
                strategy = paddle_ipu.IpuStrategy()
                strategy.set_graph_config(is_training=False, micro_batch_size=2)
                strategy.set_options(options)
                executor = executor_for(graph.specialise({"x": shape}), strategy)
                for got, w in zip(executor.run({"x": feed}), want):
                    np.testing.assert_allclose(got, w, **TOL)
                held.append(executor)
            ones = [e.session._shared for e in held]  # type: ignore[union-attr]
            if shared:
                assert ones[0] is not None and all(o is ones[0] for o in ones)
            else:
                assert ones == [None] * len(SHAPES)
            for executor in held:
                executor.reset()


def test_replicas_and_steps_run_on_the_shared_session() -> None:
    """Two replicas and two batches per step on shapes made from one open graph: each
    micro-batch of each replica runs on the one shared session, and the answer is
    Paddle's, in the step layout [bps, rf, mbs, ...]."""
    main, scope, fetches = _build(False)
    with paddle.pir_utils.IrGuard(), paddle.static.scope_guard(scope):
        graph = OpenGraph(compile_open(main, ["x"], fetches, scope=scope, micro_batch_size=2))
        cpu = paddle.static.Executor(paddle.CPUPlace())
        held = []
        for shape in SHAPES[:2]:
            rows = (8, *shape[1:])
            feed = np.random.default_rng(sum(shape)).standard_normal(rows).astype("float32")
            want = cpu.run(main, feed={"x": feed}, fetch_list=fetches)
            strategy = paddle_ipu.IpuStrategy()
            strategy.set_graph_config(num_ipus=2, is_training=False, micro_batch_size=2)
            strategy.set_pipelining_config(batches_per_step=2)
            strategy.set_options({"enable_replicated_graphs": True, "replicated_graph_count": 2})
            executor = executor_for(graph.specialise({"x": shape}), strategy)
            for got, w in zip(executor.run({"x": feed}), want):
                assert got.shape == (2, 2, 2, *w.shape[1:])
                np.testing.assert_allclose(got.reshape(w.shape), w, **TOL)
            held.append(executor)
        assert held[0].session._shared is not None  # type: ignore[union-attr]
        assert held[0].session._shared is held[1].session._shared  # type: ignore[union-attr]
        for executor in held:
            executor.reset()


def test_a_scalar_joined_with_vectors_becomes_a_vector() -> None:
    """converter_fixes.concat_scalars: a shape built by concatenating a size read from
    Shape and squeezed to a scalar with one-element vectors (the converter's reshape
    to a list of sizes; PP-OCRv4's recogniser has one) is refused by ONNX Runtime with
    its sizes open, and runs once the scalar is made a vector."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from paddle_ipu.compiler.converter_fixes import concat_scalars

    def const(name: str, values: list[int]) -> Any:
        value = numpy_helper.from_array(np.array(values, np.int64))
        return helper.make_node("Constant", [], [name], value=value)

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("start", [1]),
        const("end", [2]),
        helper.make_node("Slice", ["shape", "start", "end"], ["width1"]),
        const("axes", [0]),
        helper.make_node("Squeeze", ["width1", "axes"], ["width"]),
        const("lead", [1]),
        const("half", [2]),
        helper.make_node("Div", ["width", "two"], ["halfwidth"]),
        helper.make_node("Concat", ["lead", "halfwidth", "half"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(2, np.int64), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="Concat"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert concat_scalars(model) == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for width in (4, 10):
        x = np.arange(width, dtype=np.float32)[None]
        (y,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, x.reshape(1, width // 2, 2))


def _save(tmp_path: Path, net: Any) -> str:
    with paddle.pir_utils.IrGuard(), fresh_programs(3) as (main, startup, _):
        x, fetches = net()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        prefix = str(tmp_path / "model")
        paddle.static.save_inference_model(prefix, [x], fetches, exe, program=main)
    return prefix


def test_a_saved_model_keeps_its_checked_open_graph(tmp_path: Path, cache_dir: Any) -> None:
    from paddle_ipu.serving.package import load_package
    from paddle_ipu.serving.saved_model import compile_model

    prefix = _save(tmp_path, _image_net)
    package, _ = compile_model(prefix, micro_batch_size=2)
    assert package.meta["open_graph"] == "checked" and package.open is not None
    again = load_package(package.save(tmp_path / "p.pdipu"))
    assert again.open is not None and again.open.inputs[0].shape == (2, 3, -1, -1)
    assert not again.shapes  # no shape compiled: each is made when it is asked for


def test_a_model_that_does_not_convert_open_is_compiled_per_shape(
    tmp_path: Path, cache_dir: Any
) -> None:
    from paddle_ipu.serving.saved_model import compile_model

    def uneven_bins() -> tuple[Any, list[Any]]:
        x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
        return x, [paddle.nn.functional.adaptive_avg_pool2d(x, [3, 5])]

    package, _ = compile_model(_save(tmp_path, uneven_bins), micro_batch_size=2)
    assert package.open is None
    assert "does not convert with its dimensions open" in package.meta["open_graph"]
    assert "output size [3, 5] does not divide" in package.meta["open_graph"]


def test_an_open_graph_that_differs_from_a_compile_is_not_used(
    tmp_path: Path, cache_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check compares the open graph with a compile at one shape: a graph made
    wrong (every output doubled, as a lowering that misread an attribute would) is
    refused, and the model is compiled per shape.  The open graph is made wrong: the
    host runs it (one session for every shape), and each shape's graph is made from
    it."""
    import dataclasses

    import paddle_ipu.compiler.open_shapes as open_shapes
    from paddle_ipu.serving.saved_model import compile_model

    real = open_shapes.compile_open

    def doubled(*args: Any, **kwargs: Any) -> Any:
        import onnx
        from onnx import helper

        model = real(*args, **kwargs)
        proto = onnx.load_from_string(model.onnx)
        out = proto.graph.output[0].name
        proto.graph.node.append(helper.make_node("Add", [out + "_x", out + "_x"], [out]))
        for node in proto.graph.node[:-1]:
            node.output[:] = [o + "_x" if o == out else o for o in node.output]
            node.input[:] = [i + "_x" if i == out else i for i in node.input]
        return dataclasses.replace(model, onnx=proto.SerializeToString())

    monkeypatch.setattr(open_shapes, "compile_open", doubled)
    package, _ = compile_model(_save(tmp_path, _image_net), micro_batch_size=2)
    assert package.open is None
    assert "the open graph differs from a compile at" in package.meta["open_graph"]
