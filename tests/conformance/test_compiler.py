"""compile_program: lowering PIR programs to ONNX, checked against Paddle's CPU run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import paddle
import paddle.nn.functional as F
import pytest

from paddle_ipu.compiler import (
    CompiledModel,
    compile_program,
    ipu_shard_guard,
    set_ipu_shard,
    supported_ops,
)
from paddle_ipu.compiler.compile import reader_for
from paddle_ipu.errors import CompileError, UnsupportedOpError

paddle.enable_static()

Built = tuple[Any, Any, list[Any], list[Any], dict[str, np.ndarray]]


def _build(fn: Callable[[], tuple[list[Any], list[Any]]], seed: int = 0) -> Built:
    main, start = paddle.static.Program(), paddle.static.Program()
    paddle.seed(seed)
    with paddle.static.program_guard(main, start):
        feeds, fetches = fn()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.static.Executor(paddle.CPUPlace()).run(start)
    rng = np.random.default_rng(seed)
    feed_arrays: dict[str, np.ndarray] = {}
    for v in feeds:
        shape = [4 if d < 0 else d for d in v.shape]
        name = v.get_defining_op().attrs()["name"]
        if "int" in str(v.dtype):
            feed_arrays[name] = rng.integers(0, 10, size=shape).astype("int64")
        else:
            feed_arrays[name] = rng.standard_normal(shape).astype("float32")
    return main, scope, feeds, fetches, feed_arrays


def _mlp() -> tuple[list[Any], list[Any]]:
    x = paddle.static.data("x", [-1, 16], "float32")
    h = F.relu(paddle.nn.Linear(16, 32)(x))
    out = paddle.nn.Linear(32, 4)(h)
    return [x], [out]


def _cnn() -> tuple[list[Any], list[Any]]:
    x = paddle.static.data("img", [-1, 3, 8, 8], "float32")
    y = paddle.static.data("label", [-1, 1], "int64")
    h = paddle.nn.Conv2D(3, 4, 3, padding=1)(x)
    h = F.relu(paddle.nn.BatchNorm2D(4)(h))
    h = F.max_pool2d(h, 2)
    logits = paddle.nn.Linear(64, 10)(paddle.flatten(h, 1))
    prob = F.softmax(logits)
    loss = F.cross_entropy(logits, y)  # reduction="mean": mean over axis=[]
    paddle.optimizer.SGD(0.1).minimize(loss)
    return [x, y], [prob, loss]


def _transformer() -> tuple[list[Any], list[Any]]:
    x = paddle.static.data("tokens", [-1, 6, 32], "float32")
    layer = paddle.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1)
    out = paddle.nn.TransformerEncoder(layer, 2)(x)
    return [x], [out]


_CACHE: dict[str, Built] = {}


def _get(kind: str) -> Built:
    if kind not in _CACHE:
        _CACHE[kind] = _build({"mlp": _mlp, "cnn": _cnn, "transformer": _transformer}[kind])
    return _CACHE[kind]


def _param_names(program: Any) -> set[str]:
    return {
        str(op.attrs()["parameter_name"])
        for op in program.global_block().ops
        if op.name() == "builtin.parameter"
    }


def _paddle_run(built: Built, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    main, scope, feeds, fetches, _ = built
    test = paddle.static.normalize_program(main, feeds, fetches)
    with paddle.static.scope_guard(scope):
        return list(paddle.static.Executor(paddle.CPUPlace()).run(test, feed=feed))


def _ort_run(cm: CompiledModel, feed: dict[str, np.ndarray], scope: Any) -> list[np.ndarray]:
    model = onnx.load_from_string(cm.onnx)
    # The executor writes weights by Paddle name: do it here from the scope.
    for init in model.graph.initializer:
        if init.name in cm.weights:
            value = np.array(scope.find_var(cm.weights[init.name]).get_tensor())
            init.CopyFrom(onnx.numpy_helper.from_array(value, init.name))
    # ONNX Runtime's fusions copy unknown node attributes onto fused nodes and then
    # reject them: PopART's placement attributes must go before ORT sees the graph.
    for node in model.graph.node:
        kept = [a for a in node.attribute if not a.name.startswith("__")]
        del node.attribute[:]
        node.attribute.extend(kept)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {spec.name: feed[spec.paddle_name] for spec in cm.inputs}
    return list(sess.run([o.name for o in cm.outputs], inputs))


@pytest.mark.parametrize("kind", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("mbs", [1, 4])
def test_matches_paddle(kind: str, mbs: int) -> None:
    built = _get(kind)
    main, scope, feeds, fetches, arrays = built
    cm = compile_program(main, feeds, fetches, scope=scope, micro_batch_size=mbs)
    feed = {k: v[:mbs] for k, v in arrays.items()}
    want = _paddle_run(built, feed)
    got = _ort_run(cm, feed, scope)
    assert len(got) == len(want) == len(cm.outputs)
    for spec, g, w in zip(cm.outputs, got, want):
        assert g.shape == w.shape == spec.shape
        assert g.dtype == np.dtype(spec.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    for spec, v in zip(cm.inputs, feeds):
        assert spec.shape[0] == mbs
        assert spec.shape[1:] == tuple(v.shape[1:])
    assert cm.micro_batch_size == mbs


def test_specs_and_weights() -> None:
    main, scope, _, fetches, _ = _get("cnn")
    cm = compile_program(main, ["img", "label"], fetches, scope=scope, micro_batch_size=4)
    assert [(s.name, s.dtype, s.shape, s.paddle_name) for s in cm.inputs] == [
        ("img", "float32", (4, 3, 8, 8), "img"),
        ("label", "int64", (4, 1), "label"),
    ]
    assert [(s.dtype, s.shape) for s in cm.outputs] == [("float32", (4, 10)), ("float32", ())]
    assert cm.outputs[0].name == "softmax_0"
    assert cm.outputs[1].name == "mean_0"
    params = _param_names(main)
    model = onnx.load_from_string(cm.onnx)
    inits = {i.name for i in model.graph.initializer}
    # Every parameter (incl. batch-norm statistics) is an initializer named after it.
    assert set(cm.weights) == params
    assert all(cm.weights[k] == k for k in cm.weights)
    assert params <= inits
    assert not any(n.op_type == "Constant" and n.output[0] in params for n in model.graph.node)
    # No backward or optimizer operator reaches the graph.
    assert not any(op.endswith("_grad") or op.endswith("sgd_") for op in cm.source_ops)
    onnx.checker.check_model(model)


def test_fetch_by_name_and_existing_fetch_op() -> None:
    main, scope, _, fetches, arrays = _get("mlp")
    params = sorted(_param_names(main))
    cm = compile_program(main, ["x"], [fetches[0], params[0], "x"], scope=scope)
    assert [o.paddle_name for o in cm.outputs][1:] == [params[0], "x"]
    got = _ort_run(cm, {"x": arrays["x"][:1]}, scope)
    np.testing.assert_array_equal(got[2], arrays["x"][:1])
    np.testing.assert_array_equal(got[1], np.array(scope.find_var(params[0]).get_tensor()))

    # A fetch op already in the program is found by its name.
    prog = main.clone()
    with paddle.static.program_guard(prog):
        out_value = next(
            op.result(0) for op in reversed(prog.global_block().ops) if op.name() == "pd_op.add"
        )
        paddle._pir_ops.fetch(out_value, "logits", 0).persistable = True
    cm2 = compile_program(prog, ["x"], ["logits"], scope=scope)
    assert cm2.outputs[0].name == "logits" and cm2.outputs[0].paddle_name == "logits"
    want = _paddle_run(_get("mlp"), {"x": arrays["x"][:1]})[0]
    np.testing.assert_allclose(_ort_run(cm2, {"x": arrays["x"][:1]}, scope)[0], want, rtol=1e-5)


def test_unsupported_ops_are_all_named() -> None:
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 4], "float32")
        h = paddle.lgamma(paddle.nn.Linear(4, 4)(x))
        return [x], [paddle.cumprod(h, 0) + paddle.erfinv(h)]

    main, scope, feeds, fetches, _ = _build(net)
    with pytest.raises(UnsupportedOpError) as info:
        compile_program(main, feeds, fetches, scope=scope)
    msg = str(info.value)
    for op in ("pd_op.lgamma", "pd_op.cumprod", "pd_op.erfinv"):
        assert op in msg
    assert "3 Paddle operator type(s)" in msg
    assert "float32[-1, 4]" in msg  # operands are described with their shapes
    assert "pd_op.lgamma#" in msg  # cumprod's operand is named by its producer
    assert "pd_op.matmul" not in msg.split("\n", 1)[0]


@pytest.mark.parametrize("opset", [0, 6, 22, "13", 13.0])
def test_bad_opset(opset: Any) -> None:
    main, scope, feeds, fetches, _ = _get("mlp")
    with pytest.raises(CompileError, match="opset"):
        compile_program(main, feeds, fetches, scope=scope, opset=opset)


def test_explicit_opset() -> None:
    main, scope, feeds, fetches, _ = _get("mlp")
    cm = compile_program(main, feeds, fetches, scope=scope, opset=11)
    assert cm.opset == 11
    assert onnx.load_from_string(cm.onnx).opset_import[0].version == 11


def test_converter_abort_is_isolated(tmp_path: Any) -> None:
    from paddle_ipu.compiler.lowering import export_onnx

    main, scope, feeds, fetches, _ = _get("mlp")
    fg = reader_for(main).read(main, feeds, fetches, scope)
    model, params = fg.write_inference_model(str(tmp_path))
    # Opset 30 makes the converter abort (SIGABRT); compile_program refuses it
    # up front, the isolation is what saves the process when a check is missed.
    with pytest.raises(CompileError, match="crashed \\(SIGABRT\\)"):
        export_onnx(model, params, 30, auto_upgrade=False, log_path=str(tmp_path / "log"))
    # The same files convert fine with a valid opset.
    assert onnx.load_from_string(
        export_onnx(model, params, 13, auto_upgrade=False, log_path=str(tmp_path / "log"))
    ).graph.node


def test_feed_errors() -> None:
    main, scope, _, fetches, _ = _get("mlp")
    with pytest.raises(CompileError, match="nope"):
        compile_program(main, ["nope"], fetches, scope=scope)
    with pytest.raises(CompileError, match="not in feed_list"):
        compile_program(main, [], fetches, scope=scope)
    with pytest.raises(CompileError, match="no fetch op"):
        compile_program(main, ["x"], ["missing"], scope=scope)


def test_unused_feed_kept_in_order() -> None:
    main, scope, _, fetches, _ = _get("cnn")
    cm = compile_program(main, ["label", "img"], [fetches[0]], scope=scope)
    assert [s.name for s in cm.inputs] == ["label", "img"]
    assert [i.name for i in onnx.load_from_string(cm.onnx).graph.input] == ["label", "img"]


def test_legacy_program_compiles_through_its_pir_translation() -> None:
    """A legacy-IR program compiles (compiler/legacy_reader.py): feeds, fetches by
    variable name, parameters and index ranges as for PIR."""
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [4, 8], "float32")
            ids = paddle.static.data("ids", [4, 1], "int64")
            emb = paddle.static.nn.embedding(ids, size=[10, 8])
            out = paddle.static.nn.fc(x + paddle.flatten(emb, 1), 3)
            paddle.static.Executor(paddle.CPUPlace()).run(startup)
        name = out.name
    cm = compile_program(main, ["x", "ids"], [name], scope=scope)
    assert [s.paddle_name for s in cm.outputs] == [name]
    assert cm.outputs[0].shape == (4, 3)
    assert cm.inputs[1].ranges and cm.inputs[1].ranges[0].high == 10
    assert len(cm.weights) == 3  # embedding table, fc weight and bias
    with pytest.raises(CompileError, match="not a variable"):
        compile_program(main, ["x"], ["no_such_var"], scope=scope)


def test_dump(tmp_path: Any) -> None:
    main, scope, feeds, fetches, _ = _get("mlp")
    path = tmp_path / "out" / "m.onnx"
    cm = compile_program(main, feeds, fetches, scope=scope, onnx_dump_path=str(path))
    assert path.read_bytes() == cm.onnx


def test_shards_on_nodes() -> None:
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 8], "float32")
        with ipu_shard_guard(index=0, stage=0):
            h = F.relu(paddle.nn.Linear(8, 8)(x))
        second = set_ipu_shard(paddle.nn.Linear(8, 8), index=1, stage=1)
        h = second(h)
        with ipu_shard_guard(index=1, stage=2):
            out = F.softmax(h)
        return [x], [out]

    main, scope, feeds, fetches, arrays = _build(net)
    plain = compile_program(main, feeds, fetches, scope=scope)
    assert plain.shards == {}
    cm = compile_program(
        main, feeds, fetches, scope=scope, enable_manual_shard=True, enable_pipelining=True
    )
    model = onnx.load_from_string(cm.onnx)
    by_type: dict[str, list[tuple[int, int]]] = {}
    for node in model.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        if node.op_type in ("MatMul", "Relu", "Softmax"):
            by_type.setdefault(node.op_type, []).append(
                (attrs["__ipu_number"], attrs["__pipeline_stage"])
            )
            spec = cm.shards[node.name]
            assert (spec.ipu_index, spec.ipu_stage) == by_type[node.op_type][-1]
    assert by_type == {"MatMul": [(0, 0), (1, 1)], "Relu": [(0, 0)], "Softmax": [(1, 2)]}
    # Annotated graphs still run the same.
    got = _ort_run(cm, {"x": arrays["x"][:1]}, scope)
    want = _ort_run(plain, {"x": arrays["x"][:1]}, scope)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)

    index_only = compile_program(main, feeds, fetches, scope=scope, enable_manual_shard=True)
    assert {s.ipu_stage for s in index_only.shards.values()} == {-1}


def test_supported_ops() -> None:
    ops = supported_ops()
    assert ops == sorted(ops)
    for name in ("conv2d", "matmul", "mean", "softmax", "batch_norm_", "layer_norm"):
        assert name in ops
    assert "lgamma" not in ops


def _wide_mlp() -> tuple[list[Any], list[Any]]:
    x = paddle.static.data("x", [-1, 64], "float32")
    h = F.relu(paddle.nn.Linear(64, 256)(x))  # 16384 weights: a placeholder
    out = paddle.nn.Linear(256, 3)(h)  # 768 weights and the biases: sent as they are
    return [x], [out]


def test_big_weights_reach_the_converter_as_placeholders(monkeypatch: Any) -> None:
    """The converter's parameter file holds one element for each big float weight,
    and the compiled model still computes Paddle's numbers from the scope's weights."""
    import os

    import paddle_ipu.compiler.compile as C

    sizes: list[int] = []
    convert = C.export_onnx

    def recording(model: str, params: str, *args: Any, **kwargs: Any) -> bytes:
        sizes.append(os.path.getsize(params))
        return convert(model, params, *args, **kwargs)

    monkeypatch.setattr(C, "export_onnx", recording)
    built = _build(_wide_mlp)
    main, scope, feeds, fetches, arrays = built
    weight_bytes = sum(np.array(scope.find_var(n).get_tensor()).nbytes for n in _param_names(main))
    cm = compile_program(main, feeds, fetches, scope=scope, micro_batch_size=4)
    assert len(sizes) == 1  # converted once: every placeholder came back unchanged
    assert sizes[0] < weight_bytes - 16384 * 4 + 1024
    model = onnx.load_from_string(cm.onnx)
    dims = {i.name: tuple(i.dims) for i in model.graph.initializer}
    for name in _param_names(main):
        assert dims[name] == tuple(np.array(scope.find_var(name).get_tensor()).shape)
    got = _ort_run(cm, arrays, scope)
    np.testing.assert_allclose(got[0], _paddle_run(built, arrays)[0], rtol=1e-5, atol=1e-6)


def test_a_placeholder_the_converter_changed_means_converting_again(monkeypatch: Any) -> None:
    import paddle_ipu.compiler.compile as C

    calls: list[frozenset[str]] = []
    convert = C._convert

    def recording(fg: Any, *args: Any) -> Any:
        calls.append(args[-1])
        return convert(fg, *args)

    monkeypatch.setattr(C, "_convert", recording)
    monkeypatch.setattr(C, "_restore_placeholders", lambda *a: False)
    built = _build(_wide_mlp)
    main, scope, feeds, fetches, arrays = built
    cm = compile_program(main, feeds, fetches, scope=scope, micro_batch_size=4)
    assert len(calls) == 2 and calls[0] and calls[1] == frozenset()
    got = _ort_run(cm, arrays, scope)
    np.testing.assert_allclose(got[0], _paddle_run(built, arrays)[0], rtol=1e-5, atol=1e-6)


def _graph_with(nodes: list[Any]) -> Any:
    from onnx import helper

    return helper.make_model(helper.make_graph(nodes, "g", [], []))


def _constant(name: str, dims: tuple[int, ...], dtype: int = onnx.TensorProto.FLOAT) -> Any:
    from onnx import helper

    value = onnx.TensorProto()
    value.name = name
    value.dims.extend(dims)
    value.data_type = dtype
    return helper.make_node("Constant", [], [name], value=value)


@pytest.mark.parametrize(
    "nodes",
    [
        [_constant("w", (1, 1, 1))],  # another rank
        [_constant("w", (1, 1), onnx.TensorProto.DOUBLE)],  # another dtype
        [_constant("w", (4, 1))],  # another shape
        [],  # gone (folded away)
        [_constant("w", (1, 1)), _constant("w", (1, 1))],  # twice
        [onnx.helper.make_node("Identity", ["v"], ["w"])],  # made by another op
    ],
    ids=["rank", "dtype", "shape", "missing", "twice", "not-a-constant"],
)
def test_placeholders_not_carried_through_unchanged_are_refused(nodes: list[Any]) -> None:
    from paddle_ipu.compiler.compile import _restore_placeholders

    model = _graph_with(nodes)
    before = model.SerializeToString()
    params = {"w": ((4, 8), "float32")}
    assert not _restore_placeholders(model, params, frozenset(params))
    assert model.SerializeToString() == before


def test_placeholders_get_their_declared_shape() -> None:
    from paddle_ipu.compiler.compile import _restore_placeholders

    model = _graph_with([_constant("w", (1, 1)), _constant("b", (8,))])
    params = {"w": ((4, 8), "float32"), "b": ((8,), "float32")}
    assert _restore_placeholders(model, params, frozenset({"w"}))
    dims = {n.output[0]: tuple(n.attribute[0].t.dims) for n in model.graph.node}
    assert dims == {"w": (4, 8), "b": (8,)}


def _matches(net: Callable[[], tuple[list[Any], list[Any]]], mbs: int = 3) -> CompiledModel:
    """Compile ``net`` at micro-batch ``mbs`` (its -1 batch) and compare with Paddle's run."""
    built = _build(net)
    main, scope, feeds, fetches, arrays = built
    cm = compile_program(main, feeds, fetches, scope=scope, micro_batch_size=mbs)
    feed = {k: v[:mbs] for k, v in arrays.items()}
    for g, w in zip(_ort_run(cm, feed, scope), _paddle_run(built, feed)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return cm


def test_a_shape_operand_computed_from_a_feeds_values_is_refused_before_conversion(
    monkeypatch: Any,
) -> None:
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 4], "float32")
        n = paddle.static.data("n", [2], "int64")
        return [x, n], [paddle.tile(x, n * 2) + 1.0]

    main, scope, feeds, fetches, _ = _build(net)
    from paddle_ipu.compiler import compile as compile_module

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the converter ran")

    monkeypatch.setattr(compile_module, "_convert", never)
    with pytest.raises(UnsupportedOpError) as info:
        compile_program(main, feeds, fetches, scope=scope)
    msg = str(info.value)
    assert "pd_op.tile" in msg and "operand 1" in msg and "feed 'n'" in msg
    assert msg.count("is computed from the values") == 1  # the tile only, not the scale


