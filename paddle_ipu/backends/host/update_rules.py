"""The host backend's optimizer update rules, in numpy.

:func:`apply_update` holds the update rules of the ten optimizers, written against
Paddle 3.3's CPU kernels (``sgd``, ``momentum``, ``adam`` / ``adamw`` (the jit kernels),
``adamax``, ``lamb``, ``adagrad``, ``adadelta``, ``rmsprop``) in float32 arithmetic, in
the same order of operations, so that a host run tracks ``Executor.run`` of the original
program to float32 rounding.  Global-norm clipping and L2 regularisation are applied as
Paddle's Python optimizer inserts them: clip first, then ``g + coeff * w``.  Adam's
update also runs in one pass in the C++ core (csrc/core/optim.cc), bitwise equal to
the numpy formulas here (tests/unit/test_core_optim.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paddle_ipu import _core
from paddle_ipu.compiler.optimizer import OptimizerConfig, ParamSlot, state_names
from paddle_ipu.errors import NotSupportedError

F32 = np.float32
F16 = np.float16
ONE = F32(1.0)
# Adam's update in one pass (csrc/core/optim.cc), bitwise equal to apply_update's
# numpy formulas; adam_update_many does every parameter of a step in one call.
adam_update = _core.adam_update
adam_update_many = _core.adam_update_many


def immutable(value: np.ndarray) -> bool:
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


def round_fp16(value: np.ndarray) -> np.ndarray:
    """``value`` rounded to float16 (round to nearest even), held as float32."""
    return np.asarray(value, dtype=F32).astype(F16).astype(F32)


def f32(x: float | np.floating[Any]) -> np.float32:
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
    clip = f32(config.clip_norm)
    factor = clip / np.maximum(norm, clip)
    out = dict(grads)
    for n in clipped:
        out[n] = (grads[n] * factor).astype(F32, copy=False)
    return out


def regularised(
    config: OptimizerConfig, slot: ParamSlot, weight: np.ndarray, grad: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """``(w, g, weight_decay)`` in float32, ``g`` with L2 regularisation applied (every
    optimizer but Momentum, which applies it itself)."""
    w = weight.astype(F32, copy=False)
    g = grad.astype(F32, copy=False)
    wd = f32(slot.weight_decay)
    if (
        config.weight_decay_mode == "l2_regularization"
        and slot.weight_decay
        and config.type != "momentum"
    ):
        g = g + w * wd
    return w, g, wd


def adam_inputs(
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
    b1, b2 = f32(config.beta1), f32(config.beta2)
    b1p = state[names["beta1_pow"]].reshape(-1)[0].astype(F32)
    b2p = state[names["beta2_pow"]].reshape(-1)[0].astype(F32)
    key = (float(b1p), float(b2p))
    cached = scalars.get(key) if scalars is not None else None
    if cached is None:
        lr_t = lr32 * (np.sqrt(ONE - b2p) / (ONE - b1p))
        eps_t = f32(config.epsilon) * np.sqrt(ONE - b2p)
        cached = (-lr_t, eps_t)
        if scalars is not None:
            scalars[key] = cached
    if config.type == "adamw" and slot.weight_decay:
        w = w - lr32 * ONE * wd * w
    # m1 = b1 * m1 + (1 - b1) * g;  m2 = b2 * m2 + (1 - b2) * g * g
    # w + (-lr_t) * (m1 / (sqrt(m2) + eps_t))
    # The state gets new arrays (snapshots may hold the old ones).
    m1_old, m2_old = state[names["moment1"]], state[names["moment2"]]
    state[names["beta1_pow"]] = np.full([1], b1 * b1p, dtype=F32)
    state[names["beta2_pow"]] = np.full([1], b2 * b2p, dtype=F32)
    return w, g, m1_old, m2_old, cached[0], cached[1]


def adam_fusable(w: np.ndarray, g: np.ndarray, m1: np.ndarray, m2: np.ndarray) -> bool:
    """Whether the core's one-pass loop can update these arrays."""
    return all(a.dtype == F32 and a.flags.c_contiguous for a in (w, g, m1, m2)) and (
        w.shape == g.shape == m1.shape == m2.shape
    )


