"""Memory of a compile: peak RSS and retained RSS against the model's weight bytes.

    python bench/compile_memory.py [--sizes 64,256] [--training]

Each size runs in a fresh interpreter: it builds an inference model of a few big fc
layers holding about SIZE MiB of float32 weights, runs the startup program, and then
measures around ``IpuCompiledProgram.compile`` (which compiles and loads the graph on the
default backend):

- peak: the rise of the process's peak resident set (``VmHWM`` in /proc/self/status,
  reset just before compiling by writing 5 to /proc/self/clear_refs) over the resident
  set before compiling, divided by the weight bytes;
- child peak: the peak resident set of the converter's child process (``ru_maxrss`` of
  the reaped children) over this process's resident set before compiling (a forked
  child starts with the parent's pages mapped); it is a separate process, so it is
  reported on its own;
- retained: the resident set after dropping the compiled program (and returning freed
  heap to the system with ``malloc_trim``) over the resident set before compiling,
  divided by the weight bytes; "after 3" is the same after two more compile-and-drop
  cycles (memory that Paddle's allocator keeps for reuse shows in the first, and must
  not grow with the number of compiles).

The weights in the scope are counted in the baseline, not in any ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
from typing import Any

MIB = 1 << 20


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} is not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def build(size_mib: int, training: bool = False) -> tuple[Any, Any, Any, int]:
    """A model of four square fc layers holding ``size_mib`` MiB of float32 weights.

    Returns (main program, scope, output value, weight bytes)."""
    import numpy as np
    import paddle

    paddle.enable_static()
    width = int(np.sqrt(size_mib * MIB / 4 / 4))
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, width], "float32")
        h = x
        for _ in range(4):
            h = paddle.static.nn.fc(h, width, bias_attr=False)
        out = paddle.mean(h)
        if training:
            paddle.optimizer.SGD(0.01).minimize(out)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    nbytes = 4 * width * width * 4
    return main, scope, out, nbytes


def _compile(main: Any, scope: Any, out: Any, training: bool) -> tuple[Any, Any]:
    import paddle_ipu

    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=training, micro_batch_size=1)
    compiled = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    return compiled, compiled.compile(["x"], [out])


def measure(size_mib: int, training: bool = False) -> dict[str, float]:
    """Compile a ``size_mib`` model in this process; the ratios described above.

    A tiny model is compiled first, so that what every process pays once (loading
    ONNX Runtime, Paddle Inference's first predictor) is in the baseline."""
    tiny = build(1, training)
    compiled, prog = _compile(*tiny[:3], training)
    del compiled, prog, tiny
    main, scope, out, nbytes = build(size_mib, training)
    _trim()
    before = _status_kib("VmRSS") * 1024
    if not _reset_peak():
        raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs)")
    compiled, prog = _compile(main, scope, out, training)
    peak = _status_kib("VmHWM") * 1024
    loaded = _status_kib("VmRSS") * 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    del prog, compiled
    _trim()
    after = _status_kib("VmRSS") * 1024
    for _ in range(2):  # recompiles must not pile up
        compiled, prog = _compile(main, scope, out, training)
        del compiled, prog
    _trim()
    cycles = _status_kib("VmRSS") * 1024
    return {
        "weights_mib": nbytes / MIB,
        "peak": (peak - before) / nbytes,
        "loaded": (loaded - before) / nbytes,
        "retained": (after - before) / nbytes,
        "retained_3": (cycles - before) / nbytes,
        "child_peak": (child - before) / nbytes,
    }


def run_fresh(size_mib: int, training: bool = False) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter (peak RSS is per process)."""
    args = [sys.executable, os.path.abspath(__file__), "--child", str(size_mib)]
    if training:
        args.append("--training")
    env = dict(os.environ, GLOG_minloglevel="2")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256", help="weight MiB, comma separated")
    parser.add_argument("--training", action="store_true", help="compile with an optimizer")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.training)))
        return
    mode = "training" if args.training else "inference"
    print(f"compile memory ({mode}), ratios to the weight bytes, each size in a fresh process")
    print(
        f"{'weights':>10} {'peak':>7} {'loaded':>7} {'retained':>9} {'after 3':>8} "
        f"{'child peak':>11}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        r = run_fresh(size, args.training)
        print(
            f"{r['weights_mib']:>7.0f} MiB {r['peak']:>6.2f}x {r['loaded']:>6.2f}x "
            f"{r['retained']:>8.2f}x {r['retained_3']:>7.2f}x {r['child_peak']:>10.2f}x"
        )


if __name__ == "__main__":
    main()
