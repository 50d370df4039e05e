"""The main job: a CNN on scikit-learn's digits, trained and served by the emulated
IPU, checked against Paddle's CPU.

1. Build a static Paddle CNN (conv2d, batch_norm, relu, pool2d, fc, softmax) with
   an Adam optimizer.
2. Train it on the emulated IPU (``paddle_ipu.IpuCompiledProgram``, several steps
   per run), and Paddle's CPU training of the same program from the same initial
   weights beside it; compare the losses step by step.
3. Copy the weights back, compile the inference graph, run the test split through
   ``exe.run`` on the "ipu" place, and print accuracy, agreement with Paddle's CPU
   run of the same program, and the throughput of both.

The digits data ships inside scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

# paddle_ipu before paddle: it keeps Paddle's own log lines and warnings out of the
# demo's output (PADDLE_IPU_PADDLE_LOGS=1 shows them).
import paddle_ipu

import numpy as np
import paddle


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


def copy_scope(source: Any, target: Any) -> None:
    """Copy every initialised tensor of ``source`` into ``target`` on the CPU."""
    for name in source.local_var_names():
        tensor = source.find_var(name).get_tensor()
        if tensor._is_initialized():
            target.var(name).get_tensor().set(np.array(tensor), paddle.CPUPlace())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--steps-per-run", type=int, default=4, help="batches_per_step")
    parser.add_argument(
        "--threads", type=int, default=1, help="emulated IPU threads (Paddle CPU uses 1)"
    )
    args = parser.parse_args()

    paddle.enable_static()
    paddle.seed(args.seed)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    cpu = paddle.static.Executor(paddle.CPUPlace())
    ipu = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    train_prog, startup, image, prob, loss = build()

    # Two scopes from the same initial weights: the emulated IPU trains in one,
    # Paddle's CPU trains the same program in the other, as a reference.
    ipu_scope, cpu_scope = paddle.static.Scope(), paddle.static.Scope()
    with paddle.static.scope_guard(ipu_scope):
        ipu.run(startup)
    copy_scope(ipu_scope, cpu_scope)

    bps = args.steps_per_run
    strategy = paddle_ipu.IpuStrategy()
    strategy.set_graph_config(num_ipus=1, is_training=True, micro_batch_size=args.batch)
    strategy.set_pipelining_config(batches_per_step=bps)
    strategy.set_options({"host_num_threads": args.threads})
    t0 = time.perf_counter()
    trainer = paddle_ipu.IpuCompiledProgram(train_prog, scope=ipu_scope, ipu_strategy=strategy)
    train_ipu = trainer.compile(["image", "label"], [loss])
    print(f"compile the training graph for the IPU: {time.perf_counter() - t0:.2f} s")

    rng = np.random.default_rng(args.seed)
    rows = args.batch * bps
    ipu_losses: list[float] = []
    cpu_losses: list[float] = []
    ipu_s = cpu_s = 0.0
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        first = len(ipu_losses)
        for i in range(0, len(order) - rows + 1, rows):
            idx = order[i : i + rows]
            feed = {"image": x_train[idx], "label": y_train[idx, None]}
            t = time.perf_counter()
            with paddle.static.scope_guard(ipu_scope):
                (steps,) = ipu.run(train_ipu, feed=feed, fetch_list=train_ipu.fetch_names)
            ipu_s += time.perf_counter() - t
            ipu_losses.extend(np.atleast_1d(steps).tolist())
            t = time.perf_counter()
            with paddle.static.scope_guard(cpu_scope):
                for j in range(bps):
                    part = {k: v[j * args.batch : (j + 1) * args.batch] for k, v in feed.items()}
                    (value,) = cpu.run(train_prog, feed=part, fetch_list=[loss])
                    cpu_losses.append(float(value))
            cpu_s += time.perf_counter() - t
        print(
            f"epoch {epoch + 1}: train loss {np.mean(ipu_losses[first:]):.4f} (emulated IPU), "
            f"{np.mean(cpu_losses[first:]):.4f} (Paddle CPU)"
        )
    diff = np.abs(np.array(ipu_losses) - np.array(cpu_losses)) / np.abs(np.array(cpu_losses))
    steps_done = len(ipu_losses)
    print(
        f"training: {steps_done} steps of {args.batch} images; emulated IPU {ipu_s:.2f} s, "
        f"Paddle CPU {cpu_s:.2f} s; step losses agree to {diff[:20].max():.1e} relative over "
        f"the first 20 steps, {diff.max():.1e} over all"
    )

    # Weights back from the device into the scope (they stay on the ipu place), then
    # serve the trained model.  Paddle's CPU executor, the reference, reads a CPU copy.
    trainer.weights_to_host()
    reference_scope = paddle.static.Scope()
    copy_scope(ipu_scope, reference_scope)
    with paddle.static.scope_guard(ipu_scope):
        # The inference program for the CPU: pruned to the prediction, batch norm
        # in test mode.  The IPU compiler does the same from the training program.
        infer_prog = paddle.static.normalize_program(train_prog, [image], [prob])
        strategy = paddle_ipu.IpuStrategy()
        strategy.set_graph_config(num_ipus=1, is_training=False, micro_batch_size=args.batch)
        strategy.set_options({"host_num_threads": args.threads})
        t0 = time.perf_counter()
        compiled = paddle_ipu.IpuCompiledProgram(
            train_prog, scope=ipu_scope, ipu_strategy=strategy
        ).compile(["image"], [prob])
        print(f"compile the inference graph for the IPU: {time.perf_counter() - t0:.2f} s")

        n = (len(x_test) // args.batch) * args.batch
        batches = [x_test[i : i + args.batch] for i in range(0, n, args.batch)]

        def timed(run: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, float]:
            for b in batches[:2]:  # warm-up
                run(b)
            t = time.perf_counter()
            outs = [run(b) for b in batches]
            return np.concatenate(outs), time.perf_counter() - t

        ipu_probs, ipu_s = timed(
            lambda b: ipu.run(compiled, feed={"image": b}, fetch_list=compiled.fetch_names)[0]
        )
        with paddle.static.scope_guard(reference_scope):
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
        f"inference throughput ({args.threads} thread(s), batch {args.batch}): emulated IPU "
        f"{n / ipu_s:,.0f} images/s, Paddle CPU {n / cpu_s:,.0f} images/s"
    )
    if agree < 0.99 or max_diff > 1e-4:
        raise SystemExit("the emulated IPU disagrees with Paddle CPU")


if __name__ == "__main__":
    main()
