"""Dygraph Layers on the IPU: ``inference_model`` / ``training_model`` (PopTorch style).

``paddle_ipu.inference_model(layer, strategy)`` and ``paddle_ipu.training_model(layer,
optimizer, strategy)`` return an :class:`IpuModel`: calling it runs the Layer as one
compiled graph.  The graph is built on the first call from the arguments' shapes and
dtypes (``paddle.jit.to_static`` of the Layer's forward, a PIR program), and built
again, with a log line, when they change.  Arguments that are not tensors (``None``,
Python numbers, strings) are constants of the graph; a new value compiles again.  One
call takes ``batches_per_step * accumulation_factor * replicas`` micro-batches, stacked
along the first dimension (the Layer is traced at the micro-batch size).  The call
returns what the forward returns (its tensors computed on the device), in the same
structure.

Training.  Each call runs forward, backward and one update of ``optimizer``'s kind
(SGD, Momentum, Adam, AdamW, Adamax, Lamb, Adagrad, Adadelta, RMSProp) with its
hyper-parameters, learning rate (an ``LRScheduler`` is read at each call; the caller
steps it), weight decay and gradient clipping.  The loss is found the way PopTorch finds
it (:func:`paddle_ipu.frontends.dygraph_training.find_loss`):

* a value passed through ``paddle.incubate.identity_loss`` marks the loss (any
  ``reduction``: 0 sum, 1 mean, 2 none); a marked loss that feeds another marked loss
  is only part of it, so the graph must hold one final marked loss;
* otherwise the loss is the one returned value that holds one floating-point element
  and that a gradient reaches from a trainable parameter (``(logits, loss)``, ``(loss,
  accuracy)`` and a loss returned alone all qualify); a candidate that only feeds
  another candidate is a part of it;
* anything else (two independent losses, no candidate) is a CompileError naming the
  outputs, raised before anything runs.

A loss with more than one element (``identity_loss(x, reduction=2)``) trains as eager
``loss.backward()`` does: on the sum of its elements.

Eval mode.  A ``training_model`` whose Layer is in eval mode (``layer.eval()``) runs the
forward only -- dropout off, BatchNorm on its running statistics -- with the trained
weights and updates nothing; ``layer.train()`` resumes training.  The two graphs are
compiled once each and share the weights.

Weights.  The weights, BatchNorm statistics and optimizer state live on the device
between calls.  :meth:`IpuModel.copy_weights_to_host` writes them into the Layer's
parameters and buffers and the optimizer's accumulators (so ``paddle.save`` of their
``state_dict()`` and eager code see them); ``layer.set_state_dict`` /
``optimizer.set_state_dict`` mark the host as newer, and the next call writes it to the
device (so does :meth:`IpuModel.copy_weights_to_device`).  ``detach()`` copies the
weights back and releases the device; the next call compiles again.

Paddle 2.x's flow (an ``IpuStrategy`` made in dynamic mode and ``paddle.jit.to_static``)
runs its Layers as IpuModels too: see :mod:`paddle_ipu.frontends.dy2static`.
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api, paddle_jit
from paddle_ipu.compiler.legacy_reader import pir_mode
from paddle_ipu.compiler.pir_values import dtype_name
from paddle_ipu.errors import CompileError, IpuError, NotSupportedError, OptionError
from paddle_ipu.executor.feeds import as_array
from paddle_ipu.frontends.dygraph_training import (
    find_loss,
    one_element,
    static_optimizer,
    take_identity_losses,
)
from paddle_ipu.strategy import IpuStrategy

log = logging.getLogger("paddle_ipu")


def _is_tensor_like(value: Any) -> bool:
    import paddle

    return isinstance(value, (paddle.Tensor, np.ndarray))


# ----------------------------------------------------------------------------------
# host-side changes of the weights
# ----------------------------------------------------------------------------------

_watch_lock = threading.Lock()
# Layer or optimizer -> the IpuModels whose device copy it feeds.
_watchers: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
_watch_installed: dict[tuple[type, str], Callable[..., Any]] = {}


def _notify_after(original: Callable[..., Any]) -> Callable[..., Any]:
    def set_state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        for model in list(_watchers.get(self, ())):
            model._host_changed()
        return result

    set_state_dict.__doc__ = original.__doc__
    set_state_dict.__name__ = original.__name__
    set_state_dict.__wrapped__ = original  # type: ignore[attr-defined]
    return set_state_dict


def _watch(obj: Any, model: IpuModel) -> None:
    """Tell ``model`` when ``obj`` (its Layer or optimizer) gets a new state through
    ``set_state_dict`` (or ``set_dict`` / ``load_dict``): the host is then newer
    than the device.  The methods of ``paddle.nn.Layer`` and
    ``paddle.optimizer.Optimizer`` are wrapped once, the first time a model needs it;
    the wrapper calls Paddle's method, then tells the models watching that object."""
    import paddle

    with _watch_lock:
        for cls, names in (
            (paddle.nn.Layer, ("set_state_dict", "set_dict", "load_dict")),
            (paddle.optimizer.Optimizer, ("set_state_dict",)),
        ):
            for name in names:
                if (cls, name) in _watch_installed or name not in cls.__dict__:
                    continue
                original = cls.__dict__[name]
                _watch_installed[(cls, name)] = original
                setattr(cls, name, _notify_after(original))
        _watchers.setdefault(obj, weakref.WeakSet()).add(model)


