"""Data-parallel training across processes on the host backend, as a user runs it: the
script ``distributed_job.py`` under Paddle's own launcher (``python -m
paddle.distributed.launch``), checked from outside against Paddle's CPU training of the
whole batch, and against itself across ranks, restarts and failures."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import distributed_job as job_script  # noqa: E402

import paddle_ipu  # noqa: E402
from paddle_ipu.errors import NotSupportedError  # noqa: E402

SCRIPT = Path(job_script.__file__).resolve()
STEPS = 10
# What a test must not inherit: the switches of the plugin and a launcher's own job.
_DROP = ("PADDLE_IPU_DEFAULT_DEVICE", "PADDLE_IPU_VISIBLE_DEVICES", "CUSTOM_DEVICE_ROOT")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DROP and not k.startswith(("PADDLE_TRAINER", "POPDIST_", "FLAGS_selected"))
    }
    env.update(extra or {})
    return env


def _launcher(out: Path, cfg: dict[str, Any], *args: str, log: str = "log") -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cfg.json").write_text(json.dumps({"out": str(out), **cfg}))
    return [
        sys.executable, "-m", "paddle.distributed.launch", *args,
        "--log_dir", str(out / log), str(SCRIPT), str(out / "cfg.json"),
    ]  # fmt: skip


def _launch(out: Path, cfg: dict[str, Any], nproc: int = 2) -> None:
    proc = subprocess.run(
        _launcher(out, cfg, "--nproc_per_node", str(nproc)),
        cwd=out, env=_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, _logs(out) + proc.stdout[-3000:] + proc.stderr[-3000:]


def _logs(out: Path, log: str = "log") -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((out / log).glob("workerlog.*"))
    )


def _rank(out: Path, rank: int) -> tuple[dict[str, np.ndarray], list[list[float]]]:
    with np.load(out / f"rank{rank}.npz") as z:
        state = {k: z[k] for k in z.files}
    losses = json.loads((out / f"rank{rank}.json").read_text())["losses"]
    return state, losses


def _paddle_cpu(init: Path, loss_scale: float, epsilon: float) -> tuple[dict[str, Any], list]:
    """Paddle's CPU executor training the same program on the whole batch of every step,
    from rank 0's initial weights: the state after STEPS steps and the loss of each."""
    with paddle.utils.unique_name.guard():  # the names the job's fresh process made
        main, startup, loss = job_script.build(0, epsilon, loss_scale)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    losses = []
    with paddle.static.scope_guard(scope), np.load(init) as z:
        exe.run(startup)
        for name in z.files:
            scope.find_var(name).get_tensor().set(z[name], paddle.CPUPlace())
        for step in range(STEPS):
            x, y = job_script.batch(step)
            (value,) = exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss])
            losses.append(float(value))
        return job_script.persistables(main, scope), losses


