"""Writing a file so that a reader sees the old file or the whole new one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from paddle_ipu.errors import IpuError, OutputFileError


def compile_cache_dir() -> Path:
    """The compile cache's directory: ``PADDLE_IPU_CACHE_DIR``, default
    ``~/.cache/paddle_ipu/compile``."""
    env = os.environ.get("PADDLE_IPU_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "paddle_ipu" / "compile"


def write_atomically(
    path: str | os.PathLike[str],
    content: bytes | Callable[[str], None],
    *,
    error: type[IpuError] = OutputFileError,
    what: str = "",
    make_dirs: bool = False,
) -> str:
    """Write ``content`` (bytes, or a function that writes the file it is given) to
    a new temporary file beside ``path``, fsync it, rename it to ``path`` and fsync
    the folder.  A symlink (or anything else) planted at ``path`` is replaced, never
    written through; the temporary file never outlives the call.  ``error`` (named
    ``what`` and the path) for a working directory, folder or file that cannot be
    written.  Returns the absolute path."""
    label = f"{what} " if what else ""
    try:
        target = os.path.abspath(path)
    except OSError as exc:  # the working directory was deleted
        raise error(
            f"cannot write {label}{str(path)!r}: the working directory is not accessible "
            f"({exc}); change to an existing, writable directory"
        ) from exc
    directory = os.path.dirname(target)
    try:
        if make_dirs:
            os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory
        )
    except OSError as exc:
        raise error(
            f"cannot write {label}{target!r}: its directory {directory!r} is missing or "
            f"not writable ({exc.strerror or exc})"
        ) from exc
    try:
        os.fchmod(fd, 0o644)  # what a plain open() would give, not mkstemp's 0600
        if isinstance(content, (bytes, bytearray, memoryview)):
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        else:
            os.close(fd)
            fd = -1
            content(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        raise error(f"cannot write {label}{target!r}: {exc.strerror or exc}") from exc
    finally:
        if fd >= 0:
            os.close(fd)
        if os.path.lexists(tmp):
            os.unlink(tmp)
    with contextlib.suppress(OSError):  # not every file system syncs folders
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target
