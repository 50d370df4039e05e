"""Fixtures for contract tests: tests that every backend must pass.

``backend_name`` runs a test once per backend in the registry.  The popart run is
marked ``popart`` and skipped, with the backend's own reason, where the Poplar SDK
is not importable; any other backend that is unavailable fails its runs, because
the host backend is meant to work everywhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from paddle_ipu.backends import availability, backend_names


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
    return params


@pytest.fixture(params=_backend_params())
def backend_name(request: pytest.FixtureRequest) -> str:
    """The name of a backend to run the test against."""
    name = str(request.param)
    ok, reason = availability(name)
    if not ok:
        pytest.fail(f"the {name} backend is not available: {reason}")
    return name
