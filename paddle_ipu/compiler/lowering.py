"""Running paddle2onnx's converter so that nothing it does can hurt the caller.

The converter is C++ that aborts the process (SIGABRT) on inputs it does not
handle, and its Python package calls ``sys.exit`` from its logger.  Here the
C++ entry point is called (through :mod:`paddle_ipu._internals.p2o_api`; never
``paddle.onnx.export`` or the ``save_file=`` path, which run polygraphy and
pip-install packages), in a forked child process: the child writes the model
bytes back through a pipe and exits; an abort in the child becomes a
:class:`CompileError` in the parent, carrying the converter's own error lines.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Collection

from paddle_ipu._internals import p2o_api
from paddle_ipu.errors import CompileError

MIN_OPSET = 7
MAX_OPSET = 21
DEFAULT_OPSET = 13
# A conversion that takes longer than this is taken to be hung.
TIMEOUT_S = 600.0

_OK = b"K"
_ERR = b"E"


def check_opset(opset: int | None) -> int:
    """The opset to convert with; raise CompileError for one the converter would abort on."""
    if opset is None:
        return DEFAULT_OPSET
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise CompileError(f"opset must be an int in {MIN_OPSET}..{MAX_OPSET}, got {opset!r}")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise CompileError(
            f"opset {opset} is out of range: paddle2onnx converts to ONNX opsets "
            f"{MIN_OPSET}..{MAX_OPSET}"
        )
    return opset


def export_onnx(
    model: str,
    params: str,
    opset: int,
    *,
    auto_upgrade: bool,
    log_path: str,
    isolate: bool = True,
    strip: Collection[str] = (),
) -> bytes:
    """Convert a saved inference model to ONNX bytes.

    ``log_path`` receives the converter's console output; its error lines go into
    the CompileError when conversion fails.  The values of the parameters named in
    ``strip`` are left out of the result (see :func:`weights.strip_constants`): the
    weights stay in the converter's process instead of crossing into this one.
    """
    try:
        p2o_api.converter()  # import it here: its import can fail (or sys.exit)
    except RuntimeError as exc:
        raise CompileError(str(exc)) from None

    def convert() -> bytes:
        return p2o_api.export(model, params, opset, auto_upgrade)

    if not isolate or not hasattr(os, "fork"):
        try:
            return _stripped(convert(), strip)
        except BaseException as exc:
            raise CompileError(f"paddle2onnx failed: {exc!r}") from None
    return _export_in_child(convert, log_path, strip)


def _stripped(raw: bytes, strip: Collection[str]) -> bytes:
    if not strip:
        return raw
    from paddle_ipu.compiler.weights import strip_constants

    return strip_constants(raw, strip)


def _export_in_child(
    convert: Callable[[], bytes], log_path: str, strip: Collection[str] = ()
) -> bytes:
    read_fd, write_fd = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid == 0:  # child: never returns
        status = 0
        try:
            os.close(read_fd)
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            # Paddle's fatal-signal handler prints a C++ traceback; a plain abort
            # is all the parent needs to see.
            signal.signal(signal.SIGABRT, signal.SIG_DFL)
            try:
                payload = _OK + _stripped(convert(), strip)
            except BaseException as exc:
                payload = _ERR + repr(exc).encode("utf-8", "replace")
            _write_all(write_fd, struct.pack("<Q", len(payload)) + payload)
        except BaseException:
            status = 1
        finally:
            os._exit(status)

    os.close(write_fd)
    try:
        data = _read_all(read_fd, pid)
    finally:
        os.close(read_fd)
    _, wait_status = os.waitpid(pid, 0)
    if len(data) >= 9:
        (size,) = struct.unpack("<Q", data[:8])
        payload = data[8 : 8 + size]
        if len(payload) == size and payload[:1] == _OK:
            return payload[1:]
        if payload[:1] == _ERR:
            detail = payload[1:].decode("utf-8", "replace")
            raise CompileError(f"paddle2onnx failed: {detail}{_log_tail(log_path)}")
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        try:
            signame = signal.Signals(sig).name
        except ValueError:
            signame = str(sig)
        raise CompileError(
            f"paddle2onnx crashed ({signame}) while converting the program; "
            f"the process was isolated and is unharmed{_log_tail(log_path)}"
        )
    raise CompileError(
        f"paddle2onnx exited (status {wait_status}) without a model{_log_tail(log_path)}"
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_all(fd: int, pid: int) -> bytes:
    chunks: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise CompileError(f"paddle2onnx did not finish within {TIMEOUT_S:.0f} s")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _log_tail(log_path: str, lines: int = 20) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    keep = [
        ln.strip()
        for ln in text.splitlines()
        if "[ERROR]" in ln or "Error" in ln or "error" in ln or "not supported" in ln
    ]
    keep = [ln for ln in keep if ln][-lines:]
    if not keep:
        return ""
    return "\nconverter output:\n  " + "\n  ".join(keep)