def _check_job(out: Path, loss_scale: float, epsilon: float, replicas: int) -> dict[str, Any]:
    ref, ref_losses = _paddle_cpu(out / "init0.npz", loss_scale, epsilon)
    (state0, losses0), (state1, losses1) = _rank(out, 0), _rank(out, 1)
    assert sorted(state0) == sorted(ref)
    for name in ref:
        # every rank holds bitwise the same weights and optimizer state
        assert state0[name].tobytes() == state1[name].tobytes(), name
        np.testing.assert_allclose(state0[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # the loss anchors: one per local replica (PopART's layout), per step
    assert np.shape(losses0) == np.shape(losses1) == (STEPS, replicas)
    mean = (np.mean(losses0, axis=1) + np.mean(losses1, axis=1)) / 2
    np.testing.assert_allclose(mean, ref_losses, rtol=1e-5)
    # each rank drew its own initial weights; the job trained from rank 0's
    with np.load(out / "init0.npz") as a, np.load(out / "init1.npz") as b:
        assert a["w1"].tobytes() != b["w1"].tobytes()
    return ref


@pytest.mark.slow
def test_two_processes_train_as_paddle_cpu_on_the_whole_batch(tmp_path: Path) -> None:
    # The acceptance: 2 processes, a 4-row shard each of an 8-row batch, 10 Adam steps
    # with new data every step, mean reduction.
    _launch(tmp_path, {"steps": STEPS})
    _check_job(tmp_path, loss_scale=1.0, epsilon=1e-8, replicas=1)


@pytest.mark.slow
def test_ranks_waiting_longer_than_gloos_timeout_are_not_failures(tmp_path: Path) -> None:
    # Rank 1 compiles 35 s after rank 0, rank 0 works alone for 35 s after step 3 and
    # then every rank meets at paddle_ipu.distributed.barrier(): both waits are longer
    # than gloo's 30 s, and the job trains as without them.
    _launch(tmp_path, {"steps": STEPS, "late_ranks": [1], "late_by": 35, "alone_at": 3,
                       "alone_for": 35})  # fmt: skip
    _check_job(tmp_path, loss_scale=1.0, epsilon=1e-8, replicas=1)


@pytest.mark.slow
def test_sum_reduction_over_processes_and_local_replicas(tmp_path: Path) -> None:
    # 2 processes x 2 local replicas: 4 replicas of 2 rows.  Sum adds the 4 replicas'
    # mean-loss gradients: Paddle's CPU training of 4 x the whole batch's mean loss.  A
    # large epsilon makes Adam's update depend on the gradient's scale, so a Mean here
    # would fail the comparison (checked below).
    _launch(tmp_path, {"steps": STEPS, "replicas": 2, "reduction": "Sum", "epsilon": 0.1})
    ref = _check_job(tmp_path, loss_scale=4.0, epsilon=0.1, replicas=2)
    mean_ref, _ = _paddle_cpu(tmp_path / "init0.npz", 1.0, 0.1)
    assert np.max(np.abs(ref["w1"] - mean_ref["w1"])) > 1e-2


@pytest.mark.slow
def test_checkpoint_written_by_rank_0_resumes_on_both(tmp_path: Path) -> None:
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    _launch(whole, {"steps": STEPS})
    _launch(stopped, {"steps": STEPS, "mode": "save", "save_at": 5})
    # Each rank saved to a relative path in a folder of its own: rank 0 alone wrote.
    assert (stopped / "rank0" / "ckpt.safetensors").is_file()
    assert not (stopped / "rank1" / "ckpt.safetensors").exists()
    assert [p.name for p in (stopped / "rank0").iterdir()] == ["ckpt.safetensors"]
    resumed = tmp_path / "resumed"
    for rank in (0, 1):  # a copy for each rank, as on hosts without a shared folder
        (resumed / f"rank{rank}").mkdir(parents=True)
        data = (stopped / "rank0" / "ckpt.safetensors").read_bytes()
        (resumed / f"rank{rank}" / "ckpt.safetensors").write_bytes(data)
    _launch(resumed, {"steps": STEPS, "mode": "resume", "save_at": 5})
    reference, _ = _rank(whole, 0)
    for rank in (0, 1):
        state, losses = _rank(resumed, rank)
        assert len(losses) == STEPS - 5
        for name, value in reference.items():
            assert state[name].tobytes() == value.tobytes(), (rank, name)
    # the run that saved went on to the same end
    for name, value in _rank(stopped, 1)[0].items():
        assert value.tobytes() == reference[name].tobytes(), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_launchers_as_two_hosts_train_the_same_bits(tmp_path: Path) -> None:
    # docs/distributed.md's multi-host command, both "hosts" on this machine.
    one, two = tmp_path / "one", tmp_path / "two"
    _launch(one, {"steps": STEPS})
    master = f"127.0.0.1:{_free_port()}"
    args = ("--nnodes", "2", "--master", master, "--nproc_per_node", "1")
    procs = [
        subprocess.Popen(
            _launcher(two, {"steps": STEPS}, *args, log=f"log{node}"),
            cwd=two,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for rank in (0, 1):
        a, b = _rank(one, rank)[0], _rank(two, rank)[0]
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), rank


def _state(pid: int) -> str:
    """A process's state letter (Z: it ended, its parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


def _fail_one_rank(out: Path, sig: int, bound: float) -> tuple[float, str, str]:
    """Start a job, send ``sig`` to rank 1 after a few steps, and time rank 0 until it
    ends.  The launcher is paused meanwhile: on one host it stops every rank as soon as
    one fails, which would hide what rank 0 does on its own (as on another host).
    Returns the seconds rank 0 took to end, the launcher's output and rank 0's log."""
    proc = subprocess.Popen(
        _launcher(out, {"steps": 400, "mode": "wait", "pause": 0.2}, "--nproc_per_node", "2"),
        cwd=out, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        log1 = out / "log" / "workerlog.1"
        while not (out / "rank1.pid").exists() or "step 3 " not in log1.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, _logs(out)
            time.sleep(0.2)
        ranks = [int((out / f"rank{r}.pid").read_text()) for r in (0, 1)]
        os.kill(proc.pid, signal.SIGSTOP)
        os.kill(ranks[1], sig)
        start = time.monotonic()
        while _state(ranks[0]) not in ("Z", "gone") and time.monotonic() - start < bound:
            time.sleep(0.05)
        took = time.monotonic() - start
        os.kill(proc.pid, signal.SIGCONT)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        for pid in ranks:
            if _state(pid) not in ("Z", "gone"):
                os.kill(pid, signal.SIGKILL)  # a stopped rank the launcher left
    assert proc.returncode != 0
    return took, output, (out / "log" / "workerlog.0").read_text()


@pytest.mark.slow
def test_a_killed_rank_fails_the_other_naming_it(tmp_path: Path) -> None:
    took, output, rank0 = _fail_one_rank(tmp_path, signal.SIGKILL, bound=20)
    # rank 0 ended on its own, non-zero, saying which rank failed and how
    assert took < 20, took
    assert "paddle_ipu.errors.DistributedError: rank 0: the gradient all-reduce" in rank0
    # gloo names the peer whose connection closed ("pair_rank = 1"), or, when the read
    # fails first ("Read error ... Connection reset by peer", seen under load), rank 1's
    # heartbeats in the job's store have stopped: either way rank 1 is named
    named = (
        "rank 1 closed its connection: its process ended (killed",
        "rank(s) 1 stopped answering",
    )
    assert any(n in rank0 for n in named), rank0[-2000:]
    assert any(n in output for n in named)  # the launcher shows rank 0's log
    print(f"rank 0 ended {took:.2f} s after rank 1 was killed")


@pytest.mark.slow
def test_a_stopped_rank_fails_the_other_within_gloos_timeout(tmp_path: Path) -> None:
    # SIGSTOP: rank 1 hangs, its sockets open.  Gloo gives up after its 30 s, the
    # heartbeats in the job's store name the rank.
    took, _, rank0 = _fail_one_rank(tmp_path, signal.SIGSTOP, bound=45)
    assert took < 45, took
    assert "paddle_ipu.errors.DistributedError: rank 0: the gradient all-reduce" in rank0
    assert "rank(s) 1 stopped answering" in rank0
    print(f"rank 0 ended {took:.2f} s after rank 1 was stopped")


def test_without_a_launcher_enable_distribution_says_how_to_launch(tmp_path: Path) -> None:
    with paddle.utils.unique_name.guard():
        main, startup, loss = job_script.build(0, 1e-8)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=True, micro_batch_size=4)
    s.set_options({"enable_distribution": True, "backend": "host"})
    compiled = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    with pytest.raises(NotSupportedError, match=r"paddle\.distributed\.launch --nproc_per_node"):
        compiled.compile(["x", "y"], [loss])


@pytest.mark.slow
def test_the_script_of_the_docs_runs_under_the_launcher(tmp_path: Path) -> None:
    import re

    text = (SCRIPT.parents[2] / "docs" / "distributed.md").read_text()
    block = re.search(r"## The script\n\n```python\n(.*?)```", text, re.S)
    assert block is not None
    (tmp_path / "train.py").write_text(block.group(1))
    proc = subprocess.run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
         "--log_dir", "log", "train.py"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, _logs(tmp_path) + proc.stdout[-3000:]
    rank0 = (tmp_path / "log" / "workerlog.0").read_text().splitlines()
    printed = [line for line in rank0 if not line.startswith(("I1", "W1"))]
    assert [line.split()[0] for line in printed] == [str(s) for s in range(0, 100, 10)]
    assert float(printed[-1].split()[1]) < float(printed[0].split()[1])  # it learned
    assert (tmp_path / "log" / "workerlog.1").read_text().strip() == ""  # rank 1: quiet
    assert (tmp_path / "ckpt.safetensors").is_file()
