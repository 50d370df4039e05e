"""The popart adapter against the PopART double (tests/contract/popart_double), one
test per defect of the adapter found by reading PopART 3.x's sources.  The double
follows the bindings (popart.cpp) and session.py/session.cpp; the numbers of
inference runs are checked against the host backend in test_session_contract.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_session_contract import IN, MB, OUT, affine_model

import paddle_ipu
import paddle_ipu.backends.popart.options as popart_options_module
import paddle_ipu.backends.popart.session as adapter
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.optimizer import OptimizerConfig, ParamSlot
from paddle_ipu.errors import NotSupportedError, OptionError

DOUBLE_DIR = Path(__file__).parent / "popart_double"
ROOT = Path(paddle_ipu.__file__).resolve().parent.parent
B1 = 0.9


def training_model(kind: str = "adam") -> CompiledModel:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [MB, IN])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
        helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0),
    ]
    inits = [
        numpy_helper.from_array(np.ones((IN, OUT), np.float32), "w"),
        numpy_helper.from_array(np.zeros(OUT, np.float32), "b"),
    ]
    graph = helper.make_graph(nodes, "train", [x], [loss], initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opt = OptimizerConfig(
        type=kind, params=(ParamSlot("w"), ParamSlot("b")), lr=0.1, beta1=B1, momentum=0.9
    )
    return CompiledModel(
        onnx=proto.SerializeToString(),
        inputs=[TensorSpec("x", "float32", (MB, IN), "x")],
        outputs=[TensorSpec("loss", "float32", (), "loss")],
        weights={"w": "w", "b": "b"},
        micro_batch_size=MB,
        loss="loss",
        optimizer=opt,
        opset=13,
    )


def _run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{DOUBLE_DIR}"}
    # Not from the checkout: ``python -c`` puts the working directory first on sys.path,
    # where the source tree (without the compiled core) would shadow the package.
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tempfile.gettempdir(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


# 1. import order ------------------------------------------------------------------


@pytest.mark.slow
def test_popart_is_imported_before_onnx() -> None:
    check = "from paddle_ipu.backends import availability; print(availability('popart'))"
    # paddle_ipu loads popart first, so the compiler's onnx import does not block it
    assert _run_python(f"import paddle_ipu, onnx\n{check}").startswith("(True, 'popart 3.4")
    # onnx first: the SDK refuses, and the reason says what to do
    out = _run_python(f"import onnx, paddle_ipu\n{check}")
    assert out.startswith("(False") and "import paddle_ipu, or popart, before onnx" in out


# 2. options in their bound types ---------------------------------------------------


def test_the_double_refuses_what_pybind11_refuses(popart_double: ModuleType) -> None:
    opts = popart_double.SessionOptions()
    with pytest.raises(TypeError):
        opts.virtualGraphMode = 1  # an int for an enum
    with pytest.raises(TypeError):
        opts.hardwareInstrumentations = [popart_double.Instrumentation.Inner]  # a list
    with pytest.raises(TypeError):
        opts.weightTensorLocationSettings = {"minElementsForOffChip": 3}  # a dict
    with pytest.raises(AttributeError):
        opts.enableSerializedMatmuls = True  # no binding in 3.x
    with pytest.raises(AttributeError):
        setattr(opts, "batchSerializationSettings.factor", 2)


def test_every_strategy_option_reaches_the_bindings(popart_double: ModuleType) -> None:
    strategy = paddle_ipu.IpuStrategy()
    opts = popart_double.SessionOptions()
    passed = popart_options_module.popart_options(
        strategy.values(), strategy.explicit_options(), include_defaults=True
    )
    assert len(passed) > 90
    for name, value in passed.items():
        popart_options_module.set_session_option(popart_double, opts, name, value)
    # spot checks of the translations
    assert opts.accumulationAndReplicationReductionType == popart_double.ReductionType.Mean
    assert opts.hardwareInstrumentations == {popart_double.Instrumentation.Outer}
    loc = opts.optimizerStateTensorLocationSettings
    assert loc.location.storage == popart_double.TensorStorage.OffChip
    assert loc.location.replicatedTensorSharding == popart_double.ReplicatedTensorSharding.On


def test_option_values_are_translated_or_refused_by_name(popart_double: ModuleType) -> None:
    p = popart_double
    opts = p.SessionOptions()
    popart_options_module.set_session_option(p, opts, "batchSerializationSettings.factor", 4)
    popart_options_module.set_session_option(
        p, opts, "autoRecomputation", 0
    )  # C++ None -> NoRecompute
    popart_options_module.set_session_option(p, opts, "mergeVarUpdate", "None")  # bound as Off
    popart_options_module.set_session_option(p, opts, "hardwareInstrumentations", [0, 1])
    popart_options_module.set_session_option(p, opts, "numIOTiles", 32)
    popart_options_module.set_session_option(p, opts, "engineOptions", {"debug.instrument": True})
    assert opts.batchSerializationSettings.factor == 4
    assert opts.autoRecomputation == p.RecomputationType.NoRecompute
    assert opts.mergeVarUpdate == p.MergeVarUpdateType.Off
    assert opts.hardwareInstrumentations == {p.Instrumentation.Outer, p.Instrumentation.Inner}
    assert opts.numIOTiles.n == 32
    assert opts.engineOptions == {"debug.instrument": "true"}
    with pytest.raises(NotSupportedError, match="enableSerializedMatmuls"):
        popart_options_module.set_session_option(p, opts, "enableSerializedMatmuls", False)
    popart_options_module.set_session_option(
        p, opts, "enableSerializedMatmuls", True
    )  # the default: skipped
    with pytest.raises(OptionError, match=r"virtualGraphMode.*7"):
        popart_options_module.set_session_option(p, opts, "virtualGraphMode", 7)
    with pytest.raises(OptionError, match=r"batchSerializationSettings\.nope"):
        popart_options_module.set_session_option(p, opts, "batchSerializationSettings.nope", 1)


# 3-5. has_info, constantWeights, export ----------------------------------------------


def test_tensor_lookup_without_has_info_and_weights_load(popart_double: ModuleType) -> None:
    assert not hasattr(popart_double.InferenceSession, "hasInfo")
    session = adapter.create_session(affine_model(), SessionConfig())
    session.prepare_device()
    assert session.has_info("w") and not session.has_info("nope")
    assert session._session._opts.constantWeights is False
    session.write_weights({"b": np.ones(OUT, np.float32)})  # would raise with constantWeights
    np.testing.assert_array_equal(session.read_weights(["b"])["b"], np.ones(OUT, np.float32))
    session.close()
    session = adapter.create_session(
        affine_model(), SessionConfig(extras={"session_options": {"constantWeights": True}})
    )
    session.prepare_device()
    with pytest.raises(OptionError, match="constantWeights"):
        session.write_weights({"b": np.ones(OUT, np.float32)})


def test_compile_only_exports_a_bare_file_name_even_with_the_ipu_model(
    popart_double: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IPU_COMPILE_ONLY", "1")  # POPLAR_IPUMODEL=1 is set too
    session = adapter.create_session(affine_model(), SessionConfig())
    session.compile_and_export("model.popef")
    assert (tmp_path / "model.popef").read_bytes().startswith(b"POPEF-double")
    assert session._device.type == popart_double.DeviceType.OfflineIpu


# 6. optimizer state ------------------------------------------------------------------


def test_adam_step_count_round_trips_as_beta1_pow(popart_double: ModuleType) -> None:
    cfg = SessionConfig(is_training=True)
    session = adapter.create_session(training_model(), cfg)
    session.prepare_device()
    assert session.get_info("Step___w").shape == ()
    pow_after_two_updates = np.array([B1**3], np.float32)  # Paddle: beta1**(k+1)
    session.write_weights({"Step___w": pow_after_two_updates})
    raw = session.snapshot()["Step___w"]
    assert raw.shape == () and raw == pytest.approx(2.0, abs=1e-5)  # PopART: k
    np.testing.assert_allclose(session.read_weights(["Step___w"])["Step___w"],
                               pow_after_two_updates, rtol=1e-6)  # fmt: skip
    session.run({"x": np.ones((MB, IN), np.float32)})  # the device counts one step
    np.testing.assert_allclose(session.read_weights(["Step___w"])["Step___w"],
                               [B1**4], rtol=1e-6)  # fmt: skip


def test_eval_runs_leave_every_state_tensor_alone(popart_double: ModuleType) -> None:
    session = adapter.create_session(training_model(), SessionConfig(is_training=True))
    session.prepare_device()
    before = session.snapshot()
    session.set_eval(True)
    session.run({"x": np.ones((MB, IN), np.float32)})
    after = session.snapshot()
    assert sorted(after) == sorted(before) and "Step___w" in after
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    session.set_eval(False)
    session.run({"x": np.ones((MB, IN), np.float32)})
    assert session.snapshot()["Step___w"] == 1.0


def test_sgd_momentum_keeps_paddles_velocity_in_accl1(popart_double: ModuleType) -> None:
    session = adapter.create_session(training_model("momentum"), SessionConfig(is_training=True))
    session.prepare_device()
    opt = session._session.optimizer
    assert opt.accumulatorAndMomentum == popart_double.SGDAccumulatorAndMomentum.Separate
    assert "Accl1___w" in session.weight_names() and "Accl___w" not in session.weight_names()


# 7. strategy options that reach the SDK -------------------------------------------------


def test_strategy_options_reach_the_sdk(popart_double: ModuleType) -> None:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(num_ipus=2)
    s.set_options({"tiles_per_ipu": 64, "max_weight_norm": 100.0,
                   "scaled_optimizer_state": True, "use_no_bias_optimizer": True})  # fmt: skip
    s.enable_pattern("TiedGather")
    cfg = SessionConfig(
        is_training=True, options=s.values(), explicit=s.explicit_options(), patterns=s.patterns
    )
    session = adapter.create_session(training_model("lamb"), cfg)
    session.prepare_device()
    device, sdk_session = session._device, session._session
    assert (device.numIpus, device.tilesPerIPU) == (2, 64)
    assert sdk_session._patterns.enabled == {"TiedGather": True}
    opt = sdk_session.optimizer
    assert opt.max_weight_norm == 100.0 and opt.scaled_optimizer_state is True
    assert opt.mode == popart_double.AdamMode.LambNoBias
    assert "Step___w" not in session.weight_names()  # no bias correction, no step count


def test_lamb_trust_ratio_is_not_clipped_at_popart_default(popart_double: ModuleType) -> None:
    """Paddle's lamb kernel does not bound the weight norm of its trust ratio; PopART's
    Lamb bounds it by defaultMaxWeightNorm, 10 when unset (adam.hpp): the adapter must
    lift that bound unless max_weight_norm is set."""
    session = adapter.create_session(training_model("lamb"), SessionConfig(is_training=True))
    session.prepare_device()
    opt = session._session.optimizer
    assert opt.mode == popart_double.AdamMode.Lamb
    assert opt.max_weight_norm >= 3.0e38  # float32 max: no bound, as in Paddle


def test_fp16_pass_reaches_popart(popart_double: ModuleType) -> None:
    session = adapter.create_session(affine_model(), SessionConfig(enable_fp16=True))
    session.prepare_device()
    assert session.get_info("w").dtype == "float16"
    assert session.get_info("x").dtype == "float32"  # inputs stay float32 (keep_io_types)


def test_fp16_black_list_reaches_popart(popart_double: ModuleType) -> None:
    """The listed operator's weight stays float32 in the graph PopART is given (the
    fp16 pass with the list); the others are float16."""
    model = affine_model()
    proto = __import__("onnx").load_from_string(model.onnx)
    for node, name in zip(proto.graph.node, ("mm", "add")):
        node.name = name
    model.onnx = proto.SerializeToString()
    model.source_ops, model.node_ops = ["pd_op.matmul", "pd_op.add"], {"mm": 0, "add": 1}
    config = SessionConfig(enable_fp16=True, options={"fp16_black_list": ["elementwise_add"]})
    session = adapter.create_session(model, config)
    session.prepare_device()
    assert session.get_info("w").dtype == "float16"
    assert session.get_info("b").dtype == "float32"
    assert session.get_info("y").dtype == "float32"


# The whole stack (compiler, executor, adapter) over the double ---------------------------


@pytest.mark.slow
def test_executor_on_the_double_keeps_paddles_beta1_pow(
    popart_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adam through IpuCompiledProgram on the popart backend: the first loss is the
    forward pass Paddle's CPU executor computes, and after weights_to_host the scope's
    beta1_pow is what Paddle's own kernel leaves after as many steps (the double counts
    steps on Step___; it does not update weights, so only the first loss compares)."""
    # The training models and Paddle's CPU reference live with the conformance tier.
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "conformance"))
    from test_training import MBS, P, build_mlp, mlp_batches, run_ipu, train_cpu

    steps = 3
    batches = mlp_batches(steps, seed=4)
    net = build_mlp(lambda: P.Adam(0.01))
    st = paddle_ipu.IpuStrategy()
    st.set_graph_config(num_ipus=1, is_training=True, micro_batch_size=MBS)
    st.set_options({"backend": "popart"})
    cp = paddle_ipu.IpuCompiledProgram(net.main, scope=net.scope, ipu_strategy=st)
    prog = cp.compile(net.feeds, [net.loss])
    losses = [float(run_ipu(net, prog, b)) for b in batches]
    cp.weights_to_host()

    cpu = build_mlp(lambda: P.Adam(0.01))
    cpu_losses = train_cpu(cpu, batches)
    assert losses[0] == pytest.approx(float(cpu_losses[0]), rel=1e-5)
    pows = [n for n in net.persistable_names() if "beta1_pow" in n or "beta2_pow" in n]
    assert any("beta2_pow" in n for n in pows)
    for name in pows:
        # beta2_pow has no device tensor: it follows the step count too.
        np.testing.assert_allclose(net.array(name), cpu.array(name), rtol=1e-6, err_msg=name)


