"""fp32 <-> fp16 conversion throughput: paddle_ipu._core against numpy, paddle.cast and memcpy;
and float16 rounding of float32 values (the IPU's weight updates on the host): the core's
round_fp16, to nearest and stochastically, against numpy's round trip.

    python bench/fp16.py [--quick]

GB/s counts the float32 side (4 bytes per element) in both directions, so rows of one
size compare directly. Each figure is the median over repeats of a timed batch of
calls; ratios are against numpy's ``astype`` measured in the same run. The 1 KiB
section also reports the per-call time in microseconds (the call overhead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Optional

os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np
import paddle

from paddle_ipu import _core
from paddle_ipu._tensors import fp16

SIZES = [("1 KiB", 1 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]
Call = Callable[[], object]
Row = tuple[str, Call, Optional[Call]]  # name, timed call, untimed setup before each call


def seconds_per_call(fn: Call, nbytes: int, quick: bool, setup: Call | None = None) -> float:
    # Batch small calls so the timer's own cost disappears; keep big ones to a few runs.
    # With a setup step (the in-place rows), only fn is inside the timed region.
    batch = max(1, min(1000, (4 << 20) // nbytes))
    repeats = 5 if quick else (7 if nbytes >= 32 << 20 else 21)
    if setup is not None:
        setup()
    fn()  # warm-up: first touch of pages and caches
    times = []
    for _ in range(repeats):
        if setup is None:
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            times.append((time.perf_counter() - t0) / batch)
        else:
            total = 0.0
            for _ in range(batch):
                setup()
                t0 = time.perf_counter()
                fn()
                total += time.perf_counter() - t0
            times.append(total / batch)
    return statistics.median(times)


def inplace_rows(src: np.ndarray, threads: int) -> tuple[Row, Row]:
    # Each in-place row's untimed setup refills the buffer with the state it starts from.
    buf = src.copy()

    def fill_float() -> None:
        np.copyto(buf, src)

    def fill_half() -> None:
        np.copyto(buf, src)
        _core.f32_to_f16_inplace(buf, threads)

    def to_half() -> object:
        return _core.f32_to_f16_inplace(buf, threads)

    def to_float() -> object:
        return _core.f16_to_f32_inplace(buf, threads)

    label = f"_core in place, {threads} thread{'s' if threads > 1 else ''}"
    return (label, to_half, fill_float), (label, to_float, fill_half)


def run(quick: bool) -> None:
    paddle.set_device("cpu")
    print(f"fp16 kernel: {_core.fp16_isa()}  (available: {', '.join(_core.fp16_isas())})")
    print(f"cores: {os.cpu_count()}  numpy {np.__version__}  paddle {paddle.__version__}\n")
    print("| size | direction | method | GB/s | us/call | vs numpy astype |")
    print("|---|---|---|---:|---:|---:|")
    for label, nbytes in SIZES:
        bench_size(label, nbytes, quick)
    print(
        "\nTargets (64 MiB, 1 thread, vs numpy astype): f32->f16 >= 6x, f16->f32 >= 2.5x; "
        "1 KiB _core call <= 2 us."
    )


def bench_size(label: str, nbytes: int, quick: bool) -> None:
    n = nbytes // 4
    a32 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    a16 = a32.astype(np.float16)
    o32, o16 = np.empty_like(a32), np.empty_like(a16)
    t32, t16 = paddle.to_tensor(a32), paddle.to_tensor(a16)
    down, up = inplace_rows(a32, 1)
    directions = {
        "f32->f16": [
            ("memcpy (np.copyto f32)", lambda: np.copyto(o32, a32), None),
            ("numpy astype", lambda: a32.astype(np.float16), None),
            ("numpy copyto (cast into out)", lambda: np.copyto(o16, a32, casting="unsafe"), None),
            ("paddle.cast", lambda: paddle.cast(t32, "float16"), None),
            ("_core new array, 1 thread", lambda: _core.f32_to_f16(a32, None, 1), None),
            ("_core into out, 1 thread", lambda: _core.f32_to_f16(a32, o16, 1), None),
            ("fp16.to_fp16 into out, auto", lambda: fp16.to_fp16(a32, out=o16), None),
            down,
        ],
        "f16->f32": [
            ("memcpy (np.copyto f32)", lambda: np.copyto(o32, a32), None),
            ("numpy astype", lambda: a16.astype(np.float32), None),
            ("numpy copyto (cast into out)", lambda: np.copyto(o32, a16, casting="unsafe"), None),
            ("paddle.cast", lambda: paddle.cast(t16, "float32"), None),
            ("_core new array, 1 thread", lambda: _core.f16_to_f32(a16, None, 1), None),
            ("_core into out, 1 thread", lambda: _core.f16_to_f32(a16, o32, 1), None),
            ("fp16.to_fp32 into out, auto", lambda: fp16.to_fp32(a16, out=o32), None),
            up,
        ],
    }
    rng = np.random.default_rng(1)

    def numpy_stochastic() -> object:
        # the same rounding with numpy: 13 random bits added below float16's last
        # mantissa bit, then dropped (float16's normal range only)
        bits = a32.view(np.uint32)
        noise = rng.integers(0, 1 << 13, n, dtype=np.uint32)
        return ((bits + noise) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float16)

    directions["f32 -> f16 values in f32 (round)"] = [
        ("numpy astype", lambda: a32.astype(np.float16).astype(np.float32), None),
        ("_core.round_fp16 nearest", lambda: _core.round_fp16(a32), None),
        ("numpy stochastic (bits)", numpy_stochastic, None),
        ("_core.round_fp16 stochastic", lambda: _core.round_fp16(a32, stochastic=True), None),
    ]
    if nbytes >= 64 << 20:
        down2, up2 = inplace_rows(a32, 2)
        directions["f32->f16"] += [
            ("_core into out, 2 threads", lambda: _core.f32_to_f16(a32, o16, 2), None),
            down2,
        ]
        directions["f16->f32"] += [
            ("_core into out, 2 threads", lambda: _core.f16_to_f32(a16, o32, 2), None),
            up2,
        ]
    for direction, rows in directions.items():
        results = [(name, seconds_per_call(fn, nbytes, quick, setup)) for name, fn, setup in rows]
        numpy_s = dict(results)["numpy astype"]
        for name, s in results:
            print(
                f"| {label} | {direction} | {name} | {nbytes / s / 1e9:.2f} | "
                f"{s * 1e6:.2f} | {numpy_s / s:.2f}x |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    run(parser.parse_args().quick)
