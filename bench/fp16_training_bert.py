"""An emulated float16 training step of BERT-base on the host, against the float32 step.

    python bench/fp16_training_bert.py [--layers 12] [--seq 128] [--steps 4]
        [--variants fp32,fp16,fp16_sr,fp16_half,fp16_paddle_ops]

A BERT-base encoder (``paddle.nn.TransformerEncoder``: hidden 768, 12 heads, feed-forward
3072, a 30,522-token embedding), micro-batch 1, Adam, compiled with
``IpuCompiledProgram`` for the host backend; each variant in a fresh process:

- ``fp32``: float32;
- ``fp16``: ``enable_fp16``: every result of the gradient program rounded to float16
  (the host's rounding operator, csrc/ops);
- ``fp16_sr``: fp16 with ``enable_stochastic_rounding``;
- ``fp16_half``: fp16 with ``enable_half_partial`` (float16 matmul partials);
- ``fp16_paddle_ops``: fp16 with the rounding spelt in Paddle's own operators (what the
  host did before its rounding operator: 5 operators per rounding, 20 stochastic).

Printed per variant: the compile, the first step (Paddle's executor prepares the
gradient program in it) and the median of the later steps, in seconds, and the ratio of
the later steps to fp32's.  The machine's other load moves every number: compare
variants of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = ("fp32", "fp16", "fp16_sr", "fp16_half", "fp16_paddle_ops")


def _one(variant: str, layers: int, seq: int, steps: int) -> dict[str, float]:
    import numpy as np
    import paddle

    import paddle_ipu

    paddle.enable_static()
    if variant == "fp16_paddle_ops":
        from paddle_ipu import device

        device._operators = []  # the rounding in Paddle's operators
    hidden, vocab = 768, 30522
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        ids = paddle.static.data("ids", [1, seq], "int64")
        labels = paddle.static.data("labels", [1, seq], "int64")
        h = paddle.nn.Embedding(vocab, hidden)(ids)
        layer = paddle.nn.TransformerEncoderLayer(hidden, 12, 4 * hidden, dropout=0.0)
        h = paddle.nn.TransformerEncoder(layer, layers)(h)
        logits = paddle.nn.Linear(hidden, 2)(h)
        loss = paddle.nn.functional.cross_entropy(logits, labels.unsqueeze(-1)).mean()
        paddle.optimizer.Adam(1e-4).minimize(loss)
    paddle.static.Executor(paddle.CPUPlace()).run(startup)
    strategy = paddle_ipu.IpuStrategy()
    strategy.set_graph_config(num_ipus=1, is_training=True, micro_batch_size=1)
    if variant != "fp32":
        strategy.set_precision_config(enable_fp16=True)
    if variant == "fp16_sr":
        strategy.set_options({"enable_stochastic_rounding": True, "random_seed": 1})
    if variant == "fp16_half":
        strategy.set_options({"enable_half_partial": True})
    start = time.perf_counter()
    prog = paddle_ipu.IpuCompiledProgram(main, ipu_strategy=strategy).compile(
        ["ids", "labels"], [loss]
    )
    compile_s = time.perf_counter() - start
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    rng = np.random.default_rng(0)
    times = []
    for _ in range(steps):
        feed = {
            "ids": rng.integers(0, vocab, [1, seq]),
            "labels": rng.integers(0, 2, [1, seq]),
        }
        start = time.perf_counter()
        exe.run(prog, feed=feed, fetch_list=prog.fetch_names)
        times.append(time.perf_counter() - start)
    return {
        "compile": compile_s,
        "first": times[0],
        "later": statistics.median(times[1:]) if len(times) > 1 else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--one", default="")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.layers, args.seq, args.steps)))
        return
    rows = {}
    for variant in args.variants.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--one", variant, "--layers", str(args.layers),
             "--seq", str(args.seq), "--steps", str(args.steps)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    base = rows.get("fp32", {}).get("later")
    print(f"BERT-base-shaped encoder, {args.layers} layers, sequence {args.seq}, micro-batch 1")
    print("| variant | compile s | first step s | later steps s | later / fp32 |")
    print("|---|---|---|---|---|")
    for variant, r in rows.items():
        ratio = f"{r['later'] / base:.2f}x" if base else "-"
        print(f"| {variant} | {r['compile']:.1f} | {r['first']:.1f} | {r['later']:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
