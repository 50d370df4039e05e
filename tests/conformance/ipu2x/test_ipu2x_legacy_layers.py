"""Legacy-IR programs (Paddle 2.x's static API), compiled for the IPU.

These run only with FLAGS_enable_pir_api=0 set before Paddle is imported (Paddle's
IR is fixed per process); test_ipu2x_legacy.py runs them, and the 2.x-style op and
model tests, in such a process.  The oracle is Paddle's legacy CPU executor.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import paddle
import pytest
from support.ipu2x_base import check, run_mode, run_modes, static_graph

pytestmark = pytest.mark.skipif(
    os.environ.get("FLAGS_enable_pir_api") != "0",  # noqa: SIM112 (Paddle's spelling)
    reason="legacy-IR tests run in a process started with FLAGS_enable_pir_api=0",
)

paddle.enable_static()
rng = np.random.default_rng(7)
X = rng.standard_normal([4, 3, 8, 8]).astype(np.float32)
IDS = rng.integers(0, 20, size=[4, 5]).astype(np.int64)
LABEL = rng.integers(0, 10, size=[4, 1]).astype(np.int64)


def _legacy_layers(with_bn: bool) -> tuple[list[str], list[str]]:
    x = paddle.static.data(name="x", shape=[4, 3, 8, 8], dtype="float32")
    ids = paddle.static.data(name="ids", shape=[4, 5], dtype="int64")
    conv = paddle.static.nn.conv2d(x, num_filters=4, filter_size=3)
    hidden = paddle.static.nn.batch_norm(conv, is_test=True) if with_bn else conv
    ln = paddle.static.nn.layer_norm(paddle.flatten(hidden, 1))
    emb = paddle.static.nn.embedding(ids, size=[20, 6])
    out = paddle.concat([ln, paddle.flatten(emb, 1)], axis=1)
    if not with_bn:
        return [x.name, ids.name], [ln.name, out.name]
    return [x.name, ids.name], [conv.name, hidden.name, out.name]


def test_legacy_only_layers_fp32() -> None:
    check(run_modes(_legacy_layers, {"x": X, "ids": IDS}, modes=("cpu", "ipu"), args=(True,)))


def test_legacy_only_layers_fp16_from_amp() -> None:
    # Paddle's legacy amp cast (the program computes in float16 itself)
    check(run_modes(_legacy_layers, {"x": X, "ids": IDS}, args=(False,)))


def test_legacy_amp_batch_norm_matches_cpu() -> None:
    """Paddle's amp keeps batch_norm's statistics and scale in float32 next to a float16
    input, which one ONNX BatchNormalization cannot take: they are cast to float16 in
    front of it (converter_fixes), and the result is the CPU's within float16."""
    check(run_modes(_legacy_layers, {"x": X, "ids": IDS}, args=(True,)))


def _classifier(opt: str) -> Any:
    def build() -> tuple[list[str], list[str]]:
        x = paddle.static.data(name="x", shape=[4, 3, 8, 8], dtype="float32")
        label = paddle.static.data(name="label", shape=[4, 1], dtype="int64")
        conv = paddle.static.nn.conv2d(x, num_filters=4, filter_size=3, act="relu")
        bn = paddle.static.nn.batch_norm(conv)
        logits = paddle.static.nn.fc(paddle.flatten(bn, 1), 10)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label, reduction="none"))
        {
            "sgd": lambda: paddle.optimizer.SGD(0.05),
            "momentum": lambda: paddle.optimizer.Momentum(0.05, momentum=0.9),
            "adam": lambda: paddle.optimizer.Adam(0.01),
            "lamb": lambda: paddle.optimizer.Lamb(0.01),
        }[opt]().minimize(loss)
        return [x.name, label.name], [loss.name, logits.name]

    return build


@pytest.mark.parametrize("opt", ["sgd", "momentum", "adam", "lamb"])
def test_legacy_training_matches_cpu(opt: str) -> None:
    results = run_modes(
        _classifier(opt),
        {"x": X, "label": LABEL},
        modes=("cpu", "ipu"),
        is_training=True,
        steps=6,
    )
    losses = [float(np.asarray(s[0]).reshape(-1)[0]) for s in results["cpu"]]
    assert losses[-1] < losses[0]
    check(results, rtol=1e-4, atol=1e-5)


