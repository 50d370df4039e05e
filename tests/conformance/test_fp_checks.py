"""enable_floating_point_checks on the emulated IPU (inference): the run stops at the
first operator of the compiled graph that makes an infinity or a NaN from finite
operands, with an error naming the ONNX node, the Paddle operator it came from, what
happened and the run; without the checks the same program runs on (float16
overflows saturating at 65504, as on the IPU)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle
import pytest

import paddle_ipu
from paddle_ipu.errors import FloatingPointCheckError

paddle.enable_static()


@pytest.fixture(autouse=True)
def _static() -> Iterator[None]:
    paddle.enable_static()
    yield


def _compile(fp16: bool, checks: bool, build: Any) -> tuple[Any, Any]:
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with (
        paddle.static.program_guard(main, startup),
        paddle.static.scope_guard(scope),
        paddle.utils.unique_name.guard(),
    ):
        x = paddle.static.data("x", [2, 4], "float32")
        out = build(x)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    s.set_precision_config(enable_fp16=fp16)
    s.set_options({"enable_floating_point_checks": checks})
    prog = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s).compile(["x"], [out])
    return prog, scope


def _run(prog: Any, scope: Any, x: np.ndarray) -> np.ndarray:
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    with paddle.static.scope_guard(scope):
        return np.asarray(exe.run(prog, feed={"x": x}, fetch_list=prog.fetch_names)[0])


def _exp_then_tanh(x: Any) -> Any:
    # tanh(exp(x)) is finite whatever exp gives: only the checks see the overflow
    return paddle.tanh(paddle.exp(x) * 0.5)


def test_fp16_overflow_stops_at_its_operator() -> None:
    prog, scope = _compile(True, True, _exp_then_tanh)
    ok = _run(prog, scope, np.ones((2, 4), np.float32))
    np.testing.assert_allclose(ok, np.tanh(np.exp(1.0) * 0.5), rtol=2e-3)
    with pytest.raises(FloatingPointCheckError) as info:
        _run(prog, scope, np.full((2, 4), 12.0, np.float32))  # exp(12) > 65504
    err = info.value
    assert err.op_type == "Exp" and err.paddle_op == "pd_op.exp"
    assert err.kind == "overflow" and err.step == 2
    assert err.node in str(err) and "pd_op.exp" in str(err)


def test_without_checks_the_overflow_saturates() -> None:
    prog, scope = _compile(True, False, lambda x: paddle.exp(x) * 0.5)
    out = _run(prog, scope, np.full((2, 4), 12.0, np.float32))
    np.testing.assert_array_equal(out, 32752.0)  # 65504 * 0.5: the IPU saturates


def test_fp32_overflow_and_division_by_zero() -> None:
    prog, scope = _compile(False, True, _exp_then_tanh)
    _run(prog, scope, np.full((2, 4), 12.0, np.float32))  # finite in float32
    with pytest.raises(FloatingPointCheckError, match="overflow"):
        _run(prog, scope, np.full((2, 4), 100.0, np.float32))
    prog, scope = _compile(True, True, lambda x: paddle.tanh(1.0 / x))
    with pytest.raises(FloatingPointCheckError) as info:
        _run(prog, scope, np.zeros((2, 4), np.float32))
    assert info.value.kind == "division by zero" and info.value.paddle_op


def test_a_nan_feed_is_refused_with_the_checks() -> None:
    prog, scope = _compile(True, True, _exp_then_tanh)
    x = np.ones((2, 4), np.float32)
    x[1, 2] = np.nan
    with pytest.raises(FloatingPointCheckError, match="feed 'x'"):
        _run(prog, scope, x)
