"""PopART's spelling of the IpuStrategy options, and setting them on ``SessionOptions``.

The IpuStrategy options a session is configured with (``SessionConfig.options``, by
Paddle 2.x's names) that are passed through to the SDK (``OptionSpec.passthrough``) are
handed to ``popart.SessionOptions`` under PopART's camelCase names
(``enable_stochastic_rounding`` -> ``enableStochasticRounding``; nested settings are
dotted: ``batchSerializationSettings.factor``): :func:`popart_options`.  Each value is
translated to the type the binding takes (pybind11 refuses anything else): an int or a
name to the enum member, a list to a set where the field is a ``std::set``, a dict to
the settings object (``TensorLocationSettings`` ...): :func:`set_session_option`.  An
option this SDK has no binding for raises, naming it (see :data:`UNBOUND_OPTIONS`).

:func:`session_options` builds a session's whole ``SessionOptions``: the step layout
and gradient reduction of the config first, then those options, then the backend's own
``session_options`` setting, then popdist's (``enable_distribution``).

Checked against PopART 3.0-3.4's ``python/popart/popart_core/popart.cpp`` and
``willow/include/popart/sessionoptions.hpp``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.backends.popart.device import import_popdist
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import BackendError, NotSupportedError, OptionError, UnknownOptionError
from paddle_ipu.options import OPTIONS, OptionSpec
from paddle_ipu.options.table import SHARDING_KEYS

#: Settings of the popart backend that are not IpuStrategy options
#: (``SessionConfig.extras``).
EXTRAS: dict[str, str] = {
    "ipu_version": 'IPU architecture for the IPU Model / offline device (default "ipu2")',
    "device_wait_seconds": "how long to retry acquiring busy IPUs (default 30)",
    "patterns": "PopART pattern name -> enabled (after IpuStrategy's)",
    "export_path": 'where IPU_COMPILE_ONLY writes the executable ("offline_cache.popart")',
    "popef_path": "where the PopEF file for model_runtime is exported (default: a temporary file)",
    "session_options": "more SessionOptions fields, by PopART's name, set after the strategy's",
}

#: PopART names that are not the camelCase of the option's name
_POPART_NAMES = {
    "num_io_tiles": "numIOTiles",
    "partials_type_matmuls": "partialsTypeMatMuls",
    "accumulate_outer_fragment": "accumulateOuterFragmentSettings",
    "location_activation": "activationTensorLocationSettings",
    "location_weight": "weightTensorLocationSettings",
    "location_optimizer": "optimizerStateTensorLocationSettings",
    "location_accumulator": "accumulatorTensorLocationSettings",
    "compilation_progress_logger": "compilationProgressLogger",
}


def camel(snake: str) -> str:
    """PopART's spelling of a Paddle pass-through name (dots separate structs)."""
    parts = []
    for piece in snake.split("."):
        head, *rest = piece.split("_")
        parts.append(head + "".join(word[:1].upper() + word[1:] for word in rest))
    return ".".join(parts)


def popart_name(spec: OptionSpec) -> str:
    """The ``SessionOptions`` field an option passed through to PopART sets."""
    return _POPART_NAMES.get(spec.name, camel(spec.name))


def _location(location: Mapping[str, int]) -> dict[str, Any]:
    sharding = next(k for k in SHARDING_KEYS if k in location)
    return {
        "location.storage": "OnChip" if location["on_chip"] else "OffChip",
        "location.replicatedTensorSharding": (
            "On" if location["use_replicated_tensor_sharding"] else "Off"
        ),
        "location.loadTileSet": "IO" if location["use_io_tiles_to_load"] else "Compute",
        "location.storageTileSet": "IO" if location["use_io_tiles_to_store"] else "Compute",
        "location.shardingDomain": {
            "type": sharding.rsplit("_", 1)[-1].capitalize(),
            "size": location[sharding],
        },
        "minElementsForOffChip": location["min_elements_for_off_chip"],
        "minElementsForReplicatedTensorSharding": location[
            "min_elements_for_replicated_tensor_sharding"
        ],
    }


def popart_options(
    options: Mapping[str, Any], explicit: frozenset[str] | set[str], include_defaults: bool = False
) -> dict[str, Any]:
    """The ``SessionOptions`` fields to set, by PopART's name, from IpuStrategy option
    values (by Paddle name): the options passed through that were set explicitly (or
    by Paddle 2.x's constructor), or every one with ``include_defaults``.

    Enums are given as their index (:attr:`OptionSpec.enum` names them).  Tensor
    locations are dicts of ``location.storage`` ("OnChip"/"OffChip"),
    ``location.replicatedTensorSharding`` ("On"/"Off"), ``location.loadTileSet`` /
    ``location.storageTileSet`` ("IO"/"Compute"), ``location.shardingDomain``
    ({"type", "size"}), ``minElementsForOffChip`` and
    ``minElementsForReplicatedTensorSharding``.  ``accumulateOuterFragmentSettings`` is
    ``{"schedule", "excludedVirtualGraphs"}``.
    """
    result: dict[str, Any] = {}
    for name, spec in sorted(OPTIONS.items()):
        if not spec.passthrough or spec.derived is not None:
            continue
        if not include_defaults and name not in explicit:
            continue
        value = options.get(name, spec.initial())
        if name == "compilation_progress_logger" and value is None:
            continue
        if spec.group == "popart.location":
            value = _location(value)
        elif name == "accumulate_outer_fragment":
            ((schedule, excluded),) = value.items()
            value = {"schedule": schedule, "excludedVirtualGraphs": list(excluded)}
        elif name == "replicated_collectives_settings":
            value = {camel(k): v for k, v in value.items()}
        elif name == "custom_ops":
            continue  # lowered by the compiler, not a SessionOptions field
        elif name != "compilation_progress_logger":
            value = copy.deepcopy(value)
        result[popart_name(spec)] = value
    return result


