"""The README's main job runs and checks itself."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_digits_demo_trains_and_serves_on_the_emulated_ipu() -> None:
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn (the demo extra)")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "digits.py"), "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "(emulated IPU)" in out and "agreement with Paddle CPU: 1.0000" in out
    accuracy = float(out.split("accuracy: emulated IPU ")[1].split(",")[0])
    assert accuracy > 0.9


def test_hello_ipu_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "hello_ipu.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tempfile.gettempdir(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "matches the CPU" in proc.stdout
