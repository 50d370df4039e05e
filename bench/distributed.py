"""Data-parallel training across processes on this machine: paddle-ipu's host backend
(``enable_distribution`` under Paddle's launcher) against Paddle's own ``DataParallel``
(dygraph, gloo on the CPU) training the same MLP on the same job batch with Adam,
measured in the same run.

For 1 and 2 processes (``--nproc_per_node``), each process training on its share of the
job's batch, the median ms of one training step (rank 0's), and the cost of the
gradient all-reduce per step: paddle-ipu's (packing into one buffer included) against a
bare ``paddle.distributed.all_reduce`` of a buffer of the weights' bytes (Paddle's gloo,
no training around it).  Runs alternate between the systems and process counts, and the
table shows the median over ``--repeat`` launches of each.

    python bench/distributed.py [--repeat 3] [--steps 60] [--batch 64] [--widths 256,1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

IN, OUT, DEPTH = 64, 10, 3


def _batches(steps: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((batch, IN), dtype=np.float32),
         rng.standard_normal((batch, OUT), dtype=np.float32))
        for _ in range(steps)
    ]  # fmt: skip


def _mine(rows: np.ndarray, rank: int, count: int) -> np.ndarray:
    size = len(rows) // count
    return rows[rank * size : (rank + 1) * size]


def _bare_all_reduce_ms(elements: int, repeat: int = 20) -> float:
    """Paddle's own all-reduce of ``elements`` float32 (dygraph, the default group)."""
    import paddle
    import paddle.distributed as dist

    from paddle_ipu._internals.paddle_dist import dygraph_mode

    with dygraph_mode():
        tensor = paddle.ones([elements], dtype="float32")
        dist.all_reduce(tensor)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def worker_ipu(args: argparse.Namespace) -> dict[str, Any]:
    import paddle

    import paddle_ipu
    import paddle_ipu.distributed as ipu_dist
    from paddle_ipu.backends.host.replica_group import ReplicaGroup

    job = ipu_dist.job()
    paddle.enable_static()
    paddle.seed(1)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, IN], "float32")
        y = paddle.static.data("y", [-1, OUT], "float32")
        h = x
        for _ in range(DEPTH):
            h = paddle.nn.functional.relu(paddle.static.nn.fc(h, args.width))
        loss = paddle.mean((paddle.static.nn.fc(h, OUT) - y) ** 2)
        paddle.optimizer.Adam(1e-3).minimize(loss)
    exe = paddle.static.Executor(paddle_ipu.device.place())
    exe.run(startup)
    weights = sum(int(np.prod(p.shape)) for p in main.global_block().all_parameters())
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=True, micro_batch_size=args.batch // job.count)
    s.set_options({"enable_distribution": True, "backend": "host"})
    program = paddle_ipu.IpuCompiledProgram(main, ipu_strategy=s).compile(["x", "y"], [loss])
    data = _batches(args.steps + 10, args.batch)
    times = []
    group = ReplicaGroup._instance
    for i, (xs, ys) in enumerate(data):
        if i == 10 and group is not None:
            before = group.seconds
        feed = {"x": _mine(xs, job.index, job.count), "y": _mine(ys, job.index, job.count)}
        start = time.perf_counter()
        exe.run(program, feed=feed, fetch_list=program.fetch_names)
        if i >= 10:
            times.append(time.perf_counter() - start)
    result = {"step_ms": statistics.median(times) * 1e3, "weight_bytes": 4 * weights}
    if group is not None and job.count > 1:
        result["all_reduce_ms"] = (group.seconds - before) / args.steps * 1e3
        result["bare_ms"] = _bare_all_reduce_ms(weights)
    return result


