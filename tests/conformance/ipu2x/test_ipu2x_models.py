"""Model-level tests in the style of Paddle 2.x's test/ipu, with the 2.x names:
save/load mid-training, eval mode, pipelining, replicas, the model runtime.  They
build with APIs both IRs have, and run again in legacy mode (test_ipu2x_legacy.py).
The oracle is Paddle's CPU executor."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import paddle
import pytest
from support.ipu2x_base import static_graph

import paddle_ipu  # noqa: F401

paddle.enable_static()
rng = np.random.default_rng(11)
BATCHES = [
    {
        "x": rng.standard_normal([4, 12]).astype(np.float32),
        "y": rng.integers(0, 5, [4, 1]).astype(np.int64),
    }
    for _ in range(30)
]


def _fc(x: Any, size: int, name: str) -> Any:
    # Named parameters: under PIR, fc's default names do not restart inside
    # unique_name.guard() as they did in 2.x, and save/load matches by name.
    return paddle.static.nn.fc(
        x, size, weight_attr=paddle.ParamAttr(name=f"{name}.w"), bias_attr=f"{name}.b"
    )


def _net(shard: bool = False, batch: int = 4) -> tuple[list[str], list[str]]:
    x = paddle.static.data(name="x", shape=[batch, 12], dtype="float32")
    y = paddle.static.data(name="y", shape=[batch, 1], dtype="int64")
    if shard:
        with paddle.static.ipu_shard_guard(index=0, stage=0):
            h = paddle.nn.functional.relu(_fc(x, 16, "fc1"))
        with paddle.static.ipu_shard_guard(index=1, stage=1):
            logits = _fc(h, 5, "fc2")
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y, reduction="none"))
    else:
        h = paddle.nn.functional.relu(_fc(x, 16, "fc1"))
        logits = _fc(h, 5, "fc2")
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y, reduction="none"))
    paddle.optimizer.Adam(0.01).minimize(loss)
    return [x.name, y.name], [loss.name]


def _cpu_losses(batches: list[dict[str, np.ndarray]], batch: int = 4) -> list[float]:
    built = static_graph(_net, False, batch)
    with paddle.static.scope_guard(built.scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(built.startup)
        return [
            float(np.asarray(exe.run(built.main, feed=b, fetch_list=built.fetch_list)[0]))
            for b in batches
        ]


def _ipu(built: Any, configure: Any = None) -> tuple[Any, Any]:
    exe = paddle.static.Executor(paddle.IPUPlace())
    exe.run(built.startup)
    s = paddle.static.IpuStrategy()
    s.set_graph_config(is_training=True)
    if configure is not None:
        configure(s)
    program = paddle.static.IpuCompiledProgram(built.main, ipu_strategy=s).compile(
        built.feed_list, built.fetch_list
    )
    return exe, program


def test_save_at_step_20_load_and_continue(tmp_path: Any) -> None:
    """2.x's save/load test: copy the weights to the host at step 20, paddle.static.save,
    load into a new program, train on; losses 21-30 equal a CPU run of 30 steps."""
    want = _cpu_losses(BATCHES)
    path = os.path.join(str(tmp_path), "ckpt")
    first = static_graph(_net)
    with paddle.static.scope_guard(first.scope):
        exe, program = _ipu(first)
        for b in BATCHES[:20]:
            exe.run(program, feed=b, fetch_list=first.fetch_list)
        paddle.framework.core.IpuBackend.get_instance().weights_to_host()
        paddle.static.save(first.main, path)
        paddle.framework.core.IpuBackend.get_instance().reset()
    second = static_graph(_net)
    with paddle.static.scope_guard(second.scope):
        exe = paddle.static.Executor(paddle.IPUPlace())
        exe.run(second.startup)
        paddle.static.load(second.main, path, exe)
        s = paddle.static.IpuStrategy()
        s.set_graph_config(is_training=True)
        program = paddle.static.IpuCompiledProgram(second.main, ipu_strategy=s).compile(
            second.feed_list, second.fetch_list
        )
        got = [
            float(np.asarray(exe.run(program, feed=b, fetch_list=second.fetch_list)[0]))
            for b in BATCHES[20:]
        ]
    np.testing.assert_allclose(got, want[20:], rtol=1e-5, atol=1e-6)


def test_eval_mode_then_training() -> None:
    want = _cpu_losses(BATCHES[:1] * 3)
    built = static_graph(_net)
    with paddle.static.scope_guard(built.scope):
        exe, program = _ipu(built, lambda s: s.set_options({"runtime_options.enable_eval": True}))
        evals = [
            float(np.asarray(exe.run(program, feed=BATCHES[0], fetch_list=built.fetch_list)[0]))
            for _ in range(3)
        ]
    assert evals == [evals[0]] * 3  # nothing was updated
    np.testing.assert_allclose(evals[0], want[0], rtol=1e-5)


def test_pipelining_two_stages_batches_per_step() -> None:
    """Two shards in two pipeline stages, batches_per_step=2: one run is two steps,
    each equal to a CPU step."""
    want = _cpu_losses(BATCHES[:6])

    def configure(s: Any) -> None:
        s.set_graph_config(num_ipus=2, is_training=True, enable_manual_shard=True)
        s.set_pipelining_config(enable_pipelining=True, batches_per_step=2)

    built = static_graph(_net, True)
    with paddle.static.scope_guard(built.scope):
        exe, program = _ipu(built, configure)
        got: list[float] = []
        for i in range(0, 6, 2):
            feed = {k: np.concatenate([BATCHES[i][k], BATCHES[i + 1][k]]) for k in ("x", "y")}
            out = exe.run(program, feed=feed, fetch_list=built.fetch_list)[0]
            got.extend(float(v) for v in np.asarray(out).reshape(-1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("replicas", [2])
def test_replicas_equal_cpu_on_the_whole_batch(replicas: int) -> None:
    """Two replicas, each on half the batch, gradients averaged (2.x's default):
    a CPU step on the whole batch."""
    big = [
        {k: np.concatenate([BATCHES[i][k], BATCHES[i + 1][k]]) for k in ("x", "y")}
        for i in range(0, 8, 2)
    ]
    want = _cpu_losses(big, batch=8)

    def configure(s: Any) -> None:
        s.set_graph_config(num_ipus=replicas, is_training=True)
        s.set_options({"enable_replicated_graphs": True, "replicated_graph_count": replicas})

    built = static_graph(_net, False, 4)
    with paddle.static.scope_guard(built.scope):
        exe, program = _ipu(built, configure)
        got = [
            float(np.mean(np.asarray(exe.run(program, feed=b, fetch_list=built.fetch_list)[0])))
            for b in big
        ]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_model_runtime_partial_batches() -> None:
    """enable_model_runtime_executor with timeout_ms: requests of 1..7 rows (micro
    batch 8) each get their own rows, equal to the CPU's."""

    def build() -> tuple[list[str], list[str]]:
        x = paddle.static.data(name="x", shape=[-1, 12], dtype="float32")
        out = paddle.nn.functional.softmax(paddle.static.nn.fc(x, 5))
        return [x.name], [out.name]

    built = static_graph(build)
    with paddle.static.scope_guard(built.scope):
        cpu = paddle.static.Executor(paddle.CPUPlace())
        cpu.run(built.startup)
        requests = [rng.standard_normal([n, 12]).astype(np.float32) for n in (1, 3, 7, 5)]
        want = [
            cpu.run(built.main, feed={"x": r}, fetch_list=built.fetch_list)[0] for r in requests
        ]
        s = paddle.static.IpuStrategy()
        s.set_graph_config(is_training=False, micro_batch_size=8)
        s.set_options({"enable_model_runtime_executor": True, "timeout_ms": 2.0})
        compiled = paddle.static.IpuCompiledProgram(built.main, ipu_strategy=s)
        program = compiled.compile(built.feed_list, built.fetch_list)
        exe = paddle.static.Executor(paddle.IPUPlace())
        try:
            got = [
                exe.run(program, feed={"x": r}, fetch_list=built.fetch_list)[0] for r in requests
            ]
        finally:
            compiled.reset()
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
