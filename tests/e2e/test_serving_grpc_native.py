"""The native gRPC port (nghttp2 in the server's IO threads) from outside its process:
h2load and nghttp (nghttp2's own clients, Debian's nghttp2-client) posting
ModelInferRequests with raw_input_contents; clients that reset their stream or close
their connection while the call is queued; garbage at the HTTP/2 and the gRPC layers.
The server must answer what is valid, drop what was abandoned, refuse the rest by
status, and keep serving.  And the control calls answered with no Python: while the
server's process holds the GIL."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import Built, build
from support.serving_models import ServerProcess, reference, save

grpcclient = pytest.importorskip("tritonclient.grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

from paddle_ipu.serving.saved_model import compile_model  # noqa: E402

WAIT = 60.0
LABEL = 'model="mlp",version="1"'
PATH = "/inference.GRPCInferenceService/ModelInfer"

needs_nghttp2_client = pytest.mark.skipif(
    shutil.which("h2load") is None or shutil.which("nghttp") is None,
    reason="h2load and nghttp (apt-get install nghttp2-client)",
)


@pytest.fixture(scope="module")
def mlp() -> Built:
    paddle.enable_static()
    return build("mlp")


@pytest.fixture(scope="module")
def package(mlp: Built, tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("grpc_native")
    pkg, _ = compile_model(save(mlp, work), micro_batch_size=8, cache=False)
    return str(pkg.save(work / "mlp_b8.pkg"))


@pytest.fixture(scope="module")
def server(package: str) -> Iterator[ServerProcess]:
    srv = ServerProcess(package, "--name", "mlp", "--timeout-ms", "2", "--max-body-mb", "0.01")
    yield srv
    code, out, err = srv.terminate()
    assert code == 0, out + err


@pytest.fixture
def slow(package: str) -> Iterator[ServerProcess]:
    """Partial runs wait 3 s (the batching timeout): calls stay queued."""
    srv = ServerProcess(package, "--name", "mlp", "--timeout-ms", "3000")
    yield srv
    srv.stop()


def rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def message(x: np.ndarray, model: str = "mlp") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    return bytes(request.SerializeToString())


def framed(msg: bytes) -> bytes:
    return b"\0" + len(msg).to_bytes(4, "big") + msg


def count(srv: ServerProcess, status: int) -> float:
    key = f'paddle_ipu_requests_total{{{LABEL},status="{status}"}}'
    return srv.metrics().get(key, 0.0)


def tritonclient_infer(srv: ServerProcess, mlp: Built, seed: int) -> None:
    """A tritonclient.grpc call, checked against Paddle: the server still serves."""
    x = rows(seed, 3)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp])
    name = result.get_response().outputs[0].name
    np.testing.assert_allclose(
        result.as_numpy(name), reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6
    )
    client.close()


def nghttp(srv: ServerProcess, body: bytes, tmp: Path, *headers: str) -> str:
    """One call by nghttp; its verbose output (the frames and headers received)."""
    path = tmp / "body.bin"
    path.write_bytes(body)
    argv = ["nghttp", "-v", "-n", "-t", "30", "-d", str(path)]
    for h in ("content-type: application/grpc", "te: trailers", *headers):
        argv += ["-H", h]
    argv.append(f"http://127.0.0.1:{srv.grpc_port}{PATH}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


def grpc_status(out: str) -> tuple[int, str]:
    """The grpc-status and grpc-message nghttp printed."""
    code, text = -1, ""
    for line in out.splitlines():
        words = line.split()
        if "grpc-status:" in words:
            code = int(words[words.index("grpc-status:") + 1])
        if "grpc-message:" in words:
            text = line.split("grpc-message:", 1)[1].strip()
    return code, text


# -- load ------------------------------------------------------------------------------


@needs_nghttp2_client
def test_h2load_calls_are_all_answered(server: ServerProcess, tmp_path: Path) -> None:
    """32 connections of h2load (its own process): no error, and every call it counts
    is a 200 in the server's own counters (gRPC errors would travel in trailers)."""
    body = tmp_path / "call.bin"
    body.write_bytes(framed(message(rows(1, 1))))
    before = count(server, 200)
    out = subprocess.run(
        ["h2load", "-c32", "-m1", "-t1", "-n", "3200", "-d", str(body),
         "-H", "content-type: application/grpc", "-H", "te: trailers",
         f"http://127.0.0.1:{server.grpc_port}{PATH}"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    line = next(ln for ln in out.splitlines() if ln.startswith("requests:"))
    words = line.replace(",", "").split()
    succeeded, failed, errored = int(words[7]), int(words[9]), int(words[11])
    assert (succeeded, failed, errored) == (3200, 0, 0), out
    assert "3200 2xx" in out.replace(",", ""), out
    assert count(server, 200) - before == 3200


@needs_nghttp2_client
def test_nghttp_answer_is_paddles(server: ServerProcess, mlp: Built, tmp_path: Path) -> None:
    """nghttp's call: the status trailer, and the response message's outputs as
    Paddle's CPU executor computes them."""
    x = rows(2, 2)
    out = nghttp(server, framed(message(x)), tmp_path, "traceparent: 00-ab-cd-01")
    assert grpc_status(out)[0] == 0, out
    assert "content-type: application/grpc" in out
    path = tmp_path / "body.bin"
    body = subprocess.run(
        ["nghttp", "-t", "30", "-d", str(path), "-H", "content-type: application/grpc",
         "-H", "te: trailers", f"http://127.0.0.1:{server.grpc_port}{PATH}"],
        capture_output=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    response = service_pb2.ModelInferResponse.FromString(body[5:])
    assert response.model_name == "mlp" and list(response.outputs[0].shape) == [2, 10]
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 10)
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)


# -- cancel and timeouts -----------------------------------------------------------------


def hpack_literal(name: str, value: str) -> bytes:
    """A header field as HPACK's literal without indexing, new name (RFC 7541 6.2.2)."""
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return b"\0" + bytes([len(n)]) + n + bytes([len(v)]) + v


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")  # and empty SETTINGS


def call_headers(port: int, timeout: str | None = None) -> bytes:
    """A ModelInfer call's header block."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if timeout:
        fields.append(("grpc-timeout", timeout))
    return b"".join(hpack_literal(k, v) for k, v in fields)


def raw_call(port: int, body: bytes, timeout: str | None = None) -> socket.socket:
    """A socket that has sent one ModelInfer call on stream 1 (END_STREAM)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    s.sendall(PREFACE + frame(1, 0x4, 1, call_headers(port, timeout)) + frame(0, 0x1, 1, body))
    return s


def frames(s: socket.socket, until: float) -> Iterator[tuple[int, int, int, bytes]]:
    """The frames the server sends (type, flags, stream, payload) until it closes."""
    buf = b""
    s.settimeout(0.5)
    while time.monotonic() < until:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return
        buf += chunk
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            yield buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9 : 9 + n]
            buf = buf[9 + n :]


