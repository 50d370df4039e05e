"""The backend registry.

A backend is one package exposing ``create_session(model, config) -> Session``,
``available() -> tuple[bool, str]`` and ``SUPPORT`` (an :class:`~.base.OptionSupport`:
what it does with the IpuStrategy options).  The built-in ones are imported only when
first asked for, so a backend whose engine is missing (no Poplar SDK, say) never breaks
``import paddle_ipu``:

* ``"host"``: :mod:`paddle_ipu.backends.host`, the emulated IPU; the default everywhere.
* ``"popart"``: :mod:`paddle_ipu.backends.popart`, the Poplar SDK.

Other backends call :func:`register`.  ``"auto"`` resolves to ``"popart"`` when it is
available and to ``"host"`` otherwise.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paddle_ipu.errors import BackendUnavailableError, NotSupportedError, UnknownOptionError

if TYPE_CHECKING:
    from paddle_ipu.backends.base import OptionSupport, Session, SessionConfig
    from paddle_ipu.compiler.model import CompiledModel

SessionFactory = Callable[["CompiledModel", "SessionConfig"], "Session"]
AvailabilityCheck = Callable[[], "tuple[bool, str]"]

#: Built-in backends: name -> module, imported on first use.
BUILTIN: dict[str, str] = {
    "host": "paddle_ipu.backends.host",
    "popart": "paddle_ipu.backends.popart",
}

AUTO = "auto"


@dataclass(frozen=True)
class BackendEntry:
    name: str
    factory: SessionFactory
    available: AvailabilityCheck
    support: OptionSupport


_registry: dict[str, BackendEntry] = {}
_lock = threading.RLock()


def register(
    name: str,
    factory: SessionFactory,
    available: AvailabilityCheck,
    support: OptionSupport | None = None,
) -> None:
    """Add (or replace) a backend.  ``factory(model, config)`` returns a Session;
    ``available()`` returns ``(True, description)`` or ``(False, reason)``; ``support``
    says which options it cannot honour (default: it honours them all)."""
    from paddle_ipu.backends.base import EVERYTHING

    if not name or name == AUTO:
        raise ValueError(f"{name!r} cannot name a backend")
    with _lock:
        _registry[name] = BackendEntry(name, factory, available, support or EVERYTHING)


def unregister(name: str) -> None:
    """Remove a registered backend (a built-in one is imported again on next use)."""
    with _lock:
        _registry.pop(name, None)


def backend_names() -> list[str]:
    """Every backend known by name: the built-in ones, then the registered ones."""
    with _lock:
        return list(dict.fromkeys([*BUILTIN, *_registry]))


def _entry(name: str) -> BackendEntry:
    """The registered entry, importing a built-in backend's module on first use.

    Raises ImportError when a built-in module cannot be imported."""
    with _lock:
        entry = _registry.get(name)
        if entry is not None:
            return entry
        if name not in BUILTIN:
            raise UnknownOptionError(
                f"unknown backend {name!r}; known: {', '.join([AUTO, *backend_names()])}"
            )
        module = importlib.import_module(BUILTIN[name])
        # A module may register itself on import; otherwise use its two functions.
        entry = _registry.get(name)
        if entry is None:
            entry = BackendEntry(name, module.create_session, module.available, module.SUPPORT)
            _registry[name] = entry
        return entry


def availability(name: str) -> tuple[bool, str]:
    """``(True, description)`` or ``(False, reason)`` for one backend."""
    try:
        entry = _entry(name)
    except ImportError as exc:
        return False, f"{BUILTIN.get(name, name)} cannot be imported: {exc}"
    try:
        ok, reason = entry.available()
    except Exception as exc:  # an availability check must never take the caller down
        return False, f"the availability check failed: {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)


def available_backends() -> dict[str, tuple[bool, str]]:
    """Every known backend with ``(available, description or reason)``."""
    return {name: availability(name) for name in backend_names()}


def resolve(name: str = AUTO) -> str:
    """The backend a name stands for: ``"auto"`` is popart when available, else host."""
    if name == AUTO:
        return "popart" if availability("popart")[0] else "host"
    if name not in backend_names():
        raise UnknownOptionError(
            f"unknown backend {name!r}; known: {', '.join([AUTO, *backend_names()])}"
        )
    return name


def support(name: str = AUTO) -> OptionSupport:
    """What backend ``name`` does with the IpuStrategy options."""
    return _entry(resolve(name)).support


def check_support(name: str, config: SessionConfig) -> None:
    """Raise NotSupportedError naming every setting of ``config`` backend ``name``
    cannot honour (its :class:`~.base.OptionSupport`)."""
    resolved = resolve(name)
    problems = support(resolved).refusals(config)
    if problems:
        raise NotSupportedError(
            f"the {resolved} backend cannot honour these IpuStrategy settings (they would "
            "change results); reset them or use another backend: " + "; ".join(problems)
        )


def create_session(name: str, model: CompiledModel, config: SessionConfig) -> Session:
    """A Session of backend ``name`` (or ``"auto"``) for ``model``, after checking that
    the backend can honour ``config`` (:func:`check_support`).

    Raises BackendUnavailableError, with the backend's own reason, when it cannot
    be used here, and NotSupportedError for settings it cannot honour."""
    resolved = resolve(name)
    ok, reason = availability(resolved)
    if not ok:
        raise BackendUnavailableError(f"the {resolved} backend is not available: {reason}")
    check_support(resolved, config)
    return _entry(resolved).factory(model, config)


__all__ = [
    "AUTO",
    "BUILTIN",
    "BackendEntry",
    "availability",
    "available_backends",
    "backend_names",
    "check_support",
    "create_session",
    "register",
    "resolve",
    "support",
    "unregister",
]


def job_group() -> Any:
    """This process's group in a job of Paddle's launcher, as the host backend joins it
    (its replicas are processes): ``barrier(what, timeout)`` and
    ``check_agreement(data, what)`` across the job (what
    :mod:`paddle_ipu.distributed` offers a script).  NotSupportedError outside such a
    job."""
    group = importlib.import_module("paddle_ipu.backends.host.replica_group")
    return group.ReplicaGroup.of_job()
