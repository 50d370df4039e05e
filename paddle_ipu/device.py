"""The "ipu" custom device: where the plugin lives, whether Paddle loaded it, and
its statistics.

The plugin (``libpaddle-custom-ipu.so``) is loaded by Paddle itself when
``import paddle`` runs; this module only reports on it.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

from paddle_ipu.errors import DeviceError

DEVICE_TYPE = "ipu"
PLUGIN_NAME = "libpaddle-custom-ipu.so"
#: the ipu kernels of Paddle's eager data transforms (csrc/kernels), in this package
KERNELS_NAME = "libpaddle-ipu-kernels.so"
#: environment variable holding the number of visible emulated IPUs (default 1)
DEVICE_COUNT_ENV = "PADDLE_IPU_VISIBLE_DEVICES"


def plugin_root() -> Path | None:
    """The folder Paddle loads custom-device plugins from, as Paddle resolves it.

    ``None`` when loading is disabled (``CUSTOM_DEVICE_ROOT=''``).
    """
    env = os.environ.get("CUSTOM_DEVICE_ROOT")
    if env is not None:
        return Path(env) if env else None
    import importlib.util

    spec = importlib.util.find_spec("paddle")
    if spec is None or spec.origin is None:
        return None
    return Path(os.path.realpath(spec.origin)).parent.parent / "paddle_custom_device"


def plugin_path() -> Path | None:
    """The plugin library, if it is installed where Paddle looks."""
    root = plugin_root()
    if root is None:
        return None
    path = root / PLUGIN_NAME
    return path if path.exists() else None


def is_registered() -> bool:
    """Whether Paddle loaded the plugin and knows the device type "ipu"."""
    import paddle

    return DEVICE_TYPE in (paddle.device.get_all_custom_device_type() or [])


def device_count() -> int:
    """The number of "ipu" devices Paddle sees (0 when the plugin is not loaded)."""
    if not is_registered():
        return 0
    import paddle

    devices = paddle.device.get_available_custom_device() or []
    return len([d for d in devices if d.startswith("ipu")])


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    path = plugin_path()
    if path is None:
        raise DeviceError(
            f"the ipu plugin {PLUGIN_NAME} is not installed in {plugin_root()}; "
            "reinstall paddle-ipu (pip install paddle-ipu)"
        )
    # The library is already loaded by Paddle; dlopen returns the same handle.
    return ctypes.CDLL(str(path))


def memory_stats(device: int = 0) -> dict[str, int]:
    """Bytes allocated on an emulated IPU right now and at the peak."""
    lib = _library()
    lib.paddle_ipu_device_memory_used.restype = ctypes.c_size_t
    lib.paddle_ipu_device_memory_peak.restype = ctypes.c_size_t
    return {
        "allocated": int(lib.paddle_ipu_device_memory_used(ctypes.c_int(device))),
        "peak": int(lib.paddle_ipu_device_memory_peak(ctypes.c_int(device))),
    }


def selected_device() -> int:
    """The ipu device Paddle's launcher gave this process (``FLAGS_selected_ipus``, set
    when the launcher sees the ipu devices: ``PADDLE_IPU_DEFAULT_DEVICE=1``), else 0."""
    raw = os.environ.get("FLAGS_selected_ipus", "").split(",")[0].strip()  # noqa: SIM112 - Paddle spells it so
    if not raw:
        return 0
    if not raw.isdigit():
        raise DeviceError(f"FLAGS_selected_ipus: expected an ipu device index, received {raw!r}")
    return int(raw)


def place(device: int | None = None) -> object:
    """``paddle.CustomPlace("ipu", device)``, with a clear error when unavailable.
    ``device`` defaults to this process's device (:func:`selected_device`): under
    Paddle's launcher with the ipu devices visible to it, each process has its own."""
    import paddle

    if device is None:
        device = selected_device()

    if not is_registered():
        raise DeviceError(
            'Paddle did not load the "ipu" device plugin '
            f"(looked in {plugin_root()}); reinstall paddle-ipu, and check that "
            "CUSTOM_DEVICE_ROOT is unset or points at the folder holding "
            f"{PLUGIN_NAME}"
        )
    return paddle.CustomPlace(DEVICE_TYPE, device)


_kernels: ctypes.CDLL | None = None


