"""Fetching from a compiled program gives the asked values or a FetchError; compiles
are serialised; a dropped or recompiled program releases its executor."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from support.helpers import fresh_programs  # noqa: E402

import paddle_ipu  # noqa: E402
from paddle_ipu.errors import FetchError, IpuError  # noqa: E402

IPU = paddle.CustomPlace("ipu", 0)


def build(training: bool, seed: int = 4) -> dict[str, Any]:
    with fresh_programs(seed) as (main, startup, scope):
        x = paddle.static.data("x", [-1, 6], "float32")
        y = paddle.static.data("y", [-1, 1], "int64")
        logits = paddle.static.nn.fc(x, 4)
        loss = paddle.nn.functional.cross_entropy(logits, y)
        if training:
            paddle.optimizer.SGD(0.5).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    params = {
        str(op.attrs()["parameter_name"]): op.result(0)
        for op in main.global_block().ops
        if op.name() == "builtin.parameter"
    }
    return {"main": main, "scope": scope, "logits": logits, "loss": loss, "params": params}


def feed(rows: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "x": rng.standard_normal((rows, 6)).astype("float32"),
        "y": rng.integers(0, 4, (rows, 1)).astype("int64"),
    }


def compile_(net: dict[str, Any], training: bool, fetches: list[Any]) -> tuple[Any, Any]:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=training, micro_batch_size=4)
    compiled = paddle_ipu.IpuCompiledProgram(net["main"], scope=net["scope"], ipu_strategy=s)
    return compiled, compiled.compile(["x", "y"], fetches)


@pytest.mark.parametrize("direct", ["1", "0"])
@pytest.mark.parametrize("training", [False, True])
def test_fetching_what_was_not_compiled_raises(monkeypatch, direct: str, training: bool) -> None:
    monkeypatch.setenv("PADDLE_IPU_DIRECT_RUN", direct)
    net = build(training)
    _, prog = compile_(net, training, [net["loss"]])
    exe = paddle.static.Executor(IPU)
    with paddle.static.scope_guard(net["scope"]):
        for fetch_list in ([net["logits"]], [net["loss"], net["logits"]], ["no_such_tensor"]):
            with pytest.raises(FetchError, match="can fetch") as info:
                exe.run(prog, feed=feed(), fetch_list=fetch_list)
            assert isinstance(info.value, IpuError)
            assert prog.fetch_names[0] in str(info.value)
        # What was compiled still comes back, by Value and by name.
        by_value = exe.run(prog, feed=feed(), fetch_list=[net["loss"]])
        by_name = exe.run(prog, feed=feed(), fetch_list=prog.fetch_names)
    assert len(by_value) == len(by_name) == 1


@pytest.mark.parametrize("training", [False, True])
def test_two_fetches_come_back_as_two_arrays(training: bool) -> None:
    net = build(training)
    cpu = build(training)
    _, prog = compile_(net, training, [net["loss"], net["logits"]])
    exe = paddle.static.Executor(IPU)
    with paddle.static.scope_guard(net["scope"]):
        got = exe.run(prog, feed=feed(), fetch_list=[net["loss"], net["logits"]])
        swapped = exe.run(prog, feed=feed(), fetch_list=[net["logits"], net["loss"]])
    with paddle.static.scope_guard(cpu["scope"]):
        want = paddle.static.Executor(paddle.CPUPlace()).run(
            cpu["main"], feed=feed(), fetch_list=[cpu["loss"], cpu["logits"]]
        )
    assert len(got) == 2
    np.testing.assert_allclose(np.asarray(got[0]).reshape(()), np.asarray(want[0]), rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    if not training:  # a training run moved the weights between the two calls
        np.testing.assert_array_equal(swapped[0], got[1])


@pytest.mark.parametrize("training", [False, True])
def test_parameter_fetched_by_name_matches_cpu(training: bool) -> None:
    """A parameter fetched by name is the value Paddle's CPU run returns: in training,
    the value after that step's update."""
    net = build(training)
    cpu = build(training)
    name = sorted(net["params"])[-1]  # the weight matrix
    _, prog = compile_(net, training, [net["loss"], name])
    exe = paddle.static.Executor(IPU)
    with paddle.static.scope_guard(net["scope"]):
        got = exe.run(prog, feed=feed(), fetch_list=[name])[0]
    with paddle.static.scope_guard(cpu["scope"]):
        want = paddle.static.Executor(paddle.CPUPlace()).run(
            cpu["main"], feed=feed(), fetch_list=[cpu["params"][sorted(cpu["params"])[-1]]]
        )[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_compile_from_dygraph_mode(dygraph: None) -> None:
    paddle.enable_static()
    net = build(False)
    paddle.disable_static()
    _, prog = compile_(net, False, [net["logits"]])
    assert prog.fetch_names


def test_compiles_from_threads_are_serialised() -> None:
    nets = [build(False, seed=s) for s in range(4)]
    errors: list[BaseException] = []
    progs: list[Any] = [None] * 4

    def work(i: int) -> None:
        try:
            progs[i] = compile_(nets[i], False, [nets[i]["logits"]])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    exe = paddle.static.Executor(IPU)
    for net, (_, prog) in zip(nets, progs):
        with paddle.static.scope_guard(net["scope"]):
            got = exe.run(prog, feed=feed(), fetch_list=prog.fetch_names)[0]
            want = paddle.static.Executor(paddle.CPUPlace()).run(
                net["main"], feed=feed(), fetch_list=[net["logits"]]
            )[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dropping_a_compiled_program_releases_its_executor() -> None:
    net = build(False)
    compiled, prog = compile_(net, False, [net["logits"]])
    with paddle.static.scope_guard(net["scope"]):
        paddle.static.Executor(IPU).run(prog, feed=feed(), fetch_list=prog.fetch_names)
    executor = weakref.ref(compiled.executor)
    session = weakref.ref(compiled.executor.session)
    del compiled, prog
    gc.collect()
    assert executor() is None
    assert session() is None


def test_recompiling_closes_the_previous_executor() -> None:
    net = build(False)
    compiled, _ = compile_(net, False, [net["logits"]])
    old = compiled.executor
    compiled.compile(["x", "y"], [net["logits"]])
    assert compiled.executor is not old
    assert old.session is None  # reset: its device is released


@pytest.mark.parametrize("direct", ["1", "0"])
def test_nested_fetch_list_and_scalars_read_both_ways(monkeypatch, direct: str) -> None:
    """2.x code fetches ``[fetch_targets]`` (a list in the list, as load_inference_model
    returns them) and reads a scalar result with len() / [0], as 2.x's IPU backend gave
    it the shape [1]; Paddle 3 code reads the same result as the CPU's 0-d array."""
    monkeypatch.setenv("PADDLE_IPU_DIRECT_RUN", direct)
    net = build(False)
    _, prog = compile_(net, False, [net["loss"], net["logits"]])
    exe = paddle.static.Executor(IPU)
    cpu = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(net["scope"]):
        want_loss, want_logits = cpu.run(
            net["main"], feed=feed(), fetch_list=[net["loss"], net["logits"]]
        )
        loss, logits = exe.run(prog, feed=feed(), fetch_list=[[net["loss"], net["logits"]]])
    assert np.asarray(want_loss).shape == () and loss.shape == ()
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    assert len(loss) == 1 and loss[0] == pytest.approx(float(want_loss), rel=1e-5)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-6)
