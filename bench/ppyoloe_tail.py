"""PP-YOLOE from PaddleDetection's own code, exported with NMS, on paddle-ipu's host tail.

Builds a PP-YOLOE (PaddleDetection 2.6's ``CSPResNet``, ``CustomCSPPAN`` and
``PPYOLOEHead`` with its ``MultiClassNMS``: width 0.50, depth 0.33, 80 classes, NMS score
threshold 0.01, top 1000, keep 300, IoU 0.7) with random weights -- the class biases
drawn from N(``--bias``, 2) so that boxes pass the threshold --, exports it as
PaddleDetection's exporter does (the RepVGG branches folded by ``convert_to_deploy``, a
fixed ``eval_size`` of 320, ``paddle.jit.to_static`` over image, im_shape and
scale_factor, saved with the inputs the program reads), in a process without paddle-ipu,
and runs it through Paddle Inference on the CPU (oneDNN off) and through
``paddle_ipu.inference``: prints the boxes per image, whether labels, scores and boxes
agree, and the medians of a whole run and of the host tail in it.

PaddleDetection 2.6 builds ``multiclass_nms3`` as a legacy-IR operator, which Paddle
3's PIR export cannot hold; its later releases call Paddle's PIR operator
(``paddle._C_ops.multiclass_nms3``) instead, which this script does in its place.  It
needs PaddleDetection's code importable (``pip install --no-deps paddledet==2.6.0`` and
the packages its modules import: requests, tqdm, opencv, scipy, shapely, matplotlib,
pandas, typeguard, terminaltables, pycocotools, six), for example on ``--path``:

    python bench/ppyoloe_tail.py --path /tmp/ppdet:/tmp/ppdeps [--bias -2] [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EXPORT = r"""
import sys
import paddle
from paddle.static import InputSpec
import ppdet.modeling.ops as ppdet_ops
from ppdet.modeling.architectures.yolo import YOLOv3
from ppdet.modeling.backbones.cspresnet import CSPResNet
from ppdet.modeling.heads.ppyoloe_head import PPYOLOEHead
from ppdet.modeling.layers import MultiClassNMS
from ppdet.modeling.necks.custom_pan import CustomCSPPAN


def multiclass_nms(bboxes, scores, score_threshold, nms_top_k, keep_top_k,
                   nms_threshold=0.3, normalized=True, nms_eta=1.0, background_label=-1,
                   return_index=False, return_rois_num=True, rois_num=None, name=None):
    out, index, num = paddle._C_ops.multiclass_nms3(
        bboxes, scores, rois_num, score_threshold, nms_top_k, keep_top_k, nms_threshold,
        normalized, nms_eta, background_label)
    return out, num, (index if return_index else None)


ppdet_ops.multiclass_nms = multiclass_nms
paddle.seed(11)
backbone = CSPResNet(layers=[3, 6, 6, 3], channels=[64, 128, 256, 512, 1024],
                     return_idx=[1, 2, 3], use_large_stem=True, width_mult=0.5,
                     depth_mult=0.33, use_alpha=True)
neck = CustomCSPPAN(in_channels=[s.channels for s in backbone.out_shape],
                    out_channels=[768, 384, 192], stage_num=1, block_num=3, act="swish",
                    spp=True, width_mult=0.5, depth_mult=0.33)
nms = MultiClassNMS(nms_top_k=1000, keep_top_k=300, score_threshold=0.01, nms_threshold=0.7)
head = PPYOLOEHead(in_channels=[s.channels for s in neck.out_shape], num_classes=80,
                   fpn_strides=[32, 16, 8], static_assigner_epoch=-1, static_assigner=None,
                   assigner=None, nms=nms, eval_size=[320, 320])
for conv in head.pred_cls:
    conv.bias.set_value(paddle.randn(conv.bias.shape) * 2.0 + float(sys.argv[2]))
