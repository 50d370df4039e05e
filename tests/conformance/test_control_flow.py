"""Control flow: ``paddle.static.nn.while_loop`` and ``cond`` (PIR ``pd_op.while`` /
``pd_op.if``; the legacy IR's ``while``) compile to ONNX ``Loop`` / ``If`` and run on
the emulated IPU as Paddle's CPU executor runs them.  The trip counts are the models'
own: a loop's condition reads the data, so the number of iterations differs per feed."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from support.helpers import fresh_programs, run_python

import paddle_ipu
from paddle_ipu.compiler import compile_program
from paddle_ipu.errors import CompileError


def _compile(main: object, feeds: list[str], fetches: list[object]) -> object:
    strategy = paddle_ipu.IpuStrategy()
    strategy.set_graph_config(is_training=False)
    return paddle_ipu.IpuCompiledProgram(main, ipu_strategy=strategy).compile(feeds, fetches)


def _decoder(paddle: object) -> tuple[object, object, object]:
    """A loop in the shape of a greedy decoder: a state updated from a weight and the
    input it started from (read again in every step), until its mean passes a limit the
    data decides how soon to reach, at most 12 steps; then a branch on the result."""
    x = paddle.static.data("x", [2, 4], "float32")
    limit = paddle.static.data("limit", [1], "float32")
    w = paddle.create_parameter([4, 4], "float32")
    steps = paddle.full([1], 12, "int64")
    i = paddle.zeros([1], "int64")

    def cond(i: object, h: object) -> object:
        return paddle.logical_and(i < steps, paddle.mean(h).reshape([1]) < limit)

    def body(i: object, h: object) -> list[object]:
        return [i + 1, paddle.tanh(paddle.matmul(h, w)) + x]

    count, h = paddle.static.nn.while_loop(cond, body, [i, x])
    y = paddle.static.nn.cond(paddle.mean(h) > 1.0, lambda: h * 2.0, lambda: h - 1.0)
    return count, h, y


def test_pir_while_and_if_give_the_cpus_results_with_data_dependent_trip_counts() -> None:
    import paddle

    with fresh_programs(seed=3) as (main, startup, scope):
        count, h, y = _decoder(paddle)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        rng = np.random.default_rng(0)
        feeds = [
            {"x": rng.random((2, 4), dtype=np.float32), "limit": np.float32([lim])}
            for lim in (0.2, 1.1, 5.0)
        ]
        want = [exe.run(main, feed=f, fetch_list=[count, h, y]) for f in feeds]
        assert len({int(w[0][0]) for w in want}) > 1, "the trip counts should differ"
        prog = _compile(main, ["x", "limit"], [count, h, y])
        for feed, expected in zip(feeds, want):
            got = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
            np.testing.assert_array_equal(got[0], expected[0])
            for a, b in zip(got[1:], expected[1:]):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        compiled = compile_program(main, ["x", "limit"], [count, h, y], scope=scope)
    graph = onnx.load_from_string(compiled.onnx).graph
    assert {"Loop", "If"} <= {n.op_type for n in graph.node}


def test_a_loop_whose_carried_value_grows_is_refused_by_name() -> None:
    import paddle

    with fresh_programs() as (main, startup, _):
        x = paddle.static.data("x", [2, 3], "float32")
        i = paddle.zeros([1], "int64")
        steps = paddle.full([1], 3, "int64")

        def body(i: object, seq: object) -> list[object]:
            return [i + 1, paddle.concat([seq, seq[:, :1]], axis=1)]

        _, seq = paddle.static.nn.while_loop(lambda i, s: i < steps, body, [i, x * 1.0])
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        with pytest.raises(CompileError) as info:
            _compile(main, ["x"], [seq])
    text = str(info.value)
    assert "pd_op.while" in text and "[2, 3]" in text and "[2, 4]" in text
    assert "static shapes" in text


# The legacy IR (Paddle 2.x's ``while`` op with its sub-block; FLAGS_enable_pir_api=0 is
# read at import, so in a process of its own).  Paddle 3's Python layers append PIR ops
# under the legacy IR, so the body's activation is appended as a 2.x layer did.
LEGACY = """
import json, numpy as np, paddle
paddle.enable_static()
from paddle.base.layer_helper import LayerHelper

def tanh(x):
    helper = LayerHelper("tanh")
    y = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type="tanh", inputs={"X": x}, outputs={"Out": y})
    return y

main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [2, 4], "float32")
    w = paddle.static.create_parameter([4], "float32")
    n = paddle.full([1], 5, "int64")
    i = paddle.zeros([1], "int64")
    i2, h = paddle.static.nn.while_loop(lambda i, h: i < n,
                                        lambda i, h: [i + 1, tanh(h * w) + x], [i, x])
ops = [op.type for op in main.global_block().ops]
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
feed = {"x": np.random.default_rng(0).random((2, 4), dtype=np.float32)}
want = exe.run(main, feed=feed, fetch_list=[h])
import paddle_ipu
strategy = paddle_ipu.IpuStrategy()
strategy.set_graph_config(is_training=False)
prog = paddle_ipu.IpuCompiledProgram(main, ipu_strategy=strategy).compile(["x"], [h])
got = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
print(json.dumps({"ops": ops, "diff": float(np.abs(got[0] - want[0]).max()),
                  "moved": float(np.abs(want[0] - feed["x"]).max())}))
"""


def test_legacy_while_gives_the_cpus_result() -> None:
    proc = run_python(LEGACY, {"FLAGS_enable_pir_api": "0", "PADDLE_IPU_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "while" in result["ops"]
    # the loop's result is written back to the variable it started from (x): the
    # fetch is the loop's value, not the feed's
    assert result["moved"] > 0.1
    assert result["diff"] < 1e-5


def test_a_decoder_loop_writing_each_step_at_its_index_gives_the_cpus_buffer() -> None:
    """``buf[:, i:i + 1] = step`` inside the loop (a table decoder's pattern): a slice whose
    place the loop's counter gives at run time."""
    import paddle

    with fresh_programs(seed=5) as (main, startup, _):
        x = paddle.static.data("x", [2, 4], "float32")
        w = paddle.create_parameter([4, 4], "float32")
        buf = paddle.zeros([2, 6, 4], "float32")
        i = paddle.zeros([1], "int64")
        steps = paddle.full([1], 6, "int64")

        def body(i: object, h: object, buf: object) -> list[object]:
            h = paddle.tanh(paddle.matmul(h, w))
            buf = buf * 1.0  # the loop's own copy: Paddle carries it
            buf[:, i : i + 1] = h.unsqueeze(1)
            return [i + 1, h, buf]

        _, _, out = paddle.static.nn.while_loop(lambda i, h, b: i < steps, body, [i, x, buf])
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        feed = {"x": np.random.default_rng(1).random((2, 4), dtype=np.float32)}
        (want,) = exe.run(main, feed=feed, fetch_list=[out])
        assert np.abs(want).min() > 0  # every step written
        prog = _compile(main, ["x"], [out])
        (got,) = exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
