"""A data-parallel training script as a user writes it, for tests/e2e/test_distributed.py:
one process per instance under ``python -m paddle.distributed.launch``.

    python -m paddle.distributed.launch --nproc_per_node 2 distributed_job.py CONFIG.json

The job's batch of ``BATCH`` rows is new every step (drawn from the step number); each
instance trains on its shard (``paddle_ipu.distributed.shard``).  Each rank starts from
its own random weights (the job trains from rank 0's).  It writes, in the config's
``out`` folder: ``init<R>.npz`` (rank R's weights before training), ``rank<R>.json``
(the loss anchors of every step) and ``rank<R>.npz`` (every persistable variable after
the last step, weights and optimizer state).  ``mode``: ``train``; ``save`` (checkpoint
after ``save_at`` steps to ``rank<R>/ckpt.safetensors``, a path relative to a working
folder of each rank's own, then go on); ``resume`` (load ``rank<R>/ckpt.safetensors``,
run the steps after ``save_at``); ``wait`` (write ``rank<R>.pid`` and sleep ``pause`` s
between steps, for a test to kill or stop one rank).  ``late_ranks`` wait ``late_by``
seconds before they compile; after step ``alone_at``, rank 0 works alone for
``alone_for`` seconds, then every rank waits at ``paddle_ipu.distributed.barrier()``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import paddle

import paddle_ipu
import paddle_ipu.distributed as ipu_dist

BATCH = 8
IN = 8
HIDDEN = 16


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The job's batch of step ``step``: new data every step."""
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    y = np.tanh(x[:, :2].sum(axis=1, keepdims=True)) + 0.1 * rng.standard_normal((BATCH, 1))
    return x, y.astype(np.float32)


def build(seed: int, epsilon: float, loss_scale: float = 1.0) -> tuple[object, object, object]:
    """The MLP (fixed parameter names), its Adam, and the loss to fetch."""
    paddle.enable_static()
    paddle.seed(seed)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, IN], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h = paddle.tanh(
            paddle.static.nn.fc(
                x,
                HIDDEN,
                weight_attr=paddle.ParamAttr(name="w1"),
                bias_attr=paddle.ParamAttr(name="b1"),
            )
        )
        out = paddle.static.nn.fc(
            h, 1, weight_attr=paddle.ParamAttr(name="w2"), bias_attr=paddle.ParamAttr(name="b2")
        )
        loss = paddle.mean((out - y) ** 2)
        trained = loss * loss_scale if loss_scale != 1.0 else loss
        paddle.optimizer.Adam(0.05, epsilon=epsilon).minimize(trained)
    return main, startup, loss


def persistables(main: object, scope: object) -> dict[str, np.ndarray]:
    out = {}
    for var in main.list_vars():  # type: ignore[attr-defined]
        if var.persistable:
            found = scope.find_var(var.name)  # type: ignore[attr-defined]
            if found is not None and found.get_tensor()._is_initialized():
                out[var.name] = np.array(found.get_tensor())
    return out


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    out = cfg["out"]
    job = ipu_dist.job()
    rank = job.index
    replicas = int(cfg.get("replicas", 1))
    mode = cfg.get("mode", "train")
    prog, startup, loss = build(100 + rank, float(cfg.get("epsilon", 1e-8)))
    scope = paddle.static.global_scope()
    exe = paddle.static.Executor(paddle_ipu.device.place())  # this process's ipu
    exe.run(startup)
    if mode != "resume":
        np.savez(os.path.join(out, f"init{rank}.npz"), **persistables(prog, scope))

    s = paddle_ipu.IpuStrategy()
    rows = BATCH // job.count  # this instance's rows per step
    s.set_graph_config(num_ipus=replicas, is_training=True, micro_batch_size=rows // replicas)
    s.set_options({
        "enable_replicated_graphs": replicas > 1,
        "replicated_graph_count": replicas,
        "enable_distribution": True,
        "accumulation_and_replication_reduction_type": cfg.get("reduction", "Mean"),
    })  # fmt: skip
    compiled = paddle_ipu.IpuCompiledProgram(prog, ipu_strategy=s)
    if rank in cfg.get("late_ranks", []):  # as if its compile took that much longer
        time.sleep(float(cfg["late_by"]))
    runnable = compiled.compile(["x", "y"], [loss])

    steps = range(int(cfg.get("steps", 10)))
    save_at = int(cfg.get("save_at", -1))
    ckpt = "ckpt.safetensors"
    if mode in ("save", "resume"):
        # each rank in a folder of its own: a relative path shows who wrote the file
        os.makedirs(os.path.join(out, f"rank{rank}"), exist_ok=True)
        os.chdir(os.path.join(out, f"rank{rank}"))
    if mode == "resume":
        paddle_ipu.checkpoint.load(compiled, ckpt)
        steps = range(save_at, int(cfg.get("steps", 10)))
    if mode == "wait":
        with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
    losses = []
    for step in steps:
        x, y = batch(step)
        feed = {"x": ipu_dist.shard(x, name="x"), "y": ipu_dist.shard(y, name="y")}
        (value,) = exe.run(runnable, feed=feed, fetch_list=runnable.fetch_names)
        losses.append(np.asarray(value).reshape(-1).tolist())
        print(f"rank {rank} step {step} loss {losses[-1]}", flush=True)
        if mode == "save" and step + 1 == save_at:
            paddle_ipu.checkpoint.save(compiled, ckpt)
        if mode == "wait":
            time.sleep(float(cfg.get("pause", 0.5)))
        if step == cfg.get("alone_at"):
            # work only this rank does (an evaluation on rank 0, say), then the barrier
            # that keeps the other rank's next all-reduce from taking the wait for a hang
            if rank == 0:
                time.sleep(float(cfg["alone_for"]))
            ipu_dist.barrier("the end of rank 0's evaluation")
    compiled.weights_to_host()
    np.savez(os.path.join(out, f"rank{rank}.npz"), **persistables(prog, scope))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "job": [job.index, job.count]}, f)


if __name__ == "__main__":
    main()
