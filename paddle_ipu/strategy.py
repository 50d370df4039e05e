"""IpuStrategy: how a Paddle program is compiled for, and run on, the IPU.

The API of Paddle 2.x's in-tree ``paddle.static.IpuStrategy``: the option names, types
and defaults are those of Paddle 2.x (declared once, in :mod:`paddle_ipu.options`), so
existing scripts keep working.  On top of that:

* values are validated when they are set: a wrong type, a value out of range or an
  unknown name raises at once, naming the option and what would be valid;
* :meth:`IpuStrategy.set_options` is atomic: if any entry is rejected, none applies;
* cross-option rules that depend on the order of calls are checked by
  :meth:`IpuStrategy.validate`, which the compiler calls (and the helpers call too).

What each backend does with an option is that backend's declaration
(:func:`paddle_ipu.backends.support`); the executor checks it before a session is made.
"""

from __future__ import annotations

import copy as _copy
import importlib.util
import numbers
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, Protocol

from paddle_ipu._internals import paddle_api, paddle_logs
from paddle_ipu.errors import NotSupportedError, OptionError
from paddle_ipu.executor.config import ExecutorConfig, RunTimeOptions
from paddle_ipu.options import ALIASES, OPTIONS, CustomOp, coerce, default_of, resolve
from paddle_ipu.options.spec import (
    check_everyn_period,
    coerce_bool,
    coerce_string,
    is_int,
    type_error,
)
from paddle_ipu.options.values import OptionValues

__all__ = ["IpuStrategy"]

# Set by Paddle 2.x's constructor, so passed to PopART even though unchanged here.
_CONSTRUCTOR_SET = (
    "location_optimizer",
    "accumulation_and_replication_reduction_type",
    "mean_accumulation_and_replication_reduction_strategy",
)

# PopART patterns that are off unless enabled (the rest default to on).
_PATTERNS_OFF_BY_DEFAULT = frozenset(
    {"LSTMOp", "Slice2SliceSubsample", "SplitGather", "TiedGather", "TiedGatherAccumulate"}
)

# Keys whose change does not require recompiling (as in Paddle 2.x).
_NO_RECOMPILE = frozenset({"lr"})


class _OptionView:
    """Paddle 2.x's ``IpuStrategy._ipu_strategy``: ``get_option(name)`` as
    ``{"name", "type", "value"}``, and the calls that read or set options."""

    def __init__(self, owner: IpuStrategy) -> None:
        self._owner = owner

    def get_option(self, name: str) -> dict[str, Any]:
        return self._owner.option_info(name)

    def set_options(self, options: Any) -> None:
        self._owner.set_options(options)

    def get_all_option_names(self) -> list[str]:
        return self._owner.get_all_option_names()

    def enable_pattern(self, pattern: str) -> None:
        self._owner.enable_pattern(pattern)

    def disable_pattern(self, pattern: str) -> None:
        self._owner.disable_pattern(pattern)

    def is_pattern_enabled(self, pattern: str) -> bool:
        return self._owner.is_pattern_enabled(pattern)


class Dy2StaticSwitch(Protocol):
    """What :class:`IpuStrategy` asks of Paddle 2.x's dy2static patch (the dygraph
    front door's, :mod:`paddle_ipu.frontends.dy2static`)."""

    def created(self, strategy: IpuStrategy) -> None:
        """A user made ``strategy`` (2.x registered one made in dynamic mode)."""

    def register(self, strategy: IpuStrategy) -> None: ...

    def release(self) -> None: ...


#: the dy2static switch in use (set by :func:`set_dy2static_switch`), or None
_dy2static: list[Dy2StaticSwitch | None] = [None]


def set_dy2static_switch(switch: Dy2StaticSwitch | None) -> None:
    """Plug in (None: take out) the dy2static patch :class:`IpuStrategy` calls."""
    _dy2static[0] = switch


def current_dy2static_switch() -> Dy2StaticSwitch | None:
    """The dy2static patch :class:`IpuStrategy` calls (None: none)."""
    return _dy2static[0]


def _switch(what: str) -> Dy2StaticSwitch:
    switch = _dy2static[0]
    if switch is None:
        raise NotSupportedError(
            f"IpuStrategy.{what}(): Paddle 2.x's dy2static patch is not installed "
            "(paddle_ipu.patches.apply('dy2static') installs it; import paddle_ipu does)"
        )
    return switch


