"""Dygraph Layers on the IPU: ``inference_model`` / ``training_model`` (PopTorch style)
and Paddle 2.x's ``IpuStrategy.register_patch`` flow.

``paddle_ipu.inference_model(layer, strategy)`` and ``paddle_ipu.training_model(layer,
optimizer, strategy)`` return an :class:`IpuModel`: calling it runs the Layer as one
compiled graph.  The graph is built on the first call from the inputs' shapes and
dtypes (``paddle.jit.to_static`` of the Layer's forward, a PIR program), and built
again, with a log line, when they change.  One call takes
``batches_per_step * accumulation_factor * replicas`` micro-batches, stacked along
the first dimension (the Layer is traced at the micro-batch size).

Training: the Layer's forward computes the loss -- the one output it returns, or the
output it passes through ``paddle.incubate.identity_loss`` -- and each call runs
forward, backward and the update of ``optimizer``'s kind (SGD, Momentum, Adam,
AdamW, Lamb) with its hyper-parameters, learning rate (a scheduler is read each
call; the caller steps it), weight decay and gradient clipping.  The weights and the
optimizer state live on the device between calls; :meth:`IpuModel.copy_weights_to_host`
writes them back into the Layer's parameters and the optimizer's accumulators, so
``paddle.save(layer.state_dict())`` and eager code see them.  ``detach()`` releases
the device (the next call compiles again, from the Layer's current weights).

Paddle 2.x's flow (``IpuStrategy.set_optimizer(opt)``, ``register_patch()``, then a
``paddle.jit.to_static`` Layer trains on each call) is :func:`register_patch`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from paddle_ipu import strategy as strategy_module
from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.legacy_reader import pir_mode
from paddle_ipu.errors import CompileError, NotSupportedError, OptionError

log = logging.getLogger("paddle_ipu")


def _as_array(value: Any) -> np.ndarray:
    import paddle

    if isinstance(value, paddle.Tensor):
        return np.asarray(value.numpy())
    return np.asarray(value)


def _static_optimizer(optimizer: Any) -> Any:
    """A static-graph optimizer of the same kind and settings as ``optimizer``."""
    import paddle

    opt = paddle.optimizer
    lr = paddle_api.optimizer_attr(optimizer, "learning_rate")
    common = {
        "learning_rate": lr,
        "grad_clip": paddle_api.optimizer_attr(optimizer, "grad_clip", None),
    }
    kind = type(optimizer)
    if kind is opt.SGD:
        return opt.SGD(weight_decay=optimizer.regularization, **common)
    if kind is opt.Momentum:
        return opt.Momentum(
            momentum=float(paddle_api.optimizer_attr(optimizer, "momentum")),
            use_nesterov=bool(paddle_api.optimizer_attr(optimizer, "use_nesterov")),
            weight_decay=optimizer.regularization,
            **common,
        )
    if kind is opt.Adam:
        return opt.Adam(
            beta1=float(paddle_api.optimizer_attr(optimizer, "beta1")),
            beta2=float(paddle_api.optimizer_attr(optimizer, "beta2")),
            epsilon=float(paddle_api.optimizer_attr(optimizer, "epsilon")),
            weight_decay=optimizer.regularization,
            **common,
        )
    if kind is opt.AdamW:
        return opt.AdamW(
            beta1=float(paddle_api.optimizer_attr(optimizer, "beta1")),
            beta2=float(paddle_api.optimizer_attr(optimizer, "beta2")),
            epsilon=float(paddle_api.optimizer_attr(optimizer, "epsilon")),
            weight_decay=float(paddle_api.optimizer_attr(optimizer, "weight_decay")),
            **common,
        )
    if kind is opt.Lamb:
        return opt.Lamb(
            beta1=float(paddle_api.optimizer_attr(optimizer, "beta1")),
            beta2=float(paddle_api.optimizer_attr(optimizer, "beta2")),
            epsilon=float(paddle_api.optimizer_attr(optimizer, "epsilon")),
            lamb_weight_decay=float(paddle_api.optimizer_attr(optimizer, "lamb_weight_decay")),
            **common,
        )
    raise NotSupportedError(
        f"training_model: {kind.__name__} is not supported; use SGD, Momentum, Adam, AdamW or Lamb"
    )


def _replace_identity_loss(program: Any, outputs: list[Any]) -> int | None:
    """Take ``identity_loss`` out of the program (it only marks the loss); return
    the index of the output it produced (None when there is none)."""
    import paddle

    block = program.global_block()
    marked = None
    for op in list(block.ops):
        if op.name() != "pd_op.identity_loss":
            continue
        source = op.operand_source(0)
        reduction = int(op.attrs().get("reduction", 1))
        result = op.result(0)
        try:
            paddle.pir.set_insertion_point(op)
            if reduction == 1 and len(source.shape) > 0:
                value = paddle.mean(source)
            elif reduction == 0 and len(source.shape) > 0:
                value = paddle.sum(source)
            else:
                value = source
        finally:
            paddle.pir.reset_insertion_point_to_end()
        for i, out in enumerate(outputs):
            if out.id == result.id:
                outputs[i] = value
                marked = i
        result.replace_all_uses_with(value)
        block.remove_op(op)
    return marked


class IpuModel:
    """A Layer compiled for the IPU (see the module docstring)."""

    def __init__(
        self, layer: Any, strategy: Any = None, optimizer: Any = None, training: bool = False
    ) -> None:
        import paddle

        IpuStrategy = strategy_module.IpuStrategy

        if not isinstance(layer, paddle.nn.Layer):
            raise OptionError(f"expected a paddle.nn.Layer, received {type(layer).__name__}")
        if strategy is None:
            strategy = IpuStrategy()
        elif not isinstance(strategy, IpuStrategy):
            raise OptionError(
                f"strategy must be a paddle_ipu.IpuStrategy, received {type(strategy).__name__}"
            )
        if training and optimizer is None:
            raise OptionError("training_model needs the optimizer that trains the Layer")
        self.layer = layer
        # Read in dygraph mode (Layer.parameters() answers Values in static mode).
        self._params = list(layer.parameters())
        self.optimizer = optimizer
        self.training = training
        self._strategy = strategy.copy()
        self._strategy.set_graph_config(
            num_ipus=strategy.num_ipus,
            is_training=training,
            micro_batch_size=strategy.micro_batch_size,
            enable_manual_shard=strategy.enable_manual_shard,
        )
        self._signature: tuple[Any, ...] | None = None
        self._compiled: Any = None
        self._scope: Any = None
        self._feed_names: list[str] = []
        self._loss_index: int | None = None
        self._n_outputs = 0
        self._lock = threading.Lock()

    # -- compile ----------------------------------------------------------------
    def _micro_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        s = self._strategy
        n = s.batches_per_step * s.replication_factor
        if self.training:
            n *= s.accumulation_factor
        if not shape or shape[0] % n:
            raise OptionError(
                f"an input of shape {list(shape)}: its first dimension must be a multiple "
                f"of batches_per_step * accumulation_factor * replicas = {n}"
            )
        return (shape[0] // n, *shape[1:])

    def _compile(self, arrays: Sequence[np.ndarray]) -> None:
        import paddle

        from paddle_ipu.frontends.program import IpuCompiledProgram

        dtypes: list[Any] = [str(a.dtype) for a in arrays]
        specs = [
            paddle.static.InputSpec(list(self._micro_shape(a.shape)), dtypes[i], f"input_{i}")
            for i, a in enumerate(arrays)
        ]
        self._strategy.set_graph_config(
            num_ipus=self._strategy.num_ipus,
            is_training=self.training,
            micro_batch_size=int(specs[0].shape[0]) if specs and specs[0].shape else 1,
            enable_manual_shard=self._strategy.enable_manual_shard,
        )
        function = paddle.jit.to_static(self.layer.forward, input_spec=specs, full_graph=True)
        try:
            concrete, _ = function.get_concrete_program(*specs)
        except Exception as exc:
            raise CompileError(
                f"paddle.jit.to_static could not trace {type(self.layer).__name__}.forward: {exc}"
            ) from exc
        main = concrete.main_program
        outputs = [v for v in concrete.outputs if isinstance(v, paddle.pir.Value)]
        self._n_outputs = len(outputs)
        dynamic = paddle.in_dynamic_mode()
        paddle.enable_static()
        try:
            startup = paddle.static.Program()
            marked = _replace_identity_loss(main, outputs)
            if self.training:
                if marked is None and len(outputs) != 1:
                    raise CompileError(
                        f"{type(self.layer).__name__}.forward returns {len(outputs)} values: "
                        "pass the loss through paddle.incubate.identity_loss to mark it"
                    )
                self._loss_index = 0 if marked is None else marked
                with paddle.static.program_guard(main, startup):
                    _static_optimizer(self.optimizer).minimize(outputs[self._loss_index])
            scope = paddle.static.Scope()
            with paddle.static.scope_guard(scope):
                paddle.static.Executor(paddle.CPUPlace()).run(startup)
        finally:
            if dynamic:
                paddle.disable_static()
        self._scope = scope
        # The Layer's current weights (and optimizer state) replace the startup's.
        self._write_scope()
        compiled = IpuCompiledProgram(main, scope=scope, ipu_strategy=self._strategy)
        compiled.compile([s.name for s in specs], outputs)
        self._feed_names = [str(s.name) for s in specs]
        self._compiled = compiled
        from paddle_ipu.frontends.program import IpuBackend

        IpuBackend.set_current(self)

    # -- weights -----------------------------------------------------------------
    def _state_pairs(self) -> list[tuple[Any, str]]:
        """(dygraph tensor, scope variable name) for every parameter and, when
        training, every optimizer accumulator of the Layer's parameters."""
        params = self._params
        pairs = [(p, p.name) for p in params]
        if self.training and self.optimizer is not None and self._scope is not None:
            accumulators = paddle_api.optimizer_accumulators(self.optimizer)
            names = {p.name for p in params}
            # The static optimizer's state is "<param>_<accumulator>_<n>"; n is a
            # process-wide counter, so it is looked up rather than assumed 0.
            scope_names = set(self._scope.local_var_names())
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

    def _write_scope(self) -> None:
        import paddle

        for tensor, name in self._state_pairs():
            if paddle_api.is_initialized(tensor):
                self._scope.var(name).get_tensor().set(
                    np.asarray(tensor.numpy()), paddle.CPUPlace()
                )

    def _ensure_accumulators(self) -> None:
        """Create the dygraph optimizer's accumulators, so that state trained on the
        device has a place to go (a fresh optimizer creates them on its first step)."""
        opt = self.optimizer
        if opt is None or paddle_api.optimizer_accumulators(opt):
            return
        import paddle

        block = paddle.static.default_main_program().global_block()
        paddle_api.create_accumulators(opt, block, [p for p in self._params if not p.stop_gradient])

    def copy_weights_to_host(self) -> None:
        """Write the device's weights (and optimizer state) into the Layer's
        parameters and the optimizer's accumulators."""
        if self._compiled is None or self._compiled.executor is None:
            return
        self._compiled.weights_to_host()
        if self.training:
            self._ensure_accumulators()
        for tensor, name in self._state_pairs():
            var = self._scope.find_var(name)
            if var is None:
                continue
            value = np.asarray(var.get_tensor())
            tensor.set_value(value.astype(tensor.numpy().dtype, copy=False))

    # 2.x spelling (IpuBackend.get_instance().weights_to_host())
    weights_to_host = copy_weights_to_host

    def copy_weights_to_device(self) -> None:
        """Write the Layer's parameters (after set_state_dict, say) to the device."""
        if self._compiled is None or self._compiled.executor is None:
            return
        self._write_scope()
        self._compiled.weights_from_host()

    weights_from_host = copy_weights_to_device

    def detach(self) -> None:
        """Release the device; the next call compiles again from the Layer's weights."""
        with self._lock:
            if self._compiled is not None:
                self.copy_weights_to_host()
                self._compiled.reset()
            self._compiled = None
            self._signature = None

    reset = detach

    def save_model_proto(self, path: str) -> None:
        if self._compiled is None:
            raise CompileError("nothing compiled yet: call the model first")
        self._compiled.save_model_proto(path)

    # -- run -------------------------------------------------------------------------
    def __call__(self, *inputs: Any) -> Any:
        import paddle

        arrays = [_as_array(v) for v in inputs]
        signature = tuple((a.shape, a.dtype.str) for a in arrays)
        with self._lock:
            if signature != self._signature:
                if self._signature is not None:
                    log.info(
                        "%s: input shapes changed from %s to %s: compiling again",
                        type(self.layer).__name__,
                        [list(s) for s, _ in self._signature],
                        [list(s) for s, _ in signature],
                    )
                    self.copy_weights_to_host()
                    self._compiled.reset()
                # Traced as PIR whatever the process's IR (a no-op under PIR).
                with pir_mode():
                    self._compile(arrays)
                self._signature = signature
            compiled = self._compiled
        with pir_mode():
            outs = compiled.run(dict(zip(self._feed_names, arrays)))
        tensors = [paddle.to_tensor(o) for o in outs]
        return tensors[0] if len(tensors) == 1 else tuple(tensors)


