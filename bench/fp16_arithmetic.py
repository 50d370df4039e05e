"""The IPU's float16 arithmetic on the emulated IPU against float32, on the model zoo.

    python bench/fp16_arithmetic.py [--models resnet18,...] [--full] [--repeat 30] [--rounds 5]
    python bench/fp16_arithmetic.py --training [--models mlp,cnn,transformer]

For each model (tests/support/zoo_models.py, batch 1, one fresh process per
model, one thread), compiled for the host backend:

- ``fp32``: float32;
- ``fp16``: ``enable_fp16`` with the default ``host_fp16_arithmetic="float16"``: every
  operator's result rounded to float16 as the IPU rounds it;
- ``storage``: ``host_fp16_arithmetic="float32"``: float16 weights, float32 arithmetic;
- ``fp16 checks``: fp16 with ``enable_floating_point_checks`` (roundings after every
  operator of the compiled graph, and a flag per operator);
- ``fp32 checks``: fp32 with the checks;
- ``fp16 SR``: fp16 with ``enable_stochastic_rounding``;
- ``fp16 half``: fp16 with ``enable_half_partial``.

Each is timed as the user runs it (``exe.run`` of the compiled program on the ipu place)
and as the session alone (``session.run`` of the backend): every round times each
variant in turn (the median of ``--repeat`` calls), the ratios to fp32 are taken per
round, and the table gives the median over ``--rounds`` rounds.  ``fp32 off`` repeats
fp32 in the same round (its ratio to fp32 is the measurement's noise, and shows that
the checks off cost nothing: they are the same graph).

``--training`` times training steps instead (``exe.run`` of one step: forward,
backward, update), on bench/training.py's MLP and CNN and the zoo's transformer
classifier (Adam, batch 16), with the same variants but half partials (training with
float16 partials does not compile on the host).

``--where`` prints, for one model, where the fp16 session's time goes: ONNX Runtime's
profile of the graph it runs, by the operators the host added for the roundings against
the model's own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = (
    "resnet18,resnet50,vgg11,alexnet,mobilenet_v2,mobilenet_v3_large,densenet121,"
    "squeezenet1_0,shufflenet_v2_x1_0,googlenet,inception_v3,lstm,gru,transformer,"
    "unet_bilinear_scale"
)
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    "fp32": (False, {}),
    "fp32 off": (False, {"enable_floating_point_checks": False}),
    "fp16": (True, {}),
    "storage": (True, {"host_fp16_arithmetic": "float32"}),
    "fp16 checks": (True, {"enable_floating_point_checks": True}),
    "fp32 checks": (False, {"enable_floating_point_checks": True}),
    "fp16 SR": (True, {"enable_stochastic_rounding": True, "random_seed": 1}),
    "fp16 half": (True, {"enable_half_partial": True}),
}


def _median_ms(fn: Any, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def measure(name: str, full: bool, repeat: int, rounds: int) -> dict[str, Any]:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import paddle
    from support import zoo_models as Z

    import paddle_ipu

    size = Z.VISION[name][2] if full and name in Z.VISION else None
    model = Z.build(name, size=size, batch=1)
    feed = model.feed(seed=0)
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    runs: dict[str, Any] = {}
    sessions: dict[str, Any] = {}
    for key, (fp16, options) in VARIANTS.items():
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=False, micro_batch_size=1)
        s.set_precision_config(enable_fp16=fp16)
        s.set_options({"backend": "host", "host_num_threads": 1, **options})
        cp = paddle_ipu.IpuCompiledProgram(model.main, scope=model.scope, ipu_strategy=s)
        prog = cp.compile(model.feeds, [model.out])
        runs[key] = lambda prog=prog: exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
        session = cp.executor.session
        spec = cp.model.inputs[0]
        inputs = {spec.name: feed["x"]}
        sessions[key] = lambda session=session, inputs=inputs: session.run(inputs)
    result: dict[str, Any] = {"model": name, "exe": {}, "session": {}}
    with paddle.static.scope_guard(model.scope):
        for where, calls in (("exe", runs), ("session", sessions)):
            per_round: dict[str, list[float]] = {k: [] for k in calls}
            base: list[float] = []
            for _ in range(rounds):
                times = {k: _median_ms(fn, repeat) for k, fn in calls.items()}
                base.append(times["fp32"])
                for k, v in times.items():
                    per_round[k].append(v / times["fp32"])
            result[where] = {
                "fp32_ms": statistics.median(base),
                "ratios": {k: statistics.median(v) for k, v in per_round.items()},
            }
    return result


def measure_training(name: str, repeat: int, rounds: int) -> dict[str, Any]:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import numpy as np
    import paddle
    import training as T

    import paddle_ipu

    paddle.enable_static()
    batch = 16
    rng = np.random.default_rng(0)
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    steps: dict[str, Any] = {}
    for key, (fp16, options) in VARIANTS.items():
        if key == "fp16 half":
            continue
        main, scope, loss, feeds = T.build(name, batch)
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=True, micro_batch_size=batch)
        s.set_precision_config(enable_fp16=fp16)
        s.set_options({"backend": "host", "host_num_threads": 1, **options})
        cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
        prog = cp.compile(list(feeds), [loss])
        feed = T.make_feed(feeds, (batch,), rng)

        def step(prog: Any = prog, feed: Any = feed, scope: Any = scope) -> object:
            with paddle.static.scope_guard(scope):
                return exe.run(prog, feed=feed, fetch_list=prog.fetch_names)

        steps[key] = step
    per_round: dict[str, list[float]] = {k: [] for k in steps}
    base: list[float] = []
    for _ in range(rounds):
        times = {k: _median_ms(fn, repeat) for k, fn in steps.items()}
        base.append(times["fp32"])
        for k, v in times.items():
            per_round[k].append(v / times["fp32"])
    ratios = {k: statistics.median(v) for k, v in per_round.items()}
    ratios["fp16 half"] = float("nan")
    return {"model": name, "step": {"fp32_ms": statistics.median(base), "ratios": ratios}}


def where_time_goes(name: str, full: bool) -> None:
    """ONNX Runtime's profile of the fp16 graph: the rounding operators against the rest."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import onnx
    import onnxruntime as ort
    import paddle
    from support import zoo_models as Z

    from paddle_ipu.backends.base import SessionConfig
    from paddle_ipu.backends.host import fp16_graph, inference_graph
    from paddle_ipu.compiler import compile_program
    from paddle_ipu.compiler.weights import split_weights

    size = Z.VISION[name][2] if full and name in Z.VISION else None
    model = Z.build(name, size=size, batch=1)
    with paddle.static.scope_guard(model.scope):
        compiled = compile_program(model.main, model.feeds, [model.out], scope=model.scope)
    marker = inference_graph.IN_MEMORY
    proto, views = split_weights(compiled.onnx, compiled.weights, external=marker)
    feed = {compiled.inputs[0].name: model.feed(seed=0)["x"]}
    for label, fp16 in (("fp32", False), ("fp16", True)):
        plan = inference_graph.plan(proto, SessionConfig(enable_fp16=fp16))
        weights = {k: v.astype("float16") if fp16 else v for k, v in views.items()}
        graph, values = plan.proto, dict(weights)
        if plan.fused:
            graph, values = plan._optimized(values, 1)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.enable_profiling = True
        opts.log_severity_level = 3
        if plan.fused:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        data_less = {
            i.name for i in graph.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL
        }
        external = [n for n in values if n in data_less]
        if external:
            opts.add_external_initializers(
                external, [ort.OrtValue.ortvalue_from_numpy(values[n]) for n in external]
            )
        sess = ort.InferenceSession(
            graph.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        for _ in range(50):
            sess.run(None, feed)
        path = sess.end_profiling()
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        os.unlink(path)
        total: dict[str, float] = {}
        for e in events:
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            node = e["name"][: -len("_kernel_time")]
            kind = "rounding" if node.startswith(fp16_graph.MARK) else e["args"].get("op_name", "?")
            total[kind] = total.get(kind, 0.0) + e["dur"] / 50.0
        overall = sum(total.values())
        top = sorted(total.items(), key=lambda kv: -kv[1])[:6]
        parts = ", ".join(f"{k} {v / 1000:.3f} ms ({100 * v / overall:.0f} %)" for k, v in top)
        print(f"{name} {label}: {overall / 1000:.3f} ms in kernels: {parts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--full", action="store_true", help="full input sizes")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--where", help="profile one model: where the fp16 time goes")
    parser.add_argument("--training", action="store_true", help="time training steps")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.where:
        where_time_goes(args.where, args.full)
        return
    if args.child:
        if args.training:
            result = measure_training(args.child, args.repeat, args.rounds)
        else:
            result = measure(args.child, args.full, args.repeat, args.rounds)
        print(json.dumps(result))
        return
    if args.training and args.models == DEFAULT:
        args.models = "mlp,cnn,transformer"
    keys = [k for k in VARIANTS if k != "fp32" and not (args.training and k == "fp16 half")]
    what = "training steps, batch 16" if args.training else "batch 1"
    print(f"fp16 arithmetic against fp32 on the emulated IPU, {what}, "
          f"{'full size' if args.full else 'small inputs'}, one thread; ratios to fp32: "
          f"medians over {args.rounds} rounds of medians of {args.repeat} calls")  # fmt: skip
    header = "| model | where | fp32 ms | " + " | ".join(keys) + " |"
    print(header)
    print("|" + "---|" * (3 + len(keys)))
    env = dict(os.environ, GLOG_minloglevel="2", OMP_NUM_THREADS="1")
    for name in args.models.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name,
               "--repeat", str(args.repeat), "--rounds", str(args.rounds)]  # fmt: skip
        cmd += ["--full"] if args.full else []
        cmd += ["--training"] if args.training else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            print(f"| {name} | failed: {proc.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        for where in ("step",) if args.training else ("exe", "session"):
            row = r[where]
            cells = " | ".join(f"{row['ratios'][k]:.2f}x" for k in keys)
            print(f"| {name} | {where} | {row['fp32_ms']:.3f} | {cells} |")


if __name__ == "__main__":
    main()
