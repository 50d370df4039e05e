"""A server for the hostile-client tests, run as a script in its own process:
dynamic models with open dimensions (the C++ front end checks every size a request
brings, nothing else bounds them), served by an InferenceServer with the options given
on the command line, printing ``paddle-ipu: serving ... on http://...`` as ``paddle-ipu
serve`` does (tests/support/serving_models.ServerProcess reads it).

    python hostile_server.py [--as-headroom-mb N] [option=json-value ...]

``option=value``: an InferenceServer keyword (``header_timeout_s=1``), the value read as
JSON.  ``--as-headroom-mb N``: once serving, the process's address space is limited to
what it uses plus N MiB (RLIMIT_AS), so that a request needing more makes the C++ side's
allocations fail (std::bad_alloc) rather than the machine swap.

Models (the handlers are numpy, the tests' oracle):

- ``open``: x FP32 [-1, -1] -> y = 2 x;
- ``words``: s BYTES [-1] -> n INT64 [-1], the length of each element;
- ``typed``: u UINT8 [-1], b BOOL [-1], h FP16 [-1] -> the three echoed.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time
from typing import Any

import numpy as np

from paddle_ipu.serving.dynamic import FunctionModel, TensorSpec
from paddle_ipu.serving.server import InferenceServer


def _open(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": feed["x"] * 2}


def _words(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = feed["s"]
    return {"n": np.array([len(w) for w in s.reshape(-1)], np.int64).reshape(s.shape)}


def _typed(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"u_out": feed["u"], "b_out": feed["b"], "h_out": feed["h"]}


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main(argv: list[str]) -> None:
    headroom_mb = 0
    options: dict[str, Any] = {}
    args = iter(argv)
    for arg in args:
        if arg == "--as-headroom-mb":
            headroom_mb = int(next(args))
            continue
        key, value = arg.split("=", 1)
        options[key] = json.loads(value)
    options.setdefault("port", 0)
    options.setdefault("grpc_port", 0)
    srv = InferenceServer(None, **options)
    srv.add_model(
        FunctionModel(
            _open, [TensorSpec("x", "FP32", (-1, -1))], [TensorSpec("y", "FP32", (-1, -1))]
        ),
        "open",
    )
    srv.add_model(
        FunctionModel(_words, [TensorSpec("s", "BYTES", (-1,))], [TensorSpec("n", "INT64", (-1,))]),
        "words",
    )
    typed_in = [TensorSpec(n, t, (-1,)) for n, t in (("u", "UINT8"), ("b", "BOOL"), ("h", "FP16"))]
    typed_out = [TensorSpec(f"{s.name}_out", s.datatype, s.dims) for s in typed_in]
    srv.add_model(FunctionModel(_typed, typed_in, typed_out), "typed")
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    srv.start()
    if headroom_mb:  # after start(): the server's threads and their stacks exist
        cap = _vm_bytes() + headroom_mb * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
    print(
        f"paddle-ipu: serving models on http://{srv.host}:{srv.port} and "
        f"grpc://{srv.host}:{srv.grpc_port}",
        flush=True,
    )
    while not received:
        time.sleep(0.1)
    srv.stop()
    print("paddle-ipu: stopped", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
