"""KServe's own Python SDK (``kserve`` 0.21, in the test extra) against ``paddle-ipu
serve``, both in processes of their own: ``InferenceRESTClient`` with the v2 protocol
and ``InferenceGRPCClient`` -- health, model readiness and infer (JSON and binary
tensors over REST, raw contents over gRPC), answers equal to Paddle's CPU executor, and
a bad request raised by the SDK with the input named.  The SDK has no metadata call;
tritonclient covers metadata (test_serving_protocols.py).  The client runs in a process
of its own because the SDK's gRPC messages and tritonclient's share protobuf names."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import Built, build
from support.serving_models import ServerProcess, reference, save

from paddle_ipu.serving.saved_model import compile_model

pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import kserve"], capture_output=True).returncode,
    reason="KServe's SDK (kserve, in the test extra on Python 3.10-3.13) is not installed",
)

CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys
    import numpy as np
    import kserve

    http_url, grpc_url, x_path = sys.argv[1:4]
    x = np.load(x_path)
    report = {}

    def request(binary, datatype="FP32", data=None):
        data = x if data is None else data
        tensor = kserve.InferInput("x", list(data.shape), datatype)
        tensor.set_data_from_numpy(data, binary_data=binary)
        return kserve.InferRequest(model_name="mlp", infer_inputs=[tensor], request_id="sdk-1")

    async def rest():
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", retries=0))
        base = "http://" + http_url
        try:
            report["rest_health"] = [
                await client.is_server_live(base),
                await client.is_server_ready(base),
                await client.is_model_ready(base, "mlp"),
            ]
            for binary in (False, True):
                answer = await client.infer(base, request(binary), model_name="mlp")
                report[f"rest_binary_{binary}"] = [answer.id, answer.outputs[0].as_numpy().tolist()]
            try:
                bad = request(False, "BOOL", np.zeros(x.shape, bool))
                await client.infer(base, bad, model_name="mlp")
                report["rest_bad"] = "answered"
            except Exception as exc:
                report["rest_bad"] = f"{type(exc).__name__}: {exc}"
        finally:
            await client.close()

    async def grpc():
        client = kserve.InferenceGRPCClient(grpc_url, retries=0)
        try:
            report["grpc_health"] = [
                await client.is_server_live(),
                await client.is_server_ready(),
                await client.is_model_ready("mlp"),
            ]
            answer = await client.infer(request(False))
            report["grpc"] = [answer.id, answer.outputs[0].as_numpy().tolist()]
        finally:
            await client.close()

    asyncio.run(rest())
    asyncio.run(grpc())
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def mlp() -> Built:
    paddle.enable_static()
    return build("mlp")


@pytest.fixture(scope="module")
def server(mlp: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work: Path = tmp_path_factory.mktemp("kserve_sdk")
    pkg, _ = compile_model(save(mlp, work), micro_batch_size=8, cache=False)
    srv = ServerProcess(str(pkg.save(work / "mlp.pkg")), "--name", "mlp", "--timeout-ms", "2")
    yield srv
    code, out, err = srv.terminate()
    assert code == 0, out + err


def test_kserve_sdk_clients(server: ServerProcess, mlp: Built, tmp_path: Path) -> None:
    x = mlp.random_feed(3, np.random.default_rng(1))["x"]
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, server.url, server.grpc_url, str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    want = reference(mlp, {"x": x})
    assert report["rest_health"] == [True, True, True]
    assert report["grpc_health"] == [True, True, True]
    for key in ("rest_binary_False", "rest_binary_True", "grpc"):
        request_id, got = report[key]
        assert request_id == "sdk-1", key
        np.testing.assert_allclose(np.array(got, "float32"), want, rtol=1e-5, atol=1e-5)
    assert "'x'" in report["rest_bad"] and "BOOL" in report["rest_bad"], report["rest_bad"]
