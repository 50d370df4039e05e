"""Constant arithmetic folded into convolutions (paddle_ipu/compiler/conv_folds.py) and
the fp16 pass's rule for trained weights (paddle_ipu/compiler/fp16_pass.py): BatchNorm
folded into its convolution in float32, float16's real range, and what does not fit
kept float32 and reported.

The oracle is ONNX Runtime running the graph before the rewrite."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from paddle_ipu.compiler import fp16_pass
from paddle_ipu.compiler.conv_folds import (
    fold_batch_norms,
    fold_into_convolutions,
    fold_scalars_before_convolutions,
)
from paddle_ipu.errors import NotSupportedError


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _bn_params(rng: np.random.Generator, c: int, var_scale: float = 1.0) -> list[np.ndarray]:
    gamma = rng.uniform(0.5, 1.5, c)
    beta = rng.uniform(-1, 1, c)
    mean = rng.uniform(-2, 2, c)
    var = rng.uniform(0.5, 2.0, c) * var_scale
    return [np.asarray(p, np.float32) for p in (gamma, beta, mean, var)]


def _model(nodes: list, inits: list, out_shape: list[int], in_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _conv_bn(
    rng: np.random.Generator, *, group: int = 1, bias: bool = True, var_scale: float = 1.0
) -> onnx.ModelProto:
    w = rng.standard_normal((8, 4 // group, 3, 3)) * 0.3
    inits = [_init("w", w)]
    conv_in = ["x", "w"]
    if bias:
        inits.append(_init("b", rng.standard_normal(8)))
        conv_in.append("b")
    names = ["gamma", "beta", "mean", "var"]
    inits += [_init(n, p) for n, p in zip(names, _bn_params(rng, 8, var_scale))]
    nodes = [
        helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], group=group),
        helper.make_node("BatchNormalization", ["c", *names], ["y"], name="bn", epsilon=1e-5),
    ]
    return _model(nodes, inits, [2, 8, 6, 6], [2, 4, 6, 6])


@pytest.mark.parametrize("group,bias", [(1, True), (1, False), (2, True), (4, False)])
def test_conv_batchnorm_folds_exactly(group: int, bias: bool) -> None:
    rng = np.random.default_rng(group)
    model = _conv_bn(rng, group=group, bias=bias)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    before = _run(model, x)
    folds = fold_batch_norms(model)
    assert [f.describe() for f in folds] == ["bn into conv"]
    assert [n.op_type for n in model.graph.node] == ["Conv"]
    assert {i.name for i in model.graph.initializer} == {"w::folded", "conv::folded_bias"}
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)


def test_conv_transpose_with_bias_add_folds_exactly() -> None:
    """DB's head: ConvTranspose, an Add of a per-channel bias (Reshape of a vector),
    BatchNorm -- PP-OCRv4's detector exports this."""
    rng = np.random.default_rng(7)
    group = 2
    w = rng.standard_normal((4, 3, 2, 2)) * 0.3  # [C_in, C_out / group, k, k]: C_out = 6
    names = ["gamma", "beta", "mean", "var"]
    inits = [_init("w", w), _init("bias", rng.standard_normal(6))]
    inits += [_init(n, p) for n, p in zip(names, _bn_params(rng, 6))]
    shape = numpy_helper.from_array(np.array([1, 6, 1, 1], np.int64), "shape")
    nodes = [
        helper.make_node("Constant", [], ["shape"], name="shape_const", value=shape),
        helper.make_node("Reshape", ["bias", "shape"], ["bias4"], name="reshape"),
        helper.make_node(
            "ConvTranspose", ["x", "w"], ["c"], name="deconv", strides=[2, 2], group=group
        ),
        helper.make_node("Add", ["c", "bias4"], ["a"], name="add"),
        helper.make_node("BatchNormalization", ["a", *names], ["y"], name="bn"),
    ]
    model = _model(nodes, inits, [1, 6, 10, 10], [1, 4, 5, 5])
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    before = _run(model, x)
    assert [f.describe() for f in fold_batch_norms(model)] == ["add+bn into deconv"]
    assert [n.op_type for n in model.graph.node] == ["ConvTranspose"]
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)


def test_what_is_not_a_constant_or_not_alone_is_not_folded() -> None:
    rng = np.random.default_rng(3)
    # a synced weight (excluded): the fold would go stale on a later write
    model = _conv_bn(rng)
    assert fold_batch_norms(model, excluded={"var"}) == []
    # the conv's result read twice: it cannot become the BatchNorm's
    model = _conv_bn(rng)
    model.graph.node.append(helper.make_node("Relu", ["c"], ["r"], name="other"))
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    assert fold_batch_norms(model) == []
    # a weight without data (the session supplies it): not a constant
    model = _conv_bn(rng)
    w = next(i for i in model.graph.initializer if i.name == "w")
    w.ClearField("raw_data")
    w.ClearField("float_data")
    assert fold_batch_norms(model) == []


