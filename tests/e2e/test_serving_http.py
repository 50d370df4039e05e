"""The HTTP server (KServe v2 / Triton protocol) in this process, over loopback, checked
with tritonclient.http (a client we did not write) and a raw HTTP client; the server in
its own process is tested in test_serving_protocols."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import Built, build
from support.serving_models import raw, reference, save

httpclient = pytest.importorskip("tritonclient.http")

from paddle_ipu.serving.model_runtime import ModelRuntime  # noqa: E402
from paddle_ipu.serving.saved_model import compile_model  # noqa: E402
from paddle_ipu.serving.server import InferenceServer  # noqa: E402

WAIT = 60.0


@pytest.fixture(scope="module")
def mlp() -> Built:
    paddle.enable_static()
    return build("mlp")


@pytest.fixture(scope="module")
def package(mlp: Built, tmp_path_factory: pytest.TempPathFactory) -> Any:
    prefix = save(mlp, tmp_path_factory.mktemp("saved"))
    pkg, _ = compile_model(prefix, micro_batch_size=8, cache=False)
    return pkg


@pytest.fixture
def server(package: Any) -> Iterator[InferenceServer]:
    # 32 micro-batches in flight: the concurrent test's 24 requests fit (the queue's
    # bound answers 503 beyond it, see test_serving_protocols)
    runtime = ModelRuntime(package.executor(), timeout_ms=2.0, num_buffers=32)
    srv = InferenceServer(runtime, name="mlp", port=0).start()
    yield srv
    srv.stop()


def infer_json(srv: InferenceServer, x: np.ndarray, name: str = "x") -> tuple[int, Any]:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }
    ).encode()
    status, _, data = raw(srv, "POST", "/v2/models/mlp/infer", body)
    return status, json.loads(data)


def test_health_and_metadata_with_tritonclient(server: InferenceServer) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp")
    meta = client.get_model_metadata("mlp")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"][0]["datatype"] == "FP32" and meta["outputs"][0]["shape"] == [-1, 10]
    assert not client.is_model_ready("other")
    client.close()


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_infer_matches_paddle(
    server: InferenceServer, mlp: Built, binary: bool
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    out_name = json.loads(raw(server, "GET", "/v2/models/mlp")[2])["outputs"][0]["name"]
    for rows in (1, 3, 8, 13):
        x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        outs = [httpclient.InferRequestedOutput(out_name, binary_data=binary)]
        result = client.infer("mlp", [inp], outputs=outs)
        got = result.as_numpy(out_name)
        np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    client.close()


def test_concurrent_clients_get_their_own_rows(server: InferenceServer, mlp: Built) -> None:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((int(n), 16)).astype(np.float32) for n in rng.integers(1, 8, 24)]
    results: dict[int, Any] = {}

    def client(i: int) -> None:
        results[i] = infer_json(server, xs[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    for i, x in enumerate(xs):
        status, doc = results[i]
        assert status == 200, doc
        out = doc["outputs"][0]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    assert server.runtime.stats().runs < len(xs)  # requests were batched together


def test_bad_requests_get_4xx_naming_the_input(server: InferenceServer) -> None:
    x = np.ones((2, 16), np.float32)
    status, doc = infer_json(server, np.ones((2, 15), np.float32))
    assert status == 400 and "'x'" in doc["error"] and "[2, 15]" in doc["error"]
    status, doc = infer_json(server, x, name="y")
    assert status == 400 and "unknown input 'y'" in doc["error"]
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": [1.0] * 5}]}
    ).encode()
    status, _, data = raw(server, "POST", "/v2/models/mlp/infer", body)
    assert status == 400 and "input 'x'" in json.loads(data)["error"]
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "BYTES", "data": ["a"]}]}
    ).encode()
    status, _, data = raw(server, "POST", "/v2/models/mlp/infer", body)
    assert status == 400 and "input 'x'" in json.loads(data)["error"]
    status, _, data = raw(server, "POST", "/v2/models/mlp/infer", b"{not json")
    assert status == 400 and "JSON" in json.loads(data)["error"]
    status, _, data = raw(
        server,
        "POST",
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2, 16],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 128},
                    }
                ]
            }
        ).encode()
        + b"\0" * 64,
        {"Inference-Header-Content-Length": "96"},
    )
    assert status == 400
    status, _, _ = raw(server, "POST", "/v2/models/nope/infer", b"{}")
    assert status == 404
    # tritonclient sees the message too
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    inp = httpclient.InferInput("x", [2, 15], "FP32")
    inp.set_data_from_numpy(np.ones((2, 15), np.float32))
    with pytest.raises(Exception, match="'x'"):
        client.infer("mlp", [inp])
    client.close()
    # and the server still answers
    status, doc = infer_json(server, x)
    assert status == 200


def test_metrics_in_prometheus_format(server: InferenceServer) -> None:
    for rows in (1, 2, 3):
        assert infer_json(server, np.ones((rows, 16), np.float32))[0] == 200
    assert infer_json(server, np.ones((1, 3), np.float32))[0] == 400
    status, headers, body = raw(server, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    label = 'model="mlp",version="1"'
    assert values[f'paddle_ipu_requests_total{{{label},status="200"}}'] == 3
    assert values[f'paddle_ipu_requests_total{{{label},status="400"}}'] == 1
    assert values[f"paddle_ipu_request_rows_total{{{label}}}"] == 6
    assert values[f"paddle_ipu_batch_size_sum{{{label}}}"] == 6
    assert values[f"paddle_ipu_compute_seconds_total{{{label}}}"] > 0
    runs = values[f"paddle_ipu_runs_total{{{label}}}"]
    assert values[f'paddle_ipu_batch_size_bucket{{{label},le="+Inf"}}'] == runs >= 1


def test_graceful_stop_answers_requests_in_flight(package: Any, mlp: Built) -> None:
    runtime = ModelRuntime(package.executor(), timeout_ms=2.0)
    gate, entered = threading.Event(), threading.Event()
    run = runtime.executor.run

    def slow_run(feed: Any) -> Any:
        entered.set()
        assert gate.wait(WAIT)
        return run(feed)

    runtime.executor.run = slow_run  # type: ignore[method-assign]
    srv = InferenceServer(runtime, name="mlp", port=0).start()
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    answer: list[Any] = []
    caller = threading.Thread(target=lambda: answer.append(infer_json(srv, x)))
    caller.start()
    assert entered.wait(WAIT)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive()  # waiting for the request in flight
    gate.set()
    stopper.join(WAIT)
    caller.join(WAIT)
    status, doc = answer[0]
    assert status == 200
    out = doc["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    assert runtime.closed
    with pytest.raises(OSError):
        raw(srv, "GET", "/v2/health/live")


def test_lifecycle_options_are_checked(package: Any, tmp_path: Any) -> None:
    from paddle_ipu.errors import OptionError

    runtime = ModelRuntime(package.executor(), timeout_ms=2.0)
    try:
        for kwargs, match in (
            ({"warmup": -1}, "warmup must be >= 0"),
            ({"drain_grace_s": -0.5}, "drain_grace_s must be >= 0"),
            ({"instances": 0}, "instances must be >= 1"),
        ):
            with pytest.raises(OptionError, match=match):
                InferenceServer(runtime, name="mlp", port=0, **kwargs)
        with pytest.raises(OSError, match="cannot open the access log"):
            InferenceServer(runtime, name="mlp", port=0, access_log=str(tmp_path / "no" / "a.log"))
    finally:
        runtime.close()


def test_access_log_and_histograms_cover_every_model(package: Any, tmp_path: Any) -> None:
    log_path = tmp_path / "access.log"
    first = ModelRuntime(package.executor(), timeout_ms=2.0)
    second = ModelRuntime(package.executor(), timeout_ms=2.0)
    srv = InferenceServer(first, name="a", port=0, access_log=str(log_path))
    srv.add_model(second, "b", "3")
    srv.start()
    try:
        body = json.dumps(
            {"id": "q", "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                    "data": [0.5] * 16}]}
        ).encode()  # fmt: skip
        assert raw(srv, "POST", "/v2/models/a/infer", body)[0] == 200
        assert raw(srv, "POST", "/v2/models/b/versions/3/infer", body)[0] == 200
        assert raw(srv, "POST", "/v2/models/c/infer", body)[0] == 404
        text = raw(srv, "GET", "/metrics")[2].decode()
    finally:
        srv.stop()
    for model, version in (("a", "1"), ("b", "3")):
        key = f'paddle_ipu_request_duration_seconds_count{{model="{model}",version="{version}"}} 1'
        assert key in text
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    got = [(e["model"], e["version"], e["status"], e["id"]) for e in lines]
    assert got == [("a", "1", 200, "q"), ("b", "3", 200, "q"), ("c", None, 404, None)]