def adam_numpy(
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
    b1, b2 = f32(config.beta1), f32(config.beta2)
    m1 = b1 * m1_old + (ONE - b1) * g
    m2 = b2 * m2_old + (ONE - b2) * g * g
    state[slot.state["moment1"]] = m1.astype(F32, copy=False)
    state[slot.state["moment2"]] = m2.astype(F32, copy=False)
    return w + neg_lr_t * (m1 / (np.sqrt(m2) + eps_t))


def no_bias_update(
    config: OptimizerConfig,
    slot: ParamSlot,
    w: np.ndarray,
    g: np.ndarray,
    state: dict[str, np.ndarray],
    lr32: np.float32,
    wd: np.float32,
) -> np.ndarray:
    """PopART's AdamNoBias and LambNoBias (``use_no_bias_optimizer``), one parameter,
    as willow/include/popart/adam.hpp documents the update (``g`` already reduced,
    clipped and, in L2 mode, regularised):

    ``m = b1 * m + (1 - b1) * g``, ``v = b2 * v + (1 - b2) * g^2`` (no bias correction:
    ``mc = m``, ``vc = v``); ``x = m / (sqrt(v) + eps)``, plus ``wd * w`` with decoupled
    decay (AdamW, Lamb); Lamb: ``r1 = ||w||``, ``r2 = ||x||``, ``phi = min(r1,
    max_weight_norm)``, the trust ratio ``phi / r2`` (1 when either is 0);
    ``w -= ratio * lr * x``.  Paddle's ``beta*_pow`` state advances as Paddle's kernels
    advance it (the bias correction does not read it)."""
    names = slot.state
    b1, b2, eps = f32(config.beta1), f32(config.beta2), f32(config.epsilon)
    m = b1 * state[names["moment1"]] + (ONE - b1) * g
    v = b2 * state[names["moment2"]] + (ONE - b2) * (g * g)
    x = m / (np.sqrt(v) + eps)
    if config.type in ("adamw", "lamb") and wd:
        x = x + wd * w
    ratio = ONE
    if config.type == "lamb":
        r1 = np.sqrt(np.sum(np.square(w, dtype=F32), dtype=F32))
        r2 = np.sqrt(np.sum(np.square(x, dtype=F32), dtype=F32))
        phi = np.minimum(r1, f32(config.max_weight_norm))
        if phi > 0 and r2 > 0:
            ratio = F32(phi / r2)
    state[names["moment1"]] = m.astype(F32, copy=False)
    state[names["moment2"]] = v.astype(F32, copy=False)
    for role, beta in (("beta1_pow", b1), ("beta2_pow", b2)):
        if role in names:
            state[names[role]] = (state[names[role]].astype(F32) * beta).astype(F32)
    return (w - ratio * lr32 * x).astype(F32, copy=False)


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
    w, g, wd = regularised(config, slot, weight, grad)
    lr32 = f32(lr)
    kind = config.type
    names = slot.state

    def get(role: str) -> np.ndarray:
        return state[names[role]]

    def put(role: str, value: np.ndarray) -> None:
        state[names[role]] = value.astype(F32, copy=False)

    if kind == "sgd":
        return w - lr32 * g

    if kind == "momentum":
        mu = f32(config.momentum)
        if slot.weight_decay:
            g = w * wd + g
        v = get("velocity") * mu + g
        put("velocity", v)
        return w - lr32 * v

    if config.no_bias and kind in ("adam", "adamw", "lamb"):
        return no_bias_update(config, slot, w, g, state, lr32, wd)

    if kind in ("adam", "adamw"):
        w, g, m1_old, m2_old, neg_lr_t, eps_t = adam_inputs(config, slot, w, g, state, lr32, wd)
        if adam_fusable(w, g, m1_old, m2_old):
            # the same operations in one pass, rounded alike (tests/unit/test_core_optim.py)
            b1, b2 = f32(config.beta1), f32(config.beta2)
            new_w, m1, m2 = adam_update(
                w, g, m1_old, m2_old, b1, ONE - b1, b2, ONE - b2, neg_lr_t, eps_t
            )
            put("moment1", m1)
            put("moment2", m2)
            return np.asarray(new_w)
        return adam_numpy(config, slot, w, g, m1_old, m2_old, state, neg_lr_t, eps_t)

    if kind == "adamax":
        b1, b2, eps = f32(config.beta1), f32(config.beta2), f32(config.epsilon)
        b1p = get("beta1_pow").astype(F32)
        m = b1 * get("moment") + (ONE - b1) * g
        inf = np.maximum(np.abs(g), (b2 * get("inf_norm")) + eps)
        lr_t = lr32 / (ONE - b1p.reshape(-1)[0])
        put("moment", m)
        put("inf_norm", inf)
        put("beta1_pow", b1p * b1)
        return w - lr_t * (m / inf)

    if kind == "lamb":
        b1, b2, eps = f32(config.beta1), f32(config.beta2), f32(config.epsilon)
        b1p = get("beta1_pow").reshape(-1)[0].astype(F32)
        b2p = get("beta2_pow").reshape(-1)[0].astype(F32)
        m1 = b1 * get("moment1") + (ONE - b1) * g
        m2 = b2 * get("moment2") + (ONE - b2) * g * g
        m1_hat = m1 / (ONE - b1p)
        m2_hat = m2 / (ONE - b2p)
        trust = m1_hat / (np.sqrt(m2_hat) + eps) + wd * w
        ratio = ONE
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
        eps = f32(config.epsilon)
        m = get("moment") + g * g
        put("moment", m)
        return w - lr32 * g / (np.sqrt(m) + eps)

    if kind == "adadelta":
        rho, eps = f32(config.rho), f32(config.epsilon)
        asg = rho * get("avg_squared_grad") + (ONE - rho) * np.square(g)
        update = -((np.sqrt(get("avg_squared_update") + eps)) / (np.sqrt(asg + eps)) * g)
        asu = rho * get("avg_squared_update") + (ONE - rho) * np.square(update)
        put("avg_squared_grad", asg)
        put("avg_squared_update", asu)
        return w + lr32 * update

    if kind in ("rmsprop", "centered_rmsprop"):
        rho, eps, mu = f32(config.rho), f32(config.epsilon), f32(config.momentum)
        ms = rho * get("mean_square") + (ONE - rho) * g * g
        if kind == "centered_rmsprop":
            mg = rho * get("mean_grad") + (ONE - rho) * g
            mom = mu * get("moment") + lr32 * g / np.sqrt(ms - np.square(mg) + eps)
            put("mean_grad", mg)
        else:
            mom = mu * get("moment") + lr32 * g / np.sqrt(ms + eps)
        put("mean_square", ms)
        put("moment", mom)
        return w - mom

    raise NotSupportedError(f"the host backend has no update rule for {kind!r}")
