"""The host backend's ONNX Runtime threads: they spin between runs unless the model
runtime serves the graph (its callers' threads need the cores), and an explicit
``host_spin_threads`` always wins.  bench/serving.py --in-process measures the effect
(the ``runtime exe.run`` rows)."""

from __future__ import annotations

import pytest

from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.backends.host.session import _spin


@pytest.mark.parametrize(
    ("options", "explicit", "spins"),
    [
        ({}, set(), True),
        ({"enable_model_runtime_executor": True}, {"enable_model_runtime_executor"}, False),
        (
            {"enable_model_runtime_executor": True, "host_spin_threads": True},
            {"enable_model_runtime_executor", "host_spin_threads"},
            True,
        ),
        ({"host_spin_threads": False}, {"host_spin_threads"}, False),
    ],
)
def test_threads_spin_unless_the_model_runtime_serves(
    options: dict[str, bool], explicit: set[str], spins: bool
) -> None:
    assert _spin(SessionConfig(options=options, explicit=frozenset(explicit))) is spins
