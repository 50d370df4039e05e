"""A compile's scratch folder, and the checks of the process it runs in.

The program is saved for the converter into anonymous in-memory files (memfd) behind
symlinks in a folder named after the compiling process: a killed compile leaves no
weights on any file system, and the next compile removes the folders of processes that
are gone (:func:`remove_stale_scratch`).  A deleted working directory is refused while
it is still a Python error (:func:`check_working_dir`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from paddle_ipu.errors import WorkDirError

__all__ = ["Scratch", "check_working_dir", "remove_stale_scratch", "scratch_dir", "scratch_folder"]

# Scratch folders are named after the compiling process, so that a later compile can
# tell the folders of a killed process from those of a live one.
_SCRATCH_PREFIX = "paddle_ipu_"
_SCRATCH_RE = re.compile(re.escape(_SCRATCH_PREFIX) + r"(\d+)_")


def scratch_dir() -> str:
    """Where a compile's scratch folder goes: $TMPDIR when it is set (and then it must
    be usable), else /dev/shm, else Python's default temporary directory."""
    chosen = os.environ.get("TMPDIR")
    if chosen:
        if not os.path.isdir(chosen):
            raise WorkDirError(
                f"TMPDIR={chosen!r} is not a directory (missing or deleted): paddle-ipu "
                "writes a compile's scratch files there; point TMPDIR at a writable directory "
                "or unset it"
            )
        if not os.access(chosen, os.W_OK | os.X_OK):
            raise WorkDirError(
                f"TMPDIR={chosen!r} is not writable: paddle-ipu writes a compile's scratch "
                "files there; point TMPDIR at a writable directory or unset it"
            )
        return chosen
    # tmpfs keeps the save/convert round trip in memory.
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    try:
        return tempfile.gettempdir()
    except OSError as exc:
        raise WorkDirError(f"no usable directory for temporary files: {exc}") from exc


def check_working_dir() -> None:
    """A deleted working directory aborts Paddle's native code later on (its library
    loader); say so while it is still a Python error."""
    try:
        os.getcwd()
    except OSError as exc:
        try:
            where = os.readlink("/proc/self/cwd")
        except OSError:
            where = "?"
        raise WorkDirError(
            f"the working directory {where!r} is missing ({exc.strerror}): change to an "
            "existing directory before compiling"
        ) from None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` lives (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_scratch(directory: str) -> list[str]:
    """Remove the scratch folders in ``directory`` that processes of this user left when
    they were killed mid-compile (their pid is dead); return their paths."""
    removed: list[str] = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _SCRATCH_RE.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or (uid is not None and st.st_uid != uid):
            continue
        if pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


@dataclass
class Scratch:
    """A compile's scratch folder.  The files the converter reads are symlinks to
    anonymous in-memory files (memfd) of this process: the weights never have a name
    on any file system, and vanish with the process however it ends."""

    directory: str
    log_path: str
    _fds: dict[str, int]

    def size(self, path: str) -> int:
        fd = self._fds.get(os.path.basename(path))
        return os.fstat(fd).st_size if fd is not None else os.path.getsize(path)


@contextlib.contextmanager
def scratch_folder() -> Iterator[Scratch]:
    """A new scratch folder of this process (the stale ones of dead processes removed
    first), removed with its in-memory files when the block ends."""
    base = scratch_dir()
    remove_stale_scratch(base)
    try:
        directory = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}_", dir=base)
    except OSError as exc:
        raise WorkDirError(
            f"cannot create a scratch folder in {base!r} ({exc.strerror or exc}): "
            "point TMPDIR at a writable directory"
        ) from None
    fds: dict[str, int] = {}
    try:
        log_path = os.path.join(directory, "convert.log")
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            for name in ("model.json", "model.pdiparams", "convert.log"):
                fd = os.memfd_create(f"paddle_ipu_{name}")
                fds[name] = fd
                os.symlink(f"/proc/self/fd/{fd}", os.path.join(directory, name))
            # The converter's forked child inherits the descriptors: /proc/self
            # resolves in either process.
            log_path = f"/proc/self/fd/{fds['convert.log']}"
        yield Scratch(directory, log_path, fds)
    finally:
        for fd in fds.values():
            os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)
