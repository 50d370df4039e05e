"""The idioms of Paddle 2.x's IPU model-zoo scripts (BERT fine-tuning and pretraining
written for Paddle's in-tree IPU backend), one at a time, on the emulated IPU against
Paddle's CPU executor: manual sharding of constants, feeds taken by element count.
The whole script style is tested in test_ipu2x_bert_style.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

import paddle_ipu
from paddle_ipu.errors import FeedError

rng = np.random.default_rng(40)


def _strategy(**graph: Any) -> Any:
    s = paddle.static.IpuStrategy()
    s.set_graph_config(**graph)
    return s


def test_manual_shard_keeps_the_shapes_of_placed_constants() -> None:
    """OneHot's depth and a fused QKV split's sizes are constants placed on an IPU
    (``__ipu_number`` beside their value): shape inference still reads them."""
    with fresh_programs(seed=1) as (main, startup, _scope):
        seg = paddle.static.data("seg", [8], "int32")
        x = paddle.static.data("x", [8, 16], "float32")
        with paddle.static.ipu_shard_guard(index=0, stage=0):
            token_type = paddle.nn.functional.one_hot(seg, num_classes=2)
            table = paddle.create_parameter([2, 16], "float32")
            emb = paddle.matmul(token_type, table) + x
        with paddle.static.ipu_shard_guard(index=1, stage=1):
            qkv = paddle.matmul(emb, paddle.create_parameter([16, 48], "float32"))
            q, k, v = paddle.split(qkv, [16, 16, 16], axis=1)
            out = paddle.sum(q * k + v, axis=1)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        feed = {
            "seg": rng.integers(0, 2, [8]).astype(np.int32),
            "x": rng.standard_normal([8, 16]).astype(np.float32),
        }
        (want,) = exe.run(main, feed=feed, fetch_list=[out])
        strategy = _strategy(
            num_ipus=2, is_training=False, micro_batch_size=8, enable_manual_shard=True
        )
        prog = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy).compile(
            ["seg", "x"], [out]
        )
        (got,) = exe.run(prog, feed=feed, fetch_list=[out])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _flat_feed_program() -> tuple[Any, Any, Any, Any]:
    """Feeds declared as static_ipu declares them: ``[micro_batch * seq_len]``."""
    micro, seq = 2, 5
    ids = paddle.static.data("indices", [micro * seq], "int32")
    emb = paddle.nn.Embedding(11, 4)
    out = paddle.reshape(emb(ids), [micro, seq * 4])
    return ids, out, micro, seq


@pytest.mark.parametrize("bps", [1, 3])
def test_a_feed_is_taken_by_its_element_count(bps: int) -> None:
    """Declared ``[micro_batch * seq_len]``, fed ``[batch, seq_len]`` (batch =
    micro_batch * batches_per_step), as Paddle 2.x's IPU backend took it."""
    with fresh_programs(seed=2) as (main, startup, _scope):
        _, out, micro, seq = _flat_feed_program()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        batch = rng.integers(0, 11, [micro * bps, seq]).astype(np.int32)
        want = np.concatenate(
            [
                exe.run(
                    main,
                    feed={"indices": batch[i * micro : (i + 1) * micro].reshape(-1)},
                    fetch_list=[out],
                )[0]
                for i in range(bps)
            ]
        )
        strategy = _strategy(num_ipus=1, is_training=False, micro_batch_size=micro)
        strategy.set_pipelining_config(batches_per_step=bps)
        prog = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy).compile(
            ["indices"], [out]
        )
        (got,) = exe.run(prog, feed={"indices": batch}, fetch_list=[out])
        np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-6)
        # one element too many or too few: refused, naming the counts
        for bad in (batch[:, :-1], np.concatenate([batch, batch[:, :1]], axis=1)):
            with pytest.raises(FeedError, match=rf"'indices'.*any shape of {micro * seq * bps}"):
                exe.run(prog, feed={"indices": bad}, fetch_list=[out])