def worker_dp(args: argparse.Namespace) -> dict[str, Any]:
    import paddle
    import paddle.distributed as dist

    count = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    paddle.disable_static()
    paddle.set_device("cpu")
    if count > 1:
        dist.init_parallel_env()
    paddle.seed(1)
    layers: list[Any] = []
    width = IN
    for _ in range(DEPTH):
        layers += [paddle.nn.Linear(width, args.width), paddle.nn.ReLU()]
        width = args.width
    model: Any = paddle.nn.Sequential(*layers, paddle.nn.Linear(width, OUT))
    if count > 1:
        model = paddle.DataParallel(model)
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    times = []
    for i, (xs, ys) in enumerate(_batches(args.steps + 10, args.batch)):
        x = paddle.to_tensor(_mine(xs, rank, count))
        y = paddle.to_tensor(_mine(ys, rank, count))
        start = time.perf_counter()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        float(loss)
        if i >= 10:
            times.append(time.perf_counter() - start)
    return {"step_ms": statistics.median(times) * 1e3}


def _launch(system: str, nproc: int, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    out = os.path.join(folder, f"{system}-{nproc}-{time.monotonic_ns()}.json")
    command = [
        sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
        "--log_dir", os.path.join(folder, "log"), os.path.abspath(__file__), "--worker", system,
        "--out", out, "--steps", str(args.steps), "--batch", str(args.batch),
        "--width", str(args.width),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, cwd=folder, check=False)
    if proc.returncode != 0:
        logs = ""
        for name in sorted(os.listdir(os.path.join(folder, "log"))):
            if name.startswith("workerlog"):
                with open(os.path.join(folder, "log", name)) as f:
                    logs += f.read()[-2000:]
        raise SystemExit(f"{system} x{nproc} failed:\n{proc.stdout[-2000:]}{logs}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64, help="the job's batch per step")
    parser.add_argument("--widths", default="256,1024")
    parser.add_argument("--width", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=("ipu", "dp"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = (worker_ipu if args.worker == "ipu" else worker_dp)(args)
        if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)
        return

    print(f"{os.cpu_count()} cores; job batch {args.batch} rows, {args.steps} timed steps, "
          f"median of {args.repeat} launches each")  # fmt: skip
    runs = [("ipu", 1), ("dp", 1), ("ipu", 2), ("dp", 2)]
    for width in (int(w) for w in args.widths.split(",")):
        args.width = width
        results: dict[tuple[str, int], list[dict[str, Any]]] = {run: [] for run in runs}
        with tempfile.TemporaryDirectory() as folder:
            for r in range(args.repeat):
                for run in runs if r % 2 == 0 else runs[::-1]:
                    results[run].append(_launch(*run, args, folder))

        def med(run: tuple[str, int], key: str, results: Any = results) -> float:
            return statistics.median(x[key] for x in results[run])

        mb = results[("ipu", 2)][0]["weight_bytes"] / 1e6
        print(f"\nMLP {IN}-{'-'.join([str(width)] * DEPTH)}-{OUT}, {mb:.2f} MB of weights")
        print("| processes | paddle-ipu step ms | DataParallel step ms | ratio |")
        print("|---|---|---|---|")
        for n in (1, 2):
            ipu, dp = med(("ipu", n), "step_ms"), med(("dp", n), "step_ms")
            print(f"| {n} | {ipu:.2f} | {dp:.2f} | {ipu / dp:.2f} |")
        for name, system in (("paddle-ipu", "ipu"), ("DataParallel", "dp")):
            ratio = med((system, 2), "step_ms") / med((system, 1), "step_ms")
            print(f"{name}: a step of 2 processes (half the batch each) takes {ratio:.2f}x "
                  "a step of 1")  # fmt: skip
        ours, bare = med(("ipu", 2), "all_reduce_ms"), med(("ipu", 2), "bare_ms")
        print(f"all-reduce per step: paddle-ipu {ours:.2f} ms (packing included), a bare "
              f"paddle.distributed.all_reduce of the {mb:.2f} MB {bare:.2f} ms "
              f"(ratio {ours / bare:.2f}; {mb / ours:.2f} GB/s of weights)")  # fmt: skip


if __name__ == "__main__":
    main()
