"""The gRPC port's control calls: latency of health, metadata, configuration and
statistics calls, this checkout's server against a peer.

``paddle-ipu serve`` of the MLP of tests/support/models.py (micro-batch 8) in its own
process, a client in this one: one channel of grpcio, ``--calls`` calls of each method
in turn, one at a time (closed loop), per round; rounds alternate between the servers
(a ratio is fair only between runs made together on a shared machine).  The methods:
ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, RepositoryIndex,
ModelConfig, ModelStatistics, and HTTP's ``GET /v2/health/live`` (one keep-alive
connection: the HTTP front end's own cost, a floor for the gRPC calls).
Every answer is decoded with tritonclient's messages and checked equal between the two
servers first.

With ``--peer DIR`` (another checkout, e.g. of main, with its ``paddle_ipu/_core``
built in place: ``pip install -e .`` there, or CMake with
``-DPADDLE_IPU_PACKAGE_DIR=DIR/paddle_ipu`` and this environment's Paddle and pybind11,
as setup.py passes them) a second server runs that checkout's ``paddle_ipu`` (this
interpreter, ``PYTHONPATH=DIR``): the table prints each method's median latency on
both and the ratio peer / this.  Without it only this checkout is measured.

    python bench/grpc_control.py [--peer /path/to/checkout] [--calls 400] [--rounds 5]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import serving  # noqa: E402 - bench/serving.py: its server process

METHODS = (
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "RepositoryIndex",
    "ModelConfig",
    "ModelStatistics",
)


class Served(serving.Served):
    """``paddle-ipu serve`` of the package (``pythonpath``: another checkout's
    paddle_ipu), on fresh ports, with a gRPC channel and an HTTP connection to it."""

    def __init__(self, package: Path, label: str, pythonpath: str | None = None) -> None:
        self.label = label
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        super().__init__(package, env=env, log_suffix=f".{label}.log")
        import grpc

        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def stop(self) -> None:
        self.channel.close()
        self.http.close()
        super().stop()


def requests() -> dict[str, tuple[bytes, Any]]:
    """Each method's serialized request and its answer's message type."""
    from tritonclient.grpc import service_pb2 as pb

    return {
        "ServerLive": (pb.ServerLiveRequest().SerializeToString(), pb.ServerLiveResponse),
        "ServerReady": (pb.ServerReadyRequest().SerializeToString(), pb.ServerReadyResponse),
        "ModelReady": (pb.ModelReadyRequest(name="m").SerializeToString(), pb.ModelReadyResponse),
        "ServerMetadata": (
            pb.ServerMetadataRequest().SerializeToString(),
            pb.ServerMetadataResponse,
        ),
        "ModelMetadata": (
            pb.ModelMetadataRequest(name="m").SerializeToString(),
            pb.ModelMetadataResponse,
        ),
        "RepositoryIndex": (
            pb.RepositoryIndexRequest().SerializeToString(),
            pb.RepositoryIndexResponse,
        ),
        "ModelConfig": (
            pb.ModelConfigRequest(name="m").SerializeToString(),
            pb.ModelConfigResponse,
        ),
        "ModelStatistics": (
            pb.ModelStatisticsRequest(name="m").SerializeToString(),
            pb.ModelStatisticsResponse,
        ),
    }


def call(srv: Served, method: str, body: bytes) -> bytes:
    stub = srv.channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
    return bytes(stub(body, timeout=30))


def http_live(srv: Served) -> bytes:
    srv.http.request("GET", "/v2/health/live")
    response = srv.http.getresponse()
    body = response.read()
    assert response.status == 200, (response.status, body)
    return body


def latencies(srv: Served, method: str, body: bytes, calls: int) -> list[float]:
    stub = srv.channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        stub(body, timeout=30)
        out.append(time.perf_counter() - t0)
    return out


def http_latencies(srv: Served, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        http_live(srv)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", default=None)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import paddle
    from google.protobuf import json_format
    from support.models import build
    from support.serving_models import save

    from paddle_ipu.serving.saved_model import compile_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paddle.enable_static()
        pkg, _ = compile_model(save(build("mlp"), work), micro_batch_size=8, cache=False)
        package = Path(pkg.save(work / "mlp_b8.pkg"))
        servers = [Served(package, "this")]
        if args.peer:
            servers.append(Served(package, "peer", str(Path(args.peer).resolve())))
        try:
            reqs = requests()
            # The answers, decoded by tritonclient's messages, agree between the servers.
            for method, (body, answer) in reqs.items():
                decoded = [
                    json_format.MessageToDict(answer.FromString(call(s, method, body)))
                    for s in servers
                ]
                assert all(d == decoded[0] for d in decoded), (method, decoded)
                assert decoded[0] or method in ("ServerLive", "ServerReady"), method
            assert json_format.MessageToDict(
                reqs["ServerLive"][1].FromString(call(servers[0], "ServerLive", b""))
            ) == {"live": True}
            for s in servers:  # warm: connections open, first calls done
                for method, (body, _) in reqs.items():
                    latencies(s, method, body, 20)
                http_latencies(s, 20)
            medians: dict[str, dict[str, list[float]]] = {s.label: {} for s in servers}
            for r in range(args.rounds):
                for s in servers if r % 2 == 0 else servers[::-1]:
                    for method, (body, _) in reqs.items():
                        lat = latencies(s, method, body, args.calls)
                        medians[s.label].setdefault(method, []).append(statistics.median(lat))
                    lat = http_latencies(s, args.calls)
                    medians[s.label].setdefault("HTTP live", []).append(statistics.median(lat))
        finally:
            for s in servers:
                s.stop()

    names = [*METHODS, "HTTP live"]
    print(
        f"{args.calls} calls per method per round, {args.rounds} rounds, one at a time; "
        "median latency in µs (median of the rounds' medians)"
    )
    header = f"  {'method':16} {'this':>8}"
    if args.peer:
        header += f" {'peer':>8} {'peer/this':>9}"
    print(header)
    result: dict[str, Any] = {}
    for name in names:
        this = statistics.median(medians["this"][name]) * 1e6
        line = f"  {name:16} {this:8.1f}"
        result[name] = {"this_us": this}
        if args.peer:
            peer = statistics.median(medians["peer"][name]) * 1e6
            ratios = [p / t for p, t in zip(medians["peer"][name], medians["this"][name])]
            ratio = statistics.median(ratios)
            line += f" {peer:8.1f} {ratio:8.2f}x"
            result[name].update(peer_us=peer, ratio=ratio)
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
