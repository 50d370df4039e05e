"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any


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


@contextlib.contextmanager
def fresh_programs(seed: int | None = None) -> Iterator[tuple[Any, Any, Any]]:
    """(main, startup, scope): new programs, scope and unique names (under ``seed``, when
    given), all three made current inside the block, in static mode."""
    import paddle

    paddle.enable_static()
    if seed is not None:
        paddle.seed(seed)
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with (
        paddle.utils.unique_name.guard(),
        paddle.static.scope_guard(scope),
        paddle.static.program_guard(main, startup),
    ):
        yield main, startup, scope
