"""``paddle-ipu serve`` in its own process, with real clients over loopback:
tritonclient.http and tritonclient.grpc (clients we did not write), raw HTTP, raw
sockets.  Answers are checked against Paddle's CPU executor on the original program;
the policies (busy, timeouts, disconnects, drain on SIGTERM, body limit) and bad input
(fuzzed with hypothesis over the raw bytes) are checked from outside the server."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kserve_forms import config_and_statistics
from support.models import Built, build
from support.serving_models import ServerProcess, raw, reference, save

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from paddle_ipu.serving.saved_model import compile_model  # noqa: E402

WAIT = 60.0
MBS = 8


@pytest.fixture(scope="module")
def mlp() -> Built:
    paddle.enable_static()
    return build("mlp")


@pytest.fixture(scope="module")
def packages(mlp: Built, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The MLP compiled with micro-batch 8 (auto-batching) and 1 (one row per run)."""
    work = tmp_path_factory.mktemp("serving")
    prefix = save(mlp, work)
    out = {}
    for mbs in (MBS, 1):
        pkg, _ = compile_model(prefix, micro_batch_size=mbs, cache=False)
        out[f"b{mbs}"] = str(pkg.save(work / f"mlp_b{mbs}.pkg"))
    return out


@pytest.fixture(scope="module")
def server(packages: dict[str, str]) -> Iterator[ServerProcess]:
    srv = ServerProcess(packages[f"b{MBS}"], "--name", "mlp", "--timeout-ms", "2")
    yield srv
    code, out, err = srv.terminate()
    assert code == 0, out + err


def out_name(srv: ServerProcess) -> str:
    client = httpclient.InferenceServerClient(srv.url)
    name = str(client.get_model_metadata("mlp")["outputs"][0]["name"])
    client.close()
    return name


def binary_body(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> tuple[bytes, int]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(x.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return head + x.tobytes(), len(head)


def infer_http(srv: ServerProcess, x: np.ndarray, **kw: Any) -> tuple[int, dict[str, str], Any]:
    body, n = binary_body(x)
    status, headers, data = raw(
        srv,
        "POST",
        "/v2/models/mlp/infer",
        body,
        {"Inference-Header-Content-Length": str(n), **kw},
    )
    if status != 200:
        return status, headers, json.loads(data)
    n = int(headers["Inference-Header-Content-Length"])
    head = json.loads(data[:n])
    out = head["outputs"][0]
    return status, headers, np.frombuffer(data[n:], np.float32).reshape(out["shape"])


def rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


# -- the protocols, with Triton's clients --------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_http_equals_paddle(server: ServerProcess, mlp: Built, binary: bool) -> None:
    client = httpclient.InferenceServerClient(server.url)
    name = out_name(server)
    for n in (1, 3, 8, 13):
        x = rows(n, n)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        outs = [httpclient.InferRequestedOutput(name, binary_data=binary)]
        result = client.infer("mlp", [inp], outputs=outs, request_id=f"r{n}")
        assert result.get_response()["id"] == f"r{n}"
        np.testing.assert_allclose(
            result.as_numpy(name), reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6
        )
    client.close()


def test_tritonclient_grpc_equals_paddle(server: ServerProcess, mlp: Built) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and not client.is_model_ready("other")
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "16"]}]
    name = meta["outputs"][0]["name"]
    assert client.get_server_metadata().name == "paddle-ipu"
    for n in (1, 5, 8, 19):
        x = rows(100 + n, n)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("mlp", [inp], request_id=f"g{n}")
        assert result.get_response().id == f"g{n}"
        np.testing.assert_allclose(
            result.as_numpy(name), reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6
        )
    client.close()


