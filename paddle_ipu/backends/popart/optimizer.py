"""Translating the compiled model's optimizer (:class:`OptimizerConfig`, Paddle's
optimizer as the compiler read it) into a PopART optimizer (``SGD``, ``Adam``,
``Adaptive``), with the hyper-parameters and per-weight settings PopART names
(:func:`to_popart_optimizer`); :func:`session_optimizer` adds what the IpuStrategy
says about it (:func:`with_strategy` its overrides of the program's).

Checked against PopART 3.0-3.4's ``willow/include/popart/adam.hpp``, ``sgd.hpp`` and
``adaptive.hpp``; see docs/optimizers.md for the mapping of each optimizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler.optimizer import OptimizerConfig
from paddle_ipu.errors import NotSupportedError, OptionError

# The largest float32: a weight-norm bound that never applies.
_NO_WEIGHT_NORM_BOUND = 3.4028234663852886e38


def _accl_type(popart: Any, value: Any, default: Any) -> Any:
    if value is None or value == "":
        return default
    text = str(value).upper()
    if text in ("FLOAT", "FLOAT32", "FP32"):
        return popart.DataType.FLOAT
    if text in ("FLOAT16", "HALF", "FP16"):
        return popart.DataType.FLOAT16
    raise OptionError(f"optimizer state type {value!r} is not FLOAT or FLOAT16")


def specific_decay_weights(
    cfg: OptimizerConfig, device_names: Mapping[str, str] | None = None
) -> list[str]:
    """Device names of the parameters whose decay differs from the common one
    (ParamAttr regularizers, AdamW's apply_decay_param_fun, Lamb's exclusions)."""
    names = device_names or {}
    return [
        names.get(slot.name, slot.name)
        for slot in cfg.params
        if float(slot.weight_decay) != float(cfg.weight_decay)
    ]


def to_popart_optimizer(
    cfg: OptimizerConfig,
    popart: Any,
    device_names: Mapping[str, str] | None = None,
    specific: Sequence[str] | None = None,
    *,
    max_weight_norm: float | None = None,
    scaled_optimizer_state: bool = False,
    no_bias: bool = False,
) -> Any:
    """Translate an :class:`~paddle_ipu.compiler.optimizer.OptimizerConfig` into a
    ``popart.SGD``, ``popart.Adam`` or ``popart.Adaptive``.

    Fields read: ``type``, ``lr``, ``weight_decay``, ``weight_decay_mode``,
    ``momentum``, ``beta1``, ``beta2``, ``epsilon``, ``rho``, ``clip_norm``,
    ``loss_scaling``, ``accl1_type``/``accl2_type``/``accl3_type``, and per parameter
    ``params[i].name``, ``.weight_decay`` and ``.clip``.  ``device_names`` maps a
    Paddle parameter name to its device tensor name where the two differ.

    Per-parameter decays go in with ``insertSpecific`` for the weights in
    ``specific`` (default: :func:`specific_decay_weights`).  A replacement optimizer
    must carry the same specific weights as the one the session was built with, so
    the session passes the list it started with on every update.

    From the IpuStrategy: ``max_weight_norm`` bounds Lamb's trust ratio (PopART's
    ``defaultMaxWeightNorm``, 10 when unset, adam.hpp; ``None``: no bound, as Paddle's
    kernel), ``scaled_optimizer_state`` is Adam's ``scaled_optimizer_state``, and
    ``no_bias`` picks ``AdamNoBias`` / ``LambNoBias`` (adam.hpp).

    The learning rate and the weight decay are non-const (``(value, False)``) so that
    lr schedules and eval mode (lr 0, decay 0) can change them through
    ``updateOptimizerFromHost``; the other hyper-parameters are const.
    """
    kind = cfg.type
    names = dict(device_names or {})
    wd_mode_name = (cfg.weight_decay_mode or "none").lower()
    if wd_mode_name not in ("none", "decay", "l2_regularization"):
        raise OptionError(
            f"weight_decay_mode {cfg.weight_decay_mode!r} is not one of "
            "'none', 'decay', 'l2_regularization'"
        )
    values: dict[str, tuple[float, bool]] = {
        "defaultLearningRate": (float(cfg.lr), False),
        "defaultWeightDecay": (float(cfg.weight_decay), False),
        "lossScaling": (float(cfg.loss_scaling), True),
    }

    clip: list[Any] = []
    if cfg.clip_norm:
        clipped = [names.get(p.name, p.name) for p in cfg.params if p.clip]
        if not cfg.params or len(clipped) == len(cfg.params):
            clip = [popart.ClipNormSettings.clipAllWeights(float(cfg.clip_norm))]
        elif clipped:
            clip = [popart.ClipNormSettings.clipWeights(clipped, float(cfg.clip_norm))]

    def decay_mode(default: str) -> Any:
        mode = default if wd_mode_name == "none" else wd_mode_name
        if mode == "decay":
            return popart.WeightDecayMode.Decay
        return popart.WeightDecayMode.L2Regularization

    opt: Any
    if kind in ("sgd", "momentum"):
        if wd_mode_name == "decay":
            raise NotSupportedError(
                f"decoupled weight decay with {kind} has no PopART SGD equivalent"
            )
        # Paddle's sgd and momentum kernels have neither dampening nor velocity scaling;
        # PopART's dampening scales the gradient even without momentum (its SGD0
        # update is w -= lr * (1 - dm) * (g + wd * w)), so it is set in both cases.
        values["defaultDampening"] = (0.0, True)
        values["defaultVelocityScaling"] = (1.0, True)
        # PopART's SGD adds the decay to the gradient, as Paddle's L2 regularizer does.
        if kind == "momentum" and cfg.momentum:
            values["defaultMomentum"] = (float(cfg.momentum), True)
            # Separate keeps Paddle's velocity as it is in Accl1___<w>.  The default,
            # Combined, stores in Accl___<w> the next step's precomputed
            # "v * mm / rf + wd * vs * w" (PopART's sgd.hpp), which is not Paddle's
            # velocity: weights_to_host and a resumed checkpoint would be wrong.
            opt = popart.SGD(
                values,
                clip,
                accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate,
                accl1Type=_accl_type(popart, cfg.accl1_type, popart.DataType.UNDEFINED),
            )
        else:
            opt = popart.SGD(values, clip)
    elif kind in ("adam", "adamw", "adamax", "lamb"):
        values["defaultBeta1"] = (float(cfg.beta1), True)
        values["defaultBeta2"] = (float(cfg.beta2), True)
        values["defaultEps"] = (float(cfg.epsilon), True)
        if kind == "lamb":
            # Paddle's lamb kernel does not bound the weight norm of its trust ratio;
            # PopART's Lamb bounds it by defaultMaxWeightNorm, 10 when unset
            # (adam.hpp getUnsetMaxWeightNorm; "maxWeightNorm" is its deprecated key
            # in willow/src/adam.cpp).
            bound = _NO_WEIGHT_NORM_BOUND if max_weight_norm is None else max_weight_norm
            values["defaultMaxWeightNorm"] = (float(bound), True)
        mode = {
            "adam": popart.AdamMode.AdamNoBias if no_bias else popart.AdamMode.Adam,
            "adamw": popart.AdamMode.AdamNoBias if no_bias else popart.AdamMode.Adam,
            # AdaMax has no bias-free variant in PopART (AdamMode, adam.hpp).
            "adamax": popart.AdamMode.AdaMax,
            "lamb": popart.AdamMode.LambNoBias if no_bias else popart.AdamMode.Lamb,
        }[kind]
        opt = popart.Adam(
            values,
            mode=mode,
            # adam/adamax: Paddle adds the decay to the gradient; adamw/lamb: decoupled.
            weight_decay_mode=decay_mode(
                "decay" if kind in ("adamw", "lamb") else "l2_regularization"
            ),
            accl1_type=_accl_type(popart, cfg.accl1_type, popart.DataType.FLOAT),
            accl2_type=_accl_type(popart, cfg.accl2_type, popart.DataType.FLOAT),
            clip_norm_settings=clip,
            scaled_optimizer_state=bool(scaled_optimizer_state),
        )
    elif kind in ("adagrad", "rmsprop", "centered_rmsprop", "adadelta"):
        mode = {
            "adagrad": popart.AdaptiveMode.AdaGrad,
            "adadelta": popart.AdaptiveMode.AdaDelta,
            "rmsprop": popart.AdaptiveMode.RMSProp,
            "centered_rmsprop": popart.AdaptiveMode.CenteredRMSProp,
        }[kind]
        values["defaultEps"] = (float(cfg.epsilon), True)
        if kind != "adagrad":
            values["defaultAlpha"] = (float(cfg.rho), True)
        if kind in ("rmsprop", "centered_rmsprop"):
            values["defaultMomentum"] = (float(cfg.momentum), True)
        if clip:
            raise NotSupportedError(
                f"global-norm gradient clipping with {kind} has no PopART equivalent "
                "(PopART clips only SGD and Adam-family optimizers)"
            )
        opt = popart.Adaptive(
            values,
            mode=mode,
            weight_decay_mode=decay_mode("l2_regularization"),
            accl1_type=_accl_type(popart, cfg.accl1_type, popart.DataType.FLOAT),
            accl2_type=_accl_type(popart, cfg.accl2_type, popart.DataType.FLOAT),
            accl3_type=_accl_type(popart, cfg.accl3_type, popart.DataType.UNDEFINED),
            # Paddle's rmsprop adds eps inside the square root and applies lr to the
            # momentum term: PopART's "TF variant" of RMSProp.
            rmsprop_tf_variant=kind in ("rmsprop", "centered_rmsprop"),
        )
    else:
        raise NotSupportedError(
            f"optimizer type {kind!r} has no PopART equivalent (supported: sgd, momentum, "
            "adam, adamw, adamax, lamb, adagrad, adadelta, rmsprop, centered_rmsprop)"
        )
    decays = {names.get(slot.name, slot.name): float(slot.weight_decay) for slot in cfg.params}
    wanted = specific_decay_weights(cfg, names) if specific is None else specific
    for weight in wanted:
        decay = decays.get(weight, float(cfg.weight_decay))
        opt.insertSpecific(weight, {"weightDecay": (decay, False)})
    return opt


# --------------------------------------------------------------------------- session


def with_strategy(cfg: OptimizerConfig, config: SessionConfig) -> OptimizerConfig:
    """The IpuStrategy's weight_decay_mode and accl*_type override the program's."""
    changes: dict[str, Any] = {}
    mode = config.option("weight_decay_mode")
    if mode:
        changes["weight_decay_mode"] = str(mode)
    for field in ("accl1_type", "accl2_type", "accl3_type"):
        if config.changed(field):
            changes[field] = str(config.option(field))
    return dataclasses.replace(cfg, **changes) if changes else cfg


def session_optimizer(
    cfg: OptimizerConfig,
    popart: Any,
    config: SessionConfig,
    weights: Mapping[str, str],
    specific: Sequence[str],
) -> Any:
    """The PopART optimizer of a session for ``cfg`` (already :func:`with_strategy`),
    with the strategy's Lamb bound, scaled optimizer state and no-bias choice.
    ``weights`` maps ONNX (device) names to Paddle names; ``specific`` is the list the
    session was built with (:func:`specific_decay_weights`)."""
    device_names = {paddle: onnx for onnx, paddle in weights.items()}
    # Paddle's lamb kernel has no bound: only a max_weight_norm set explicitly sets one.
    bound = config.option("max_weight_norm") if config.changed("max_weight_norm") else None
    return to_popart_optimizer(
        cfg,
        popart,
        device_names,
        specific,
        max_weight_norm=None if bound is None else float(bound),
        scaled_optimizer_state=bool(config.option("scaled_optimizer_state")),
        no_bias=bool(config.option("use_no_bias_optimizer")),
    )
