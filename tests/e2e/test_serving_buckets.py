"""``paddle-ipu serve`` of a decoder saved with a -1 sequence length, through buckets of
sequence lengths (a dynamic model of the C++ server: serving/dynamic.py): real HTTP and
gRPC clients in this process, the server in another, every answer equal to the
decoder's own dygraph forward."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
from support.serving_models import (
    ServerProcess,
    decoder_reference,
    raw,
    save_decoder,
    wait_for_lines,
)


def _post(srv: ServerProcess, ids: np.ndarray) -> tuple[int, dict]:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "input_ids",
                    "shape": list(ids.shape),
                    "datatype": "INT64",
                    "data": ids.reshape(-1).tolist(),
                }
            ]
        }
    ).encode()
    status, _, answer = raw(srv, "POST", "/v2/models/lm/infer", body)
    return status, json.loads(answer or b"{}")


@pytest.mark.slow
def test_serve_answers_every_sequence_length_as_the_eager_decoder(tmp_path: Path) -> None:
    prefix, layer = save_decoder(tmp_path)
    env = {"PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}
    args = ["--name", "lm", "--micro-batch", "2", "--seq-buckets", "4,8,16"]
    srv = ServerProcess(prefix, *args, env=env)
    try:
        status, _, body = raw(srv, "GET", "/v2/models/lm")
        meta = json.loads(body)
        assert status == 200, meta
        assert meta["inputs"][0]["shape"] == [-1, -1]
        assert meta["outputs"][0]["shape"] == [-1, -1, 50]
        rng = np.random.default_rng(11)
        for rows, length in ((1, 1), (3, 5), (2, 8), (1, 13), (2, 16)):
            ids = rng.integers(0, 50, (rows, length)).astype(np.int64)
            status, doc = _post(srv, ids)
            assert status == 200, doc
            out = doc["outputs"][0]
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
            assert got.shape == (rows, length, 50)
            np.testing.assert_allclose(got, decoder_reference(layer, ids), rtol=1e-5, atol=1e-5)
        status, doc = _post(srv, np.zeros((1, 17), np.int64))
        assert status == 400 and "sequence length 17" in doc["error"], doc
        # gRPC, which the former Python server of bucketed packages did not serve.
        grpcclient = pytest.importorskip("tritonclient.grpc")
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        ids = rng.integers(0, 50, (2, 6)).astype(np.int64)
        feed = grpcclient.InferInput("input_ids", list(ids.shape), "INT64")
        feed.set_data_from_numpy(ids)
        got = client.infer("lm", [feed]).as_numpy(meta["outputs"][0]["name"])
        np.testing.assert_allclose(got, decoder_reference(layer, ids), rtol=1e-5, atol=1e-5)
        for path, want in (
            ("/v2/health/live", {"live": True}),
            ("/v2/health/ready", {"ready": True}),
        ):
            status, _, body = raw(srv, "GET", path)
            assert status == 200 and json.loads(body) == want
        ids = np.zeros((1, 4), np.int64)
        # Request parameters: Triton's timeout is served (the former Python server of
        # bucketed packages refused it), an unknown one is refused by name.
        for parameters, refused in (({"x": 1}, "'x'"),):
            doc_in = {
                "inputs": [
                    {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [0] * 4}
                ],
                "parameters": parameters,
            }
            status, _, answer = raw(srv, "POST", "/v2/models/lm/infer", json.dumps(doc_in).encode())
            error = json.loads(answer)["error"]
            assert status == 400 and refused in error and "not implemented" in error
        assert _post(srv, ids)[0] == 200
    finally:
        code, _, stderr = srv.terminate()
    assert code == 0, stderr


def test_compile_and_run_a_bucketed_package_from_the_command_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from paddle_ipu import cli

    prefix, layer = save_decoder(tmp_path)
    package = tmp_path / "lm.pdipu"
    args = ["compile", prefix, "-o", str(package), "--no-cache", "--seq-buckets", "8,4"]
    assert cli.main(args) == 0
    assert "sequence buckets [4, 8]" in capsys.readouterr().out
    ids = np.random.default_rng(12).integers(0, 50, (1, 6)).astype(np.int64)
    np.save(tmp_path / "ids.npy", ids)
    out_dir = tmp_path / "out"
    args = ["run", str(package), "--input", f"input_ids={tmp_path / 'ids.npy'}"]
    assert cli.main([*args, "--output-dir", str(out_dir)]) == 0
    (written,) = out_dir.glob("*.npy")
    np.testing.assert_allclose(
        np.load(written), decoder_reference(layer, ids), rtol=1e-5, atol=1e-5
    )
    assert cli.main(["compile", prefix, "-o", str(package), "--seq-buckets", "4,x"]) == 1
    assert "--seq-buckets must be lengths" in capsys.readouterr().err
    assert cli.main(["serve", str(package), "--seq-buckets", "4"]) == 1
    assert "its buckets were chosen when it was compiled" in capsys.readouterr().err


@pytest.mark.slow
def test_workers_serve_a_bucketed_package(tmp_path: Path) -> None:
    """``--workers 2`` with a bucketed package (the former Python server refused it): two
    processes on one HTTP and one gRPC port, each answering as the decoder."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from paddle_ipu import cli

    grpcclient = pytest.importorskip("tritonclient.grpc")
    prefix, layer = save_decoder(tmp_path)
    package = tmp_path / "lm.pdipu"
    assert (
        cli.main(["compile", prefix, "-o", str(package), "--no-cache", "--seq-buckets", "4,8"]) == 0
    )
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "paddle_ipu", "serve", str(package), "--name", "lm",
         "--port", str(ports[0]), "--grpc-port", str(ports[1]), "--workers", "2"],
        cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ),
    )  # fmt: skip
    try:
        wait_for_lines(proc, "paddle-ipu: serving", 2)
        srv = type("Srv", (), {"port": ports[0]})()
        rng = np.random.default_rng(13)
        for _ in range(8):  # new connections: spread over both processes
            ids = rng.integers(0, 50, (1, 6)).astype(np.int64)
            status, doc = _post(srv, ids)
            assert status == 200, doc
            out = doc["outputs"][0]
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
            np.testing.assert_allclose(got, decoder_reference(layer, ids), rtol=1e-5, atol=1e-5)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        ids = rng.integers(0, 50, (2, 3)).astype(np.int64)
        feed = grpcclient.InferInput("input_ids", [2, 3], "INT64")
        feed.set_data_from_numpy(ids)
        answer = client.infer("lm", [feed])
        name = answer.get_response().outputs[0].name
        np.testing.assert_allclose(
            answer.as_numpy(name), decoder_reference(layer, ids), rtol=1e-5, atol=1e-5
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
