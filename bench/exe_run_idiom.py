"""Paddle 2.x's threaded idiom against plain exe.run, in one process, on a compute-heavy MLP.

Paddle 2.x scripts served requests from many threads, each calling ``exe.run`` on a
program compiled with ``enable_model_runtime_executor`` (the model runtime batches their
rows).  Three ways to answer 1-row requests, measured in the same run, in rounds that
alternate them (a ratio is fair only between runs made together on a shared machine):

- ``runtime``: ``--threads`` client threads calling ``exe.run`` on the program compiled
  with ``enable_model_runtime_executor`` (micro-batch ``--micro-batch``, ``timeout_ms``
  ``--timeout-ms``), each request one row;
- ``one``: one thread calling plain ``exe.run`` per request on the program compiled with
  micro-batch 1 (no model runtime);
- ``plain``: ``--threads`` threads calling plain ``exe.run`` on that micro-batch-1
  program (the executor runs them one at a time).

Every strategy is what a script writes (no option beyond those named above).  The
model is ``mlp512`` of tests/support/models.py (512-1024-1024-10, ReLU), where a run of
a full micro-batch costs a few times a 1-row run (printed: the batch's compute per row
is what batching saves).  Every mode's answer to a probe is checked against Paddle's
CPU executor first.  Printed: each round's requests/s, then the medians and the median
of the rounds' ratios runtime/one and runtime/plain (the target is 1.5x both), and
where each mode's CPU time goes per request (the client threads, the runtime's worker,
the engine's threads: /proc's per-thread counters).

    python bench/exe_run_idiom.py [--threads 16] [--micro-batch 16] [--timeout-ms 2]
        [--seconds 2] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


class Where:
    """Where a mode's CPU time went, in µs per request: the client threads (the
    exe.run call: hook, checks, hand-off, wake-up), the model runtime's worker thread
    (packing, the run's Python, scattering), and every other thread (the engine's:
    ONNX Runtime's pool)."""

    def __init__(self) -> None:
        self.clients = self.worker = self.rest = 0.0


def closed_loop(
    call: Callable[[np.ndarray], Any],
    clients: int,
    seconds: float,
    xs: list,
    where: Where | None = None,
) -> float:
    """Requests/s of ``clients`` threads each calling ``call`` back to back."""
    counts = [0] * clients
    stop = [0.0]
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    cpu = [0.0] * clients

    def client(c: int) -> None:
        try:
            barrier.wait()
            t0 = time.thread_time()
            i = c * 7919
            while time.perf_counter() < stop[0]:
                call(xs[i % len(xs)])
                i += 1
                counts[c] += 1
            cpu[c] = time.thread_time() - t0
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for th in threads:
        th.start()
    before = thread_cpu()
    stop[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    barrier.wait()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    after = thread_cpu()
    if errors:
        raise errors[0]
    if where is not None:
        n = max(sum(counts), 1)
        where.clients += sum(cpu) / n * 1e6  # (the client threads have ended)
        mine = {th.native_id for th in threads}
        workers = {
            th.native_id for th in threading.enumerate() if th.name == "paddle-ipu-model-runtime"
        }
        for tid, seconds in after.items():
            spent = (seconds - before.get(tid, 0.0)) / n * 1e6
            if tid in mine:
                continue
            elif tid in workers:
                where.worker += spent
            elif tid != threading.get_native_id():
                where.rest += spent
    return sum(counts) / wall


def median_ms(fn: Callable[[], Any], repeat: int = 300) -> float:
    for _ in range(30):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--timeout-ms", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=2.0, help="per mode and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import paddle
    from support.models import build

    import paddle_ipu

    paddle.enable_static()
    built = build("mlp512")
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))

    def compile_with(micro_batch: int, **options: Any) -> tuple[Any, Any]:
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=False, micro_batch_size=micro_batch)
        if options:
            s.set_options(options)
        cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
        return cp, cp.compile(built.feeds, built.fetches)

    cp1, prog1 = compile_with(1)
    cpr, progr = compile_with(
        args.micro_batch, enable_model_runtime_executor=True, timeout_ms=args.timeout_ms
    )
    cpb, _ = compile_with(args.micro_batch)  # the cost of a full micro-batch's run

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(1024)]

    def one(x: np.ndarray) -> Any:
        return exe.run(prog1, feed={"x": x}, fetch_list=prog1.fetch_names)

    def runtime(x: np.ndarray) -> Any:
        return exe.run(progr, feed={"x": x}, fetch_list=progr.fetch_names)

    # the oracle: Paddle's CPU executor on the original program
    for mode, call in (("one", one), ("runtime", runtime)):
        np.testing.assert_allclose(
            call(xs[0])[0], built.run_cpu({"x": xs[0]})[0], rtol=1e-4, atol=1e-5, err_msg=mode
        )
    full = np.concatenate(xs[: args.micro_batch])
    row_ms = median_ms(lambda: cp1.executor.run({"x": xs[0]}))
    batch_ms = median_ms(lambda: cpb.executor.run({"x": full}))
    print(
        f"{os.cpu_count()} CPUs; mlp512 (512-1024-1024-10); a {args.micro_batch}-row run "
        f"{batch_ms:.3f} ms = {batch_ms / row_ms:.2f}x a 1-row run ({row_ms:.3f} ms), "
        f"median of 300"
    )
    modes: dict[str, tuple[Callable[[np.ndarray], Any], int]] = {
        "runtime": (runtime, args.threads),
        "one": (one, 1),
        "plain": (one, args.threads),
    }
    for call, clients in modes.values():
        closed_loop(call, clients, 0.3, xs)  # warm
    rounds: dict[str, list[float]] = {m: [] for m in modes}
    where: dict[str, list[Where]] = {m: [] for m in modes}
    print(
        f"  round  runtime x{args.threads} (req/s)  one x1  plain x{args.threads}  "
        f"runtime/one  runtime/plain"
    )
    for r in range(args.rounds):
        for mode, (call, clients) in modes.items():
            where[mode].append(Where())
            rounds[mode].append(closed_loop(call, clients, args.seconds, xs, where[mode][-1]))
        rt, o, p = (rounds[m][-1] for m in ("runtime", "one", "plain"))
        print(f"  {r + 1:5d}  {rt:22.0f}  {o:6.0f}  {p:8.0f}  {rt / o:11.2f}  {rt / p:13.2f}")
    stats = rcpr.stats() if (rcpr := cpr.runtime) is not None else None
    med = {m: statistics.median(v) for m, v in rounds.items()}
    vs_one = statistics.median(a / b for a, b in zip(rounds["runtime"], rounds["one"]))
    vs_plain = statistics.median(a / b for a, b in zip(rounds["runtime"], rounds["plain"]))
    print(
        f"median of {args.rounds} rounds of {args.seconds:g} s: runtime {med['runtime']:.0f}, "
        f"one {med['one']:.0f}, plain {med['plain']:.0f} req/s"
    )
    if stats is not None:
        print(f"rows per runtime run: {stats.units / max(stats.runs, 1):.2f}")
    # CPU per request by thread: less moved by other processes than requests/s, and
    # it says whose time a mode spends (a request's Python, or the engine's compute).
    print("CPU µs per request (median of the rounds): clients, runtime worker, engine threads")
    for mode in modes:
        cells = [statistics.median(getattr(w, k) for w in where[mode]) for k in Where().__dict__]
        print(f"  {mode:8} {cells[0]:8.1f} {cells[1]:8.1f} {cells[2]:8.1f}")
    print(
        f"runtime / one exe.run per request: {vs_one:.2f}x; runtime / {args.threads} threads "
        f"of plain exe.run: {vs_plain:.2f}x (target >= 1.5x both)"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"rounds": rounds, "vs_one": vs_one, "vs_plain": vs_plain}, indent=1)
        )
    for cp in (cpr, cp1, cpb):
        cp.reset()


if __name__ == "__main__":
    main()
