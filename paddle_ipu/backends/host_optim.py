"""The host backend's training step: Paddle's CPU kernels for gradients, numpy for the
optimizer update.

:func:`apply_update` holds the update rules of the ten optimizers, written against
Paddle 3.3's CPU kernels (``sgd``, ``momentum``, ``adam`` / ``adamw`` (the jit kernels),
``adamax``, ``lamb``, ``adagrad``, ``adadelta``, ``rmsprop``) in float32 arithmetic, in
the same order of operations, so that a host run tracks ``Executor.run`` of the original
program to float32 rounding.  Global-norm clipping and L2 regularisation are applied as
Paddle's Python optimizer inserts them: clip first, then ``g + coeff * w``.

:class:`HostTrainer` runs one IPU training step on the host: every micro-batch of every
replica through the gradient program (:mod:`paddle_ipu.compiler.gradients`) in a private
scope, gradient reduction over ``accumulation_factor x replication_factor`` micro-batches
(Mean or Sum), then one update.  Weights and optimizer state are numpy arrays held by
Paddle name (``w``, ``w_moment1_0``, ``w_beta1_pow_acc_0`` ...), so they can be written
straight back into a Paddle scope.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.gradients import GradientProgram
from paddle_ipu.compiler.optimizer import OptimizerConfig, ParamSlot, state_names
from paddle_ipu.errors import BackendError, FeedError, NotSupportedError, OptionError

F32 = np.float32
F16 = np.float16
#: The address alignment a weight array needs to be shared with Paddle's scope.
_KERNEL_ALIGNMENT = 16
_ONE = F32(1.0)
# Adam's update in one pass (csrc/core/optim.cc), bitwise equal to apply_update's
# numpy formulas (tests/test_core_optim.py); _adam_update_many does every parameter of
# a step in one call.
_core: Any = importlib.import_module("paddle_ipu._core")
_adam_update: Any = _core.adam_update
_adam_update_many: Any = _core.adam_update_many
#: Threads for a step's Adam update.  Paddle's executor runs the program's adam ops,
#: which depend on nothing but their own parameter, on its pool of host threads
#: (OMP_NUM_THREADS does not bound it), so its CPU step updates parameters on more than
#: one core too; two threads is what the host backend's step uses for its update.
ADAM_THREADS = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
# Parameters per adam_update_many call, in elements: bounds the memory held twice
# (old and new weights and moments) while a step's update runs.
_ADAM_BATCH_ELEMENTS = 1 << 22
# PopART state prefix -> the accl*_type option that sets its dtype
_ACCL_OF_PREFIX = {
    "Accl___": "accl1",
    "Accl1___": "accl1",
    "Accl2___": "accl2",
    "Accl3___": "accl3",
}


def _immutable(value: np.ndarray) -> bool:
    """True if ``value`` is a view of a ``bytes`` object (the compiled model's weights):
    nothing can write to it, so holding it needs no copy."""
    base: Any = value
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj if base.readonly else None
    return isinstance(base, bytes)


def _round_fp16(value: np.ndarray) -> np.ndarray:
    """``value`` rounded to float16 (round to nearest even), held as float32."""
    return np.asarray(value, dtype=F32).astype(F16).astype(F32)


def _f(x: float | np.floating[Any]) -> np.float32:
    return F32(x)


def initial_state(config: OptimizerConfig, slot: ParamSlot) -> dict[str, np.ndarray]:
    """The state Paddle's startup program gives a fresh parameter (zeros; Adam-family
    ``beta1_pow`` / ``beta2_pow`` start at ``beta1`` / ``beta2``)."""
    out: dict[str, np.ndarray] = {}
    for entry in state_names(config.type):
        var = slot.state.get(entry.role)
        if var is None:
            continue
        if entry.role == "beta1_pow":
            out[var] = np.full([1], config.beta1, dtype=F32)
        elif entry.role == "beta2_pow":
            out[var] = np.full([1], config.beta2, dtype=F32)
        else:
            out[var] = np.zeros(slot.shape, dtype=F32)
    return out


def clip_by_global_norm(
    grads: Mapping[str, np.ndarray], config: OptimizerConfig
) -> dict[str, np.ndarray]:
    """``ClipGradByGlobalNorm``: scale the clipped gradients by
    ``clip_norm / max(global_norm, clip_norm)``, the norm taken over those gradients."""
    if config.clip_norm is None:
        return dict(grads)
    clipped = [slot.name for slot in config.params if slot.clip and slot.name in grads]
    if not clipped:
        return dict(grads)
    squares = np.stack(
        [np.sum(np.square(grads[n], dtype=F32), dtype=F32).reshape(()) for n in clipped]
    )
    norm = np.sqrt(np.sum(squares, dtype=F32))
    clip = _f(config.clip_norm)
    factor = clip / np.maximum(norm, clip)
    out = dict(grads)
    for n in clipped:
        out[n] = (grads[n] * factor).astype(F32, copy=False)
    return out


def _regularised(
    config: OptimizerConfig, slot: ParamSlot, weight: np.ndarray, grad: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """``(w, g, weight_decay)`` in float32, ``g`` with L2 regularisation applied (every
    optimizer but Momentum, which applies it itself)."""
    w = weight.astype(F32, copy=False)
    g = grad.astype(F32, copy=False)
    wd = _f(slot.weight_decay)
    if (
        config.weight_decay_mode == "l2_regularization"
        and slot.weight_decay
        and config.type != "momentum"
    ):
        g = g + w * wd
    return w, g, wd


def _adam_inputs(
    config: OptimizerConfig,
    slot: ParamSlot,
    w: np.ndarray,
    g: np.ndarray,
    state: dict[str, np.ndarray],
    lr32: np.float32,
    wd: np.float32,
    scalars: dict[tuple[float, float], tuple[np.float32, np.float32]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.float32, np.float32]:
    """Adam / AdamW up to the moments: AdamW's decay of ``w``, the bias-corrected step
    ``-lr_t`` and ``eps_t``, and the new ``beta*_pow`` put into ``state``.  Returns
    ``(w, g, moment1, moment2, -lr_t, eps_t)`` (the moments are the current arrays).
    ``scalars`` caches ``(-lr_t, eps_t)`` by ``(beta1_pow, beta2_pow)`` over one step's
    parameters (the same values give the same float32 results)."""
    names = slot.state
    b1, b2 = _f(config.beta1), _f(config.beta2)
    b1p = state[names["beta1_pow"]].reshape(-1)[0].astype(F32)
    b2p = state[names["beta2_pow"]].reshape(-1)[0].astype(F32)
    key = (float(b1p), float(b2p))
    cached = scalars.get(key) if scalars is not None else None
    if cached is None:
        lr_t = lr32 * (np.sqrt(_ONE - b2p) / (_ONE - b1p))
        eps_t = _f(config.epsilon) * np.sqrt(_ONE - b2p)
        cached = (-lr_t, eps_t)
        if scalars is not None:
            scalars[key] = cached
    if config.type == "adamw" and slot.weight_decay:
        w = w - lr32 * _ONE * wd * w
    # m1 = b1 * m1 + (1 - b1) * g;  m2 = b2 * m2 + (1 - b2) * g * g
    # w + (-lr_t) * (m1 / (sqrt(m2) + eps_t))
    # The state gets new arrays (snapshots may hold the old ones).
    m1_old, m2_old = state[names["moment1"]], state[names["moment2"]]
    state[names["beta1_pow"]] = np.full([1], b1 * b1p, dtype=F32)
    state[names["beta2_pow"]] = np.full([1], b2 * b2p, dtype=F32)
    return w, g, m1_old, m2_old, cached[0], cached[1]


def _adam_fusable(w: np.ndarray, g: np.ndarray, m1: np.ndarray, m2: np.ndarray) -> bool:
    """Whether the core's one-pass loop can update these arrays."""
    return all(a.dtype == F32 and a.flags.c_contiguous for a in (w, g, m1, m2)) and (
        w.shape == g.shape == m1.shape == m2.shape
    )


