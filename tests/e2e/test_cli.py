from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import paddle
import pytest
from support.helpers import run_python
from support.models import Built, build
from support.serving_models import reference, save

from paddle_ipu import cli
from paddle_ipu.cli import progress_printer
from paddle_ipu.errors import PackageError
from paddle_ipu.serving.cache import cache_entries
from paddle_ipu.serving.package import load_package
from paddle_ipu.serving.saved_model import STAGES, compile_model


def test_info_json(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["plugin_loaded"] is True
    assert info["ipu_device_count"] >= 1
    assert info["backends"]["host"]["available"] is True
    assert "popart" in info["backends"]


def test_info_text_via_module() -> None:
    proc = run_python("import sys; from paddle_ipu.cli import main; sys.exit(main(['info']))")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plugin loaded by Paddle  yes" in out
    assert "host     available" in out
    assert "popart" in out


def test_python_dash_m() -> None:
    proc = run_python(
        "import runpy, sys\n"
        "sys.argv = ['paddle_ipu', 'info']\n"
        "runpy.run_module('paddle_ipu', run_name='__main__')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "ipu devices" in proc.stdout


# --- compile, run, bench, cache, serve --------------------------------------------


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str]:
    paddle.enable_static()
    built = build("cnn")
    return built, save(built, tmp_path_factory.mktemp("saved"))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(d))
    return d


