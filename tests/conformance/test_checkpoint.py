"""paddle_ipu.checkpoint: weights and optimizer state in an atomic safetensors file.

Oracles: an uninterrupted training run (resuming from a checkpoint must give the same
losses, bitwise), Paddle's own CPU executor (a checkpoint reads back into the plain
program), and the previous/new file contents (a killed save leaves one of them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from test_training import (  # noqa: E402
    OPTIMIZERS,
    build_cnn,
    build_mlp,
    cnn_batch,
    compile_ipu,
    mlp_batches,
    train_cpu,
    train_ipu,
)

from paddle_ipu import checkpoint  # noqa: E402
from paddle_ipu.errors import CheckpointError, IpuError  # noqa: E402

STEPS = 12


def _persistables(net: object) -> list[str]:
    return net.persistable_names()  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("opt", ["adam", "momentum"])
def test_resume_from_checkpoint_is_bitwise_an_uninterrupted_run(opt: str, tmp_path: Path) -> None:
    make_opt = OPTIMIZERS[opt][1]
    batches = mlp_batches(STEPS)
    net = build_mlp(make_opt)
    _, prog = compile_ipu(net)
    uninterrupted = train_ipu(net, prog, batches)

    net = build_mlp(make_opt)
    cp, prog = compile_ipu(net)
    first = train_ipu(net, prog, batches[: STEPS // 2])
    np.testing.assert_array_equal(first, uninterrupted[: STEPS // 2])
    path = tmp_path / "ckpt.safetensors"
    checkpoint.save(cp, path)
    # Everything persistable is in the file: weights, moments, beta pows, lr.
    arrays, dtypes = checkpoint.read(path)
    assert sorted(arrays) == _persistables(net)
    assert all(dtypes[n] == "float32" for n in arrays)

    # A fresh program and scope (a new process would do the same), whose own
    # initial values differ: only the checkpoint can make the losses match.
    resumed = build_mlp(make_opt, seed=123)
    assert not np.array_equal(resumed.array("w1"), net.array("w1"))
    cp2, prog2 = compile_ipu(resumed)
    checkpoint.load(cp2, path)
    rest = train_ipu(resumed, prog2, batches[STEPS // 2 :])
    np.testing.assert_array_equal(rest, uninterrupted[STEPS // 2 :])


def test_fp16_resume_from_checkpoint_is_bitwise(tmp_path: Path) -> None:
    """With fp16 weights on the device, the checkpoint holds the scope's float32 copy
    of them; loading it back gives the device the same fp16 values (fp16 -> fp32 ->
    fp16 is exact), so training continues bit for bit."""
    make_opt = OPTIMIZERS["adam"][0]
    batches = mlp_batches(8)
    net = build_mlp(make_opt)
    _, prog = compile_ipu(net, fp16=True)
    uninterrupted = train_ipu(net, prog, batches)

    net = build_mlp(make_opt)
    cp, prog = compile_ipu(net, fp16=True)
    train_ipu(net, prog, batches[:4])
    path = tmp_path / "fp16.safetensors"
    checkpoint.save(cp, path)
    resumed = build_mlp(make_opt, seed=5)
    cp2, prog2 = compile_ipu(resumed, fp16=True)
    checkpoint.load(cp2, path)
    np.testing.assert_array_equal(train_ipu(resumed, prog2, batches[4:]), uninterrupted[4:])


def test_checkpoint_reads_back_into_a_cpu_program(tmp_path: Path) -> None:
    """Paddle's CPU executor, given the checkpointed values, computes what the IPU run
    computes next: the same loss and the same weights after one more step."""
    make_opt = OPTIMIZERS["adam"][1]
    batches = mlp_batches(6)
    net = build_mlp(make_opt)
    _, prog = compile_ipu(net)
    train_ipu(net, prog, batches[:5])
    path = tmp_path / "ckpt.safetensors"
    checkpoint.save(prog, path)  # the compiled program's runnable program works too

    cpu = build_mlp(make_opt, seed=99)
    names = checkpoint.load(cpu.main, path, scope=cpu.scope)
    assert names == _persistables(cpu)
    for name in names:
        np.testing.assert_array_equal(cpu.array(name), net.array(name))
    cpu_loss = train_cpu(cpu, batches[5:])
    ipu_loss = train_ipu(net, prog, batches[5:])
    np.testing.assert_allclose(cpu_loss, ipu_loss, rtol=1e-5)


def test_checkpoint_keeps_batchnorm_statistics_and_places(tmp_path: Path) -> None:
    net = build_cnn(OPTIMIZERS["momentum"][0])
    cp, prog = compile_ipu(net)
    rng = np.random.default_rng(0)
    train_ipu(net, prog, [cnn_batch(rng, (4,)) for _ in range(3)])
    path = tmp_path / "cnn.safetensors"
    checkpoint.save(cp, path)
    arrays, _ = checkpoint.read(path)
    assert sorted(arrays) == _persistables(net)
    # The BatchNorm running mean, moved by training from its initial zeros.
    assert np.abs(arrays["batch_norm2d_0.w_0"]).max() > 0
    cpu = build_cnn(OPTIMIZERS["momentum"][0], seed=5)
    checkpoint.load(cpu.main, path, scope=cpu.scope)
    for name, value in arrays.items():
        np.testing.assert_array_equal(cpu.array(name), value)
        assert cpu.scope.find_var(name).get_tensor()._place().is_cpu_place()


def test_mismatches_name_the_variable(tmp_path: Path) -> None:
    net = build_mlp(OPTIMIZERS["sgd"][0])
    path = tmp_path / "a.safetensors"
    checkpoint.save(net.main, path, scope=net.scope)
    arrays, dtypes = checkpoint.read(path)
    from safetensors.numpy import save_file

    def write(arrs: dict[str, np.ndarray], dts: dict[str, str], name: str) -> Path:
        p = tmp_path / name
        meta = {"format": checkpoint.FORMAT, "dtypes": json.dumps(dts)}
        save_file(arrs, str(p), metadata=meta)
        return p

    bad = dict(arrays, w1=np.zeros((3, 3), np.float32))
    with pytest.raises(CheckpointError, match=r"'w1' has shape \[3, 3\].*expects \[8, 16\]"):
        checkpoint.load(net.main, write(bad, dtypes, "shape.st"), scope=net.scope)
    bad = dict(arrays, w1=arrays["w1"].astype(np.float64))
    with pytest.raises(CheckpointError, match=r"'w1' has dtype float64.*expects float32"):
        checkpoint.load(net.main, write(bad, dict(dtypes, w1="float64"), "dtype.st"),
                        scope=net.scope)  # fmt: skip
    bad = dict(arrays, extra=np.zeros(2, np.float32))
    with pytest.raises(CheckpointError, match="'extra' is not a persistable"):
        checkpoint.load(net.main, write(bad, dict(dtypes, extra="float32"), "extra.st"),
                        scope=net.scope)  # fmt: skip
    fewer = {k: v for k, v in arrays.items() if k != "b2"}
    with pytest.raises(CheckpointError, match=r"lacks variables of the program: \['b2'\]"):
        checkpoint.load(net.main, write(fewer, {k: dtypes[k] for k in fewer}, "missing.st"),
                        scope=net.scope)  # fmt: skip
    # Nothing was written by the failed loads.
    before = net.array("w1").copy()
    with pytest.raises(CheckpointError):
        checkpoint.load(net.main, tmp_path / "shape.st", scope=net.scope)
    np.testing.assert_array_equal(net.array("w1"), before)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "header", "missing"])
def test_damaged_file_is_a_checkpoint_error(tmp_path: Path, damage: str) -> None:
    net = build_mlp(OPTIMIZERS["adam"][0])
    path = tmp_path / "c.safetensors"
    checkpoint.save(net.main, path, scope=net.scope)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) - 7])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "header":
        path.write_bytes(data[:8] + b"[" + data[9:])
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match=str(path)) as info:
        checkpoint.load(net.main, path, scope=net.scope)
    assert isinstance(info.value, IpuError)


def test_paddle_format_is_refused_without_unpickling(tmp_path: Path) -> None:
    net = build_mlp(OPTIMIZERS["sgd"][0])
    with paddle.static.scope_guard(net.scope):
        paddle.static.save(net.main, str(tmp_path / "m"))
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        checkpoint.load(net.main, tmp_path / "m.pdparams", scope=net.scope)


def test_save_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    net = build_mlp(OPTIMIZERS["sgd"][0])
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "ckpt.safetensors"
    link.symlink_to(victim)
    checkpoint.save(net.main, link, scope=net.scope)
    assert victim.read_text() == "keep"
    assert not link.is_symlink()
    assert sorted(checkpoint.read(link)[0]) == _persistables(net)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


_BIG = """
import numpy as np, paddle


