"""Fixtures for contract tests: tests that every backend must pass.

``backend_name`` runs a test once per backend in the registry, and once more on the
popart adapter over the PopART double (tests/contract/popart_double, id
``popart-double``).  The run on the real popart backend is marked ``popart`` and
skipped, with the backend's own reason, where the Poplar SDK is not importable; any
other backend that is unavailable fails its runs, because the host backend is meant
to work everywhere.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from paddle_ipu.backends import availability, backend_names

DOUBLE = "popart-double"
DOUBLE_DIR = Path(__file__).parent / "popart_double"


def load_popart_double() -> ModuleType:
    """The double's module, loaded under the name ``popart`` without its package
    __init__ (whose import-order check refuses to load after onnx, as PopART's does;
    tests import onnx first)."""
    path = DOUBLE_DIR / "popart" / "_core.py"
    spec = importlib.util.spec_from_file_location("popart", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def popart_double(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The double installed as ``popart`` for one test, on the IPU Model device."""
    module = load_popart_double()
    monkeypatch.setitem(sys.modules, "popart", module)
    monkeypatch.setenv("POPLAR_IPUMODEL", "1")
    for var in ("IPU_COMPILE_ONLY", "IPU_CACHE_PATH"):
        monkeypatch.delenv(var, raising=False)
    return module


def _backend_params() -> list[Any]:
    params = []
    for name in backend_names():
        marks: list[Any] = []
        if name == "popart":
            marks.append(pytest.mark.popart)
            ok, reason = availability(name)
            if not ok:
                marks.append(pytest.mark.skip(reason=f"popart backend unavailable: {reason}"))
        params.append(pytest.param(name, marks=marks, id=name))
    params.append(pytest.param(DOUBLE, id=DOUBLE))
    return params


@pytest.fixture(params=_backend_params())
def backend_name(request: pytest.FixtureRequest) -> str:
    """The name of a backend to run the test against."""
    name = str(request.param)
    if name == DOUBLE:
        request.getfixturevalue("popart_double")
        name = "popart"
    ok, reason = availability(name)
    if not ok:
        pytest.fail(f"the {name} backend is not available: {reason}")
    return name