def _adam_numpy(
    config: OptimizerConfig,
    slot: ParamSlot,
    w: np.ndarray,
    g: np.ndarray,
    m1_old: np.ndarray,
    m2_old: np.ndarray,
    state: dict[str, np.ndarray],
    neg_lr_t: np.float32,
    eps_t: np.float32,
) -> np.ndarray:
    """Adam's moments and weight with numpy (arrays the core's loop does not take)."""
    b1, b2 = _f(config.beta1), _f(config.beta2)
    m1 = b1 * m1_old + (_ONE - b1) * g
    m2 = b2 * m2_old + (_ONE - b2) * g * g
    state[slot.state["moment1"]] = m1.astype(F32, copy=False)
    state[slot.state["moment2"]] = m2.astype(F32, copy=False)
    return w + neg_lr_t * (m1 / (np.sqrt(m2) + eps_t))


def apply_update(
    config: OptimizerConfig,
    slot: ParamSlot,
    weight: np.ndarray,
    grad: np.ndarray,
    state: dict[str, np.ndarray],
    lr: float | np.floating[Any],
) -> np.ndarray:
    """One optimizer update of one parameter; returns the new weight and replaces the
    entries of ``state`` (Paddle names) with new arrays.  ``grad`` is already reduced
    and clipped; L2 regularisation is applied here."""
    w, g, wd = _regularised(config, slot, weight, grad)
    lr32 = _f(lr)
    kind = config.type
    names = slot.state

    def get(role: str) -> np.ndarray:
        return state[names[role]]

    def put(role: str, value: np.ndarray) -> None:
        state[names[role]] = value.astype(F32, copy=False)

    if kind == "sgd":
        return w - lr32 * g

    if kind == "momentum":
        mu = _f(config.momentum)
        if slot.weight_decay:
            g = w * wd + g
        v = get("velocity") * mu + g
        put("velocity", v)
        return w - lr32 * v

    if kind in ("adam", "adamw"):
        w, g, m1_old, m2_old, neg_lr_t, eps_t = _adam_inputs(config, slot, w, g, state, lr32, wd)
        if _adam_fusable(w, g, m1_old, m2_old):
            # the same operations in one pass, rounded alike (tests/test_core_optim.py)
            b1, b2 = _f(config.beta1), _f(config.beta2)
            new_w, m1, m2 = _adam_update(
                w, g, m1_old, m2_old, b1, _ONE - b1, b2, _ONE - b2, neg_lr_t, eps_t
            )
            put("moment1", m1)
            put("moment2", m2)
            return np.asarray(new_w)
        return _adam_numpy(config, slot, w, g, m1_old, m2_old, state, neg_lr_t, eps_t)

    if kind == "adamax":
        b1, b2, eps = _f(config.beta1), _f(config.beta2), _f(config.epsilon)
        b1p = get("beta1_pow").astype(F32)
        m = b1 * get("moment") + (_ONE - b1) * g
        inf = np.maximum(np.abs(g), (b2 * get("inf_norm")) + eps)
        lr_t = lr32 / (_ONE - b1p.reshape(-1)[0])
        put("moment", m)
        put("inf_norm", inf)
        put("beta1_pow", b1p * b1)
        return w - lr_t * (m / inf)

    if kind == "lamb":
        b1, b2, eps = _f(config.beta1), _f(config.beta2), _f(config.epsilon)
        b1p = get("beta1_pow").reshape(-1)[0].astype(F32)
        b2p = get("beta2_pow").reshape(-1)[0].astype(F32)
        m1 = b1 * get("moment1") + (_ONE - b1) * g
        m2 = b2 * get("moment2") + (_ONE - b2) * g * g
        m1_hat = m1 / (_ONE - b1p)
        m2_hat = m2 / (_ONE - b2p)
        trust = m1_hat / (np.sqrt(m2_hat) + eps) + wd * w
        ratio = _ONE
        if wd > 0 or config.lamb_always_adapt:
            pn = np.sqrt(np.sum(np.square(w, dtype=F32), dtype=F32))
            tn = np.sqrt(np.sum(np.square(trust, dtype=F32), dtype=F32))
            if pn > 0 and tn > 0:
                ratio = pn / tn
        put("moment1", m1)
        put("moment2", m2)
        put("beta1_pow", np.full([1], b1p * b1, dtype=F32))
        put("beta2_pow", np.full([1], b2p * b2, dtype=F32))
        return w - (lr32 * ratio) * trust

    if kind == "adagrad":
        eps = _f(config.epsilon)
        m = get("moment") + g * g
        put("moment", m)
        return w - lr32 * g / (np.sqrt(m) + eps)

    if kind == "adadelta":
        rho, eps = _f(config.rho), _f(config.epsilon)
        asg = rho * get("avg_squared_grad") + (_ONE - rho) * np.square(g)
        update = -((np.sqrt(get("avg_squared_update") + eps)) / (np.sqrt(asg + eps)) * g)
        asu = rho * get("avg_squared_update") + (_ONE - rho) * np.square(update)
        put("avg_squared_grad", asg)
        put("avg_squared_update", asu)
        return w + lr32 * update

    if kind in ("rmsprop", "centered_rmsprop"):
        rho, eps, mu = _f(config.rho), _f(config.epsilon), _f(config.momentum)
        ms = rho * get("mean_square") + (_ONE - rho) * g * g
        if kind == "centered_rmsprop":
            mg = rho * get("mean_grad") + (_ONE - rho) * g
            mom = mu * get("moment") + lr32 * g / np.sqrt(ms - np.square(mg) + eps)
            put("mean_grad", mg)
        else:
            mom = mu * get("moment") + lr32 * g / np.sqrt(ms + eps)
        put("mean_square", ms)
        put("moment", mom)
        return w - mom

    raise NotSupportedError(f"the host backend has no update rule for {kind!r}")


