"""Fetch by the names 2.x code reads off ``var.name`` (paddle_ipu.frontends.fetch_names and
paddle_ipu.compat.names)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_ipu
from paddle_ipu.errors import FetchError

paddle.enable_static()


def _program() -> tuple[object, object, object, dict[str, object]]:
    scope = paddle.static.Scope()
    main, startup = paddle.static.Program(), paddle.static.Program()
    paddle.seed(3)
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [2, 6], "float32")
        linear = paddle.nn.Linear(6, 4)
        hidden = linear(x)
        act = paddle.nn.functional.tanh(hidden)
        out = paddle.sum(act * 2.0, axis=1)
    values = {"x": x, "hidden": hidden, "act": act, "out": out, "w": linear.weight}
    return scope, main, startup, values


FEED = {"x": np.random.default_rng(0).standard_normal([2, 6]).astype(np.float32)}


def test_cpu_run_by_names_equals_run_by_values() -> None:
    scope, main, startup, v = _program()
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        by_value = exe.run(main, feed=FEED, fetch_list=[v["hidden"], v["act"], v["out"]])
        names = [v["hidden"].name, v["act"].name, v["out"].name]
        assert len(set(names)) == 3 and all(n.endswith(".tmp_0") for n in names)
        by_name = exe.run(main, feed=FEED, fetch_list=names)
        # data and parameter names, which Paddle 3.3's PIR executor also refuses
        x_w = exe.run(main, feed=FEED, fetch_list=["x", v["w"].name])
        w_scope = np.asarray(scope.find_var(v["w"].name).get_tensor())
    for a, b in zip(by_value, by_name):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(x_w[0], FEED["x"])
    np.testing.assert_array_equal(x_w[1], w_scope)
    # the name is stable: read twice, the same
    assert v["act"].name == names[1]


def _inference() -> paddle_ipu.IpuStrategy:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    return s


def test_compiled_program_by_names() -> None:
    scope, main, startup, v = _program()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        want = exe.run(main, feed=FEED, fetch_list=[v["act"], v["out"]])
        names = [v["act"].name, v["out"].name]
        prog = paddle_ipu.IpuCompiledProgram(main, ipu_strategy=_inference()).compile(["x"], names)
        got = exe.run(prog, feed=FEED, fetch_list=names)
        got_reversed = exe.run(prog, feed=FEED, fetch_list=names[::-1])
        # a value compiled by Value is fetchable by its name read later, too
        compiled2 = paddle_ipu.IpuCompiledProgram(main, ipu_strategy=_inference())
        prog2 = compiled2.compile(["x"], [v["hidden"]])
        hidden = exe.run(prog2, feed=FEED, fetch_list=[v["hidden"].name])
        want_hidden = exe.run(main, feed=FEED, fetch_list=[v["hidden"]])
        with pytest.raises(FetchError, match="not an output"):
            exe.run(prog2, feed=FEED, fetch_list=[v["act"].name])
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_reversed[0], got[1])
    np.testing.assert_allclose(hidden[0], want_hidden[0], rtol=1e-6, atol=1e-6)


def test_implicit_run_on_ipu_place_by_names() -> None:
    scope, main, startup, v = _program()
    with paddle.static.scope_guard(scope):
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        want = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=FEED, fetch_list=[v["out"]])
        got = paddle.static.Executor(paddle.IPUPlace()).run(
            main, feed=FEED, fetch_list=[v["out"].name]
        )
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


def test_limits_name_belongs_to_its_program() -> None:
    scope, _main, _startup, v = _program()  # _main stays alive: v points into it
    name = v["act"].name
    other = paddle.static.Program()
    with paddle.static.program_guard(other, paddle.static.Program()):
        paddle.static.data("x", [2, 6], "float32")
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope), pytest.raises(Exception, match="fetch op"):
        # Paddle's own error: the name does not resolve in another program
        exe.run(other, feed=FEED, fetch_list=[name])


def test_paddle_internal_readers_still_get_the_error() -> None:
    _, main, _, v = _program()  # main stays alive: its values point into it
    # Paddle's own modules rely on ValueError for unnamed values; they keep it.
    for module in ("paddle.some_module", "paddle_ipu.checkpoint"):
        with pytest.raises(ValueError):
            exec("value.name", {"__name__": module, "value": v["act"]})
    assert not v["act"].has_name
    assert main is not None
