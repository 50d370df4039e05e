"""The package's public surface: every public submodule is an attribute of paddle_ipu,
as the docs use them (``paddle_ipu.inference.Config``, ``paddle_ipu.serving``)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tempfile

import pytest

import paddle_ipu

PUBLIC = sorted(
    m.name
    for m in pkgutil.iter_modules(paddle_ipu.__path__)
    if m.name.isidentifier() and not m.name.startswith("_")
)


def test_the_public_submodules_are_the_expected_ones() -> None:
    assert {"inference", "serving", "backends", "compat", "strategy"} <= set(PUBLIC)


def test_every_public_submodule_is_an_attribute_in_a_fresh_interpreter() -> None:
    code = "import paddle_ipu\n" + "".join(
        f"print(paddle_ipu.{name}.__name__)\n" for name in PUBLIC
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        check=False, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [f"paddle_ipu.{name}" for name in PUBLIC]


def test_unknown_and_private_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = paddle_ipu.nope
    with pytest.raises(AttributeError):
        _ = paddle_ipu._nope
