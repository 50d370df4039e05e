"""The backend Session protocol: the subset of PopART's session API the executor uses.

A backend is one folder (``paddle_ipu/backends/<name>/``) implementing :class:`Session`
and declaring what it does with the IpuStrategy options (:class:`OptionSupport`); it is
registered with :func:`paddle_ipu.backends.register`.  The executor owns IPU semantics
(step layout, weight sync, lr updates, eval mode) and checks a backend's declaration
before it makes a session; a backend owns running the compiled graph.  A backend is
given a :class:`SessionConfig` (plain data, option values by their names), never the
IpuStrategy or a Paddle program.

Data layout (PopART's documented one).  One ``run`` moves ``batches_per_step``
(bps) steps; each step is ``accumulation_factor`` (af) micro-batches on each of
``replication_factor`` (rf) replicas.  An input buffer, and an ALL anchor, has the
shape ``[bps, af, rf, *tensor_shape]`` with the size-1 factors removed.  See
:mod:`paddle_ipu.backends.layout`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import OptionError
from paddle_ipu.options import resolve
from paddle_ipu.options.spec import check_everyn_period
from paddle_ipu.options.values import OptionValues

if TYPE_CHECKING:
    from paddle_ipu.compiler.training import TrainingSource

Support = Literal["honoured", "ignored", "unsupported"]

ANCHOR_KINDS = ("ALL", "FINAL", "SUM", "EVERYN")


@dataclass(frozen=True)
class AnchorReturnType:
    """What an output returns per run: every step (ALL), the last (FINAL), the sum
    over steps (SUM) or every n-th step (EVERYN)."""

    kind: str = "ALL"
    period: int = 1

    def __post_init__(self) -> None:
        kind = self.kind.upper()
        object.__setattr__(self, "kind", kind)
        if kind not in ANCHOR_KINDS:
            raise OptionError(
                f"anchor return type {self.kind!r} is not one of {', '.join(ANCHOR_KINDS)}"
            )
        if kind == "EVERYN":
            check_everyn_period(self.period)


@dataclass
class SessionConfig:
    """Everything a backend needs besides the model: plain data.

    ``options`` holds IpuStrategy option values by their names (Paddle 2.x's), as an
    :class:`~paddle_ipu.options.values.OptionValues` (a plain mapping given here is
    made one: every name checked against the option table), and ``explicit`` the names
    set explicitly; an option left out has its declared default (:meth:`option`).
    ``extras`` holds a backend's own settings that are not options (the popart
    backend's device wait, export paths, ...).
    """

    batches_per_step: int = 1
    accumulation_factor: int = 1
    replication_factor: int = 1
    anchors: dict[str, AnchorReturnType] = field(default_factory=dict)
    is_training: bool = False
    enable_fp16: bool = False
    random_seed: int | None = None
    num_threads: int = 0  # 0: all cores
    # "mean" or "sum": how gradients are reduced over af and rf.
    gradient_reduction: str = "mean"
    options: OptionValues = field(default_factory=OptionValues)
    explicit: frozenset[str] = frozenset()
    #: PopART pattern name -> enabled (IpuStrategy.enable_pattern / disable_pattern)
    patterns: Mapping[str, bool] = field(default_factory=dict)
    extras: Mapping[str, Any] = field(default_factory=dict)
    #: training: the Paddle program the model was compiled from, for a backend that
    #: computes gradients with Paddle's kernels (the host); the model holds no Paddle
    #: objects
    training_source: TrainingSource | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # The option names are checked whenever options are given, made or assigned.
        if name == "options" and not isinstance(value, OptionValues):
            value = OptionValues(value)
        elif name == "explicit":
            value = frozenset(resolve(n) for n in value)
        object.__setattr__(self, name, value)

    def option(self, name: str) -> Any:
        """The value of IpuStrategy option ``name`` (its default when not given)."""
        return self.options.value(name)

    def changed(self, name: str) -> bool:
        """Whether option ``name`` differs from its default."""
        return self.options.changed(name)


@dataclass(frozen=True)
class OptionSupport:
    """What a backend does with the IpuStrategy options: an option not listed is
    honoured (emulated or passed on faithfully); ``ignored`` ones are accepted because
    they cannot change results (placement, memory, scheduling, logging ...);
    ``unsupported`` ones would change results and cannot be honoured, so a strategy
    that sets one away from its default is refused before a session is made.  Each
    entry says why.  ``refuse`` adds checks of values (an option supported except for
    one of its values)."""

    ignored: Mapping[str, str] = field(default_factory=dict)
    unsupported: Mapping[str, str] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    refuse: Any = None  # Callable[[SessionConfig], list[str]] | None

    def status(self, name: str) -> Support:
        if name in self.unsupported:
            return "unsupported"
        if name in self.ignored:
            return "ignored"
        return "honoured"

    def note(self, name: str) -> str:
        return self.unsupported.get(name) or self.ignored.get(name) or self.notes.get(name, "")

    def refusals(self, config: SessionConfig) -> list[str]:
        """The settings of ``config`` this backend cannot honour, each with the reason."""
        problems = [
            f"{name}={config.option(name)!r} ({why})"
            for name, why in sorted(self.unsupported.items())
            if config.changed(name)
        ]
        if self.refuse is not None:
            problems += list(self.refuse(config))
        return problems


EVERYTHING = OptionSupport(notes=MappingProxyType({}))


class Session(abc.ABC):
    """One compiled graph on one (emulated or real) IPU device."""

    #: the backend's name, as passed to :func:`paddle_ipu.backends.create_session`
    backend: str = ""

    def __init__(self, model: CompiledModel, config: SessionConfig) -> None:
        self.model = model
        self.config = config

    @abc.abstractmethod
    def prepare_device(self) -> None:
        """Compile the graph and load it on the device (PopART prepareDevice)."""

    @abc.abstractmethod
    def write_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy weights and optimizer state (ONNX names) to the device
        (writeWeights + weightsFromHost).  Arrays are read, never kept."""

    @abc.abstractmethod
    def read_weights(
        self, names: Sequence[str] | None = None, *, copy: bool = True
    ) -> dict[str, np.ndarray]:
        """Copy weights and optimizer state back (weightsToHost + readWeights).
        ``None`` reads every tensor the session holds.  ``copy=False`` allows arrays
        the session keeps (read-only for the caller, until the next run); a backend
        whose reads are copies anyway ignores it."""

    @abc.abstractmethod
    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one step group.  ``inputs`` maps ONNX input names to buffers in the
        step layout, every one present and of the compiled dtype and shape (the
        executor's feed check is the only one: a backend does not check them again);
        returns (or fills ``outputs``) the anchors in their layout."""

    def share_into(self, tensors: Mapping[str, Any]) -> dict[str, int]:
        """Point each Paddle CPU tensor of ``tensors`` (by weight or optimizer-state
        name) at the session's own host memory of that name, instead of copying into
        it: memory the session replaces on every update and never writes into, so
        that what is written there between runs is what the next run reads.  Returns
        the address each shared tensor now holds; a name left out was not shared
        (the default: a backend whose state lives on a device shares nothing)."""
        return {}

    def snapshot(self) -> Any:
        """The weight and optimizer state, for :meth:`restore` after a failed run
        (the executor makes a training run all or nothing).  The default reads
        every tensor back; a backend with a cheaper way overrides both."""
        return self.read_weights()

    def restore(self, snapshot: Any) -> None:
        """Put back the state :meth:`snapshot` returned."""
        self.write_weights(snapshot)

    def update_optimizer(self, optimizer: Any) -> None:
        """Replace the optimizer's hyper-parameters (updateOptimizerFromHost)."""
        raise OptionError(f"the {self.backend} session is not a training session")

    def set_eval(self, enabled: bool) -> None:  # noqa: B027 - the eval optimizer suffices
        """Eval mode: run the training graph without updating anything.  The
        executor also sends an eval optimizer (lr 0, no weight decay); a backend
        that can skip the update step altogether does so here."""

    @abc.abstractmethod
    def set_random_seed(self, seed: int) -> None:
        """Seed the device's random number generators."""

    def get_info(self, name: str) -> TensorSpec:
        """The shape and dtype of a graph input, output or weight."""
        for spec in (*self.model.inputs, *self.model.outputs):
            if spec.name == name:
                return spec
        raise KeyError(name)

    def has_info(self, name: str) -> bool:
        """Whether the session holds a tensor of that name (PopART hasInfo)."""
        try:
            self.get_info(name)
        except KeyError:
            return False
        return True

    def compile_and_export(self, path: str) -> None:
        """Compile without a device and write the executable to ``path``."""
        raise OptionError(f"the {self.backend} backend cannot export an offline executable")

    def model_to_host(self, path: str) -> None:
        """Write the ONNX model with the device's current weights to ``path``."""
        raise OptionError(f"the {self.backend} backend cannot write the model")

    def close(self) -> None:  # noqa: B027 - a session may hold nothing to release
        """Release the device."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
