"""Hostile clients against ``paddle-ipu serve`` in another process.

Several hundred cases -- raw HTTP/1.1 bytes, JSON and binary-extension bodies, raw
HTTP/2 frames and protobuf bytes on the gRPC port, deadlines of any size, floods, slow
and stalled clients, a 64 MB body -- thrown at two servers: a fixed model (an MLP,
auto-batching) and a shape-routed package (open dimensions: nothing but the front end's
checks bounds the sizes a request brings).  After every case: the process must be
alive, ``/v2/health/ready`` must answer 200 and a good request over HTTP and over gRPC
must be answered with Paddle's CPU executor's output (the oracle) within 10 s each.
Reported: crashes, hangs (a check not answered in time), wrong answers, the answers'
statuses, health's latency while a 64 MB JSON body is parsed, and the server's resident
memory after each round of the cases (the same cases each round: growth from one round
to the next is a leak).

    python bench/hostile_probe.py [--rounds 2] [--models fixed shaped] [--out report.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_cases import (
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    INFER,
    MAX_CONNECTIONS,
    grpc_cases,
    http_cases,
    request_message,
    slow_cases,
)

ROOT = Path(__file__).resolve().parent.parent
CHECK_S = 10.0


# -- the servers ----------------------------------------------------------------------


def build_models(
    work: Path,
) -> dict[str, tuple[Path, Callable[[np.ndarray], Any], list[int]]]:
    """name -> (package, the CPU executor's function of x, a good request's shape)."""
    import paddle

    from paddle_ipu.serving.saved_model import compile_model

    paddle.enable_static()
    out: dict[str, tuple[Path, Callable[[np.ndarray], Any], list[int]]] = {}
    for name, shape, width in (("fixed", [-1, 16], 16), ("shaped", [-1, -1], 8)):
        main, startup = paddle.static.Program(), paddle.static.Program()
        scope = paddle.static.Scope()
        with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            paddle.seed(7)
            x = paddle.static.data("x", shape, "float32")
            if name == "fixed":
                y = paddle.static.nn.fc(paddle.static.nn.fc(x, 32, activation="relu"), 4)
            else:
                y = paddle.nn.functional.relu(x * 2.0 - 0.5) + paddle.sum(x, axis=-1, keepdim=True)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            prefix = str(work / name)
            paddle.static.save_inference_model(prefix, [x], [y], exe, program=main)

        def cpu(
            a: np.ndarray, main: Any = main, y: Any = y, exe: Any = exe, scope: Any = scope
        ) -> Any:
            with paddle.static.scope_guard(scope):
                return exe.run(main, feed={"x": a}, fetch_list=[y])[0]

        shapes = [{"x": [-1, width]}] if name == "shaped" else ()
        package, _ = compile_model(prefix, micro_batch_size=4, cache=False, input_shapes=shapes)
        out[name] = (package.save(work / f"{name}.pdipu"), cpu, [3, width])
    return out


class Server:
    def __init__(self, package: Path, log: Path) -> None:
        argv = [sys.executable, "-m", "paddle_ipu", "serve", str(package), "--name", "m"]
        argv += ["--port", "0", "--grpc-port", "0", "--timeout-ms", "2"]
        argv += [
            "--header-timeout-s",
            str(HEADER_TIMEOUT_S),
            "--idle-timeout-s",
            str(IDLE_TIMEOUT_S),
        ]
        argv += ["--max-connections", str(MAX_CONNECTIONS)]
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            cwd=tempfile.gettempdir(),
            stdout=subprocess.PIPE,
            stderr=open(log, "w"),  # noqa: SIM115 (the log lives with the server)
            text=True,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("paddle-ipu: serving"):
                words = line.split()
                self.port = int(words[words.index("on") + 1].rsplit(":", 1)[1])
                self.grpc_port = int(words[-1].rsplit(":", 1)[1])
                break
        else:
            raise RuntimeError(f"the server did not start: {log.read_text()[-3000:]}")
        # what the server prints from now on is drained, so that a full pipe never blocks it
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


# -- the checks after every case, the large body, the run ----------------------------


def check(s: Server, good: np.ndarray, want: np.ndarray) -> str | None:
    """None when the server is alive and answers health and a good request on both
    protocols right within CHECK_S each; else what failed."""
    import http.client

    import grpc
    from tritonclient.grpc import service_pb2

    if s.proc.poll() is not None:
        return f"crashed (exit {s.proc.returncode})"
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=CHECK_S)
        conn.request("GET", "/v2/health/ready")
        health = conn.getresponse()
        health.read()
        if health.status != 200:
            return "health not 200"
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": list(good.shape),
                        "datatype": "FP32",
                        "data": good.tolist(),
                    }
                ]
            }
        )
        conn.request("POST", "/v2/models/m/infer", body)
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        conn.close()
        if resp.status != 200:
            return f"good HTTP request answered {resp.status}: {answer}"
        got = np.array(answer["outputs"][0]["data"], np.float32).reshape(want.shape)
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            return "good HTTP request answered wrong"
    except (OSError, http.client.HTTPException) as exc:
        return f"HTTP check: {type(exc).__name__} {exc}"
    with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
        try:
            data = channel.unary_unary(INFER)(
                request_message(list(good.shape), good.tobytes()), timeout=CHECK_S
            )
        except grpc.RpcError as exc:
            return f"gRPC check: {exc.code().name} {exc.details()}"
    response = service_pb2.ModelInferResponse.FromString(data)
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(want.shape)
    return (
        None if np.allclose(got, want, rtol=1e-5, atol=1e-6) else "good gRPC request answered wrong"
    )


def large_body(s: Server, rows: int = 16_000_000) -> dict[str, Any]:
    """A 64 MB JSON body (its parse takes seconds) sent by another process, health
    polled from this one on its own connection meanwhile: health's latencies."""
    import http.client

    sender = (
        "import socket, sys\n"
        f"rows = {rows}\n"
        'body = b\'{"inputs":[{"name":"x","shape":[%d,1],"datatype":"FP32",'
        '"data":[\' % rows + b\'0.5,\' * (rows - 1) + b\'0.5]}],"outputs":[{"name":"none"}]}\'\n'
        "head = b'POST /v2/models/m/infer HTTP/1.1\\r\\nHost: p\\r\\n'\n"
        "head += b'Content-Length: %d\\r\\n\\r\\n'\n"
        f"s = socket.create_connection(('127.0.0.1', {s.port}), timeout=300)\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        "s.sendall(head % len(body) + body)\n"
        "print(s.recv(64).split(b'\\r\\n')[0].decode(), len(body), flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", sender], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"  # its body is built
    proc.stdin.write("go\n")
    proc.stdin.flush()
    latencies = []
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    while proc.poll() is None:
        t0 = time.perf_counter()
        conn.request("GET", "/v2/health/ready")
        conn.getresponse().read()
        latencies.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.01)
    conn.close()
    answer, size = proc.stdout.read().rsplit(" ", 1)
    return {
        "body_mb": round(int(size) / 1e6, 1),
        "answer": answer.strip(),
        "health_checks": len(latencies),
        "health_ms_median": round(statistics.median(latencies), 2),
        "health_ms_p99": round(float(np.percentile(latencies, 99)), 2),
        "health_ms_max": round(max(latencies), 2),
    }


