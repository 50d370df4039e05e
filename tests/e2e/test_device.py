"""The "ipu" custom device plugin, as Paddle sees it."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from support.helpers import run_python

import paddle_ipu
from paddle_ipu import device


def test_plugin_registered_without_importing_paddle_ipu() -> None:
    # The import hook (which loads paddle_ipu after paddle) is off: the plugin alone.
    proc = run_python(
        "import sys, paddle\n"
        "assert 'paddle_ipu' not in sys.modules\n"
        "print(paddle.device.get_all_custom_device_type())\n"
        "paddle.set_device('ipu'); print(paddle.get_device())\n",
        env={"PADDLE_IPU_AUTOLOAD": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "'ipu'" in lines[0]
    assert lines[1] == "ipu:0"


def test_registered_in_process() -> None:
    assert "ipu" in paddle.device.get_all_custom_device_type()
    assert device.is_registered()
    assert device.plugin_path() is not None


@pytest.mark.parametrize("name", ["ipu", "ipu:0"])
def test_set_device(name: str) -> None:
    previous = paddle.get_device()
    try:
        paddle.set_device(name)
        assert paddle.get_device() == "ipu:0"
    finally:
        paddle.set_device(previous)


def test_dygraph_round_trip(dygraph: None) -> None:
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = paddle.to_tensor(data, place=paddle.CustomPlace("ipu", 0))
    assert "ipu" in str(t.place)
    out = (t * 2 + 1).numpy()
    np.testing.assert_array_equal(out, data * 2 + 1)
    back = t.to("cpu").numpy()
    np.testing.assert_array_equal(back, data)
    # device to device copy
    t2 = t.clone()
    np.testing.assert_array_equal(t2.numpy(), data)


def test_memory_stats_track_allocations(dygraph: None) -> None:
    before = device.memory_stats(0)["allocated"]
    t = paddle.to_tensor(np.ones((1024, 1024), np.float32), place=paddle.CustomPlace("ipu", 0))
    stats = device.memory_stats(0)
    assert stats["peak"] >= 4 * 1024 * 1024
    assert stats["allocated"] >= before
    assert stats["peak"] >= stats["allocated"]
    del t


def _fc_relu_mean(place: object, x: np.ndarray) -> list[np.ndarray]:
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
            inp = paddle.static.data("x", [-1, 8], "float32")
            init = paddle.nn.initializer.Assign(np.linspace(-1, 1, 8 * 5).reshape(8, 5))
            h = paddle.static.nn.fc(inp, 5, weight_attr=paddle.ParamAttr(initializer=init))
            out = paddle.mean(paddle.nn.functional.relu(h))
            exe = paddle.static.Executor(place)
            exe.run(startup)
            return exe.run(main, feed={"x": x}, fetch_list=[h, out])
    finally:
        paddle.disable_static()


def test_static_program_on_ipu_place_matches_cpu() -> None:
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    on_ipu = _fc_relu_mean(paddle.CustomPlace("ipu", 0), x)
    on_cpu = _fc_relu_mean(paddle.CPUPlace(), x)
    for a, b in zip(on_ipu, on_cpu):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


COUNT = "import paddle; print(len(paddle.device.get_available_custom_device()))"


def test_device_count_from_environment() -> None:
    proc = run_python(COUNT, env={device.DEVICE_COUNT_ENV: "3"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "3"


@pytest.mark.parametrize("bad", ["abc", "0", "-2", "2x", "100000"])
def test_bad_device_count_falls_back_with_error(bad: str) -> None:
    proc = run_python(COUNT, env={device.DEVICE_COUNT_ENV: bad})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"
    assert f'{device.DEVICE_COUNT_ENV}="{bad}" is not a device count' in proc.stderr


#: ipu kernels whose CPU kernel older releases' headers do not declare -> the first series
#: that does (csrc/kernels/kernels.cc leaves them out of builds for older ones)
KERNELS_SINCE = {"masked_fill": (3, 1), "trunc_divide": (3, 3)}
#: kernels whose CPU kernel registers other arguments than its declaration (on every
#: supported release): they keep Paddle's CPU fallback
MISMATCHED = {"sgd_sparse_param_sparse_grad"}


def test_every_ipu_kernel_is_registered_unless_this_release_lacks_it() -> None:
    from paddle_ipu._util.paddle_releases import series

    release = series(paddle.__version__)
    skipped = dict(line.split(": ", 1) for line in device.kernels_not_registered())
    absent = {name for name, since in KERNELS_SINCE.items() if release < since}
    assert {k for k, why in skipped.items() if why.startswith("not in the headers")} == absent
    for name in absent:
        assert paddle_ipu._core.paddle_version in skipped[name]
    assert set(skipped) - absent == MISMATCHED, skipped


def test_version_and_build_info() -> None:
    assert paddle_ipu.__version__
    info = paddle_ipu._core.build_info()
    assert info["paddle_version"] == paddle.__version__


def test_version_mismatch_is_refused() -> None:
    from paddle_ipu._util.versions import check_paddle_version

    check_paddle_version("3.3.1", "3.3.1")
    check_paddle_version("3.3.0", "3.3.1")  # one series, one C ABI
    check_paddle_version("3.2.0", "3.2.2")
    # another supported series than the build's: both releases and the range named
    with pytest.raises(
        paddle_ipu.PaddleVersionError,
        match=r"built against PaddlePaddle 3\.3\.1, but PaddlePaddle 3\.2\.2 .*"
        r"supports PaddlePaddle 3\.0 to 3\.3 \(paddlepaddle>=3\.0,<3\.4\).*"
        r"Install paddlepaddle==3\.3\.\*",
    ):
        check_paddle_version("3.2.2", "3.3.1")
    # an unsupported release
    with pytest.raises(
        paddle_ipu.PaddleVersionError,
        match=r"PaddlePaddle 3\.4\.0 is installed, but paddle-ipu supports PaddlePaddle "
        r"3\.0 to 3\.3 .*made against PaddlePaddle 3\.3\.1",
    ):
        check_paddle_version("3.4.0", "3.3.1")
    with pytest.raises(paddle_ipu.PaddleVersionError, match=r"PaddlePaddle 2\.6\.2 is installed"):
        check_paddle_version("2.6.2", "3.3.1")


def test_import_refuses_other_paddle_version() -> None:
    proc = run_python(
        "import paddle; paddle.__version__ = '9.9.9'\n"
        "try:\n"
        "    import paddle_ipu\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n",
        # The import hook would load paddle_ipu with the real version first.
        env={"PADDLE_IPU_AUTOLOAD": "0"},
    )
    assert "PaddleVersionError" in proc.stdout
    assert "9.9.9" in proc.stdout
    from paddle_ipu._util.paddle_releases import RANGE, describe

    assert f"supports PaddlePaddle {describe()} ({RANGE})" in proc.stdout


def test_import_hook_never_breaks_import_paddle(tmp_path) -> None:
    """A paddle_ipu that fails to import (here a stand-in that raises) costs a warning
    at ``import paddle``, never the import itself."""
    fake = tmp_path / "paddle_ipu"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('stand-in failure')\n")
    proc = run_python(
        "import warnings; warnings.simplefilter('always')\n"
        "import paddle\n"
        "print('IMPORTED', paddle.__version__)\n",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "IMPORTED" in proc.stdout
    assert "paddle-ipu could not be loaded (stand-in failure)" in proc.stderr


def test_plugin_disabled_gives_clear_error() -> None:
    proc = run_python(
        "import paddle_ipu\n"
        "from paddle_ipu import device\n"
        "print(device.is_registered())\n"
        "try:\n"
        "    device.place()\n"
        "except paddle_ipu.DeviceError as e:\n"
        "    print('DeviceError', e)\n",
        env={"CUSTOM_DEVICE_ROOT": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "False"
    assert "DeviceError" in proc.stdout