def watching() -> bool:
    """Whether Layer's and Optimizer's ``set_state_dict`` are wrapped (see :func:`_watch`)."""
    return bool(_watch_installed)


def unwatch() -> None:
    """Give ``paddle.nn.Layer`` and ``paddle.optimizer.Optimizer`` their own methods
    back (a model then no longer hears of a host-side ``set_state_dict``)."""
    with _watch_lock:
        for (cls, name), original in _watch_installed.items():
            setattr(cls, name, original)
        _watch_installed.clear()


# ----------------------------------------------------------------------------------
# IpuModel
# ----------------------------------------------------------------------------------


@dataclass
class _LayerGraph:
    """One compiled graph of a model: training or forward only, at one signature."""

    training: bool
    signature: tuple[Any, ...]
    compiled: Any
    scope: Any
    feed_names: list[str]
    #: the forward's return structure; its tensors are replaced by output positions
    structure: Any
    #: outputs the caller gets back (the fetched values beyond are internal)
    n_returned: int
    #: the scope variables holding the Layer's parameters and buffers: name -> dtype
    state_names: dict[str, str] = field(default_factory=dict)
    #: whether the device holds older weights than the host
    stale: bool = False
    #: position, among the compiled fetches, of each output (duplicates fetched once)
    fetch_index: list[int] = field(default_factory=list)
    #: float16 inputs: the graph runs in float16 and its float outputs are float16
    half: bool = False


