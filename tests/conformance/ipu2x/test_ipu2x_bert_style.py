"""A Paddle 3 script in the style of Paddle 2.x's IPU BERT scripts (fine-tuning and
pretraining written for Paddle's in-tree IPU backend), BERT-small sized, with all of
their idioms at once: the encoder layers sharded over two IPUs (``ipu_shard_guard`` +
``enable_manual_shard``), the embeddings a gather of a transposed table and a one-hot
segment matmul, a fused QKV matmul split in three, the custom ops (``detach`` on the
attention mask, ``checkpointoutput`` between layers, ``custom_nll_loss`` with and
without an ignored label), IPU hints set with ``op._set_attr`` (``__available_memory``
on the matmuls, ``serialize_factor`` on the MLM head), feeds declared ``[micro_batch *
seq_len]`` and fed ``[batch, seq_len]``, the no-bias Adam (PopART's AdamNoBias),
float16 with float16 partials.  Oracle: the same program on Paddle's CPU executor
(the first step's loss), and the loss falling on new data each step."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

import paddle_ipu

VOCAB, HIDDEN, HEADS, LAYERS, SEQ, MICRO, PRED = 40, 32, 2, 2, 12, 4, 3
ops = paddle_ipu.custom_ops


def _data() -> list[Any]:
    flat = [MICRO * SEQ]
    return [
        paddle.static.data("indices", flat, "int32"),
        paddle.static.data("segments", flat, "int32"),
        paddle.static.data("positions", flat, "int32"),
        paddle.static.data("input_mask", [MICRO, 1, 1, SEQ], "float32"),
        paddle.static.data("masked_lm_ids", [MICRO, PRED], "int32"),
        paddle.static.data("next_sentence_labels", [MICRO], "int32"),
    ]


def _param(shape: list[int]) -> Any:
    return paddle.create_parameter(
        shape, "float32", default_initializer=paddle.nn.initializer.Normal(std=0.3)
    )


def _encoder(indices: Any, segments: Any, positions: Any, mask: Any) -> tuple[Any, Any]:
    with paddle.static.ipu_shard_guard(index=0, stage=0):
        word = _param([HIDDEN, VOCAB])
        emb = paddle.gather(paddle.transpose(word, [1, 0]), indices, axis=0)
        emb = emb + paddle.nn.Embedding(SEQ, HIDDEN)(positions)
        token_type = paddle.nn.functional.one_hot(segments, num_classes=2)
        emb = emb + paddle.matmul(token_type, _param([2, HIDDEN]))
        h = paddle.nn.LayerNorm(HIDDEN)(emb)
        mask = ops.detach(mask)
    for layer in range(LAYERS):
        with paddle.static.ipu_shard_guard(index=layer, stage=layer):
            qkv = paddle.matmul(h, paddle.concat([_param([HIDDEN, HIDDEN]) for _ in "qkv"], 1))
            qkv.block.ops[-1]._set_attr("__available_memory", 0.28)
            q, k, v = paddle.split(qkv, [HIDDEN, HIDDEN, HIDDEN], axis=1)
            shape = [-1, SEQ, HEADS, HIDDEN // HEADS]
            q = paddle.transpose(paddle.reshape(q, shape), [0, 2, 1, 3])
            k = paddle.transpose(paddle.reshape(k, shape), [0, 2, 3, 1])
            v = paddle.transpose(paddle.reshape(v, shape), [0, 2, 1, 3])
            scores = paddle.matmul(q, k) * (1.0 / np.sqrt(HIDDEN // HEADS)) + mask
            ctx = paddle.matmul(paddle.nn.functional.softmax(scores), v)
            ctx = paddle.reshape(paddle.transpose(ctx, [0, 2, 1, 3]), [-1, HIDDEN])
            h = paddle.nn.LayerNorm(HIDDEN)(h + paddle.nn.Linear(HIDDEN, HIDDEN)(ctx))
            ff = paddle.nn.Linear(HIDDEN, 2 * HIDDEN)(h)
            ff.block.ops[-2]._set_attr("__available_memory", 0.28)
            ff = paddle.nn.Linear(2 * HIDDEN, HIDDEN)(paddle.nn.functional.gelu(ff, True))
            h = paddle.nn.LayerNorm(HIDDEN)(h + ff)
            if layer < LAYERS - 1:
                h = ops.checkpointoutput(h)
    return h, word


def _heads(h: Any, word: Any, mlm_ids: Any, nsp_labels: Any) -> tuple[Any, Any, Any]:
    with paddle.static.ipu_shard_guard(index=LAYERS - 1, stage=LAYERS - 1):
        seq = paddle.reshape(h, [-1, SEQ, HIDDEN])
        masked = paddle.reshape(paddle.slice(seq, [1], [0], [PRED]), [-1, HIDDEN])
        logits = paddle.matmul(masked, word)
        logits.block.ops[-1]._set_attr("serialize_factor", 2)
        probs = paddle.nn.functional.softmax(paddle.reshape(logits, [-1, PRED, VOCAB]))
        mlm_loss = ops.custom_nll_loss(probs, mlm_ids, 1, "-1", False)
        pooled = paddle.tanh(paddle.nn.Linear(HIDDEN, HIDDEN)(seq[:, PRED, :]))
        nsp = paddle.nn.functional.softmax(paddle.nn.Linear(HIDDEN, 2)(pooled))
        nsp_loss = ops.custom_nll_loss(nsp, nsp_labels, 1, "None", False)
        return mlm_loss + nsp_loss, mlm_loss, nsp_loss


def _batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A task the model can learn: the masked tokens are the first PRED input tokens
    (which the model sees), the next-sentence label is whether the first token is even;
    a third of the MLM labels are ignored (-1)."""
    tokens = rng.integers(0, VOCAB, [MICRO, SEQ]).astype(np.int32)
    lm = tokens[:, :PRED].copy()
    lm[rng.random(lm.shape) < 0.33] = -1
    lengths = rng.integers(SEQ // 2, SEQ + 1, [MICRO])
    mask = np.where(np.arange(SEQ)[None, :] < lengths[:, None], 0.0, -1000.0)
    return {
        "indices": tokens,  # [batch, seq_len]: taken by its element count
        "segments": (np.arange(SEQ)[None, :] >= SEQ // 2).repeat(MICRO, 0).astype(np.int32),
        "positions": np.tile(np.arange(SEQ, dtype=np.int32), (MICRO, 1)),
        "input_mask": mask.reshape(MICRO, 1, 1, SEQ).astype(np.float32),
        "masked_lm_ids": lm,
        "next_sentence_labels": (tokens[:, 0] % 2).astype(np.int32),
    }


def _cpu_feed(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds in their declared shapes (Paddle's CPU executor takes them as given)."""
    flat = ("indices", "segments", "positions")
    return {k: v.reshape(-1) if k in flat else v for k, v in batch.items()}


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16_half_partials"])
def test_a_static_ipu_style_bert_trains_on_the_emulated_ipu(fp16: bool) -> None:
    rng = np.random.default_rng(40)
    batches = [_batch(rng) for _ in range(30)]
    with fresh_programs(seed=40) as (main, startup, _scope):
        indices, segments, positions, mask, mlm_ids, nsp_labels = _data()
        h, word = _encoder(indices, segments, positions, mask)
        total, mlm_loss, nsp_loss = _heads(h, word, mlm_ids, nsp_labels)
        paddle.optimizer.Adam(learning_rate=0.001, epsilon=1e-6).minimize(total)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        state = {name: np.array(value) for name, value in main.state_dict().items()}
        (cpu_first,) = exe.run(main, feed=_cpu_feed(batches[0]), fetch_list=[total])
        paddle.static.set_program_state(main, state)

        strategy = paddle.static.IpuStrategy()
        strategy.set_graph_config(
            num_ipus=2, is_training=True, micro_batch_size=MICRO, enable_manual_shard=True
        )
        options: dict[str, Any] = {"use_no_bias_optimizer": True}
        if fp16:
            strategy.set_precision_config(enable_fp16=True)
            options["enable_half_partial"] = True
        strategy.set_options(options)
        feeds = [
            "indices", "segments", "positions", "input_mask", "masked_lm_ids",
            "next_sentence_labels",
        ]  # fmt: skip
        prog = paddle.static.IpuCompiledProgram(main, ipu_strategy=strategy).compile(
            feeds, [total.name, mlm_loss.name, nsp_loss.name]
        )
        ipu_exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
        losses = [
            float(np.asarray(ipu_exe.run(prog, feed=b, fetch_list=prog.fetch_names)[0]))
            for b in batches
        ]
    # float32: the CPU's loss to float32 rounding; float16 (every result rounded, float16
    # partials): within 1e-3 of it, relative
    assert losses[0] == pytest.approx(float(np.asarray(cpu_first)), rel=1e-3 if fp16 else 1e-5)
    # falling on new data each step: the last five well below the first five
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
