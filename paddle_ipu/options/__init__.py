"""The IpuStrategy options: one declaration per option, and the checks of their values.

The option names, value types and defaults are those of Paddle 2.x's in-tree
``paddle.static.IpuStrategy`` (native options plus the PopART ``SessionOptions`` it
passed through), so existing scripts keep working.  Every option is declared once, in
:mod:`paddle_ipu.options.table`, as an :class:`OptionSpec` (:mod:`.spec`): its type,
default, range, documentation, whether it is passed through to the Poplar SDK's
session options, and, for the few options whose values are not plain, the functions
that read or present them.  :func:`coerce` checks a value against its declaration.

What a backend does with an option is that backend's declaration
(:class:`paddle_ipu.backends.base.OptionSupport`), not part of the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from paddle_ipu.options import table as _table
from paddle_ipu.options.spec import (
    ALIASES,
    CustomOp,
    Derived,
    OptionSpec,
    OptionType,
    coerce,
    default_of,
    resolve,
    specs,
)

OPTIONS: Mapping[str, OptionSpec] = MappingProxyType(specs())
"""Every option, by name: its type, default, range and documentation."""

del _table  # imported for its declarations

__all__ = [
    "ALIASES",
    "OPTIONS",
    "CustomOp",
    "Derived",
    "OptionSpec",
    "OptionType",
    "coerce",
    "default_of",
    "resolve",
]
