"""What Paddle 2.x's IPU model-zoo scripts put on operators reaches the graph PopART is
given, read the way PopART's op creators read it (the double, written from
willow/src/op/*.cpp): the matmul hints set with ``op._set_attr``."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import paddle
import pytest

import paddle_ipu.backends.popart.session as adapter
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler import compile_program
from paddle_ipu.compiler.model import CompiledModel


def _compiled_with_hints() -> CompiledModel:
    from support.helpers import fresh_programs

    with fresh_programs(seed=5) as (main, startup, scope):
        x = paddle.static.data("x", [4, 8], "float32")
        h = paddle.matmul(x, paddle.create_parameter([8, 16], "float32"))
        h.block.ops[-1]._set_attr("__available_memory", 0.28)
        out = paddle.matmul(h, paddle.create_parameter([16, 10], "float32"))
        out.block.ops[-1]._set_attr("serialize_factor", 5)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        return compile_program(main, [x], [out], scope=scope, micro_batch_size=4)


def test_matmul_hints_reach_popart(popart_double: ModuleType) -> None:
    session = adapter.create_session(_compiled_with_hints(), SessionConfig())
    session.prepare_device()
    settings = list(session._session.node_settings.values())
    assert settings[0]["availableMemoryProportion"] == pytest.approx(0.28)
    assert settings[1]["serialise"] == ("output_channels", 5, True)
    out = session.run({"x": np.ones([4, 8], np.float32)})
    assert np.all(np.isfinite(next(iter(out.values()))))


def test_the_double_refuses_what_popart_refuses(popart_double: ModuleType) -> None:
    import onnx

    model = _compiled_with_hints()
    proto = onnx.load_from_string(model.onnx)
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.name == "__serialize_matmul_mode":
                attr.s = b"rows"
    model.onnx = proto.SerializeToString()
    session = adapter.create_session(model, SessionConfig())
    with pytest.raises(Exception, match="Unsupport matmul serialisation mode rows"):
        session.prepare_device()


def _compiled_with_custom_ops() -> tuple[CompiledModel, dict[str, np.ndarray]]:
    """static_ipu's four custom ops in one inference graph (the losses fetched)."""
    from support.helpers import fresh_programs

    import paddle_ipu

    ops = paddle_ipu.custom_ops
    rng = np.random.default_rng(6)
    with fresh_programs(seed=6) as (main, startup, scope):
        x = paddle.static.data("x", [4, 8], "float32")
        y = paddle.static.data("y", [4], "int32")
        m = paddle.static.data("m", [4, 3], "int32")
        h = ops.checkpointoutput(paddle.nn.Linear(8, 8)(x))
        h = h + ops.detach(ops.identity(paddle.nn.Linear(8, 8)(x)))
        start = ops.custom_nll_loss(paddle.nn.functional.softmax(paddle.nn.Linear(8, 5)(h)), y,
                                    1, "None", False)  # fmt: skip
        mlm = paddle.nn.functional.softmax(paddle.reshape(paddle.nn.Linear(8, 15)(h), [4, 3, 5]))
        masked = ops.custom_nll_loss(mlm, m, 1, "-1", False)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        model = compile_program(main, [x, y, m], [start, masked], scope=scope, micro_batch_size=4)
    feed = {
        "x": rng.standard_normal([4, 8]).astype(np.float32),
        "y": rng.integers(0, 5, [4]).astype(np.int32),
        "m": rng.integers(-1, 5, [4, 3]).astype(np.int32),
    }
    return model, feed


def test_custom_ops_are_popart_builtins_in_the_graph_popart_gets(popart_double: ModuleType) -> None:
    import onnx

    from paddle_ipu.backends.host.session import create_session as host_session

    model, feed = _compiled_with_custom_ops()
    session = adapter.create_session(model, SessionConfig())
    graph = onnx.load_from_string(session._graph()).graph
    kinds = [(n.domain, n.op_type) for n in graph.node]
    assert kinds.count(("ai.graphcore", "Nll")) == 2
    assert kinds.count(("ai.graphcore", "Detach")) == 1
    nll = [n for n in graph.node if n.op_type == "Nll"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nll]
    assert attrs[0] == {"reduction": b"Mean", "inputIsLogProbability": 0}
    assert attrs[1] == {"reduction": b"Mean", "inputIsLogProbability": 0, "ignoreIndex": -1}
    checkpoints = [
        n
        for n in graph.node
        if any(a.name == "__recompute_output_in_backward_pass" and a.i == 1 for a in n.attribute)
    ]
    assert [n.op_type for n in checkpoints] == ["Identity"]
    assert not any(a.name.startswith("__ipu_custom") for n in graph.node for a in n.attribute)
    # PopART's Nll and Detach (the double runs them as PopART's Opx compute them)
    # against the host, which runs the Paddle operators the regions hold
    session.prepare_device()
    got = session.run(feed)
    host = host_session(model, SessionConfig())
    host.prepare_device()
    want = host.run(feed)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)


def test_a_users_custom_op_reaches_popart_as_its_node(popart_double: ModuleType) -> None:
    """PopART gets the user's op (domain, type, version, attributes) in place of its
    host stand-in; PopART (the double) refuses it unless such an op is registered."""
    import onnx
    from support.helpers import fresh_programs

    import paddle_ipu

    op = paddle_ipu.register_custom_op(
        "scaled_gather_test",
        lambda w, idx, scale=1.0: paddle.gather(w, idx) * scale,
        popart_op="ScaledGather",
        domain="my.ops",
        version=2,
        attr_names=("scale",),
    )
    with fresh_programs(seed=9) as (main, startup, scope):
        idx = paddle.static.data("idx", [5], "int32")
        out = op(paddle.create_parameter([7, 3], "float32"), idx, 0.5)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        model = compile_program(main, [idx], [out], scope=scope, micro_batch_size=5)
    session = adapter.create_session(model, SessionConfig())
    proto = onnx.load_from_string(session._graph())
    (node,) = [n for n in proto.graph.node if n.domain == "my.ops"]
    assert node.op_type == "ScaledGather" and len(node.input) == 2
    assert onnx.helper.get_attribute_value(node.attribute[0]) == pytest.approx(0.5)
    assert ("my.ops", 2) in {(o.domain, o.version) for o in proto.opset_import}
    with pytest.raises(Exception, match=r"No definition found for my\.ops:ScaledGather"):
        session.prepare_device()
