"""Names for PIR values, so that Paddle 2.x's ``fetch_list=[out.name]`` works.

In Paddle 2.x every variable had a name, and scripts fetched intermediate values
by it (``exe.run(prog, fetch_list=[out.name])``, ``compile(feeds, [out.name])``).
In PIR only values of data and parameter ops have one: ``Value.name`` raises for
the rest.

While 2.x's names are on (:func:`install`, called by :func:`paddle_ipu.compat.install`),
reading ``value.name`` of an unnamed value from user code (not from Paddle's or
paddle_ipu's own modules, whose code relies on the error) returns a name made up once
per value, ``<op>_<n>.tmp_<result>`` as 2.x named them (``relu_0.tmp_0``), unique in
the process (:func:`paddle_ipu.frontends.fetch_names.made_up`).  The program is not
changed (``value.has_name`` stays False, and ``value.name = ...`` still raises).  The
front doors resolve such names back into values
(:func:`paddle_ipu.frontends.fetch_names.resolve_fetches`); the ``exe.run`` hook does
so for plain programs only while these names are on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from paddle_ipu.frontends import fetch_names


def _from_paddle(depth: int = 2) -> bool:
    """Whether the caller reading ``.name`` is Paddle's or paddle_ipu's own code
    (both rely on the error to tell unnamed values apart)."""
    try:
        module = sys._getframe(depth).f_globals.get("__name__", "")
    except ValueError:
        return False
    return module.split(".", 1)[0] in ("paddle", "paddle_ipu")


def _name_getter(original: Any) -> Any:
    def name(self: Any) -> str:
        try:
            return str(original.__get__(self))
        except ValueError:
            if _from_paddle():
                raise
            return fetch_names.made_up(self)

    return name


def install(replace: Callable[[Any, str, Any], None]) -> None:
    """Give ``pir.Value`` the reading of ``name`` described above (``replace``
    records the original so that compat.disable() restores it), and have ``exe.run``
    of plain programs resolve fetch names."""
    import paddle

    value_type = paddle.pir.Value
    original = value_type.__dict__["name"]
    replace(value_type, "name", property(_name_getter(original), original.fset))
    fetch_names.resolve_on_run(True)


def uninstalled() -> None:
    """Record that compat.disable() gave ``pir.Value.name`` back."""
    fetch_names.resolve_on_run(False)


def installed() -> bool:
    """Whether 2.x names are on (exe.run then resolves them)."""
    return fetch_names.resolve_on_run()
