"""Serving benchmarks: ``paddle-ipu serve`` under load from other processes, and the
model runtime in process.

Out of process (the default; the table of docs/serving.md): ``paddle-ipu serve`` of
each model in its own process, load from a compiled load generator in another one --
``wrk`` for KServe v2 HTTP (binary tensor requests), ``h2load`` for KServe v2 gRPC
(ModelInfer) -- at 1, 8, 32 and 128 connections, closed loop, 1-row requests; batching
on (micro-batch 16, ``--timeout-ms 2``) and off (micro-batch 1, ``--timeout-ms 0``).
Models: ``double`` (x * 2: the server's own cost), ``mlp512`` (512-1024-1024-10, where
batching pays on a CPU), and the transformer and CNN of tests/support/models.py.  Printed:
requests/s, p50, p99 and the server's CPU per request (the user and system time of its
process over the requests it answered) per row, then the ratios the serving issue sets
targets for; every answer of a probe request is checked against Paddle's CPU executor
first, and the server's own count of 200s must cover what the load tool counted.  The load tools
come from Debian (``--install-tools`` runs ``apt-get install wrk nghttp2-client``).

    python bench/serving.py [--models double mlp512 transformer cnn]
        [--connections 1 8 32 128] [--protocols http grpc] [--seconds 4] [--rounds 1]
        [--plot docs/serving.svg] [--json out.json]

In process (``--in-process``, the earlier table): client threads in this process.
Closed loop: N client threads each send a request, wait for its answer, send the
next, for ``--seconds`` per table row.  Requests have 1 row, or a random 1-7 rows
("mixed").  Modes, all in the same run:

- ``runtime``: in-process, ``ModelRuntime.run`` (micro-batch ``--micro-batch``,
  ``--timeout-ms``), whose C++ queue packs the rows of concurrent requests.
- ``runtime exe.run``: the same runtime entered through Paddle's ``exe.run`` on the
  "ipu" place (what Paddle 2.x scripts call).
- ``http``: ``paddle-ipu serve`` in a separate process, clients over loopback with
  http.client, the KServe v2 binary tensor extension, one connection per client.
- ``exe.run``: one Paddle ``exe.run`` per request, no batching: for 1-row requests the
  model compiled with micro-batch 1 on the "ipu" place (serialised by a lock, as one
  device would serve them); for mixed requests Paddle's CPU executor on the original
  program (it takes any number of rows).
- ``ort b1``: raw ONNX Runtime on the compiled micro-batch-1 graph, one
  ``session.run`` per request (1-row requests only).

Printed: one table (req/s, rows/s, p50, p99, rows per graph run), the throughput
ratios at concurrency 32, the p99 bound (timeout + 3x one full batch's compute), the
queue's overhead per request on a trivial model (``runtime.run`` of a whole
micro-batch minus ``executor.run`` of it, interleaved, medians), and the HTTP
server's overhead per request (p50 at concurrency 1, http minus runtime), and the
hand-off floor: the requests/s of the cheapest possible in-process request/response
with Python client threads -- a worker answering waiting clients in batches of up to
``--micro-batch`` by releasing a lock each, no model, no copies -- beside four times
one ``exe.run`` per request.  No in-process server with Python client threads can
answer faster than that floor on the machine.  With ``--plot`` an SVG of throughput
against p99 latency is written.

    python bench/serving.py [--models cnn transformer] [--concurrency 1 4 16 32 64]
        [--seconds 1.5] [--micro-batch 16] [--timeout-ms 2] [--plot docs/serving.svg]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

Row = dict[str, Any]


def closed_loop(
    call: Callable[[np.ndarray], Any], clients: int, seconds: float, requests: list[np.ndarray]
) -> tuple[int, int, float, list[float]]:
    """(requests, rows, wall seconds, latencies) of N clients for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    rows = [0] * clients
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []
    stop = [0.0]

    def client(c: int) -> None:
        try:
            barrier.wait()
            mine = latencies[c]
            i = c * 7919
            while time.perf_counter() < stop[0]:
                x = requests[i % len(requests)]
                i += 1
                t = time.perf_counter()
                call(x)
                mine.append(time.perf_counter() - t)
                rows[c] += x.shape[0]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for th in threads:
        th.start()
    stop[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    barrier.wait()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    flat = [x for per in latencies for x in per]
    return len(flat), sum(rows), wall, flat


def handoff_floor(clients: int, seconds: float, batch: int) -> tuple[float, float]:
    """(requests/s, p99 ms) of the cheapest in-process request/response with Python
    client threads: each request is a lock the client blocks on (without the GIL) and
    a worker thread releases, up to ``batch`` at a time."""
    import collections

    pending: collections.deque[Any] = collections.deque()
    cv = threading.Condition()
    done = [False]

    def worker() -> None:
        while True:
            with cv:
                while not pending and not done[0]:
                    cv.wait()
                if done[0] and not pending:
                    return
                answered = [pending.popleft() for _ in range(min(batch, len(pending)))]
            for lock in answered:
                lock.release()

    def call(x: np.ndarray) -> np.ndarray:
        lock = threading.Lock()
        lock.acquire()
        with cv:
            pending.append(lock)
            cv.notify()
        lock.acquire()
        return x

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    try:
        n, _, wall, lat = closed_loop(call, clients, seconds, [np.zeros((1, 1), np.float32)])
    finally:
        with cv:
            done[0] = True
            cv.notify()
        th.join()
    return n / wall, pct(lat, 0.99)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(20):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpClient:
    """One keep-alive connection; requests in the binary tensor extension."""

    def __init__(self, port: int, model: str, out_name: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.path = f"/v2/models/{model}/infer"
        self.out_name = out_name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        data = x.tobytes()
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": len(data)},
                    }
                ],
                "outputs": [{"name": self.out_name, "parameters": {"binary_data": True}}],
            }
        ).encode()
        self.conn.request(
            "POST",
            self.path,
            body=head + data,
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(body.decode(errors="replace"))
        length = resp.getheader("Inference-Header-Content-Length")
        if length is None:
            raise RuntimeError("the response has no Inference-Header-Content-Length header")
        n = int(length)
        doc = json.loads(body[:n])
        out = doc["outputs"][0]
        return np.frombuffer(body, np.float32, offset=n).reshape(out["shape"])


def start_server(package: Path, port: int, timeout_ms: float) -> subprocess.Popen[str]:
    log = open(package.with_suffix(".log"), "w")  # noqa: SIM115 (lives with the server)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paddle_ipu",
            "serve",
            str(package),
            "--port",
            str(port),
            "--name",
            "m",
            "--timeout-ms",
            str(timeout_ms),
        ],
        cwd=package.parent,  # the installed package, not the source tree
        # a file, not a pipe: a full pipe that nobody reads would block the server
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v2/health/ready")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(package.with_suffix(".log").read_text()) from None
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def bench_model(
    kind: str, args: argparse.Namespace, work: Path
) -> tuple[list[Row], dict[str, Any]]:
    import onnxruntime as ort
    import paddle
    from support.models import build
    from support.serving_models import save

    import paddle_ipu
    from paddle_ipu.serving.saved_model import compile_model

    paddle.enable_static()
    built = build(kind)
    prefix = save(built, work, kind)
    rng = np.random.default_rng(0)
    shape = built.feed_shapes["x"]
    pool = rng.standard_normal((4096, *shape)).astype(np.float32)
    one_row = [pool[i : i + 1] for i in range(1024)]
    sizes = rng.integers(1, 8, 1024)
    starts = rng.integers(0, 4096 - 8, 1024)
    mixed = [pool[s : s + n] for s, n in zip(starts, sizes)]
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    cpu = paddle.static.Executor(paddle.CPUPlace())

    # the micro-batch-1 program (no batching) and the batched package and runtime
    s1 = paddle_ipu.IpuStrategy()
    s1.set_graph_config(is_training=False, micro_batch_size=1)
    # Threads that sleep between runs: faster for one exe.run per request from client
    # threads too (mlp512, 16 clients: 7,800 against 6,300 req/s spinning).
    s1.set_options({"host_spin_threads": False})
    cp1 = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s1)
    prog1 = cp1.compile(built.feeds, built.fetches)
    device = threading.Lock()

    def one_by_one(x: np.ndarray) -> Any:
        with device:
            return exe.run(prog1, feed={"x": x}, fetch_list=prog1.fetch_names)

    def paddle_cpu(x: np.ndarray) -> Any:
        # Paddle's executor is not thread-safe (concurrent runs crash): serialise
        with device, paddle.static.scope_guard(built.scope):
            return cpu.run(built.main, feed={"x": x}, fetch_list=built.fetches)

    sess = ort.InferenceSession(cp1.executor.model.onnx, providers=["CPUExecutionProvider"])
    in_name = sess.get_inputs()[0].name

    def ort_b1(x: np.ndarray) -> Any:
        with device:
            return sess.run(None, {in_name: x})

    package, _ = compile_model(prefix, micro_batch_size=args.micro_batch, cache=False)
    package_path = package.save(work / f"{kind}.pdipu")
    # Its threads sleep between runs: the client threads need the cores (as `serve` does).
    runtime = paddle_ipu.ModelRuntime(
        package.executor(host_spin_threads=False), timeout_ms=args.timeout_ms
    )
    sm = paddle_ipu.IpuStrategy()
    sm.set_graph_config(is_training=False, micro_batch_size=args.micro_batch)
    sm.set_options({"enable_model_runtime_executor": True, "timeout_ms": args.timeout_ms})
    cpm = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=sm)
    progm = cpm.compile(built.feeds, built.fetches)

    def via_exe_run(x: np.ndarray) -> Any:
        return exe.run(progm, feed={"x": x}, fetch_list=progm.fetch_names)

    # every mode gives the same answers (the oracle: Paddle's CPU executor)
    probe = mixed[0]
    want = paddle_cpu(probe)[0]
    for got in (runtime.run({"x": probe})[0], via_exe_run(probe)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(one_by_one(probe[:1])[0], want[:1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ort_b1(probe[:1])[0], want[:1], rtol=1e-4, atol=1e-5)

    port = free_port()
    server = start_server(package_path, port, args.timeout_ms)
    out_name = package.model.outputs[0].paddle_name or package.model.outputs[0].name
    local = threading.local()

    def over_http(x: np.ndarray) -> Any:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = HttpClient(port, "m", out_name)
        return client(x)

    np.testing.assert_allclose(over_http(probe), want, rtol=1e-4, atol=1e-5)

    rows: list[Row] = []
    try:
        for mix, requests in (("1", one_row), ("1-7", mixed)):
            modes: list[tuple[str, Callable[[np.ndarray], Any], Any]] = [
                ("runtime", lambda x: runtime.run({"x": x}), runtime),
                ("runtime exe.run", via_exe_run, cpm.runtime),
                ("http", over_http, None),
                ("exe.run", one_by_one if mix == "1" else paddle_cpu, None),
            ]
            if mix == "1":
                modes.append(("ort b1", ort_b1, None))
            for mode, call, rt in modes:
                if mode not in args.modes:
                    continue
                for _ in range(30):
                    call(requests[0])
                for clients in args.concurrency:
                    before = rt.stats() if rt is not None else None
                    n, nrows, wall, lat = closed_loop(call, clients, args.seconds, requests)
                    per_run = float("nan")
                    if rt is not None and before is not None:
                        after = rt.stats()
                        per_run = (after.units - before.units) / max(after.runs - before.runs, 1)
                    rows.append(
                        {
                            "model": kind,
                            "rows": mix,
                            "mode": mode,
                            "clients": clients,
                            "rps": n / wall,
                            "rowsps": nrows / wall,
                            "p50": pct(lat, 0.5),
                            "p99": pct(lat, 0.99),
                            "per_run": per_run,
                        }
                    )
                    r = rows[-1]
                    print(
                        f"  {kind:11} {mix:>4} {mode:16} {clients:4d} {r['rps']:9.0f} "
                        f"{r['rowsps']:9.0f} {r['p50']:8.2f} {r['p99']:8.2f} {per_run:8.2f}",
                        flush=True,
                    )
        full = pool[: args.micro_batch]
        batch_ms = median_time(lambda: runtime.executor.run({"x": full}), 200) * 1e3
    finally:
        server.terminate()
        server.wait(timeout=60)
        runtime.close()
        cpm.reset()
        cp1.reset()
    return rows, {"batch_ms": batch_ms}


def queue_overhead(args: argparse.Namespace) -> tuple[float, float, float]:
    """(runtime.run, executor.run, difference) medians in us on a trivial model: one
    whole micro-batch per request, one client, interleaved."""
    import paddle

    import paddle_ipu

    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        out = x * 2.0
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=args.micro_batch)
    cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    cp.compile(["x"], [out])
    rt = paddle_ipu.ModelRuntime(cp.executor, timeout_ms=args.timeout_ms)
    feed = {"x": np.ones((args.micro_batch, 4), np.float32)}
    direct, queued = [], []
    for i in range(args.overhead_repeats + 100):
        t = time.perf_counter()
        cp.executor.run(feed)
        d = time.perf_counter() - t
        t = time.perf_counter()
        rt.run(feed)
        q = time.perf_counter() - t
        if i >= 100:
            direct.append(d)
            queued.append(q)
    rt.close()
    cp.reset()
    dq, dd = statistics.median(queued) * 1e6, statistics.median(direct) * 1e6
    return dq, dd, dq - dd


def write_svg(rows: list[Row], path: Path) -> None:
    """Throughput against p99 latency, one panel per (model, request rows)."""
    panels = sorted({(r["model"], r["rows"]) for r in rows})
    colors = {
        "runtime": "#1f77b4",
        "runtime exe.run": "#9467bd",
        "http": "#2ca02c",
        "exe.run": "#d62728",
        "ort b1": "#7f7f7f",
    }
    pw, ph, pad = 420, 300, 60
    cols = 2
    width = cols * pw
    height = ((len(panels) + cols - 1) // cols) * ph + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for k, (model, mix) in enumerate(panels):
        ox, oy = (k % cols) * pw, (k // cols) * ph
        sel = [r for r in rows if r["model"] == model and r["rows"] == mix]
        xmax = max(r["p99"] for r in sel) * 1.1
        ymax = max(r["rps"] for r in sel) * 1.1
        x0, y0, x1, y1 = ox + pad, oy + ph - 40, ox + pw - 20, oy + 30

        def sx(v: float, x0: float = x0, x1: float = x1, xmax: float = xmax) -> float:
            return x0 + (x1 - x0) * v / xmax

        def sy(v: float, y0: float = y0, y1: float = y1, ymax: float = ymax) -> float:
            return y0 - (y0 - y1) * v / ymax

        out.append(
            f'<text x="{ox + pw / 2}" y="{oy + 18}" text-anchor="middle" '
            f'font-weight="bold">{model}, {mix}-row requests</text>'
        )
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
        for i in range(5):
            xv, yv = xmax * i / 4, ymax * i / 4
            out.append(f'<text x="{sx(xv)}" y="{y0 + 14}" text-anchor="middle">{xv:.1f}</text>')
            out.append(f'<text x="{x0 - 4}" y="{sy(yv) + 4}" text-anchor="end">{yv:.0f}</text>')
        out.append(
            f'<text x="{(x0 + x1) / 2}" y="{y0 + 30}" text-anchor="middle">p99 latency (ms)</text>'
        )
        out.append(
            f'<text x="{ox + 12}" y="{(y0 + y1) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 {ox + 12} {(y0 + y1) / 2})">requests/s</text>'
        )
        legend_y = y1 + 4
        for mode, color in colors.items():
            pts = sorted((r for r in sel if r["mode"] == mode), key=lambda r: r["clients"])
            if not pts:
                continue
            line = " ".join(f"{sx(r['p99']):.1f},{sy(r['rps']):.1f}" for r in pts)
            out.append(
                f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
            for r in pts:
                out.append(
                    f'<circle cx="{sx(r["p99"]):.1f}" cy="{sy(r["rps"]):.1f}" r="2.5" '
                    f'fill="{color}"><title>{r["clients"]} clients</title></circle>'
                )
            out.append(f'<text x="{x1 - 110}" y="{legend_y + 8}" fill="{color}">{mode}</text>')
            legend_y += 13
    out.append(
        f'<text x="10" y="{height - 8}">closed loop at 1, 4, 16, 32, 64 clients '
        f"(points, left to right as latency grows); bench/serving.py</text>"
    )
    out.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


# -- out of process --------------------------------------------------------------------

OOP_MODELS = ["double", "mlp512", "transformer", "cnn"]


def install_tools() -> None:
    """wrk and h2load from Debian's packages (run as root)."""
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "wrk", "nghttp2-client"],
        check=True,
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
    )


def need_tools(protocols: list[str]) -> None:
    import shutil

    missing = [
        tool
        for tool, proto in (("wrk", "http"), ("h2load", "grpc"))
        if proto in protocols and shutil.which(tool) is None
    ]
    if missing:
        raise SystemExit(
            f"bench/serving.py needs {' and '.join(missing)}: run it with --install-tools "
            f"(apt-get install wrk nghttp2-client, as root)"
        )


def infer_body(x: np.ndarray, out_name: str) -> tuple[bytes, int]:
    data = x.tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": out_name, "parameters": {"binary_data": True}}],
        },
        separators=(",", ":"),
    ).encode()
    return head + data, len(head)


