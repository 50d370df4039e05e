"""``paddle-ipu serve`` in its own process, seen from outside: health bodies as KServe's
clients read them, request parameters it does not implement refused by name, the
configuration's instance_group, /metrics read by Prometheus' own text parser (its
histograms against latencies a client in another process measured), the access log
(curl and tritonclient.grpc, with W3C trace context), the warm-up and the drain grace
on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import Built, build
from support.serving_models import ServerProcess, raw, reference, save, wait_for_lines

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

from tritonclient.utils import InferenceServerException  # noqa: E402

from paddle_ipu.serving.saved_model import compile_model  # noqa: E402

WAIT = 60.0
MBS = 8
LABEL = {"model": "mlp", "version": "1"}
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def mlp() -> Built:
    paddle.enable_static()
    return build("mlp")


@pytest.fixture(scope="module")
def package(mlp: Built, tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("lifecycle")
    pkg, _ = compile_model(save(mlp, work), micro_batch_size=MBS, cache=False)
    return str(pkg.save(work / "mlp.pkg"))


@pytest.fixture(scope="module")
def server(package: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(package, "--name", "mlp", "--timeout-ms", "2")
    yield srv
    code, out, err = srv.terminate()
    assert code == 0, out + err


def infer_body(x: np.ndarray, **extra: Any) -> bytes:
    doc = {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ],
        **extra,
    }
    return json.dumps(doc).encode()


def scrape(srv: ServerProcess) -> dict[str, Any]:
    """/metrics through prometheus_client's text parser: {family name: family}."""
    status, headers, body = raw(srv, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(body.decode())}


def gauge(families: dict[str, Any], name: str) -> float:
    return sample(families, name, name)


def sample(families: dict[str, Any], family: str, name: str, **labels: str) -> float:
    want = {**LABEL, **labels}
    values = [s.value for s in families[family].samples if s.name == name and s.labels == want]
    assert len(values) == 1, (family, name, labels)
    return float(values[0])


# -- health ------------------------------------------------------------------------------


def test_health_answers_json_bodies_that_clients_read(server: ServerProcess) -> None:
    for path, want in (
        ("/v2/health/live", {"live": True}),
        ("/v2/health/ready", {"ready": True}),
        ("/v2/models/mlp/ready", {"name": "mlp", "ready": True}),
    ):
        status, headers, body = raw(server, "GET", path)
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert json.loads(body) == want
    http_client = httpclient.InferenceServerClient(server.url)
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert http_client.is_model_ready("mlp") and not http_client.is_model_ready("other")
    http_client.close()
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    grpc_client.close()


# -- parameters --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"priority": 1}, "'priority'"),
        ({"sequence_id": 7}, "'sequence_id'"),
        ({"sequence_id": "abc"}, "'sequence_id'"),
        ({"sequence_start": True}, "'sequence_start'"),
        ({"sequence_end": True}, "'sequence_end'"),
        ({"my_custom_parameter": 42}, "'my_custom_parameter'"),
        ({"triton_enable_empty_final_response": True}, "'triton_enable_empty_final_response'"),
    ],
)
def test_unimplemented_parameters_are_refused_by_name_over_http(
    server: ServerProcess, parameters: dict[str, Any], named: str
) -> None:
    body = infer_body(np.ones((1, 16), np.float32), parameters=parameters)
    status, _, data = raw(server, "POST", "/v2/models/mlp/infer", body)
    message = json.loads(data)["error"]
    assert status == 400 and named in message and "not implemented" in message


