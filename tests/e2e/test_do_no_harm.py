"""With paddle-ipu installed, Paddle code that never asked for the IPU runs exactly as
without it: the default device, what ``import paddle`` prints, eager kernels, Paddle's
launcher. Each check runs in fresh interpreters, as a user meets it, and compares with
the same code with the plugin turned off (``CUSTOM_DEVICE_ROOT=``, Paddle's own switch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from support.helpers import run_python

PLUGIN_OFF = {"CUSTOM_DEVICE_ROOT": ""}
# The variables this file is about, unset unless a test sets them.
_OURS = ("PADDLE_IPU_DEFAULT_DEVICE", "PADDLE_IPU_AUTOLOAD", "CUSTOM_DEVICE_ROOT")


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OURS and k != "GLOG_minloglevel"}
    env.update(extra or {})
    return env


def _run(code: str, extra: dict[str, str] | None = None, timeout: float = 180):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_clean_env(extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=tempfile.gettempdir(),
    )


def test_import_paddle_prints_and_chooses_as_without_the_plugin() -> None:
    code = """
        import paddle
        print(paddle.get_device())
        print(paddle.static.Executor()._default_executor is not None)
        print(paddle.framework._current_expected_place())
        """
    with_plugin = _run(code)
    without = _run(code, PLUGIN_OFF)
    assert with_plugin.returncode == 0, with_plugin.stderr[-3000:]
    assert without.returncode == 0, without.stderr[-3000:]
    assert with_plugin.stdout == without.stdout
    assert with_plugin.stdout.splitlines()[0] == "cpu"
    # Not one more line on stderr than Paddle prints itself (its start-up warnings).
    assert with_plugin.stderr == without.stderr


def test_the_ipu_is_still_there_when_asked_for() -> None:
    proc = _run(
        """
        import paddle
        assert "ipu" in paddle.device.get_all_custom_device_type()
        paddle.set_device("ipu")
        print(paddle.get_device())
        print(paddle.to_tensor([1.0, 2.0]).place)
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ipu:0", "Place(ipu:0)"]


def test_one_switch_makes_the_ipu_the_default() -> None:
    proc = _run("import paddle; print(paddle.get_device())", {"PADDLE_IPU_DEFAULT_DEVICE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ipu:0"
    bad = _run("import paddle; print(paddle.get_device())", {"PADDLE_IPU_DEFAULT_DEVICE": "x"})
    assert bad.returncode == 0, bad.stderr[-3000:]
    assert bad.stdout.strip() == "cpu"
    assert "PADDLE_IPU_DEFAULT_DEVICE" in bad.stderr and "'x'" in bad.stderr


def test_plain_static_program_runs_on_paddles_cpu_executor() -> None:
    # Executor() without a place is Paddle's default device: the CPU, op by op, never the
    # emulated IPU's whole-graph compile.
    code = """
        import numpy as np, paddle
        paddle.enable_static()
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [2, 3], "float32")
            y = paddle.nn.functional.relu(x) * 2
        exe = paddle.static.Executor()
        exe.run(startup)
        out, = exe.run(main, feed={"x": np.arange(-3, 3, dtype="float32").reshape(2, 3)},
                       fetch_list=[y])
        print(exe.place, out.tolist())
        """
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "Place(cpu) [[0.0, 0.0, 0.0], [0.0, 2.0, 4.0]]"
    without = _run(code, PLUGIN_OFF)
    assert proc.stdout == without.stdout
    # Paddle's log lines (its executor's INFO lines among them) are all still there: the
    # hook's import of paddle_ipu leaves Paddle's logging alone.
    assert _without_times(proc.stderr) == _without_times(without.stderr)
    assert "New Executor" in proc.stderr


def _without_times(text: str) -> str:
    """glog lines without their date, time and thread id."""
    return re.sub(r"^([IWEF])\d{4} [0-9:.]+ +\d+ ", r"\1 ", text, flags=re.M)


EAGER_ON_BOTH = """
    import json, numpy as np, paddle
    out = {}
    for name, place in (("cpu", paddle.CPUPlace()), ("ipu", paddle.CustomPlace("ipu", 0))):
        paddle.set_device("cpu" if name == "cpu" else "ipu")
        rng = np.random.default_rng(0)
        x = paddle.to_tensor(rng.random((3, 4), dtype=np.float32), place=place)
        t = x.transpose([1, 0])
        cat = paddle.concat([t, t])
        paddle.seed(7)
        layer = paddle.nn.Sequential(
            paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.ReLU(),
            paddle.nn.Flatten(), paddle.nn.Linear(4 * 6 * 6, 5))
        data = paddle.to_tensor(rng.random((2, 3, 8, 8), dtype=np.float32), place=place)
        loss = layer(data).square().mean()
        loss.backward()
        grads = [p.grad.numpy().tolist() for p in layer.parameters() if not p.stop_gradient]
        out[name] = {"places": sorted({str(v.place) for v in (cat, loss)}),
                     "cat": cat.numpy().tolist(), "loss": float(loss), "grads": grads}
    print(json.dumps(out))
    """


def test_eager_transpose_concat_and_a_layer_backward_equal_the_cpu() -> None:
    proc = _run(EAGER_ON_BOTH)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ipu"]["places"] == ["Place(ipu:0)"]
    assert out["cpu"]["places"] == ["Place(cpu)"]
    assert out["ipu"]["cat"] == out["cpu"]["cat"]
    assert out["ipu"]["loss"] == out["cpu"]["loss"]
    assert out["ipu"]["grads"] == out["cpu"]["grads"]


def test_launcher_sees_the_cpu_in_process() -> None:
    proc = run_python(
        "from paddle.distributed.launch.context.device import Device\n"
        "d = Device.parse_device(); print(d.dtype, d.count)\n",
        env={"CUSTOM_DEVICE_ROOT": os.environ.get("CUSTOM_DEVICE_ROOT", "")}
        if "CUSTOM_DEVICE_ROOT" in os.environ
        else None,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["cpu", "1"]


TRAIN = """
import paddle, paddle.distributed as dist
dist.init_parallel_env()
t = paddle.to_tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", t.item(),
      paddle.get_device(), flush=True)
"""


def _launch(tmp_path: Path, extra: dict[str, str] | None) -> tuple[int, list[str], str]:
    tmp_path.mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    proc = subprocess.run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
         "--log_dir", str(tmp_path / "log"), "train.py"],
        cwd=tmp_path,
        env=_clean_env(extra),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    lines = []
    for log in sorted((tmp_path / "log").glob("workerlog.*")):
        lines += [ln for ln in log.read_text().splitlines() if ln.startswith("rank ")]
    return proc.returncode, sorted(lines), proc.stdout + proc.stderr


@pytest.mark.slow
def test_launcher_runs_a_two_process_cpu_job_as_without_the_plugin(tmp_path: Path) -> None:
    rc, lines, output = _launch(tmp_path / "with", None)
    rc_off, lines_off, output_off = _launch(tmp_path / "without", PLUGIN_OFF)
    assert rc_off == 0, output_off[-3000:]
    assert rc == 0, output[-3000:]
    assert lines == lines_off
    assert lines == ["rank 0 of 2 sum 3.0 cpu", "rank 1 of 2 sum 3.0 cpu"]
