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

import paddle_ipu  # noqa: F401
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
