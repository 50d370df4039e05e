"""deploy/: the container's command, run here as a plain process against a model
repository (no container engine runs on this machine: the image itself is not built
here), and the KServe manifests checked against it: the ServingRuntime runs the image's
exact command, its probes and ports are routes and ports that command serves, the
InferenceServices name the runtime and its model format.  The models answer as Paddle's
CPU executor does, over HTTP and gRPC (tritonclient), on the ports the command names
(replaced by free ones: only the port numbers and the repository's path differ)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
import yaml
from support.models import build
from support.serving_models import ServerProcess, raw, reference, save

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT (its JSON form)."""
    text = (DEPLOY / "Dockerfile").read_text()
    (line,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    return [str(a) for a in json.loads(line)]


def _manifests() -> dict[str, Any]:
    return {p.name: yaml.safe_load(p.read_text()) for p in (DEPLOY / "kserve").glob("*.yaml")}


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_manifests_name_the_command_ports_and_probes_that_exist() -> None:
    command = _entrypoint()
    manifests = _manifests()
    runtime = manifests["servingruntime.yaml"]
    assert runtime["kind"] == "ServingRuntime"
    (container,) = runtime["spec"]["containers"]
    assert [str(a) for a in container["args"]] == command
    http_port, grpc_port = int(_option(command, "--port")), int(_option(command, "--grpc-port"))
    assert _option(command, "--model-repository") == "/mnt/models"  # KServe's mount
    assert [p["containerPort"] for p in container["ports"]] == [http_port]
    for probe, path in (
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": http_port}
    annotations = runtime["metadata"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(http_port)
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"EXPOSE {http_port} {grpc_port}" in dockerfile
    assert container["image"] in dockerfile  # the tag the Dockerfile's build line gives
    services = [m for m in manifests.values() if m["kind"] == "InferenceService"]
    assert {m["spec"]["predictor"]["model"]["protocolVersion"] for m in services} == {
        "v2",
        "grpc-v2",
    }
    for service in services:
        model = service["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert model["modelFormat"]["name"] in formats
        if model["protocolVersion"] == "grpc-v2":
            assert model["ports"] == [
                {"name": "h2c", "protocol": "TCP", "containerPort": grpc_port}
            ]


def test_the_containers_command_serves_a_repository(tmp_path: Path) -> None:
    """The image's command with the repository's path and free ports: the health
    routes the probes use answer 200, both models answer over HTTP and gRPC; on
    SIGTERM readiness turns 503 while the server still answers."""
    paddle.enable_static()
    built = {"mlp": build("mlp", seed=11), "cnn": build("cnn", seed=12)}
    repo = tmp_path / "models"
    for name, model in built.items():
        version = repo / name / "1"
        version.mkdir(parents=True)
        save(model, version)  # model.json + model.pdiparams
    command = _entrypoint()
    script = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert script is not None, f"{command[0]} is not installed beside {sys.executable}"
    argv = [script, *command[1:]]
    argv[argv.index("/mnt/models")] = str(repo)
    argv[argv.index("--port") + 1] = "0"
    argv[argv.index("--grpc-port") + 1] = "0"
    srv = ServerProcess("", command=argv)
    try:
        for path in ("/v2/health/live", "/v2/health/ready"):
            status, _, _ = raw(srv, "GET", path)
            assert status == 200, path
        http = httpclient.InferenceServerClient(srv.url)
        grpc = grpcclient.InferenceServerClient(srv.grpc_url)
        rng = np.random.default_rng(5)
        for name, model in built.items():
            feed = model.random_feed(3, rng)
            ((feed_name, x),) = feed.items()
            want = reference(model, feed)
            out_name = http.get_model_metadata(name)["outputs"][0]["name"]
            inp = httpclient.InferInput(feed_name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            got = http.infer(name, [inp]).as_numpy(out_name)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            ginp = grpcclient.InferInput(feed_name, list(x.shape), "FP32")
            ginp.set_data_from_numpy(x)
            got = grpc.infer(name, [ginp]).as_numpy(out_name)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        http.close()
        grpc.close()
        # SIGTERM: readiness turns 503 at once while the server still answers
        # (--drain-grace-s), so that the endpoints drop the pod before it closes
        grace = float(_option(command, "--drain-grace-s"))
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace / 2
        status = 200
        while status == 200 and time.monotonic() < deadline:
            status, _, _ = raw(srv, "GET", "/v2/health/ready")
        assert status == 503
        assert raw(srv, "GET", "/v2/health/live")[0] == 200
    finally:
        code, out, err = srv.terminate()
    assert code == 0, out + err