def test_defaults_of_reserved_parameters_are_what_the_server_does(
    server: ServerProcess, mlp: Built
) -> None:
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    parameters = {
        "priority": 0,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "timeout": 5_000_000,
        "binary_data_output": False,
    }
    status, _, data = raw(
        server, "POST", "/v2/models/mlp/infer", infer_body(x, parameters=parameters)
    )
    assert status == 200, data
    out = json.loads(data)["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    status, _, data = raw(server, "POST", "/v2/models/mlp/infer", infer_body(x, parameters=[1]))
    assert status == 400 and '"parameters" must be an object' in json.loads(data)["error"]


def test_tritonclient_sequence_and_priority_are_refused_on_both_protocols(
    server: ServerProcess,
) -> None:
    x = np.ones((1, 16), np.float32)
    for client_module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        client = client_module.InferenceServerClient(url)
        inp = client_module.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        for kwargs, named in (
            ({"sequence_id": 5, "sequence_start": True}, "'sequence_"),
            ({"priority": 3}, "'priority'"),
            ({"parameters": {"custom": "on"}}, "'custom'"),
        ):
            with pytest.raises(InferenceServerException) as info:
                client.infer("mlp", [inp], **kwargs)
            assert named in info.value.message() and "not implemented" in info.value.message()
            if client_module is grpcclient:
                assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert client.infer("mlp", [inp], timeout=5_000_000) is not None  # timeout: honoured
        client.close()


# -- configuration -----------------------------------------------------------------------


def test_config_instance_group_is_one_cpu_instance(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    group = client.get_model_config("mlp")["instance_group"]
    assert group == [{"name": "mlp", "count": 1, "kind": "KIND_CPU"}]
    client.close()


@pytest.mark.slow
def test_config_instance_group_counts_the_workers(package: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "paddle_ipu", "serve", package, "--name", "mlp",
         "--port", str(port), "--workers", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tempfile.gettempdir(),  # the installed package, not a source tree's
    )  # fmt: skip
    try:
        wait_for_lines(proc, "paddle-ipu: serving", 3)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        for _ in range(3):  # whichever worker answers
            group = client.get_model_config("mlp")["instance_group"]
            assert group == [{"name": "mlp", "count": 3, "kind": "KIND_CPU"}]
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err


@pytest.mark.slow
def test_metrics_port_gathers_every_worker_in_one_scrape(package: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "paddle_ipu", "serve", package, "--name", "mlp",
         "--port", str(port), "--workers", "2", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tempfile.gettempdir(),  # the installed package, not a source tree's
    )  # fmt: skip
    try:
        lines = wait_for_lines(proc, "paddle-ipu: serving", 2)
        (metrics_url,) = [
            line.split()[-1]
            for line in lines
            if line.startswith("paddle-ipu: metrics of 2 workers on ")
        ]
        assert metrics_url.endswith("/metrics")
        import http.client

        n = 24
        for i in range(n):  # new connections: the kernel spreads them over both
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
            conn.request("POST", "/v2/models/mlp/infer", infer_body(np.full((1, 16), i, "f4")))
            assert conn.getresponse().status == 200
            conn.close()
        import urllib.request

        with urllib.request.urlopen(metrics_url, timeout=WAIT) as r:
            text = r.read().decode()
        families = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
        up = {s.labels["worker"]: s.value for s in families["paddle_ipu_worker_up"].samples}
        assert up == {"0": 1.0, "1": 1.0}
        ok = {
            s.labels["worker"]: s.value
            for s in families["paddle_ipu_requests"].samples
            if s.labels.get("status") == "200"
        }
        assert set(ok) == {"0", "1"} and sum(ok.values()) == n
        counts = [
            s.value
            for s in families["paddle_ipu_request_duration_seconds"].samples
            if s.name.endswith("_count")
        ]
        assert len(counts) == 2 and sum(counts) == n
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err


# -- metrics -----------------------------------------------------------------------------

# The load: a client in its own process, 4 connections (threads), JSON requests of one
# row, each timed from sending to the answer read; prints the latencies as JSON.
LOAD = """
import http.client, json, sys, threading, time
port, per_thread = int(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                               "data": [0.25] * 16}]}).encode()
latencies, statuses = [], []
def worker():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(per_thread):
        t0 = time.perf_counter()
        conn.request("POST", "/v2/models/mlp/infer", body)
        r = conn.getresponse(); r.read()
        latencies.append(time.perf_counter() - t0); statuses.append(r.status)
threads = [threading.Thread(target=worker) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"latencies": latencies, "statuses": statuses}))
"""


def bucket_index(bounds: list[float], value: float) -> int:
    """The histogram bucket (le) that holds `value`."""
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear within the bucket that holds rank q."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-12)
        lower, below = bound, cumulative
    raise AssertionError("no bucket holds the rank")


def test_metrics_histograms_agree_with_a_client_measured_p99(package: str) -> None:
    srv = ServerProcess(package, "--name", "mlp", "--timeout-ms", "2")
    try:
        per_thread = 300
        load = subprocess.run(
            [sys.executable, "-c", LOAD, str(srv.port), str(per_thread)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        result = json.loads(load.stdout)
        assert set(result["statuses"]) == {200}
        n = 4 * per_thread
        client_p99 = float(np.percentile(result["latencies"], 99))
        families = scrape(srv)
        family = families["paddle_ipu_request_duration_seconds"]
        assert family.type == "histogram"
        buckets = sorted(
            (float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")
        )
        assert buckets[-1] == (float("inf"), n)
        name = "paddle_ipu_request_duration_seconds"
        assert sample(families, name, name + "_count") == n
        bounds = [b for b, _ in buckets[:-1]]
        assert bounds[0] <= 1e-4 and bounds[-1] >= 10  # 100 us .. 10 s
        server_p99 = histogram_quantile(0.99, buckets)
        assert abs(bucket_index(bounds, server_p99) - bucket_index(bounds, client_p99)) <= 1, (
            server_p99,
            client_p99,
        )
        # Every request that ran was in the queue and in a graph run.
        for part in ("queue", "compute"):
            name = f"paddle_ipu_{part}_duration_seconds"
            assert families[name].type == "histogram"
            assert sample(families, name, name + "_count") == n
            assert sample(families, name, name + "_sum") > 0
        # The queue's time is its share of the request's: at most the whole.
        queue_sum = sample(
            families, "paddle_ipu_queue_duration_seconds", "paddle_ipu_queue_duration_seconds_sum"
        )
        request_sum = sample(
            families,
            "paddle_ipu_request_duration_seconds",
            "paddle_ipu_request_duration_seconds_sum",
        )
        assert 0 < queue_sum <= request_sum
        # gRPC requests count in the same series.
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        inp = grpcclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(np.ones((1, 16), np.float32))
        for _ in range(10):
            client.infer("mlp", [inp])
        client.close()
        families = scrape(srv)
        name = "paddle_ipu_request_duration_seconds"
        assert sample(families, name, name + "_count") == n + 10
        ok = sample(families, "paddle_ipu_requests", "paddle_ipu_requests_total", status="200")
        assert ok == n + 10
        assert gauge(families, "paddle_ipu_in_flight_requests") == 0
    finally:
        srv.stop()


def test_in_flight_requests_counts_requests_and_units_counts_rows(package: str) -> None:
    # A partial run waits 3 s: the requests stay in flight while the test looks.
    srv = ServerProcess(package, "--name", "mlp", "--timeout-ms", "3000")
    try:
        import threading

        answers: list[int] = []
        callers = [
            threading.Thread(
                target=lambda k=k: answers.append(
                    raw(srv, "POST", "/v2/models/mlp/infer", infer_body(np.ones((k, 16), "f4")))[0]
                )
            )
            for k in (1, 2)
        ]
        for t in callers:
            t.start()
        deadline = time.monotonic() + WAIT
        while True:
            families = scrape(srv)
            units = gauge(families, "paddle_ipu_in_flight_units")
            if units == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert units == 3
        assert gauge(families, "paddle_ipu_in_flight_requests") == 2
        for t in callers:
            t.join(WAIT)
        assert answers == [200, 200]
    finally:
        srv.stop()


# -- the access log ----------------------------------------------------------------------


def test_access_log_has_a_line_per_request_with_trace_ids(package: str, tmp_path: Path) -> None:
    log_path = tmp_path / "access.log"
    srv = ServerProcess(package, "--name", "mlp", "--access-log", str(log_path))
    body = infer_body(np.ones((3, 16), np.float32), id="req-1")
    curl = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
         "-H", f"traceparent: {TRACEPARENT}", "-H", "Content-Type: application/json",
         "--data-binary", body.decode(), f"http://{srv.url}/v2/models/mlp/versions/1/infer"],
        capture_output=True, text=True, timeout=WAIT, check=True,
    )  # fmt: skip
    assert curl.stdout == "200"
    bad = infer_body(np.ones((1, 15), np.float32), id="req-2")
    curl = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
         "-H", "traceparent: not-a-trace", "--data-binary", bad.decode(),
         f"http://{srv.url}/v2/models/mlp/infer"],
        capture_output=True, text=True, timeout=WAIT, check=True,
    )  # fmt: skip
    assert curl.stdout == "400"
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("x", [2, 16], "FP32")
    inp.set_data_from_numpy(np.ones((2, 16), np.float32))
    client.infer("mlp", [inp], request_id="g-1", headers={"traceparent": TRACEPARENT})
    client.close()
    raw(srv, "GET", "/v2/health/ready")  # not an inference request: not logged
    code, _, err = srv.terminate()
    assert code == 0, err
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(lines) == 3, lines
    http_ok, http_bad, grpc_ok = lines
    assert http_ok["protocol"] == "http" and http_ok["id"] == "req-1"
    assert (http_ok["model"], http_ok["version"], http_ok["status"]) == ("mlp", "1", 200)
    assert http_ok["rows"] == 3 and http_ok["trace_id"] == TRACE
    assert 0 < http_ok["queue_ms"] + http_ok["compute_ms"] <= http_ok["latency_ms"]
    assert http_bad["status"] == 400 and http_bad["id"] == "req-2"
    assert http_bad["trace_id"] is None and "queue_ms" not in http_bad
    assert grpc_ok["protocol"] == "grpc" and grpc_ok["id"] == "g-1"
    assert (grpc_ok["model"], grpc_ok["version"], grpc_ok["status"]) == ("mlp", "1", 200)
    assert grpc_ok["rows"] == 2 and grpc_ok["trace_id"] == TRACE and grpc_ok["latency_ms"] > 0
    for line in lines:
        assert line["time"].endswith("Z") and line["time"][:4].isdigit()


# -- the warm-up and the drain grace -------------------------------------------------------


def test_warmup_keeps_readiness_503_until_its_runs_are_done(package: str) -> None:
    runs = 3000
    srv = ServerProcess(package, "--name", "mlp", "--warmup", str(runs))
    try:
        status, headers, body = raw(srv, "GET", "/v2/health/ready")
        assert status == 503 and json.loads(body)["ready"] is False  # still warming up
        assert headers["Content-Type"] == "application/json"
        assert raw(srv, "GET", "/v2/health/live")[0] == 200
        grpc_client = grpcclient.InferenceServerClient(srv.grpc_url)
        assert not grpc_client.is_server_ready()
        deadline = time.monotonic() + WAIT
        while raw(srv, "GET", "/v2/health/ready")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        families = scrape(srv)
        assert sample(families, "paddle_ipu_runs", "paddle_ipu_runs_total") >= runs
        assert grpc_client.is_server_ready()
        grpc_client.close()
    finally:
        srv.stop()


def test_sigterm_turns_readiness_503_and_serves_through_the_grace(package: str, mlp: Built) -> None:
    grace = 2.0
    srv = ServerProcess(package, "--name", "mlp", "--drain-grace-s", str(grace))
    assert raw(srv, "GET", "/v2/health/ready")[0] == 200
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    deadline = t0 + grace / 2
    while raw(srv, "GET", "/v2/health/ready")[0] != 503:
        assert time.monotonic() < deadline, "readiness did not turn 503 at once"
        time.sleep(0.01)
    x = np.random.default_rng(8).standard_normal((2, 16)).astype(np.float32)
    status, _, data = raw(srv, "POST", "/v2/models/mlp/infer", infer_body(x))
    assert status == 200 and time.monotonic() - t0 < grace  # still served in the grace
    out = json.loads(data)["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, reference(mlp, {"x": x}), rtol=1e-5, atol=1e-6)
    assert raw(srv, "GET", "/v2/health/live")[0] == 200
    while True:
        try:
            raw(srv, "GET", "/v2/health/live", timeout=5)
        except OSError:
            break
        assert time.monotonic() - t0 < WAIT
        time.sleep(0.02)
    closed = time.monotonic() - t0
    assert closed >= grace * 0.95, closed
    out, err = srv.proc.communicate(timeout=WAIT)  # no second SIGTERM: it is stopping
    assert srv.proc.returncode == 0, err
    assert "draining (serving 2 s more)" in out and "stopped" in out


def test_sigterm_during_the_warmup_stops_without_finishing_it(package: str) -> None:
    srv = ServerProcess(package, "--name", "mlp", "--warmup", "100000000")
    assert raw(srv, "GET", "/v2/health/ready")[0] == 503
    t0 = time.monotonic()
    code, out, err = srv.terminate()
    assert code == 0, err
    assert time.monotonic() - t0 < WAIT / 2 and "stopped" in out
