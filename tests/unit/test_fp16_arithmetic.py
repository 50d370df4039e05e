"""The host backend's float16 arithmetic against the numpy reference written from
Graphcore's documented behaviour (tests/fp16_reference.py), one operator family at a
time: elementwise, matmul and convolution with float32 and float16 partials,
reductions, softmax, normalisations; saturation; the graph's inputs and weights.

Graphs are built with onnx.helper and run on a host session as the compiler's graphs
are, in both of its placements of the roundings: after ONNX Runtime's optimisation
(the default) and after every operator of the graph (what the floating-point checks
use)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support import fp16_reference as ref

from paddle_ipu.backends import create_session
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec

F = TensorProto.FLOAT
#: the two placements of the roundings (see paddle_ipu/backends/host/fp16_graph.py)
PLACEMENTS = {"optimised": {}, "every_operator": {"enable_floating_point_checks": True}}


def run(
    nodes: Sequence[onnx.NodeProto],
    feeds: Mapping[str, np.ndarray],
    outputs: Mapping[str, tuple[int, ...]],
    *,
    weights: Mapping[str, np.ndarray] | None = None,
    options: Mapping[str, Any] | None = None,
    fp16: bool = True,
    opset: int = 17,
    seed: int | None = None,
    replicas: int = 1,
) -> list[np.ndarray]:
    """Run a graph on a host session; ``weights`` become the model's weights."""
    weights = dict(weights or {})
    inputs = [helper.make_tensor_value_info(n, F, list(a.shape)) for n, a in feeds.items()]
    outs = [helper.make_tensor_value_info(n, F, list(s)) for n, s in outputs.items()]
    inits = [onnx.numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in weights.items()]
    graph = helper.make_graph(list(nodes), "g", inputs, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    compiled = CompiledModel(
        onnx=model.SerializeToString(),
        inputs=[TensorSpec(n, "float32", tuple(a.shape), n) for n, a in feeds.items()],
        outputs=[TensorSpec(n, "float32", tuple(s), n) for n, s in outputs.items()],
        weights={n: n for n in weights},
    )
    config = SessionConfig(
        enable_fp16=fp16,
        num_threads=1,
        options=dict(options or {}),
        random_seed=seed,
        replication_factor=replicas,
    )
    session = create_session("host", compiled, config)
    session.prepare_device()
    result = session.run({n: np.asarray(a, np.float32) for n, a in feeds.items()})
    return [np.asarray(result[n], np.float64) for n in outputs]


def half(rng: np.random.Generator, shape: Sequence[int], scale: float = 1.0) -> np.ndarray:
    """Random float16 values (held in float32)."""
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


def grid(rng: np.random.Generator, shape: Sequence[int], k: int = 32) -> np.ndarray:
    """Multiples of 1/16 in [-k/16, k/16]: float16 values whose products and sums of a
    few thousand are exact in float32, so that the host's float32 arithmetic adds no
    rounding of its own and only the IPU's roundings remain (compared bit for bit)."""
    return (rng.integers(-k, k + 1, shape) / 16).astype(np.float32)


@pytest.fixture(params=list(PLACEMENTS))
def placement(request: Any) -> dict[str, Any]:
    return dict(PLACEMENTS[request.param])


# -- elementwise ------------------------------------------------------------------------


def test_every_elementwise_result_is_rounded(rng: np.random.Generator, placement: Any) -> None:
    a, b, c = (half(rng, (64,)) for _ in range(3))
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["s"]),
        helper.make_node("Sub", ["s", "a"], ["y"]),
    ]
    (got,) = run(nodes, {"a": a, "b": b, "c": c}, {"y": (64,)}, options=placement)
    m = ref.elementwise(np.multiply, a, b)
    s = ref.elementwise(np.add, m, c)
    want = ref.elementwise(np.subtract, s, a)
    np.testing.assert_array_equal(got, want)
    # and not what one rounding of the float32 chain gives
    assert not np.array_equal(got, ref.r(a * b + c - a))


def test_unary_functions_round_their_results(rng: np.random.Generator, placement: Any) -> None:
    x = half(rng, (256,), 2.0)
    nodes = [
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("Tanh", ["e"], ["t"]),
        helper.make_node("Sqrt", ["e"], ["q"]),
        helper.make_node("Add", ["t", "q"], ["y"]),
    ]
    (got,) = run(nodes, {"x": x}, {"y": (256,)}, options=placement)
    e = ref.elementwise(np.exp, x)
    want = ref.elementwise(np.add, ref.elementwise(np.tanh, e), ref.elementwise(np.sqrt, e))
    # exp, tanh and sqrt are evaluated in float32 before the rounding: at most one
    # float16 ulp where float32's error crosses a rounding boundary
    assert ref.ulps(got, want).max() <= 1
    assert np.mean(got == want) > 0.98


