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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu.compiler.gradients import GradientProgram
from paddle_ipu.compiler.optimizer import OptimizerConfig, ParamSlot, state_names
from paddle_ipu.errors import FeedError, NotSupportedError, OptionError

F32 = np.float32
_ONE = F32(1.0)


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
    w = weight.astype(F32, copy=False)
    g = grad.astype(F32, copy=False)
    lr32 = _f(lr)
    wd = _f(slot.weight_decay)
    kind = config.type
    names = slot.state

    def get(role: str) -> np.ndarray:
        return state[names[role]]

    def put(role: str, value: np.ndarray) -> None:
        state[names[role]] = value.astype(F32, copy=False)

    if config.weight_decay_mode == "l2_regularization" and slot.weight_decay and kind != "momentum":
        g = g + w * wd

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
        b1, b2, eps = _f(config.beta1), _f(config.beta2), _f(config.epsilon)
        b1p = get("beta1_pow").reshape(-1)[0].astype(F32)
        b2p = get("beta2_pow").reshape(-1)[0].astype(F32)
        lr_t = lr32 * (np.sqrt(_ONE - b2p) / (_ONE - b1p))
        eps_t = eps * np.sqrt(_ONE - b2p)
        if kind == "adamw" and slot.weight_decay:
            w = w - lr32 * _ONE * wd * w
        m1 = b1 * get("moment1") + (_ONE - b1) * g
        m2 = b2 * get("moment2") + (_ONE - b2) * g * g
        put("moment1", m1)
        put("moment2", m2)
        put("beta1_pow", np.full([1], b1 * b1p, dtype=F32))
        put("beta2_pow", np.full([1], b2 * b2p, dtype=F32))
        return w + (-lr_t) * (m1 / (np.sqrt(m2) + eps_t))

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
        artifact: the gradient program (``CompiledModel.training`` for the host).
        optimizer: the optimizer (default: ``artifact.optimizer``).
        accumulation_factor: micro-batches per replica per step (af).
        replication_factor: replicas (rf).
        gradient_reduction: ``"mean"`` (divide the summed gradients by af*rf, Paddle
            2.x's IPU default) or ``"sum"``.

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
        self.af = int(accumulation_factor)
        self.rf = int(replication_factor)
        self.reduction = reduction
        self._paddle = paddle
        self._place = paddle.CPUPlace()
        self._exe = paddle.static.Executor(self._place)
        self._scope = paddle.static.Scope()
        self.weights: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}
        self.lr = _f(self.optimizer.lr)
        # per replica: buffer name -> array (only used when rf > 1)
        self._replica_buffers: list[dict[str, np.ndarray]] = [{} for _ in range(self.rf)]
        for slot in self.optimizer.params:
            self.state.update(initial_state(self.optimizer, slot))

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

    def _set_scope(self, name: str, value: np.ndarray) -> None:
        self._scope.var(name).get_tensor().set(np.ascontiguousarray(value), self._place)

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
                self.weights[name] = arr.astype(F32, copy=True)
                self._set_scope(name, self.weights[name])
            elif name in self.state:
                self.state[name] = arr.astype(F32, copy=True).reshape(self.state[name].shape)
            elif name in buffers:
                self._set_scope(name, arr)
                for copy in self._replica_buffers:
                    copy[name] = arr.copy()
            elif name == self.optimizer.lr_name:
                self.lr = _f(float(arr.reshape(-1)[0]))
            else:
                raise KeyError(f"{name!r} is not a weight, optimizer state or buffer of this model")

    def read(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Copies of the named tensors (default: all of :meth:`names`)."""
        wanted = list(names) if names is not None else self.names()
        buffers = set(self.buffer_names)
        out: dict[str, np.ndarray] = {}
        for name in wanted:
            if name in self.weights:
                out[name] = self.weights[name].copy()
            elif name in self.state:
                out[name] = self.state[name].copy()
            elif name in buffers:
                if self.rf > 1 and name in self._replica_buffers[0]:
                    out[name] = self._replica_buffers[0][name].copy()
                else:
                    out[name] = self._get_scope(name)
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
            if tensor is None or not tensor._is_initialized():
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
        fetch_list = gp.fetch_list
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
                result = self._exe.run(
                    gp.program, feed=feed, fetch_list=fetch_list, scope=self._scope
                )
                if swap:
                    for name in gp.buffers:
                        self._replica_buffers[r][name] = self._get_scope(name)
                row.append([np.asarray(v) for v in result[:n_out]])
                for i, g in enumerate(result[n_out:]):
                    g32 = np.asarray(g, dtype=F32)
                    prev = sums[i]
                    sums[i] = g32.copy() if prev is None else prev + g32
            outputs.append(row)
        count = self.af * self.rf
        grads: dict[str, np.ndarray] = {}
        for slot, total in zip(self.optimizer.params, sums):
            assert total is not None
            grads[slot.name] = total / F32(count) if self.reduction == "mean" else total
        return grads, outputs

    def apply_gradients(self, grads: Mapping[str, np.ndarray]) -> None:
        """Clip, regularise and update every parameter (one optimizer step)."""
        grads = clip_by_global_norm(grads, self.optimizer)
        for slot in self.optimizer.params:
            if slot.name not in self.weights:
                raise KeyError(f"weight {slot.name!r} was never written to the trainer")
            new = apply_update(
                self.optimizer, slot, self.weights[slot.name], grads[slot.name], self.state, self.lr
            )
            self.weights[slot.name] = new.astype(F32, copy=False)
            self._set_scope(slot.name, self.weights[slot.name])

    def step(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One training step.  Each feed is ``[af, rf, *micro_batch_shape]``; returns
        the loss and fetches by name, each ``[af, rf, *shape]``."""
        grads, outputs = self.compute_gradients(feeds)
        self.apply_gradients(grads)
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
