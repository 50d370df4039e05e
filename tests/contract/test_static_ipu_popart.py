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
