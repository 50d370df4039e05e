"""One server, several models: ``paddle-ipu serve --model-repository DIR`` in its own
process (Triton's layout: packages and saved models, a config.json, versions), checked
with tritonclient.http and tritonclient.grpc against Paddle's CPU executor; Triton's
repository extension (index, load, unload) over both protocols while another client
process keeps one model busy; a model that fails to load.  And the same server from
Python with two runtimes (InferenceServer.add_model / remove_model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.kserve_forms import config_and_statistics
from support.models import Built, build
from support.serving_models import ServerProcess, raw, reference, save

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
grpclib = pytest.importorskip("grpc")

from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from paddle_ipu.serving.model_runtime import ModelRuntime  # noqa: E402
from paddle_ipu.serving.saved_model import compile_model  # noqa: E402
from paddle_ipu.serving.server import InferenceServer  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def models() -> dict[str, Built]:
    """Small static programs with random weights: the MLP twice (versions 1 and 2,
    other weights), a CNN and a transformer encoder."""
    paddle.enable_static()
    return {
        "mlp/1": build("mlp", seed=1),
        "mlp/2": build("mlp", seed=2),
        "cnn/1": build("cnn", seed=3),
        "transformer/1": build("transformer", seed=4),
    }


def _version_dir(root: Path, key: str) -> Path:
    d = root / key
    d.mkdir(parents=True)
    return d


@pytest.fixture(scope="module")
def repo(models: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp: version 1 a saved model (compiled on load), version 2 a package, both
    served (version policy all); cnn: a package; transformer: a saved model with its
    own micro-batch; broken: a corrupt package."""
    root = tmp_path_factory.mktemp("repository")
    work = tmp_path_factory.mktemp("saved")
    save(models["mlp/1"], _version_dir(root, "mlp/1"), "model")
    pkg, _ = compile_model(save(models["mlp/2"], work, "mlp2"), micro_batch_size=8, cache=False)
    pkg.save(_version_dir(root, "mlp/2") / "model.pdipu")
    (root / "mlp" / "config.json").write_text(
        json.dumps({"micro_batch_size": 8, "version_policy": {"all": {}}})
    )
    pkg, _ = compile_model(save(models["cnn/1"], work, "cnn"), micro_batch_size=4, cache=False)
    pkg.save(_version_dir(root, "cnn/1") / "model.pdipu")
    save(models["transformer/1"], _version_dir(root, "transformer/1"), "model")
    (root / "transformer" / "config.json").write_text(
        json.dumps({"micro_batch_size": 2, "timeout_ms": 1})
    )
    good = (root / "cnn" / "1" / "model.pdipu").read_bytes()
    broken = bytearray(good)
    broken[len(broken) // 2 : len(broken) // 2 + 64] = b"\0" * 64
    (_version_dir(root, "broken/1") / "model.pdipu").write_bytes(bytes(broken))
    return root


def feed(models: dict[str, Built], key: str, rows: int, seed: int) -> np.ndarray:
    return models[key].random_feed(rows, np.random.default_rng(seed))["x"]


def http_infer(client: Any, model: str, x: np.ndarray, version: str = "") -> np.ndarray:
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], model_version=version)
    return np.asarray(result.as_numpy(result.get_response()["outputs"][0]["name"]))


def grpc_infer(client: Any, model: str, x: np.ndarray, version: str = "") -> np.ndarray:
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], model_version=version)
    return np.asarray(result.as_numpy(result.get_response().outputs[0].name))