def in_flight(srv: ServerProcess) -> float:
    return srv.metrics()[f"paddle_ipu_in_flight_units{{{LABEL}}}"]


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_reset_stream_and_closed_connection_drop_queued_calls(
    slow: ServerProcess, mlp: Built
) -> None:
    body = framed(message(rows(3, 2)))
    a = raw_call(slow.grpc_port, body)
    wait_for(lambda: in_flight(slow) == 2, "the first call is queued")
    a.sendall(frame(3, 0, 1, struct.pack(">I", 8)))  # RST_STREAM (CANCEL)
    wait_for(lambda: in_flight(slow) == 0, "the reset call leaves the queue")
    b = raw_call(slow.grpc_port, body)
    wait_for(lambda: in_flight(slow) == 2, "the second call is queued")
    b.close()
    wait_for(lambda: in_flight(slow) == 0, "the abandoned call leaves the queue")
    a.close()
    metrics = slow.metrics()
    assert metrics[f"paddle_ipu_disconnected_total{{{LABEL}}}"] == 2
    assert metrics[f"paddle_ipu_runs_total{{{LABEL}}}"] == 0  # neither was computed
    tritonclient_infer(slow, mlp, 4)  # 3 rows: runs after the 3 s batching timeout


def test_grpc_timeout_header_ends_the_call_in_time(slow: ServerProcess) -> None:
    """grpc-timeout 300m: the server answers DEADLINE_EXCEEDED itself, before it."""
    t0 = time.monotonic()
    s = raw_call(slow.grpc_port, framed(message(rows(5, 1))), timeout="300m")
    got = next((f for f in frames(s, time.monotonic() + WAIT) if f[2] == 1 and f[0] == 1), None)
    took = time.monotonic() - t0
    s.close()
    assert got is not None, "no HEADERS answered the call"
    assert 0.2 < took < 2.5  # the 3 s batching timeout never came
    wait_for(lambda: in_flight(slow) == 0, "the call left the queue")
    metrics = slow.metrics()
    assert metrics[f"paddle_ipu_timed_out_total{{{LABEL}}}"] == 1
    assert metrics[f"paddle_ipu_runs_total{{{LABEL}}}"] == 0


