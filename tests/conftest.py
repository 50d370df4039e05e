from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import numpy as np
import paddle
import pytest


@pytest.fixture
def static_mode() -> Iterator[None]:
    """Run the test in static-graph mode with fresh programs and scope."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        yield
    paddle.disable_static()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


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
