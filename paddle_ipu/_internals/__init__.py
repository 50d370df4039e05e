"""The one seam between paddle-ipu and the private interfaces of its dependencies.

Every use of a private interface of PaddlePaddle, ONNX Runtime or paddle2onnx (an
underscored attribute, a ``*_cpp2py_export`` binding, an internal naming scheme) lives
in one module per dependency:

- :mod:`paddle_ipu._internals.paddle_jit` -- PaddlePaddle (dy2static, backward rules)
- :mod:`paddle_ipu._internals.paddle_api` -- PaddlePaddle
- :mod:`paddle_ipu._internals.ort_api` -- ONNX Runtime
- :mod:`paddle_ipu._internals.p2o_api` -- paddle2onnx
- :mod:`paddle_ipu._internals.paddle_logs` -- PaddlePaddle's glog level
- :mod:`paddle_ipu._internals.paddle_dist` -- PaddlePaddle's collectives and store

and nowhere else in the package.  Each module records the release it was checked on
(``CHECKED_ON``), uses a public interface instead where one exists (chosen once, when the
private one is missing *or* its signature differs from the one checked), and registers a
probe of every interface with :func:`interface`.  :func:`check` runs every probe against
the installed releases; ``python -m paddle_ipu._internals`` prints the report and exits 1
when an interface without a fallback is broken (CI runs it, and
``tests/unit/test_internals.py`` runs the same probes), so an upgrade that breaks one fails
loudly instead of silently.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable
from dataclasses import dataclass

from paddle_ipu.errors import PrivateApiError

log = logging.getLogger("paddle_ipu")

__all__ = [
    "Interface",
    "Result",
    "Unavailable",
    "check",
    "interface",
    "interfaces",
    "main",
    "signature_of",
]

#: the seam modules, imported by :func:`check`
MODULES = (
    "paddle_ipu._internals.paddle_jit",
    "paddle_ipu._internals.paddle_api",
    "paddle_ipu._internals.paddle_process",
    "paddle_ipu._internals.ort_api",
    "paddle_ipu._internals.p2o_api",
    "paddle_ipu._internals.paddle_logs",
    "paddle_ipu._internals.paddle_dist",
)


@dataclass(frozen=True)
class Interface:
    """One private interface: what it is, where paddle-ipu uses it, what replaces it when
    it breaks, and a probe that exercises it on the installed release (returns a detail
    line, raises when the interface is broken)."""

    dependency: str
    name: str
    used_for: str
    fallback: str
    probe: Callable[[], str]


@dataclass(frozen=True)
class Result:
    interface: Interface
    ok: bool
    detail: str
    #: the installed release lacks the interface by design and its fallback serves
    fallback: bool = False


class Unavailable(Exception):
    """Raised by a probe whose interface the installed release does not have (one of
    the supported releases before it appeared): the fallback is in use, which is not
    a failure."""


_REGISTRY: list[Interface] = []


def interface(
    dependency: str, name: str, used_for: str, fallback: str = ""
) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register the decorated function as the probe of one private interface."""

    def register(probe: Callable[[], str]) -> Callable[[], str]:
        _REGISTRY.append(Interface(dependency, name, used_for, fallback, probe))
        return probe

    return register


def interfaces() -> list[Interface]:
    for module in MODULES:
        importlib.import_module(module)
    return list(_REGISTRY)


def signature_of(fn: object) -> str:
    """The first line of a pybind11 function's docstring: its bound signature."""
    doc = getattr(fn, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def fallback_used(dependency: str, name: str, why: str, instead: str) -> None:
    """Say once, at WARNING, that a private interface is broken and a public one is used."""
    log.warning(
        "%s %s: %s; using %s instead (paddle-ipu was checked on another release; "
        "`python -m paddle_ipu._internals` reports every interface)",
        dependency,
        name,
        why,
        instead,
    )


def broken(dependency: str, name: str, checked_on: str, why: str) -> PrivateApiError:
    try:
        installed = importlib.metadata.version(dependency)
    except importlib.metadata.PackageNotFoundError:
        installed = "not installed"
    return PrivateApiError(
        f"{dependency} {installed}: {name} {why}; paddle-ipu relies on it and was checked "
        f"on {dependency} {checked_on} (run `python -m paddle_ipu._internals` for the "
        "report; install the release it was checked on)"
    )


def check() -> list[Result]:
    """Run the probe of every private interface on the installed releases."""
    results = []
    for item in interfaces():
        try:
            results.append(Result(item, True, item.probe()))
        except Unavailable as exc:
            results.append(Result(item, True, f"{exc}; fallback: {item.fallback}", fallback=True))
        except Exception as exc:  # a probe reports every failure, whatever it is
            results.append(Result(item, False, f"{type(exc).__name__}: {exc}"))
    return results


def main() -> int:
    results = check()
    versions: dict[str, str] = {}
    for r in results:
        dep = r.interface.dependency
        if dep not in versions:
            try:
                versions[dep] = importlib.metadata.version(dep)
            except importlib.metadata.PackageNotFoundError:
                versions[dep] = "not installed"
    # each dependency's main seam module (MODULES holds more than one per dependency)
    main_modules = {
        "paddlepaddle": "paddle_api",
        "onnxruntime": "ort_api",
        "paddle2onnx": "p2o_api",
    }
    checked = {
        dep: importlib.import_module(f"paddle_ipu._internals.{module}").CHECKED_ON
        for dep, module in main_modules.items()
    }
    for dep, version in versions.items():
        print(f"{dep} {version} (interfaces checked on {checked.get(dep, '?')})")
    for r in results:
        mark = ("fall" if r.fallback else "ok  ") if r.ok else "FAIL"
        print(f"{mark} {r.interface.dependency}: {r.interface.name} -- {r.detail}")
    failed = [r for r in results if not r.ok]
    fallbacks = sum(r.fallback for r in results)
    note = f" ({fallbacks} through a fallback on this release)" if fallbacks else ""
    print(f"{len(results) - len(failed)} of {len(results)} private interfaces work{note}")
    return 1 if failed else 0