def wrk_script(x: np.ndarray, out_name: str, path: Path) -> Path:
    body, n = infer_body(x, out_name)
    escaped = "".join(f"\\{b}" for b in body)
    path.write_text(
        'wrk.method = "POST"\n'
        f'wrk.body = "{escaped}"\n'
        f'wrk.headers["Inference-Header-Content-Length"] = "{n}"\n'
        'wrk.headers["Content-Type"] = "application/octet-stream"\n'
    )
    return path


def grpc_body(x: np.ndarray, path: Path) -> Path:
    """One gRPC-framed ModelInferRequest (what h2load posts)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    message = request.SerializeToString()
    path.write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)
    return path


def _ms(text: str) -> float:
    value = float(text.rstrip("usm"))
    return (
        value / 1e3
        if text.endswith("us")
        else value * 1e3
        if text.endswith(("s",)) and not text.endswith("ms")
        else value
    )


def run_wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got: dict[str, float] = {"errors": 0.0}
    for line in out.splitlines():
        words = line.split()
        if line.startswith("Requests/sec:"):
            got["rps"] = float(words[1])
        elif len(words) == 2 and words[0] in ("50%", "99%"):
            got["p50" if words[0] == "50%" else "p99"] = _ms(words[1])
        elif "Non-2xx" in line or line.strip().startswith("Socket errors"):
            got["errors"] += sum(float(w.rstrip(",")) for w in words if w.rstrip(",").isdigit())
        elif "requests in" in line:
            got["requests"] = float(words[0])
    return got


def run_h2load(
    url: str, body: Path, connections: int, seconds: float, log: Path
) -> dict[str, float]:
    log.unlink(missing_ok=True)  # h2load appends to its log
    out = subprocess.run(
        [
            "h2load",
            f"-c{connections}",
            "-m1",
            "-t1",
            "-D",
            f"{seconds:g}",
            "-d",
            str(body),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            f"--log-file={log}",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got: dict[str, float] = {}
    for line in out.splitlines():
        words = line.replace(",", "").split()
        if line.startswith("finished in"):
            got["rps"] = float(words[3])
        elif line.startswith("requests:"):
            got["requests"] = float(words[7])  # succeeded
            got["errors"] = float(words[9]) + float(words[11])  # failed, errored
    lat = np.loadtxt(log, usecols=2, ndmin=1) / 1e3  # microseconds to the answer
    got["p50"], got["p99"] = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    return got


class Served:
    """``paddle-ipu serve`` of one package, on fresh ports (``args``: more of its
    options; ``env``: its environment; its log ``package`` with ``log_suffix``)."""

    def __init__(
        self,
        package: Path,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_suffix: str = ".log",
    ) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.log = package.with_suffix(log_suffix)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "paddle_ipu", "serve", str(package), "--name", "m",
             "--port", str(self.port), "--grpc-port", str(self.grpc_port), *args],
            cwd=package.parent,  # the installed package, not the source tree
            stdout=self.log.open("w"),  # a file: a full pipe would block the server
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 180
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/v2/health/ready")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(self.log.read_text()) from None
                time.sleep(0.2)

    def answered(self) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        key = 'paddle_ipu_requests_total{model="m",version="1",status="200"} '
        return float(text.split(key)[1].split()[0])

    def cpu_seconds(self) -> float:
        """The server process's user + system CPU time so far (every thread)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()  # SIGTERM: the server drains
        self.proc.wait(timeout=120)


