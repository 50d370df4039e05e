"""paddle-ipu installed from the checkout into a fresh environment that already holds an
older supported PaddlePaddle (3.2.2): pip's default, isolated build compiles against
that Paddle and keeps it, the device registers, and a compiled training program gives
the losses and weights Paddle's CPU executor gives.

Every install runs with ``--no-index`` from the folder of wheels that
``tools/check_paddle_releases.sh`` fetched (``PADDLE_IPU_RELEASE_WHEELS``, default
``build/paddle-releases``): nothing is downloaded here.  Without that folder the test is
skipped, unless ``PADDLE_IPU_RELEASE_WHEELS`` names it (as CI does): then it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: the release the issue names; any release of another series than the suite's works
VERSION = "3.2.2"
WHEELS_ENV = "PADDLE_IPU_RELEASE_WHEELS"

#: trains a two-layer model for five SGD steps (new data each step) on Paddle's CPU
#: executor and compiled on the ipu, from the same weights
SCRIPT = r"""
import json

import numpy as np
import paddle

registered = "ipu" in (paddle.device.get_all_custom_device_type() or [])
import paddle_ipu  # noqa: E402

paddle.enable_static()
rng = np.random.default_rng(7)
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [8, 6], "float32")
    y = paddle.static.data("y", [8, 1], "float32")
    w1 = paddle.create_parameter([6, 16], "float32", name="w1")
    w2 = paddle.create_parameter([16, 1], "float32", name="w2")
    pred = paddle.matmul(paddle.nn.functional.relu(paddle.matmul(x, w1)), w2)
    loss = paddle.nn.functional.mse_loss(pred, y)
    paddle.optimizer.SGD(learning_rate=0.05).minimize(loss)
init = {"w1": rng.standard_normal((6, 16)).astype("float32") * 0.3,
        "w2": rng.standard_normal((16, 1)).astype("float32") * 0.3}
# new data every step
steps = [(rng.standard_normal((8, 6)).astype("float32"),
          rng.standard_normal((8, 1)).astype("float32")) for _ in range(5)]


def train(place, compile_it):
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(place)
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        for name, value in init.items():
            scope.var(name).get_tensor().set(value, paddle.CPUPlace())
        program = main
        if compile_it:
            strategy = paddle_ipu.IpuStrategy()
            strategy.set_graph_config(is_training=True, micro_batch_size=8)
            compiled = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=strategy)
            program = compiled.compile(["x", "y"], [loss])
        losses = [float(np.asarray(exe.run(program, feed={"x": a, "y": b}, fetch_list=[loss])[0]))
                  for a, b in steps]
        if compile_it:
            compiled.weights_to_host()
        weights = {n: np.array(scope.find_var(n).get_tensor()).tolist() for n in init}
    return losses, weights


cpu = train(paddle.CPUPlace(), False)
ipu = train(paddle.CustomPlace("ipu", 0), True)
print(json.dumps({
    "paddle": paddle.__version__,
    "registered": registered,
    "built_against": paddle_ipu._core.paddle_version,
    "cpu": cpu,
    "ipu": ipu,
}))
"""


def _wheels() -> Path:
    named = os.environ.get(WHEELS_ENV)
    wheels = Path(named) if named else ROOT / "build" / "paddle-releases"
    if not list(wheels.glob(f"paddlepaddle-{VERSION}-*.whl")):
        message = (
            f"no paddlepaddle {VERSION} wheel in {wheels}: fetch the wheels with "
            f"`tools/check_paddle_releases.sh --fetch-only {VERSION}`"
        )
        if named:
            pytest.fail(message)
        pytest.skip(message)
    return wheels


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def _copy_checkout(target: Path) -> None:
    """The checkout's files without its build products (pip builds a local folder in
    place: the suite's own build folder stays untouched)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def test_install_into_an_environment_holding_paddle_3_2_keeps_it(tmp_path: Path) -> None:
    wheels = _wheels()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PADDLE_IPU_PADDLE_VERSION", None)
    # `import paddle` sets CUSTOM_DEVICE_ROOT to its own plugin folder (this suite's
    # plugin, built against another release): the new environment loads its own.
    env.pop("CUSTOM_DEVICE_ROOT", None)
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", f"paddlepaddle=={VERSION}"], tmp_path, env)
    source = tmp_path / "src"
    _copy_checkout(source)
    # pip's defaults: an isolated build, dependencies resolved against what is installed
    _run([python, "-m", "pip", "install", "--quiet", str(source)], tmp_path, env)

    shown = _run([python, "-m", "pip", "list", "--format", "json"], tmp_path, env)
    installed = {p["name"].lower(): p["version"] for p in json.loads(shown)}
    assert installed["paddlepaddle"] == VERSION
    requires = _run(
        [python, "-c", "import importlib.metadata as m; print(m.requires('paddle-ipu'))"],
        tmp_path,
        env,
    )
    major, minor = VERSION.split(".")[:2]
    assert f"paddlepaddle<{major}.{int(minor) + 1},>={major}.{minor}" in requires

    (tmp_path / "script.py").write_text(SCRIPT)
    result = json.loads(_run([python, "script.py"], tmp_path, env).splitlines()[-1])
    assert result["paddle"] == VERSION
    assert result["built_against"] == VERSION
    assert result["registered"]
    cpu_losses, cpu_weights = result["cpu"]
    ipu_losses, ipu_weights = result["ipu"]
    np.testing.assert_allclose(ipu_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    assert len(set(cpu_losses)) == len(cpu_losses)  # the data changed every step
    for name, expected in cpu_weights.items():
        np.testing.assert_allclose(ipu_weights[name], expected, rtol=1e-5, atol=1e-6)
