"""Training on the emulated IPU against Paddle's own CPU training, measured in the same run.

For an MLP and a small CNN (with BatchNorm), and with ``--models`` Paddle's resnet18 on
96x96 images (``resnet18``) or the zoo tier's TransformerEncoder classifier with an
Embedding (``transformer``, tests/support/zoo_models.py), all trained with Adam, the median
time of:

- ``ipu exe.run``: Paddle's ``exe.run`` of the compiled program on the "ipu" place (one
  training step: every micro-batch, then one update);
- ``cpu exe.run``: Paddle's ``exe.run`` of the original program (forward, backward and
  optimizer) on the CPU, one micro-batch.

Rows: af=1 rf=1 (ratio = ipu step / cpu step, target <= 1.3), and af=4 and rf=2, where the
ratio is per micro-batch (ipu step / (af * rf)) against one CPU step of one micro-batch.

A second table times the plain program (no IpuCompiledProgram) run by ``exe.run`` on the
"ipu" place, which compiles it implicitly and keeps the scope's weights current after
every step, against the same program on the CPU (target: ratio <= 1.0).

    python bench/training.py [--repeat 200] [--batch 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def paired_median_ms(
    a: Callable[[], object], b: Callable[[], object], repeat: int
) -> tuple[float, float]:
    """Median ms of ``a`` and of ``b``, calls interleaved so both see the same machine."""
    for _ in range(max(3, repeat // 10)):
        a()
        b()
    times_a, times_b = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        a()
        times_a.append(time.perf_counter() - t)
        t = time.perf_counter()
        b()
        times_b.append(time.perf_counter() - t)
    return statistics.median(times_a) * 1e3, statistics.median(times_b) * 1e3


FeedSpec = dict[str, tuple[Any, ...]]


def build(kind: str, batch: int = 16) -> tuple[Any, Any, Any, FeedSpec]:
    """(main program, scope, loss, feed name -> (per-sample shape, dtype[, integer
    bound])).  ``batch`` is used by the zoo models, whose programs fix it."""
    import paddle

    if kind == "transformer":
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from support import zoo_models as Z

        model = Z.build(kind, batch=batch, train=True)
        inner = model.x_shape[1:]
        specs: FeedSpec = {
            "x": (inner, model.x_dtype, 50),
            "label": ((1,), "int64", model.label_classes),
        }
        return model.main, model.scope, model.loss, specs
    paddle.seed(1)
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        label = paddle.static.data("label", [-1, 1], "int64")
        if kind == "mlp":
            x = paddle.static.data("x", [-1, 64], "float32")
            h = paddle.nn.functional.relu(paddle.static.nn.fc(x, 128))
            h = paddle.nn.functional.relu(paddle.static.nn.fc(h, 64))
            logits = paddle.static.nn.fc(h, 10)
            feeds: FeedSpec = {"x": ((64,), "float32")}
        elif kind == "resnet18":
            x = paddle.static.data("x", [-1, 3, 96, 96], "float32")
            logits = paddle.vision.models.resnet18(num_classes=10)(x)
            feeds = {"x": ((3, 96, 96), "float32")}
        else:
            x = paddle.static.data("x", [-1, 1, 16, 16], "float32")
            h = paddle.nn.Conv2D(1, 8, 3, padding=1)(x)
            h = paddle.nn.functional.relu(paddle.nn.BatchNorm2D(8)(h))
            h = paddle.nn.functional.max_pool2d(h, 2)
            h = paddle.nn.functional.relu(paddle.nn.Conv2D(8, 16, 3, padding=1)(h))
            h = paddle.nn.functional.max_pool2d(h, 2)
            logits = paddle.nn.Linear(16 * 4 * 4, 10)(paddle.flatten(h, 1))
            feeds = {"x": ((1, 16, 16), "float32")}
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label, reduction="none"))
        paddle.optimizer.Adam(1e-3).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    feeds["label"] = ((1,), "int64")
    return main, scope, loss, feeds


def make_feed(
    feeds: FeedSpec, lead: tuple[int, ...], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    out = {}
    for name, (shape, dtype, *bound) in feeds.items():
        if dtype == "int64":
            high = bound[0] if bound else 10
            out[name] = rng.integers(0, high, size=(*lead, *shape)).astype(dtype)
        else:
            out[name] = rng.standard_normal((*lead, *shape)).astype(dtype)
    return out


def bench_model(kind: str, batch: int, repeat: int, configs: list[tuple[int, int]]) -> list[str]:
    import paddle

    import paddle_ipu

    rng = np.random.default_rng(0)
    cpu_main, cpu_scope, cpu_loss, feeds = build(kind, batch)
    cpu = paddle.static.Executor(paddle.CPUPlace())
    cpu_feed = make_feed(feeds, (batch,), rng)

    def cpu_step() -> object:
        with paddle.static.scope_guard(cpu_scope):
            return cpu.run(cpu_main, feed=cpu_feed, fetch_list=[cpu_loss])

    rows = []
    ipu = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    for af, rf in configs:
        main, scope, loss, feeds = build(kind, batch)
        st = paddle_ipu.IpuStrategy()
        st.set_graph_config(num_ipus=rf, is_training=True, micro_batch_size=batch)
        if af > 1:
            st.set_pipelining_config(enable_gradient_accumulation=True, accumulation_factor=af)
        if rf > 1:
            st.set_options({"enable_replicated_graphs": True, "replicated_graph_count": rf})
        prog = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=st).compile(
            list(feeds), [loss]
        )
        lead = (*(n for n in (af, rf) if n > 1), batch)
        feed = make_feed(feeds, lead, rng)

        def ipu_step(prog: Any = prog, feed: Any = feed, scope: Any = scope) -> object:
            with paddle.static.scope_guard(scope):
                return ipu.run(prog, feed=feed, fetch_list=prog.fetch_names)

        step_ms, cpu_ms = paired_median_ms(ipu_step, cpu_step, repeat)
        per_micro = step_ms / (af * rf)
        rows.append(
            f"| {kind} | {batch} | {af} | {rf} | {step_ms:.3f} | {per_micro:.3f} | {cpu_ms:.3f} "
            f"| {per_micro / cpu_ms:.2f}x |"
        )
    return rows


def bench_implicit(kind: str, batch: int, repeat: int) -> str:
    """One step of the plain program on the ipu place against the CPU."""
    import paddle

    import paddle_ipu  # noqa: F401 - routes exe.run on the ipu place

    rng = np.random.default_rng(0)
    cpu_main, cpu_scope, cpu_loss, feeds = build(kind, batch)
    main, scope, loss, _ = build(kind, batch)
    feed = make_feed(feeds, (batch,), rng)
    cpu = paddle.static.Executor(paddle.CPUPlace())
    ipu = paddle.static.Executor(paddle.CustomPlace("ipu", 0))

    def cpu_step() -> object:
        with paddle.static.scope_guard(cpu_scope):
            return cpu.run(cpu_main, feed=feed, fetch_list=[cpu_loss])

    def ipu_step() -> object:
        with paddle.static.scope_guard(scope):
            return ipu.run(main, feed=feed, fetch_list=[loss])

    ipu_ms, cpu_ms = paired_median_ms(ipu_step, cpu_step, repeat)
    return f"| {kind} | {batch} | {ipu_ms:.3f} | {cpu_ms:.3f} | {ipu_ms / cpu_ms:.2f}x |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="micro-batch size")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads (both sides)")
    parser.add_argument("--models", default="mlp,cnn", help="mlp, cnn, resnet18, transformer")
    parser.add_argument(
        "--configs", default="1x1,4x1,1x2", help="af x rf of the compiled rows, comma separated"
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("GLOG_minloglevel", "2")
    import paddle

    paddle.enable_static()
    print(
        "| model | micro-batch | af | rf | ipu step ms | ipu ms / micro-batch "
        "| cpu step ms | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind in args.models.split(","):
        configs = [(int(c.split("x")[0]), int(c.split("x")[1])) for c in args.configs.split(",")]
        for row in bench_model(kind, args.batch, args.repeat, configs):
            print(row, flush=True)
    print("ratio: ipu ms per micro-batch / cpu ms per step (target <= 1.3 at af=1 rf=1)")
    print()
    print("| model (plain program) | batch | ipu-place exe.run ms | cpu exe.run ms | ratio |")
    print("|---|---|---|---|---|")
    for kind in args.models.split(","):
        print(bench_implicit(kind, args.batch, args.repeat), flush=True)
    print("ratio: plain program on the ipu place / on the CPU (target <= 1.0)")


if __name__ == "__main__":
    main()
