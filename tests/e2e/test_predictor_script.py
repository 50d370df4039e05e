"""A Paddle Inference CPU predictor script, as Paddle's docs write one, run unchanged
except for one added ``config.enable_ipu()`` line: it runs on the IPU and gives the
CPU predictor's results.  Each run is a fresh interpreter that imports nothing but
``paddle.inference`` (and numpy): paddle_ipu comes in through its autoload hook, as it
does for a user.  The model is saved by a legacy-IR program (a ``.pdmodel``, what most
deployed models are)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.helpers import run_python

SAVE = """
import numpy as np, paddle
paddle.enable_static()
paddle.seed(3)
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 3, 16, 16], "float32")
    y = paddle.nn.Conv2D(3, 4, 3)(x)
    y = paddle.nn.functional.relu(paddle.nn.BatchNorm2D(4)(y))
    y = paddle.nn.Linear(4 * 14 * 14, 10)(paddle.flatten(y, 1))
    out = paddle.nn.functional.softmax(y)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
paddle.static.save_inference_model({prefix!r}, [x], [out], exe, program=main)
"""

# Paddle Inference's Python example (paddle_infer.Config(model, params), the CPU
# settings, handles, copy_from_cpu / run / copy_to_cpu), on two batch sizes.
SCRIPT = """
import sys
import numpy as np
import paddle.inference as paddle_infer

config = paddle_infer.Config({model!r}, {params!r})
config.enable_memory_optim()
config.set_cpu_math_library_num_threads(1)
config.switch_ir_optim(True)
{enable_ipu}
predictor = paddle_infer.create_predictor(config)
input_names = predictor.get_input_names()
input_handle = predictor.get_input_handle(input_names[0])
results = {{}}
for batch in (1, 4, 1):
    data = np.random.default_rng(batch).standard_normal([batch, 3, 16, 16]).astype("float32")
    input_handle.reshape([batch, 3, 16, 16])
    input_handle.copy_from_cpu(data)
    predictor.run()
    output_names = predictor.get_output_names()
    output_handle = predictor.get_output_handle(output_names[0])
    results["batch%d" % batch] = output_handle.copy_to_cpu()
np.savez(sys.argv[1], **results)
print("ran on", "ipu" if config.use_ipu() else "cpu", type(predictor).__module__)
"""


def _script(prefix: str, ipu: bool) -> str:
    return SCRIPT.format(
        model=prefix + ".pdmodel",
        params=prefix + ".pdiparams",
        enable_ipu="config.enable_ipu()" if ipu else "",
    )


def _run_script(tmp: Path, script: str, out: Path, env: dict[str, str]) -> Any:
    path = tmp / f"{out.stem}.py"
    path.write_text(script)
    return subprocess.run(
        [sys.executable, str(path), str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tempfile.gettempdir(),
    )


@pytest.mark.slow
def test_cpu_predictor_script_runs_on_the_ipu_changed_only_by_enable_ipu(tmp_path: Path) -> None:
    prefix = str(tmp_path / "model")
    saved = run_python(SAVE.format(prefix=prefix), env={"FLAGS_enable_pir_api": "0"})
    assert saved.returncode == 0, saved.stderr[-3000:]
    assert Path(prefix + ".pdmodel").exists()
    cpu_script = _script(prefix, ipu=False)
    ipu_script = _script(prefix, ipu=True)
    changed = [(a, b) for a, b in zip(cpu_script.splitlines(), ipu_script.splitlines()) if a != b]
    assert changed == [("", "config.enable_ipu()")]

    env = {"PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}
    cpu = _run_script(tmp_path, cpu_script, tmp_path / "cpu.npz", env)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    assert "ran on cpu" in cpu.stdout
    ipu = _run_script(tmp_path, ipu_script, tmp_path / "ipu.npz", env)
    assert ipu.returncode == 0, ipu.stderr[-3000:]
    assert "ran on ipu paddle_ipu.inference" in ipu.stdout
    want, got = np.load(tmp_path / "cpu.npz"), np.load(tmp_path / "ipu.npz")
    assert sorted(got.files) == ["batch1", "batch4"]
    for key in want.files:
        assert got[key].shape == want[key].shape
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


# The same script as a Paddle 3 user writes it for a custom device, with the settings
# real engines make (a thread count, Paddle's INFO lines off), in the dygraph mode a
# script starts in; then the script's own dygraph code.
CUSTOM_DEVICE_SCRIPT = """
import logging, sys
import numpy as np
import paddle
import paddle.inference as paddle_infer

records = []
counter = logging.Handler()
counter.emit = records.append
logging.getLogger("paddle_ipu").addHandler(counter)
config = paddle_infer.Config({model!r}, {params!r})
config.set_cpu_math_library_num_threads(1)
config.disable_glog_info()
config.enable_custom_device("ipu", 0)
predictor = paddle_infer.create_predictor(config)
handle = predictor.get_input_handle(predictor.get_input_names()[0])
data = np.random.default_rng(1).standard_normal([1, 3, 16, 16]).astype("float32")
handle.reshape([1, 3, 16, 16])
handle.copy_from_cpu(data)
predictor.run()
out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
handle.reshape([3, 3, 16, 16])  # another batch: compiled again, with a log line
handle.copy_from_cpu(np.concatenate([data] * 3))
predictor.run()
np.savez(sys.argv[1], batch1=out)
print("ran on", type(predictor).__module__)
print("info lines", sum(r.levelno == logging.INFO for r in records))
print("threads", predictor._shared.shapes.executor("").session_config().num_threads)
print("dynamic", paddle.in_dynamic_mode(), paddle.get_device())
layer = paddle.jit.to_static(paddle.nn.Linear(2, 2), full_graph=True)
print("to_static", tuple(layer(paddle.ones([1, 2])).shape))
"""


@pytest.mark.slow
def test_enable_custom_device_runs_the_compiled_graph_as_real_engines_configure_it(
    tmp_path: Path,
) -> None:
    """``enable_custom_device("ipu", 0)`` (Paddle 3's spelling) runs the compiled graph,
    not Paddle's kernels one by one; the thread count is the host's; after
    ``disable_glog_info()`` no INFO line of paddle-ipu's shows; the script's mode and
    device are as they were, so its dygraph code runs next."""
    prefix = str(tmp_path / "model")
    saved = run_python(SAVE.format(prefix=prefix), env={"FLAGS_enable_pir_api": "0"})
    assert saved.returncode == 0, saved.stderr[-3000:]
    env = {"PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}
    cpu = _run_script(tmp_path, _script(prefix, ipu=False), tmp_path / "cpu.npz", env)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    script = CUSTOM_DEVICE_SCRIPT.format(model=prefix + ".pdmodel", params=prefix + ".pdiparams")
    ipu = _run_script(tmp_path, script, tmp_path / "ipu.npz", env)
    assert ipu.returncode == 0, ipu.stderr[-3000:]
    lines = ipu.stdout.splitlines()
    assert "ran on paddle_ipu.inference" in lines
    assert "threads 1" in lines
    assert "dynamic True cpu" in lines
    assert "to_static (1, 2)" in lines
    assert "info lines 0" in lines
    np.testing.assert_allclose(
        np.load(tmp_path / "ipu.npz")["batch1"],
        np.load(tmp_path / "cpu.npz")["batch1"],
        rtol=1e-5,
        atol=1e-6,
    )
