"""What an :class:`~paddle_ipu.executor.IpuExecutor` takes from an IpuStrategy.

:class:`ExecutorConfig` is made once, and checked there, by
:meth:`paddle_ipu.IpuStrategy.executor_config`: the step layout, the anchors, the
backend and its options, the model runtime's settings, typed.  The executor and the
model runtime read it and nothing else of the strategy; the few options Paddle 2.x
let a script change on a compiled program's strategy between runs (the learning rate,
eval mode) are read at every run through :attr:`ExecutorConfig.run_time`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from paddle_ipu.backends.base import AnchorReturnType
from paddle_ipu.backends.layout import StepLayout
from paddle_ipu.options.spec import check_everyn_period
from paddle_ipu.options.values import OptionValues

__all__ = ["ConfigSource", "ExecutorConfig", "RunTimeOptions"]


@dataclass(frozen=True)
class RunTimeOptions:
    """The options a training run reads when it starts."""

    #: the learning rate set by the ``lr`` option (set away from 0, or ``is_dynamic``);
    #: None: the program's own (its scheduler or its lr variable)
    lr: float | None = None
    #: ``runtime_options.enable_eval``: run the training graph without updating anything
    enable_eval: bool = False


@dataclass(frozen=True)
class ExecutorConfig:
    """An IpuStrategy's settings as the executor uses them (see the module docstring)."""

    #: "host", "popart" or "auto"
    backend: str
    is_training: bool
    enable_fp16: bool
    #: the step layout: one run moves batches_per_step steps of accumulation_factor
    #: micro-batches (1 for inference) on each of replication_factor replicas
    batches_per_step: int
    accumulation_factor: int
    replication_factor: int
    micro_batch_size: int
    #: every output's anchor return type: ALL, FINAL, SUM or EVERYN (every period-th)
    anchor_return_type: str
    anchor_return_period: int
    random_seed: int | None
    #: threads of the host backend (0: all cores)
    host_num_threads: int
    #: "mean" or "sum": how gradients are reduced over accumulation and replicas
    gradient_reduction: str
    #: the model runtime: enable_model_runtime_executor, timeout_ms, num_buffers
    model_runtime: bool = False
    timeout_ms: float = 0.0
    num_buffers: int = 1
    #: every option by name, and those set explicitly: what a backend is configured from
    options: OptionValues = field(default_factory=OptionValues)
    explicit: frozenset[str] = frozenset()
    #: PopART pattern name -> enabled
    patterns: Mapping[str, bool] = field(default_factory=dict)
    #: the options read at every run (Paddle 2.x changed them without a recompile)
    run_time: Callable[[], RunTimeOptions] = RunTimeOptions

    def __post_init__(self) -> None:
        # The checks of the layout and the anchor (OptionError naming the value), once.
        object.__setattr__(
            self,
            "_layout",
            StepLayout(self.batches_per_step, self.accumulation_factor, self.replication_factor),
        )
        anchor = AnchorReturnType(self.anchor_return_type, self.anchor_return_period)
        if anchor.kind == "EVERYN":
            check_everyn_period(anchor.period, self.batches_per_step, "anchor_return_period")
        object.__setattr__(self, "_anchor", anchor)

    @property
    def layout(self) -> StepLayout:
        """PopART's step layout of this configuration."""
        return self._layout  # type: ignore[attr-defined]

    @property
    def anchor(self) -> AnchorReturnType:
        """Every output's anchor return type."""
        return self._anchor  # type: ignore[attr-defined]


class ConfigSource(Protocol):
    """What makes an :class:`ExecutorConfig` (an IpuStrategy)."""

    def executor_config(self) -> ExecutorConfig: ...
