"""Paddle's own log lines and warnings, kept from a user of the IPU (checked on 3.3.1).

Paddle writes glog lines and Python warnings for programs that did nothing wrong: "No
ccache found" at import, "New Executor is Running ..." at the first ``exe.run``, PIR's
"not support input out tensor" while a program is built.  A process that uses paddle-ipu
shows none of them: from an ``import paddle_ipu`` of the user's (not the one the import
hook does for every Paddle process, which changes nothing), from the first
``IpuStrategy``, compile or ``exe.run`` on the ipu place, and in the ``paddle-ipu``
command.  Paddle's errors (glog ERROR and FATAL, exceptions) still show.

The user asks for Paddle's lines back with ``PADDLE_IPU_PADDLE_LOGS=1``; glog's own
``GLOG_minloglevel``/``GLOG_v`` and Python's ``-W``/``PYTHONWARNINGS`` are left to rule
when they are set.

Private interface: glog's ``FLAGS_minloglevel``, which ``libpaddle.so`` and
``libphi_core.so`` (each with its own copy of glog) export; glog reads it at every log
line.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from pathlib import Path

from paddle_ipu._internals import interface
from paddle_ipu._util.env import env_flag

CHECKED_ON = "3.3.1"
_DEP = "paddlepaddle"
#: glog's ``fLI::FLAGS_minloglevel`` (int): 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL
_MINLOGLEVEL = "_ZN3fLI17FLAGS_minloglevelE"
#: Paddle's libraries with a glog of their own, relative to the paddle package
_GLOG_LIBRARIES = ("base/libpaddle.so", "libs/libphi_core.so")
_WARNINGS = r"paddle(\.|$)"

_state = {"warnings": False, "glog": False}
#: the glog levels quiet_paddle changed: (the library's flag, its level before)
_changed: list[tuple[ctypes.c_int, int]] = []


def asked_for_paddle_logs() -> bool:
    """Whether the user asked to see Paddle's lines (``PADDLE_IPU_PADDLE_LOGS``)."""
    return env_flag("PADDLE_IPU_PADDLE_LOGS", False)


def quiet_paddle_warnings() -> None:
    """Ignore the Python warnings raised inside Paddle's modules (safe before Paddle is
    imported; idempotent)."""
    if _state["warnings"] or asked_for_paddle_logs() or sys.warnoptions:
        return
    _state["warnings"] = True
    warnings.filterwarnings("ignore", module=_WARNINGS)


def _glog_levels() -> list[ctypes.c_int]:
    """The ``FLAGS_minloglevel`` of every glog Paddle has loaded."""
    origin = getattr(sys.modules.get("paddle"), "__file__", None)
    if not origin:
        return []
    root = Path(origin).resolve().parent
    levels = []
    for relative in _GLOG_LIBRARIES:
        path = root / relative
        if not path.exists():
            continue
        try:
            # RTLD_NOLOAD: the library Paddle loaded, never a second copy.
            lib = ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            levels.append(ctypes.c_int.in_dll(lib, _MINLOGLEVEL))
        except (OSError, ValueError):
            continue
    return levels


def quiet_paddle() -> None:
    """Keep Paddle's log lines below ERROR and its Python warnings from the user (see
    the module docstring; idempotent, cheap after the first call)."""
    quiet_paddle_warnings()
    if _state["glog"] or "paddle" not in sys.modules:
        return
    _state["glog"] = True
    if asked_for_paddle_logs() or "GLOG_minloglevel" in os.environ or "GLOG_v" in os.environ:
        return
    for level in _glog_levels():
        _changed.append((level, level.value))
        level.value = max(level.value, 2)


def quieted() -> bool:
    """Whether :func:`quiet_paddle` or :func:`quiet_paddle_warnings` took effect."""
    return _state["warnings"] or bool(_changed)


def restore_paddle_logs() -> None:
    """Undo :func:`quiet_paddle` and :func:`quiet_paddle_warnings`: Paddle's log level and
    its warnings as they were (a later use of the IPU quiets them again)."""
    for level, before in _changed:
        level.value = before
    _changed.clear()
    if _state["warnings"]:
        for f in list(warnings.filters):
            if f[0] == "ignore" and getattr(f[3], "pattern", None) == _WARNINGS:
                warnings.filters.remove(f)  # type: ignore[attr-defined]
        # What Python does with a warning no filter matches, as the last filter: adding
        # it through the public call makes the warnings module forget its decisions.
        warnings.simplefilter(getattr(warnings, "defaultaction", "default"), append=True)
    _state["warnings"] = _state["glog"] = False


@interface(
    _DEP,
    "glog's FLAGS_minloglevel exported by libpaddle.so and libphi_core.so",
    "keeping Paddle's INFO and WARNING log lines from a user of the IPU",
    fallback="Paddle's lines show (GLOG_minloglevel=2 hides them)",
)
def _probe_glog() -> str:
    import paddle  # noqa: F401

    levels = _glog_levels()
    assert len(levels) == len(_GLOG_LIBRARIES), (
        f"{_MINLOGLEVEL} found in {len(levels)} of {list(_GLOG_LIBRARIES)}"
    )
    return f"FLAGS_minloglevel in {len(levels)} libraries"
