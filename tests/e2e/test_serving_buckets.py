"""``paddle-ipu serve`` of a decoder saved with a -1 sequence length, through buckets of
sequence lengths (the Python HTTP server): a real HTTP client in this process, the server
in another, every answer equal to the decoder's own dygraph forward."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from serving_models import decoder_reference, save_decoder

pytest.importorskip("aiohttp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(base: str, ids: np.ndarray) -> tuple[int, dict]:
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
    req = urllib.request.Request(base + "/v2/models/lm/infer", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.mark.slow
def test_serve_answers_every_sequence_length_as_the_eager_decoder(tmp_path: Path) -> None:
    prefix, layer = save_decoder(tmp_path)
    port = _free_port()
    env = dict(os.environ, PADDLE_IPU_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "paddle_ipu", "serve", prefix, "--port", str(port)]
    cmd += ["--name", "lm", "--micro-batch", "2", "--seq-buckets", "4,8,16"]
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(base + "/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.communicate()[1]) from None
                time.sleep(0.2)
        with urllib.request.urlopen(base + "/v2/models/lm", timeout=10) as r:
            meta = json.loads(r.read())
        assert meta["inputs"][0]["shape"] == [-1, -1]
        assert meta["outputs"][0]["shape"] == [-1, -1, 50]
        rng = np.random.default_rng(11)
        for rows, length in ((1, 1), (3, 5), (2, 8), (1, 13), (2, 16)):
            ids = rng.integers(0, 50, (rows, length)).astype(np.int64)
            status, doc = _post(base, ids)
            assert status == 200, doc
            out = doc["outputs"][0]
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
            assert got.shape == (rows, length, 50)
            np.testing.assert_allclose(got, decoder_reference(layer, ids), rtol=1e-5, atol=1e-5)
        status, doc = _post(base, np.zeros((1, 17), np.int64))
        assert status == 400 and "sequence length 17" in doc["error"], doc
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr


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
    # The Python server serves a bucketed package over HTTP alone, in one process.
    assert cli.main(["serve", str(package), "--port", "0", "--grpc-port", "0"]) == 1
    assert "served over HTTP by one process" in capsys.readouterr().err