def register_kernels() -> int:
    """Give Paddle the ipu kernels of csrc/kernels: Paddle's CPU kernels, run on the ipu
    tensors' own (host) memory.

    They cover the data transforms Paddle runs on the tensor's own device with no CPU
    fallback (``contiguous``, ``cast``, ``strided_copy``, ``fill``: without them
    ``paddle.concat`` of a transposed ipu tensor raised "kernel contiguous is not
    registered"), the ops with an in-place form (Paddle's fallback runs those on a copy,
    so ``v = x[1]; v.add_(1)`` lost the write) and the optimizers' updates.  Done once,
    at ``import paddle_ipu`` (a no-op when the plugin is not loaded); returns the number
    of kernels added (0 the second time)."""
    global _kernels
    if _kernels is not None or not is_registered():
        return 0
    path = Path(__file__).resolve().parent / KERNELS_NAME
    if not path.exists():  # a source tree (a copy, or a clone beside an editable install)
        raise DeviceError(
            f"the ipu kernels {path} are missing: paddle_ipu is imported from its source "
            f"tree ({path.parent.parent}) instead of the installed package: install it "
            "with `pip install .` and run Python from another directory"
        )
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise DeviceError(
            f"the ipu kernels {path} could not be loaded ({exc}); they are built against "
            "the installed PaddlePaddle: reinstall paddle-ipu (pip install --force-reinstall "
            "paddle-ipu)"
        ) from None
    added = int(library.paddle_ipu_register_kernels())
    _kernels = library
    return added


def kernels_registered() -> bool:
    """Whether :func:`register_kernels` gave Paddle the ipu kernels in this process."""
    return _kernels is not None


def kernels_not_registered() -> list[str]:
    """The ipu kernels that could not be registered, as ``"name: reason"`` (empty when
    every kernel matched the installed Paddle's CPU kernel)."""
    if _kernels is None:
        return []
    _kernels.paddle_ipu_kernels_skipped.restype = ctypes.c_char_p
    text = _kernels.paddle_ipu_kernels_skipped() or b""
    return [line for line in text.decode().splitlines() if line]


#: the host backend's Paddle operators (csrc/ops: ipu_round_fp16), in this package
OPERATORS_NAME = "libpaddle-ipu-ops.so"
_operators: list[str] | None = None
#: how long the forked child may take to register the operators (a child of a process
#: with threads can block on a lock another thread held at the fork: then it is killed)
_PROBE_SECONDS = 60.0


def _wait_child(pid: int, seconds: float) -> int:
    """The child's exit status; -1 (after killing it) when it runs longer than
    ``seconds``."""
    import signal
    import time

    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.01)


def load_host_operators() -> list[str]:
    """Register the host backend's Paddle operators (csrc/ops) with Paddle, once per
    process; returns their names (empty where they cannot be registered: the library is
    missing, or built for another Paddle).

    Paddle 3.3.1 registers a library's operators by walking every custom operator the
    process holds, and aborts the process when one of them is a Python op
    (``paddle.static.register_op``: "Unsupported `void*` type value as custom
    attribute").  The registration is therefore tried first in a forked child; only if
    the child survives does this process register them.  paddle-ipu calls this before it
    registers a Python op of its own (frontends.graph_op) and where the host needs the
    operators (backends.host.fp16_program)."""
    global _operators
    if _operators is not None:
        return _operators
    path = Path(__file__).resolve().parent / OPERATORS_NAME
    _operators = []
    if not path.exists():
        return _operators
    from paddle_ipu._internals import paddle_api

    if hasattr(os, "fork"):
        pid = os.fork()
        if pid == 0:  # the child: try, and report by the exit status only
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                paddle_api.load_custom_operators(str(path))
            except BaseException:
                os._exit(1)
            os._exit(0)
        status = _wait_child(pid, _PROBE_SECONDS)
        if status != 0:
            import logging

            logging.getLogger("paddle_ipu").warning(
                "the host's operators (%s) cannot be registered with Paddle in this process "
                "(a Python op registered before them makes Paddle abort): float16 training "
                "rounds with Paddle's own operators, which is slower",
                path,
            )
            return _operators
    try:
        _operators = paddle_api.load_custom_operators(str(path))
    except Exception as exc:  # a library built for another Paddle
        import logging

        logging.getLogger("paddle_ipu").warning(
            "the host's operators (%s) did not load: %s", path, exc
        )
    return _operators
