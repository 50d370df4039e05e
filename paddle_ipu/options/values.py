"""Option values as they cross into a backend: :class:`OptionValues`.

A backend is configured from the IpuStrategy's options by their Paddle 2.x names
(:class:`paddle_ipu.backends.base.SessionConfig`).  They travel as an
:class:`OptionValues`: a read-only mapping whose every name was checked against the
option table when it was made (a misspelt name fails there, naming the closest ones,
not later as a silent default), with each option's default for the names left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from paddle_ipu.options.spec import default_of, resolve, specs

__all__ = ["OptionValues"]


class OptionValues(Mapping[str, Any]):
    """Option values by their declared names (aliases resolved), checked once."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        checked = {resolve(name): value for name, value in (values or {}).items()}
        self._values: Mapping[str, Any] = MappingProxyType(checked)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"OptionValues({dict(self._values)!r})"

    def value(self, name: str) -> Any:
        """The value of option ``name`` (its default when not given); an
        UnknownOptionError for a name that is no option."""
        name = resolve(name)
        if name in self._values:
            return self._values[name]
        return default_of(specs()[name])

    def changed(self, name: str) -> bool:
        """Whether option ``name`` is given, with a value other than its default."""
        name = resolve(name)
        return name in self._values and self._values[name] != default_of(specs()[name])