def test_shapes_computed_from_a_feeds_shape_are_static_at_compile_time() -> None:
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 6], "float32")
        rows = paddle.shape(x)[0]
        # a reshape target, a tile's repeats and a range sized by the batch
        y = paddle.reshape(x, [rows * 2, 3]) + paddle.arange(3, dtype="float32")
        t = paddle.tile(x, paddle.shape(x)[:1] // rows * 2)
        m = paddle.arange(0, rows, dtype="float32")
        return [x], [y, t, paddle.unsqueeze(m, 1) * x]

    cm = _matches(net, mbs=3)
    assert [s.shape for s in cm.outputs] == [(6, 3), (3, 12), (3, 6)]


def test_shape_arithmetic_folds_until_nothing_changes() -> None:
    # Each channel shuffle reshapes with a target read off the previous result's
    # shape: one more round of folding per shuffle (PP-HumanSeg's backbone).
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 8, 4, 4], "float32")
        h = x
        for _ in range(12):
            n, c, hh, ww = (paddle.shape(h)[i] for i in range(4))
            h = paddle.reshape(h, paddle.stack([n, c // 2, paddle.full([], 2, "int64"), hh, ww]))
            h = paddle.transpose(h, [0, 2, 1, 3, 4])
            h = paddle.reshape(h, paddle.stack([n, c, hh, ww]))
        return [x], [F.relu(h)]

    cm = _matches(net, mbs=2)
    assert cm.outputs[0].shape == (2, 8, 4, 4)


def test_the_shape_of_a_constant_folds() -> None:
    # A Llama mask: Expand(arange, Max(.., Shape(arange))): a Shape of a constant.
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 5], "float32")
        r = paddle.arange(5, dtype="float32")
        return [x], [x + paddle.expand(r, paddle.concat([paddle.shape(x)[:1], paddle.shape(r)]))]

    _matches(net)


def test_set_value_on_an_axis_of_unknown_size() -> None:
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 5], "float32")
        b = paddle.static.data("b", [-1, 5], "float32")
        y = paddle.static.setitem(x * 1.0, (slice(1, None), slice(0, 2)), 9.0)
        z = paddle.static.setitem(b > 0, (slice(-2, None, 1), 3), True)
        w = paddle.static.setitem(x * 1.0, (slice(0, None, 2),), -1.0)
        return [x, b], [y, paddle.cast(z, "float32"), w]

    for mbs in (1, 4):
        _matches(net, mbs=mbs)


def test_repeat_interleave_on_axes_of_unknown_size() -> None:
    def net() -> tuple[list[Any], list[Any]]:
        x = paddle.static.data("x", [-1, 3, 4], "float32")
        return [x], [paddle.repeat_interleave(x, 2, axis=0), paddle.repeat_interleave(x, 3, 2)]

    cm = _matches(net, mbs=2)
    assert [s.shape for s in cm.outputs] == [(4, 3, 4), (2, 3, 12)]