def test_grpc_control_calls_answer_what_http_answers(server: ServerProcess) -> None:
    """The read-only RPCs (answered in C++ from the server's state) against the HTTP
    routes' JSON, decoded by tritonclient's messages; their errors by status code."""
    http_client = httpclient.InferenceServerClient(server.url)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    meta = http_client.get_server_metadata()
    gmeta = client.get_server_metadata()
    assert (gmeta.name, gmeta.version) == (meta["name"], meta["version"])
    assert list(gmeta.extensions) == meta["extensions"] and "model_repository" in meta["extensions"]
    model = http_client.get_model_metadata("mlp")
    gmodel = client.get_model_metadata("mlp", "1")
    assert (gmodel.name, list(gmodel.versions), gmodel.platform) == (
        model["name"],
        model["versions"],
        model["platform"],
    )
    for tensors, gtensors in ((model["inputs"], gmodel.inputs), (model["outputs"], gmodel.outputs)):
        assert [(t.name, t.datatype, list(t.shape)) for t in gtensors] == [
            (t["name"], t["datatype"], t["shape"]) for t in tensors
        ]
    assert client.is_model_ready("mlp", "1") and not client.is_model_ready("mlp", "7")
    gindex = client.get_model_repository_index().models
    assert [(m.name, m.version, m.state, m.reason) for m in gindex] == [
        (m["name"], m["version"], m["state"], m["reason"])
        for m in http_client.get_model_repository_index()
    ]
    for name, version, want in (
        ("other", "", "unknown model 'other'"),
        ("mlp", "7", "no version '7'"),
    ):
        with pytest.raises(InferenceServerException, match=want) as info:
            client.get_model_metadata(name, version)
        assert info.value.status() == "StatusCode.NOT_FOUND"
    client.close()
    http_client.close()

    # raw calls: malformed and unknown-field requests, methods not offered or unknown
    from tritonclient.grpc import service_pb2

    channel = grpc.insecure_channel(server.grpc_url)

    def call(method: str, body: bytes) -> bytes:
        stub = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        return bytes(stub(body, timeout=WAIT))

    for method in ("ServerLive", "ModelReady", "ModelMetadata"):
        with pytest.raises(grpc.RpcError) as err:
            call(method, b"\x0a\x05ab")  # a string field cut short
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert f"malformed {method} request" in str(err.value.details())
    # a field this message does not have (9, a varint) is passed over, as protobuf does
    ready = service_pb2.ModelReadyRequest(name="mlp").SerializeToString() + b"\x48\x01"
    assert service_pb2.ModelReadyResponse.FromString(call("ModelReady", ready)).ready
    for method, want in (
        ("SystemSharedMemoryStatus", "not offered"),
        ("TraceSetting", "not offered"),
        ("NoSuchMethod", "has no method 'NoSuchMethod'"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(method, b"")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
        assert want in str(err.value.details()), err.value.details()
    channel.close()


def test_config_index_and_statistics_on_both_protocols(server: ServerProcess) -> None:
    http_client = httpclient.InferenceServerClient(server.url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    config = http_client.get_model_config("mlp")
    assert config["max_batch_size"] == 64 * MBS  # max_request_rows: 64 runs' worth
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}]
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 2000  # --timeout-ms 2
    assert batching["preferred_batch_size"] == [MBS]
    assert batching["default_queue_policy"]["max_queue_size"] == 64 * MBS  # --num-buffers 64
    gconfig = grpc_client.get_model_config("mlp", as_json=True)["config"]
    assert gconfig["max_batch_size"] == config["max_batch_size"]
    assert gconfig["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"
    index = http_client.get_model_repository_index()
    assert index == [{"name": "mlp", "version": "1", "state": "READY", "reason": ""}]
    gindex = grpc_client.get_model_repository_index(as_json=True)
    assert gindex["models"] == [{"name": "mlp", "version": "1", "state": "READY"}]

    before = http_client.get_inference_statistics("mlp")["model_stats"][0]
    x = rows(7, 3)
    inp = httpclient.InferInput("x", [3, 16], "FP32")
    inp.set_data_from_numpy(x)
    http_client.infer("mlp", [inp])
    ginp = grpcclient.InferInput("x", [3, 16], "FP32")
    ginp.set_data_from_numpy(x)
    grpc_client.infer("mlp", [ginp])
    after = http_client.get_inference_statistics("mlp")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 6
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == 2
    gstats = grpc_client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert int(gstats["inference_count"]) >= after["inference_count"]
    assert sum(int(b["compute_infer"]["count"]) for b in gstats["batch_stats"]) == int(
        gstats["execution_count"]
    )
    # the gRPC answers say what the HTTP ones say, field by field (the model by name,
    # by name and version, and every model's statistics)
    for version in ("", "1"):
        stats = config_and_statistics(http_client, grpc_client, "mlp", version)
        assert stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 2
    config_and_statistics(http_client, grpc_client)
    http_client.close()
    grpc_client.close()


def test_json_errors_on_every_route(server: ServerProcess) -> None:
    for method, path, want in (
        ("GET", "/", 404),
        ("GET", "/v2/nothing", 404),
        ("GET", "/v2/models/mlp/nothing", 404),
        ("GET", "/v2/models/nope", 404),
        ("GET", "/v2/models/nope/config", 404),
        ("GET", "/v2/models/mlp/versions/7/ready", 404),
        ("POST", "/v2/models/mlp", 405),
        ("GET", "/v2/models/mlp/infer", 405),
        ("DELETE", "/v2/health/live", 405),
        ("POST", "/v2/models/nope/infer", 404),
    ):
        status, headers, body = raw(server, method, path, b"{}" if method == "POST" else None)
        assert status == want, (method, path, body)
        assert headers["Content-Type"] == "application/json"
        assert isinstance(json.loads(body)["error"], str) and json.loads(body)["error"]


# -- bad input: named, and the server keeps serving --------------------------------------


def test_bad_input_is_named_over_http(server: ServerProcess, mlp: Built) -> None:
    x = rows(3, 2)
    body, n = binary_body(x)
    post = "/v2/models/mlp/infer"
    cases = [
        # a malformed binary header length
        ({"Inference-Header-Content-Length": "12x"}, body, "Inference-Header-Content-Length"),
        ({"Inference-Header-Content-Length": str(len(body) + 1)}, body, "bytes"),
        # a header cut inside the JSON
        ({"Inference-Header-Content-Length": str(n - 5)}, body, "JSON"),
        # a truncated tensor
        ({"Inference-Header-Content-Length": str(n)}, body[:-4], "input 'x'"),
    ]
    # wrong datatype and shape
    for wrong in (x.astype(np.int16), rows(3, 2)[:, :15].copy()):
        data, m = binary_body(wrong, datatype="INT16" if wrong.dtype == np.int16 else "FP32")
        cases.append(({"Inference-Header-Content-Length": str(m)}, data, "input 'x'"))
    for headers, data, word in cases:
        status, _, answer = raw(server, "POST", post, data, headers)
        assert status == 400, answer
        assert word in json.loads(answer)["error"], answer
    # an unknown input, output, model
    doc = {"inputs": [{"name": "y", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}
    status, _, answer = raw(server, "POST", post, json.dumps(doc).encode())
    assert status == 400 and "unknown input 'y'" in json.loads(answer)["error"]
    doc = {
        "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}],
        "outputs": [{"name": "nope"}],
    }
    status, _, answer = raw(server, "POST", post, json.dumps(doc).encode())
    assert status == 400 and "unknown output 'nope'" in json.loads(answer)["error"]
    # a datatype cast the runtime allows (FP64 -> FP32) gives Paddle's answer
    doc = {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP64", "data": x.tolist()}]}
    status, _, answer = raw(server, "POST", post, json.dumps(doc).encode())
    assert status == 200, answer
    out = json.loads(answer)["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    # tritonclient sees the message too, and the server still answers
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("x", [2, 15], "FP32")
    inp.set_data_from_numpy(np.ones((2, 15), np.float32))
    with pytest.raises(InferenceServerException, match="'x'"):
        client.infer("mlp", [inp])
    client.close()
    status, _, got = infer_http(server, x)
    assert status == 200
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)


def test_bad_input_is_invalid_argument_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("x", [2, 15], "FP32")
    inp.set_data_from_numpy(np.ones((2, 15), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'x'" in info.value.message() and "[2, 15]" in info.value.message()
    inp = grpcclient.InferInput("x", [2, 16], "INT8")
    inp.set_data_from_numpy(np.ones((2, 16), np.int8))
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'x'" in info.value.message() and "INT8" in info.value.message()
    inp = grpcclient.InferInput("x", [2, 16], "FP32")
    inp.set_data_from_numpy(np.ones((2, 16), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [inp])
    assert info.value.status() == "StatusCode.NOT_FOUND" and "'nope'" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [inp], outputs=[grpcclient.InferRequestedOutput("zz")])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "'zz'" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert client.infer("mlp", [inp]).as_numpy(out_name(server)).shape == (2, 10)
    client.close()


def valid_request() -> bytes:
    x = rows(11, 2)
    body, n = binary_body(x)
    return (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
        + f"Inference-Header-Content-Length: {n}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def send_raw(port: int, data: bytes) -> bytes:
    """Send, close the sending side, read until the server closes. (A request the
    server admitted is then dropped as its client's: an end of stream before the
    answer is a client gone; the bad ones are answered before they are admitted.)"""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzzed_http_bytes_get_4xx_and_the_server_keeps_serving(
    server: ServerProcess, data: Any
) -> None:
    request = bytearray(valid_request())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, len(request) - 1))
        if kind == "flip":
            request[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            request = request[: max(at, 1)]
        elif kind == "insert":
            request[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif len(request) > 1:
            del request[at]
    answer = send_raw(server.port, bytes(request))
    if not answer:  # the request never completed (a cut): the server just closes
        return
    # The first answer (the rest of the bytes may have made more requests).
    head, _, rest = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    assert status in (200, 400, 404, 405, 413, 431), answer[:300]
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    body = rest[: int(fields[b"Content-Length"])]
    if status != 200:
        assert fields[b"Content-Type"] == b"application/json"
        assert json.loads(body)["error"]


def test_a_client_that_expects_100_continue_is_told_to_go_on(
    server: ServerProcess, mlp: Built
) -> None:
    x = rows(12, 3)
    body, n = binary_body(x)
    head = (
        "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        f"Inference-Header-Content-Length: {n}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as s:
        s.sendall(head.encode())
        s.settimeout(0.9)  # curl waits 1 s for it before sending the body anyway
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.settimeout(WAIT)
        s.sendall(body)  # (no half-close: an end of stream is a client gone)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += s.recv(65536)
        fields, _, data = answer.partition(b"\r\n\r\n")
        size = int(fields.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        while len(data) < size:
            data += s.recv(65536)
    assert fields.startswith(b"HTTP/1.1 200")
    length = int(fields.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    got = np.frombuffer(data[length:], np.float32).reshape(3, 10)
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)


def test_after_the_fuzz_answers_are_right(server: ServerProcess, mlp: Built) -> None:
    x = rows(11, 2)
    status, _, got = infer_http(server, x)
    assert status == 200
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)


def test_grpc_garbage_is_invalid_argument(server: ServerProcess) -> None:
    channel = grpc.insecure_channel(server.grpc_url)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    for garbage in (b"\xff\xff\xff", b"\x0a\x05ab", b"\x2a\x03\x0a\x01"):
        with pytest.raises(grpc.RpcError) as info:
            call(garbage, timeout=WAIT)
        assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    channel.close()


# -- load: every request answered once, with its own rows ---------------------------------


def test_load_over_both_protocols_loses_and_doubles_nothing(
    server: ServerProcess, mlp: Built
) -> None:
    name = out_name(server)
    before = server.metrics()
    label = 'model="mlp",version="1"'
    errors: list[str] = []
    answered = [0]
    got: list[tuple[np.ndarray, np.ndarray]] = []  # checked after: Paddle's executor
    lock = threading.Lock()  # is not for threads

    def http_worker(w: int) -> None:
        client = httpclient.InferenceServerClient(server.url)
        for i in range(25):
            x = rows(1000 * w + i, 1 + (i * 7 + w) % 9)
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=bool(i % 2))
            r = client.infer("mlp", [inp], request_id=f"h{w}.{i}")
            if r.get_response()["id"] != f"h{w}.{i}":
                errors.append(f"h{w}.{i}")
            with lock:
                answered[0] += 1
                got.append((x, r.as_numpy(name)))
        client.close()

    def grpc_worker(w: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for i in range(25):
            x = rows(5000 * w + i, 1 + (i * 5 + w) % 11)
            inp = grpcclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            r = client.infer("mlp", [inp], request_id=f"g{w}.{i}")
            if r.get_response().id != f"g{w}.{i}":
                errors.append(f"g{w}.{i}")
            with lock:
                answered[0] += 1
                got.append((x, r.as_numpy(name)))
        client.close()

    threads = [threading.Thread(target=http_worker, args=(w,)) for w in range(8)]
    threads += [threading.Thread(target=grpc_worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 4)
    assert not errors and answered[0] == 16 * 25
    for x, y in got:  # every request got its own rows back
        np.testing.assert_allclose(y, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    after = server.metrics()
    key = f'paddle_ipu_requests_total{{{label},status="200"}}'
    assert after[key] - before[key] == 16 * 25
    runs = after[f"paddle_ipu_runs_total{{{label}}}"] - before[f"paddle_ipu_runs_total{{{label}}}"]
    assert runs < 16 * 25  # requests were batched together


# -- policies --------------------------------------------------------------------------


@pytest.fixture
def slow(packages: dict[str, str]) -> Iterator[ServerProcess]:
    """A server whose partial runs wait 3 s (the batching timeout), 8 rows in flight at
    most: requests stay queued long enough to be refused, timed out or abandoned."""
    srv = ServerProcess(
        packages[f"b{MBS}"],
        "--name",
        "mlp",
        "--timeout-ms",
        "3000",
        "--num-buffers",
        "1",
        "--request-timeout-ms",
        "20000",
    )
    yield srv
    srv.stop()


def in_flight(srv: ServerProcess) -> float:
    return srv.metrics()['paddle_ipu_in_flight_units{model="mlp",version="1"}']


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_full_queue_answers_busy_with_retry_after(slow: ServerProcess, mlp: Built) -> None:
    first: list[Any] = []
    x = rows(1, 4)
    t = threading.Thread(target=lambda: first.append(infer_http(slow, x)))
    t.start()
    wait_for(lambda: in_flight(slow) == 4, "the first request is queued")
    status, headers, doc = infer_http(slow, rows(2, 5))  # 4 + 5 > 8 rows
    assert status == 503 and headers["Retry-After"] == "1" and "busy" in doc["error"]
    client = grpcclient.InferenceServerClient(slow.grpc_url)
    inp = grpcclient.InferInput("x", [5, 16], "FP32")
    inp.set_data_from_numpy(rows(3, 5))
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [inp])
    assert info.value.status() == "StatusCode.UNAVAILABLE" and "busy" in info.value.message()
    client.close()
    t.join(WAIT)
    status, _, got = first[0]
    assert status == 200
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    assert slow.metrics()['paddle_ipu_rejected_total{model="mlp",version="1"}'] == 2


def test_request_not_started_in_time_is_504_and_never_computed(slow: ServerProcess) -> None:
    label = 'model="mlp",version="1"'
    doc = {
        "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}],
        "parameters": {"timeout": 200_000},  # microseconds, Triton's request parameter
    }
    t0 = time.monotonic()
    status, _, body = raw(slow, "POST", "/v2/models/mlp/infer", json.dumps(doc).encode())
    took = time.monotonic() - t0
    assert status == 504 and "timeout of 200 ms" in json.loads(body)["error"]
    assert 0.15 < took < 2.5  # the 3 s batching timeout never came
    client = grpcclient.InferenceServerClient(slow.grpc_url)
    inp = grpcclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(rows(4, 1))
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [inp], client_timeout=0.3)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    client.close()
    wait_for(lambda: in_flight(slow) == 0, "the timed-out requests leave the queue")
    metrics = slow.metrics()
    # The server ends the gRPC call just before the client's deadline (timed out); on a
    # loaded machine gRPC's cancellation at the deadline can come first (disconnected).
    # Either way the request leaves the queue uncomputed.
    timed_out = metrics[f"paddle_ipu_timed_out_total{{{label}}}"]
    assert timed_out >= 1  # the HTTP request
    assert timed_out + metrics[f"paddle_ipu_disconnected_total{{{label}}}"] == 2
    assert metrics[f"paddle_ipu_runs_total{{{label}}}"] == 0  # neither was computed


def test_request_of_a_client_that_went_away_is_dropped_before_it_runs(
    slow: ServerProcess, mlp: Built
) -> None:
    label = 'model="mlp",version="1"'
    with socket.create_connection(("127.0.0.1", slow.port), timeout=WAIT) as s:
        s.sendall(valid_request())
        wait_for(lambda: in_flight(slow) == 2, "the request is queued")
    # the connection is closed: the 2 rows leave the queue without being run
    wait_for(lambda: in_flight(slow) == 0, "the abandoned request leaves the queue")
    client = grpcclient.InferenceServerClient(slow.grpc_url)
    inp = grpcclient.InferInput("x", [3, 16], "FP32")
    inp.set_data_from_numpy(rows(5, 3))
    call = client.async_infer("mlp", [inp], callback=lambda result, error: None)
    wait_for(lambda: in_flight(slow) == 3, "the gRPC request is queued")
    call.cancel()
    wait_for(lambda: in_flight(slow) == 0, "the cancelled call leaves the queue")
    client.close()
    x = rows(6, 1)
    status, _, got = infer_http(slow, x)  # runs after the 3 s timeout
    assert status == 200
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    metrics = slow.metrics()
    assert metrics[f"paddle_ipu_disconnected_total{{{label}}}"] == 2
    assert metrics[f"paddle_ipu_runs_total{{{label}}}"] == 1
    assert metrics[f"paddle_ipu_batch_size_sum{{{label}}}"] == 1  # only the last row ran


def test_sigterm_drains_requests_in_flight(packages: dict[str, str], mlp: Built) -> None:
    srv = ServerProcess(packages[f"b{MBS}"], "--name", "mlp", "--timeout-ms", "1500")
    answers: dict[int, Any] = {}
    xs = {i: rows(40 + i, i) for i in (1, 2, 3)}

    def call(i: int) -> None:
        if i == 3:
            client = grpcclient.InferenceServerClient(srv.grpc_url)
            inp = grpcclient.InferInput("x", [3, 16], "FP32")
            inp.set_data_from_numpy(xs[3])
            answers[i] = client.infer("mlp", [inp]).as_numpy(out_name_cached[0])
            client.close()
        else:
            answers[i] = infer_http(srv, xs[i])[2]

    out_name_cached = [out_name(srv)]
    threads = [threading.Thread(target=call, args=(i,)) for i in xs]
    for t in threads:
        t.start()
    wait_for(lambda: in_flight(srv) == 6, "three requests are queued")
    code, out, err = srv.terminate()
    for t in threads:
        t.join(WAIT)
    assert code == 0, err
    assert "draining" in out and "stopped" in out
    for i, x in xs.items():
        np.testing.assert_allclose(answers[i], reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    with pytest.raises(OSError):
        raw(srv, "GET", "/v2/health/live")


def test_body_over_the_limit_is_413(packages: dict[str, str], mlp: Built) -> None:
    srv = ServerProcess(packages[f"b{MBS}"], "--name", "mlp", "--max-body-mb", "0.01")
    try:
        big = rows(9, 200)  # 12.8 kB of tensor
        status, _, doc = infer_http(srv, big)
        assert status == 413 and "limit" in doc["error"]
        x = rows(9, 2)
        status, _, got = infer_http(srv, x)
        assert status == 200
        np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    finally:
        srv.stop()


def test_the_serve_command_s_limits_act(packages: dict[str, str], mlp: Built) -> None:
    """--header-timeout-s and --max-headers, from the command line to the connection."""
    srv = ServerProcess(
        packages[f"b{MBS}"], "--name", "mlp", "--header-timeout-s", "1", "--max-headers", "5"
    )
    try:
        status, _, body = raw(
            srv, "GET", "/v2/health/ready", headers={f"X-{i}": "1" for i in range(5)}
        )
        assert status == 431 and "limit of 5 (--max-headers)" in json.loads(body)["error"]
        with socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT) as s:
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\n")  # and no more
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and b"within 1 s" in answer, answer
        x = rows(9, 2)
        status, _, got = infer_http(srv, x)
        assert status == 200
        np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    finally:
        srv.stop()


def test_batching_off_takes_exactly_one_micro_batch(packages: dict[str, str], mlp: Built) -> None:
    srv = ServerProcess(packages["b1"], "--name", "mlp", "--timeout-ms", "0")
    try:
        http = httpclient.InferenceServerClient(srv.url)
        config = http.get_model_config("mlp")
        assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
        assert config["input"][0]["dims"] == [1, 16]
        status, _, doc = infer_http(srv, rows(1, 2))
        assert status == 400 and "exactly one micro-batch" in doc["error"]
        x = rows(2, 1)
        status, _, got = infer_http(srv, x)
        assert status == 200
        np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
        # over gRPC the same configuration (no batching) and statistics (one failure)
        stats = config_and_statistics(http, grpcclient.InferenceServerClient(srv.grpc_url), "mlp")
        assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 1
    finally:
        srv.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_workers_share_the_ports(packages: dict[str, str], mlp: Built, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    port, gport = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "paddle_ipu", "serve", packages[f"b{MBS}"], "--name", "mlp",
         "--port", str(port), "--grpc-port", str(gport), "--workers", "2"],
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )  # fmt: skip
    try:
        served = 0
        assert proc.stdout is not None
        for line in proc.stdout:
            served += line.startswith("paddle-ipu: serving")
            if served == 2:
                break
        assert served == 2
        seen = []
        for i in range(24):  # new connections: the kernel spreads them over both
            x = rows(70 + i, 2)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
            body, n = binary_body(x)
            conn.request(
                "POST", "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": str(n)}
            )
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200
            head = int(resp.getheader("Inference-Header-Content-Length"))
            got = np.frombuffer(data[head:], np.float32).reshape(2, 10)
            np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
            conn.request("GET", "/metrics")
            metrics = conn.getresponse().read().decode()
            key = 'paddle_ipu_requests_total{model="mlp",version="1",status="200"} '
            seen.append(int(metrics.split(key)[1].split()[0]))
            conn.close()
        # Each worker counts its own requests: one process alone would have counted
        # 1, 2, ..., 24; two interleave (the kernel spreads new connections).
        assert seen != list(range(1, 25)) and sum(seen) < sum(range(1, 25))
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{gport}")
        assert client.is_model_ready("mlp")
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert out.count("stopped") == 2
