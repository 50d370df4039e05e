"""Server CPU per request of a model served as a fixed model (no Python per request),
as a dynamic one (a handler called once per request), as a model compiled per input
shape (its first request of a shape goes through the handler, the later ones run in
C++ on that shape's runtime), and as a package of sequence buckets (every request
padded to its bucket and cut back in C++).

``fixed`` and ``dynamic``: one small compiled model (a 16 -> 4 linear layer,
micro-batch 16, auto-batching with a 2 ms timeout) behind two runtimes (``fixed``: its
ModelRuntime's queue fed from C++; ``dynamic``: a RuntimeModel over another
ModelRuntime, the C++ front end handing each parsed request to its ``submit``).
``shaped``: a saved model whose feed ``x`` is ``[-1, -1]`` (an elementwise
``relu(0.5 x + 1)``), compiled per input shape (micro-batch 16, 2 ms), served through a
ShapeRuntime.  ``bucketed``: the same saved model compiled with sequence buckets 8 and
16, served through a BucketedRuntime, its requests ``[1, 12]`` (padded to 16, cut back
to 12).  ``wrk`` (Debian's package) posts a one-row ``[1, 16]`` JSON request (``[1, 12]``
to ``bucketed``) on ``--connections`` connections for ``--seconds`` to each in turn,
twice; the CPU is this process's (user + system, ``resource.getrusage``) over the run,
divided by the requests wrk completed.

    python bench/serving_dynamic.py [--connections 16] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
from pathlib import Path
from typing import Any


def _runtime() -> Any:
    import paddle

    import paddle_ipu
    from paddle_ipu.compiler import compile_program
    from paddle_ipu.executor import executor_for
    from paddle_ipu.serving.model_runtime import ModelRuntime

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 16], "float32")
        y = paddle.nn.Linear(16, 4)(x)
    paddle.static.Executor(paddle.CPUPlace()).run(startup)
    model = compile_program(
        main, ["x"], [y], scope=paddle.static.global_scope(), micro_batch_size=16
    )
    strategy = paddle_ipu.IpuStrategy()
    strategy.set_graph_config(is_training=False, micro_batch_size=16)
    return ModelRuntime(executor_for(model, strategy), timeout_ms=2.0)


def _shaped(directory: str, buckets: bool = False) -> Any:
    import paddle

    from paddle_ipu.serving.bucketed_runtime import runtime_for
    from paddle_ipu.serving.saved_model import compile_model

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, -1], "float32")
        y = paddle.nn.functional.relu(x * 0.5 + 1.0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    prefix = str(Path(directory) / ("bucketed" if buckets else "shaped"))
    paddle.static.save_inference_model(prefix, [x], [y], exe, program=main)
    if buckets:
        package, _ = compile_model(prefix, micro_batch_size=16, cache=False, seq_buckets=[8, 16])
    else:
        package, _ = compile_model(
            prefix, micro_batch_size=16, cache=False, input_shapes=[{"x": [-1, 16]}]
        )
    return runtime_for(package, timeout_ms=2.0)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    from paddle_ipu.serving.dynamic import RuntimeModel
    from paddle_ipu.serving.server import InferenceServer

    server = InferenceServer(_runtime(), name="fixed", port=0, threads=1)
    server.add_model(RuntimeModel(_runtime()), "dynamic", queue_limit=1024)
    work = tempfile.mkdtemp()
    server.add_model(_shaped(work), "shaped", queue_limit=1024)
    server.add_model(_shaped(work, buckets=True), "bucketed", queue_limit=1024)
    server.start()

    def request(length: int) -> str:
        x = {"name": "x", "shape": [1, length], "datatype": "FP32", "data": [0.5] * length}
        return json.dumps({"inputs": [x]})

    body = request(16)
    # The shape's first request (through the handler: it makes the shape's runtime).
    first = subprocess.run(
        ["curl", "-sf", "-d", body, f"http://127.0.0.1:{server.port}/v2/models/shaped/infer"],
        capture_output=True,
        text=True,
    )
    if first.returncode != 0:
        raise RuntimeError(f"shaped: the first request failed: {first.stderr}")
    scripts = {}
    for length in (12, 16):
        scripts[length] = Path(work) / f"post{length}.lua"
        scripts[length].write_text(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(request(length))}\n"
        )
    print(f"{'model':>8} {'req/s':>9} {'CPU µs/req':>11}")
    try:
        for name in ("fixed", "dynamic", "shaped", "bucketed") * 2:
            script = scripts[12 if name == "bucketed" else 16]
            url = f"http://127.0.0.1:{server.port}/v2/models/{name}/infer"
            before = _cpu()
            load = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds:g}s"]
            out = subprocess.run(
                [*load, "-s", str(script), url], capture_output=True, text=True, check=True
            ).stdout
            cpu = _cpu() - before
            requests = int(next(ln for ln in out.splitlines() if "requests in" in ln).split()[0])
            if "Non-2xx" in out:
                raise RuntimeError(f"{name}: wrk saw errors:\n{out}")
            print(f"{name:>8} {requests / args.seconds:>9.0f} {cpu / requests * 1e6:>11.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
