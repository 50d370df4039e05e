"""The compile cache: packages kept by a content address.

The key is the SHA-256 of the saved model's files, the result-changing options, the
backend and the versions of paddle-ipu, Paddle, paddle2onnx and ONNX Runtime
(:func:`paddle_ipu.serving.saved_model.cache_key`).  It is a least-recently-used store
bounded in bytes (``PADDLE_IPU_CACHE_MAX_MB``, default 2048) in ``PADDLE_IPU_CACHE_DIR`` (default
``~/.cache/paddle_ipu/compile``); an entry whose checksum does not match is removed and
compiled again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from paddle_ipu._util.files import compile_cache_dir
from paddle_ipu.errors import OptionError, OutputFileError, PackageError
from paddle_ipu.serving.package import Package, load_package

log = logging.getLogger("paddle_ipu")

__all__ = ["CacheEntry", "cache_clear", "cache_dir", "cache_entries", "get", "put"]

_DEFAULT_CACHE_MB = 2048


def cache_dir() -> Path:
    return compile_cache_dir()


def _cache_limit() -> int:
    raw = os.environ.get("PADDLE_IPU_CACHE_MAX_MB", str(_DEFAULT_CACHE_MB))
    try:
        mb = float(raw)
    except ValueError:
        raise OptionError(f"PADDLE_IPU_CACHE_MAX_MB must be a number of MiB, got {raw!r}") from None
    if not mb >= 0:
        raise OptionError(f"PADDLE_IPU_CACHE_MAX_MB must be >= 0, got {raw!r}")
    return int(mb * (1 << 20))


@dataclass
class CacheEntry:
    key: str
    path: Path
    size: int
    last_used: float
    source: str


def cache_entries() -> list[CacheEntry]:
    """The cache's entries, most recently used first."""
    directory = cache_dir()
    out = []
    for path in _entry_paths(directory):
        try:
            st = path.stat()
            with zipfile.ZipFile(path) as zf:
                source = str(json.loads(zf.read("meta.json")).get("source", "?"))
        except (OSError, zipfile.BadZipFile, KeyError, ValueError):
            source = "(unreadable)"
            try:
                st = path.stat()
            except OSError:
                continue
        out.append(CacheEntry(path.stem, path, st.st_size, st.st_mtime, source))
    out.sort(key=lambda e: e.last_used, reverse=True)
    return out


def _entry_paths(directory: Path) -> Iterator[Path]:
    if directory.is_dir():
        yield from directory.glob("*.pdipu")


def cache_clear() -> int:
    """Remove every entry, and the open graphs' folded shapes kept beside them
    (``open-graph-shapes/``, see :class:`paddle_ipu.compiler.open_shapes.FoldMemo`);
    return how many entries."""
    n = 0
    for path in list(_entry_paths(cache_dir())):
        with contextlib.suppress(OSError):
            path.unlink()
            n += 1
    from paddle_ipu.compiler.open_shapes import FoldMemo

    shapes = cache_dir() / FoldMemo.FOLDER
    if shapes.is_dir():
        for path in list(shapes.glob("*.json")):
            with contextlib.suppress(OSError):
                path.unlink()
    return n


def get(key: str) -> Package | None:
    path = cache_dir() / f"{key}.pdipu"
    if not path.is_file():
        return None
    try:
        package = load_package(path)
    except PackageError as exc:
        log.warning("compile cache: dropping a damaged entry (%s); compiling again", exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used: the mtime is the last use
    return package


def put(key: str, package: Package) -> None:
    directory = cache_dir()
    try:
        package.save(directory / f"{key}.pdipu")
    except OutputFileError as exc:  # a cache that cannot be written is not an error
        log.warning("compile cache: %s; continuing without caching", exc)
        return
    _evict(_cache_limit())


def _evict(limit: int) -> None:
    entries = cache_entries()
    total = sum(e.size for e in entries)
    # Oldest first; the entry just written is the newest and goes last (and does
    # go when it alone exceeds the limit).
    for entry in reversed(entries):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            entry.path.unlink()
            total -= entry.size
