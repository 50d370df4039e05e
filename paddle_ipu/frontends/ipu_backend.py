"""Paddle 2.x's ``paddle.base.core.IpuBackend`` and ``IpuCompiledProgram._backend``.

In 2.x there was one IPU backend per process, holding the program compiled last; here
each compiled program has its own executor, and :class:`IpuBackend` acts on the one
compiled (or trained through :mod:`paddle_ipu.frontends.dygraph`) most recently
(:func:`last_compiled`), or, as a program's ``_backend``, on that program.
``IpuCompiledProgram._backend`` is the compiled program's own property;
:func:`paddle_ipu.compat.install` puts ``core.IpuBackend`` in Paddle's module.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from paddle_ipu.errors import CompileError

_last_compiled: dict[str, weakref.ReferenceType[Any] | None] = {"target": None}


def set_last_compiled(target: Any) -> None:
    """Record ``target`` (a compiled program or a dygraph model) as the one compiled
    last in this process: Paddle 2.x's ``IpuBackend.get_instance()`` acts on it."""
    _last_compiled["target"] = weakref.ref(target)


def last_compiled() -> Any:
    """The compiled program or dygraph model compiled last (None when none lives)."""
    ref = _last_compiled["target"]
    return ref() if ref is not None else None


class IpuBackend:
    """Paddle 2.x's ``core.IpuBackend``: the process's one IPU backend (see the module
    docstring)."""

    _instance: IpuBackend | None = None
    _instance_lock = threading.Lock()

    def __init__(self, target: Any = None) -> None:
        self._scope: Any = None
        # A backend handle of one compiled program (IpuCompiledProgram._backend).
        self._bound = weakref.ref(target) if target is not None else None

    @classmethod
    def get_instance(cls) -> IpuBackend:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _get(self) -> Any:
        if self._bound is not None:
            return self._bound()
        return last_compiled()

    def _target(self, what: str) -> Any:
        target = self._get()
        if target is None:
            raise CompileError(
                f"IpuBackend.{what}(): nothing is compiled in this process (compile an "
                "IpuCompiledProgram, or run a Layer through paddle_ipu, first)"
            )
        return target

    def weights_to_host(self) -> None:
        """Copy the weights (and optimizer state) of the program compiled last to the host."""
        target = self._get()
        if target is not None:
            target.weights_to_host()

    def weights_from_host(self) -> None:
        self._target("weights_from_host").weights_from_host()

    def reset(self) -> None:
        """Release the device of the program compiled last (nothing when none)."""
        target = self._get()
        if target is not None:
            target.reset()

    def detach(self) -> None:
        """Release the device (2.x detached it; it attached again on the next run,
        here the next run raises until compile() is called again)."""
        self.reset()

    def set_scope(self, scope: Any) -> None:
        """2.x told its backend which scope holds the weights; each compiled program
        here keeps the scope it was compiled with (``IpuCompiledProgram(scope=...)``),
        so this only records it."""
        self._scope = scope

    def save_model_proto(self, path: str) -> None:
        self._target("save_model_proto").save_model_proto(path)

    def is_compiled(self) -> bool:
        target = self._get()
        return target is not None and getattr(target, "executor", None) is not None