class _Argument:
    """A non-tensor argument of a call: a constant of the traced graph."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def key(self) -> Any:
        try:
            hash(self.value)
            return ("const", type(self.value).__name__, self.value)
        except TypeError:
            return ("const", type(self.value).__name__, repr(self.value))


class IpuModel:
    """A Layer compiled for the IPU (see the module docstring)."""

    def __init__(
        self,
        layer: Any,
        strategy: Any = None,
        optimizer: Any = None,
        training: bool = False,
        function: Callable[..., Any] | None = None,
    ) -> None:
        import paddle

        if not isinstance(layer, paddle.nn.Layer):
            raise OptionError(f"expected a paddle.nn.Layer, received {type(layer).__name__}")
        if strategy is None:
            strategy = IpuStrategy.unpatched()
        elif not isinstance(strategy, IpuStrategy):
            raise OptionError(
                f"strategy must be a paddle_ipu.IpuStrategy, received {type(strategy).__name__}"
            )
        if training and optimizer is None:
            raise OptionError("training_model needs the optimizer that trains the Layer")
        if optimizer is not None and not isinstance(optimizer, paddle.optimizer.Optimizer):
            raise OptionError(
                f"optimizer must be a paddle.optimizer.Optimizer, received "
                f"{type(optimizer).__name__}"
            )
        self.layer = layer
        if function is None:
            function = layer.forward
        if isinstance(function, paddle_jit.static_function_type()):
            # A forward decorated with @paddle.jit.to_static: trace what it converts.
            function = paddle_jit.static_function_source(function)
        self._function = function
        self._name = f"{type(layer).__name__}.{getattr(function, '__name__', 'forward')}"
        # Read in dygraph mode (Layer.parameters() answers Values in static mode).
        self._params = list(layer.parameters())
        self._buffers = [b for b in layer.buffers() if getattr(b, "persistable", False)]
        self.optimizer = optimizer
        self.training = training
        self._strategy = strategy.copy()
        self._entries: dict[bool, _LayerGraph] = {}
        #: the entry whose device weights are newer than the host's (None: the host)
        self._owner: _LayerGraph | None = None
        self._last: _LayerGraph | None = None
        self._lock = threading.RLock()
        for sub in layer.sublayers(include_self=True):  # a sublayer's load counts too
            _watch(sub, self)
        if optimizer is not None:
            _watch(optimizer, self)

    # -- arguments ---------------------------------------------------------------
    def _bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The call's positional and keyword arguments, tensors as arrays and everything
        else as :class:`_Argument` constants."""
        try:
            signature = inspect.signature(self._function)
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise OptionError(f"{self._name}: {exc}") from None
        except ValueError:  # no signature (a builtin): take the call as it is
            bound = None

        def convert(value: Any) -> Any:
            if _is_tensor_like(value):
                return as_array(value)
            return _Argument(value)

        if bound is None:
            return [convert(a) for a in args], {k: convert(v) for k, v in kwargs.items()}
        return [convert(a) for a in bound.args], {k: convert(v) for k, v in bound.kwargs.items()}

    @staticmethod
    def _signature(pos: list[Any], kw: dict[str, Any]) -> tuple[Any, ...]:
        def key(value: Any) -> Any:
            if isinstance(value, _Argument):
                return value.key()
            return ("tensor", value.shape, value.dtype.str)

        return (tuple(key(v) for v in pos), tuple((k, key(v)) for k, v in sorted(kw.items())))

    def _micro_shape(self, shape: tuple[int, ...], training: bool) -> tuple[int, ...]:
        s = self._strategy
        n = s.batches_per_step * s.replication_factor
        if training:
            n *= s.accumulation_factor
        if n == 1:
            return tuple(shape)
        if not shape or shape[0] % n:
            raise OptionError(
                f"an input of shape {list(shape)}: its first dimension must be a multiple "
                f"of batches_per_step * accumulation_factor * replicas = {n}"
            )
        return (shape[0] // n, *shape[1:])

    # -- compile -------------------------------------------------------------------
    def _compile(self, training: bool, pos: list[Any], kw: dict[str, Any]) -> _LayerGraph:
        import paddle

        from paddle_ipu.frontends.ipu_backend import set_last_compiled
        from paddle_ipu.frontends.program import IpuCompiledProgram

        arrays: list[tuple[str, np.ndarray]] = []

        def spec(value: Any, half: bool) -> Any:
            if isinstance(value, _Argument):
                return value.value
            name = f"input_{len(arrays)}"
            arrays.append((name, value))
            shape = list(self._micro_shape(value.shape, training))
            dtype = "float32" if half and value.dtype == np.float16 else str(value.dtype)
            return paddle.static.InputSpec(shape, dtype, name)  # type: ignore[arg-type]

        if _holds_float16(self._params + self._buffers):
            raise NotSupportedError(
                f"{self._name}: the Layer holds float16 weights; keep its weights float32 "
                "and feed float16 inputs (the graph then runs in float16), or set "
                "strategy.set_precision_config(enable_fp16=True)"
            )
        half = any(
            not isinstance(v, _Argument) and v.dtype == np.float16 for v in [*pos, *kw.values()]
        )
        spec_pos = [spec(v, half) for v in pos]
        spec_kw = {k: spec(kw[k], half) for k in sorted(kw)}
        strategy = self._strategy.copy()
        if training:
            # The optimizer's own learning rate (its scheduler's, read at each run)
            # decides, not the ``lr`` option set_optimizer() copied from it once.
            strategy.set_options({"lr": 0.0})
        if half:
            # float16 inputs (PopTorch's inferenceModel of a half model, Paddle 2.x's
            # dy2static with enable_fp16): the Layer is traced in float32 and the
            # graph runs in float16, as every float16 graph does (the executor converts
            # the graph and the weights; the weights stay float32 on the host).
            strategy.set_precision_config(enable_fp16=True)
        first = next((a for _, a in arrays if a.ndim), None)
        strategy.set_graph_config(
            num_ipus=strategy.num_ipus,
            is_training=training,
            micro_batch_size=self._micro_shape(first.shape, training)[0]
            if first is not None
            else 1,
            enable_manual_shard=strategy.enable_manual_shard,
        )
        function = paddle.jit.to_static(self._function, full_graph=True)
        try:
            concrete, _ = function.get_concrete_program(
                *spec_pos, **spec_kw, is_train=bool(self.layer.training)
            )
        except IpuError:
            raise
        except Exception as exc:
            raise CompileError(f"paddle.jit.to_static could not trace {self._name}: {exc}") from exc
        main = concrete.main_program
        structure = concrete.outputs
        flat = paddle.utils.flatten(structure)
        outputs = [v for v in flat if isinstance(v, paddle.pir.Value)]
        dynamic = paddle.in_dynamic_mode()
        paddle.enable_static()
        try:
            startup = paddle.static.Program()
            fetches = list(outputs)
            if training:
                loss, index = find_loss(main, fetches, self._name)
                with paddle.static.program_guard(main, startup):
                    # Eager backward() of a tensor of several elements seeds every one
                    # with 1: the gradient of their sum.
                    objective = loss if one_element(loss) else paddle.sum(loss)
                    static_optimizer(self.optimizer).minimize(objective)
                if index is None:
                    fetches.append(loss)  # trained on, not returned: fetched all the same
            else:
                # identity_loss only marks a loss: out of an inference graph too.
                take_identity_losses(main, fetches)
            scope = paddle.static.Scope()
            with paddle.static.scope_guard(scope):
                paddle.static.Executor(paddle.CPUPlace()).run(startup)
        finally:
            if dynamic:
                paddle.disable_static()
        # The returned structure, its tensors replaced by their positions in fetches.
        positions: list[Any] = []
        k = 0
        for v in flat:
            if isinstance(v, paddle.pir.Value):
                positions.append(_Position(k))
                k += 1
            else:
                positions.append(v)
        packed = paddle.utils.pack_sequence_as(structure, positions)
        state_names = {
            str(op.attrs()["parameter_name"]): dtype_name(op.result(0))
            for op in main.global_block().ops
            if op.name() == "builtin.parameter"
        }
        entry = _LayerGraph(
            training=training,
            signature=(),
            compiled=None,
            scope=scope,
            feed_names=[name for name, _ in arrays],
            structure=packed,
            n_returned=len(outputs),
            state_names=state_names,
        )
        # The Layer's current weights (and optimizer state) replace the startup's.
        self._write_scope(entry)
        compiled = IpuCompiledProgram(main, scope=scope, ipu_strategy=strategy)
        compiled.compile(entry.feed_names, _unique(fetches))
        entry.compiled = compiled
        entry.fetch_index = _fetch_positions(fetches)
        entry.half = half
        set_last_compiled(self)
        return entry

    # -- weights -----------------------------------------------------------------
    def _state_pairs(self, entry: _LayerGraph) -> list[tuple[Any, str]]:
        """(dygraph tensor, scope variable name) for every parameter and buffer the
        graph reads and, for a training graph, every optimizer accumulator."""
        pairs = [(t, t.name) for t in self._params + self._buffers if t.name in entry.state_names]
        if entry.training and self.optimizer is not None:
            accumulators = paddle_api.optimizer_accumulators(self.optimizer)
            names = {p.name for p in self._params}
            # The static optimizer's state is "<param>_<accumulator>_<n>"; n is a
            # process-wide counter, so it is looked up rather than assumed 0.
            scope_names = set(entry.scope.local_var_names())
            for acc_name, per_param in accumulators.items():
                for param_name, tensor in per_param.items():
                    if param_name not in names:
                        continue
                    pattern = re.compile(re.escape(f"{param_name}_{acc_name}_") + r"\d+")
                    found = [n for n in scope_names if pattern.fullmatch(n)]
                    if len(found) > 1:
                        raise CompileError(
                            f"optimizer state of {param_name!r} ({acc_name}) is ambiguous: "
                            f"{sorted(found)}"
                        )
                    if found:
                        pairs.append((tensor, found[0]))
        return pairs

    def _write_scope(self, entry: _LayerGraph) -> None:
        import paddle

        for tensor, name in self._state_pairs(entry):
            if paddle_api.is_initialized(tensor):
                value = np.asarray(tensor.numpy())
                declared = entry.state_names.get(name)
                if declared is not None and declared != value.dtype.name:
                    value = value.astype(declared)
                entry.scope.var(name).get_tensor().set(value, paddle.CPUPlace())

    def _ensure_accumulators(self) -> None:
        """Create the dygraph optimizer's accumulators, so that state trained on the
        device has a place to go (a fresh optimizer creates them on its first step)."""
        opt = self.optimizer
        if opt is None or paddle_api.optimizer_accumulators(opt):
            return
        import paddle

        block = paddle.static.default_main_program().global_block()
        paddle_api.create_accumulators(opt, block, [p for p in self._params if not p.stop_gradient])

    def _to_host(self, entry: _LayerGraph) -> None:
        entry.compiled.weights_to_host()
        if entry.training:
            self._ensure_accumulators()
        for tensor, name in self._state_pairs(entry):
            var = entry.scope.find_var(name)
            if var is None:
                continue
            value = np.asarray(var.get_tensor())
            tensor.set_value(value.astype(tensor.numpy().dtype, copy=False))

    def _to_device(self, entry: _LayerGraph) -> None:
        self._write_scope(entry)
        entry.compiled.weights_from_host()
        entry.stale = False

    def _host_changed(self) -> None:
        """The Layer or optimizer got a new state on the host (set_state_dict): every
        graph takes it before its next run."""
        with self._lock:
            self._owner = None
            for entry in self._entries.values():
                entry.stale = True

    def copy_weights_to_host(self) -> None:
        """Write the device's weights (BatchNorm statistics, optimizer state) into the
        Layer's parameters and buffers and the optimizer's accumulators."""
        with self._lock:
            owner = self._owner
            if owner is None or owner.compiled is None or owner.compiled.executor is None:
                return
            self._to_host(owner)
            self._owner = None

    # 2.x spelling (IpuBackend.get_instance().weights_to_host())
    weights_to_host = copy_weights_to_host

    def copy_weights_to_device(self) -> None:
        """Write the Layer's parameters and buffers (and the optimizer's state) to the
        device, after changing them on the host (``set_value``, say)."""
        with self._lock:
            self._host_changed()
            for entry in self._entries.values():
                if entry.compiled is not None and entry.compiled.executor is not None:
                    self._to_device(entry)

    weights_from_host = copy_weights_to_device

    def detach(self) -> None:
        """Copy the weights back to the Layer and release the device; the next call
        compiles again from the Layer's weights."""
        with self._lock:
            self.copy_weights_to_host()
            for entry in self._entries.values():
                if entry.compiled is not None:
                    entry.compiled.reset()
            self._entries.clear()
            self._last = None

    reset = detach

    def save_model_proto(self, path: str) -> None:
        if self._last is None:
            raise CompileError("nothing compiled yet: call the model first")
        self._last.compiled.save_model_proto(path)

    @property
    def executor(self) -> Any:
        """The executor of the graph that ran last (None before the first call)."""
        return self._last.compiled.executor if self._last is not None else None

    # -- run -------------------------------------------------------------------------
    def _entry_for(self, training: bool, pos: list[Any], kw: dict[str, Any]) -> _LayerGraph:
        signature = self._signature(pos, kw)
        entry = self._entries.get(training)
        if entry is not None and entry.signature == signature:
            return entry
        if entry is not None:
            log.info(
                "%s: the arguments changed from %s to %s: compiling again",
                self._name,
                _describe_signature(entry.signature),
                _describe_signature(signature),
            )
        # Compiled from the host's weights: bring the newest there first.
        self.copy_weights_to_host()
        if entry is not None:
            entry.compiled.reset()
            del self._entries[training]
        if training:
            # The optimizer's state goes to the device with the weights: create it now
            # (from a state_dict loaded into a fresh optimizer, if there is one), as its
            # first eager step would -- in the process's own IR, before PIR mode.
            self._ensure_accumulators()
        with pir_mode():  # traced as PIR whatever the process's IR
            entry = self._compile(training, pos, kw)
        entry.signature = signature
        self._entries[training] = entry
        return entry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import paddle

        pos, kw = self._bind(args, kwargs)
        training = self.training and bool(self.layer.training)
        with self._lock:
            entry = self._entry_for(training, pos, kw)
            if self._owner is not None and self._owner is not entry:
                self.copy_weights_to_host()
            if entry.stale:
                self._to_device(entry)
            feed = dict(
                zip(
                    entry.feed_names,
                    [
                        v
                        for v in [*pos, *[kw[k] for k in sorted(kw)]]
                        if not isinstance(v, _Argument)
                    ],
                )
            )
            with pir_mode():
                outs = entry.compiled.run(feed)
            if entry.training:
                self._owner = entry
                for other in self._entries.values():
                    if other is not entry:
                        other.stale = True
            self._last = entry
        index = entry.fetch_index
        arrays = [np.asarray(outs[index[i]]) for i in range(entry.n_returned)]
        if entry.half:
            # Computed in float16 (the executor hands float32 copies back): exact.
            arrays = [a.astype(np.float16) if a.dtype == np.float32 else a for a in arrays]
        tensors = [paddle.to_tensor(a) for a in arrays]
        return _unpack(entry.structure, tensors)


class _Position:
    """A tensor's place among the fetched outputs, in a returned structure."""

    def __init__(self, index: int) -> None:
        self.index = index


def _unique(values: Sequence[Any]) -> list[Any]:
    seen: set[int] = set()
    out = []
    for v in values:
        if v.id not in seen:
            seen.add(v.id)
            out.append(v)
    return out


def _fetch_positions(values: Sequence[Any]) -> list[int]:
    """For each value, its position among :func:`_unique` of the values."""
    first: dict[int, int] = {}
    positions = []
    for v in values:
        if v.id not in first:
            first[v.id] = len(first)
        positions.append(first[v.id])
    return positions


def _unpack(structure: Any, tensors: list[Any]) -> Any:
    import paddle

    flat = [
        tensors[v.index] if isinstance(v, _Position) else v for v in paddle.utils.flatten(structure)
    ]
    packed = paddle.utils.pack_sequence_as(structure, flat)
    # Paddle wraps a single return value in a list: give it back as it was returned.
    if isinstance(packed, list) and len(packed) == 1:
        return packed[0]
    if isinstance(packed, list):
        return tuple(packed)
    return packed


def _holds_float16(tensors: Sequence[Any]) -> bool:
    import paddle

    return any(t.dtype == paddle.float16 for t in tensors)


def _describe_signature(signature: tuple[Any, ...]) -> str:
    pos, kw = signature
    parts = []
    for key in [*pos, *[k for _, k in kw]]:
        if key[0] == "tensor":
            parts.append(f"{np.dtype(key[2]).name}{list(key[1])}")
        else:
            parts.append(repr(key[2]))
    return "(" + ", ".join(parts) + ")"


def inference_model(layer: Any, strategy: Any = None) -> IpuModel:
    """``layer`` for inference on the IPU (see :mod:`paddle_ipu.frontends.dygraph`)."""
    return IpuModel(layer, strategy, training=False)


def training_model(layer: Any, optimizer: Any = None, strategy: Any = None) -> IpuModel:
    """``layer`` trained by ``optimizer`` on the IPU, one step per call (see
    :mod:`paddle_ipu.frontends.dygraph`).  Without an optimizer, SGD with learning rate
    0.01 over the Layer's parameters (PopTorch's default)."""
    import paddle

    if optimizer is None:
        optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=layer.parameters())
    return IpuModel(layer, strategy, optimizer=optimizer, training=True)