def _hinted_program() -> tuple[Any, Any]:
    """The hints static_ipu sets, on the operators it sets them on: a matmul's
    available memory (``qkv.block.ops[-1]``), a Linear's matmul (``ops[-2]``, before
    its bias add) and a serialised matmul (the MLM head's ``serialize_factor``)."""
    x = paddle.static.data("x", [4, 8], "float32")
    qkv = paddle.matmul(x, paddle.create_parameter([8, 24], "float32"))
    qkv.block.ops[-1]._set_attr("__available_memory", 0.28)
    ff = paddle.nn.Linear(24, 16)(qkv)
    ff.block.ops[-2]._set_attr("__available_memory", 0.5)
    out = paddle.matmul(ff, paddle.create_parameter([16, 10], "float32"))
    out.block.ops[-1]._set_attr("serialize_factor", 5)
    return x, out


def test_ipu_hints_on_pir_operations_reach_the_graph_and_change_no_result() -> None:
    import onnx

    from paddle_ipu.compiler import compile_program

    with fresh_programs(seed=3) as (main, startup, scope):
        x, out = _hinted_program()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        feed = {"x": rng.standard_normal([4, 8]).astype(np.float32)}
        (want,) = exe.run(main, feed=feed, fetch_list=[out])
        model = compile_program(main, [x], [out], scope=scope, micro_batch_size=4)
        strategy = _strategy(num_ipus=1, is_training=False, micro_batch_size=4)
        prog = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy).compile(["x"], [out])
        (got,) = exe.run(prog, feed=feed, fetch_list=[out])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    matmuls = [n for n in onnx.load_from_string(model.onnx).graph.node if n.op_type == "MatMul"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in matmuls]
    assert [a.get("__available_memory") for a in attrs] == pytest.approx([0.28, 0.5, None])
    assert attrs[2]["__serialize_matmul_mode"] == b"output_channels"
    assert (attrs[2]["__serialize_matmul_factor"], attrs[2]["__serialize_matmul_precision"]) == (
        5,
        1,
    )
    assert not any("__serialize_matmul_mode" in a for a in attrs[:2])


def test_ipu_hints_are_checked_where_they_are_set() -> None:
    from paddle_ipu.errors import NotSupportedError, OptionError

    with fresh_programs() as _:
        x = paddle.static.data("x", [4, 8], "float32")
        op = paddle.matmul(x, x, transpose_y=True).get_defining_op()
        with pytest.raises(OptionError, match=r"__available_memory.*\[0, 1\].*1\.5"):
            op._set_attr("__available_memory", 1.5)
        with pytest.raises(OptionError, match=r"serialize_factor.*>= 1"):
            op._set_attr("serialize_factor", 0)
        with pytest.raises(OptionError, match=r"serialize_mode.*output_channels"):
            op._set_attr("serialize_mode", "rows")
        with pytest.raises(NotSupportedError, match="float"):
            op._set_attr("alpha", 0.5)
        op._set_attr("serialize_mode", "reducing_dim")
        op._set_attr("my_flag", True)
        assert op.attrs()["serialize_mode"] == "reducing_dim" and op.attrs()["my_flag"] is True


def test_the_memory_report_reads_an_operators_own_available_memory() -> None:
    """The host records the hints where they change what it computes: the memory
    report's temporaries are bounded by the operator's own proportion."""
    from paddle_ipu.compiler import compile_program
    from paddle_ipu.compiler.memory import memory_report

    def temporaries(proportion: float) -> int:
        with fresh_programs(seed=4) as (main, startup, scope):
            x = paddle.static.data("x", [2048, 2048], "float32")
            out = paddle.matmul(x, x)
            if proportion:
                out.block.ops[-1]._set_attr("__available_memory", proportion)
            paddle.static.Executor(paddle.CPUPlace()).run(startup)
            model = compile_program(main, [x], [out], scope=scope, micro_batch_size=2048)
        report = memory_report(model, {"is_training": False})
        return next(p.bytes for p in report.ipus[0].parts if p.name == "temporaries")

    # 16 MiB of partials and 32 MiB of operands: above 1e-3 of the IPU's memory
    assert temporaries(1e-3) < temporaries(0.0)