def test_compile_run_and_the_cache(cnn, cache_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    built, prefix = cnn
    out = tmp_path / "cnn.pdipu"
    t0 = time.perf_counter()
    assert cli.main(["compile", prefix, "-o", str(out), "--micro-batch", "4"]) == 0
    cold = time.perf_counter() - t0
    text = capsys.readouterr()
    assert "compiled in" in text.out
    # not a terminal: one log line per stage
    assert "[1/3] reading the saved model" in text.err and "[3/3]" in text.err
    assert out.is_file() and len(cache_entries()) == 1
    t0 = time.perf_counter()
    assert (
        cli.main(["compile", prefix, "-o", str(tmp_path / "again.pdipu"), "--micro-batch", "4"])
        == 0
    )
    warm = time.perf_counter() - t0
    assert "from the compile cache" in capsys.readouterr().out
    assert warm < cold
    # another result-changing option is another entry
    assert (
        cli.main(["compile", prefix, "-o", str(tmp_path / "mb2.pdipu"), "--micro-batch", "2"]) == 0
    )
    assert len(cache_entries()) == 2
    capsys.readouterr()
    assert cli.main(["cache", "ls"]) == 0
    listing = capsys.readouterr().out
    assert "2 entries" in listing and prefix in listing
    # run: three rows through the package, against Paddle's CPU executor
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert (
        cli.main(
            [
                "run",
                str(out),
                "--input",
                f"x={tmp_path / 'x.npy'}",
                "--output-dir",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    (name,) = [p.stem for p in (tmp_path / "o").glob("*.npy")]
    got = np.load(tmp_path / "o" / f"{name}.npy")
    np.testing.assert_allclose(got, reference(built, {"x": x}), rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert cli.main(["run", str(out), "--input", f"y={tmp_path / 'x.npy'}"]) == 1
    assert "unknown feed 'y'" in capsys.readouterr().err
    assert cli.main(["cache", "clear"]) == 0
    assert cache_entries() == []


def test_bench_prints_a_table(cnn, cache_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _, prefix = cnn
    out = tmp_path / "cnn.pdipu"
    assert cli.main(["compile", prefix, "-o", str(out), "--micro-batch", "4", "--no-cache"]) == 0
    assert cache_entries() == []
    capsys.readouterr()
    assert cli.main(["bench", str(out), "--clients", "1", "4", "--seconds", "0.3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["1", "4"]
    assert all(float(r[1]) > 0 for r in rows)


def test_damaged_packages_and_cache_entries(cnn, cache_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _built, prefix = cnn
    _package, cached = compile_model(prefix, micro_batch_size=2)
    assert not cached
    (entry,) = cache_entries()
    # flip one byte of the ONNX inside the zip, then of the weights: the checksums
    # catch them
    with zipfile.ZipFile(entry.path) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    for damaged in ("model.onnx", "weights.safetensors"):
        data = bytearray(files[damaged])
        data[len(data) // 2] ^= 0xFF
        with zipfile.ZipFile(entry.path, "w") as zf:
            for name, content in files.items():
                zf.writestr(name, bytes(data) if name == damaged else content)
        with pytest.raises(PackageError, match=f"{damaged} has SHA-256"):
            load_package(entry.path)
    _again, cached = compile_model(prefix, micro_batch_size=2)
    assert not cached  # the damaged entry was dropped and compiled again
    load_package(cache_entries()[0].path)
    (tmp_path / "junk.pdipu").write_bytes(b"not a zip")
    with pytest.raises(PackageError, match="not a paddle-ipu package"):
        load_package(tmp_path / "junk.pdipu")
    with pytest.raises(PackageError, match="no package"):
        load_package(tmp_path / "missing.pdipu")


def test_cache_is_a_size_bounded_lru(cnn, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    _, prefix = cnn
    compile_model(prefix, micro_batch_size=1)
    (one,) = cache_entries()
    # room for two entries: the least recently used goes
    monkeypatch.setenv("PADDLE_IPU_CACHE_MAX_MB", str(2.5 * one.size / (1 << 20)))
    compile_model(prefix, micro_batch_size=2)
    time.sleep(0.01)
    assert compile_model(prefix, micro_batch_size=1)[1]  # a hit: now the newest
    compile_model(prefix, micro_batch_size=3)
    kept = {load_package(e.path).options["micro_batch_size"] for e in cache_entries()}
    assert kept == {1, 3}


def test_progress_bar_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    show = progress_printer(stream)
    for i, stage in enumerate(STAGES, 1):
        show(i, len(STAGES), stage)
    text = stream.getvalue()
    assert text.count("\r") == 3 and "[" + "#" * 24 + "] 3/3" in text and text.endswith("\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_command_answers_and_stops_on_sigterm(cnn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    built, prefix = cnn
    port = _free_port()
    env = dict(os.environ, PADDLE_IPU_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paddle_ipu",
            "serve",
            prefix,
            "--port",
            str(port),
            "--name",
            "cnn",
            "--micro-batch",
            "4",
        ],
        env=env,
        cwd=tempfile.gettempdir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/v2/health/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(proc.communicate()[1]) from None
                time.sleep(0.2)
        x = np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32)
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2, 1, 8, 8],
                        "datatype": "FP32",
                        "data": x.reshape(-1).tolist(),
                    }
                ]
            }
        ).encode()
        req = urllib.request.Request(base + "/v2/models/cnn/infer", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            doc = json.loads(r.read())
        out = doc["outputs"][0]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, reference(built, {"x": x}), rtol=1e-5, atol=1e-6)
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stopped" in stdout


def test_a_package_loads_on_the_popart_backend(cnn, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The package's ONNX and specs go to PopART unchanged: on the double of PopART's
    Python API (tests/contract/popart_double; no SDK needed), which runs the graph with
    ONNX Runtime in PopART's step layout, it gives the host backend's numbers."""
    from contract.conftest import load_popart_double

    _, prefix = cnn
    package, _ = compile_model(prefix, micro_batch_size=2, cache=False)
    package.save(tmp_path / "cnn.pdipu")
    loaded = load_package(tmp_path / "cnn.pdipu")
    x = np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(np.float32)
    host = loaded.executor(backend="host")
    (want,) = host.run({"x": x})
    host.reset()
    monkeypatch.setitem(sys.modules, "popart", load_popart_double())
    monkeypatch.setenv("POPLAR_IPUMODEL", "1")
    executor = loaded.executor(backend="popart")
    assert executor.session.backend == "popart"
    (out,) = executor.run({"x": x})
    executor.reset()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_no_arguments_prints_help_and_version_works() -> None:
    bare = subprocess.run(
        [sys.executable, "-m", "paddle_ipu"], capture_output=True, text=True, timeout=120,
        cwd=tempfile.gettempdir(), check=False,
    )  # fmt: skip
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert "usage: paddle-ipu" in bare.stdout and "selftest" in bare.stdout
    assert "``" not in bare.stdout  # plain text, not reST
    version = subprocess.run(
        [sys.executable, "-m", "paddle_ipu", "--version"], capture_output=True, text=True,
        timeout=120, cwd=tempfile.gettempdir(), check=False,
    )  # fmt: skip
    assert version.returncode == 0
    import paddle_ipu

    assert version.stdout.strip() == f"paddle-ipu {paddle_ipu.__version__}"


def test_selftest_subcommand_passes_on_host(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["selftest", "--backend", "host"]) == 0
    out = capsys.readouterr().out
    assert "backend: host" in out and " 0 failed" in out