def build_big():
    # Four 1024x1024 float32 weights (16 MiB): a save takes long enough to be hit.
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        h = paddle.static.data("x", [-1, 1024], "float32")
        for i in range(4):
            h = paddle.static.nn.fc(
                h, 1024, weight_attr=paddle.ParamAttr(name=f"big{i}"), bias_attr=False
            )
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, scope
"""

_SAVER = (
    _BIG
    + """
from paddle_ipu import checkpoint
main, scope = build_big()
names = sorted(v.name for v in main.list_vars() if v.persistable)
print("ready", flush=True)
step = 0
while True:
    step += 1
    # Every save holds one value everywhere: the step number.
    for name in names:
        t = scope.find_var(name).get_tensor()
        t.set(np.full(np.array(t).shape, step, np.float32), paddle.CPUPlace())
    checkpoint.save(main, {path!r}, scope=scope)
"""
)


@pytest.mark.slow
def test_kill_during_save_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    """kill -9 at random points of repeated saves: the file at the path always loads,
    and holds one whole save (paddle.static.save left an unloadable file in 3 of 8)."""
    path = tmp_path / "ckpt.safetensors"
    rng = np.random.default_rng(0)
    namespace: dict[str, Any] = {}
    exec(_BIG, namespace)
    main, scope = namespace["build_big"]()
    env = dict(os.environ, GLOG_minloglevel="2")
    for _ in range(8):
        # Run outside the checkout, so the installed package is the one imported.
        errors = tmp_path.parent / "saver.err"
        with open(errors, "w") as err:
            child = subprocess.Popen(
                [sys.executable, "-c", _SAVER.replace("{path!r}", repr(str(path)))],
                stdout=subprocess.PIPE, stderr=err, env=env, text=True, cwd=tmp_path.parent,
            )  # fmt: skip
        assert child.stdout is not None
        ready = child.stdout.readline().strip()
        assert ready == "ready", errors.read_text()[-2000:]
        time.sleep(float(rng.uniform(0.05, 0.4)))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if not path.exists():
            continue  # killed before the first save finished: nothing there, never half
        arrays, _ = checkpoint.read(path)
        first = next(iter(arrays.values())).flat[0]
        assert first >= 1
        for value in arrays.values():
            assert np.all(value == first)
        checkpoint.load(main, path, scope=scope)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    # Temporary files of killed saves may stay (hidden, named after the target); the
    # checkpoint itself is never one of them.
    assert all(n.startswith(f".{path.name}.") and n.endswith(".tmp") for n in leftovers)