model = YOLOv3(backbone=backbone, neck=neck, yolo_head=head, post_process=None)
model.eval()
for layer in model.sublayers():
    if hasattr(layer, "convert_to_deploy"):
        layer.convert_to_deploy()
spec = {"image": InputSpec([None, 3, 320, 320], "float32", "image"),
        "im_shape": InputSpec([None, 2], "float32", "im_shape"),
        "scale_factor": InputSpec([None, 2], "float32", "scale_factor")}
static = paddle.jit.to_static(model, input_spec=[spec], full_graph=True)
used = {k: v for k, v in spec.items() if k != "im_shape"}  # PP-YOLOE reads no im_shape
paddle.jit.save(static, sys.argv[1], input_spec=[used])
"""


def export(prefix: str, paths: str, bias: float) -> None:
    env = dict(os.environ, CUSTOM_DEVICE_ROOT="", PADDLE_IPU_AUTOLOAD="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (paths, env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", EXPORT, prefix, str(bias)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the export failed:\n{done.stderr[-3000:]}")


def run(predictor: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    for name in predictor.get_input_names():  # type: ignore[attr-defined]
        handle = predictor.get_input_handle(name)  # type: ignore[attr-defined]
        handle.reshape(list(feed[name].shape))
        handle.copy_from_cpu(feed[name])
    predictor.run()  # type: ignore[attr-defined]
    names = predictor.get_output_names()  # type: ignore[attr-defined]
    return [predictor.get_output_handle(n).copy_to_cpu() for n in names]  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", default="", help="where PaddleDetection's code is")
    parser.add_argument("--bias", type=float, default=-2.0, help="mean of the class biases")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    import paddle.inference as paddle_infer

    from paddle_ipu import inference

    with tempfile.TemporaryDirectory() as directory:
        os.environ["PADDLE_IPU_CACHE_DIR"] = str(Path(directory) / "cache")
        prefix = str(Path(directory) / "model")
        export(prefix, args.path, args.bias)
        predictors = []
        for module, ipu in ((paddle_infer, False), (inference, True)):
            config = module.Config(prefix + ".json", prefix + ".pdiparams")
            config.set_cpu_math_library_num_threads(1)
            if ipu:
                config.enable_ipu()
            else:
                config.disable_mkldnn()
            predictors.append(module.create_predictor(config))
        cpu, ipu = predictors
        rng = np.random.default_rng(0)
        for rows in (1, 2, 3):
            feed = {
                "image": rng.random((rows, 3, 320, 320), dtype=np.float32),
                "scale_factor": np.tile(np.float32([[1.5, 0.5]]), (rows, 1)),
            }
            (want, want_num), (got, got_num) = run(cpu, feed), run(ipu, feed)
            same = want.shape == got.shape and np.array_equal(want_num, got_num)
            line = f"{rows} image(s): boxes per image {got_num.tolist()} (CPU {want_num.tolist()})"
            if same and len(got):
                line += (
                    f", labels {'equal' if np.array_equal(want[:, 0], got[:, 0]) else 'DIFFER'}"
                    f", max |score diff| {np.abs(want[:, 1] - got[:, 1]).max():.2g}"
                    f", max |box diff| {np.abs(want[:, 2:] - got[:, 2:]).max():.2g} of "
                    f"{np.abs(want[:, 2:]).max():.0f}"
                )
            print(line)
        tail = ipu._shared.package.tail  # type: ignore[attr-defined]
        whole, host = [], []
        for _ in range(args.repeat):
            before = tail.seconds
            start = time.perf_counter()
            run(ipu, feed)
            whole.append(time.perf_counter() - start)
            host.append(tail.seconds - before)
        ipu.close()  # type: ignore[attr-defined]
    w, t = statistics.median(whole) * 1e3, statistics.median(host) * 1e3
    print(f"3 images: whole run {w:.1f} ms, host tail {t:.1f} ms ({100 * t / w:.0f}%)")


if __name__ == "__main__":
    main()
