"""Models that leave input dimensions open, as Paddle's libraries export trained models
(an OCR detector's ``[-1, 3, -1, -1]``): compiled for concrete input shapes, each
compile against Paddle's own CPU executor on the same feed, in both IRs."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

import paddle_ipu
from paddle_ipu.compiler import compile_program
from paddle_ipu.errors import CompileError
from paddle_ipu.executor import executor_for

TOL = dict(rtol=2e-5, atol=2e-5)


def _detector_like() -> tuple[Any, Any]:
    """The operators that need sizes to lower: a strided conv, a squeeze-excite block
    (adaptive pooling to 1x1), a nearest upsampling by a scale, an adaptive pooling
    whose bins do not divide every input, and a reshape computed from a shape."""
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 8, 3, stride=2, padding=1)(x))
    se = paddle.nn.functional.adaptive_avg_pool2d(h, [1, 1])
    h = h * paddle.nn.functional.hardsigmoid(paddle.nn.Conv2D(8, 8, 1)(se))
    up = paddle.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest")
    pooled = paddle.nn.functional.adaptive_avg_pool2d(up, [3, 5])
    flat = paddle.reshape(pooled, [paddle.shape(pooled)[0], -1])
    return x, [up, flat]


def _build(legacy: bool) -> tuple[Any, Any, Any, Any]:
    with fresh_programs(5) as (main, startup, scope):
        x, fetches = _detector_like()
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, scope, x, fetches


@pytest.mark.parametrize("legacy", [False, True], ids=["pir", "legacy"])
def test_open_dimensions_compile_for_each_input_shape(legacy: bool) -> None:
    guard = paddle.pir_utils.OldIrGuard() if legacy else paddle.pir_utils.IrGuard()
    with guard:
        main, scope, _, fetches = _build(legacy)
        cpu = paddle.static.Executor(paddle.CPUPlace())
        for shape in ((2, 3, 32, 48), (2, 3, 20, 36)):
            feed = np.random.default_rng(sum(shape)).standard_normal(shape).astype("float32")
            with paddle.static.scope_guard(scope):
                want = cpu.run(main, feed={"x": feed}, fetch_list=fetches)
                model = compile_program(
                    main, ["x"], fetches, scope=scope, micro_batch_size=2,
                    input_shapes={"x": shape},
                )  # fmt: skip
            assert [s.shape for s in model.outputs] == [w.shape for w in want]
            strategy = paddle_ipu.IpuStrategy()
            strategy.set_graph_config(is_training=False, micro_batch_size=2)
            executor = executor_for(model, strategy)
            got = executor.run({"x": feed})
            executor.reset()
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, **TOL)


def test_shapes_the_model_does_not_take_are_refused_by_name() -> None:
    main, scope, _, fetches = _build(legacy=False)
    with paddle.static.scope_guard(scope):
        with pytest.raises(CompileError, match=r"input shape \[2, 4, 32, 48\] for feed 'x'"):
            compile_program(main, ["x"], fetches, scope=scope, input_shapes={"x": (2, 4, 32, 48)})
        with pytest.raises(CompileError, match=r"no input shape"):
            compile_program(main, ["x"], fetches, scope=scope, input_shapes={})
        with pytest.raises(CompileError, match=r"not feeds of the program"):
            compile_program(main, ["x"], fetches, scope=scope, input_shapes={"y": (1, 2)})
