"""The Session protocol, checked against every available backend.

The graph is y = x @ w + b with w, b as weights, built directly in ONNX so that
the contract does not depend on the compiler.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from paddle_ipu import backends
from paddle_ipu.backends.base import AnchorReturnType, SessionConfig
from paddle_ipu.backends.layout import StepLayout
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import FeedError, IpuError

MB, IN, OUT = 2, 3, 4
W0 = np.arange(IN * OUT, dtype=np.float32).reshape(IN, OUT) / 10
B0 = np.linspace(-1, 1, OUT).astype(np.float32)


def affine_model() -> CompiledModel:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [MB, IN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [MB, OUT])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    inits = [numpy_helper.from_array(W0, "w"), numpy_helper.from_array(B0, "b")]
    graph = helper.make_graph(nodes, "affine", [x], [y], initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return CompiledModel(
        onnx=proto.SerializeToString(),
        inputs=[TensorSpec("x", "float32", (MB, IN), "x")],
        outputs=[TensorSpec("y", "float32", (MB, OUT), "y")],
        weights={"w": "fc.w_0", "b": "fc.b_0"},
        micro_batch_size=MB,
        opset=13,
    )


def expected(x: np.ndarray, w: np.ndarray = W0, b: np.ndarray = B0) -> np.ndarray:
    return x @ w + b


@pytest.mark.parametrize(
    ("bps", "rf", "kind", "period"),
    [
        (1, 1, "ALL", 1),
        (3, 1, "ALL", 1),
        (3, 2, "ALL", 1),
        (4, 2, "EVERYN", 2),
        (3, 2, "FINAL", 1),
        (3, 2, "SUM", 1),
    ],
)
def test_layout_and_anchor_types(
    backend_name: str, bps: int, rf: int, kind: str, period: int
) -> None:
    layout = StepLayout(bps, 1, rf)
    config = SessionConfig(
        batches_per_step=bps,
        replication_factor=rf,
        anchors={"y": AnchorReturnType(kind, period)},
    )
    x = np.random.default_rng(bps * 10 + rf).standard_normal((bps, rf, MB, IN)).astype(np.float32)
    per_micro = expected(x)  # [bps, rf, MB, OUT]
    want = {
        "ALL": per_micro,
        "EVERYN": per_micro[period - 1 :: period],
        "FINAL": per_micro[-1],
        "SUM": per_micro.sum(axis=0),
    }[kind]
    with backends.create_session(backend_name, affine_model(), config) as session:
        session.prepare_device()
        out = session.run({"x": x.reshape(layout.input_shape((MB, IN)))})
    assert out["y"].shape == layout.anchor_shape((MB, OUT), kind, period)
    np.testing.assert_allclose(out["y"], want.reshape(out["y"].shape), rtol=1e-6, atol=1e-6)


def test_weights_round_trip_and_take_effect(backend_name: str) -> None:
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as session:
        session.prepare_device()
        assert session.has_info("w") and not session.has_info("nope")
        assert session.get_info("w").shape == (IN, OUT)
        read = session.read_weights(["w", "b"])
        np.testing.assert_array_equal(read["w"], W0)
        w1 = -W0
        session.write_weights({"w": w1})
        np.testing.assert_array_equal(session.read_weights(["w"])["w"], w1)
        x = np.ones((MB, IN), np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x, w1), rtol=1e-6)
        # the session keeps its own copy: changing the caller's array changes nothing
        w1[:] = 0
        assert session.read_weights(["w"])["w"].any()


def test_bad_input_raises_package_errors(backend_name: str) -> None:
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as session:
        session.prepare_device()
        with pytest.raises(FeedError, match="feed 'x'"):
            session.run({"x": np.ones((MB + 1, IN), np.float32)})
        with pytest.raises(IpuError):
            session.write_weights({"w": np.ones((IN + 1, OUT), np.float32)})


def test_fp16_weights_live_in_half_precision(backend_name: str) -> None:
    config = SessionConfig(enable_fp16=True)
    with backends.create_session(backend_name, affine_model(), config) as session:
        session.prepare_device()
        assert session.get_info("w").dtype == "float16"
        x = np.random.default_rng(0).standard_normal((MB, IN)).astype(np.float32)
        y = session.run({"x": x})["y"]
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, expected(x), rtol=1e-2, atol=1e-2)


def test_model_to_host_writes_current_weights(backend_name: str, tmp_path: object) -> None:
    import onnx

    path = str(tmp_path) + "/model.onnx"  # type: ignore[operator]
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as session:
        session.prepare_device()
        session.write_weights({"b": np.zeros(OUT, np.float32)})
        session.model_to_host(path)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    np.testing.assert_array_equal(inits["b"], np.zeros(OUT, np.float32))
    np.testing.assert_array_equal(inits["w"], W0)
