"""Small Paddle static programs shared by the tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle


@dataclass
class Built:
    main: Any
    startup: Any
    scope: Any
    feeds: list[str]
    fetches: list[Any]
    feed_shapes: dict[str, tuple[int, ...]]
    feed_dtypes: dict[str, str]

    def random_feed(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {}
        for name in self.feeds:
            shape = (batch, *self.feed_shapes[name])
            dtype = self.feed_dtypes[name]
            if dtype.startswith("int"):
                out[name] = rng.integers(0, 10, size=shape).astype(dtype)
            else:
                out[name] = rng.standard_normal(shape).astype(dtype)
        return out

    def run_cpu(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(self.scope):
            return [np.asarray(v) for v in exe.run(self.main, feed=feed, fetch_list=self.fetches)]


def _build(kind: str, seed: int = 7) -> Built:
    paddle.enable_static()
    paddle.seed(seed)
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        if kind == "mlp":
            x = paddle.static.data("x", [-1, 16], "float32")
            h = paddle.nn.functional.relu(paddle.static.nn.fc(x, 32))
            out = paddle.nn.functional.softmax(paddle.static.nn.fc(h, 10))
            shapes = {"x": (16,)}
        elif kind == "cnn":
            x = paddle.static.data("x", [-1, 1, 8, 8], "float32")
            conv = paddle.nn.Conv2D(1, 8, 3, padding=1)
            bn = paddle.nn.BatchNorm2D(8)
            fc = paddle.nn.Linear(8 * 4 * 4, 10)
            bn.eval()
            h = paddle.nn.functional.relu(bn(conv(x)))
            h = paddle.nn.functional.max_pool2d(h, 2)
            out = paddle.nn.functional.softmax(fc(paddle.flatten(h, 1)))
            shapes = {"x": (1, 8, 8)}
        elif kind == "transformer":
            x = paddle.static.data("x", [-1, 8, 32], "float32")
            layer = paddle.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
            enc = paddle.nn.TransformerEncoder(layer, 2)
            enc.eval()
            out = enc(x)
            shapes = {"x": (8, 32)}
        elif kind == "mlp512":  # where batching pays on a CPU (bench/serving.py)
            x = paddle.static.data("x", [-1, 512], "float32")
            h = paddle.nn.functional.relu(paddle.static.nn.fc(x, 1024))
            h = paddle.nn.functional.relu(paddle.static.nn.fc(h, 1024))
            out = paddle.static.nn.fc(h, 10)
            shapes = {"x": (512,)}
        elif kind == "double":  # a trivial model: the server's own cost
            x = paddle.static.data("x", [-1, 16], "float32")
            out = x * 2.0
            shapes = {"x": (16,)}
        else:
            raise ValueError(kind)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
    return Built(main, startup, scope, ["x"], [out], shapes, {"x": "float32"})


def build(kind: str, seed: int = 7) -> Built:
    """Build model ``kind`` ("mlp", "cnn", "transformer", "mlp512", "double") with
    initialised weights."""
    return _build(kind, seed)
