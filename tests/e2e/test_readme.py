"""The README's usage example runs as written (a claim of the README is a test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_usage_example_runs(tmp_path: Path) -> None:
    text = README.read_text()
    match = re.search(r"```python\n(import numpy as np, paddle, paddle_ipu\n.*?)```", text, re.S)
    assert match, "the README's usage example was not found"
    code = match.group(1) + "\nprint('LOSSES', losses[0].shape)\n"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOSSES (4,)" in result.stdout
    assert (tmp_path / "ckpt" / "model.safetensors").stat().st_size > 0
