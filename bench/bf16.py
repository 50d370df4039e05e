"""The error of the host backend's bfloat16 (``host_precision="bfloat16"``) on the model
zoo, against Paddle's CPU executor, beside float32's.

    python bench/bf16.py [--models resnet18,mobilenet_v2,...] [--full]

Each model of tests/support/zoo_models.py (random weights, batch 1; the zoo tier's small
inputs, ``--full`` for 224 x 224) is compiled twice with ``IpuCompiledProgram``: in
float32 (the default engine) and with ``host_precision="bfloat16"`` (matmuls and
convolutions in bfloat16 on OpenVINO).  Per model: the largest absolute difference over
the largest reference magnitude, and whether the top-1 class (the argmax of the last
axis) of every row is the CPU's.  Random weights give near-ties no trained model has:
the trained OCR models' reading is measured by ``python bench/ocr_fp16.py --bf16``.
Needs the openvino extra and a CPU with AVX512-BF16 or AMX.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = (
    "resnet18,resnet50,vgg11,mobilenet_v2,mobilenet_v3_large,densenet121,squeezenet1_0,"
    "shufflenet_v2_x1_0,googlenet,inception_v3,lstm,gru,transformer,unet_bilinear_size"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--full", action="store_true", help="full input sizes")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    sys.path.insert(0, str(ROOT / "tests"))
    from support import zoo_models as Z

    print("| model | input | fp32 error | bf16 error | bf16 top-1 = CPU's |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        size = Z.VISION[name][2] if args.full and name in Z.VISION else None
        model = Z.build(name, size=size, batch=1)
        feed = model.feed(seed=0)
        ref = Z.run_cpu(model, feed)
        row = []
        for precision in ("", "bfloat16"):
            try:
                _, prog = Z.compile_ipu(model, precision=precision)
                got = Z.run_ipu(model, prog, feed)
                top1 = bool(np.array_equal(got.argmax(-1), ref.argmax(-1)))
                row.append((Z.rel_error(got, ref), top1))
            except Exception as exc:  # the table says what failed
                row.append((f"{type(exc).__name__}: {str(exc)[:60]}", None))
        (e32, _), (e16, top1) = row
        fmt = [format(e, ".1e") if isinstance(e, float) else e for e in (e32, e16)]
        print(f"| {name} | {list(model.x_shape)} | {fmt[0]} | {fmt[1]} | {top1} |", flush=True)


if __name__ == "__main__":
    main()