# Loops: PopART takes a Loop's trip count M as a constant (willow/src/op/loop.cpp) ---------


def _loop_program(bounded: bool) -> tuple[Any, Any]:
    """A loop whose trip count the data decides: a state updated until its mean passes
    a limit fed at run time -- at most 12 steps when ``bounded`` (a counter in the
    condition), else with nothing but the data to end it."""
    import paddle

    from paddle_ipu.compiler import compile_program

    paddle.enable_static()
    paddle.seed(3)
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [2, 4], "float32")
        limit = paddle.static.data("limit", [1], "float32")
        w = paddle.create_parameter([4, 4], "float32")
        steps = paddle.full([1], 12, "int64")

        def cond(i: Any, h: Any) -> Any:
            below = paddle.mean(h).reshape([1]) < limit
            return paddle.logical_and(i < steps, below) if bounded else below

        def body(i: Any, h: Any) -> list[Any]:
            return [i + 1, paddle.tanh(paddle.matmul(h, w)) + x]

        _, h = paddle.static.nn.while_loop(cond, body, [paddle.zeros([1], "int64"), x])
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        model = compile_program(main, ["x", "limit"], [h], scope=scope)
    return model, h


def test_a_bounded_loop_runs_on_the_double_as_on_the_host(popart_double: ModuleType) -> None:
    """The compiler gives the Loop the trip count its condition bounds (12); PopART's
    Repeat of 12 iterations, each skipped once the condition is false, gives the
    host's results whatever number of iterations the data asks for."""
    import onnx

    from paddle_ipu.backends import create_session

    model, _ = _loop_program(bounded=True)
    graph = onnx.load_from_string(model.onnx).graph
    (loop,) = [n for n in graph.node if n.op_type == "Loop"]
    trip = next(n for n in graph.node if n.output and n.output[0] == loop.input[0])
    assert numpy_helper.to_array(trip.attribute[0].t) == 12
    host = create_session("host", model, SessionConfig())
    host.prepare_device()
    double = adapter.create_session(model, SessionConfig())
    double.prepare_device()
    x = np.random.default_rng(0).random((2, 4), dtype=np.float32)
    for limit in (0.2, 1.1, 5.0):  # 1 step, a few, all 12
        feed = {"x": x, "limit": np.float32([limit])}
        want = host.run(feed)
        got = double.run(feed)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_a_loop_without_a_bound_is_refused_by_name(popart_double: ModuleType) -> None:
    """No counter in the condition: the compiled Loop keeps no trip count, the adapter
    refuses it naming the Loop, and PopART's importer (the double's) refuses such a
    graph given to it directly."""
    model, _ = _loop_program(bounded=False)
    with pytest.raises(NotSupportedError, match=r"Loop\(s\) \['Loop\.0'\] have no trip count"):
        adapter.create_session(model, SessionConfig()).prepare_device()
    with pytest.raises(popart_double.popart_exception, match="TensorId ''"):
        popart_double.InferenceSession(
            fnModel=model.onnx,
            dataFlow=popart_double.DataFlow(1, {}),
            deviceInfo=popart_double.DeviceManager().createIpuModelDevice({}),
            userOptions=popart_double.SessionOptions(),
        )