def run_case(fn: Callable[[Server], str], s: Server, limit: float = 120.0) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(_safe(fn, s)), daemon=True)
    t.start()
    t.join(limit)
    return out[0] if out else "hung"


def _safe(fn: Callable[[Server], str], s: Server) -> str:
    try:
        return fn(s)
    except Exception as exc:  # a client-side surprise is an outcome, not a probe failure
        return f"client {type(exc).__name__}: {str(exc)[:80]}"


def probe(
    name: str,
    package: Path,
    cpu: Callable[[np.ndarray], np.ndarray],
    shape: list[int],
    rounds: int,
    work: Path,
) -> dict[str, Any]:
    good = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = np.asarray(cpu(good))
    valid = request_message(list(good.shape), good.tobytes())
    cases = http_cases(good) + grpc_cases(good, valid) + slow_cases(good)
    s = Server(package, work / f"{name}.log")
    report: dict[str, Any] = {
        "model": name,
        "cases": len(cases),
        "rounds": rounds,
        "crashes": 0,
        "hangs": 0,
        "failed_checks": [],
        "outcomes": Counter(),
    }
    for _ in range(50):  # warm: the allocator's and the runtime's first requests
        problem = check(s, good, want)
        assert problem is None, problem
    report["rss_mb"] = [round(s.rss_mb(), 1)]
    t0 = time.monotonic()
    for r in range(rounds):
        for family, case, fn in cases:
            outcome = run_case(fn, s)
            report["outcomes"][f"{family}: {' '.join(outcome.split(' ')[:2])}"] += 1
            if outcome == "hung":
                report["hangs"] += 1
            problem = check(s, good, want)
            if problem is not None:
                report["failed_checks"].append(
                    f"round {r}: {family} / {case}: {outcome}: {problem}"
                )
                if s.proc.poll() is not None:
                    report["crashes"] += 1
                    s = Server(package, work / f"{name}-{len(report['failed_checks'])}.log")
                elif problem.startswith(("HTTP check", "gRPC check")):
                    report["hangs"] += 1
            if r == 0 and family == "slow clients":
                report.setdefault("slow clients", {})[case] = outcome
        report["rss_mb"].append(round(s.rss_mb(), 1))
    report["seconds"] = round(time.monotonic() - t0)
    report["large body"] = large_body(s)
    problem = check(s, good, want)
    if problem is not None:
        report["failed_checks"].append(f"after the large body: {problem}")
    report["exit code on SIGTERM"] = s.stop()
    report["outcomes"] = dict(sorted(report["outcomes"].items()))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--models", nargs="+", default=["fixed", "shaped"], choices=["fixed", "shaped"]
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hostile-probe-"))
    models = build_models(work)
    reports = []
    for name in args.models:
        package, cpu, shape = models[name]
        report = probe(name, package, cpu, shape, args.rounds, work)
        reports.append(report)
        cases, rounds, seconds = report["cases"], report["rounds"], report["seconds"]
        print(f"\n== {name}: {cases} cases x {rounds} rounds in {seconds} s")
        failed = len(report["failed_checks"])
        print(f"crashes {report['crashes']}, hangs {report['hangs']}, failed checks {failed}")
        for line in report["failed_checks"][:20]:
            print("  ", line)
        print(f"resident MB: after warm-up, then after each round: {report['rss_mb']}")
        print(f"large body: {report['large body']}")
        print(f"slow clients: {report.get('slow clients')}")
        print(f"exit code on SIGTERM: {report['exit code on SIGTERM']}")
        for key, count in report["outcomes"].items():
            print(f"  {count:5d}  {key}")
    if args.out:
        args.out.write_text(json.dumps(reports, indent=1))
    print(f"\nlogs in {work}")
    sys.exit(
        0
        if all(not r["crashes"] and not r["hangs"] and not r["failed_checks"] for r in reports)
        else 1
    )


if __name__ == "__main__":
    main()