# -- garbage ---------------------------------------------------------------------------


def test_not_http2_is_closed_and_serving_goes_on(server: ServerProcess, mlp: Built) -> None:
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=WAIT) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
        kinds = [f[0] for f in frames(s, time.monotonic() + WAIT)]  # ends: closed
    assert 1 not in kinds  # no response HEADERS
    tritonclient_infer(server, mlp, 6)


def test_bad_frames_get_goaway_and_serving_goes_on(server: ServerProcess, mlp: Built) -> None:
    for bad in (
        frame(0, 0x1, 0, b"data on stream 0"),  # DATA on the connection: PROTOCOL_ERROR
        frame(1, 0x4, 2, b"\xff\xff\xff\xff"),  # HEADERS of undecodable HPACK
        frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"),  # SETTINGS_INITIAL_WINDOW_SIZE too large
        frame(8, 0, 0, b"\x00"),  # WINDOW_UPDATE of the wrong length
    ):
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=WAIT) as s:
            s.sendall(PREFACE + bad)
            kinds = [f[0] for f in frames(s, time.monotonic() + WAIT)]
        assert 7 in kinds, (bad, kinds)  # GOAWAY, then the server closed
    tritonclient_infer(server, mlp, 7)


@needs_nghttp2_client
def test_bad_messages_are_refused_by_status(server: ServerProcess, tmp_path: Path) -> None:
    good = framed(message(rows(8, 1)))
    cases = [
        (good[:-3], 3, "prefix says"),  # shorter than its prefix
        (good + b"\0\0\0\0\0", 3, "prefix says"),  # a second message on a unary call
        (b"\1" + good[1:], 12, "compressed"),  # compressed, no grpc-encoding
        (b"\0\0", 3, "no message"),
        (framed(b"\xff\xff\xff"), 3, "malformed ModelInferRequest"),
        (framed(message(rows(9, 1), model="nope")), 5, "'nope'"),
        (framed(message(rows(10, 200))), 8, "--max-body-mb"),  # 12.8 KB > 0.01 MiB
    ]
    key = 'paddle_ipu_unrouted_requests_total{status="413"}'
    over = server.metrics().get(key, 0.0)
    for body, code, text in cases:
        got = grpc_status(nghttp(server, body, tmp_path))
        assert got[0] == code and text in got[1], (body[:16], got)
    assert server.metrics()[key] == over + 1  # the message over the limit, counted
    bad_timeout = nghttp(server, good, tmp_path, "grpc-timeout: soon")
    assert grpc_status(bad_timeout)[0] == 3


# -- ModelStreamInfer --------------------------------------------------------------------


def test_model_stream_infer_answers_every_request(server: ServerProcess, mlp: Built) -> None:
    """tritonclient's bidirectional stream: every request answered on the stream (as
    Paddle's CPU executor does), a bad one by an error naming its input, the stream
    still serving after it."""
    import queue

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    xs = {f"r{i}": rows(20 + i, 1 + i % 4) for i in range(12)}
    items = list(xs.items())
    for k, (rid, x) in enumerate(items):
        if k == 6:
            bad = grpcclient.InferInput("x", [2, 15], "FP32")
            bad.set_data_from_numpy(np.zeros((2, 15), np.float32))
            client.async_stream_infer("mlp", [bad], request_id="bad")
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client.async_stream_infer("mlp", [inp], request_id=rid)
    got: dict[str, Any] = {}
    errors: list[Any] = []
    for _ in range(len(xs) + 1):
        result, error = answers.get(timeout=WAIT)
        if error is not None:
            errors.append(error)
        else:
            got[result.get_response().id] = result
    client.stop_stream()
    client.close()
    assert sorted(got) == sorted(xs)
    for rid, x in xs.items():
        name = got[rid].get_response().outputs[0].name
        np.testing.assert_allclose(
            got[rid].as_numpy(name), reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6
        )
    assert len(errors) == 1 and "'x'" in str(errors[0]) and "15" in str(errors[0]), errors
    assert answers.empty()


