"""Fetches given by name under PIR: the names Paddle 2.x code uses for values.

In PIR only values of data and parameter ops have a name, and ``exe.run`` takes a
string only when the program already holds a fetch op of that name.  This module
resolves the other names 2.x code fetches by -- data ops, parameters, and the names
made up for intermediate values (``<op>_<n>.tmp_<result>`` as 2.x named them) -- back
into the program's values:

- :func:`made_up` gives an unnamed value its name, once per value, unique in the
  process (the ``pir.Value.name`` reading of :mod:`paddle_ipu.compat.names` calls it);
  the program is not changed;
- :func:`resolve_fetches` turns such names, and names of data ops and parameters,
  into the values of the program being run, by walking its global block.
  ``IpuCompiledProgram.compile`` always calls it; the ``exe.run`` hook calls it for
  plain programs only while 2.x's names are on (:func:`resolve_on_run`, set by
  :mod:`paddle_ipu.compat.names`), so that with them off ``exe.run`` stays Paddle's.
- A made-up name belongs to the program the value was read from: it does not
  resolve in a clone of that program (clones have new values), nor in another
  program; such a name is passed on and Paddle's own error follows.
- Values inside control-flow sub-blocks are not searched; feeding an intermediate
  value by name (2.x fed any variable) is not possible in PIR.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

_lock = threading.Lock()
# value id -> made-up name, and back
_by_id: dict[str, str] = {}
_by_name: dict[str, str] = {}
_counters: dict[str, Any] = {}

_on_run = {"resolve": False}


def resolve_on_run(on: bool | None = None) -> bool:
    """Whether the ``exe.run`` hook resolves the fetch names of plain programs (while
    Paddle 2.x's names are on); ``on`` sets it.  Returns the setting."""
    if on is not None:
        _on_run["resolve"] = bool(on)
    return _on_run["resolve"]


def made_up(value: Any) -> str:
    """The made-up name of an unnamed value (given on first call, then kept)."""
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
