"""Reading a Paddle tensor from numpy: zero-copy views against Paddle's copying conversions.

    python bench/views.py [--quick]

For a scope tensor (``scope.var(name).get_tensor()``) on the CPU and on the ipu place,
and a dygraph tensor, at 4 KiB and 64 MiB: the median time of each way of getting a
numpy array of its contents, and the ratio against ``np.array(tensor)`` (a copy) measured
in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np
import paddle

from paddle_ipu._tensors.views import as_numpy, view

SIZES = [("4 KiB", 4 << 10), ("64 MiB", 64 << 20)]


def seconds_per_call(fn: Callable[[], object], nbytes: int, quick: bool) -> float:
    batch = max(1, min(2000, (1 << 20) // nbytes))
    repeats = 5 if quick else (7 if nbytes >= 32 << 20 else 21)
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch)
    return statistics.median(times)


def places() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = [("cpu", paddle.CPUPlace())]
    if "ipu" in paddle.device.get_all_custom_device_type():
        found.append(("ipu", paddle.CustomPlace("ipu", 0)))
    return found


def report(
    label: str, what: str, rows: list[tuple[str, Callable[[], object]]], nbytes: int, quick: bool
) -> None:
    results = [(name, seconds_per_call(fn, nbytes, quick)) for name, fn in rows]
    base = results[0][1]
    for name, s in results:
        print(f"| {label} | {what} | {name} | {s * 1e6:.2f} | {base / s:.2f}x |")


def run(quick: bool) -> None:
    print(f"numpy {np.__version__}  paddle {paddle.__version__}\n")
    print("| size | tensor | method | us/call | vs copy |")
    print("|---|---|---|---:|---:|")
    scope = paddle.static.Scope()
    for label, nbytes in SIZES:
        data = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
        for place_name, place in places():
            t = scope.var(f"w_{place_name}_{nbytes}").get_tensor()
            t.set(data, place)
            rows = [
                ("np.array(tensor) (copy)", lambda t=t: np.array(t)),
                ("view(tensor)", lambda t=t: view(t)),
                ("np.asarray(view(tensor))", lambda t=t: np.asarray(view(t))),
            ]
            report(label, f"scope, {place_name}", rows, nbytes, quick)
        x = paddle.to_tensor(data, place=paddle.CPUPlace())
        rows = [
            ("tensor.numpy() (copy)", lambda x=x: x.numpy()),
            ("view(tensor)", lambda x=x: view(x)),
            ("as_numpy(tensor)", lambda x=x: as_numpy(x)),
        ]
        report(label, "dygraph, cpu", rows, nbytes, quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    run(parser.parse_args().quick)
