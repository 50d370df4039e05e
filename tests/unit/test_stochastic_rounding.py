"""Stochastic rounding to float16, as the IPU applies it: unbiased (the mean of many
roundings is the value, within its standard error), between the two float16 neighbours
only, reproducible for a seed, different per replica -- in the core's loop
(paddle_ipu._core.round_fp16, the trainer's weight updates) and in the graph the host
runs (its own construction from float operators)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from paddle_ipu import _core as core
from paddle_ipu.backends import create_session
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.backends.host import numerics
from paddle_ipu.compiler.model import CompiledModel, TensorSpec

N = 200_000
#: values and where they sit: normal range, negative, across a binade, subnormal,
#: the edge of the range, and a float16 value (which never moves)
VALUES = [1.0 / 3.0, -2.7182817, 1.9999, 2.0 + 2**-12, 3e-7, -6.0e-8, 65500.0, 1.5]


def neighbours(x: float) -> tuple[float, float]:
    """The float16 values lo <= x <= hi around x."""
    h = np.float16(x)
    if float(h) == x:
        return x, x
    if float(h) < x:  # (a Python float would be cast to float16 in the comparison)
        return float(h), float(np.nextafter(h, np.float16(np.inf)))
    return float(np.nextafter(h, np.float16(-np.inf))), float(h)


def check_unbiased(x: float, rounded: np.ndarray) -> None:
    lo, hi = neighbours(x)
    assert set(np.unique(rounded)) <= {lo, hi}, (x, np.unique(rounded)[:5])
    if lo == hi:
        return
    p = (x - lo) / (hi - lo)
    # the mean of N Bernoulli(p) steps of (hi - lo): within 4 standard errors
    stderr = (hi - lo) * np.sqrt(p * (1 - p) / rounded.size)
    assert abs(rounded.astype(np.float64).mean() - x) <= 4 * stderr, (x, rounded.mean())


@pytest.mark.parametrize("x", VALUES)
def test_core_rounding_is_unbiased(x: float) -> None:
    src = np.full(N, x, np.float32)
    check_unbiased(float(np.float32(x)), numerics.round_fp16(src, stochastic=True, seed=7))


def test_core_rounding_is_reproducible_per_seed_and_stream() -> None:
    src = np.full(4096, 1.0 / 3.0, np.float32)
    a = core.round_fp16(src, stochastic=True, seed=1, stream=5)
    np.testing.assert_array_equal(a, core.round_fp16(src, stochastic=True, seed=1, stream=5))
    assert not np.array_equal(a, core.round_fp16(src, stochastic=True, seed=2, stream=5))
    assert not np.array_equal(a, core.round_fp16(src, stochastic=True, seed=1, stream=6))


def test_core_rounding_to_nearest_is_numpy_s_and_saturates() -> None:
    rng = np.random.default_rng(0)
    src = (rng.standard_normal(10_000) * 1000).astype(np.float32)
    np.testing.assert_array_equal(core.round_fp16(src), src.astype(np.float16).astype(np.float32))
    big = np.array([70000.0, -1e9, np.inf, np.nan, 65519.0], np.float32)
    np.testing.assert_array_equal(
        core.round_fp16(big)[:4], np.array([65504.0, -65504.0, np.inf, np.nan], np.float32)
    )
    assert core.round_fp16(big, saturate=False)[0] == np.inf
    assert core.round_fp16(big)[4] == 65504.0  # rounds down to the largest value


def _session(seed: int | None, replicas: int = 1) -> Any:
    """A graph computing ones / threes (1/3, not a float16 value) on N elements."""
    graph = helper.make_graph(
        [helper.make_node("Div", ["one", "three"], ["y"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [N]) for n in ("one", "three")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    compiled = CompiledModel(
        onnx=model.SerializeToString(),
        inputs=[TensorSpec(n, "float32", (N,), n) for n in ("one", "three")],
        outputs=[TensorSpec("y", "float32", (N,), "y")],
    )
    config = SessionConfig(
        enable_fp16=True,
        num_threads=1,
        random_seed=seed,
        replication_factor=replicas,
        options={"enable_stochastic_rounding": True},
    )
    session = create_session("host", compiled, config)
    session.prepare_device()
    return session


def _feeds(replicas: int = 1) -> dict[str, np.ndarray]:
    shape = (replicas, N) if replicas > 1 else (N,)
    return {"one": np.ones(shape, np.float32), "three": np.full(shape, 3.0, np.float32)}


def test_graph_rounding_is_unbiased_and_reproducible() -> None:
    first = _session(seed=11)
    a = np.asarray(first.run(_feeds())["y"])
    check_unbiased(float(np.float32(1.0) / np.float32(3.0)), a)
    b = np.asarray(first.run(_feeds())["y"])
    assert not np.array_equal(a, b)  # the random state moves on from run to run
    again = _session(seed=11)
    np.testing.assert_array_equal(np.asarray(again.run(_feeds())["y"]), a)
    np.testing.assert_array_equal(np.asarray(again.run(_feeds())["y"]), b)
    other = _session(seed=12)
    assert not np.array_equal(np.asarray(other.run(_feeds())["y"]), a)


def test_graph_rounding_differs_per_replica() -> None:
    out = np.asarray(_session(seed=11, replicas=2).run(_feeds(2))["y"])
    assert out.shape == (2, N)
    assert not np.array_equal(out[0], out[1])
    for row in out:
        check_unbiased(float(np.float32(1.0) / np.float32(3.0)), row)


def test_without_stochastic_rounding_the_graph_rounds_to_nearest() -> None:
    session = _session(seed=11)
    session.config.options = {}
    session.prepare_device()
    out = np.asarray(session.run(_feeds())["y"])
    assert np.all(out == np.float32(np.float16(1.0 / 3.0)))


def test_stream_seeds_differ_by_key() -> None:
    seeds = {numerics.stream_seed(5, kind, step) for kind in (1, 2, 3) for step in range(100)}
    assert len(seeds) == 300
    assert onnx  # the graph tests above use onnx through helper