def load(
    server: Served,
    proto: str,
    conns: int,
    args: argparse.Namespace,
    script: Path,
    body: Path,
    work: Path,
    kind: str,
) -> dict[str, float]:
    """One round of the load tool against ``server``; checked against its count."""
    before = server.answered()
    cpu = server.cpu_seconds()
    if proto == "http":
        url = f"http://127.0.0.1:{server.port}/v2/models/m/infer"
        r = run_wrk(url, script, conns, args.seconds)
    else:
        url = f"http://127.0.0.1:{server.grpc_port}/inference.GRPCInferenceService/ModelInfer"
        r = run_h2load(url, body, conns, args.seconds, work / "h2.log")
    cpu = server.cpu_seconds() - cpu
    done = server.answered() - before
    # every request the tool counted was answered 200 by the server (gRPC errors
    # travel in trailers, which h2load does not read)
    if r.get("errors", 0) or done < r.get("requests", 0):
        raise RuntimeError(f"{kind} {proto}: {r}, server 200s {done}")
    r["cpu_us"] = cpu / max(done, 1) * 1e6  # the server's CPU per request answered
    return r


def out_of_process(args: argparse.Namespace) -> list[Row]:
    import paddle
    from support.models import build
    from support.serving_models import save

    from paddle_ipu.serving.saved_model import compile_model

    need_tools(args.protocols)
    rows: list[Row] = []
    print(
        f"{os.cpu_count()} CPUs; {args.seconds:g} s per row; 1-row requests; median of "
        f"{args.rounds} round(s)"
    )
    print(
        f"  {'model':11} {'batching':8} {'proto':5} {'conns':>5} {'req/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'CPU µs':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for kind in args.models:
            paddle.enable_static()
            built = build(kind)
            prefix = save(built, work, kind)
            x = np.random.default_rng(0).standard_normal((1, *built.feed_shapes["x"]))
            x = x.astype(np.float32)
            want = built.run_cpu({"x": x})[0]
            # Batching on and off served side by side, their rounds alternating: on a
            # shared machine a ratio is only fair between runs made together.
            servers: dict[str, Served] = {}
            try:
                for batching, mbs, timeout in (
                    ("on", args.micro_batch, args.timeout_ms),
                    ("off", 1, 0.0),
                ):
                    package, _ = compile_model(prefix, micro_batch_size=mbs, cache=False)
                    path = package.save(work / f"{kind}_{batching}.pdipu")
                    servers[batching] = Served(
                        path, ("--timeout-ms", str(timeout), "--num-buffers", "256")
                    )
                    out = package.model.outputs[0]
                    out_name = out.paddle_name or out.name
                    got = HttpClient(servers[batching].port, "m", out_name)(x)
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
                script = wrk_script(x, out_name, work / f"{kind}.lua")
                body = grpc_body(x, work / f"{kind}.grpc")
                for proto in args.protocols:
                    for conns in args.connections:
                        rounds: dict[str, list[dict[str, float]]] = {b: [] for b in servers}
                        for _ in range(args.rounds):
                            for batching, server in servers.items():
                                rounds[batching].append(
                                    load(server, proto, conns, args, script, body, work, kind)
                                )
                        for batching in servers:
                            med = {
                                k: statistics.median(r[k] for r in rounds[batching])
                                for k in ("rps", "p50", "p99", "cpu_us")
                            }
                            row = {
                                "model": kind,
                                "batching": batching,
                                "proto": proto,
                                "conns": conns,
                                **med,
                            }
                            rows.append(row)
                            print(
                                f"  {kind:11} {batching:8} {proto:5} {conns:5d} "
                                f"{med['rps']:9.0f} {med['p50']:8.2f} {med['p99']:8.2f} "
                                f"{med['cpu_us']:7.1f}",
                                flush=True,
                            )
            finally:
                for server in servers.values():
                    server.stop()
    return rows


def oop_summary(rows: list[Row]) -> None:
    def find(model: str, batching: str, proto: str, conns: int) -> Row | None:
        for r in rows:
            if (r["model"], r["batching"], r["proto"], r["conns"]) == (
                model,
                batching,
                proto,
                conns,
            ):
                return r
        return None

    print()
    for proto in ("http", "grpc"):
        on, off = find("mlp512", "on", proto, 32), find("mlp512", "off", proto, 32)
        if on and off:
            print(
                f"mlp512, 32 connections, {proto}: batching on {on['rps']:.0f} req/s "
                f"(p99 {on['p99']:.2f} ms) / off {off['rps']:.0f} req/s = "
                f"{on['rps'] / off['rps']:.2f}x (target >= 3x, p99 <= 10 ms)"
            )
    for model in ("mlp512", "double"):
        http, grpc = find(model, "on", "http", 32), find(model, "on", "grpc", 32)
        if http and grpc:
            print(
                f"{model}, 32 connections, batching on: grpc {grpc['rps']:.0f} req/s "
                f"(p99 {grpc['p99']:.2f} ms) / http {http['rps']:.0f} req/s = "
                f"{grpc['rps'] / http['rps']:.2f}x (target >= 0.7x, p99 <= 10 ms)"
            )
    for batching in ("on", "off"):
        r = find("double", batching, "http", 32)
        if r:
            print(
                f"double (x * 2), 32 connections, http, batching {batching}: {r['rps']:.0f} "
                f"req/s, p99 {r['p99']:.2f} ms (target >= 15000, p99 <= 5 ms)"
            )


def write_oop_svg(rows: list[Row], path: Path) -> None:
    """Requests/s against connections, one panel per model; a line per protocol and
    batching."""
    models = [m for m in OOP_MODELS if any(r["model"] == m for r in rows)]
    colors = {
        ("http", "on"): "#2ca02c",
        ("http", "off"): "#98df8a",
        ("grpc", "on"): "#1f77b4",
        ("grpc", "off"): "#aec7e8",
    }
    pw, ph, pad, cols = 420, 300, 60, 2
    width = cols * pw
    height = ((len(models) + cols - 1) // cols) * ph + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for k, model in enumerate(models):
        ox, oy = (k % cols) * pw, (k // cols) * ph
        sel = [r for r in rows if r["model"] == model]
        conns = sorted({r["conns"] for r in sel})
        ymax = max(r["rps"] for r in sel) * 1.1
        x0, y0, x1, y1 = ox + pad, oy + ph - 40, ox + pw - 20, oy + 30

        def sx(c: int, x0: float = x0, x1: float = x1, conns: list[int] = conns) -> float:
            i = conns.index(c)
            return x0 + (x1 - x0) * (i + 0.5) / len(conns)

        def sy(v: float, y0: float = y0, y1: float = y1, ymax: float = ymax) -> float:
            return y0 - (y0 - y1) * v / ymax

        out.append(
            f'<text x="{ox + pw / 2}" y="{oy + 18}" text-anchor="middle" '
            f'font-weight="bold">{model}: 1-row requests</text>'
        )
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
        for c in conns:
            out.append(f'<text x="{sx(c)}" y="{y0 + 14}" text-anchor="middle">{c}</text>')
        for i in range(5):
            yv = ymax * i / 4
            out.append(f'<text x="{x0 - 4}" y="{sy(yv) + 4}" text-anchor="end">{yv:.0f}</text>')
        out.append(
            f'<text x="{(x0 + x1) / 2}" y="{y0 + 30}" text-anchor="middle">'
            "connections (p99 ms at each point)</text>"
        )
        out.append(
            f'<text x="{ox + 12}" y="{(y0 + y1) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 {ox + 12} {(y0 + y1) / 2})">requests/s</text>'
        )
        legend_y = y1 + 4
        for (proto, batching), color in colors.items():
            pts = sorted(
                (r for r in sel if (r["proto"], r["batching"]) == (proto, batching)),
                key=lambda r: r["conns"],
            )
            if not pts:
                continue
            line = " ".join(f"{sx(r['conns']):.1f},{sy(r['rps']):.1f}" for r in pts)
            out.append(
                f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
            for r in pts:
                out.append(
                    f'<circle cx="{sx(r["conns"]):.1f}" cy="{sy(r["rps"]):.1f}" r="2.5" '
                    f'fill="{color}"><title>{r["rps"]:.0f} req/s, p99 {r["p99"]:.2f} ms'
                    "</title></circle>"
                )
                out.append(
                    f'<text x="{sx(r["conns"]) + 4:.1f}" y="{sy(r["rps"]) - 4:.1f}" '
                    f'font-size="8" fill="{color}">{r["p99"]:.1f}</text>'
                )
            out.append(
                f'<text x="{x1 - 120}" y="{legend_y + 8}" fill="{color}">'
                f"{proto}, batching {batching}</text>"
            )
            legend_y += 13
    out.append(
        f'<text x="10" y="{height - 8}">paddle-ipu serve in its own process; load from '
        "wrk (HTTP) and h2load (gRPC) in another; bench/serving.py</text>"
    )
    out.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-process", action="store_true", help="the in-process table")
    parser.add_argument("--install-tools", action="store_true", help="apt-get wrk and h2load")
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--rounds", type=int, default=1, help="out of process: median of")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument(
        "--modes", nargs="+", default=["runtime", "runtime exe.run", "http", "exe.run", "ort b1"]
    )
    parser.add_argument("--seconds", type=float, default=None, help="per table row")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--timeout-ms", type=float, default=2.0)
    parser.add_argument("--overhead-repeats", type=int, default=2000)
    parser.add_argument("--plot", type=Path, default=None, help="write an SVG plot here")
    args = parser.parse_args()
    if args.install_tools:
        install_tools()
    if not args.in_process:
        args.models = args.models or OOP_MODELS
        args.seconds = args.seconds or 4.0
        rows = out_of_process(args)
        oop_summary(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        if args.plot:
            write_oop_svg(rows, args.plot)
            print(f"plot: {args.plot}")
        return
    args.models = args.models or ["cnn", "transformer"]
    args.seconds = args.seconds or 1.5
    in_process(args)


def in_process(args: argparse.Namespace) -> None:
    print(
        f"micro-batch {args.micro_batch}, timeout {args.timeout_ms:g} ms, {args.seconds:g} s "
        f"per row, {os.cpu_count()} CPUs"
    )
    print(
        f"  {'model':11} {'rows':>4} {'mode':16} {'conc':>4} {'req/s':>9} {'rows/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'rows/run':>8}"
    )
    rows: list[Row] = []
    extra: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models:
            got, info = bench_model(kind, args, Path(tmp))
            rows += got
            extra[kind] = info
    dq, dd, diff = queue_overhead(args)

    def find(model: str, mix: str, mode: str, clients: int) -> Row | None:
        for r in rows:
            if (r["model"], r["rows"], r["mode"], r["clients"]) == (model, mix, mode, clients):
                return r
        return None

    print()
    for kind in args.models:
        for mix in ("1", "1-7"):
            base = find(kind, mix, "exe.run", 32)
            for mode in ("runtime", "runtime exe.run", "http"):
                r = find(kind, mix, mode, 32)
                if r and base:
                    print(
                        f"{kind} {mix}-row, 32 clients: {mode} / exe.run = "
                        f"{r['rps'] / base['rps']:.2f}x throughput"
                    )
            r = find(kind, mix, "runtime", 32)
            if r:
                bound = args.timeout_ms + 3 * extra[kind]["batch_ms"]
                print(
                    f"{kind} {mix}-row, 32 clients: runtime p99 {r['p99']:.2f} ms; bound "
                    f"timeout + 3 x batch compute ({extra[kind]['batch_ms']:.2f} ms) = "
                    f"{bound:.2f} ms"
                )
            h, rt = find(kind, mix, "http", 1), find(kind, mix, "runtime", 1)
            if h and rt:
                print(
                    f"{kind} {mix}-row: HTTP server overhead per request (p50 at 1 client, "
                    f"http - runtime) {(h['p50'] - rt['p50']) * 1e3:.0f} us"
                )
    floor, floor_p99 = handoff_floor(32, args.seconds, args.micro_batch)
    print(f"hand-off floor, 32 Python client threads: {floor:.0f} req/s (p99 {floor_p99:.2f} ms)")
    for kind in args.models:
        base = find(kind, "1", "exe.run", 32)
        if base:
            print(
                f"{kind} 1-row: 4 x exe.run = {4 * base['rps']:.0f} req/s; the floor is "
                f"{floor / base['rps']:.2f}x exe.run"
            )
    print(
        f"queue overhead per request (trivial model, micro-batch {args.micro_batch}): "
        f"runtime.run {dq:.1f} us - executor.run {dd:.1f} us = {diff:.1f} us"
    )
    if args.plot:
        write_svg(rows, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