class IpuStrategy:
    """How a Paddle program is compiled for, and run on, the IPU.

    The API of Paddle 2.x's ``paddle.static.IpuStrategy``::

        s = IpuStrategy()
        s.set_graph_config(num_ipus=2, is_training=True, micro_batch_size=8,
                           enable_manual_shard=True)
        s.set_pipelining_config(enable_pipelining=True, batches_per_step=4,
                                enable_gradient_accumulation=True, accumulation_factor=4)
        s.set_options({"enable_engine_caching": True, "cache_path": "./cache"})

    Every option is listed in :data:`OPTIONS` (and in docs/strategy.md).

    As in Paddle 2.x, a strategy created in dynamic (dygraph) mode registers the
    dy2static patch (:meth:`register_patch`): from then on a Layer method under
    ``paddle.jit.to_static`` runs on the IPU, trained by :meth:`set_optimizer`'s
    optimizer when ``is_training``, until :meth:`release_patch`.  The patch is the
    dygraph front door's (:mod:`paddle_ipu.frontends.dy2static`): this class calls it
    through :class:`Dy2StaticSwitch`, which ``import paddle_ipu`` plugs in
    (:mod:`paddle_ipu.patches`).  The strategies paddle_ipu makes for itself
    (:meth:`unpatched`) register nothing.
    """

    def __init__(self) -> None:
        paddle_logs.quiet_paddle()  # the user asked for the IPU
        self._init_values()
        switch = _dy2static[0]
        if switch is not None:
            switch.created(self)

    def register_patch(self) -> None:
        """Run ``paddle.jit.to_static`` Layer methods on the IPU with this strategy
        (Paddle 2.x's dy2static patch; the last strategy registered is the one used)."""
        _switch("register_patch").register(self)

    def release_patch(self) -> None:
        """Undo :meth:`register_patch`: every patched model's weights (and optimizer
        state) go back to its Layer (and optimizer) and its device is released."""
        _switch("release_patch").release()

    @classmethod
    def unpatched(cls) -> IpuStrategy:
        """A strategy with the default options that registers no dy2static patch,
        whatever the mode (what paddle_ipu's own front doors create)."""
        strategy = cls.__new__(cls)
        strategy._init_values()
        return strategy

    def _init_values(self) -> None:
        self._values: dict[str, Any] = {
            name: spec.initial() for name, spec in OPTIONS.items() if spec.derived is None
        }
        # Names set explicitly (by the caller or by Paddle 2.x's constructor).
        self._explicit: set[str] = set(_CONSTRUCTOR_SET)
        self._patterns: dict[str, bool] = {}
        self.need_compile: bool = True

    # --- generic access -----------------------------------------------------------

    @staticmethod
    def get_all_option_names() -> list[str]:
        """Names of every option, sorted (``get_option`` accepts each)."""
        return sorted(OPTIONS)

    def get_option(self, name: str) -> Any:
        """The value of option ``name`` (a copy, for lists and dicts), as Paddle 2.x's
        ``IpuStrategy.get_option`` returned it; ``self._ipu_strategy.get_option(name)``
        gives ``{"name", "type", "value"}``, as 2.x's C++ strategy did."""
        return self.get(name)

    def option_info(self, name: str) -> dict[str, Any]:
        """``{"name", "type", "value"}`` of option ``name``."""
        spec = OPTIONS[resolve(name)]
        return {"name": spec.name, "type": spec.type, "value": self.get(spec.name)}

    @property
    def _ipu_strategy(self) -> _OptionView:
        """What Paddle 2.x's ``IpuStrategy._ipu_strategy`` (its C++ strategy) offered;
        2.x's own tests read options through it."""
        return _OptionView(self)

    def get(self, name: str) -> Any:
        """The value of option ``name`` (a copy, for lists and dicts)."""
        spec = OPTIONS[resolve(name)]
        if spec.derived is not None:
            return spec.derived.get(self._values)
        value = self._values[spec.name]
        if spec.present is not None:
            return spec.present(value)
        return _copy.deepcopy(value) if spec.copy else value

    def values(self) -> Mapping[str, Any]:
        """Every option's value by name, as a read-only snapshot (what a backend's
        session is configured from)."""
        return MappingProxyType({name: self.get(name) for name in OPTIONS})

    def explicit_options(self) -> frozenset[str]:
        """The options set explicitly (by the caller, or by Paddle 2.x's constructor)."""
        return frozenset(self._explicit)

    def set_options(self, options: Mapping[str, Any]) -> None:
        """Set several options from a dict of name to value.

        The value's Python type selects how it is read, as in Paddle 2.x: ``bool``
        for bool options, ``int`` for uint64 options (and for PopART enums, whose
        member name is accepted too), ``float`` (or ``int``) for double options,
        ``str`` for string options, a list/tuple/set for vector options (added to
        the current ones), a dict for map and tensor-location options (updating the
        given keys), a callable for ``compilation_progress_logger``; ``None`` unsets
        ``random_seed``.  ``{"custom_op": {...}}`` adds a custom op.

        All entries are checked before any is applied: an unknown name raises
        :class:`UnknownOptionError` (with the closest valid names), a value of the
        wrong type :class:`OptionTypeError`, a value out of range
        :class:`OptionError`; the strategy is then unchanged.
        """
        if not isinstance(options, Mapping):
            raise type_error("set_options", "a dict of option names to values", options)
        values = dict(self._values)
        for name in self._mutable_names():
            values[name] = _copy.deepcopy(self._values[name])
        explicit = set(self._explicit)
        for key, value in options.items():
            if not isinstance(key, str):
                raise type_error("set_options", "str option names", key)
            name = resolve(ALIASES.get(key, key))
            spec = OPTIONS[name]
            if spec.derived is not None:
                spec.derived.set(values, explicit, coerce_bool(spec, value))
                continue
            values[name] = coerce(spec, values[name], value, key)
            explicit.add(name)
        self._values, self._explicit = values, explicit
        if set(options) - _NO_RECOMPILE:
            self.need_compile = True

    # --- the helpers of Paddle 2.x --------------------------------------------------

    def set_graph_config(
        self,
        num_ipus: int = 1,
        is_training: bool = True,
        micro_batch_size: int = 1,
        enable_manual_shard: bool = False,
    ) -> None:
        """Set the graph: IPU count, training or inference, micro-batch size, sharding.

        Args:
            num_ipus: IPUs in total (replicas x IPUs per replica).
            is_training: True builds a training graph, False an inference graph.
            micro_batch_size: batch size of one micro-batch; a -1 batch dimension
                of the feeds becomes this.
            enable_manual_shard: place ops on IPUs by their ``ipu_index``
                (``ipu_shard_guard``); sets PopART's virtual_graph_mode to Manual.
                Needs ``num_ipus > 1``.

        Raises:
            OptionError: manual sharding with one IPU, or a value out of range.
        """
        if enable_manual_shard and num_ipus == 1:
            raise OptionError(
                "enable_manual_shard=True needs num_ipus > 1 (got num_ipus=1): sharding "
                "places ops on different IPUs"
            )
        self.set_options(
            {
                "num_ipus": num_ipus,
                "is_training": is_training,
                "micro_batch_size": micro_batch_size,
                "enable_manual_shard": enable_manual_shard,
            }
        )

    def set_pipelining_config(
        self,
        enable_pipelining: bool = False,
        batches_per_step: int = 1,
        enable_gradient_accumulation: bool = False,
        accumulation_factor: int = 1,
    ) -> None:
        """Set pipelining, steps per run and gradient accumulation.

        Args:
            enable_pipelining: pipeline the manual shards (PopART enablePipelining).
                Needs ``enable_manual_shard`` (call :meth:`set_graph_config` first).
            batches_per_step: steps moved by one run (PopART batchesPerStep).
            enable_gradient_accumulation: accumulate gradients before each weight
                update (PopART enableGradientAccumulation).
            accumulation_factor: micro-batches per weight update (PopART
                accumulationFactor); above 1 it needs enable_gradient_accumulation.

        Raises:
            OptionError: pipelining without manual sharding, an accumulation factor
                above 1 without gradient accumulation, or a value out of range.
        """
        if enable_pipelining and not self.enable_manual_shard:
            raise OptionError(
                "enable_pipelining=True needs enable_manual_shard=True: call "
                "set_graph_config(num_ipus=..., enable_manual_shard=True) first"
            )
        if (
            is_int(accumulation_factor)
            and accumulation_factor > 1
            and not enable_gradient_accumulation
        ):
            raise OptionError(
                f"accumulation_factor={accumulation_factor} needs enable_gradient_accumulation=True"
            )
        self.set_options(
            {
                "enable_pipelining": enable_pipelining,
                "batches_per_step": batches_per_step,
                "enable_gradient_accumulation": enable_gradient_accumulation,
                "accumulation_factor": accumulation_factor,
            }
        )

    def set_precision_config(self, enable_fp16: bool = False) -> None:
        """Run the graph in float16 (``enable_fp16``) or float32."""
        self.set_options({"enable_fp16": enable_fp16})

    # --- dynamic-to-static (Paddle 2.x) --------------------------------------------

    def set_optimizer(self, optimizer: Any) -> None:
        """Give the strategy a dygraph optimizer (Paddle 2.x's dy2static flow): its
        learning rate goes into the ``lr`` option and the optimizer is kept for
        :func:`paddle_ipu.training_model`.  As in 2.x, dygraph mode only."""
        import paddle

        if not paddle.in_dynamic_mode():
            raise OptionError(
                "set_optimizer() takes a dygraph optimizer and works in dynamic mode only "
                "(as in Paddle 2.x); a static program brings its optimizer ops with it"
            )
        self.set_options(self.parse_optimizer(optimizer))
        self._optimizer = optimizer

    @property
    def optimizer(self) -> Any:
        """The optimizer given to :meth:`set_optimizer` (None before)."""
        return getattr(self, "_optimizer", None)

    def parse_optimizer(self, optimizer: Any) -> dict[str, Any]:
        """The options Paddle 2.x read off a dygraph optimizer: ``{"lr": value}``
        (a scheduler's current value)."""
        from paddle.optimizer.lr import LRScheduler

        lr = paddle_api.optimizer_attr(optimizer, "learning_rate", None)
        if isinstance(lr, LRScheduler):
            return {"lr": float(lr())}
        if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
            return {"lr": float(lr)}
        raise OptionError(
            f"parse_optimizer: expected a paddle.optimizer.Optimizer with a float or "
            f"LRScheduler learning rate, received {type(optimizer).__name__} "
            f"(learning rate {lr!r})"
        )

    def add_custom_op(
        self,
        paddle_op: str,
        popart_op: str | None = None,
        domain: str = "custom.ops",
        version: int = 1,
    ) -> None:
        """Lower the Paddle op ``paddle_op`` to the PopART custom op ``popart_op``.

        Args:
            paddle_op: the Paddle operator type.
            popart_op: the PopART operator; defaults to ``paddle_op``.
            domain: the PopART op's domain.
            version: the PopART op's version.
        """
        self.set_options(
            {
                "custom_op": {
                    "paddle_op": paddle_op,
                    "popart_op": paddle_op if popart_op is None else popart_op,
                    "domain": domain,
                    "version": version,
                }
            }
        )

    def set_anchor_config(self, return_type: str = "ALL", period: int = 1) -> None:
        """Choose what each run returns for every fetched tensor.

        Args:
            return_type: ``"ALL"`` (every step: shape ``[bps, af, rf, ...]`` without
                size-1 dims), ``"FINAL"`` (the last step), ``"SUM"`` (summed over
                the steps) or ``"EVERYN"`` (every ``period``-th step).
            period: the N of EVERYN; must divide batches_per_step.  Other return
                types take no period (leave it at 1).

        Raises:
            OptionError: an unknown return type, a period with a type other than
                EVERYN, or a period that does not divide batches_per_step.
        """
        canonical = coerce_string(OPTIONS["anchor_return_type"], return_type)
        if canonical != "EVERYN" and period != 1:
            raise OptionError(f"a return period applies only to EVERYN, not to {canonical}")
        candidate = self.copy()
        candidate.set_options({"anchor_return_type": canonical, "anchor_return_period": period})
        candidate._check_anchor()
        self._values, self._explicit = candidate._values, candidate._explicit
        self.need_compile = True

    # --- patterns -----------------------------------------------------------------

    def enable_pattern(self, pattern: str) -> None:
        """Enable the PopART graph pattern ``pattern``."""
        self._patterns[self._pattern_name(pattern)] = True
        self.need_compile = True

    def disable_pattern(self, pattern: str) -> None:
        """Disable the PopART graph pattern ``pattern``."""
        self._patterns[self._pattern_name(pattern)] = False
        self.need_compile = True

    def is_pattern_enabled(self, pattern: str) -> bool:
        """Whether PopART pattern ``pattern`` is on (set here, else PopART's default)."""
        name = self._pattern_name(pattern)
        if name in self._patterns:
            return self._patterns[name]
        return name not in _PATTERNS_OFF_BY_DEFAULT

    @property
    def patterns(self) -> dict[str, bool]:
        """Patterns enabled (True) or disabled (False) here, by name."""
        return dict(self._patterns)

    # --- cross-option checks --------------------------------------------------------

    def validate(self) -> None:
        """Check the rules that involve several options; the compiler calls this.

        Raises:
            OptionError: manual sharding with one IPU; pipelining without manual
                sharding; an accumulation factor above 1 without gradient
                accumulation; num_ipus not a multiple of the replica count; an
                EVERYN period that does not divide batches_per_step.
        """
        if self.enable_manual_shard and self.num_ipus == 1:
            raise OptionError("enable_manual_shard needs num_ipus > 1 (num_ipus is 1)")
        if self.enable_pipelining and not self.enable_manual_shard:
            raise OptionError(
                "enable_pipelining needs enable_manual_shard "
                "(set_graph_config(..., enable_manual_shard=True))"
            )
        af = self._values["accumulation_factor"]
        if af > 1 and not self.enable_gradient_accumulation:
            raise OptionError(
                f"accumulation_factor is {af} but enable_gradient_accumulation is False: "
                "enable gradient accumulation or set the factor to 1"
            )
        rf = self.replication_factor
        if rf > 1 and self.num_ipus % rf:
            raise OptionError(
                f"num_ipus ({self.num_ipus}) must be a multiple of replicated_graph_count ({rf})"
            )
        self._check_anchor()

    def _check_anchor(self) -> None:
        if self._values["anchor_return_type"] != "EVERYN":
            return
        check_everyn_period(
            self._values["anchor_return_period"], self.batches_per_step, "anchor_return_period"
        )

    # --- the backend -----------------------------------------------------------------

    def resolved_backend(self) -> Literal["host", "popart"]:
        """The backend ``backend`` selects: "auto" is popart when importable, else host."""
        choice = self._values["backend"]
        if choice == "host":
            return "host"
        if choice == "popart":
            return "popart"
        try:
            found = importlib.util.find_spec("popart") is not None
        except (ImportError, ValueError):
            found = False
        return "popart" if found else "host"

    # --- typed accessors for the compiler and executor ---------------------------

    @property
    def num_ipus(self) -> int:
        """IPUs in total."""
        return int(self._values["num_ipus"])

    @property
    def is_training(self) -> bool:
        """True for a training graph."""
        return bool(self._values["is_training"])

    @property
    def enable_pipelining(self) -> bool:
        """Whether the shards are pipelined."""
        return bool(self._values["enable_pipelining"])

    @property
    def enable_fp16(self) -> bool:
        """Whether the graph runs in float16."""
        return bool(self._values["enable_fp16"])

    @property
    def enable_manual_shard(self) -> bool:
        """Whether ops are placed by ipu_index (virtual_graph_mode is Manual)."""
        return bool(self._values["virtual_graph_mode"] == 1)

    @property
    def enable_gradient_accumulation(self) -> bool:
        """Whether gradients are accumulated before each weight update."""
        return bool(self._values["enable_gradient_accumulation"])

    @property
    def accumulation_factor(self) -> int:
        """Micro-batches per weight update: accumulation_factor, or 1 when accumulation is off."""
        if not self.enable_gradient_accumulation:
            return 1
        return int(self._values["accumulation_factor"])

    @property
    def replication_factor(self) -> int:
        """Replicas: replicated_graph_count, or 1 when replication is off."""
        if not self._values["enable_replicated_graphs"]:
            return 1
        return int(self._values["replicated_graph_count"])

    @property
    def batches_per_step(self) -> int:
        """Steps moved by one run."""
        return int(self._values["batches_per_step"])

    @property
    def micro_batch_size(self) -> int:
        """Batch size of one micro-batch."""
        return int(self._values["micro_batch_size"])

    @property
    def gradient_reduction(self) -> Literal["mean", "sum"]:
        """How gradients are reduced over accumulation and replicas: "mean" or "sum".

        Raises:
            NotSupportedError: the reduction type is NoReduction.
        """
        kind = self._values["accumulation_and_replication_reduction_type"]
        if kind == 0:
            return "sum"
        if kind == 1:
            return "mean"
        raise NotSupportedError(
            "accumulation_and_replication_reduction_type NoReduction is not supported"
        )

    @property
    def anchor_return_type(self) -> str:
        """ALL, FINAL, SUM or EVERYN."""
        return str(self._values["anchor_return_type"])

    @property
    def anchor_return_period(self) -> int:
        """The N of EVERYN."""
        return int(self._values["anchor_return_period"])

    @property
    def random_seed(self) -> int | None:
        """The device random seed, or None when unset."""
        seed = self._values["random_seed"]
        return None if seed is None else int(seed)

    @property
    def custom_ops(self) -> tuple[CustomOp, ...]:
        """The custom ops added, in order."""
        return tuple(self._values["custom_ops"])

    @property
    def has_custom_ops(self) -> bool:
        """Whether any custom op was added (Paddle 2.x attribute)."""
        return bool(self._values["custom_ops"])

    @property
    def custom_op_names(self) -> list[str]:
        """Paddle op types of the custom ops (Paddle 2.x attribute)."""
        return [op.paddle_op for op in self._values["custom_ops"]]

    # --- what crosses into the executor -------------------------------------------

    def executor_config(self) -> ExecutorConfig:
        """The settings an :class:`~paddle_ipu.executor.IpuExecutor` runs with, typed
        and checked here, once (the executor and the model runtime read nothing else;
        the options a run reads each time come through :meth:`run_time_options`).

        Raises:
            OptionError: an EVERYN period that does not divide batches_per_step.
            NotSupportedError: the gradient reduction type is NoReduction.
        """
        training = self.is_training
        seed = self.random_seed
        return ExecutorConfig(
            backend=str(self._values["backend"]),
            is_training=training,
            enable_fp16=self.enable_fp16,
            batches_per_step=self.batches_per_step,
            accumulation_factor=self.accumulation_factor if training else 1,
            replication_factor=self.replication_factor,
            micro_batch_size=self.micro_batch_size,
            anchor_return_type=self.anchor_return_type,
            anchor_return_period=self.anchor_return_period,
            random_seed=seed,
            host_num_threads=int(self._values["host_num_threads"]),
            gradient_reduction=self.gradient_reduction,
            model_runtime=bool(self._values["enable_model_runtime_executor"]),
            timeout_ms=float(self._values["timeout_ms"]),
            num_buffers=int(self._values["num_buffers"]),
            options=OptionValues(self.values()),
            explicit=self.explicit_options(),
            patterns=MappingProxyType(dict(self._patterns)),
            run_time=self.run_time_options,
        )

    def run_time_options(self) -> RunTimeOptions:
        """The options a training run reads when it starts: Paddle 2.x changed them on
        a compiled program's strategy between runs, without a recompile."""
        lr = self._values["lr"]
        set_here = lr != 0.0 or bool(self._values["is_dynamic"])
        return RunTimeOptions(
            lr=float(lr) if set_here else None,
            enable_eval=bool(self._values["runtime_options.enable_eval"]),
        )

    def changed_options(self) -> dict[str, Any]:
        """Options whose value differs from the default, by name."""
        changed = {}
        for name, spec in sorted(OPTIONS.items()):
            value = self.get(name)
            if value != default_of(spec):
                changed[name] = value
        return changed

    # --- object protocol ----------------------------------------------------------

    def copy(self) -> IpuStrategy:
        """An independent copy (the progress logger callable is shared)."""
        clone = type(self).__new__(type(self))
        clone._values = dict(self._values)
        for name in self._mutable_names():
            clone._values[name] = _copy.deepcopy(self._values[name])
        clone._explicit = set(self._explicit)
        clone._patterns = dict(self._patterns)
        clone.need_compile = self.need_compile
        if hasattr(self, "_optimizer"):
            clone._optimizer = self._optimizer
        return clone

    def __copy__(self) -> IpuStrategy:
        return self.copy()

    def __repr__(self) -> str:
        head = (
            f"num_ipus={self.num_ipus}, is_training={self.is_training}, "
            f"micro_batch_size={self.micro_batch_size}, "
            f"batches_per_step={self.batches_per_step}, "
            f"backend={self._values['backend']!r}"
        )
        shown = {"num_ipus", "is_training", "micro_batch_size", "batches_per_step", "backend"}
        rest = ", ".join(
            f"{name}={value!r}"
            for name, value in self.changed_options().items()
            if name not in shown
        )
        patterns = f", patterns={self._patterns!r}" if self._patterns else ""
        return f"IpuStrategy({head}{', ' + rest if rest else ''}{patterns})"

    # --- internals ----------------------------------------------------------------

    @staticmethod
    def _pattern_name(pattern: Any) -> str:
        if not isinstance(pattern, str) or not pattern:
            raise type_error("pattern", "a non-empty str (a PopART pattern name)", pattern)
        return pattern

    @staticmethod
    def _mutable_names() -> list[str]:
        return [n for n, s in OPTIONS.items() if s.type in ("vector", "map") and s.derived is None]
