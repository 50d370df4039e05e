"""Saved inference models and compiled packages for the serving, CLI and predictor
tests (tests/support/models.py programs saved with paddle.static.save_inference_model)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from support.models import Built


def save(built: Built, directory: Path, name: str = "model") -> str:
    """Save ``built`` as an inference model; return its path prefix."""
    prefix = str(directory / name)
    feeds = [
        op.result(0)
        for op in built.main.global_block().ops
        if op.name() == "pd_op.data" and op.attrs()["name"] in built.feeds
    ]
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(built.scope):
        paddle.static.save_inference_model(prefix, feeds, built.fetches, exe, program=built.main)
    return prefix


def reference(built: Built, feed: dict[str, np.ndarray]) -> np.ndarray:
    """Paddle's own CPU executor on the original program: the oracle."""
    return built.run_cpu(feed)[0]


def raw(
    srv: Any,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request to a server on 127.0.0.1:``srv.port``: (status, headers, body)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def native_stacks(pid: int) -> str:
    """Every thread's stack of a live process (C++ and Python frames, by gdb when
    installed): what a hung server was doing."""
    import shutil
    import subprocess

    if shutil.which("gdb") is None:
        return "(gdb is not installed: no stacks)"
    try:
        done = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return "(gdb did not finish within 120 s)"
    return done.stdout[-60000:] + done.stderr[-2000:]


class ServerProcess:
    """``paddle-ipu serve`` in its own process (the clients are this process: real
    clients over loopback), on free ports it reports when it is ready."""

    def __init__(
        self,
        model: str,
        *args: str,
        env: dict[str, str] | None = None,
        grpc: bool = True,
        command: list[str] | None = None,
    ) -> None:
        """``command``: the whole command line instead of ``python -m paddle_ipu serve
        model --port 0 ...`` (a deployment's own command)."""
        import os
        import subprocess
        import sys
        import tempfile

        argv = [sys.executable, "-m", "paddle_ipu", "serve", model, "--port", "0"]
        argv += [*args] if "--grpc-port" in args or not grpc else [*args, "--grpc-port", "0"]
        argv = command if command is not None else argv
        self.proc = subprocess.Popen(
            argv,
            cwd=tempfile.gettempdir(),
            env=dict(os.environ, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        line = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("paddle-ipu: serving"):
                break
        else:
            raise AssertionError(f"the server did not start:\n{self.stop()}")
        words = line.split()
        self.port = int(words[words.index("on") + 1].rsplit(":", 1)[1])
        self.grpc_port = int(words[-1].rsplit(":", 1)[1]) if "grpc://" in line else None
        self.url = f"127.0.0.1:{self.port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"

    def terminate(self, timeout: float = 60.0) -> tuple[int, str, str]:
        """SIGTERM; (exit code, the rest of stdout, stderr) once it has stopped."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = native_stacks(self.proc.pid)
            raise AssertionError(
                f"the server did not stop within {timeout} s of SIGTERM; its threads:\n"
                f"{stacks}\n{self.stop()}"
            ) from None
        return self.proc.returncode, "".join(self.lines) + out, err

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        out, err = self.proc.communicate(timeout=60)
        return "".join(self.lines) + out + err

    def metrics(self) -> dict[str, float]:
        """/metrics as {series: value}."""
        import urllib.request

        with urllib.request.urlopen(f"http://{self.url}/metrics", timeout=30) as r:
            text = r.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                values[key] = float(value)
        return values


class TinyDecoder(paddle.nn.Layer):
    """A small transformer over token ids, written with paddle.nn: a causal decoder
    (``causal=True``: position i attends to positions <= i) or, with an attention mask
    feed, a bidirectional encoder that ignores the masked positions; or neither (every
    position attends to every other: its outputs depend on the padding)."""

    def __init__(self, vocab: int = 50, dim: int = 16, causal: bool = True, masked: bool = False):
        super().__init__()
        self.causal, self.masked = causal, masked
        self.embed = paddle.nn.Embedding(vocab, dim)
        self.pos = paddle.nn.Embedding(64, dim)
        self.qkv = paddle.nn.Linear(dim, 3 * dim)
        self.proj = paddle.nn.Linear(dim, dim)
        self.norm = paddle.nn.LayerNorm(dim)
        self.head = paddle.nn.Linear(dim, vocab)
        self.dim = dim

    def forward(self, input_ids, attention_mask=None):  # type: ignore[no-untyped-def]
        seq = paddle.shape(input_ids)[1]
        positions = paddle.arange(0, seq, dtype="int64")
        h = self.embed(input_ids) + self.pos(positions)
        q, k, v = paddle.split(self.qkv(h), 3, axis=-1)
        scores = paddle.matmul(q, k, transpose_y=True) / float(np.sqrt(self.dim))
        if self.causal:
            rows = paddle.unsqueeze(positions, 1)
            cols = paddle.unsqueeze(positions, 0)
            scores = paddle.where(cols <= rows, scores, paddle.full_like(scores, -1e9))
        if attention_mask is not None:
            keep = paddle.unsqueeze(attention_mask, 1) > 0
            scores = paddle.where(keep, scores, paddle.full_like(scores, -1e9))
        h = self.norm(h + self.proj(paddle.matmul(paddle.nn.functional.softmax(scores), v)))
        return self.head(h)


def save_decoder(
    directory: Path, causal: bool = True, masked: bool = False, seed: int = 3
) -> tuple[str, TinyDecoder]:
    """A TinyDecoder saved with jit.save, batch and sequence length -1; returns its
    path prefix and the dygraph layer (the reference)."""
    static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    try:
        paddle.seed(seed)
        layer = TinyDecoder(causal=causal, masked=masked)
        layer.eval()
        specs = [paddle.static.InputSpec([-1, -1], "int64", "input_ids")]
        if masked:
            specs.append(paddle.static.InputSpec([-1, -1], "int64", "attention_mask"))
        prefix = str(directory / ("decoder" if causal else "encoder"))
        paddle.jit.save(paddle.jit.to_static(layer, input_spec=specs, full_graph=True), prefix)
    finally:
        if static:
            paddle.enable_static()
    return prefix, layer


def decoder_reference(layer: TinyDecoder, *feeds: np.ndarray) -> np.ndarray:
    """The layer's dygraph forward: the oracle."""
    static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    try:
        with paddle.no_grad():
            return np.asarray(layer(*[paddle.to_tensor(f) for f in feeds]).numpy())
    finally:
        if static:
            paddle.enable_static()


class ServedInProcess:
    """A runtime served by an InferenceServer in this process, with tritonclient HTTP
    and gRPC clients, counting the requests its Python handler takes (its ``submit``
    wrapped): a request the C++ front end routes never reaches it."""

    def __init__(self, srv: Any, runtime: Any) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.srv, self.runtime = srv, runtime
        self.python_calls = 0
        submit = runtime.submit

        def counted(feed: Any, timeout: float | None = None) -> Any:
            self.python_calls += 1
            return submit(feed, timeout)

        runtime.submit = counted
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}")
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")

    def infer(
        self,
        model: str,
        feed: dict[str, np.ndarray],
        datatypes: dict[str, str],
        grpc: bool,
        binary: bool = True,
        clients: tuple[Any, Any] | None = None,
    ) -> list[np.ndarray]:
        """``model``'s outputs, in its metadata's order, for ``feed`` (``datatypes``: the
        KServe datatype of every input) over gRPC or HTTP (binary or JSON data), with
        this object's clients or ``clients`` (http, grpc)."""
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        http, grpc_ = clients or (self.http, self.grpc)
        client, mod = (grpc_, grpcclient) if grpc else (http, httpclient)
        inputs = []
        for name, value in feed.items():
            inp = mod.InferInput(name, list(value.shape), datatypes[name])
            if grpc:
                inp.set_data_from_numpy(value)
            else:
                inp.set_data_from_numpy(value, binary_data=binary)
            inputs.append(inp)
        answer = client.infer(model, inputs)
        names = [o["name"] for o in http.get_model_metadata(model)["outputs"]]
        return [answer.as_numpy(name) for name in names]


def wait_for_lines(
    proc: subprocess.Popen[str], prefix: str, count: int, wait: float = 60.0
) -> list[str]:
    """Read `proc`'s stdout until `count` lines start with `prefix` (a thread reads, so
    that a server that never says so fails the test instead of hanging it)."""
    import queue
    import threading

    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.put(line)
        except (ValueError, OSError):
            pass  # closed by communicate() at the end of the test
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + wait
    while sum(line.startswith(prefix) for line in seen) < count:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise AssertionError(f"no {count} lines {prefix!r} in {wait} s: {seen}") from None
        assert line is not None, f"the server ended: {seen}"
        seen.append(line)
    return seen
