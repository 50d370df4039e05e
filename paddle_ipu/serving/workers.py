"""The metrics of ``paddle-ipu serve --workers N`` in one scrape (``--metrics-port``).

Every worker process counts its own requests (``/metrics`` on the shared port shows the
process that answered it).  With ``--metrics-port`` the parent process serves
``GET /metrics`` on that port: it asks every worker for its Prometheus text over a Unix
socket of the worker's own (:class:`WorkerMetricsSocket`), adds a ``worker`` label
(0..N-1) to each of its series, and answers them together, each family once, with
``paddle_ipu_worker_up{worker}`` (0 for a worker that did not answer).  Sum over the
``worker`` label for the server's totals (``sum without (worker) (...)``).

Nothing of this runs per inference request: only per scrape.  :func:`worker_argv`
gives a worker process its arguments.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("paddle_ipu")

__all__ = ["WorkerMetricsSocket", "WorkersMetricsServer", "merge_prometheus", "worker_argv"]

_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class WorkerMetricsSocket:
    """In a worker: answers every connection to the Unix socket ``path`` with
    ``text()`` (its Prometheus text), then closes it."""

    def __init__(self, path: str, text: Callable[[], str]) -> None:
        self.path = path
        self._text = text
        if os.path.exists(path):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(8)
        self._thread = threading.Thread(
            target=self._serve, name="paddle-ipu-worker-metrics", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    conn.sendall(self._text().encode())
                except OSError as exc:
                    log.warning("the worker's metrics were not sent: %s", exc)

    def close(self) -> None:
        self._sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def _read_socket(path: str, timeout: float) -> str | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            chunks = []
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
        return b"".join(chunks).decode()
    except OSError:
        return None


def _with_label(sample: str, label: str) -> str:
    """A sample line with one more label: ``name{a="b"} 1`` -> ``name{a="b",l} 1``."""
    name_end = sample.find("{")
    space = sample.rfind(" ")
    if name_end == -1 or name_end > space:  # no labels
        return f"{sample[:space]}{{{label}}}{sample[space:]}"
    close = sample.rfind("}", 0, space)
    inside = sample[name_end + 1 : close]
    return f"{sample[:close]}{',' if inside else ''}{label}{sample[close:]}"


def merge_prometheus(texts: Sequence[str | None]) -> str:
    """The workers' Prometheus texts as one: each family's HELP and TYPE once, then
    its samples from every worker with ``worker="i"``; and ``paddle_ipu_worker_up``
    (None: the worker did not answer)."""
    order: list[str] = []
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for index, text in enumerate(texts):
        if text is None:
            continue
        family = ""
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("# "):
                family = line.split()[2]
                if family not in headers:
                    order.append(family)
                    headers[family] = []
                    samples[family] = []
                if line not in headers[family]:
                    headers[family].append(line)
                continue
            samples[family].append(_with_label(line, f'worker="{index}"'))
    out = [
        "# HELP paddle_ipu_worker_up Whether the worker process answered this scrape.",
        "# TYPE paddle_ipu_worker_up gauge",
    ]
    out += [
        f'paddle_ipu_worker_up{{worker="{i}"}} {0 if t is None else 1}' for i, t in enumerate(texts)
    ]
    for family in order:
        out += headers[family] + samples[family]
    return "\n".join(out) + "\n"


class WorkersMetricsServer:
    """In the parent: ``GET /metrics`` on ``host:port`` (0: a free port, see
    :attr:`port`), merging the workers' texts read from their sockets."""

    def __init__(self, host: str, port: int, sockets: Sequence[str], timeout: float = 5.0):
        paths = list(sockets)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self._answer(404, b'{"error":"this port answers GET /metrics only"}', "json")
                    return
                texts = [_read_socket(p, timeout) for p in paths]
                self._answer(200, merge_prometheus(texts).encode(), _CONTENT_TYPE)

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                ctype = "application/json" if kind == "json" else kind
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="paddle-ipu-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def worker_argv(args: Any) -> list[str]:
    """The ``paddle-ipu serve`` arguments of one of ``--workers N`` processes, from the
    parent's parsed arguments."""
    out = ["serve", args.model, "--workers", "1", "--reuse-port", "--instances", str(args.workers)]
    if args.spin:
        out.append("--spin")
    flags = (
        "port host name micro_batch timeout_ms num_buffers backend grpc_port threads "
        "request_timeout_ms max_body_mb access_log warmup drain_grace_s precision engine "
        "header_timeout_s idle_timeout_s max_connections max_header_kb max_headers"
    )
    for flag in flags.split():
        value = getattr(args, flag)
        if value is not None:
            out += ["--" + flag.replace("_", "-"), str(value)]
    if args.seq_buckets:
        out += ["--seq-buckets", args.seq_buckets]
    for item in args.pad_value or ():
        out += ["--pad-value", item]
    for item in args.input_shapes or ():
        out += ["--input-shapes", item]
    if args.max_specialisations is not None:
        out += ["--max-specialisations", str(args.max_specialisations)]
    return out
