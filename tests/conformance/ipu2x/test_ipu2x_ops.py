"""Single-op and small-model tests in the style of Paddle 2.x's test/ipu, written
against the 2.x names (paddle.static.IpuStrategy, IpuCompiledProgram, IPUPlace,
fetch by ``out.name``, the 2.x fp16 flow).  The oracle is Paddle's CPU executor."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest
from support.ipu2x_base import check, run_modes

paddle.enable_static()

rng = np.random.default_rng(2021)
X = rng.uniform(-1, 1, size=[2, 3, 8, 8]).astype(np.float32)


def _unary(fn: Any) -> Any:
    def build() -> tuple[list[str], list[str]]:
        x = paddle.static.data(name="x", shape=[2, 3, 8, 8], dtype="float32")
        out = fn(x)
        return [x.name], [out.name]

    return build


UNARY = {
    "relu": paddle.nn.functional.relu,
    "leaky_relu": lambda x: paddle.nn.functional.leaky_relu(x, 0.3),
    "scale": lambda x: paddle.scale(x, scale=2.0, bias=0.5),
    "softmax": lambda x: paddle.nn.functional.softmax(x, axis=-1),
    "reduce_mean": lambda x: paddle.mean(x, axis=[1, 2]),
    "transpose": lambda x: paddle.transpose(x, [0, 2, 3, 1]),
    "pool2d": lambda x: paddle.nn.functional.max_pool2d(x, 2),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op(name: str) -> None:
    check(run_modes(_unary(UNARY[name]), {"x": X}))


def _conv_bn_fc() -> tuple[list[str], list[str]]:
    x = paddle.static.data(name="x", shape=[2, 3, 8, 8], dtype="float32")
    conv = paddle.nn.Conv2D(3, 4, 3)(x)
    hidden = paddle.nn.functional.relu(conv)
    flat = paddle.flatten(hidden, 1)
    out = paddle.nn.Linear(4 * 6 * 6, 5)(flat)
    # Intermediate values fetched by name, as 2.x tests did.
    return [x.name], [conv.name, hidden.name, out.name]


def test_model_intermediates_by_name() -> None:
    check(run_modes(_conv_bn_fc, {"x": X}))


def _train(opt: str) -> Any:
    def build() -> tuple[list[str], list[str]]:
        x = paddle.static.data(name="x", shape=[2, 3, 8, 8], dtype="float32")
        label = paddle.static.data(name="label", shape=[2, 1], dtype="int64")
        out = paddle.nn.Linear(3 * 8 * 8, 4)(paddle.flatten(x, 1))
        loss = paddle.mean(paddle.nn.functional.cross_entropy(out, label, reduction="none"))
        optimizer = {
            "sgd": lambda: paddle.optimizer.SGD(0.1),
            "adam": lambda: paddle.optimizer.Adam(0.01),
            "momentum": lambda: paddle.optimizer.Momentum(0.1, momentum=0.9),
        }[opt]()
        optimizer.minimize(loss)
        return [x.name, label.name], [loss.name]

    return build


@pytest.mark.parametrize("opt", ["sgd", "adam", "momentum"])
def test_training_by_name(opt: str) -> None:
    feed = {"x": X, "label": rng.integers(0, 4, size=[2, 1]).astype(np.int64)}
    results = run_modes(_train(opt), feed, modes=("cpu", "ipu"), is_training=True, steps=5)
    # the loss moves (the weights were updated) and matches the CPU's step by step
    losses = [float(np.asarray(step[0]).reshape(-1)[0]) for step in results["cpu"]]
    assert losses[0] != losses[-1]
    check(results)


class _RisingLr(paddle.optimizer.lr.LRScheduler):
    def get_lr(self) -> float:
        return float(self.base_lr + 1e-3 * self.last_epoch)


def test_lr_scheduler_carried_by_compiled_program() -> None:
    def build() -> tuple[list[str], list[str]]:
        x = paddle.static.data(name="x", shape=[2, 3, 8, 8], dtype="float32")
        loss = paddle.mean(paddle.nn.Conv2D(3, 3, 3, bias_attr=False)(x))
        paddle.optimizer.SGD(learning_rate=_RisingLr(0.01)).minimize(loss)
        return [x.name], [loss.name]

    results = run_modes(build, {"x": X}, modes=("cpu", "ipu"), is_training=True, steps=8)
    check(results)
