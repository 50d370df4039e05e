"""Operators kept in float32 in a float16 graph (``fp16_black_list``; Paddle Inference's
``exp_disable_mixed_precision_ops``), against a numpy reference of the rule
(paddle_ipu/compiler/float32_ops.py): a listed operator computes in float32 from its
float16 operands and its float32 weights; its result reaches listed operators and graph
outputs unrounded, and every other operator rounded to float16.

The host backend runs the graph (both placements of its roundings); the graph the
popart backend hands PopART (the fp16 pass with the same list) runs on ONNX Runtime."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support import fp16_reference as ref

from paddle_ipu.backends import create_session
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler import float32_ops, fp16_pass
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import NotSupportedError, OptionError
from paddle_ipu.options.precision import op_key
from paddle_ipu.strategy import IpuStrategy

F = TensorProto.FLOAT
PLACEMENTS = {"optimised": {}, "every_operator": {"enable_floating_point_checks": True}}
ROWS, WIDTH = 8, 16
#: node -> the Paddle operator it was converted from, as the compiler records them
SOURCE_OPS = [
    "pd_op.matmul", "pd_op.sigmoid", "pd_op.exp", "pd_op.square", "pd_op.multiply", "pd_op.add"
]  # fmt: skip
NODE_OPS = {"mm": 0, "sig": 1, "exp": 2, "sq": 3, "scale": 4, "add": 5}
LISTED = ["sigmoid", "exp", "pd_op.multiply"]


def _model(rng: np.random.Generator) -> tuple[CompiledModel, dict[str, np.ndarray]]:
    """m = x @ W; s = sigmoid(m); e = exp(s); q = s * s; v = s * V; y = e + q."""
    weights = {
        "W": (rng.standard_normal((WIDTH, WIDTH)) / 4).astype(np.float32),
        # float32 values float16 cannot hold exactly
        "V": (1 + rng.random((1, WIDTH)) / 3).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Sigmoid", ["m"], ["s"], name="sig"),
        helper.make_node("Exp", ["s"], ["e"], name="exp"),
        helper.make_node("Mul", ["s", "s"], ["q"], name="sq"),
        helper.make_node("Mul", ["s", "V"], ["v"], name="scale"),
        helper.make_node("Add", ["e", "q"], ["y"], name="add"),
    ]
    shape = [ROWS, WIDTH]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, shape)],
        [helper.make_tensor_value_info(n, F, shape) for n in ("e", "v", "y")],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = CompiledModel(
        onnx=proto.SerializeToString(),
        inputs=[TensorSpec("x", "float32", (ROWS, WIDTH), "x")],
        outputs=[TensorSpec(n, "float32", (ROWS, WIDTH), n) for n in ("e", "v", "y")],
        weights={n: n for n in weights},
        source_ops=list(SOURCE_OPS),
        node_ops=dict(NODE_OPS),
    )
    return model, weights


def _host(model: CompiledModel, x: np.ndarray, options: Mapping[str, Any]) -> dict[str, Any]:
    config = SessionConfig(enable_fp16=True, num_threads=1, options=dict(options))
    session = create_session("host", model, config)
    session.prepare_device()
    out = session.run({"x": x})
    return {n: np.asarray(out[n]) for n in ("e", "v", "y")}


def _reference(x: np.ndarray, w: Mapping[str, np.ndarray], listed: bool) -> dict[str, Any]:
    """The rule in numpy (float64 where the graph computes in float32)."""
    m = ref.matmul(ref.r(x), ref.r(w["W"]))
    s = 1 / (1 + np.exp(-m.astype(np.float64)))
    if not listed:
        s = ref.r(s)
        e = ref.r(np.exp(s))
        v = ref.r(s * ref.r(w["V"]))
        return {"e": e, "v": v, "y": ref.r(e + ref.r(s * s))}
    e = np.exp(s)  # listed reads listed: float32
    v = s * w["V"].astype(np.float64)  # its weight float32
    q = ref.r(ref.r(s) * ref.r(s))  # an unlisted reader: rounded
    return {"e": e, "v": v, "y": ref.r(ref.r(e) + q)}


def _is_half(a: np.ndarray) -> bool:
    return bool(np.all(a.astype(np.float16).astype(np.float32) == a))


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_listed_operators_compute_in_float32_on_the_host(placement: str) -> None:
    rng = np.random.default_rng(0)
    model, weights = _model(rng)
    x = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    got = _host(model, x, {"fp16_black_list": LISTED, **PLACEMENTS[placement]})
    want = _reference(x, weights, listed=True)
    for name in ("e", "v"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)
        assert not _is_half(got[name]), f"{name} was rounded to float16"
    np.testing.assert_array_equal(got["y"], want["y"].astype(np.float32))
    # the same graph without the list: every result is a float16 value
    plain = _host(model, x, dict(PLACEMENTS[placement]))
    want = _reference(x, weights, listed=False)
    for name in ("e", "v", "y"):
        assert _is_half(plain[name]), name
        np.testing.assert_array_equal(plain[name], want[name].astype(np.float32), err_msg=name)


def test_the_popart_graph_keeps_the_same_operators_in_float32() -> None:
    """What the popart backend hands PopART (the fp16 pass with the list), read and run
    on ONNX Runtime: the listed nodes read float32 (the sigmoid's result reaches exp and
    the weighted multiply without a cast), their weight stays float32, their graph
    outputs are float32 and unrounded, and the answer is the rule's (numpy reference)."""
    import onnxruntime as ort

    rng = np.random.default_rng(1)
    model, weights = _model(rng)
    x = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    nodes = float32_ops.float32_nodes(model.node_ops, model.source_ops, LISTED)
    assert nodes == {"sig", "exp", "scale"}
    graph = onnx.load_from_string(fp16_pass.convert_model(model.onnx, float32=nodes))
    by_name = {n.name: n for n in graph.graph.node}
    assert by_name["exp"].input[0] == by_name["sig"].output[0]
    assert by_name["scale"].input[0] == by_name["sig"].output[0]
    inits = {i.name: i.data_type for i in graph.graph.initializer}
    assert inits["V"] == TensorProto.FLOAT and inits["W"] == TensorProto.FLOAT16
    assert {o.name: o.type.tensor_type.elem_type for o in graph.graph.output} == dict.fromkeys(
        ("e", "v", "y"), TensorProto.FLOAT
    )
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    e, v, y = session.run(["e", "v", "y"], {"x": x})
    assert not _is_half(e) and not _is_half(v)
    want = _reference(x, weights, listed=True)
    # ONNX Runtime's float16 MatMul rounds as it goes: within a float16 step
    for name, value in (("e", e), ("v", v), ("y", y)):
        np.testing.assert_allclose(value, want[name], rtol=2e-3, err_msg=name)