def _nll_numpy(probs: np.ndarray, labels: np.ndarray, ignore: int | None) -> float:
    """PopART's Nll with Mean reduction (willow/src/popx/op/nllx.cpp), in numpy."""
    flat, lab = probs.reshape(-1, probs.shape[-1]), labels.reshape(-1).astype(np.int64)
    keep = np.ones(lab.shape, bool) if ignore is None else lab != ignore
    picked = flat[np.arange(lab.size), np.where(keep, lab, 0)]
    losses = -np.log(np.maximum(picked, 1e-7)) * keep
    return float(losses.sum() / max(keep.sum(), 1))


def test_custom_ops_compute_popart_semantics_on_the_emulated_ipu() -> None:
    ops = paddle_ipu.custom_ops
    with fresh_programs(seed=7) as (main, startup, _scope):
        x = paddle.static.data("x", [6, 8], "float32")
        y = paddle.static.data("y", [6], "int32")
        m = paddle.static.data("m", [2, 3], "int32")
        kept = paddle.nn.Linear(8, 5)
        frozen = paddle.nn.Linear(8, 5)
        logits = ops.checkpointoutput(kept(x)) + ops.detach(ops.identity(frozen(x)))
        probs = paddle.nn.functional.softmax(logits)
        start = ops.custom_nll_loss(probs, y, 1, "None", False)
        mlm_probs = paddle.reshape(probs, [2, 3, 5])
        masked = ops.custom_nll_loss(mlm_probs, m, 1, "-1", False)
        total = start + masked
        paddle.optimizer.SGD(0.5).minimize(total)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        strategy = _strategy(num_ipus=1, is_training=True, micro_batch_size=6)
        compiled = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy)
        prog = compiled.compile(["x", "y", "m"], [total, probs, start, masked])
        frozen_before = np.array(
            paddle.static.global_scope().find_var(frozen.weight.name).get_tensor()
        )
        feed = {
            "x": rng.standard_normal([6, 8]).astype(np.float32),
            "y": rng.integers(0, 5, [6]).astype(np.int32),
            "m": np.array([[1, -1, 4], [-1, -1, 0]], np.int32),
        }
        _, p, s, k = (np.asarray(v) for v in exe.run(prog, feed=feed, fetch_list=prog.fetch_names))
        compiled.weights_to_host()
        frozen_after = np.array(
            paddle.static.global_scope().find_var(frozen.weight.name).get_tensor()
        )
        kept_after = np.array(paddle.static.global_scope().find_var(kept.weight.name).get_tensor())
    assert float(s) == pytest.approx(_nll_numpy(p, feed["y"], None), rel=1e-5)
    assert float(k) == pytest.approx(_nll_numpy(p.reshape(2, 3, 5), feed["m"], -1), rel=1e-5)
    # detach: no gradient reaches the frozen branch; the kept one trains
    np.testing.assert_array_equal(frozen_after, frozen_before)
    assert not np.allclose(kept_after, frozen_after)


def test_a_users_custom_op_runs_its_registered_host_stand_in() -> None:
    """A PopART custom op of the user's (TiedGather-like) registered with a Paddle
    stand-in: the emulated IPU runs the stand-in, equal to the same program on the CPU;
    the graph PopART would get holds the op's node (tests/contract)."""
    gather = paddle_ipu.register_custom_op(
        "tied_gather_test", lambda w, idx: paddle.gather(w, idx), popart_op="TiedGather"
    )
    assert paddle_ipu.custom_ops.tied_gather_test is gather
    with fresh_programs(seed=8) as (main, startup, _scope):
        idx = paddle.static.data("idx", [5], "int32")
        table = paddle.create_parameter([7, 3], "float32")
        out = paddle.nn.functional.relu(gather(table, idx))
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        feed = {"idx": rng.integers(0, 7, [5]).astype(np.int32)}
        (want,) = exe.run(main, feed=feed, fetch_list=[out])
        strategy = _strategy(num_ipus=1, is_training=False, micro_batch_size=5)
        prog = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy).compile(["idx"], [out])
        (got,) = exe.run(prog, feed=feed, fetch_list=[out])
    np.testing.assert_array_equal(got, want)