#: SessionOptions fields IpuStrategy knows (Paddle 2.x set them through the C++ API)
#: that no Python binding of PopART 3.0-3.4 has (popart.cpp), with the value that
#: means "the SDK's own behaviour": that value is skipped, any other raises.
UNBOUND_OPTIONS: dict[str, Any] = {
    "compilationProgressLogger": None,
    "compilationProgressTotal": 100,
    "enableSerializedMatmuls": True,
    "looseThresholdAtPeak": 8000,
    "autodiffSettings.stitchStrategy": 1,
}

# The C++ enumerator ``None`` is bound under another name (popart.cpp):
# RecomputationType::None as "NoRecompute", MergeVarUpdateType::None as "Off".
_ENUM_ALIASES = {"None": ("NoRecompute", "Off")}

# std::set fields whose elements are enums (sessionoptions.hpp).
_SET_ENUM_FIELDS = {"hardwareInstrumentations": "Instrumentation"}

# std::map<std::string, std::string> fields (popart/__init__.py.in wraps them).
_STRING_MAPS = frozenset(
    {"engineOptions", "convolutionOptions", "lstmOptions", "matmulOptions",
     "reportOptions", "gclOptions"}
)  # fmt: skip


def _refused(name: str, value: Any, why: str) -> OptionError:
    return OptionError(f"SessionOptions.{name} = {value!r} was refused: {why}")


def _enum_member(enum_type: Any, value: Any, name: str) -> Any:
    """A pybind11 enum member from a member, its name, or its C++ value (pybind11
    enums refuse plain ints on assignment)."""
    members: Mapping[str, Any] = enum_type.__members__
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for candidate in (value, *_ENUM_ALIASES.get(value, ())):
            if candidate in members:
                return members[candidate]
        raise _refused(name, value, f"not one of {', '.join(members)}")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        for member in members.values():
            # pybind11 enums convert with int(); a Python Enum double has .value
            number = int(member) if hasattr(member, "__int__") else member.value
            if number == int(value):
                return member
        raise _refused(name, value, f"no member of {enum_type.__name__} has the value {int(value)}")
    raise _refused(name, value, f"expected a {enum_type.__name__} member or its name")


def _option_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # Poplar's option parser spells them so
    return str(value)


def _coerce(popart: Any, current: Any, value: Any, name: str, field: str) -> Any:
    """``value`` in the type the binding of the field holding ``current`` takes."""
    if hasattr(type(current), "__members__"):
        return _enum_member(type(current), value, name)
    if isinstance(current, bool):
        if isinstance(value, (bool, np.bool_)) or (
            isinstance(value, (int, np.integer)) and int(value) in (0, 1)
        ):
            return bool(value)
        raise _refused(name, value, "expected a bool")
    if isinstance(current, int):
        if isinstance(value, (int, np.integer)) or (
            isinstance(value, float) and value.is_integer()
        ):
            return int(value)
        raise _refused(name, value, "expected an integer")
    if isinstance(current, float):
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            return float(value)
        raise _refused(name, value, "expected a number")
    if isinstance(current, str):
        if isinstance(value, str):
            return value
        raise _refused(name, value, "expected a string")
    if isinstance(current, (set, frozenset)):
        if isinstance(value, (str, Mapping)) or not hasattr(value, "__iter__"):
            raise _refused(name, value, "expected a set")
        enum_name = _SET_ENUM_FIELDS.get(field)
        if enum_name is not None:
            enum_type = getattr(popart, enum_name)
            return {_enum_member(enum_type, item, name) for item in value}
        return set(value)
    if isinstance(current, list):
        if isinstance(value, (str, Mapping)) or not hasattr(value, "__iter__"):
            raise _refused(name, value, "expected a list")
        return list(value)
    if isinstance(current, Mapping):
        if not isinstance(value, Mapping):
            raise _refused(name, value, "expected a dict")
        if field in _STRING_MAPS:
            return {str(k): _option_string(v) for k, v in value.items()}
        return dict(value)
    if type(current).__name__ == "NumIOTiles":  # bound with an int constructor only
        if isinstance(value, type(current)):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return type(current)(int(value))
        raise _refused(name, value, "expected an integer")
    if isinstance(value, type(current)):
        return value
    raise _refused(name, value, f"expected a {type(current).__name__}")


