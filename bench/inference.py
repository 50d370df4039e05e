"""Inference on the emulated IPU against its peers, measured in the same run.

For a CNN and a two-layer transformer encoder at batch 1, 8 and 64, the median
time per call of:

- ``ipu exe.run``: Paddle's ``exe.run`` of the compiled program on the "ipu" place;
- ``cpu exe.run``: Paddle's ``exe.run`` of the original program on the CPU;
- ``paddle.inference``: a Paddle Inference predictor of the same program;
- ``executor``: paddle-ipu's own numpy-in / numpy-out API;
- ``raw ORT``: ONNX Runtime running the same ONNX model directly.

Ratios: cpu exe.run / ipu exe.run (target >= 2 at batch 1 to 8) and executor /
raw ORT (target <= 1.15).  Also the cold compile time of the CNN (fresh process,
target <= 2 s).

    python bench/inference.py [--repeat 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(max(3, repeat // 10)):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def paddle_inference_predictor(built: object, threads: int) -> Callable[[np.ndarray], object]:
    import paddle
    import paddle.inference as pi

    tmp = tempfile.mkdtemp(prefix="pipu-bench-")
    prefix = os.path.join(tmp, "model")
    with paddle.static.scope_guard(built.scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        x = [op.result(0) for op in built.main.global_block().ops if op.name() == "pd_op.data"]
        paddle.static.save_inference_model(prefix, x, built.fetches, exe, program=built.main)
    config = pi.Config(prefix + ".json", prefix + ".pdiparams")
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(threads)
    config.disable_glog_info()
    predictor = pi.create_predictor(config)
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    out = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(batch: np.ndarray) -> object:
        handle.reshape(batch.shape)
        handle.copy_from_cpu(batch)
        predictor.run()
        return out.copy_to_cpu()

    return run


def cold_compile_seconds() -> float:
    code = (
        "import time, paddle, paddle_ipu\nfrom support import models\n"
        "b = models.build('cnn')\n"
        "s = paddle_ipu.IpuStrategy()\n"
        "s.set_graph_config(is_training=False, micro_batch_size=8)\n"
        "t = time.perf_counter()\n"
        "paddle_ipu.IpuCompiledProgram(b.main, scope=b.scope, ipu_strategy=s)"
        ".compile(['x'], b.fetches)\n"
        "print(time.perf_counter() - t)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent / "tests"))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=True,
    )
    return float(proc.stdout.strip().splitlines()[-1])


def measure(kind: str, batch: int, args: argparse.Namespace) -> tuple[object, ...]:
    """One row: the five ways of running ``kind`` at ``batch``."""
    import onnxruntime as ort
    import paddle
    from support import models

    import paddle_ipu

    built = models.build(kind)
    feed = built.random_feed(batch, np.random.default_rng(0))
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=batch)
    s.set_options({"host_num_threads": args.threads})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    prog = cp.compile(["x"], built.fetches)
    ipu_exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    cpu_exe = paddle.static.Executor(paddle.CPUPlace())
    predictor = paddle_inference_predictor(built, args.threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    raw = ort.InferenceSession(cp.model.onnx, so, providers=["CPUExecutionProvider"])
    raw_out = [o.name for o in raw.get_outputs()]
    raw_feed = {cp.model.inputs[0].name: feed["x"]}

    with paddle.static.scope_guard(built.scope):
        t_ipu = median_ms(
            lambda: ipu_exe.run(prog, feed=feed, fetch_list=prog.fetch_names), args.repeat
        )
        t_cpu = median_ms(
            lambda: cpu_exe.run(built.main, feed=feed, fetch_list=built.fetches), args.repeat
        )
    t_inf = median_ms(lambda: predictor(feed["x"]), args.repeat)
    t_exec = median_ms(lambda: cp.run(feed), args.repeat)
    t_raw = median_ms(lambda: raw.run(raw_out, raw_feed), args.repeat)
    cp.reset()
    return (kind, batch, t_ipu, t_cpu, t_inf, t_exec, t_raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--models", default="cnn,transformer")
    args = parser.parse_args()

    import paddle

    paddle.enable_static()
    rows = [
        measure(kind, int(batch), args)
        for kind in args.models.split(",")
        for batch in args.batches.split(",")
    ]

    header = (
        f"{'model':<12}{'batch':>6}{'ipu exe.run':>13}{'cpu exe.run':>13}"
        f"{'paddle.inf':>12}{'executor':>10}{'raw ORT':>10}{'cpu/ipu':>9}{'exec/ORT':>10}"
    )
    print(f"median ms per call, {args.repeat} calls, {args.threads} thread(s)")
    print(header)
    for kind, batch, t_ipu, t_cpu, t_inf, t_exec, t_raw in rows:
        print(
            f"{kind:<12}{batch:>6}{t_ipu:>13.3f}{t_cpu:>13.3f}{t_inf:>12.3f}{t_exec:>10.3f}"
            f"{t_raw:>10.3f}{t_cpu / t_ipu:>9.2f}{t_exec / t_raw:>10.2f}"
        )
    print(f"cold compile of the CNN (fresh process): {cold_compile_seconds():.2f} s")


if __name__ == "__main__":
    main()