def test_a_cancelled_stream_drops_its_queued_calls(slow: ServerProcess, mlp: Built) -> None:
    client = grpcclient.InferenceServerClient(slow.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    for seed in (30, 31):
        inp = grpcclient.InferInput("x", [2, 16], "FP32")
        inp.set_data_from_numpy(rows(seed, 2))
        client.async_stream_infer("mlp", [inp])
    wait_for(lambda: in_flight(slow) == 4, "the stream's calls are queued")
    client.stop_stream(cancel_requests=True)
    wait_for(lambda: in_flight(slow) == 0, "the cancelled stream's calls leave the queue")
    client.close()
    metrics = slow.metrics()
    assert metrics[f"paddle_ipu_disconnected_total{{{LABEL}}}"] == 2
    assert metrics[f"paddle_ipu_runs_total{{{LABEL}}}"] == 0
    tritonclient_infer(slow, mlp, 32)


def test_a_connection_holds_at_most_twice_the_body_limit(server: ServerProcess, mlp: Built) -> None:
    """Calls whose messages arrive slowly: a connection's unfinished messages may hold
    twice --max-body-mb (10 KiB here); the call that would go beyond is refused and
    counted, the others go on."""
    key = 'paddle_ipu_unrouted_requests_total{status="413"}'
    before = server.metrics().get(key, 0.0)
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=WAIT) as s:
        s.sendall(PREFACE)
        for stream in (1, 3, 5):  # 9,000 bytes each, none complete
            block = call_headers(server.grpc_port)
            s.sendall(frame(1, 0x4, stream, block) + frame(0, 0, stream, b"\0" * 9000))
        wait_for(lambda: server.metrics().get(key, 0.0) == before + 1, "the third is refused")
    assert server.metrics().get(key, 0.0) == before + 1
    tritonclient_infer(server, mlp, 40)


# An InferenceServer in its own process that holds the GIL on demand: libc's sleep
# called through ctypes.PyDLL, which does not release it.
GIL_HOLDER = """
import ctypes, sys
from paddle_ipu.serving.model_runtime import ModelRuntime
from paddle_ipu.serving.package import load_package
from paddle_ipu.serving.server import InferenceServer

runtime = ModelRuntime(load_package(sys.argv[1]).executor(), timeout_ms=1.0)
srv = InferenceServer(runtime, name="mlp", port=0, grpc_port=0).start()
print(srv.port, srv.grpc_port, flush=True)
for line in sys.stdin:
    print("holding", flush=True)
    ctypes.PyDLL(None).sleep(int(line))
    print("released", flush=True)
srv.stop()
"""


def test_config_and_statistics_answer_while_python_holds_the_gil(package: str) -> None:
    """ModelConfig and ModelStatistics need no Python: answered while the server's
    process holds the GIL, and as HTTP answers them."""
    import select
    import sys
    import tempfile

    httpclient = pytest.importorskip("tritonclient.http")
    from support.kserve_forms import config_and_statistics

    proc = subprocess.Popen(
        [sys.executable, "-c", GIL_HOLDER, package],
        cwd=tempfile.gettempdir(),  # the installed paddle_ipu, not the checkout's folder
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port, grpc_port = proc.stdout.readline().split()
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        inp = grpcclient.InferInput("x", [3, 16], "FP32")
        inp.set_data_from_numpy(rows(1, 3))
        client.infer("mlp", [inp])
        proc.stdin.write("3\n")  # seconds
        proc.stdin.flush()
        assert proc.stdout.readline() == "holding\n"
        config = client.get_model_config("mlp", as_json=True, client_timeout=2.0)["config"]
        stats = client.get_inference_statistics("mlp", as_json=True, client_timeout=2.0)
        ready = select.select([proc.stdout], [], [], 0)[0]
        assert not ready, "answered only once the GIL was given back"
        assert proc.stdout.readline() == "released\n"
        assert config["name"] == "mlp" and stats["model_stats"][0]["inference_count"] == "3"
        # what was answered during the hold is what HTTP answers
        config_and_statistics(http, client, "mlp")
        assert config == client.get_model_config("mlp", as_json=True)["config"]
        assert stats == client.get_inference_statistics("mlp", as_json=True)
    finally:
        proc.stdin.close()
        proc.wait(60)
