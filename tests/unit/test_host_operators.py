"""The host backend's Paddle operators (csrc/ops): ``ipu_round_fp16`` in a PIR program
rounds exactly as the compiled core's ``round_fp16`` (whose own tests hold it to the
IPU's rounding rules), for every mode."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

from paddle_ipu import _core, device
from paddle_ipu._internals import paddle_api


@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("saturate", [False, True])
def test_round_operator_equals_the_cores_rounding(stochastic: bool, saturate: bool) -> None:
    assert "ipu_round_fp16" in device.load_host_operators()
    rng = np.random.default_rng(3)
    x = (rng.standard_normal([7, 300]) * np.logspace(-9, 5.2, 300)).astype(np.float32)
    x[0, :4] = [np.inf, -np.inf, np.nan, 70000.0]
    with fresh_programs() as (main, _startup, _scope):
        xv = paddle.static.data("x", [7, 300], "float32")
        seed = paddle.static.data("seed", [1], "int64")
        (out,) = paddle_api.run_custom_op("ipu_round_fp16", xv, seed, stochastic, saturate, 9)
        exe = paddle.static.Executor(paddle.CPUPlace())
        (got,) = exe.run(main, feed={"x": x, "seed": np.array([77], np.int64)}, fetch_list=[out])
    want = _core.round_fp16(x, stochastic=stochastic, saturate=saturate, seed=77, stream=9)
    np.testing.assert_array_equal(got, want)
