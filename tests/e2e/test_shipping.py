"""What a new user meets first: imports, the public names, other architectures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import run_python

ROOT = Path(__file__).resolve().parents[2]


def test_import_from_a_source_tree_says_what_to_do(tmp_path: Path) -> None:
    # A copy of the source tree without the compiled core, as a fresh clone is.
    shutil.copytree(
        ROOT / "paddle_ipu",
        tmp_path / "paddle_ipu",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PADDLE_IPU_AUTOLOAD"] = "0"
    result = subprocess.run(
        [sys.executable, "-c", "import paddle_ipu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "source tree" in result.stderr and "pip install ." in result.stderr


def test_dir_lists_the_public_api_before_first_use() -> None:
    result = run_python("import paddle_ipu; print(' '.join(dir(paddle_ipu)))")
    assert result.returncode == 0, result.stderr[-2000:]
    names = set(result.stdout.split())
    for name in ("IpuStrategy", "IpuCompiledProgram", "ipu_shard_guard", "FetchError"):
        assert name in names


def test_public_names_resolve() -> None:
    import paddle_ipu

    for name in paddle_ipu.__all__:
        assert getattr(paddle_ipu, name) is not None, name


def test_cxx_parts_compile_for_aarch64() -> None:
    """The fp16 core has a scalar path for other architectures: cross-compile it (and
    the device plugin) for aarch64. CI installs the cross compiler."""
    if shutil.which("aarch64-linux-gnu-g++") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install g++-aarch64-linux-gnu for this check")
        pytest.skip("no aarch64 cross compiler (apt-get install g++-aarch64-linux-gnu)")
    # the script's `python` is this one (its Paddle's headers), venv activated or not
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    result = subprocess.run(
        ["bash", str(ROOT / "tools" / "check_aarch64.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PATH": path},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_subpackage_is_packaged() -> None:
    """pyproject.toml's package list covers every package folder of the source (a
    missing one installs a paddle_ipu that fails at import)."""
    import tomllib
    from setuptools import find_namespace_packages, find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packaged = set(find_packages(str(ROOT), include=config["packages"]["find"]["include"]))
    present = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "paddle_ipu").rglob("__init__.py")
        if "__pycache__" not in path.parts
    }
    assert present <= packaged, sorted(present - packaged)
    # No stray namespace folders holding modules outside any package.
    loose = {
        name
        for name in find_namespace_packages(str(ROOT), include=["paddle_ipu.*"])
        if any((ROOT / name.replace(".", "/")).glob("*.py")) and name not in packaged
    }
    assert not loose, sorted(loose)