def test_legacy_weights_to_host_equal_cpu_training() -> None:
    """After 5 steps, the weights copied back by IpuBackend equal Paddle's CPU training."""
    weights = {}
    for mode in ("cpu", "ipu"):
        built = static_graph(_classifier("adam"))
        with paddle.static.scope_guard(built.scope):
            exe = paddle.static.Executor(paddle.CPUPlace() if mode == "cpu" else paddle.IPUPlace())
            exe.run(built.startup)
            program: Any = built.main
            if mode == "ipu":
                s = paddle.static.IpuStrategy()
                s.set_graph_config(is_training=True)
                program = paddle.static.IpuCompiledProgram(built.main, ipu_strategy=s).compile(
                    built.feed_list, built.fetch_list
                )
            for _ in range(5):
                exe.run(program, feed={"x": X, "label": LABEL}, fetch_list=built.fetch_list)
            if mode == "ipu":
                paddle.framework.core.IpuBackend.get_instance().weights_to_host()
            weights[mode] = {
                p.name: np.asarray(built.scope.find_var(p.name).get_tensor())
                for p in built.main.all_parameters()
            }
    assert weights["cpu"].keys() == weights["ipu"].keys() and len(weights["cpu"]) >= 4
    for name, want in weights["cpu"].items():
        np.testing.assert_allclose(weights["ipu"][name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def _sharded() -> tuple[list[str], list[str]]:
    x = paddle.static.data(name="x", shape=[4, 3, 8, 8], dtype="float32")
    with paddle.static.ipu_shard_guard(index=0, stage=0):
        conv = paddle.static.nn.conv2d(x, num_filters=4, filter_size=3)
    with paddle.static.ipu_shard_guard(index=1, stage=1):
        out = paddle.static.nn.fc(paddle.flatten(conv, 1), 5)
    return [x.name], [out.name]


def test_legacy_shard_attributes_reach_the_graph() -> None:
    def configure(s: Any) -> None:
        s.set_graph_config(num_ipus=2, is_training=False, enable_manual_shard=True)

    cpu = run_mode("cpu", _sharded, {"x": X})
    built = static_graph(_sharded)
    ops = {op.type: op.attr("ipu_index") for op in built.main.global_block().ops}
    assert ops["conv2d"] == 0 and ops["mul"] == 1
    with paddle.static.scope_guard(built.scope):
        exe = paddle.static.Executor(paddle.IPUPlace())
        exe.run(built.startup)
        s = paddle.static.IpuStrategy()
        configure(s)
        compiled = paddle.static.IpuCompiledProgram(built.main, ipu_strategy=s)
        program = compiled.compile(built.feed_list, built.fetch_list)
        out = exe.run(program, feed={"x": X}, fetch_list=built.fetch_list)
        shards = compiled.model.shards
    assert {spec.ipu_index for spec in shards.values()} == {0, 1}
    check({"cpu": cpu, "ipu": [out]})


def test_legacy_through_paddles_executor(monkeypatch: Any) -> None:
    """PADDLE_IPU_DIRECT_RUN=0: the compiled (PIR) program runs through Paddle's
    executor, switched to PIR mode for the run."""
    monkeypatch.setenv("PADDLE_IPU_DIRECT_RUN", "0")
    results = run_modes(
        _classifier("sgd"),
        {"x": X, "label": LABEL},
        modes=("cpu", "ipu"),
        is_training=True,
        steps=3,
    )
    check(results, rtol=1e-4, atol=1e-5)
    assert not paddle.framework.in_pir_mode()


def _fp16_classifier(opt: str) -> Any:
    def build() -> tuple[list[str], list[str]]:
        x = paddle.static.data(name="x", shape=[4, 3, 8, 8], dtype="float32")
        label = paddle.static.data(name="label", shape=[4, 1], dtype="int64")
        conv = paddle.static.nn.conv2d(x, num_filters=4, filter_size=3, act="relu")
        ln = paddle.static.nn.layer_norm(paddle.flatten(conv, 1))
        logits = paddle.static.nn.fc(ln, 10)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label, reduction="none"))
        {"sgd": lambda: paddle.optimizer.SGD(0.05), "adam": lambda: paddle.optimizer.Adam(0.01)}[
            opt
        ]().minimize(loss)
        return [x.name, label.name], [loss.name, logits.name]

    return build


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_legacy_fp16_training_matches_cpu(opt: str) -> None:
    """2.x's fp16 training flow on a legacy program: cast_model_to_fp16 casts the
    forward and backward to float16 (its gradients are cast back for the float32
    update).  It trains -- through the program's float32 twin compiled in float16 --
    as the CPU trains the float32 program, within float16's precision.  (With a
    BatchNorm the host's gradient program fails: see docs/migrating.md.)"""
    results = run_modes(
        _fp16_classifier(opt),
        {"x": X, "label": LABEL},
        modes=("cpu", "ipu_fp16"),
        is_training=True,
        steps=3,  # float16 drifts from the float32 trajectory as training goes on
    )
    losses = [float(np.asarray(step[0]).reshape(-1)[0]) for step in results["ipu_fp16"]]
    assert losses[-1] < losses[0]  # it trains
    check(results, rtol_fp16=5e-2, atol_fp16=5e-2)


def _multi_output() -> tuple[list[str], list[str]]:
    x = paddle.static.data(name="x", shape=[4, 3, 8, 8], dtype="float32")
    parts = paddle.split(x, 3, axis=1)
    rows = paddle.unstack(parts[1], axis=0)
    return [x.name], [parts[0].name, parts[2].name, rows[3].name]


def test_legacy_multi_output_ops_fetch_their_elements() -> None:
    """split / unstack translate to one list value; each fetched element is the
    right one (the translation gave the list itself, which could not be fetched)."""
    check(run_modes(_multi_output, {"x": X}, modes=("cpu", "ipu")))
