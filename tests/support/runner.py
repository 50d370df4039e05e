"""Running one conformance case: Paddle's CPU executor against the compiled graph.

A case builds a small static program (``paddle.static.data`` inputs -> one
operator through its public Paddle API -> fetches); the same program and inputs
run on Paddle's CPU executor (the oracle) and, compiled by
``paddle_ipu.compiler.compile_program``, on the host backend's ONNX Runtime
session in fp32 and in fp16 (float16 arithmetic).  Used by the tests and by
tools/gen_supported_ops.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle

from paddle_ipu.backends import create_session
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler import compile_program

FP32_TOL = 1e-5
FP16_TOL = 1e-2


@dataclass(frozen=True)
class Case:
    """One operator with one set of attribute values.

    ``inputs`` maps a feed name to a spec ``kind:shape`` where kind is ``f``
    (standard normal float32), ``p`` (positive float32), ``u`` (float32 in
    (-0.9, 0.9)), ``b`` (bool), ``iN`` (int64 in [0, N)) or ``jN`` (int32 in
    [0, N)); shape is ``3x4`` (empty for 0-D).  ``fn`` takes the data values in
    order and returns the value or values to fetch.
    """

    id: str
    op: str  # the PIR operator under test, without ``pd_op.``
    inputs: dict[str, str]
    fn: Callable[..., Any]
    fp16: bool = True
    # A case whose fp16 result is not meaningful (an integer-only operator runs
    # the same graph) still runs; this only marks the report.
    attrs: str = ""
    tol16: float = FP16_TOL
    # Paddle 1.x's sequence operators read a LoD: feed name -> its sequences' lengths
    # for Paddle's run (the compiled graph takes the rows as one sequence: give one)
    lod: dict[str, list[int]] = field(default_factory=dict)


def make_input(spec: str, rng: np.random.Generator) -> np.ndarray:
    kind, _, dims = spec.partition(":")
    shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    if kind == "f":
        return rng.standard_normal(shape).astype("float32")
    if kind == "p":
        return rng.uniform(0.2, 3.0, shape).astype("float32")
    if kind == "u":
        return rng.uniform(-0.9, 0.9, shape).astype("float32")
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if kind[0] in "ij":
        high = int(kind[1:])
        return rng.integers(0, high, shape).astype("int64" if kind[0] == "i" else "int32")
    raise ValueError(f"unknown input kind {spec!r}")


@dataclass
class Built:
    main: Any
    feeds: list[Any]
    fetches: list[Any]
    arrays: dict[str, np.ndarray]
    ops: list[str] = field(default_factory=list)
    lod: dict[str, list[int]] = field(default_factory=dict)


def build(case: Case, seed: int = 0) -> Built:
    rng = np.random.default_rng(seed)
    arrays = {name: make_input(spec, rng) for name, spec in case.inputs.items()}
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        feeds = [paddle.static.data(n, list(a.shape), str(a.dtype)) for n, a in arrays.items()]
        out = case.fn(*feeds)
    fetches = list(out) if isinstance(out, (list, tuple)) else [out]
    ops = [op.name() for op in main.global_block().ops]
    return Built(main, feeds, fetches, arrays, ops, dict(case.lod))


def run_paddle(built: Built) -> list[np.ndarray]:
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        if not built.lod:
            return [
                np.asarray(v)
                for v in exe.run(built.main, feed=built.arrays, fetch_list=built.fetches)
            ]
        feed: dict[str, object] = dict(built.arrays)
        for name, lengths in built.lod.items():  # a LoD tensor, as Paddle 1.x fed it
            feed[name] = paddle.base.create_lod_tensor(
                built.arrays[name], [lengths], paddle.CPUPlace()
            )
        out = exe.run(built.main, feed=feed, fetch_list=built.fetches, return_numpy=False)
        return [np.array(v) for v in out]


def run_compiled(
    built: Built, model: Any, fp16: bool, arithmetic: str = "float16"
) -> list[np.ndarray]:
    """The compiled graph on the host; fp16 computes in ``arithmetic`` (float16: every
    result rounded, as the IPU and PopART's fp16 graph compute)."""
    config = SessionConfig(
        enable_fp16=fp16, num_threads=1, options={"host_fp16_arithmetic": arithmetic}
    )
    session = create_session("host", model, config)
    session.prepare_device()
    out = session.run({spec.name: built.arrays[spec.paddle_name] for spec in model.inputs})
    return [np.asarray(out[spec.name]) for spec in model.outputs]


def compare(ref: list[np.ndarray], got: list[np.ndarray], tol: float) -> str:
    """ "" when every output matches at rtol = atol = tol, else what differs."""
    if len(ref) != len(got):
        return f"{len(got)} outputs, expected {len(ref)}"
    for i, (r, g) in enumerate(zip(ref, got)):
        if r.shape != g.shape:
            return f"output {i}: shape {g.shape}, expected {r.shape}"
        if r.dtype.kind in "biu" and r.dtype != g.dtype and g.dtype.kind not in "biu":
            return f"output {i}: dtype {g.dtype}, expected {r.dtype}"
        rf, gf = r.astype(np.float64), g.astype(np.float64)
        if not np.allclose(gf, rf, rtol=tol, atol=tol, equal_nan=True):
            err = float(np.nanmax(np.abs(gf - rf))) if r.size else 0.0
            return f"output {i}: max abs error {err:.3g} (tolerance {tol:g})"
    return ""


@dataclass
class Outcome:
    case: str
    op: str
    fp32: str  # "" when it matches, else what went wrong
    fp16: str

    @property
    def ok(self) -> bool:
        return not self.fp32 and not self.fp16


def run_case(case: Case) -> Outcome:
    built = build(case)
    ref = run_paddle(built)
    try:
        model = compile_program(built.main, built.feeds, built.fetches, scope=paddle.static.Scope())
    except Exception as exc:
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return Outcome(case.id, case.op, msg, msg)
    results = []
    for fp16, tol in ((False, FP32_TOL), (True, case.tol16)):
        try:
            results.append(compare(ref, run_compiled(built, model, fp16), tol))
        except Exception as exc:
            results.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return Outcome(case.id, case.op, results[0], results[1])