def test_inputs_and_weights_are_float16_values() -> None:
    x = np.array([1.0001, 2.0003, -3.00007, 65519.0], np.float32)
    w = np.array([0.1, 0.2, 0.3, 1.0], np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    (got,) = run(nodes, {"x": x}, {"y": (4,)}, weights={"w": w})
    np.testing.assert_array_equal(got, ref.elementwise(np.multiply, ref.r(x), ref.r(w)))


def test_overflow_saturates_and_infinities_stay(placement: Any) -> None:
    x = np.array([40000.0, -40000.0, 1.0, 0.0], np.float32)
    one = np.ones(4, np.float32)
    nodes = [
        helper.make_node("Add", ["x", "x"], ["big"]),  # +-80000: overflows float16
        helper.make_node("Div", ["one", "x"], ["inv"]),  # 1 / 0: a true infinity
    ]
    if placement:  # the checks would stop at the overflow: see test_fp_checks.py
        return
    big, inv = run(nodes, {"x": x, "one": one}, {"big": (4,), "inv": (4,)})
    np.testing.assert_array_equal(big, [65504.0, -65504.0, 2.0, 0.0])
    np.testing.assert_array_equal(inv, [ref.r(1 / 40000.0), ref.r(-1 / 40000.0), 1.0, np.inf])


def test_an_overflow_absorbed_later_gives_the_saturated_result() -> None:
    """1 / overflow: the IPU divides by 65504, not by an infinity (the host runs such a
    micro-batch on the graph that saturates every result)."""
    x = np.array([40000.0, 3.0], np.float32)
    nodes = [
        helper.make_node("Add", ["x", "x"], ["big"]),
        helper.make_node("Reciprocal", ["big"], ["y"]),
    ]
    (got,) = run(nodes, {"x": x}, {"y": (2,)})
    np.testing.assert_array_equal(got, [ref.r(1 / 65504.0), ref.r(1 / 6.0)])


def test_exact_operators_are_not_rounded_again(rng: np.random.Generator) -> None:
    x = half(rng, (1, 2, 4, 4), 3.0)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Transpose", ["p"], ["y"], perm=[0, 1, 3, 2]),
    ]
    (got,) = run(nodes, {"x": x}, {"y": (1, 2, 2, 2)})
    r = np.maximum(x, 0)
    want = r.reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5)).transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(got, want)


# -- matmul and convolution -------------------------------------------------------------