def _assign(popart: Any, obj: Any, path: Sequence[str], value: Any, name: str) -> None:
    head, rest = path[0], path[1:]
    if not hasattr(obj, head):
        where = "SessionOptions" if name == ".".join(path) else name[: -len(".".join(path))]
        raise UnknownOptionError(
            f"{name!r} is not a PopART SessionOptions attribute ({head!r} is not an "
            f"attribute of {where.rstrip('.')} in this SDK; the backend's own settings "
            f"are {', '.join(sorted(EXTRAS))})"
        )
    current = getattr(obj, head)
    if rest:
        # pybind11's def_readwrite hands out the nested struct by reference; setting
        # it back afterwards also covers a binding that hands out a copy.
        _assign(popart, current, rest, value, name)
        new = current
    elif head == "shardingDomain" and isinstance(value, Mapping):
        # TensorLocation.shardingDomain is a CommGroup(type, replicaGroupSize)
        # (popart._internal.ir bindings/commgroup.cpp).
        kind = _enum_member(popart.CommGroupType, value.get("type", "All"), name)
        new = popart.CommGroup(kind, int(value.get("size", 0)))
    elif isinstance(value, Mapping) and not isinstance(current, Mapping):
        for key, item in value.items():
            _assign(popart, current, str(key).split("."), item, f"{name}.{key}")
        new = current
    else:
        new = _coerce(popart, current, value, name, head)
    try:
        setattr(obj, head, new)
    except (TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise _refused(name, value, str(exc) or type(exc).__name__) from exc


def set_session_option(popart: Any, opts: Any, name: str, value: Any) -> None:
    """Set one ``SessionOptions`` field, dotted name or not, translated to its bound
    type.  Raises UnknownOptionError for a field this SDK does not bind,
    NotSupportedError for a bound-nowhere field set to a non-default value, and
    OptionError for a value the field cannot take."""
    if name in UNBOUND_OPTIONS:
        default = UNBOUND_OPTIONS[name]
        if value is default or (default is not None and value == default):
            return  # the SDK's behaviour already
        raise NotSupportedError(
            f"SessionOptions.{name} = {value!r}: PopART's Python API (3.0-3.4) has no "
            f"binding for {name!r}; leave it at {default!r}"
        )
    _assign(popart, opts, name.split("."), value, name)


def _check_cache_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise BackendError(f"the engine cache directory {path!r} cannot be created: {exc}") from exc
    if not os.access(path, os.W_OK):
        raise BackendError(f"the engine cache directory {path!r} is not writable")


def session_options(
    popart: Any,
    config: SessionConfig,
    model: CompiledModel,
    extras: Mapping[str, Any],
    *,
    constant_weights: bool,
    distributed: bool = False,
) -> Any:
    """The ``popart.SessionOptions`` of one session.

    From ``config``: replicas, gradient accumulation and its reduction (training),
    ``virtualGraphMode`` Manual for a sharded model, ``constantWeights`` for inference
    (``constant_weights``), PopART's engine cache from ``IPU_CACHE_PATH``; then the
    options passed through (:func:`popart_options`), then ``extras["session_options"]``
    by PopART's names; with ``distributed`` (enable_distribution) ``popdist.popart``
    configures the options last, so that its distributed settings win."""
    opts = popart.SessionOptions()
    rf = max(1, config.replication_factor)
    af = max(1, config.accumulation_factor)
    if rf > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = rf
    if config.is_training and af > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = af
    if config.is_training:
        reduction = config.gradient_reduction.lower()
        if reduction == "mean":
            opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
            opts.meanAccumulationAndReplicationReductionStrategy = popart.MeanReductionStrategy.Post
        elif reduction == "sum":
            opts.accumulationAndReplicationReductionType = popart.ReductionType.Sum
        else:
            raise OptionError(
                f"gradient_reduction {config.gradient_reduction!r} is not 'mean' or 'sum'"
            )
    if any(s.ipu_index >= 0 for s in model.shards.values()):
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    if not config.is_training:
        opts.constantWeights = constant_weights
    cache = os.environ.get("IPU_CACHE_PATH", "").strip()
    if cache:
        opts.enableEngineCaching = True
        opts.cachePath = cache
    fields = popart_options(config.options, config.explicit)
    fields.update(extras.get("session_options") or {})
    for name, value in fields.items():
        set_session_option(popart, opts, name, value)
    if distributed:
        import_popdist().configureSessionOptions(opts)
    if getattr(opts, "enableEngineCaching", False):
        _check_cache_dir(str(opts.cachePath))
    return opts


def wanted_patterns(config: SessionConfig, extras: Mapping[str, Any]) -> dict[str, bool]:
    """PopART pattern name -> enabled: IpuStrategy.enable_pattern / disable_pattern,
    then the backend's ``patterns`` setting."""
    wanted: dict[str, bool] = dict(config.patterns)
    wanted.update(dict(extras.get("patterns") or {}))
    return wanted