def raw_infer(srv: Any, model: str, x: np.ndarray) -> np.ndarray:
    """A JSON infer request over http.client (any thread)."""
    body = {
        "inputs": [
            {
                "name": "x",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.reshape(-1).tolist(),
            }
        ]
    }
    status, _, data = raw(srv, "POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
    assert status == 200, data
    out = json.loads(data)["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def index(client: Any) -> dict[tuple[str, str], tuple[str, str]]:
    return {
        (m["name"], m["version"]): (m["state"], m["reason"])
        for m in client.get_model_repository_index()
    }


def test_one_server_serves_every_model_of_the_repository(
    repo: Path, models: dict[str, Built]
) -> None:
    srv = ServerProcess(f"--model-repository={repo}", "--timeout-ms", "2")
    try:
        http = httpclient.InferenceServerClient(srv.url)
        grpc = grpcclient.InferenceServerClient(srv.grpc_url)
        states = index(http)
        for key in ("mlp/1", "mlp/2", "cnn/1", "transformer/1"):
            assert states[tuple(key.split("/"))] == ("READY", ""), states  # type: ignore[index]
        state, reason = states[("broken", "1")]
        assert (
            state == "UNAVAILABLE"
            and "PackageError" in reason
            and "not a paddle-ipu package" in reason
        )
        assert http.is_server_ready()  # the others serve
        for i, key in enumerate(models):
            name, version = key.split("/")
            for rows in (1, 3):
                x = feed(models, key, rows, 10 * i + rows)
                want = reference(models[key], {"x": x})
                np.testing.assert_allclose(http_infer(http, name, x, version), want, **TOL)
                np.testing.assert_allclose(grpc_infer(grpc, name, x, version), want, **TOL)
        # no version: the newest
        x = feed(models, "mlp/2", 2, 99)
        np.testing.assert_allclose(
            http_infer(http, "mlp", x), reference(models["mlp/2"], {"x": x}), **TOL
        )
        assert not np.allclose(
            reference(models["mlp/1"], {"x": x}), reference(models["mlp/2"], {"x": x})
        )
        assert http.get_model_metadata("mlp")["versions"] == ["1", "2"]
        assert list(grpc.get_model_metadata("mlp", "1").versions) == ["1", "2"]
        assert grpc.get_model_metadata("mlp", "1").inputs[0].shape == [-1, 16]
        # the failed entry's reason over gRPC too
        gindex = {
            (m.name, m.version): (m.state, m.reason)
            for m in grpc.get_model_repository_index().models
        }
        assert gindex == index(http)
        # the models' own configuration
        assert http.get_model_config("transformer")["dynamic_batching"]["preferred_batch_size"] == [
            2
        ]
        assert http.get_model_config("mlp", "1")["dynamic_batching"]["preferred_batch_size"] == [8]
        # control mode none: no load or unload
        with pytest.raises(InferenceServerException, match="control mode is 'none'") as info:
            http.unload_model("cnn")
        assert info.value.status() == "400"
        with pytest.raises(InferenceServerException, match="control mode is 'none'") as info:
            grpc.load_model("cnn")
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert http.is_model_ready("cnn")
        # unknown model or version: 404 / NOT_FOUND
        status, _, body = raw(srv, "POST", "/v2/models/nope/infer", b"{}")
        assert status == 404 and "unknown model" in json.loads(body)["error"]
        status, _, body = raw(srv, "POST", "/v2/models/mlp/versions/7/infer", b"{}")
        assert status == 404 and "no version" in json.loads(body)["error"]
        with pytest.raises(InferenceServerException, match="unknown model"):
            grpc_infer(grpc, "nope", x)
        # gRPC's configuration and statistics say what HTTP's do: every model, both
        # versions of mlp, mlp's newest and every version of it, and every model's
        for name, version in (
            ("mlp", "1"),
            ("mlp", "2"),
            ("cnn", "1"),
            ("transformer", "1"),
            ("mlp", ""),
        ):
            doc = config_and_statistics(http, grpc, name, version)["model_stats"]
            assert all(s["inference_count"] > 0 for s in doc), doc
        assert len(config_and_statistics(http, grpc)["model_stats"]) == 4
        stats = http.get_inference_statistics()["model_stats"]
        assert {(s["name"], s["version"]) for s in stats} == {
            ("cnn", "1"),
            ("mlp", "1"),
            ("mlp", "2"),
            ("transformer", "1"),
        }
        metrics = srv.metrics()
        for name, version in (("mlp", "1"), ("mlp", "2"), ("cnn", "1"), ("transformer", "1")):
            key = f'paddle_ipu_requests_total{{model="{name}",version="{version}",status="200"}}'
            assert metrics[key] >= 4, key
        assert metrics['paddle_ipu_unrouted_requests_total{status="404"}'] >= 1
        http.close()
        grpc.close()
    finally:
        code, out, err = srv.terminate()
    assert code == 0, out + err


CLIENT = textwrap.dedent(
    """
    import json, sys, threading, time
    import numpy as np
    import tritonclient.http as httpclient

    url, model, x_file, y_file, stop_file, threads = sys.argv[1:7]
    x, y = np.load(x_file), np.load(y_file)
    counts = {"ok": 0, "wrong": 0, "failed": []}
    lock = threading.Lock()

    def run():
        client = httpclient.InferenceServerClient(url)
        import os
        while not os.path.exists(stop_file):
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                out = client.infer(model, [inp])
                got = out.as_numpy(out.get_response()["outputs"][0]["name"])
                good = np.allclose(got, y, rtol=1e-5, atol=1e-6)
                with lock:
                    counts["ok" if good else "wrong"] += 1
            except Exception as exc:
                with lock:
                    counts["failed"].append(str(exc)[:200])
        client.close()

    workers = [threading.Thread(target=run) for _ in range(int(threads))]
    for w in workers:
        w.start()
    print("started", flush=True)
    for w in workers:
        w.join()
    print(json.dumps(counts), flush=True)
    """
)


def start_client(
    srv: ServerProcess, model: str, x: np.ndarray, built: Built, work: Path
) -> subprocess.Popen[str]:
    """CLIENT in its own process, 32 threads (32 connections) sending ``x`` to ``model`` until
    ``work/stop`` exists; returns once it has started."""
    work.mkdir(exist_ok=True)
    np.save(work / "x.npy", x)
    np.save(work / "y.npy", reference(built, {"x": x}))
    (work / "client.py").write_text(CLIENT)
    client = subprocess.Popen(
        [sys.executable, str(work / "client.py"), srv.url, model, str(work / "x.npy"),
         str(work / "y.npy"), str(work / "stop"), "32"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )  # fmt: skip
    assert client.stdout is not None and client.stdout.readline().strip() == "started"
    return client


def test_load_and_unload_while_another_model_serves(
    repo: Path, models: dict[str, Built], tmp_path: Path
) -> None:
    srv = ServerProcess(
        f"--model-repository={repo}",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "cnn",
        "--timeout-ms",
        "2",
    )
    stop_file = tmp_path / "stop"
    client = start_client(srv, "cnn", feed(models, "cnn/1", 2, 5), models["cnn/1"], tmp_path)
    try:
        http = httpclient.InferenceServerClient(srv.url)
        grpc = grpcclient.InferenceServerClient(srv.grpc_url)
        states = index(http)
        assert states[("cnn", "1")] == ("READY", "")
        assert states[("mlp", "2")] == ("UNAVAILABLE", "unloaded")
        assert not http.is_model_ready("mlp")
        # the index of the READY ones: {"ready": true}, gRPC's ready flag
        status, _, body = raw(srv, "POST", "/v2/repository/index", b'{"ready": true}')
        assert status == 200
        assert json.loads(body) == [{"name": "cnn", "version": "1", "state": "READY", "reason": ""}]
        assert raw(srv, "POST", "/v2/repository/index", b"[1]")[0] == 400
        with grpclib.insecure_channel(srv.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            got = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
        assert [(m.name, m.version, m.state) for m in got.models] == [("cnn", "1", "READY")]
        status, _, body = raw(srv, "POST", "/v2/models/mlp/infer", b"{}")
        assert status == 404 and "unloaded" in json.loads(body)["error"]

        for round_ in range(2):  # load, serve, unload; then again
            http.load_model("mlp")
            assert index(http)[("mlp", "1")] == ("READY", "")
            assert index(http)[("mlp", "2")] == ("READY", "")
            if round_ == 0:
                # loaded again with another version policy: version 1 unloads, 2 stays
                config = repo / "mlp" / "config.json"
                saved = config.read_text()
                config.write_text(
                    json.dumps(
                        {"micro_batch_size": 8, "version_policy": {"specific": {"versions": [2]}}}
                    )
                )
                try:
                    http.load_model("mlp")
                finally:
                    config.write_text(saved)
                assert index(http)[("mlp", "1")] == ("UNAVAILABLE", "unloaded")
                assert index(http)[("mlp", "2")] == ("READY", "")
                http.load_model("mlp")  # the policy "all" again
            for key in ("mlp/1", "mlp/2"):
                xm = feed(models, key, 3, 7 + round_)
                got = http_infer(http, "mlp", xm, key.split("/")[1])
                np.testing.assert_allclose(got, reference(models[key], {"x": xm}), **TOL)
            if round_ == 1:
                # unloaded under its own load: each request answered right, or refused
                # (404 / 503) once the unload began; nothing else
                xm = feed(models, "mlp/2", 2, 11)
                own = start_client(srv, "mlp", xm, models["mlp/2"], tmp_path / "own")
                time.sleep(1.0)
            http.unload_model("mlp")
            if round_ == 1:
                (tmp_path / "own" / "stop").write_text("")
                out, err = own.communicate(timeout=120)
                mine = json.loads(out.strip().splitlines()[-1])
                assert mine["wrong"] == 0 and mine["ok"] > 0, (mine, err)
                assert all("unload" in m or "not available" in m for m in mine["failed"]), mine[
                    "failed"
                ][:5]
                print(
                    f"the unloaded model answered {mine['ok']} requests, refused "
                    f"{len(mine['failed'])}"
                )
            assert index(http)[("mlp", "1")] == ("UNAVAILABLE", "unloaded")
            with pytest.raises(InferenceServerException, match="unloaded"):
                http_infer(http, "mlp", feed(models, "mlp/1", 1, 0))

        grpc.load_model("transformer")
        assert grpc.is_model_ready("transformer")
        xt = feed(models, "transformer/1", 3, 8)
        np.testing.assert_allclose(
            grpc_infer(grpc, "transformer", xt),
            reference(models["transformer/1"], {"x": xt}),
            **TOL,
        )
        gindex = grpc.get_model_repository_index(as_json=True)["models"]
        assert {"name": "transformer", "version": "1", "state": "READY"} in gindex
        grpc.unload_model("transformer")
        assert not grpc.is_model_ready("transformer")

        # a load that fails: the model UNAVAILABLE, the reason in the index and the answer
        with pytest.raises(InferenceServerException, match="failed to load model 'broken'"):
            http.load_model("broken")
        state, reason = index(http)[("broken", "1")]
        assert state == "UNAVAILABLE" and "not a paddle-ipu package" in reason
        with pytest.raises(InferenceServerException, match="not a paddle-ipu package"):
            grpc.load_model("broken")
        with pytest.raises(InferenceServerException, match="no model 'absent'") as info:
            http.load_model("absent")
        assert info.value.status() == "404"
        status, _, body = raw(
            srv,
            "POST",
            "/v2/repository/models/cnn/load",
            json.dumps({"parameters": {"config": "{}"}}).encode(),
        )
        assert status == 400 and "['config'] are not supported" in json.loads(body)["error"]
        assert http.is_model_ready("cnn")
        http.close()
        grpc.close()
    finally:
        stop_file.write_text("")
        out, err = client.communicate(timeout=120)
        code, sout, serr = srv.terminate()
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["failed"] == [] and counts["wrong"] == 0, (counts, err)
    assert counts["ok"] > 50, counts
    metrics_ok = counts["ok"]
    assert code == 0, sout + serr
    print(f"the other model answered {metrics_ok} requests, all 200 and right")


@pytest.fixture(scope="module")
def two_packages(models: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("two")
    return {
        key: compile_model(
            save(models[key], work, key.replace("/", "_")), micro_batch_size=4, cache=False
        )[0]
        for key in ("mlp/1", "cnn/1")
    }


def test_python_api_two_models_add_and_remove(two_packages: Any, models: dict[str, Built]) -> None:
    mlp = ModelRuntime(two_packages["mlp/1"].executor(), timeout_ms=1.0)
    cnn = ModelRuntime(two_packages["cnn/1"].executor(), timeout_ms=1.0)
    srv = InferenceServer(mlp, name="mlp", port=0).start()
    try:
        srv.add_model(cnn, "cnn")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}")
        for key in ("mlp/1", "cnn/1"):
            x = feed(models, key, 2, 3)
            np.testing.assert_allclose(
                http_infer(client, key.split("/")[0], x), reference(models[key], {"x": x}), **TOL
            )
        # removing one model answers its requests in flight and touches no other
        gate = threading.Event()
        run = cnn.executor.run

        def slow(feed_: Any) -> Any:
            gate.wait(30)
            return run(feed_)

        cnn.executor.run = slow  # type: ignore[method-assign]
        x = feed(models, "cnn/1", 1, 4)
        answers: list[Any] = []
        caller = threading.Thread(target=lambda: answers.append(raw_infer(srv, "cnn", x)))
        caller.start()
        remover = threading.Thread(target=lambda: srv.remove_model("cnn"))
        deadline = time.monotonic() + 30
        while not cnn.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        remover.start()
        time.sleep(0.2)
        xm = feed(models, "mlp/1", 1, 5)
        np.testing.assert_allclose(
            http_infer(client, "mlp", xm), reference(models["mlp/1"], {"x": xm}), **TOL
        )
        assert remover.is_alive()  # waiting for the cnn's request
        gate.set()
        remover.join(30)
        caller.join(30)
        np.testing.assert_allclose(answers[0], reference(models["cnn/1"], {"x": x}), **TOL)
        assert cnn.closed and not mlp.closed
        assert [m[0] for m in srv.models()] == ["mlp"]
        status, _, _ = raw(srv, "POST", "/v2/models/cnn/infer", b"{}")
        assert status == 404
        client.close()
    finally:
        srv.stop()


def test_load_needs_a_repository(two_packages: Any) -> None:
    mlp = ModelRuntime(two_packages["mlp/1"].executor(), timeout_ms=1.0)
    srv = InferenceServer(mlp, name="mlp", port=0).start()
    try:
        status, _, body = raw(srv, "POST", "/v2/repository/models/mlp/unload", b"")
        assert status == 400 and "no model repository" in json.loads(body)["error"]
        status, _, body = raw(srv, "POST", "/v2/repository/index", b"")
        assert status == 200
        assert json.loads(body) == [{"name": "mlp", "version": "1", "state": "READY", "reason": ""}]
    finally:
        srv.stop()


@pytest.fixture(autouse=True)
def _static() -> Iterator[None]:
    paddle.enable_static()
    yield


def test_a_model_while_it_loads_is_loading_and_answers_503(repo: Path) -> None:
    from paddle_ipu.serving.repository import ModelRepository

    repository = ModelRepository(repo, control_mode="explicit")
    gate = threading.Event()
    real = repository._runtime

    def slow(name: str, version: int, config: Any) -> Any:
        assert gate.wait(60)
        return real(name, version, config)

    repository._runtime = slow  # type: ignore[method-assign]
    srv = InferenceServer(port=0, repository=repository).start()
    try:
        answers: list[Any] = []
        loader = threading.Thread(
            target=lambda: answers.append(raw(srv, "POST", "/v2/repository/models/cnn/load"))
        )
        loader.start()
        deadline = time.monotonic() + 30
        state = ""
        while state != "LOADING" and time.monotonic() < deadline:
            doc = json.loads(raw(srv, "POST", "/v2/repository/index")[2])
            state = next(m["state"] for m in doc if m["name"] == "cnn")
        assert state == "LOADING"
        status, headers, body = raw(srv, "POST", "/v2/models/cnn/infer", b"{}")
        assert status == 503 and "is loading" in json.loads(body)["error"]
        assert headers["Retry-After"] == "1"
        gate.set()
        loader.join(60)
        assert answers[0][0] == 200, answers
        doc = json.loads(raw(srv, "POST", "/v2/repository/index")[2])
        assert {"name": "cnn", "version": "1", "state": "READY", "reason": ""} in doc
    finally:
        gate.set()
        srv.stop()
