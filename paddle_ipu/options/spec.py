"""How an IpuStrategy option is declared, and how its values are checked.

The option names, value types and defaults are those of Paddle 2.x's in-tree
``paddle.static.IpuStrategy`` (native options plus the PopART ``SessionOptions`` it
passed through), so existing scripts keep working.  Every option is declared once in
:mod:`paddle_ipu.options.table` as an :class:`OptionSpec`: type, default, range,
documentation, whether it is passed through to the Poplar SDK's session options, and,
for the few options whose values are not plain, the functions that read or present
them.  :func:`coerce` checks a value against its declaration: a wrong type, a value out
of range or an unknown name raises at once, naming the option and what would be valid.

Value types use Paddle 2.x's names: ``bool``, ``uint64`` (non-negative int; PopART
enums are uint64 options whose value is the enum's index), ``double``, ``string``,
``vector`` (a list that setting extends), ``map`` (a dict that setting updates) and
``callable``.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import difflib
import math
import numbers
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import numpy as np

from paddle_ipu.errors import OptionError, OptionTypeError, UnknownOptionError

OptionType = Literal["bool", "uint64", "double", "string", "vector", "map", "callable"]

UINT64_MAX = 2**64 - 1
# Limits of the APIs some options end in: ONNX Runtime's seed is an int64 and its thread
# count a C int; the serving worker waits with threading, which refuses longer waits.
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
TIMEOUT_MAX_MS = float(threading.TIMEOUT_MAX) * 1000.0

#: ``coerce(spec, current, value, key) -> new value`` of an option whose values are not
#: plain; ``key`` is the name the caller used (an alias such as ``custom_op``).
Coercer = Callable[["OptionSpec", Any, Any, str], Any]


@dataclasses.dataclass(frozen=True)
class Derived:
    """An option stored in other options (``enable_manual_shard`` is
    ``virtual_graph_mode == Manual``): how to read it and how a bool sets them."""

    get: Callable[[Mapping[str, Any]], Any]
    set: Callable[[dict[str, Any], set[str], bool], None]


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """The declaration of one IpuStrategy option.

    ``passthrough`` marks an option handed to the Poplar SDK's session options as it is
    (the PopART ``SessionOptions`` Paddle 2.x passed through); the popart backend spells
    it in PopART's names.  ``coerce`` reads a value set for an option that is not plain
    (a list of custom ops, a tensor location, ...), ``present`` turns a stored value
    into what ``IpuStrategy.get`` returns, and ``derived`` makes an option a view of
    others.
    """

    name: str
    type: OptionType
    default: Any
    doc: str
    group: str
    passthrough: bool = False
    enum: tuple[str, ...] | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    minimum_exclusive: bool = False
    nullable: bool = False
    coerce: Coercer | None = None
    present: Callable[[Any], Any] | None = None
    derived: Derived | None = None
    copy: bool = True

    def initial(self) -> Any:
        """The value a new strategy starts with (its own copy)."""
        if self.type == "vector":
            return list(self.default)
        return _copy.deepcopy(self.default)


@dataclasses.dataclass(frozen=True)
class CustomOp:
    """A Paddle operator lowered to a PopART custom operator."""

    paddle_op: str
    popart_op: str
    domain: str = "custom.ops"
    version: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The op as the dict ``set_options({"custom_op": ...})`` accepts."""
        return dataclasses.asdict(self)


_SPECS: dict[str, OptionSpec] = {}

#: Keys ``set_options`` accepts besides the option names.
ALIASES = {"custom_op": "custom_ops"}


def specs() -> dict[str, OptionSpec]:
    """The declared options (the table module fills it)."""
    return _SPECS


def declare(spec: OptionSpec) -> None:
    """Add an option to :data:`OPTIONS` (the table module calls this)."""
    if spec.name in _SPECS:
        raise ValueError(f"option {spec.name!r} is declared twice")
    _SPECS[spec.name] = spec


def resolve(name: Any) -> str:
    """The declared option ``name`` stands for; UnknownOptionError with the closest
    valid names otherwise."""
    if not isinstance(name, str):
        raise type_error("option name", "a str", name)
    if name in _SPECS:
        return name
    names = list(_SPECS) + list(ALIASES)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    # A name given without its struct prefix (stitch_strategy) is close too.
    close += [n for n in _SPECS if n.rsplit(".", 1)[-1] == name and n not in close]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownOptionError(
        f"unknown IpuStrategy option {name!r}{hint} "
        "(IpuStrategy.get_all_option_names() lists them all)"
    )


def default_of(spec: OptionSpec) -> Any:
    """The default as ``IpuStrategy.get`` presents it (lists for vectors)."""
    value = spec.initial()
    return spec.present(value) if spec.present is not None else value


# ----------------------------------------------------------------------------------
# Checking single values
# ----------------------------------------------------------------------------------


def describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def type_error(name: str, expected: str, value: Any) -> OptionTypeError:
    return OptionTypeError(f"IpuStrategy option {name!r} expects {expected}, got {describe(value)}")


def is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not is_bool(value)


def _bound(value: float) -> str:
    # Integer bounds exactly (2**63 - 1 must not read as 9.22337e+18).
    return str(value) if isinstance(value, int) else f"{value:g}"


def range_text(spec: OptionSpec, prefix: str = "") -> str:
    """The valid range of ``spec`` as text ("in [0, 1]", ">= 1"), or "" without one."""
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        opening = "(" if spec.minimum_exclusive else "["
        return f"{prefix}in {opening}{_bound(low)}, {_bound(high)}]"
    if low is not None:
        return f"{prefix}{'>' if spec.minimum_exclusive else '>='} {_bound(low)}"
    if high is not None:
        return f"{prefix}<= {_bound(high)}"
    return ""


