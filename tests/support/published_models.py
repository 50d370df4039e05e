"""Models Graphcore trained on IPUs, at the sizes and with the settings of their public
examples, as Paddle static programs for the memory report (tests/conformance/test_memory_report.py,
docs/without_ipu.md).

Sources (graphcore/examples):

- BERT pretraining, ``nlp/bert/pytorch/configs_pretraining.yml`` (commit 09b7c67):
  ``pretrain_large_128``: BERT-Large (24 layers, hidden 1024, 16 heads), sequence 128,
  micro-batch 8, 20 masked tokens, 4 IPUs per replica pipelined with
  ``layers_per_ipu: [3, 7, 7, 7]`` (the embeddings and 3 layers on the first IPU, which
  also holds the heads, tied to the embeddings), 4 replicas with replicated tensor
  sharding, float16 with half partials, LAMB with its state off chip, gradient
  accumulation 2048, recomputation of every layer.  ``pretrain_base_128``: BERT-Base
  (12 layers, hidden 768), micro-batch 32, ``layers_per_ipu: [0, 4, 4, 4]``.
- ResNet-50 training, ``vision/cnns/pytorch/train/configs.yml`` (commit 09b7c67):
  one IPU (``pipeline_splits: []``), micro-batch 18 of 224x224 images, float16 weights
  and optimizer state ("16.16"), half partials, SGD with momentum (one state tensor)
  on chip, gradient accumulation 57, recomputation at checkpoints.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from paddle_ipu import ipu_shard_guard


@dataclass
class Built:
    main: Any
    scope: Any
    feeds: list[str]
    loss: Any
    params: int


def _guard(index: int, stage: int, shard: bool) -> Any:
    return ipu_shard_guard(index=index, stage=stage) if shard else nullcontext()


def bert(
    *,
    layers: int,
    hidden: int,
    heads: int,
    batch: int,
    seq: int = 128,
    masked: int = 20,
    vocab: int = 30522,
    layers_per_ipu: list[int] | None = None,
) -> Built:
    """BERT pretraining (masked LM on ``masked`` tokens and next-sentence prediction)
    with LAMB; ``layers_per_ipu``: one pipeline stage per IPU, the heads a last stage
    on IPU 0 (with the embeddings they are tied to), as Graphcore's PopTorch BERT."""
    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    shard = layers_per_ipu is not None
    split = layers_per_ipu or [layers]
    stage_of_layer = [i for i, n in enumerate(split) for _ in range(n)]
    init = nn.initializer.Normal(std=0.02)
    with (
        paddle.static.program_guard(main, startup),
        paddle.static.scope_guard(scope),
        paddle.utils.unique_name.guard(),
    ):
        ids = paddle.static.data("input_ids", [batch, seq], "int64")
        segments = paddle.static.data("segment_ids", [batch, seq], "int64")
        positions = paddle.static.data("masked_positions", [batch, masked], "int64")
        labels = paddle.static.data("masked_labels", [batch, masked], "int64")
        nsp = paddle.static.data("nsp_labels", [batch, 1], "int64")
        word = nn.Embedding(vocab, hidden, weight_attr=paddle.ParamAttr(initializer=init))
        with _guard(0, 0, shard):
            pos = paddle.assign(np.arange(seq, dtype="int64")[None])
            x = word(ids) + nn.Embedding(512, hidden)(pos) + nn.Embedding(2, hidden)(segments)
            x = nn.LayerNorm(hidden)(x)
        for i in range(layers):
            stage = stage_of_layer[i]
            with _guard(stage, stage, shard):
                layer = nn.TransformerEncoderLayer(
                    hidden, heads, 4 * hidden, dropout=0.0, activation="gelu"
                )
                x = layer(x)
        with _guard(0, len(split), shard):
            picked = paddle.take_along_axis(
                x, positions.unsqueeze(-1).expand([batch, masked, hidden]), axis=1
            )
            h = nn.LayerNorm(hidden)(F.gelu(nn.Linear(hidden, hidden)(picked)))
            logits = paddle.matmul(h, word.weight, transpose_y=True)
            mlm = F.cross_entropy(logits.reshape([-1, vocab]), labels.reshape([-1, 1]))
            pooled = paddle.tanh(nn.Linear(hidden, hidden)(x[:, 0]))
            loss = mlm + F.cross_entropy(nn.Linear(hidden, 2)(pooled), nsp)
            paddle.optimizer.Lamb(learning_rate=0.006, lamb_weight_decay=0.01).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    params = sum(int(np.prod(p.shape)) for p in main.global_block().all_parameters())
    feeds = ["input_ids", "segment_ids", "masked_positions", "masked_labels", "nsp_labels"]
    return Built(main, scope, feeds, loss, params)


def resnet50(batch: int) -> Built:
    """ResNet-50 (paddle.vision's) on 224x224 images, cross entropy, SGD with momentum."""
    import paddle.vision.models as models

    paddle.enable_static()
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with (
        paddle.static.program_guard(main, startup),
        paddle.static.scope_guard(scope),
        paddle.utils.unique_name.guard(),
    ):
        x = paddle.static.data("x", [batch, 3, 224, 224], "float32")
        label = paddle.static.data("label", [batch, 1], "int64")
        loss = F.cross_entropy(models.resnet50(pretrained=False)(x), label)
        paddle.optimizer.Momentum(learning_rate=2.0, momentum=0.9).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    params = sum(int(np.prod(p.shape)) for p in main.global_block().all_parameters())
    return Built(main, scope, ["x", "label"], loss, params)
