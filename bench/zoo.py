"""The model zoo on the emulated IPU: compiles, error against Paddle's CPU, speed, memory.

    python bench/zoo.py [--models resnet18,vgg11,...] [--full] [--repeat 20]

Each model runs in a fresh interpreter (peak RSS is per process).  Per model:
whether fp32 and fp16 compile and run; the largest absolute error over the largest
reference magnitude against Paddle's CPU executor, from the same weights; the median
time per call of the compiled program (``exe.run`` on the ipu place), of Paddle's
``exe.run`` on the CPU and of ``paddle.inference`` (one thread each where the engine
allows); the fp32 compile time (``IpuCompiledProgram.compile``); the rise of peak RSS
during that compile (``VmHWM`` reset through /proc/self/clear_refs) and its ratio to
the weight bytes (for models of a few kB of weights that ratio measures the
compiler's own working memory, not the weights); and the peak of the converter's child
process (paddle2onnx runs in a forked child, so one crash cannot take the caller down:
``ru_maxrss`` of the reaped children, in MB) and the ratio of its rise over this
process's resident set before compiling to the weight bytes ("-" where it stays below:
a forked child counts only the parent's pages it touches), reported on its own because
it is another process.  ``--full`` uses each model's full
input size (224x224, 299 for inception_v3) instead of the zoo tier's small one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = (
    "resnet18,resnet50,vgg11,alexnet,mobilenet_v2,mobilenet_v3_large,densenet121,"
    "squeezenet1_0,shufflenet_v2_x1_0,googlenet,inception_v3,lstm,gru,transformer,"
    "unet_bilinear_scale"
)


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _median_ms(fn: Any, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def _inference_ms(model: Any, feed: dict[str, Any], repeat: int) -> float:
    import paddle
    import paddle.inference as pi

    with tempfile.TemporaryDirectory() as d, paddle.static.scope_guard(model.scope):
        prefix = os.path.join(d, "m")
        x = model.main.global_block().ops[0].result(0)
        for op in model.main.global_block().ops:
            if op.name() == "pd_op.data" and op.attrs()["name"] == "x":
                x = op.result(0)
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.static.save_inference_model(prefix, [x], [model.out], exe, program=model.main)
        config = pi.Config(prefix + ".json", prefix + ".pdiparams")
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(1)
        config.disable_glog_info()
        predictor = pi.create_predictor(config)
        handle = predictor.get_input_handle(predictor.get_input_names()[0])
        out = predictor.get_output_handle(predictor.get_output_names()[0])

        def call() -> None:
            handle.copy_from_cpu(feed["x"])
            predictor.run()
            out.copy_to_cpu()

        return _median_ms(call, repeat)


def measure(name: str, full: bool, repeat: int) -> dict[str, Any]:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import paddle
    from support import zoo_models as Z

    size = Z.VISION[name][2] if full and name in Z.VISION else None
    model = Z.build(name, size=size, batch=1)
    feed = model.feed(seed=0)
    ref = Z.run_cpu(model, feed)
    row: dict[str, Any] = {"model": name, "weights_mb": model.weight_bytes() / 1e6}
    # fp32: compile time and peak memory, then accuracy and speed
    Z.compile_ipu(Z.build("LeNet"))  # one-time costs (ONNX Runtime load) in the baseline
    before = _status_kib("VmRSS") * 1024
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    t = time.perf_counter()
    try:
        _, prog = Z.compile_ipu(model)
    except Exception as exc:  # the table reports it
        row["fp32"] = f"{type(exc).__name__}: {str(exc)[:80]}"
        return row
    row["compile_s"] = time.perf_counter() - t
    peak = _status_kib("VmHWM") * 1024 - before
    row["peak_mb"] = peak / 1e6
    row["peak_ratio"] = peak / max(model.weight_bytes(), 1)
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    row["child_mb"] = child / 1e6
    # a forked child maps the parent's pages but counts only those it touches: for a
    # small model its peak stays below the parent's resident set, and no rise shows
    rise = child - before
    row["child_ratio"] = rise / model.weight_bytes() if rise > 0 and model.weight_bytes() else None
    got = Z.run_ipu(model, prog, feed)
    row["fp32"] = Z.rel_error(got, ref)
    ipu = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    cpu = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(model.scope):
        row["ipu_ms"] = _median_ms(
            lambda: ipu.run(prog, feed=feed, fetch_list=prog.fetch_names), repeat
        )
        row["exe_ms"] = _median_ms(
            lambda: cpu.run(model.main, feed=feed, fetch_list=[model.out]), repeat
        )
    try:
        row["infer_ms"] = _inference_ms(model, feed, repeat)
    except Exception as exc:  # Paddle Inference's own failures are reported, not ours
        row["infer_ms"] = None
        row["infer_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    t = time.perf_counter()
    try:
        _, prog16 = Z.compile_ipu(model, fp16=True)
        row["fp16"] = Z.rel_error(Z.run_ipu(model, prog16, feed), ref)
        row["compile16_s"] = time.perf_counter() - t
    except Exception as exc:
        row["fp16"] = f"{type(exc).__name__}: {str(exc)[:80]}"
    return row


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, float) else str(v if v is not None else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--full", action="store_true", help="full input sizes")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.full, args.repeat)))
        return
    cols = (
        f"{'model':<22}{'MB':>7}{'fp32 err':>10}{'fp16 err':>10}{'ipu ms':>9}{'exe.run':>9}"
        f"{'p.infer':>9}{'compile s':>10}{'fp16 s':>8}{'peak MB':>9}{'xW':>6}"
        f"{'child MB':>9}{'xW':>6}"
    )
    print(f"model zoo, batch 1, {'full size' if args.full else 'small inputs'}, "
          f"median of {args.repeat} calls; one fresh process per model")  # fmt: skip
    print(cols)
    env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS="1")
    for name in args.models.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--repeat",
               str(args.repeat)] + (["--full"] if args.full else [])  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            print(f"{name:<22} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        err32 = r.get("fp32")
        if isinstance(err32, str):
            print(f"{name:<22}{r['weights_mb']:>7.1f}  fp32 does not compile: {err32}")
            continue
        err16 = r.get("fp16")
        print(
            f"{name:<22}{r['weights_mb']:>7.1f}{err32:>10.1e}"
            f"{(format(err16, '.1e') if isinstance(err16, float) else 'fails'):>10}"
            f"{r['ipu_ms']:>9.2f}{r['exe_ms']:>9.2f}{_fmt(r['infer_ms'], '.2f'):>9}"
            f"{r['compile_s']:>10.2f}{_fmt(r.get('compile16_s'), '.2f'):>8}"
            f"{r['peak_mb']:>9.0f}{r['peak_ratio']:>6.2f}"
            f"{r['child_mb']:>9.0f}{_fmt(r['child_ratio'], '.2f'):>6}"
        )
        if r.get("infer_error"):
            print(f"{'':<22}paddle.inference failed: {r['infer_error']}")


if __name__ == "__main__":
    main()
