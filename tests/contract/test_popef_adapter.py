"""The popart adapter's PopEF serving path (enable_model_runtime_executor) against the
doubles of PopART, model_runtime and popef (tests/contract/popart_double).

The doubles follow the upstream sources named in their docstrings; they are not the
SDK, and passing here says nothing about a real IPU (docs/backends.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from test_session_contract import IN, MB, OUT, affine_model, expected

import paddle_ipu
import paddle_ipu.backends.popart.session as adapter
from paddle_ipu import backends
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.errors import BackendUnavailableError, NotSupportedError, OptionError

DOUBLE_DIR = Path(__file__).parent / "popart_double"
SERVING = {"enable_model_runtime_executor": True}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOUBLE_DIR / name / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def model_runtime(popart_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The model_runtime and popef doubles importable, and one free (double) IPU:
    PopART exports no executable for the IPU Model (session.cpp)."""
    for name in ("popef", "model_runtime"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    _load("popef")
    module = _load("model_runtime")
    # monkeypatch puts the previous (absent) entries back afterwards
    for name in ("popef", "model_runtime"):
        monkeypatch.setitem(sys.modules, name, sys.modules[name])
    monkeypatch.delenv("POPLAR_IPUMODEL", raising=False)
    monkeypatch.setattr(popart_double.DeviceManager, "free_ipus", 1)

    # Record the export, and whether PopART still held the IPU when the runner
    # was made, in the double's event list.
    sessions: list[Any] = []
    export = popart_double.InferenceSession.compileAndExport
    make_runner = module.ModelRunner.__init__

    def recorded_export(self: Any, filename: str, err: Any = None) -> None:
        sessions.append(self)
        module.events.append("compileAndExport")
        export(self, filename, err)

    def recorded_runner(self: Any, *args: Any, **kwargs: Any) -> None:
        attached = any(s._device.isAttached for s in sessions)
        module.events.append("device attached" if attached else "device detached")
        make_runner(self, *args, **kwargs)

    monkeypatch.setattr(popart_double.InferenceSession, "compileAndExport", recorded_export)
    monkeypatch.setattr(module.ModelRunner, "__init__", recorded_runner)
    module.events.clear()
    return module


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((MB, IN)).astype(np.float32)


def test_runs_go_through_the_model_runner(model_runtime: ModuleType) -> None:
    session = adapter.create_session(affine_model(), SessionConfig(options=SERVING))
    assert session.model_runtime
    session.prepare_device()
    assert model_runtime.events == []  # nothing exported before the weights are in
    x0, x1 = _x(0), _x(1)
    np.testing.assert_allclose(session.run({"x": x0})["y"], expected(x0), rtol=1e-6)
    out = {"y": np.empty((MB, OUT), np.float32)}
    assert session.run({"x": x1}, out) is not None
    np.testing.assert_allclose(out["y"], expected(x1), rtol=1e-6)
    assert model_runtime.events == [
        "compileAndExport", "device detached", "ModelRunner", "executeAsync", "executeAsync",
    ]  # fmt: skip
    assert session._session.runs == 0  # PopART's session.run is never called
    path = session.popef_path
    assert path is not None and os.path.isfile(path)
    with pytest.raises(NotSupportedError, match="PopEF"):
        session.read_weights(["w"])  # the device is detached
    session.close()
    assert model_runtime.ModelRunner.live == 0
    assert model_runtime.events[-1] == "~ModelRunner"
    assert not os.path.exists(path)  # the session's temporary export is removed


def test_the_executable_serves_the_written_weights(model_runtime: ModuleType) -> None:
    w1 = np.full((IN, OUT), 0.5, np.float32)
    b1 = np.arange(OUT, dtype=np.float32)
    with adapter.create_session(affine_model(), SessionConfig(options=SERVING)) as session:
        session.prepare_device()
        session.write_weights({"w": w1, "b": b1})
        x = _x(2)
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x, w1, b1), rtol=1e-6)
        # New weights after the export: the runner is dropped, the next run exports again.
        session.write_weights({"b": -b1})
        assert model_runtime.ModelRunner.live == 0
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x, w1, -b1), rtol=1e-6)
    assert model_runtime.events.count("compileAndExport") == 2
    assert model_runtime.ModelRunner.live == 0


def test_a_missing_model_runtime_is_named_at_prepare_time(
    popart_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POPLAR_IPUMODEL", raising=False)
    monkeypatch.setattr(popart_double.DeviceManager, "free_ipus", 1)
    monkeypatch.setitem(sys.modules, "model_runtime", None)  # import raises ImportError
    session = adapter.create_session(affine_model(), SessionConfig(options=SERVING))
    with pytest.raises(BackendUnavailableError, match="'model_runtime'") as info:
        session.prepare_device()
    assert not isinstance(info.value, ModuleNotFoundError)
    assert session._device is None  # refused before any device was taken


def test_what_the_popef_path_does_not_take_is_refused_at_prepare(
    model_runtime: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SessionConfig(batches_per_step=2, options=SERVING)
    with pytest.raises(NotSupportedError, match="batches_per_step"):
        adapter.create_session(affine_model(), cfg).prepare_device()
    monkeypatch.setenv("POPLAR_IPUMODEL", "1")
    with pytest.raises(OptionError, match="POPLAR_IPUMODEL"):
        adapter.create_session(affine_model(), SessionConfig(options=SERVING)).prepare_device()
    # Training keeps PopART's session.run.
    from test_popart_double import training_model

    training = SessionConfig(is_training=True, options=SERVING)
    assert not adapter.create_session(training_model(), training).model_runtime
    assert model_runtime.events == []


# The whole stack: a compiled Paddle program served by ModelRuntime ---------------------


def _serve(built: Any, backend: str) -> Any:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=8)
    s.set_options({"backend": backend, "enable_model_runtime_executor": True, "timeout_ms": 5.0})
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    cp.compile(built.feeds, built.fetches)
    return cp


@pytest.mark.slow
def test_model_runtime_on_the_popef_path_matches_host(model_runtime: ModuleType) -> None:
    from support.models import build

    built = build("mlp")
    rng = np.random.default_rng(5)
    feeds = [built.random_feed(n, rng) for n in (5, 8, 13)]
    host = _serve(built, "host")
    try:
        want = [host.runtime.run(f)[0] for f in feeds]
    finally:
        host.reset()
    assert backends.availability("popart")[0]
    cp = _serve(built, "popart")
    try:
        session = cp.executor.session
        assert session.backend == "popart" and session.model_runtime
        got = [cp.runtime.run(f)[0] for f in feeds]  # ModelRuntime.run
        futures = [cp.runtime.submit(f) for f in feeds]  # ModelRuntime.submit
        submitted = [f.result(timeout=60)[0] for f in futures]
        assert session._session.runs == 0
        events = model_runtime.events
        assert events[:4] == ["compileAndExport", "device detached", "ModelRunner", "executeAsync"]
        assert set(events[3:]) == {"executeAsync"}
    finally:
        cp.reset()
    assert model_runtime.ModelRunner.live == 0
    for w, g, s in zip(want, got, submitted):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s, w, rtol=1e-5, atol=1e-6)
