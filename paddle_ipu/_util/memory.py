"""The process's memory as the C allocator sees it (Linux, glibc), for what one input
shape of a model holds (:mod:`paddle_ipu.executor.specialised`).

- :func:`allocated_bytes`: the bytes the program holds from ``malloc`` now (glibc's
  ``mallinfo2``: in use in its arenas plus its ``mmap`` blocks), None where that is not
  available.  Unlike the resident memory it does not depend on where the allocator
  put a block: a session built in memory that another session freed (and the allocator
  kept) adds its own size, where the resident memory does not grow at all;
- :func:`resident_bytes`: the resident memory (``/proc/self/statm``; 0 elsewhere);
- :func:`trim`: give the allocator's free pages back to the system (``malloc_trim``),
  after a session of a large shape was freed: glibc keeps freed memory in its arenas,
  and a process that builds and frees sessions of many sizes grows in resident memory
  that it does not use.  False where it is not available.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

__all__ = ["allocated_bytes", "resident_bytes", "trim"]

try:
    _PAGE = int(os.sysconf("SC_PAGE_SIZE"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    _PAGE = 4096


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_lock = threading.Lock()
_libc: list[Any] = []  # [the C library with mallinfo2 / malloc_trim, or None], once


def _c() -> Any:
    with _lock:
        if not _libc:
            found = None
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(lib, "mallinfo2") and hasattr(lib, "malloc_trim"):  # glibc >= 2.33
                    lib.mallinfo2.restype = _MallInfo2
                    lib.mallinfo2.argtypes = []
                    lib.malloc_trim.restype = ctypes.c_int
                    lib.malloc_trim.argtypes = [ctypes.c_size_t]
                    found = lib
            except OSError:
                pass
            _libc.append(found)
        return _libc[0]


def allocated_bytes() -> int | None:
    """The bytes held from the C allocator now (see the module docstring); None where
    glibc's ``mallinfo2`` is not there."""
    lib = _c()
    if lib is None:
        return None
    info = lib.mallinfo2()
    return int(info.uordblks) + int(info.hblkhd)


def resident_bytes() -> int:
    """The process's resident memory (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def trim() -> bool:
    """Return the allocator's free pages to the system (glibc's ``malloc_trim(0)``);
    False where it is not available."""
    lib = _c()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True
