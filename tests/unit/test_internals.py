"""The seam over private interfaces of Paddle, ONNX Runtime and paddle2onnx.

The probes run on the installed releases, so an upgrade that breaks an interface fails
here by name; the scan keeps every private use inside ``paddle_ipu/_internals``; the
fallbacks are exercised by making the checked signature not match.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from paddle_ipu import _internals
from paddle_ipu._internals import ort_api, p2o_api, paddle_api
from paddle_ipu.errors import PrivateApiError

PACKAGE = Path(__file__).resolve().parents[2] / "paddle_ipu"

INTERFACES = _internals.interfaces()


@pytest.mark.parametrize("item", INTERFACES, ids=[f"{i.dependency}:{i.name}" for i in INTERFACES])
def test_every_private_interface_works_on_the_installed_release(item: _internals.Interface) -> None:
    try:
        detail = item.probe()
    except _internals.Unavailable as exc:
        pytest.skip(f"{exc}; the fallback serves on this release")
    assert detail


def test_each_dependency_has_probes() -> None:
    deps = {i.dependency for i in INTERFACES}
    assert deps == {"paddlepaddle", "onnxruntime", "paddle2onnx"}
    assert len(INTERFACES) >= 9


# Private spellings that must not appear outside the seam.
_PRIVATE = re.compile(
    r"\._is_initialized\(|\._ptr\(|\._place\(\)|\._dtype\(\)|\._numel\(|\._to_dlpack\(|"
    r"\._share_data_with\(|_pir_ops|cpp2py_export|\._sess\b|_executor_cache|_pir_feed_data|"
    r"base\.core|base\.framework|\._set_attr\(|\._learning_rate|\"_learning_rate\"|"
    r"\._accumulators\b|\"_accumulators\"|\._beta1\b|\._epsilon\b|\"p2o\.|'p2o\."
)


def test_no_private_interface_is_used_outside_the_seam() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_internals" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = re.sub(r"``[^`]*``", "", line.split("#", 1)[0])  # docs may name them
            if _PRIVATE.search(code):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_a_missing_interface_raises_naming_it_and_the_release_checked() -> None:
    with pytest.raises(PrivateApiError) as info:
        paddle_api.is_initialized(object())
    text = str(info.value)
    assert "DenseTensor._is_initialized()" in text and paddle_api.CHECKED_ON in text
    with pytest.raises(PrivateApiError, match="_beta1"):
        paddle_api.optimizer_attr(object(), "beta1")
    assert paddle_api.optimizer_attr(object(), "beta1", 0.5) == 0.5


class _Binding:
    def run(self, names, feed, options):
        raise AssertionError("a binding with another signature must not be called")


class _Session:
    def __init__(self) -> None:
        self._sess = _Binding()
        self.calls: list[tuple[list[str], dict[str, np.ndarray]]] = []

    def run(self, names, feed):
        self.calls.append((names, feed))
        return [feed["x"] * 2]


def test_onnxruntime_binding_with_another_signature_uses_the_public_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ort_api, "_warned", False)
    session = _Session()
    with caplog.at_level(logging.WARNING, logger="paddle_ipu"):
        run = ort_api.fast_run(session)
        (out,) = run(["y"], {"x": np.ones(2, np.float32)})
    assert out.tolist() == [2.0, 2.0] and session.calls
    assert "InferenceSession._sess.run" in caplog.text and "InferenceSession.run" in caplog.text


def _saved_model(tmp: str) -> str:
    import paddle

    with paddle.pir_utils.IrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [2, 4], "float32")
            out = paddle.nn.functional.relu(paddle.static.nn.fc(x, 3))
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        prefix = os.path.join(tmp, "m")
        paddle.static.save_inference_model(prefix, [x], [out], exe, program=main)
    return prefix


def test_paddle2onnx_binding_with_another_signature_uses_the_public_export(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        prefix = _saved_model(tmp)
        private = p2o_api.export(prefix + ".json", prefix + ".pdiparams", 13, True)
        monkeypatch.setattr(p2o_api, "_EXPORT_SIGNATURE", re.compile("^never$"))
        monkeypatch.setattr(p2o_api, "_warned", False)
        with caplog.at_level(logging.WARNING, logger="paddle_ipu"):
            public = p2o_api.export(prefix + ".json", prefix + ".pdiparams", 13, True)
    assert "paddle2onnx.export" in caplog.text
    a, b = onnx.load_model_from_string(private), onnx.load_model_from_string(public)
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    assert [n.output[:] for n in a.graph.node] == [n.output[:] for n in b.graph.node]


def test_executor_internals_with_another_signature_use_executor_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import paddle

    monkeypatch.setattr(paddle_api, "_runner_checked", None)
    monkeypatch.setattr(paddle_api, "_CACHE_PARAMS", ("self", "program", "renamed"))
    with paddle.pir_utils.IrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [2, 3], "float32")
            y = paddle.scale(x, 3.0)
        exe = paddle.static.Executor(paddle.CPUPlace())
        runner = paddle_api.CachedProgramRunner(exe, main, [y], paddle.static.Scope())
        (out,) = runner.run({"x": np.ones((2, 3), np.float32)})
    assert not runner.fast and not runner._cache
    assert np.asarray(out).tolist() == [[3.0] * 3] * 2


def test_the_report_command_passes_on_the_installed_releases() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "paddle_ipu._internals"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    n = len(INTERFACES)
    assert f"{n} of {n} private interfaces work" in result.stdout
    import paddle

    assert f"paddlepaddle {paddle.__version__}" in result.stdout


def test_the_dtype_table_agrees_with_onnx_numpy_and_paddle() -> None:
    import onnx
    import paddle

    from paddle_ipu._util import dtypes

    for name, entry in dtypes.TABLE.items():
        assert entry.onnx == getattr(
            onnx.TensorProto, name.upper().replace("FLOAT32", "FLOAT").replace("FLOAT64", "DOUBLE")
        ), name
        assert dtypes.from_onnx(entry.onnx) == name
        assert dtypes.numpy_of(name) == np.dtype(entry.numpy)
    for spelling in (paddle.float32, "float32", np.float32, np.dtype("float32"), "paddle.float32"):
        assert dtypes.name_of(spelling) == "float32", spelling
    with paddle.pir_utils.OldIrGuard():
        assert dtypes.name_of(paddle.base.core.VarDesc.VarType.FP16) == "float16"
    assert (
        dtypes.name_of(paddle.bfloat16) == "bfloat16" and dtypes.numpy_of("bfloat16") == np.uint16
    )
    assert dtypes.ort_type("float64") == "tensor(double)" and dtypes.is_integer(paddle.int64)
