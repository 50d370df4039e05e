"""Helpers shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (for state fixed at process start).

    It runs outside the checkout so that ``import paddle_ipu`` finds the installed
    package, not the source tree (which has no compiled core)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=tempfile.gettempdir(),
    )
