"""The backend registry: names, availability, resolution and session creation."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import paddle_ipu.backends as backends
from paddle_ipu.backends.base import Session, SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import BackendUnavailableError, UnknownOptionError


def _model() -> CompiledModel:
    spec = TensorSpec("x", "float32", (2, 3))
    return CompiledModel(onnx=b"", inputs=[spec], outputs=[spec])


@pytest.fixture
def no_popart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import popart`` fail here, whether or not the SDK is installed."""
    monkeypatch.setitem(sys.modules, "popart", None)


def test_registry_lists_host_and_popart() -> None:
    names = backends.backend_names()
    assert "host" in names and "popart" in names
    table = backends.available_backends()
    assert set(names) == set(table)
    for ok, text in table.values():
        assert isinstance(ok, bool) and text


def test_popart_reports_unavailability_with_reason(no_popart: None) -> None:
    ok, reason = backends.availability("popart")
    assert ok is False
    assert reason.startswith("popart is not importable:")
    assert backends.available_backends()["popart"] == (False, reason)


def test_create_popart_session_without_sdk_raises_with_reason(no_popart: None) -> None:
    _, reason = backends.availability("popart")
    with pytest.raises(BackendUnavailableError) as info:
        backends.create_session("popart", _model(), SessionConfig())
    assert reason in str(info.value)
    assert "popart" in str(info.value)


def test_auto_resolves_to_host_without_sdk(no_popart: None) -> None:
    assert backends.resolve("auto") == "host"


def test_auto_resolves_to_popart_when_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "popart", types.ModuleType("popart"))
    assert backends.resolve("auto") == "popart"


def test_unknown_backend_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownOptionError, match="host"):
        backends.resolve("cuda")
    with pytest.raises(UnknownOptionError):
        backends.create_session("cuda", _model(), SessionConfig())


class _EchoSession(Session):
    backend = "echo"

    def prepare_device(self) -> None:
        pass

    def write_weights(self, weights):  # type: ignore[no-untyped-def]
        pass

    def read_weights(self, names=None, *, copy=True):  # type: ignore[no-untyped-def]
        return {}

    def run(self, inputs, outputs=None):  # type: ignore[no-untyped-def]
        return dict(inputs)

    def set_random_seed(self, seed: int) -> None:
        pass


def test_register_a_third_backend() -> None:
    backends.register("echo", _EchoSession, lambda: (True, "always"))
    try:
        assert "echo" in backends.backend_names()
        assert backends.available_backends()["echo"] == (True, "always")
        session = backends.create_session("echo", _model(), SessionConfig())
        assert isinstance(session, _EchoSession)
        backends.register("echo", _EchoSession, lambda: (False, "switched off"))
        with pytest.raises(BackendUnavailableError, match="switched off"):
            backends.create_session("echo", _model(), SessionConfig())
    finally:
        backends.unregister("echo")
    assert "echo" not in backends.backend_names()


def test_a_failing_availability_check_reports_instead_of_raising() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("driver exploded")

    backends.register("broken", _EchoSession, broken)
    try:
        ok, reason = backends.availability("broken")
        assert not ok and "driver exploded" in reason
    finally:
        backends.unregister("broken")


def test_auto_cannot_be_registered() -> None:
    with pytest.raises(ValueError):
        backends.register("auto", _EchoSession, lambda: (True, ""))


def _identity_model() -> CompiledModel:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return CompiledModel(
        onnx=proto.SerializeToString(),
        inputs=[TensorSpec("x", "float32", (2, 3))],
        outputs=[TensorSpec("y", "float32", (2, 3))],
        opset=13,
    )


def test_every_backend_runs_an_identity_graph(backend_name: str) -> None:
    config = SessionConfig(batches_per_step=2)
    with backends.create_session(backend_name, _identity_model(), config) as session:
        assert session.backend == backend_name
        session.prepare_device()
        x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
        out = session.run({"x": x})
        np.testing.assert_array_equal(out["y"], x)
