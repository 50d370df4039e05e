"""Names for PIR values, so that Paddle 2.x's ``fetch_list=[out.name]`` works.

In Paddle 2.x every variable had a name, and scripts fetched intermediate values
by it (``exe.run(prog, fetch_list=[out.name])``, ``compile(feeds, [out.name])``).
In PIR only values of data and parameter ops have one: ``Value.name`` raises for
the rest, and ``exe.run`` takes a string only when the program already holds a
fetch op of that name.

The mechanism here, and its limits:

- Reading ``value.name`` of an unnamed value from user code (not from Paddle's or
  paddle_ipu's own modules, whose code relies on the error) returns a name made up once per
  value, ``<op>_<n>.tmp_<result>`` as 2.x named them (``relu_0.tmp_0``), unique in
  the process.  The program is not changed; the name is recorded here against the
  value's id (``value.has_name`` stays False, and ``value.name = ...`` still raises).
- :func:`resolve_fetches` turns such names -- and names of data ops and
  parameters, which Paddle 3.3's executor refuses as fetch strings too -- back into
  the values of the program being run, by walking its global block.  The Paddle
  executor hook (``exe.run`` of a plain program) and ``IpuCompiledProgram.compile``
  call it; a name of a fetch op already in the program is left to Paddle.
- A made-up name belongs to the program the value was read from: it does not
  resolve in a clone of that program (clones have new values), nor in another
  program; such a name is passed on and Paddle's own error follows.
- Values inside control-flow sub-blocks are not searched; feeding an intermediate
  value by name (2.x fed any variable) is not possible in PIR.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_lock = threading.Lock()
# value id -> made-up name, and back
_by_id: dict[str, str] = {}
_by_name: dict[str, str] = {}
_counters: dict[str, Any] = {}
_original: Any = None


def _made_up(value: Any) -> str:
    key = str(value.id)
    with _lock:
        name = _by_id.get(key)
        if name is not None:
            return name
        try:
            op_type = value.get_defining_op().name().split(".", 1)[-1].rstrip("_")
        except Exception:
            op_type = "tmp"
        counter = _counters.setdefault(op_type, itertools.count())
        name = f"{op_type}_{next(counter)}.tmp_{int(value.index())}"
        _by_id[key] = name
        _by_name[name] = key
        return name


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
            return _made_up(self)

    return name


_installed = False


def install(replace: Callable[[Any, str, Any], None]) -> None:
    """Give ``pir.Value`` the reading of ``name`` described above (``replace``
    records the original so that compat.disable() restores it)."""
    global _installed
    import paddle

    value_type = paddle.pir.Value
    original = value_type.__dict__["name"]
    replace(value_type, "name", property(_name_getter(original), original.fset))
    _installed = True


def uninstalled() -> None:
    """Record that compat.disable() gave ``pir.Value.name`` back."""
    global _installed
    _installed = False


def installed() -> bool:
    """Whether 2.x names are on (exe.run then resolves them, see :func:`resolve_fetches`)."""
    return _installed


def name_of(value: Any) -> str:
    """The name of a value: its own, or the made-up one ("" when it has neither)."""
    try:
        if value.has_name:
            return str(value.name)
    except Exception:
        pass
    return _by_id.get(str(getattr(value, "id", "")), "")


def made_up_key(name: str) -> str | None:
    """The value id a made-up name stands for (None for other names)."""
    return _by_name.get(name)


def _fetch_op_names(block: Any) -> set[str]:
    return {str(op.attrs().get("name")) for op in block.ops if op.name() == "pd_op.fetch"}


def resolve_name(program: Any, name: str) -> Any:
    """The value of ``program`` called ``name`` (a made-up name, a data op or a
    parameter), or None."""
    block = program.global_block()
    wanted = _by_name.get(name)
    for op in block.ops:
        kind = op.name()
        if kind in ("pd_op.data", "pd_op.feed") and op.attrs().get("name") == name:
            return op.result(0)
        if kind == "builtin.parameter" and op.attrs().get("parameter_name") == name:
            return op.result(0)
        if wanted is not None:
            for result in op.results():
                if str(result.id) == wanted:
                    return result
    return None


@dataclass
class _Cache:
    """What a program's names resolved to, valid while the program is unchanged
    (kept on the program, so the values never outlive it)."""

    version: tuple[int, str]
    fetch_ops: set[str]
    values: dict[str, Any] = field(default_factory=dict)


_CACHE_ATTR = "_paddle_ipu_names"


def _cache_of(program: Any) -> _Cache:
    block = program.global_block()
    ops = block.ops
    version = (len(ops), str(ops[-1].id()) if ops else "")
    cache = getattr(program, _CACHE_ATTR, None)
    if cache is None or cache.version != version:
        cache = _Cache(version, _fetch_op_names(block))
        setattr(program, _CACHE_ATTR, cache)
    return cache


def resolve_fetches(program: Any, fetch_list: Any) -> Any:
    """``fetch_list`` with its strings that Paddle's PIR executor would refuse (made-up
    names, data and parameter names) replaced by the program's values.  Anything
    else -- Values, fetch-op names, unknown names (Paddle reports them) -- is kept."""
    import paddle

    if fetch_list is None or not isinstance(program, paddle.pir.Program):
        return fetch_list
    single = not isinstance(fetch_list, (list, tuple))
    items = [fetch_list] if single else list(fetch_list)
    if not any(isinstance(item, str) for item in items):
        return fetch_list
    cache = _cache_of(program)
    out = []
    for item in items:
        if not isinstance(item, str) or item in cache.fetch_ops:
            out.append(item)
            continue
        value = cache.values.get(item)
        if value is None:
            value = resolve_name(program, item)
            if value is not None:
                cache.values[item] = value
        out.append(item if value is None else value)
    if single:
        return out[0]
    return type(fetch_list)(out) if isinstance(fetch_list, tuple) else out