def _check_range(spec: OptionSpec, value: float) -> None:
    low, high = spec.minimum, spec.maximum
    too_low = low is not None and (value <= low if spec.minimum_exclusive else value < low)
    if too_low or (high is not None and value > high):
        valid = range_text(spec)
        if too_low and low is not None and high is not None:
            # Name the bound that was crossed first, then the whole range.
            valid = f"{'>' if spec.minimum_exclusive else '>='} {_bound(low)}, i.e. {valid}"
        raise OptionError(f"IpuStrategy option {spec.name!r} must be {valid}, got {value!r}")


def to_uint(name: str, value: Any, *, what: str = "a non-negative int") -> int:
    if not is_int(value):
        raise type_error(name, what, value)
    number = int(value)
    if not 0 <= number <= UINT64_MAX:
        raise OptionError(f"IpuStrategy option {name!r} expects {what}, got {number}")
    return number


def coerce_bool(spec: OptionSpec, value: Any) -> bool:
    if not is_bool(value):
        raise type_error(spec.name, "a bool", value)
    return bool(value)


def coerce_uint64(spec: OptionSpec, value: Any) -> int | None:
    if value is None and spec.nullable:
        return None
    if spec.enum is not None:
        members = ", ".join(f"{i} ({m})" for i, m in enumerate(spec.enum))
        if isinstance(value, str):
            by_name = {m.lower(): i for i, m in enumerate(spec.enum)}
            if value.lower() not in by_name:
                raise OptionError(
                    f"IpuStrategy option {spec.name!r} has no member {value!r}; valid: {members}"
                )
            return by_name[value.lower()]
        number = to_uint(spec.name, value, what=f"an enum index or name ({members})")
        if number >= len(spec.enum):
            raise OptionError(
                f"IpuStrategy option {spec.name!r} got {number}, out of range; valid: {members}"
            )
        return number
    what = "a non-negative int" + (" or None" if spec.nullable else "")
    number = to_uint(spec.name, value, what=what)
    _check_range(spec, number)
    return number


def coerce_double(spec: OptionSpec, value: Any) -> float:
    if not isinstance(value, numbers.Real) or is_bool(value):
        raise type_error(spec.name, "a float", value)
    number = float(value)
    if not math.isfinite(number):
        # No double option has a meaning for NaN or an infinity: an infinite timeout_ms
        # or lr would only fail later, inside a run or the serving worker.
        received = "NaN" if math.isnan(number) else repr(number)
        raise OptionError(
            f"IpuStrategy option {spec.name!r} expects a finite float"
            f"{range_text(spec, prefix=' ')}, got {received}"
        )
    _check_range(spec, number)
    return number


def coerce_string(spec: OptionSpec, value: Any) -> str:
    if not isinstance(value, str):
        raise type_error(spec.name, "a str", value)
    if spec.choices is None:
        return value
    for choice in spec.choices:
        if value.lower() == choice.lower():
            return choice
    valid = ", ".join(repr(c) for c in spec.choices)
    raise OptionError(f"IpuStrategy option {spec.name!r} got {value!r}; valid: {valid}")


def as_items(name: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise type_error(name, "a list, tuple or set", value)
    return list(value)


def as_mapping(name: str, value: Any) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise type_error(name, "a dict", value)
    return value


def _map_string(name: str, key: Any, value: Any) -> tuple[str, str]:
    if not isinstance(key, str):
        raise type_error(f"{name}[{key!r}]", "str keys", key)
    if is_bool(value):
        return key, "true" if value else "false"
    if is_int(value) or isinstance(value, str):
        return key, str(value)
    if isinstance(value, numbers.Real):
        return key, repr(float(value))
    raise type_error(f"{name}[{key!r}]", "a str, int or bool value", value)


def coerce(spec: OptionSpec, current: Any, value: Any, key: str | None = None) -> Any:
    """The value option ``spec`` holds after setting ``value`` (``current`` is what it
    holds now: vectors extend it, maps update a copy of it).  Raises OptionTypeError
    or OptionError, naming the option and what would be valid."""
    if spec.coerce is not None:
        return spec.coerce(spec, current, value, key or spec.name)
    if spec.type == "bool":
        return coerce_bool(spec, value)
    if spec.type == "uint64":
        return coerce_uint64(spec, value)
    if spec.type == "double":
        return coerce_double(spec, value)
    if spec.type == "string":
        return coerce_string(spec, value)
    if spec.type == "callable":
        if value is not None and not callable(value):
            raise type_error(spec.name, "a callable logger(progress, total) or None", value)
        return value
    if spec.type == "vector":
        items = as_items(spec.name, value)
        for item in items:
            if not isinstance(item, str):
                raise type_error(spec.name, "a list of str", item)
        return [*current, *items]
    # a map of str to str
    updated = dict(current)
    for map_key, item in as_mapping(spec.name, value).items():
        k, v = _map_string(spec.name, map_key, item)
        updated[k] = v
    return updated


def check_everyn_period(
    period: int, batches_per_step: int | None = None, name: str = "the EVERYN anchor period"
) -> None:
    """The one check of an EVERYN anchor's period: an int >= 1 that divides
    ``batches_per_step`` (when it is known).  Raises OptionError naming ``name``."""
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise OptionError(f"{name} must be an int >= 1 for EVERYN, got {period!r}")
    if batches_per_step is not None and batches_per_step % period:
        raise OptionError(
            f"{name} ({period}) must divide batches_per_step ({batches_per_step}) for EVERYN"
        )
