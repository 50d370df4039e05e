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


# A token-by-token decoder in the shape of a table-structure head (SLANet's): each step
# embeds the last token, updates the state, writes the step's token probabilities into
# a buffer at the step's index, and ends the loop early when every row produced the end
# token -- an `if` inside the `while` (PIR's pd_op.if; in the legacy IR the
# conditional_block and select_input that Paddle 2.x's dy2static wrote for
# `if (tok == eos).all(): break`).  The outputs are the buffer cut to the steps taken
# (a size the data decides: the cut runs on the host after the compiled graph) and the
# count.  Paddle 3.3's legacy `cond` calls a PIR-only layer, so the legacy program
# appends its operators as Paddle 2.x's layers did, and the branch through
# ConditionalBlock itself.
DECODER = """
import numpy as np, paddle
paddle.enable_static()
paddle.seed(3)
from paddle.base.layer_helper import LayerHelper
V, T, H = 6, 8, 8
LEGACY = {legacy}

def op(kind, inputs, attrs=None, dtype="float32", xshape=False):
    if not LEGACY:  # the same operator through Paddle 3's layers
        return PIR[kind](inputs, attrs or {{}})
    helper = LayerHelper(kind)
    out = helper.create_variable_for_type_inference(dtype)
    outputs = {{"Out": out}}
    if xshape:
        outputs["XShape"] = helper.create_variable_for_type_inference(dtype)
    helper.append_op(type=kind, inputs=inputs, outputs=outputs, attrs=attrs or {{}})
    return out

F = paddle.nn.functional
PIR = {{
    "logical_and": lambda i, a: paddle.logical_and(i["X"], i["Y"]),
    "logical_not": lambda i, a: paddle.logical_not(i["X"]),
    "matmul_v2": lambda i, a: paddle.matmul(i["X"], i["Y"]),
    "one_hot_v2": lambda i, a: F.one_hot(i["X"], a["depth"]),
    "elementwise_add": lambda i, a: i["X"] + i["Y"],
    "tanh": lambda i, a: paddle.tanh(i["X"]),
    "arg_max": lambda i, a: paddle.argmax(i["X"], axis=a["axis"]),
    "softmax": lambda i, a: F.softmax(i["X"]),
    "unsqueeze2": lambda i, a: i["X"].unsqueeze(a["axes"]),
    "equal": lambda i, a: i["X"] == i["Y"],
    "reduce_all": lambda i, a: paddle.all(i["X"]),
}}

def stop_if_all_ended(stop, done):
    if not LEGACY:
        return paddle.static.nn.cond(stop, lambda: paddle.full([1], True, "bool"),
                                     lambda: done)
    from paddle.static.nn.control_flow import ConditionalBlock, select_input
    kept = LayerHelper("cond").create_variable_for_type_inference("bool")
    branch = ConditionalBlock([op("logical_not", {{"X": stop}}, dtype="bool")],
                              is_scalar_condition=True)
    with branch.block():
        LayerHelper("assign").append_op(type="assign", inputs={{"X": done}},
                                        outputs={{"Out": kept}})
    mask = op("cast", {{"X": stop}}, {{"in_dtype": 0, "out_dtype": 2}}, dtype="int32")
    return select_input([kept, paddle.full([1], True, "bool")], mask)

main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [1, H], "float32")
    wh, wo, we = (paddle.static.create_parameter(s, "float32") for s in ([H, H], [H, V], [V, H]))
    n = paddle.full([1], T, "int64")
    start = [paddle.zeros([1], "int64"), x * 1.0, paddle.zeros([1], "int64"),
             paddle.full([1], False, "bool"), paddle.zeros([1, T, V], "float32"),
             # the last step's logits, which the body writes before it reads them: the
             # legacy program starts them as a placeholder of another shape, as Paddle
             # 2.x's dy2static started such a value
             paddle.zeros([1] if LEGACY else [1, V], "float32")]

    def cond(i, h, tok, done, buf, last):
        going = op("logical_not", {{"X": done}}, dtype="bool")
        return op("logical_and", {{"X": i < n, "Y": going}}, dtype="bool")

    def body(i, h, tok, done, buf, last):
        e = op("matmul_v2", {{"X": op("one_hot_v2", {{"X": tok}}, {{"depth": V}}), "Y": we}})
        h = op("matmul_v2", {{"X": h, "Y": wh}})
        h = op("elementwise_add", {{"X": op("elementwise_add", {{"X": h, "Y": e}}), "Y": x}})
        h = op("tanh", {{"X": h}})
        logits = op("matmul_v2", {{"X": h, "Y": wo}})
        tok = op("arg_max", {{"X": logits}}, {{"axis": 1, "dtype": 3, "keepdims": False,
                                              "flatten": False}}, dtype="int64")
        step = op("unsqueeze2", {{"X": op("softmax", {{"X": logits}}, {{"axis": -1}})}},
                  {{"axes": [1]}}, xshape=True)
        buf = paddle.static.setitem(buf * 1.0, (slice(None), slice(i, i + 1)), step)
        ended = op("equal", {{"X": tok, "Y": paddle.full([1], V - 1, "int64")}}, dtype="bool")
        stop = op("reduce_all", {{"X": ended}}, {{"dim": [0], "keep_dim": False,
                                                 "reduce_all": True}}, dtype="bool")
        return [i + 1, h, tok, stop_if_all_ended(stop, done), buf, logits]

    i, h, tok, done, buf, last = paddle.static.nn.while_loop(cond, body, start)
    out = buf[:, :i]
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
paddle.static.save_inference_model({prefix!r}, [x], [out, i, last], exe, program=main)
kinds = [o.type for b in main.blocks for o in b.ops] if LEGACY else [
    o.name() for o in main.global_block().ops] + [
    o.name() for o in main.global_block().ops if o.name() == "pd_op.while"
    for b in o.blocks() for o in b.ops]
print(kinds)
"""

