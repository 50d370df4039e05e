"""How far float16 (or bfloat16) moves rapidocr-paddle's OCR pipeline, against how far
the CPU's own reading moves under input noise of one grey level.

    python bench/ocr_fp16.py [--seeds 8] [--black-list OP,OP ...] [--float64] [--bf16]

The pipeline is the package's ``RapidOCR`` (PP-OCRv4 det and rec, the mobile v2
direction classifier, trained) on the twelve rendered images of
tests/conformance/trained/images.py, three ways:

- on the CPU (Paddle Inference, as the package runs it): the reference;
- on the CPU, each image with noise of -1, 0 or +1 grey level per pixel (``--seeds``
  draws): how stable the reference's own text is;
- ported with ``enable_ipu()`` and ``set_ipu_config(ipu_enable_fp16=True)``: float16 as
  the IPU computes it (``--black-list``: these Paddle operators in float32, through
  ``exp_disable_mixed_precision_ops``); with ``--bf16``, instead,
  ``enable_onednn_bfloat16()``: the host backend's bfloat16 for CPU serving (matmuls and
  convolutions in bfloat16 on OpenVINO; needs the openvino extra too).

Per image: whether the text is the CPU's, in how many of the noise draws the CPU's text
changes, and the detector's probability map against the CPU's: the pixels that cross the
package's binarisation threshold (0.3), float16 against the median over the noise
draws.  ``--float64`` also runs the detector in float64 on Paddle's CPU kernels (its
legacy program with every float32 variable retyped) and says whether the pipeline's
text is then the CPU's.  Needs the extra: pip install 'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))


def _pipeline(**ipu: Any) -> Any:
    import ocr

    if ipu:
        black = ipu.pop("black_list", None)
        with _ported(black, **ipu):
            pipeline = ocr.new_pipeline()
    else:
        pipeline = ocr.new_pipeline()
    return ocr.recording(pipeline)


def _ported(black: list[str] | None, **ipu: Any) -> Any:
    import types

    import paddle.inference as paddle_infer
    from rapidocr_paddle.utils import infer_engine

    import paddle_ipu  # noqa: F401

    bf16 = ipu.pop("bf16", False)

    class Port:
        def __enter__(self) -> None:
            def create_predictor(config: Any) -> Any:
                config.enable_ipu()
                config.set_ipu_config(**ipu)
                if bf16:
                    config.enable_onednn_bfloat16()
                if black:
                    config.exp_disable_mixed_precision_ops(set(black))
                return paddle_infer.create_predictor(config)

            self.saved = infer_engine.inference
            infer_engine.inference = types.SimpleNamespace(
                Config=paddle_infer.Config, create_predictor=create_predictor
            )

        def __exit__(self, *exc: Any) -> None:
            infer_engine.inference = self.saved

    return Port()


def _float64_texts(pictures: list[np.ndarray]) -> list[str]:
    """The pipeline's texts with its detector run in float64 (a child process: the
    legacy program needs PIR off before Paddle is imported)."""
    import json
    import subprocess

    child = r"""
import json, os, sys
os.environ["FLAGS_enable_pir_api"] = "0"
import numpy as np, paddle
from paddle.base import core
sys.path.insert(0, TRAINED)
import images, ocr
paddle.enable_static()
exe = paddle.static.Executor(paddle.CPUPlace())
scope = paddle.static.Scope()
FP32, FP64 = core.VarDesc.VarType.FP32, core.VarDesc.VarType.FP64
with paddle.static.scope_guard(scope):
    prog, feeds, fetches = paddle.static.load_inference_model(ocr.model_prefix("det"), exe)
    for name, var in prog.global_block().vars.items():
        if var.desc.type() == core.VarDesc.VarType.LOD_TENSOR and var.dtype == FP32:
            var.desc.set_dtype(FP64)
            held = scope.find_var(name)
            if var.persistable and held is not None:
                tensor = held.get_tensor()
                tensor.set(np.array(tensor).astype(np.float64), paddle.CPUPlace())
def det64(image):
    with paddle.static.scope_guard(scope):
        out = exe.run(prog, feed={feeds[0]: image.astype(np.float64)}, fetch_list=fetches)
    assert np.asarray(out[0]).dtype == np.float64
    return [np.asarray(o).astype(np.float32) for o in out]
pipeline = ocr.new_pipeline()
pipeline.text_det.infer = det64
texts = [" ".join(l.text for l in ocr.read(pipeline, t.image)) for t in images.render_all()]
print(json.dumps(texts))
""".replace("TRAINED", repr(str(ROOT / "tests" / "conformance" / "trained")))
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    texts = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(texts) == len(pictures)
    return list(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--black-list", default="", help="Paddle operators kept in float32")
    parser.add_argument("--float64", action="store_true")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 instead of float16")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    import images
    import ocr

    pictures = [t.image for t in images.render_all()]
    cpu = _pipeline()
    low = "bfloat16" if args.bf16 else "float16"
    if args.bf16:
        fp16 = _pipeline(bf16=True)
    else:
        black = [b for b in args.black_list.split(",") if b]
        fp16 = _pipeline(ipu_enable_fp16=True, black_list=black)
    texts64 = _float64_texts(pictures) if args.float64 else None
    print(
        f"| image | CPU text | {low} text | CPU text changed by noise | pixels across 0.3: "
        f"{low} | noise (median) |" + (" float64 text |" if texts64 else "")
    )
    print("|---|---|---|---|---|---|" + ("---|" if texts64 else ""))
    same = quieter = 0
    for index, picture in enumerate(pictures):
        text, reference = ocr.read_with_map(cpu, picture)
        got, half = ocr.read_with_map(fp16, picture)
        changed, crossed = 0, []
        for seed in range(args.seeds):
            noisy_text, noisy = ocr.read_with_map(cpu, ocr.noisy(picture, seed))
            changed += noisy_text != text
            crossed.append(ocr.crossed(noisy, reference))
        moved = ocr.crossed(half, reference)
        noise = statistics.median(crossed)
        same += got == text
        quieter += moved <= noise
        row = (
            f"| {index} | {text} | {'same' if got == text else got} | "
            f"{changed} of {args.seeds} | {moved} | {noise:g} |"
        )
        if texts64:
            row += f" {'same' if texts64[index] == text else texts64[index]} |"
        print(row, flush=True)
    print(
        f"\n{low} reads the CPU's text on {same} of {len(pictures)} images; its map "
        f"crosses the threshold at no more pixels than one grey level of noise does on "
        f"{quieter} of {len(pictures)}"
    )


if __name__ == "__main__":
    main()
