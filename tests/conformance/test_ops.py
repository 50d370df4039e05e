"""Every supported operator against Paddle's CPU kernel, fp32 (1e-5) and fp16 (1e-2),
with float16 arithmetic (the IPU's) and with the host's default float32 arithmetic.

One table entry per operator and attribute setting (cases.py); each program is
compiled once and run in both precisions on the host backend.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import paddle
import pytest
from support.cases import CASES, FP16_HOST_FAILS, FP16_OVERFLOWS, NOT_COVERED, REFUSED
from support.runner import FP32_TOL, Case, build, compare, run_compiled, run_paddle

from paddle_ipu.compiler import compile_program, supported_ops
from paddle_ipu.compiler.ops import converter_name
from paddle_ipu.errors import BackendError, UnsupportedOpError

paddle.enable_static()

BY_ID = {c.id: c for c in CASES}
MATCHING = [c for c in CASES if c.id not in REFUSED]


@functools.cache
def _compiled(case_id: str) -> tuple[Any, Any, list[np.ndarray]]:
    case = BY_ID[case_id]
    built = build(case)
    ref = run_paddle(built)
    model = compile_program(built.main, built.feeds, built.fetches, scope=paddle.static.Scope())
    return built, model, ref


@pytest.mark.parametrize("case", MATCHING, ids=lambda c: c.id)
def test_fp32_matches_paddle_cpu(case: Case) -> None:
    built, model, ref = _compiled(case.id)
    assert compare(ref, run_compiled(built, model, fp16=False), FP32_TOL) == ""


@pytest.mark.parametrize("case", MATCHING, ids=lambda c: c.id)
def test_fp16_matches_paddle_cpu(case: Case) -> None:
    built, model, ref = _compiled(case.id)
    if case.id in FP16_HOST_FAILS:
        with pytest.raises(BackendError):
            run_compiled(built, model, fp16=True)
        return
    got = run_compiled(built, model, fp16=True)
    if case.id in FP16_OVERFLOWS:
        _check_softplus_overflow(built.arrays, ref, got, case.tol16)
        return
    assert compare(ref, got, case.tol16) == ""


def _check_softplus_overflow(
    arrays: dict[str, np.ndarray], ref: list[np.ndarray], got: list[np.ndarray], tol: float
) -> None:
    """The emulated IPU's softplus(10 x) in float16: exp(10 x) saturates at 65504 where
    10 x > log(65504) (up to paddle2onnx's threshold, 20): there the result is
    log(1 + 65504) rounded to float16; everywhere else it matches Paddle's float32."""
    (x,) = arrays.values()
    region = (10 * x.astype(np.float64) > np.log(65504.0)) & (10 * x <= 20)
    assert region.any(), "the case's input no longer reaches float16's overflow"
    assert compare([ref[0][~region]], [got[0][~region]], tol) == ""
    saturated = np.float16(np.log1p(np.float32(65504.0)))
    np.testing.assert_allclose(got[0][region], saturated, rtol=1e-3)


@pytest.mark.parametrize("case", MATCHING, ids=lambda c: c.id)
def test_fp16_storage_with_float32_arithmetic_matches_paddle_cpu(case: Case) -> None:
    # the host's default fp16: weights and constants in float16, arithmetic in float32
    # -- every case runs, those ONNX Runtime cannot compute in float16 included
    built, model, ref = _compiled(case.id)
    assert compare(ref, run_compiled(built, model, True, "float32"), case.tol16) == ""


@pytest.mark.parametrize("case_id", sorted(REFUSED))
def test_refused_at_compile_time_naming_op_and_value(case_id: str) -> None:
    case = BY_ID[case_id]
    built = build(case)
    with pytest.raises(UnsupportedOpError) as err:
        compile_program(built.main, built.feeds, built.fetches, scope=paddle.static.Scope())
    assert REFUSED[case_id] in str(err.value)
    assert f"pd_op.{case.op}" in str(err.value)


def _names(op: str) -> set[str]:
    """Every spelling of an operator supported_ops() may use."""
    short = op.split(".", 1)[1] if op.startswith("pd_op.") else op
    pir = op if op.startswith(("pd_op.", "builtin.")) else "pd_op." + op
    return {short, op, converter_name(pir)}


def test_every_listed_operator_is_covered_or_explained() -> None:
    covered: set[str] = set()
    for case in MATCHING:  # the operators the programs really hold
        for op in build(case).ops:
            covered |= _names(op)
    for op in NOT_COVERED:
        covered |= _names(op)
    missing = [n for n in supported_ops() if n not in covered]
    assert missing == []


def test_refused_operators_are_not_listed() -> None:
    listed = set(supported_ops())
    for case_id in REFUSED:
        op = BY_ID[case_id].op
        # refused for some attribute values (or input sizes) only
        if op.startswith(("conv", "max_pool", "pool", "pad3d", "set_value", "gru")) or op.endswith(
            "_interp"
        ):
            assert op in listed
        else:
            assert op not in listed


def test_fetched_scale_of_a_feed_keeps_its_bias() -> None:
    # save_inference_model fetches scale(x, 1.0, bias) as x itself: the bias
    # must survive when such a value is fetched next to others.
    case = Case(
        "scale.fetched_twice",
        "scale",
        {"x": "f:3x4"},
        lambda x: [paddle.scale(x, 1.0, 0.5), paddle.scale(x, 1.0, -2.0, False)],
    )
    built = build(case)
    model = compile_program(built.main, built.feeds, built.fetches, scope=paddle.static.Scope())
    assert compare(run_paddle(built), run_compiled(built, model, fp16=False), FP32_TOL) == ""
