"""A dygraph Layer trained through ``paddle_ipu.training_model`` against eager training
of the same Layer on the CPU, measured in the same run.

For an MLP (Linear-ReLU-Linear, cross entropy, Adam) at two sizes, the median time of
one training step: ``eager`` (forward, ``loss.backward()``, ``opt.step()``,
``opt.clear_grad()``, reading the loss) and ``training_model`` (one call: the compiled
graph's forward, backward and update on the emulated IPU, returning the loss).
Target: ratio (training_model / eager) <= 1.0.

    python bench/dygraph_training.py [--repeat 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import paddle

    paddle.disable_static()

    class MLP(paddle.nn.Layer):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.a = paddle.nn.Linear(width, width)
            self.b = paddle.nn.Linear(width, 10)

        def forward(self, x: Any, y: Any) -> Any:
            logits = self.b(paddle.nn.functional.relu(self.a(x)))
            return paddle.nn.functional.cross_entropy(logits, y, reduction="none").mean()

    print(f"{'model':<22}{'eager ms':>10}{'training_model ms':>19}{'ratio':>8}")
    for width, batch in ((64, 32), (512, 64)):
        e, i = _row(MLP, width, batch, args.repeat)
        print(f"{f'MLP {width} b{batch}':<22}{e:>10.3f}{i:>19.3f}{i / e:>8.2f}")


def _row(mlp: Any, width: int, batch: int, repeat: int) -> tuple[float, float]:
    """(eager ms, training_model ms) per step for one size."""
    import numpy as np
    import paddle

    import paddle_ipu

    rng = np.random.default_rng(0)
    x = rng.standard_normal([batch, width]).astype(np.float32)
    y = rng.integers(0, 10, [batch, 1]).astype(np.int64)
    paddle.seed(1)
    net = mlp(width)
    opt = paddle.optimizer.Adam(1e-3, parameters=net.parameters())
    xt, yt = paddle.to_tensor(x), paddle.to_tensor(y)

    def eager() -> None:
        loss = net(xt, yt)
        loss.backward()
        opt.step()
        opt.clear_grad()
        float(loss)

    paddle.seed(1)
    net2 = mlp(width)
    model = paddle_ipu.training_model(
        net2, paddle.optimizer.Adam(1e-3, parameters=net2.parameters())
    )

    def ipu() -> None:
        float(model(x, y))

    return _median_ms(eager, repeat), _median_ms(ipu, repeat)


if __name__ == "__main__":
    main()