def test_trained_variance_is_folded_and_fp16_keeps_the_answer() -> None:
    """Variances near 1e8 (PP-OCRv4 det's first BatchNorm reaches 9.8e7): float16
    cannot hold them (a clamp to 1e4 changed the answer entirely); folded in float32
    first, the float16 graph matches float32 to float16's precision."""
    rng = np.random.default_rng(11)
    model = _conv_bn(rng, var_scale=1e8)
    x = (rng.standard_normal((2, 4, 6, 6)) * 3e3).astype(np.float32)
    ref = _run(model, x)
    report = fp16_pass.prepare(model)
    assert report.folded == ("bn into conv",) and report.kept_float32 == ()
    for convert in (fp16_pass.convert_storage, fp16_pass.convert_proto):
        half = convert(onnx.ModelProto.FromString(model.SerializeToString()), report.kept_names)
        err = np.abs(_run(half, x) - ref).max() / np.abs(ref).max()
        assert err < 2e-3, (convert.__name__, err)


def test_what_does_not_fit_stays_float32_and_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    """Not folded (the variance is a synced weight): the variance and an epsilon that
    float16 would round to zero stay float32, named in the report and the log; the
    rest is float16; both conversions give the float32 answer."""
    rng = np.random.default_rng(5)
    model = _conv_bn(rng, var_scale=1e8)
    eps = numpy_helper.from_array(np.array([1e-9], np.float32), "eps_value")
    model.graph.node.append(helper.make_node("Constant", [], ["eps"], name="eps", value=eps))
    model.graph.node.append(helper.make_node("Add", ["y", "eps"], ["z"], name="add_eps"))
    model.graph.output[0].name = "z"
    var = next(i for i in model.graph.initializer if i.name == "var")
    weights = {"var": numpy_helper.to_array(var)}
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    ref = _run(model, x)
    with caplog.at_level(logging.INFO, logger="paddle_ipu"):
        report = fp16_pass.prepare(model, weights)
        report.log()
    assert report.folded == ()
    assert [(t.name, t.reason) for t in report.kept_float32] == [
        ("eps", "underflow"),
        ("var", "overflow"),
    ]
    assert report.kept_float32[1].largest == pytest.approx(float(weights["var"].max()))
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "var (|value| up to" in warning[0] and "eps" in warning[0]
    storage = fp16_pass.convert_storage(
        onnx.ModelProto.FromString(model.SerializeToString()), report.kept_names
    )
    types = {i.name: i.data_type for i in storage.graph.initializer}
    assert types["var"] == TensorProto.FLOAT and types["w"] == TensorProto.FLOAT16
    arithmetic = fp16_pass.convert_proto(
        onnx.ModelProto.FromString(model.SerializeToString()), report.kept_names
    )
    types = {i.name: i.data_type for i in arithmetic.graph.initializer}
    assert types["var"] == TensorProto.FLOAT and types["w"] == TensorProto.FLOAT16
    for half in (storage, arithmetic):
        err = np.abs(_run(half, x) - ref).max() / np.abs(ref).max()
        assert err < 5e-3, err


def test_values_round_over_float16s_whole_range() -> None:
    """1e4 < |v| <= 65504 is float16's range: rounded, not clamped to 1e4; values
    below 1e-7 round to nearest (onnxconverter-common lifted them to 1e-7)."""
    values = np.array([3e4, -6.5e4, 65504.0, 2e-8, 1e-6, 0.0], np.float32)
    model = _model(
        [helper.make_node("Add", ["x", "c"], ["y"], name="add")],
        [_init("c", values)],
        [6],
        [6],
    )
    report = fp16_pass.prepare(model)
    assert report.kept_float32 == ()
    half = fp16_pass.convert_storage(model, report.kept_names)
    stored = numpy_helper.to_array(next(i for i in half.graph.initializer if i.name == "c"))
    np.testing.assert_array_equal(stored, values.astype(np.float16))
    assert stored[0] == np.float16(3e4) and stored[3] == 0.0


def test_training_refuses_a_weight_float16_cannot_hold() -> None:
    rng = np.random.default_rng(2)
    model = _conv_bn(rng, var_scale=1e8)
    with pytest.raises(NotSupportedError, match=r"enable_fp16 in training: var \(\|value\| up to"):
        fp16_pass.prepare(model, training=True)
    # what fits trains in fp16 as before, nothing folded
    model = _conv_bn(rng)
    assert fp16_pass.prepare(model, training=True) == fp16_pass.Fp16Report()


def _scalar(name: str, value: float) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.array([value], np.float32), f"{name}_value")
    return helper.make_node("Constant", [], [name], name=name, value=tensor)