@pytest.mark.parametrize("partials", ["float", "half"])
def test_matmul_partials(rng: np.random.Generator, partials: str, placement: Any) -> None:
    a, b = grid(rng, (8, 512)), grid(rng, (512, 16))
    options = {**placement, "partials_type_matmuls": partials}
    (got,) = run([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, {"y": (8, 16)},
                 options=options)  # fmt: skip
    np.testing.assert_array_equal(got, ref.matmul(a, b, half_partials=partials == "half"))
    # float16 partials move the product away from the exact one; float32 partials round
    # only the result
    exact = a.astype(np.float64) @ b.astype(np.float64)
    if partials == "half":
        assert np.abs(got - exact).mean() > 2 * np.abs(ref.r(exact) - exact).mean()
    else:
        np.testing.assert_array_equal(got, ref.r(exact))


def test_matmul_partials_with_any_values(rng: np.random.Generator) -> None:
    """Values whose sums float32 rounds: within one float16 ulp of the reference, and
    equal for most elements (the host sums a pass in float32, in its own order)."""
    a, b = half(rng, (8, 512)), half(rng, (512, 16))
    options = {"partials_type_matmuls": "half"}
    (got,) = run([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, {"y": (8, 16)},
                 options=options)  # fmt: skip
    want = ref.matmul(a, b, half_partials=True)
    assert np.mean(got == want) > 0.95
    # a flipped rounding of a partial moves the result by an ulp of that partial
    assert np.abs(got - want).max() <= 2 * np.spacing(np.float16(np.abs(a @ b).max()))


@pytest.mark.parametrize("partials", ["float", "half"])
def test_conv_partials(rng: np.random.Generator, partials: str, placement: Any) -> None:
    x, w = grid(rng, (1, 48, 6, 6)), grid(rng, (8, 48, 3, 3), 8)
    options = {**placement, "convolution_options": {"partialsType": partials}}
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    (got,) = run([node], {"x": x}, {"y": (1, 8, 6, 6)}, weights={"w": w}, options=options)
    np.testing.assert_array_equal(got, ref.conv2d(x, w, pad=1, half_partials=partials == "half"))


def test_enable_half_partial_sets_both(rng: np.random.Generator) -> None:
    from paddle_ipu import IpuStrategy

    s = IpuStrategy()
    s.set_options({"enable_half_partial": True})
    a, b = grid(rng, (4, 256)), grid(rng, (256, 4))
    options = {k: s.get(k) for k in ("partials_type_matmuls", "convolution_options")}
    (got,) = run([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, {"y": (4, 4)},
                 options=options)  # fmt: skip
    np.testing.assert_array_equal(got, ref.matmul(a, b, half_partials=True))


# -- reductions, softmax, normalisations -------------------------------------------------


def test_reductions_accumulate_in_float32(placement: Any) -> None:
    """4096 ones: float32 partials give 4096; a float16 running sum would stop at 2048
    (2049 is not a float16 value)."""
    x = np.ones((1, 4096), np.float32)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Constant", [], ["ax"], value=axes),
        helper.make_node("ReduceSum", ["x", "ax"], ["s"]),
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[1]),
    ]
    s, m = run(nodes, {"x": x}, {"s": (1, 1), "m": (1, 1)}, options=placement)
    assert s.item() == 4096.0 and m.item() == 1.0


def test_reduction_rounds_once(rng: np.random.Generator) -> None:
    x = half(rng, (4, 300))
    (got,) = run([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1])], {"x": x},
                 {"y": (4, 1)})  # fmt: skip
    np.testing.assert_array_equal(got, ref.reduce_mean(x, 1))


def test_softmax_as_popnn(rng: np.random.Generator, placement: Any) -> None:
    x = half(rng, (6, 40), 4.0)
    (got,) = run([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": x}, {"y": (6, 40)},
                 options=placement)  # fmt: skip
    want = ref.softmax(x)
    assert ref.ulps(got, want).max() <= 1
    assert np.mean(got == want) > 0.98
    # and not one rounding of float32's softmax
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    assert not np.array_equal(got, ref.r(e / e.sum(axis=-1, keepdims=True)))


@pytest.mark.parametrize("stable", [False, True])
def test_layer_norm_as_poplin(rng: np.random.Generator, stable: bool) -> None:
    x = half(rng, (4, 64), 3.0) + 2.0
    gamma, beta = half(rng, (64,)), half(rng, (64,))
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)
    weights, options = {"g": gamma, "b": beta}, {"enable_stable_norm": stable}
    x = x.astype(np.float16).astype(np.float32)
    (got,) = run([node], {"x": x}, {"y": (4, 64)}, weights=weights, options=options)
    want = ref.norm(x, (1,), 1e-5, gamma, beta, stable=stable)
    assert ref.ulps(got, want).max() <= 1
    assert np.mean(got == want) > 0.95


def test_instance_norm_as_poplin(rng: np.random.Generator) -> None:
    x = half(rng, (2, 3, 5, 5), 2.0)
    gamma, beta = half(rng, (3,)), half(rng, (3,))
    node = helper.make_node("InstanceNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5)
    (got,) = run([node], {"x": x}, {"y": (2, 3, 5, 5)}, weights={"g": gamma, "b": beta})
    want = ref.norm(x, (2, 3), 1e-5, gamma.reshape(1, 3, 1, 1), beta.reshape(1, 3, 1, 1))
    assert ref.ulps(got, want).max() <= 1


# -- the other arithmetic ------------------------------------------------------------------


def test_float32_arithmetic_keeps_float32_results(rng: np.random.Generator) -> None:
    a, b = half(rng, (64,)), half(rng, (64,))
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Exp", ["m"], ["y"])]
    (got,) = run(nodes, {"a": a, "b": b}, {"y": (64,)},
                 options={"host_fp16_arithmetic": "float32"})  # fmt: skip
    np.testing.assert_allclose(got, np.exp(a * b), rtol=1e-6)
    assert not np.array_equal(got, ref.r(got))
