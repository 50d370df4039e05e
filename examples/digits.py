"""The main job: a CNN on scikit-learn's digits, trained with Paddle and served by
the emulated IPU.

1. Build a static Paddle CNN (conv2d, batch_norm, relu, pool2d, fc, softmax) and
   train it on the training split.
2. Compile the inference program for the IPU (``paddle_ipu.IpuCompiledProgram``)
   and run the test split through it with ``exe.run`` on the "ipu" place.
3. Print accuracy, agreement with Paddle's CPU run of the same program, and the
   throughput of both.

The digits data ships inside scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import paddle

import paddle_ipu


def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as sk_digits

    data = sk_digits()
    x = (data.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def build() -> tuple[object, object, object, object, object]:
    """(training program, startup, image data value, prob, loss)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("image", [-1, 1, 8, 8], "float32")
        label = paddle.static.data("label", [-1, 1], "int64")
        conv1 = paddle.nn.Conv2D(1, 16, 3, padding=1)
        bn1 = paddle.nn.BatchNorm2D(16)
        conv2 = paddle.nn.Conv2D(16, 32, 3, padding=1)
        fc = paddle.nn.Linear(32 * 2 * 2, 10)
        h = paddle.nn.functional.max_pool2d(paddle.nn.functional.relu(bn1(conv1(x))), 2)
        h = paddle.nn.functional.max_pool2d(paddle.nn.functional.relu(conv2(h)), 2)
        logits = fc(paddle.flatten(h, 1))
        prob = paddle.nn.functional.softmax(logits)
        loss = paddle.nn.functional.cross_entropy(logits, label)
        paddle.optimizer.Adam(learning_rate=0.01).minimize(loss)
    return main, startup, x, prob, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument(
        "--threads", type=int, default=1, help="emulated IPU threads (Paddle CPU uses 1)"
    )
    args = parser.parse_args()

    paddle.enable_static()
    paddle.seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    scope = paddle.static.Scope()
    cpu = paddle.static.Executor(paddle.CPUPlace())

    with paddle.static.scope_guard(scope):
        train_prog, startup, image, prob, loss = build()
        cpu.run(startup)
        t0 = time.perf_counter()
        rng = np.random.default_rng(args.seed)
        for epoch in range(args.epochs):
            order = rng.permutation(len(x_train))
            losses = []
            for i in range(0, len(order) - args.batch + 1, args.batch):
                idx = order[i : i + args.batch]
                feed = {"image": x_train[idx], "label": y_train[idx, None]}
                (value,) = cpu.run(train_prog, feed=feed, fetch_list=[loss])
                losses.append(float(value))
            print(f"epoch {epoch + 1}: train loss {np.mean(losses):.4f} (Paddle CPU)")
        print(f"training: {time.perf_counter() - t0:.1f} s")

        # The inference program: pruned to the prediction, batch norm in test mode.
        infer_prog = paddle.static.normalize_program(train_prog, [image], [prob])

        # Compile for the emulated IPU.
        strategy = paddle_ipu.IpuStrategy()
        strategy.set_graph_config(num_ipus=1, is_training=False, micro_batch_size=args.batch)
        strategy.set_options({"host_num_threads": args.threads})
        t0 = time.perf_counter()
        # The compiler prunes the training program to the prediction and puts
        # batch norm in test mode, as normalize_program does for the CPU.
        compiled = paddle_ipu.IpuCompiledProgram(
            train_prog, scope=scope, ipu_strategy=strategy
        ).compile(["image"], [prob])
        compile_s = time.perf_counter() - t0
        print(f"compile for the IPU: {compile_s:.2f} s")

        ipu = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
        n = (len(x_test) // args.batch) * args.batch
        batches = [x_test[i : i + args.batch] for i in range(0, n, args.batch)]

        def timed(run: object) -> tuple[np.ndarray, float]:
            outs = [run(b) for b in batches[:2]]  # warm-up
            t = time.perf_counter()
            outs = [run(b) for b in batches]
            return np.concatenate(outs), time.perf_counter() - t

        ipu_probs, ipu_s = timed(
            lambda b: ipu.run(compiled, feed={"image": b}, fetch_list=compiled.fetch_names)[0]
        )
        cpu_probs, cpu_s = timed(lambda b: cpu.run(infer_prog, feed={"image": b})[0])

    labels = y_test[:n]
    acc_ipu = float((ipu_probs.argmax(1) == labels).mean())
    acc_cpu = float((cpu_probs.argmax(1) == labels).mean())
    agree = float((ipu_probs.argmax(1) == cpu_probs.argmax(1)).mean())
    max_diff = float(np.abs(ipu_probs - cpu_probs).max())
    print(f"test images: {n}")
    print(f"accuracy: emulated IPU {acc_ipu:.4f}, Paddle CPU {acc_cpu:.4f}")
    print(f"agreement with Paddle CPU: {agree:.4f} of predictions, max |diff| {max_diff:.2e}")
    print(
        f"throughput ({args.threads} thread(s), batch {args.batch}): emulated IPU "
        f"{n / ipu_s:,.0f} images/s, Paddle CPU {n / cpu_s:,.0f} images/s"
    )
    if agree < 0.99 or max_diff > 1e-4:
        raise SystemExit("the emulated IPU disagrees with Paddle CPU")


if __name__ == "__main__":
    main()