def test_learnable_affine_chains_fold_on_both_sides() -> None:
    """PP-LCNetV3's blocks (PP-OCRv4 det and rec): Conv, bias Add, ``a * x + b``,
    hardswish, ``c * x + d``, then the next Conv.  The chain after the first Conv folds
    into it; ``c * x`` folds into any next Conv, ``+ d`` only into one without padding."""
    rng = np.random.default_rng(9)
    nodes, inits = [], [_init("bias", rng.standard_normal(8))]
    shape = numpy_helper.from_array(np.array([1, 8, 1, 1], np.int64), "shape")
    nodes.append(helper.make_node("Constant", [], ["shape"], name="shape", value=shape))
    nodes.append(helper.make_node("Reshape", ["bias", "shape"], ["bias4"], name="reshape"))
    for pads, second in (([1, 1, 1, 1], "padded"), ([0, 0, 0, 0], "pointwise")):
        nodes.clear()
        nodes += [
            helper.make_node("Constant", [], ["shape"], name="shape", value=shape),
            helper.make_node("Reshape", ["bias", "shape"], ["bias4"], name="reshape"),
            _scalar("a", 1.7),
            _scalar("b", -0.3),
            _scalar("c", 0.8),
            _scalar("d", 0.25),
            helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c1", "bias4"], ["t1"], name="add_bias"),
            helper.make_node("Mul", ["a", "t1"], ["t2"], name="scale_a"),
            helper.make_node("Add", ["t2", "b"], ["t3"], name="shift_b"),
            helper.make_node("HardSigmoid", ["t3"], ["hs"], name="hs", alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", ["hs", "t3"], ["t4"], name="hswish"),
            helper.make_node("Mul", ["c", "t4"], ["t5"], name="scale_c"),
            helper.make_node("Add", ["t5", "d"], ["t6"], name="shift_d"),
            helper.make_node("Conv", ["t6", "w2"], ["y"], name=f"conv2_{second}", pads=pads),
        ]
        k = 3 if second == "padded" else 1
        weights = [
            _init("w1", rng.standard_normal((8, 4, 3, 3)) * 0.3),
            _init("w2", rng.standard_normal((6, 8, k, k)) * 0.3),
        ]
        model = _model(nodes, inits + weights, [2, 6, 6, 6], [2, 4, 6, 6])
        x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
        before = _run(model, x)
        after = fold_into_convolutions(model)
        assert [f.describe() for f in after] == ["add_bias+scale_a+shift_b into conv1"]
        ahead = fold_scalars_before_convolutions(model)
        if second == "padded":  # + d would change the zero padding: left alone
            assert [f.describe() for f in ahead] == []
            assert [n.name for n in model.graph.node if n.op_type != "Constant"] == [
                "conv1", "hs", "hswish", "scale_c", "shift_d", "conv2_padded",
            ]  # fmt: skip
        else:
            assert [f.describe() for f in ahead] == ["shift_d+scale_c into conv2_pointwise"]
            assert [n.op_type for n in model.graph.node] == ["Conv", "HardSigmoid", "Mul", "Conv"]
        np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)


def test_a_scale_folds_into_a_padded_convolution_and_a_shift_does_not() -> None:
    rng = np.random.default_rng(4)
    nodes = [
        _scalar("c", -1.5),
        helper.make_node("Div", ["x", "c"], ["t"], name="div"),
        helper.make_node("Conv", ["t", "w"], ["y"], name="conv", pads=[1, 1, 1, 1], group=4),
    ]
    model = _model(
        nodes, [_init("w", rng.standard_normal((4, 1, 3, 3)))], [1, 4, 5, 5], [1, 4, 5, 5]
    )
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    before = _run(model, x)
    assert [f.describe() for f in fold_scalars_before_convolutions(model)] == ["div into conv"]
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-5, atol=1e-5)
    # c - x and a per-channel Mul before a convolution: not folded
    nodes = [
        _scalar("c", 2.0),
        helper.make_node("Sub", ["c", "x"], ["t"], name="sub"),
        helper.make_node("Conv", ["t", "w"], ["y"], name="conv", group=4),
    ]
    model = _model(
        nodes, [_init("w", rng.standard_normal((4, 1, 1, 1)))], [1, 4, 5, 5], [1, 4, 5, 5]
    )
    assert fold_scalars_before_convolutions(model) == []


@pytest.mark.parametrize(
    "values",
    [
        [1.0, -2.0, 3.0],
        [-70000.0, 3.0],  # the largest magnitude is negative
        [1e5, -np.inf],  # an inf is left out of the largest
        [np.nan, -7e4],
        [np.nan, np.inf],  # nothing finite
        [1e-9],  # a scalar that rounds to zero
        [1e-7],  # a scalar float16 holds (a subnormal)
        [1e-9, 0.0],  # rounding noise in a larger tensor
        [65504.0, -65504.0],  # float16's largest: fits
    ],
)
def test_out_of_range_is_the_largest_finite_magnitude(values: list[float]) -> None:
    # The check reads the extremes, and masks only a tensor with an inf or a nan: it
    # must answer as the largest finite |value| does.
    array = np.array(values, np.float32)
    finite = np.abs(array)[np.isfinite(array)]
    largest = float(finite.max()) if finite.size else None
    hit = fp16_pass.out_of_range("w", array)
    tiny = array.size == 1 and largest is not None and 0 < largest < fp16_pass.FLOAT16_TINY
    if largest is None or not (largest > fp16_pass.FLOAT16_MAX or tiny):
        assert hit is None
    else:
        assert hit is not None and hit.largest == largest