def test_names_are_paddles_in_any_of_its_spellings() -> None:
    assert op_key("pd_op.softmax") == op_key("softmax") == "softmax"
    assert op_key("relu_") == "relu" and op_key("elementwise_add") == "add"
    assert op_key("matmul_v2") == "matmul" and op_key("hard_swish") == "hardswish"
    strategy = IpuStrategy()
    strategy.set_options({"fp16_black_list": ["pd_op.softmax", "elementwise_add"]})
    strategy.set_options({"fp16_black_list": ["softmax", "sigmoid"]})
    assert strategy.get_option("fp16_black_list") == ["softmax", "add", "sigmoid"]
    with pytest.raises(OptionError, match=r"fp16_black_list.*got 3"):
        strategy.set_options({"fp16_black_list": [3]})


def test_an_operator_the_model_lacks_is_said_and_training_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="paddle_ipu"):
        nodes = float32_ops.float32_nodes(NODE_OPS, SOURCE_OPS, ["softmax", "exp"])
    assert nodes == {"exp"}
    assert "no operator 'softmax' in this model" in caplog.text
    assert "sigmoid" in caplog.text  # the operators it has
    model, _ = _model(np.random.default_rng(2))
    config = SessionConfig(enable_fp16=True, is_training=True, options={"fp16_black_list": ["exp"]})
    with pytest.raises(NotSupportedError, match=r"fp16_black_list \['exp'\] in training"):
        float32_ops.for_session(model, config)
    # without float16 the list changes nothing
    fp32 = SessionConfig(options={"fp16_black_list": ["exp"]})
    assert float32_ops.for_session(model, fp32) == set()


def test_a_model_without_its_operator_map_is_refused_by_name() -> None:
    with pytest.raises(NotSupportedError, match="compile the model again"):
        float32_ops.float32_nodes({}, [], ["exp"])


def _saved_classifier(directory: Any) -> str:
    """A saved inference model: softmax(fc(x)), its weights trained-looking enough that
    the probabilities are not float16 values."""
    import paddle

    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 12], "float32")
            y = paddle.nn.functional.softmax(paddle.static.nn.fc(x, 10))
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            prefix = str(directory / "clf")
            paddle.static.save_inference_model(prefix, [x], [y], exe, program=main)
    finally:
        paddle.disable_static()
    return prefix


