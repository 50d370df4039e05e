"""``paddle-ipu selftest``: passes on host, and on the PopART double, with a report."""

from __future__ import annotations

from types import ModuleType

import pytest

from paddle_ipu.backends import selftest


def test_selftest_passes_on_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert selftest.main(["--backend", "host"]) == 0
    out = capsys.readouterr().out
    assert "backend: host" in out and "5 passed, 0 failed" in out
    assert "[PASS] layout SUM: bps=3 rf=2 shape=[2, 2, 4]" in out


def test_selftest_on_the_popart_double(
    popart_double: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert selftest.main(["--backend", "popart"]) == 0
    out = capsys.readouterr().out
    assert "backend: popart (popart 3.4.0-double)" in out and "POPLAR_IPUMODEL=1" in out


def test_selftest_reports_a_failing_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(selftest, "_weights", lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert selftest.main(["--backend", "host"]) == 1
    assert "[FAIL] weights round trip: ValueError: boom" in capsys.readouterr().out
