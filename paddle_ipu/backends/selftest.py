"""``paddle-ipu selftest``: the backend contract checks on whatever is installed here,
with a report an IPU owner can paste into an issue.

Each check runs a small graph (y = x @ w + b, built directly in ONNX) on the backend
and compares it with numpy: step layout and anchor types, weights written, read back
and taking effect, and fp16.  ``python -m paddle_ipu.backends.selftest [--backend NAME]``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

MB, IN, OUT = 2, 3, 4


def _model() -> Any:
    from onnx import TensorProto, helper, numpy_helper

    from paddle_ipu.compiler.model import CompiledModel, TensorSpec

    w0, b0 = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "selftest",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [MB, IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [MB, OUT])],
        initializer=[numpy_helper.from_array(w0, "w"), numpy_helper.from_array(b0, "b")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return CompiledModel(
        onnx=proto.SerializeToString(),
        inputs=[TensorSpec("x", "float32", (MB, IN), "x")],
        outputs=[TensorSpec("y", "float32", (MB, OUT), "y")],
        weights={"w": "selftest.w", "b": "selftest.b"},
        micro_batch_size=MB,
        opset=13,
    )


def _weights() -> tuple[np.ndarray, np.ndarray]:
    w = np.arange(IN * OUT, dtype=np.float32).reshape(IN, OUT) / 10
    return w, np.linspace(-1, 1, OUT).astype(np.float32)


def _check_layout(backend: str, kind: str) -> str:
    from paddle_ipu import backends
    from paddle_ipu.backends.base import AnchorReturnType, SessionConfig
    from paddle_ipu.backends.layout import StepLayout

    bps, rf = 3, 2
    layout = StepLayout(bps, 1, rf)
    config = SessionConfig(
        batches_per_step=bps, replication_factor=rf, anchors={"y": AnchorReturnType(kind)}
    )
    x = np.random.default_rng(0).standard_normal((bps, rf, MB, IN)).astype(np.float32)
    w, b = _weights()
    full = x @ w + b
    want = {"ALL": full, "FINAL": full[-1], "SUM": full.sum(axis=0)}[kind]
    with backends.create_session(backend, _model(), config) as session:
        session.prepare_device()
        out = session.run({"x": x.reshape(layout.input_shape((MB, IN)))})["y"]
    shape = layout.anchor_shape((MB, OUT), kind, 1)
    if out.shape != shape:
        raise AssertionError(f"anchor shape {out.shape}, expected {shape}")
    err = float(np.abs(out - want.reshape(shape)).max())
    if err > 1e-5:
        raise AssertionError(f"max |error| {err:.3g} > 1e-5")
    return f"bps={bps} rf={rf} shape={list(shape)} max|err|={err:.3g}"


def _check_weights(backend: str) -> str:
    from paddle_ipu import backends
    from paddle_ipu.backends.base import SessionConfig

    w, b = _weights()
    with backends.create_session(backend, _model(), SessionConfig()) as session:
        session.prepare_device()
        read = session.read_weights(["w", "b"])
        if not (np.array_equal(read["w"], w) and np.array_equal(read["b"], b)):
            raise AssertionError("the weights read back differ from the model's")
        session.write_weights({"w": -w})
        x = np.ones((MB, IN), np.float32)
        err = float(np.abs(session.run({"x": x})["y"] - (x @ -w + b)).max())
    if err > 1e-5:
        raise AssertionError(f"after write_weights, max |error| {err:.3g} > 1e-5")
    return f"read back exact; written weights take effect, max|err|={err:.3g}"


def _check_fp16(backend: str) -> str:
    from paddle_ipu import backends
    from paddle_ipu.backends.base import SessionConfig

    w, b = _weights()
    x = np.random.default_rng(1).standard_normal((MB, IN)).astype(np.float32)
    with backends.create_session(backend, _model(), SessionConfig(enable_fp16=True)) as s:
        s.prepare_device()
        dtype = s.get_info("w").dtype
        y = s.run({"x": x})["y"]
    err = float(np.abs(y - (x @ w + b)).max())
    if dtype != "float16" or err > 1e-2:
        raise AssertionError(f"weights {dtype}, max |error| {err:.3g} (want float16, <= 1e-2)")
    return f"weights float16, max|err|={err:.3g}"


def run_checks(backend: str) -> list[tuple[str, bool, str, float]]:
    """(name, passed, detail, seconds) for each check on ``backend``."""
    checks: list[tuple[str, Callable[[], str]]] = [
        ("layout ALL", lambda: _check_layout(backend, "ALL")),
        ("layout FINAL", lambda: _check_layout(backend, "FINAL")),
        ("layout SUM", lambda: _check_layout(backend, "SUM")),
        ("weights round trip", lambda: _check_weights(backend)),
        ("fp16", lambda: _check_fp16(backend)),
    ]
    results = []
    for name, fn in checks:
        start = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as exc:  # a report lists every failure, it does not stop
            detail, ok = f"{type(exc).__name__}: {exc}", False
        results.append((name, ok, detail, time.perf_counter() - start))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; 0 when every check passed, 1 otherwise, 2 when the backend
    cannot be used here."""
    parser = argparse.ArgumentParser(prog="paddle-ipu selftest", description=__doc__)
    parser.add_argument("--backend", default="auto", help="host, popart or auto (default)")
    args = parser.parse_args(argv)

    import os

    from paddle_ipu import backends
    from paddle_ipu._version import __version__

    name = backends.resolve(args.backend)
    ok, description = backends.availability(name)
    print("paddle-ipu selftest")
    print(f"  paddle-ipu {__version__}, python {platform.python_version()}, "
          f"{platform.machine()}")  # fmt: skip
    print(f"  backend: {name} ({description})")
    for var in ("POPLAR_IPUMODEL", "IPU_COMPILE_ONLY", "IPU_CACHE_PATH"):
        if os.environ.get(var):
            print(f"  {var}={os.environ[var]}")
    if not ok:
        print(f"  the {name} backend cannot be used here: {description}")
        return 2
    results = run_checks(name)
    for check, passed, detail, seconds in results:
        print(f"  [{'PASS' if passed else 'FAIL'}] {check}: {detail} ({seconds * 1000:.0f} ms)")
    failed = sum(not passed for _, passed, _, _ in results)
    print(f"  {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