def test_exp_disable_mixed_precision_ops_on_both_configs_and_a_saved_package(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paddle Inference's call, on paddle_ipu.inference.Config and on stock Paddle's
    Config given enable_ipu(): the softmax the model ends with computes in float32 (its
    probabilities are not float16 values, and match the CPU closer than float16 can),
    from a fresh compile and from the compile cache's package (which keeps the
    operator of every node)."""
    import paddle
    import paddle.inference as paddle_inference

    from paddle_ipu import inference

    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    prefix = _saved_classifier(tmp_path)
    feed = np.random.default_rng(3).standard_normal((4, 12)).astype(np.float32)
    cpu = paddle_inference.create_predictor(
        paddle_inference.Config(prefix + ".json", prefix + ".pdiparams")
    )
    (want,) = cpu.run([paddle.to_tensor(feed)])
    want = want.numpy()

    def run(config: Any, listed: bool) -> np.ndarray:
        config.enable_ipu()
        config.set_ipu_config(ipu_enable_fp16=True)
        if listed:
            config.exp_disable_mixed_precision_ops({"softmax"})
        predictor = (
            inference.create_predictor(config)
            if isinstance(config, inference.Config)
            else paddle_inference.create_predictor(config)
        )
        name = predictor.get_input_names()[0]
        predictor.get_input_handle(name).copy_from_cpu(feed)
        predictor.run()
        return np.asarray(
            predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
        )

    import paddle_ipu  # noqa: F401  (stock Config's enable_ipu)

    plain = run(inference.Config(prefix + ".json", prefix + ".pdiparams"), listed=False)
    assert _is_half(plain)
    for make in (inference.Config, paddle_inference.Config):
        for _ in range(2):  # compiled, then from the compile cache
            got = run(make(prefix + ".json", prefix + ".pdiparams"), listed=True)
            assert not _is_half(got), make
            # the softmax's own error is float32's; the fc before it is float16's
            np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-3)
    with pytest.raises(OptionError, match="expected a set of operator names"):
        inference.Config().exp_disable_mixed_precision_ops("softmax")


def test_paddle_amp_black_list_on_a_pir_program_is_said_not_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Paddle 2.x's ``cast_model_to_fp16(program, amp_lists)`` on a PIR program marks it
    float16 whole: a black list beyond Paddle's default is said, with the option that
    keeps operators in float32; the default lists (every Paddle 2.x op test passes
    them) say nothing."""
    import paddle

    import paddle_ipu  # noqa: F401  (Paddle 2.x's fp16 flow on PIR programs)

    paddle.enable_static()
    try:
        main = paddle.static.Program()
        with paddle.static.program_guard(main):
            paddle.nn.functional.relu(paddle.static.data("x", [2, 3]))
        with caplog.at_level(logging.WARNING, logger="paddle_ipu"):
            lists = paddle.static.amp.CustomOpLists(custom_black_list=["relu"])
            paddle.static.amp.cast_model_to_fp16(main, lists, use_fp16_guard=False)
            paddle.static.amp.cast_model_to_fp16(
                main, paddle.static.amp.CustomOpLists(), use_fp16_guard=False
            )
    finally:
        paddle.disable_static()
    said = [r.getMessage() for r in caplog.records if "cast_model_to_fp16" in r.getMessage()]
    assert len(said) == 1 and "['relu'] is not applied" in said[0] and "fp16_black_list" in said[0]


def test_a_package_compiled_with_a_black_list_keeps_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``paddle-ipu compile --fp16 --fp16-black-list softmax``: the package's executors
    (``paddle-ipu run``, ``serve``) keep the softmax in float32; the list without
    ``--fp16`` is refused by name."""
    from paddle_ipu import cli
    from paddle_ipu.serving.package import load_package

    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    prefix = _saved_classifier(tmp_path)
    np.save(tmp_path / "x.npy", np.random.default_rng(4).standard_normal((3, 12)).astype("f4"))
    outputs = {}
    for name, extra in (("plain", []), ("listed", ["--fp16-black-list", "pd_op.softmax"])):
        package = str(tmp_path / f"{name}.pdipu")
        assert cli.main(["compile", prefix, "-o", package, "--fp16", *extra]) == 0
        run = ["run", package, "--input", f"x={tmp_path / 'x.npy'}"]
        assert cli.main([*run, "--output-dir", str(tmp_path / name)]) == 0
        (outputs[name],) = [np.load(p) for p in (tmp_path / name).glob("*.npy")]
    assert _is_half(outputs["plain"]) and not _is_half(outputs["listed"])
    assert load_package(tmp_path / "listed.pdipu").options["fp16_black_list"] == ["softmax"]
    capsys.readouterr()
    refused = ["compile", prefix, "-o", str(tmp_path / "x.pdipu"), "--fp16-black-list", "exp"]
    assert cli.main(refused) != 0
    assert "compile with enable_fp16 (--fp16)" in capsys.readouterr().err


def test_the_memory_report_counts_the_listed_operators_weights_in_float32() -> None:
    """Whether a model fits: the weights a listed operator reads take float32's bytes."""
    from paddle_ipu.compiler.memory import memory_report

    model, weights = _model(np.random.default_rng(5))
    base = {"enable_fp16": True, "is_training": False}

    def weight_bytes(options: dict[str, Any]) -> int:
        (ipu,) = memory_report(model, options).ipus
        return next(part.bytes for part in ipu.parts if part.name == "weights")

    half = sum(a.size * 2 for a in weights.values())
    assert weight_bytes(base) == half
    listed = {**base, "fp16_black_list": ["multiply"]}
    assert weight_bytes(listed) == half + weights["V"].size * 2
    assert weight_bytes({**listed, "enable_fp16": False}) == 2 * half
