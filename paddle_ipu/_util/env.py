"""Environment variables read by paddle-ipu: one parser, so every flag accepts the
same spellings (the table of variables is in the README)."""

from __future__ import annotations

import os

from paddle_ipu.errors import OptionError

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean environment variable: 1/true/yes/on or 0/false/no/off (any case);
    unset or empty gives ``default``; anything else raises OptionError."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise OptionError(
        f"environment variable {name}: expected one of 1/true/yes/on or 0/false/no/off, "
        f"received {os.environ.get(name)!r}"
    )
