"""PopART's AdamNoBias and LambNoBias (``use_no_bias_optimizer``) on the emulated IPU,
against a numpy reference written from PopART's documented update rule
(willow/include/popart/adam.hpp: m and v without bias correction, x = m / (sqrt(v) +
eps) (+ wd * w with decoupled decay), Lamb's trust ratio min(||w||, max_weight_norm) /
||x||) and the analytic gradient of a linear least-squares model."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

import paddle_ipu  # noqa: F401

IN, OUT, BATCH, STEPS = 6, 3, 8, 4
LR, B1, B2, EPS, WD = 0.05, 0.9, 0.99, 1e-6, 0.1


def _reference(kind: str, w: np.ndarray, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    w = w.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for feed in batches:
        x, y = feed["x"].astype(np.float64), feed["y"].astype(np.float64)
        # loss = mean((x @ w - y)^2) over every element
        g = 2.0 * x.T @ (x @ w - y) / (BATCH * OUT)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        upd = m / (np.sqrt(v) + EPS)
        ratio = 1.0
        if kind == "lamb":
            upd = upd + WD * w
            r1, r2 = np.linalg.norm(w), np.linalg.norm(upd)
            phi = min(r1, 65504.0)
            ratio = phi / r2 if phi > 0 and r2 > 0 else 1.0
        w = w - ratio * LR * upd
    return w


def _optimizer(kind: str) -> Any:
    if kind == "adam":
        return paddle.optimizer.Adam(LR, beta1=B1, beta2=B2, epsilon=EPS)
    return paddle.optimizer.Lamb(LR, lamb_weight_decay=WD, beta1=B1, beta2=B2, epsilon=EPS)


@pytest.mark.parametrize("kind", ["adam", "lamb"])
def test_no_bias_optimizers_follow_poparts_rule(kind: str) -> None:
    rng = np.random.default_rng(12)
    batches = [
        {
            "x": rng.standard_normal([BATCH, IN]).astype(np.float32),
            "y": rng.standard_normal([BATCH, OUT]).astype(np.float32),
        }
        for _ in range(STEPS)
    ]
    with fresh_programs(seed=12) as (main, startup, scope):
        x = paddle.static.data("x", [BATCH, IN], "float32")
        y = paddle.static.data("y", [BATCH, OUT], "float32")
        w = paddle.create_parameter([IN, OUT], "float32")
        loss = paddle.mean(paddle.square(paddle.matmul(x, w) - y))
        _optimizer(kind).minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        w0 = np.array(scope.find_var(w.name).get_tensor())
        strategy = paddle.static.IpuStrategy()
        strategy.set_graph_config(num_ipus=1, is_training=True, micro_batch_size=BATCH)
        strategy.set_options({"use_no_bias_optimizer": True})
        compiled = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy)
        prog = compiled.compile(["x", "y"], [loss])
        for feed in batches:
            exe.run(prog, feed=feed, fetch_list=[loss])
        compiled.weights_to_host()
        got = np.array(scope.find_var(w.name).get_tensor())
    want = _reference(kind, w0, batches)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # the bias-corrected rule moves the weights elsewhere: the test can tell them apart
    assert not np.allclose(want, _reference_with_bias(kind, w0, batches), rtol=1e-3)


def _reference_with_bias(kind: str, w: np.ndarray, batches: list[dict[str, np.ndarray]]) -> Any:
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, feed in enumerate(batches, 1):
        x, y = feed["x"].astype(np.float64), feed["y"].astype(np.float64)
        g = 2.0 * x.T @ (x @ w - y) / (BATCH * OUT)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        upd = (m / (1 - B1**t)) / (np.sqrt(v / (1 - B2**t)) + EPS)
        if kind == "lamb":
            upd = upd + WD * w
            upd = upd * np.linalg.norm(w) / np.linalg.norm(upd)
        w = w - LR * upd
    return w
