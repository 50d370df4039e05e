"""``paddle-ipu serve --workers N``: N server processes on the same ports.

Each worker is its own ``paddle-ipu serve`` process (its own model runtime and IO
threads) listening with SO_REUSEPORT, so the kernel spreads the connections and every
core can run the graph and the interpreter.  :func:`supervise` starts them, passes
SIGTERM and SIGINT on to each (a worker drains as one server does), serves their
metrics in one scrape on ``metrics_port`` (:mod:`paddle_ipu.serving.workers`), and
returns the worst of their exit statuses.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = ["supervise"]


def supervise(worker_args: Sequence[str], workers: int, host: str, metrics_port: int | None) -> int:
    """Run ``workers`` processes of ``python -m paddle_ipu *worker_args`` until they end;
    with ``metrics_port``, each gets ``--worker-metrics-socket`` and their metrics are
    served together on that port."""
    argv = [sys.executable, "-m", "paddle_ipu", *worker_args]
    sockets: list[str] = []
    metrics = None
    if metrics_port is not None:
        from paddle_ipu.serving.workers import WorkersMetricsServer

        where = tempfile.mkdtemp(prefix="paddle-ipu-workers-")
        sockets = [os.path.join(where, f"worker-{i}.sock") for i in range(workers)]
        metrics = WorkersMetricsServer(host, metrics_port, sockets)
        print(
            f"paddle-ipu: metrics of {workers} workers on http://{host}:{metrics.port}/metrics",
            flush=True,
        )
    children = [
        subprocess.Popen(argv + (["--worker-metrics-socket", sockets[i]] if sockets else []))
        for i in range(workers)
    ]

    def forward(sig: int, _frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    codes = [child.wait() for child in children]
    if metrics is not None:
        metrics.close()
        shutil.rmtree(os.path.dirname(sockets[0]), ignore_errors=True)
    return max(abs(c) for c in codes)