def test_a_bigru_crf_over_padded_sequences_runs_on_the_double_as_on_the_host(
    popart_double: ModuleType,
) -> None:
    """Paddle 1.x's gru (forward and reverse) and crf_decoding over two sequences padded
    into a batch (a LoD layout, frontends/lod_runner.py): the GRUs reach PopART in the
    form its importer takes -- forward, no activations attribute, no sequence_lens, a
    reverse one reading each sequence backwards within its length (gru.cpp, grux.cpp)
    -- and give the host backend's outputs."""
    import paddle

    from paddle_ipu.backends import create_session
    from paddle_ipu.compiler import compile_program
    from paddle_ipu.compiler.sequence_rewrites import LENGTHS_FEED, LodLayout

    paddle.enable_static()
    paddle.seed(5)
    d, tags, count, steps = 4, 5, 2, 8
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 6], "float32")

        def param(*shape: int) -> Any:
            return paddle.create_parameter(list(shape), "float32")

        hidden = [
            paddle._C_ops.gru(paddle.matmul(x, param(6, 3 * d)) + param(3 * d), None,
                              param(d, 3 * d), param(1, 3 * d), "tanh", "sigmoid",
                              reverse, False, True)
            for reverse in (False, True)
        ]  # fmt: skip
        emission = paddle.matmul(paddle.concat(hidden, axis=1), param(2 * d, tags))
        path = paddle._C_ops.crf_decoding(emission, param(tags + 2, tags), None, None)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        model = compile_program(
            main, ["x"], [path, emission], scope=scope, micro_batch_size=count * steps,
            lod=LodLayout(count, ("x",)),
        )  # fmt: skip
    import onnx

    grus = [n for n in onnx.load_from_string(model.onnx).graph.node if n.op_type == "GRU"]
    assert len(grus) == 2
    for node in grus:
        assert {a.name for a in node.attribute} <= {"hidden_size", "linear_before_reset",
                                                    "direction"}  # fmt: skip
        assert len(node.input) <= 4 or not node.input[4]
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((count * steps, 6)).astype(np.float32),
            LENGTHS_FEED: np.array([5, 8], np.int64)}  # fmt: skip
    host = create_session("host", model, SessionConfig())
    host.prepare_device()
    double = adapter.create_session(model, SessionConfig())
    double.prepare_device()
    want, got = host.run(feed), double.run(feed)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
