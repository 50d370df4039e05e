"""Serving a model of tests/models.py (default: the CNN) to concurrent clients: the
model runtime's auto-batching against one exe.run per request, in the same run.

N client threads each send requests of one row, one after another (a closed loop:
a client sends its next request when the previous one is answered), through
Paddle's ``exe.run`` on the "ipu" place:

- ``no batching``: the model compiled with micro_batch_size 1; each request is its own
  ``exe.run``.  The device runs one program at a time, so calls are serialised by a
  lock (as one IPU would serve them).
- ``model runtime``: the model compiled with micro_batch_size M and the model runtime
  on (``enable_model_runtime_executor``, ``timeout_ms`` T); concurrent ``exe.run``
  calls are packed into micro-batches by the runtime's worker.

Printed: throughput (requests/s), p50 and p95 latency per request, graph runs and
rows per run, the throughput ratio, and the cost of the runtime's Python queue
(per-request overhead with whole micro-batches and no waiting, and the share of
the wall time the worker spends in the graph).

    python bench/serving.py [--model cnn] [--clients 16] [--requests 200] [--micro-batch 8]
                            [--timeout-ms 2] [--threads 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def compile_model(built: Any, mbs: int, serving: bool, timeout_ms: float, threads: int) -> Any:
    import paddle_ipu

    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=mbs)
    s.set_options(
        {
            "enable_model_runtime_executor": serving,
            "timeout_ms": timeout_ms,
            "host_num_threads": threads,
        }
    )
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    prog = cp.compile(built.feeds, built.fetches)
    return cp, prog


def serve(
    call: Callable[[np.ndarray], Any], clients: int, per_client: int, rows: np.ndarray
) -> tuple[float, list[float]]:
    """Run the closed loop; return (wall seconds, latencies in seconds)."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client(c: int) -> None:
        try:
            start.wait()
            mine = latencies[c]
            for i in range(per_client):
                x = rows[(c * per_client + i) % len(rows)][None]
                t = time.perf_counter()
                call(x)
                mine.append(time.perf_counter() - t)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for th in threads:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, [x for per in latencies for x in per]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", choices=("cnn", "transformer", "mlp"))
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--timeout-ms", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=0, help="host backend threads (0: all)")
    args = parser.parse_args()

    import paddle
    from models import build

    paddle.enable_static()
    built = build(args.model)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((1024, *built.feed_shapes["x"])).astype(np.float32)
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))

    # -- no batching: one exe.run of a micro-batch-1 program per request --------
    cp1, prog1 = compile_model(built, 1, False, 0.0, args.threads)
    device = threading.Lock()

    def one_by_one(x: np.ndarray) -> Any:
        with device:
            return exe.run(prog1, feed={"x": x}, fetch_list=prog1.fetch_names)

    for i in range(50):
        one_by_one(rows[i][None])

    # -- the model runtime -------------------------------------------------------
    cpm, progm = compile_model(built, args.micro_batch, True, args.timeout_ms, args.threads)

    def batched(x: np.ndarray) -> Any:
        return exe.run(progm, feed={"x": x}, fetch_list=progm.fetch_names)

    for _ in range(50):
        batched(rows[: args.micro_batch])

    # the answers agree with each other (and each client got its own row)
    probe = rows[:5]
    want = np.concatenate([one_by_one(r[None])[0] for r in probe])
    np.testing.assert_allclose(batched(probe)[0], want, rtol=1e-5, atol=1e-6)

    results = []
    wall, lat = serve(one_by_one, args.clients, args.requests, rows)
    n = len(lat)
    results.append(("no batching (mbs 1)", n, n / wall, pct(lat, 0.5), pct(lat, 0.95), n, 1.0))
    before = cpm.runtime.stats()
    wall_m, lat = serve(batched, args.clients, args.requests, rows)
    after = cpm.runtime.stats()
    runs = after.runs - before.runs
    units = after.units - before.units
    busy = after.busy_seconds - before.busy_seconds
    label = f"model runtime (mbs {args.micro_batch}, {args.timeout_ms:g} ms)"
    results.append((label, n, n / wall_m, pct(lat, 0.5), pct(lat, 0.95), runs, units / runs))

    # -- the queue's own cost: whole micro-batches, one client, nothing to wait for
    block = rows[: args.micro_batch]
    executor = cpm.executor
    direct = statistics.median(_times(lambda: executor.run({"x": block}), 300))
    queued = statistics.median(_times(lambda: cpm.runtime.run({"x": block}), 300))
    cp1.reset()
    cpm.reset()

    print(
        f"{args.model} of tests/models.py, {args.clients} clients x {args.requests} requests "
        f"of 1 row, "
        f"host backend threads={args.threads or 'all'}"
    )
    print(f"{'mode':36} {'req/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'runs':>7} {'rows/run':>9}")
    for label, _, rps, p50, p95, r, per_run in results:
        print(f"{label:36} {rps:9.0f} {p50:8.2f} {p95:8.2f} {r:7d} {per_run:9.2f}")
    print(
        f"throughput ratio (model runtime / no batching): {results[1][2] / results[0][2]:.2f}x; "
        f"p95 ratio: {results[1][4] / results[0][4]:.2f}x"
    )
    print(
        f"queue cost: runtime.run of a whole micro-batch {queued * 1e6:.0f} us vs executor.run "
        f"{direct * 1e6:.0f} us (+{(queued - direct) * 1e6:.0f} us per request); the worker "
        f"spent {100 * busy / wall_m:.0f}% of the serving wall time inside the graph"
    )


def _times(fn: Callable[[], Any], repeat: int) -> list[float]:
    for _ in range(20):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


if __name__ == "__main__":
    main()