class HostTrainer:
    """One emulated IPU training session on the host.

    Args:
        artifact: the gradient program (built from ``SessionConfig.training_source``).
        optimizer: the optimizer (default: ``artifact.optimizer``).
        accumulation_factor: micro-batches per replica per step (af).
        replication_factor: replicas (rf).
        gradient_reduction: ``"mean"`` (divide the summed gradients by af*rf, Paddle
            2.x's IPU default) or ``"sum"``.
        weight_dtype: the device dtype of the weights and buffers: ``"float16"``
            emulates ``enable_fp16`` (values rounded to float16 after every write and
            update; the gradient program computes in float32 from the rounded values).

    Optimizer state whose ``accl*_type`` is ``FLOAT16`` is rounded to float16 after
    every update and read back as float16; the rest is float32.

    State.  Weights, optimizer state and the learning rate are numpy arrays held by
    Paddle name; BatchNorm-style buffers live in a private ``paddle.static.Scope``, one
    copy per replica (replica 0's is what :meth:`read` returns, as PopART's
    ``weightsToHost`` does for replicated weights).
    """

    def __init__(
        self,
        artifact: GradientProgram,
        optimizer: OptimizerConfig | None = None,
        *,
        accumulation_factor: int = 1,
        replication_factor: int = 1,
        gradient_reduction: str = "mean",
        weight_dtype: str = "float32",
    ) -> None:
        import paddle

        if accumulation_factor < 1 or replication_factor < 1:
            raise OptionError("accumulation_factor and replication_factor must be >= 1")
        reduction = gradient_reduction.lower()
        if reduction not in ("mean", "sum"):
            raise OptionError(
                f"gradient_reduction must be 'mean' or 'sum', got {gradient_reduction!r}"
            )
        self.artifact = artifact
        self.optimizer = optimizer if optimizer is not None else artifact.optimizer
        if weight_dtype not in ("float32", "float16"):
            raise OptionError(f"weight_dtype must be 'float32' or 'float16', got {weight_dtype!r}")
        #: the device holds weights (and buffers) in float16: every value written or
        #: updated is rounded to float16, and read back as float16
        self.fp16 = weight_dtype == "float16"
        self.af = int(accumulation_factor)
        self.rf = int(replication_factor)
        self.reduction = reduction
        self._paddle = paddle
        self._place = paddle.CPUPlace()
        self._exe = paddle.static.Executor(self._place)
        self._scope = paddle.static.Scope()
        from paddle_ipu.compiler.gradients import empty_parameters

        for name, (shape, dtype) in empty_parameters(artifact.program).items():
            self._scope.var(name).get_tensor().set(np.zeros(shape, dtype), self._place)
        # Gradients stay in the scope (GradientProgram.grad_outputs): only the loss and
        # the user's fetches go through fetch ops.
        self._runner = paddle_api.CachedProgramRunner(
            self._exe, artifact.program, artifact.output_list, self._scope
        )
        self.weights: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}
        # name -> (array, the DenseTensor over its memory, its address or 0): the
        # weights the gradient program's scope shares, the state share_into exported
        self._weight_src: dict[str, tuple[np.ndarray, Any, int]] = {}
        self._exported: dict[str, tuple[np.ndarray, Any, int]] = {}
        self.lr = _f(self.optimizer.lr)
        # per replica: buffer name -> array (only used when rf > 1)
        self._replica_buffers: list[dict[str, np.ndarray]] = [{} for _ in range(self.rf)]
        for slot in self.optimizer.params:
            self.state.update(initial_state(self.optimizer, slot))

    def __del__(self) -> None:
        # Paddle keeps every Scope made from Python in its scope pool until the process
        # exits; erasing the variables frees their tensors when the trainer goes.
        scope = getattr(self, "_scope", None)
        if scope is not None:
            with contextlib.suppress(Exception):
                scope.erase(scope.local_var_names())
        # the freed Adam outputs the core keeps for the next step's update
        with contextlib.suppress(Exception):
            _core.adam_release_memory()

    # ------------------------------------------------------------------ names and I/O
    @property
    def buffer_names(self) -> list[str]:
        return list(self.artifact.buffers)

    def names(self) -> list[str]:
        """Every tensor the trainer holds: weights, optimizer state, buffers, lr."""
        return [
            *self.optimizer.param_names,
            *self.optimizer.state_var_names(),
            *self.buffer_names,
            self.optimizer.lr_name,
        ]

    def share_into(self, tensors: Mapping[str, Any]) -> dict[str, int]:
        """Point each Paddle tensor of ``tensors`` (by weight or optimizer-state name)
        at the trainer's own array of that name, without a copy (the scope of a
        program trained on the ipu place).  Returns the address each shared tensor
        now holds; a name left out was not shared (the caller copies).

        Every update makes new arrays and the trainer never writes into one it made,
        so such a tensor holds the last step's values; a write into it before the
        next step is what that step reads, as it is the trainer's own state.  Not
        shared: values held in float16 (a read converts them), read-only arrays (the
        compiled model's weights, before the first update) and unaligned ones.

        Each array is exported to Paddle once (Paddle 3.3 never frees an array that
        ``from_dlpack`` took twice): a weight through the DenseTensor the gradient
        program's scope already shares, the state through one cached DenseTensor."""
        out: dict[str, int] = {}
        half = self._fp16_state()
        for name, tensor in tensors.items():
            value = self.weights.get(name)
            if value is not None:
                exported = self._weight_src.get(name)
                if self.fp16 or exported is None or exported[0] is not value or not exported[2]:
                    continue
            else:
                value = self.state.get(name)
                if value is None or name in half:
                    continue
                exported = self._exported.get(name)
                if exported is None or exported[0] is not value:
                    exported = self._export(value)
                    if exported is None:
                        continue
                    self._exported[name] = exported
            paddle_api.share_data(tensor, exported[1])
            out[name] = exported[2]
        return out

    @staticmethod
    def _export(value: np.ndarray) -> tuple[np.ndarray, Any, int] | None:
        """(value, a DenseTensor over its memory, its address) for a writable, aligned,
        C-contiguous float32 array; None for any other."""
        flags = value.flags
        if value.dtype != F32 or not (flags.writeable and flags.c_contiguous):
            return None
        try:
            dense = paddle_api.dense_from_dlpack(value.__dlpack__(max_version=(1, 0)))
        except Exception:  # a layout or version DLPack refuses: not shared
            return None
        address = paddle_api.data_ptr(dense)
        if address % _KERNEL_ALIGNMENT:
            return None
        return value, dense, address

    def _set_scope(self, name: str, value: np.ndarray) -> None:
        self._scope.var(name).get_tensor().set(np.ascontiguousarray(value), self._place)

    def _share_weight(self, name: str, value: np.ndarray) -> None:
        """Point the gradient program's parameter at ``value``'s memory, without a copy.

        A weight array is never written after it is made (an update makes a new one),
        and the gradient program only reads parameters, so the scope can hold the same
        memory: the trainer keeps one copy of the weights, not two (and none of its
        own while they are the compiled model's: see compiler.weights).  An array that
        is not aligned, or that DLPack cannot export, is copied."""
        arr = np.ascontiguousarray(value)
        if arr.ctypes.data % _KERNEL_ALIGNMENT:
            # Paddle's CPU kernels compute wrong numbers from float tensors that are
            # not aligned (seen with a view of unpadded ONNX bytes): copy.
            self._weight_src.pop(name, None)
            self._set_scope(name, arr)
            return
        # Paddle's core converter gives a DenseTensor in static and dygraph mode alike
        # (paddle.utils.dlpack wraps it in an eager Tensor under dygraph, which
        # _share_data_with refuses).  The capsule's deleter keeps ``arr`` alive; a
        # versioned capsule carries read-only arrays (the compiled model's weights).
        # Each array is exported once (Paddle never frees an array from_dlpack took
        # twice): the DenseTensor is kept with it, for restore() and share_into().
        cached = self._weight_src.get(name)
        if cached is not None and cached[0] is arr:
            paddle_api.share_data(self._scope.var(name).get_tensor(), cached[1])
            return
        try:
            shared = paddle_api.dense_from_dlpack(arr.__dlpack__(max_version=(1, 0)))
            paddle_api.share_data(self._scope.var(name).get_tensor(), shared)
        except Exception:  # a dtype, layout or version DLPack refuses: the copy below
            self._weight_src.pop(name, None)
            self._set_scope(name, arr)
            return
        # the address only for an array share_into may hand out (writable float32)
        writable = arr.flags.writeable and arr.dtype == F32
        self._weight_src[name] = (arr, shared, arr.ctypes.data if writable else 0)

    def _get_scope(self, name: str) -> np.ndarray:
        var = self._scope.find_var(name)
        if var is None:
            raise KeyError(name)
        return np.array(var.get_tensor())

    def write(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Set weights, optimizer state, buffers (all replicas) or the lr by Paddle name."""
        params = set(self.optimizer.param_names)
        buffers = set(self.buffer_names)
        for name, value in arrays.items():
            arr = np.asarray(value)
            if name in params:
                self.weights[name] = self._device_value(arr)
                self._share_weight(name, self.weights[name])
            elif name in self.state:
                value = arr.astype(F32, copy=True).reshape(self.state[name].shape)
                self.state[name] = _round_fp16(value) if name in self._fp16_state() else value
            elif name in buffers:
                if self.fp16 and arr.dtype.kind == "f":
                    arr = self._device_value(arr)
                self._set_scope(name, arr)
                for copy in self._replica_buffers:
                    copy[name] = arr.copy()
            elif name == self.optimizer.lr_name:
                self.lr = _f(float(arr.reshape(-1)[0]))
            else:
                raise KeyError(f"{name!r} is not a weight, optimizer state or buffer of this model")

    def read(
        self, names: Iterable[str] | None = None, *, copy: bool = True
    ) -> dict[str, np.ndarray]:
        """Copies of the named tensors (default: all of :meth:`names`).  ``copy=False``:
        the trainer's own float32 weights and state where no conversion is needed, for
        a caller that only reads them before the next step (they are never written)."""
        wanted = list(names) if names is not None else self.names()
        buffers = set(self.buffer_names)
        out: dict[str, np.ndarray] = {}
        half = self._fp16_state()
        for name in wanted:
            if name in self.weights:
                value = self.weights[name]
                out[name] = value.astype(F16) if self.fp16 else value.copy() if copy else value
            elif name in self.state:
                value = self.state[name]
                out[name] = value.astype(F16) if name in half else value.copy() if copy else value
            elif name in buffers:
                if self.rf > 1 and name in self._replica_buffers[0]:
                    value = self._replica_buffers[0][name].copy()
                else:
                    value = self._get_scope(name)
                out[name] = value.astype(F16) if self.fp16 and value.dtype == F32 else value
            elif name == self.optimizer.lr_name:
                out[name] = np.array(self.lr, dtype=F32)
            else:
                raise KeyError(name)
        return out

    def load_scope(self, scope: Any, *, require_state: bool = False) -> None:
        """Read every weight, state, buffer and the lr from a Paddle scope.  A missing
        optimizer-state variable keeps its initial value unless ``require_state``."""
        arrays: dict[str, np.ndarray] = {}
        state = set(self.optimizer.state_var_names())
        for name in self.names():
            var = scope.find_var(name)
            tensor = var.get_tensor() if var is not None else None
            if tensor is None or not paddle_api.is_initialized(tensor):
                if name in state and not require_state:
                    continue
                if name == self.optimizer.lr_name:
                    continue
                raise KeyError(
                    f"{name!r} is not initialised in the scope (run the startup program)"
                )
            arrays[name] = np.array(tensor)
        self.write(arrays)

    def store_scope(self, scope: Any) -> None:
        """Write every weight, state and buffer back into a Paddle scope."""
        place = self._place
        for name, value in self.read().items():
            scope.var(name).get_tensor().set(np.ascontiguousarray(value), place)

    def set_lr(self, lr: float) -> None:
        self.lr = _f(lr)

    def _device_value(self, value: np.ndarray) -> np.ndarray:
        """A weight as the device holds it: float16-rounded in fp16, else float32; a
        copy, unless it is already an immutable float32 array (the compiled weights)."""
        if self.fp16:
            return _round_fp16(value)
        if value.dtype == F32 and _immutable(value):
            return value
        return np.array(value, dtype=F32, copy=True)

    def _fp16_state(self) -> frozenset[str]:
        """The optimizer-state variables held in float16 (``accl*_type`` FLOAT16)."""
        config = self.optimizer
        types = {"accl1": config.accl1_type, "accl2": config.accl2_type, "accl3": config.accl3_type}
        if "FLOAT16" not in types.values():
            return frozenset()
        half: set[str] = set()
        for entry in state_names(config.type):
            accl = _ACCL_OF_PREFIX.get(entry.device_prefix)
            if accl is None or types[accl] != "FLOAT16":
                continue
            half.update(
                slot.state[entry.role] for slot in config.params if entry.role in slot.state
            )
        return frozenset(half)

    def _round_buffers(self) -> None:
        """fp16: the buffers a step updated (BatchNorm statistics) as the device holds them."""
        for name in self.artifact.buffers:
            value = self._get_scope(name)
            if value.dtype == F32:
                self._set_scope(name, _round_fp16(value))
        for copy in self._replica_buffers:
            for name, value in copy.items():
                if value.dtype == F32:
                    copy[name] = _round_fp16(value)

    # ------------------------------------------------------------------ the step
    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name in self.artifact.feed_names:
            if name not in feeds:
                raise FeedError(f"missing feed {name!r}")
            arr = np.asarray(feeds[name])
            if arr.ndim < 2 or arr.shape[0] != self.af or arr.shape[1] != self.rf:
                raise FeedError(
                    f"feed {name!r} has shape {arr.shape}; expected "
                    f"[accumulation_factor={self.af}, replication_factor={self.rf}, ...]"
                )
            out[name] = arr
        return out

    def compute_gradients(
        self, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], list[list[list[np.ndarray]]]]:
        """Run every micro-batch; return the reduced gradients and, per [a][r], the
        outputs (loss first, then the user's fetches)."""
        arrays = self._check_feeds(feeds)
        gp = self.artifact
        n_out = 1 + len(gp.fetches)
        sums: list[np.ndarray | None] = [None] * len(gp.grads)
        outputs: list[list[list[np.ndarray]]] = []
        swap = self.rf > 1 and bool(gp.buffers)
        if swap and not self._replica_buffers[0]:
            for copy in self._replica_buffers:
                for name in gp.buffers:
                    copy[name] = self._get_scope(name)
        for a in range(self.af):
            row: list[list[np.ndarray]] = []
            for r in range(self.rf):
                if swap:
                    for name, value in self._replica_buffers[r].items():
                        self._set_scope(name, value)
                feed = {name: arr[a, r] for name, arr in arrays.items()}
                result = self._runner.run(feed)
                if swap:
                    for name in gp.buffers:
                        self._replica_buffers[r][name] = self._get_scope(name)
                row.append([np.asarray(v) for v in result[:n_out]])
                for i, g in enumerate(self._read_grads(result[n_out:])):
                    prev = sums[i]
                    if prev is None:
                        # a view of the scope's memory, which the next run may reuse:
                        # kept as it is only when no other run follows this step's update
                        one = self.af * self.rf == 1 and g.dtype == F32
                        sums[i] = g if one else np.array(g, dtype=F32)
                    else:
                        prev += g
            outputs.append(row)
        count = self.af * self.rf
        grads: dict[str, np.ndarray] = {}
        for slot, total in zip(self.optimizer.params, sums):
            assert total is not None
            mean = self.reduction == "mean" and count > 1  # x / 1 is x
            grads[slot.name] = total / F32(count) if mean else total
        return grads, outputs

    def _read_grads(self, fetched: Sequence[Any]) -> list[np.ndarray]:
        """The last run's gradients: read-only views of the scope's tensors, and the
        ``fetched`` ones (GradientProgram.output_list) in their places."""
        from paddle_ipu.tensor_view import as_numpy

        grads = []
        rest = iter(fetched)
        for name in self.artifact.grad_outputs:
            if not name:
                grads.append(np.asarray(next(rest)))
                continue
            var = self._scope.find_var(name)
            if var is None or not paddle_api.is_initialized(var.get_tensor()):
                raise BackendError(f"the gradient program left no gradient {name!r} in its scope")
            grads.append(as_numpy(var.get_tensor(), readonly=True))
        return grads

    def apply_gradients(self, grads: Mapping[str, np.ndarray]) -> None:
        """Clip, regularise and update every parameter (one optimizer step).

        Adam and AdamW update every parameter the core's loop takes in a few calls of
        ``adam_update_many`` (on :data:`ADAM_THREADS` threads), the same arithmetic as
        :func:`apply_update` parameter by parameter."""
        config = self.optimizer
        grads = clip_by_global_norm(grads, config)
        half = self._fp16_state()
        adam = config.type in ("adam", "adamw")
        lr32 = _f(self.lr)
        scalars: dict[tuple[float, float], tuple[np.float32, np.float32]] = {}
        batch: list[tuple[ParamSlot, tuple[Any, ...]]] = []
        batch_elements = 0
        for slot in config.params:
            if slot.name not in self.weights:
                raise KeyError(f"weight {slot.name!r} was never written to the trainer")
        for slot in config.params:
            weight, grad = self.weights[slot.name], grads[slot.name]
            if not adam:
                new = apply_update(config, slot, weight, grad, self.state, self.lr)
                self._updated(slot, new, half)
                continue
            w, g, wd = _regularised(config, slot, weight, grad)
            inputs = _adam_inputs(config, slot, w, g, self.state, lr32, wd, scalars)
            if not _adam_fusable(*inputs[:4]):
                self._updated(
                    slot, _adam_numpy(config, slot, *inputs[:4], self.state, *inputs[4:]), half
                )
                continue
            batch.append((slot, inputs))
            batch_elements += inputs[0].size
            if batch_elements >= _ADAM_BATCH_ELEMENTS:
                self._adam_batch(batch, half)
                batch, batch_elements = [], 0
        if batch:
            self._adam_batch(batch, half)

    def _adam_batch(
        self, batch: Sequence[tuple[ParamSlot, tuple[Any, ...]]], half: frozenset[str]
    ) -> None:
        """The core's Adam loop over ``batch``: (slot, :func:`_adam_inputs`) pairs."""
        b1, b2 = _f(self.optimizer.beta1), _f(self.optimizer.beta2)
        columns = list(zip(*(inputs for _, inputs in batch)))
        results = _adam_update_many(
            *(list(c) for c in columns[:4]),
            b1,
            _ONE - b1,
            b2,
            _ONE - b2,
            list(columns[4]),
            list(columns[5]),
            threads=ADAM_THREADS,
        )
        for (slot, _), (new, m1, m2) in zip(batch, results):
            self.state[slot.state["moment1"]] = m1
            self.state[slot.state["moment2"]] = m2
            self._updated(slot, new, half)

    def _updated(self, slot: ParamSlot, new: np.ndarray, half: frozenset[str]) -> None:
        """Hold ``slot``'s new weight (and its state) as the device does, and point the
        gradient program's parameter at it."""
        if half:
            for var in slot.state.values():
                if var in half:
                    self.state[var] = _round_fp16(self.state[var])
        new = _round_fp16(new) if self.fp16 else new.astype(F32, copy=False)
        self.weights[slot.name] = new
        self._share_weight(slot.name, new)

    def step(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One training step.  Each feed is ``[af, rf, *micro_batch_shape]``; returns
        the loss and fetches by name, each ``[af, rf, *shape]``."""
        grads, outputs = self.compute_gradients(feeds)
        self.apply_gradients(grads)
        if self.fp16:
            self._round_buffers()
        result: dict[str, np.ndarray] = {}
        for k, name in enumerate(self.artifact.output_names):
            result[name] = np.stack(
                [np.stack([outputs[a][r][k] for r in range(self.rf)]) for a in range(self.af)]
            )
        return result


def stack_micro_batches(
    batches: Sequence[Mapping[str, np.ndarray]], af: int, rf: int
) -> dict[str, np.ndarray]:
    """``af * rf`` per-micro-batch feed dicts, in [a][r] order, as step feeds."""
    if len(batches) != af * rf:
        raise FeedError(f"expected {af * rf} micro-batches, got {len(batches)}")
    names = batches[0].keys()
    return {
        n: np.stack([np.asarray(b[n]) for b in batches]).reshape(
            af, rf, *np.asarray(batches[0][n]).shape
        )
        for n in names
    }