# Paddle Inference with one line added on the IPU side (enable_ipu): each feed's outputs.
DECODE = """
import sys, numpy as np, paddle
{ipu}
import paddle.inference as paddle_infer
config = paddle_infer.Config({model!r}, {params!r})
config.disable_mkldnn()
{enable}
predictor = paddle_infer.create_predictor(config)
got = {{}}
for s in range(6):
    x = np.random.default_rng(s).random((1, 8)).astype("float32")
    handle = predictor.get_input_handle("x")
    handle.reshape(x.shape)
    handle.copy_from_cpu(x)
    predictor.run()
    for k, name in enumerate(predictor.get_output_names()):
        got[f"{{s}}_{{k}}"] = predictor.get_output_handle(name).copy_to_cpu()
np.savez({out!r}, **got)
"""


@pytest.mark.parametrize("ir", ["pir", "legacy"])
def test_a_decoder_with_a_branch_in_its_loop_cut_to_its_steps_gives_paddle_inferences_outputs(
    ir: str, tmp_path: object
) -> None:
    from pathlib import Path

    legacy = ir == "legacy"
    prefix = str(Path(str(tmp_path)) / "decoder")
    env = {"PADDLE_IPU_AUTOLOAD": "0", "FLAGS_enable_pir_api": "0" if legacy else "1"}
    proc = run_python(DECODER.format(legacy=legacy, prefix=prefix), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = proc.stdout.strip().splitlines()[-1]
    assert (
        ("conditional_block" in kinds and "select_input" in kinds)
        if legacy
        else ("pd_op.if" in kinds)
    )
    model = prefix + (".pdmodel" if legacy else ".json")
    outs = {}
    for side, ipu, enable in (("cpu", "", ""), ("ipu", "import paddle_ipu", "config.enable_ipu()")):
        out = str(Path(str(tmp_path)) / f"{side}.npz")
        script = DECODE.format(
            ipu=ipu, model=model, params=prefix + ".pdiparams", enable=enable, out=out
        )
        proc = run_python(script, {"PADDLE_IPU_AUTOLOAD": "0"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[side] = dict(np.load(out))
    cpu, ipu = outs["cpu"], outs["ipu"]
    steps = [int(cpu[f"{s}_1"][0]) for s in range(6)]
    assert len(set(steps)) > 1 and min(steps) < 8, steps  # the data ends the loop early
    for s in range(6):
        np.testing.assert_array_equal(ipu[f"{s}_1"], cpu[f"{s}_1"])
        assert ipu[f"{s}_0"].shape == cpu[f"{s}_0"].shape == (1, steps[s], 6)
        np.testing.assert_allclose(ipu[f"{s}_0"], cpu[f"{s}_0"], rtol=1e-5, atol=1e-6)
        assert ipu[f"{s}_2"].shape == cpu[f"{s}_2"].shape == (1, 6)
        np.testing.assert_allclose(ipu[f"{s}_2"], cpu[f"{s}_2"], rtol=1e-5, atol=1e-5)
