"""What the host tail of a detector costs: NMS on Paddle's CPU kernels after the graph.

A detector-like model -- a random conv backbone of stride 8, a head of 4 box offsets
and ``--classes`` class logits per location decoded on a grid, Paddle's
``multiclass_nms3`` as PaddleDetection's exporter writes it (score threshold 0.3, top
1000 per class, keep 100), boxes scaled back by ``scale_factor`` -- is saved under PIR
and run through ``paddle_ipu.inference`` on the host backend: the conv part as the
compiled graph, NMS and what follows on the host (:mod:`paddle_ipu.serving.host_tail`).
``--shift`` lowers the class logits so that fewer scores pass the threshold, as in a
trained detector.  Prints the median time of a whole ``predictor.run`` and of the host
tail inside it, how many boxes NMS kept, and the median of the whole model on Paddle
Inference's CPU predictor, oneDNN off (it must keep as many boxes).

    python bench/host_tail.py [--size 320] [--classes 80] [--batch 1] [--repeat 20] [--shift 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def save(prefix: str, classes: int, shift: float) -> None:
    import paddle

    paddle.enable_static()
    paddle.seed(7)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        image = paddle.static.data("image", [-1, 3, -1, -1], "float32")
        scale_factor = paddle.static.data("scale_factor", [-1, 2], "float32")
        x = image
        for cin, cout in ((3, 16), (16, 32), (32, 64)):  # stride 8
            x = paddle.nn.functional.relu(paddle.nn.Conv2D(cin, cout, 3, stride=2, padding=1)(x))
        x = paddle.nn.functional.relu(paddle.nn.Conv2D(64, 64, 3, padding=1)(x))
        reg = paddle.nn.Conv2D(64, 4, 1)(x)
        cls = paddle.nn.Conv2D(64, classes, 1)(x) * 4.0 - shift
        h, w = paddle.shape(x)[2], paddle.shape(x)[3]
        ys, xs = paddle.meshgrid(
            paddle.arange(h, dtype="float32"), paddle.arange(w, dtype="float32")
        )
        centre = paddle.stack([xs, ys, xs, ys], axis=0).flatten(1).unsqueeze(0) * 8.0
        size = paddle.to_tensor([-12.0, -12.0, 12.0, 12.0]).reshape([1, 4, 1])
        boxes = (centre + size + paddle.tanh(reg.flatten(2)) * 6.0).transpose([0, 2, 1])
        scores = paddle.nn.functional.sigmoid(cls.flatten(2))
        out, _, num = paddle._C_ops.multiclass_nms3(
            boxes, scores, None, 0.3, 1000, 100, 0.45, False, 1.0, -1
        )
        factor = paddle.concat([scale_factor[:, ::-1], scale_factor[:, ::-1]], axis=1)
        bbox = paddle.concat([out[:, :2], out[:, 2:] / factor[0]], axis=1)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    paddle.static.save_inference_model(
        prefix, [image, scale_factor], [bbox, num], exe, program=main
    )
    paddle.disable_static()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--shift",
        type=float,
        default=0.0,
        help="subtracted from the class logits: how many scores pass NMS's 0.3 threshold",
    )
    args = parser.parse_args()

    from paddle_ipu import inference

    with tempfile.TemporaryDirectory() as directory:
        # a compile cache of its own: the model is saved anew in each run
        os.environ["PADDLE_IPU_CACHE_DIR"] = str(Path(directory) / "cache")
        prefix = str(Path(directory) / "det")
        save(prefix, args.classes, args.shift)
        config = inference.Config(prefix + ".json", prefix + ".pdiparams")
        config.set_cpu_math_library_num_threads(args.threads)
        config.enable_ipu()
        config.set_ipu_input_shapes([{"image": [-1, 3, args.size, args.size]}])
        predictor = inference.create_predictor(config)
        tail = predictor._shared.package.tail
        assert tail is not None
        rng = np.random.default_rng(0)
        image = rng.random((args.batch, 3, args.size, args.size), dtype=np.float32)
        factor = np.tile(np.float32([[1.0, 1.0]]), (args.batch, 1))
        predictor.run([image, factor])  # warm-up
        whole, host = [], []
        kept = 0
        for _ in range(args.repeat):
            before = tail.seconds
            start = time.perf_counter()
            bbox, _ = predictor.run([image, factor])  # type: ignore[misc]
            whole.append(time.perf_counter() - start)
            host.append(tail.seconds - before)
            kept = len(bbox)
        predictor.close()
        # the same model on Paddle Inference's CPU predictor (Paddle's, not paddle-ipu's)
        import paddle.inference as paddle_infer

        cpu_config = paddle_infer.Config(prefix + ".json", prefix + ".pdiparams")
        cpu_config.set_cpu_math_library_num_threads(args.threads)
        cpu_config.disable_glog_info()
        # oneDNN's concat fails on NMS's empty result (0 boxes kept) in Paddle 3.3.1
        cpu_config.disable_mkldnn()
        cpu = paddle_infer.create_predictor(cpu_config)

        def cpu_run() -> np.ndarray:
            for name, value in zip(cpu.get_input_names(), (image, factor)):
                handle = cpu.get_input_handle(name)
                handle.reshape(value.shape)
                handle.copy_from_cpu(value)
            cpu.run()
            return np.asarray(cpu.get_output_handle(cpu.get_output_names()[0]).copy_to_cpu())

        cpu_run()
        paddle_times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            cpu_bbox = cpu_run()
            paddle_times.append(time.perf_counter() - start)
        assert len(cpu_bbox) == kept, (len(cpu_bbox), kept)
    w, t = statistics.median(whole) * 1e3, statistics.median(host) * 1e3
    p = statistics.median(paddle_times) * 1e3
    boxes = args.size // 8 * (args.size // 8)
    print(
        f"{args.batch}x3x{args.size}x{args.size}, {boxes} boxes x {args.classes} classes, "
        f"{kept} kept, {args.threads} thread(s): whole run {w:.2f} ms, host tail {t:.2f} ms "
        f"({100 * t / w:.1f}%), the compiled graph and the rest {w - t:.2f} ms; Paddle "
        f"Inference on the CPU {p:.2f} ms"
    )


if __name__ == "__main__":
    main()