def inference_model(layer: Any, strategy: Any = None) -> IpuModel:
    """``layer`` for inference on the IPU (see :mod:`paddle_ipu.frontends.dygraph`)."""
    return IpuModel(layer, strategy, training=False)


def training_model(layer: Any, optimizer: Any, strategy: Any = None) -> IpuModel:
    """``layer`` trained by ``optimizer`` on the IPU, one step per call (see
    :mod:`paddle_ipu.frontends.dygraph`)."""
    return IpuModel(layer, strategy, optimizer=optimizer, training=True)


# ----------------------------------------------------------------------------------
# Paddle 2.x: IpuStrategy.register_patch / release_patch
# ----------------------------------------------------------------------------------

_patch_lock = threading.Lock()
_patched: dict[str, Any] = {}


def register_patch(strategy: Any) -> None:
    """Make ``paddle.jit.to_static`` Layers run on the IPU, as Paddle 2.x's
    IpuDynamicPatcher did: after this, ``paddle.jit.to_static(layer)`` returns a
    callable that trains the Layer (``is_training`` with ``set_optimizer``) or runs it
    for inference as one compiled graph per call (an :class:`IpuModel`)."""
    import paddle

    with _patch_lock:
        if _patched:
            return
        original = paddle.jit.to_static

        def to_static(function: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(function, paddle.nn.Layer):
                optimizer = strategy.optimizer
                if strategy.is_training:
                    if optimizer is None:
                        raise OptionError(
                            "is_training=True: call ipu_strategy.set_optimizer(optimizer) "
                            "before paddle.jit.to_static(layer)"
                        )
                    return training_model(function, optimizer, strategy)
                return inference_model(function, strategy)
            return original(function, *args, **kwargs)

        _patched["to_static"] = original
        paddle.jit.to_static = to_static


def release_patch() -> None:
    """Undo :func:`register_patch`."""
    import paddle

    with _patch_lock:
        original = _patched.pop("to_static", None)
        if original is not None:
            paddle.jit.to_static = original


# IpuStrategy.register_patch / release_patch reach the two functions above through this
# (the configuration does not import a front door).
strategy_module.DY2STATIC.update(register_patch=register_patch, release_patch=release_patch)
