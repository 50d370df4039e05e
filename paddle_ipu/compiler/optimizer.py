"""Optimizer extraction: fold the optimizer ops of a PIR training program into one
backend-neutral :class:`OptimizerConfig`.

After ``optimizer.minimize(loss)`` a Paddle 3.x PIR program holds, after the backward
ops, one in-place update op per trainable parameter (``pd_op.sgd_``, ``momentum_``,
``adam_``, ``adamw_``, ``adamax_``, ``lamb_``, ``adagrad_``, ``adadelta_``,
``rmsprop_``), plus the ops that feed them:

* the learning rate: a persistable ``pd_op.data`` named ``learning_rate_N`` for a
  constant lr, or a ``builtin.parameter`` of that name when an ``LRScheduler`` is used
  (the program then carries ``lr_scheduler`` / ``lr_name`` Python attributes and
  ``Executor.run`` writes the scheduler's value into the variable before each run);
* L2/L1 regularisation (``weight_decay=`` on SGD/Adam/Adamax/Adagrad/Adadelta/RMSProp,
  or a ``ParamAttr`` regularizer): ``add_n([grad, scale(param, coeff)])``, with a
  ``sign(param)`` in front for L1.  Momentum instead folds L2 into its op attributes
  (``regularization_method="l2_decay"``, ``regularization_coeff``);
* ``ClipGradByGlobalNorm``: ``squared_l2_norm`` of every clipped gradient, summed,
  ``sqrt``, ``clip_norm / maximum(norm, clip_norm)``, and a ``multiply`` per gradient;
  ``ClipGradByNorm`` becomes one ``clip_by_norm`` op per gradient;
* optimizer state: persistable ``pd_op.data`` ops named ``<param><suffix>_<N>`` (see
  :func:`state_names`); Adamax also appends a ``scale_`` op updating ``beta1_pow_acc``.

:func:`extract_optimizer` walks those patterns back from each update op to the raw
gradient (the output of the backward pass), so the gradient that a backend reduces over
micro-batches and replicas is the raw one, and decay and clipping are applied once,
after the reduction, as on the IPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from paddle_ipu._util import dtypes
from paddle_ipu.errors import CompileError, NotSupportedError

#: Optimizer types, as :attr:`OptimizerConfig.type` spells them.
OPTIMIZER_TYPES = (
    "sgd",
    "momentum",
    "adam",
    "adamw",
    "adamax",
    "lamb",
    "adagrad",
    "adadelta",
    "rmsprop",
    "centered_rmsprop",
)

#: PIR op name -> optimizer type (rmsprop_ becomes centered_rmsprop when centered).
_OP_TYPES = {
    "pd_op.sgd_": "sgd",
    "pd_op.sgd": "sgd",
    "pd_op.momentum_": "momentum",
    "pd_op.momentum": "momentum",
    "pd_op.adam_": "adam",
    "pd_op.adam": "adam",
    "pd_op.adamw_": "adamw",
    "pd_op.adamw": "adamw",
    "pd_op.adamax_": "adamax",
    "pd_op.adamax": "adamax",
    "pd_op.lamb_": "lamb",
    "pd_op.lamb": "lamb",
    "pd_op.adagrad_": "adagrad",
    "pd_op.adagrad": "adagrad",
    "pd_op.adadelta_": "adadelta",
    "pd_op.adadelta": "adadelta",
    "pd_op.rmsprop_": "rmsprop",
    "pd_op.rmsprop": "rmsprop",
}

#: Optimizer ops this module recognises but the IPU path cannot run.
_REJECTED_OPS = {
    "pd_op.merged_adam_": "merged (multi-tensor) Adam",
    "pd_op.merged_momentum_": "merged (multi-tensor) Momentum",
    "pd_op.lars_momentum_": "LarsMomentum",
    "pd_op.dgc_momentum": "DGCMomentum",
    "pd_op.ftrl": "Ftrl",
    "pd_op.asgd_": "ASGD",
    "pd_op.nadam_": "NAdam",
    "pd_op.radam_": "RAdam",
    "pd_op.rprop_": "Rprop",
    "pd_op.decayed_adagrad": "DecayedAdagrad",
}


#: The prefixes PopART gives the optimizer state (and gradient accumulators) of a
#: weight ``w``: ``Accl1___w`` ... (willow/include/popart/tensornames.hpp), with the
#: ``accl*_type`` option that sets each state's dtype (Paddle 2.x's IpuStrategy).
STATE_PREFIXES: dict[str, str] = {
    "Accl___": "accl1_type",
    "Accl1___": "accl1_type",
    "Accl2___": "accl2_type",
    "Accl3___": "accl3_type",
    "Accum___": "",
    "Step___": "",
}


@dataclass(frozen=True)
class StateName:
    """One optimizer-state tensor of one parameter.

    Attributes:
        role: the Paddle input name of the state on the update op (``moment1``,
            ``beta1_pow``, ``velocity`` ...); the key of :attr:`ParamSlot.state`.
        suffix: the Paddle 3.x variable-name suffix without its counter: the variable
            is ``<param><suffix>_<N>`` (``fc_0.w_0`` + ``_moment1`` + ``_0``).
        device_prefix: the PopART tensor-name prefix of the matching device tensor
            (``Accl1___`` + ``<weight>``), or ``""`` when PopART has no such tensor
            (``beta2_pow``: PopART derives it from the step count).
    """

    role: str
    suffix: str
    device_prefix: str


_STATE_TABLE: dict[str, tuple[StateName, ...]] = {
    "sgd": (),
    # PopART's SGD with SGDAccumulatorAndMomentum.Separate (what the popart backend
    # builds) keeps the velocity in Accl1___; Accl___ is the Combined form's tensor,
    # which holds a precomputed mix of velocity and weight instead.
    "momentum": (StateName("velocity", "_velocity", "Accl1___"),),
    "adam": (
        StateName("moment1", "_moment1", "Accl1___"),
        StateName("moment2", "_moment2", "Accl2___"),
        StateName("beta1_pow", "_beta1_pow_acc", "Step___"),
        StateName("beta2_pow", "_beta2_pow_acc", ""),
    ),
    "adamax": (
        StateName("moment", "_moment", "Accl1___"),
        StateName("inf_norm", "_inf_norm", "Accl2___"),
        StateName("beta1_pow", "_beta1_pow_acc", "Step___"),
    ),
    "adagrad": (StateName("moment", "_moment", "Accl1___"),),
    "adadelta": (
        StateName("avg_squared_grad", "__avg_squared_grad", "Accl1___"),
        StateName("avg_squared_update", "__avg_squared_update", "Accl2___"),
    ),
    "rmsprop": (
        StateName("mean_square", "_mean_square", "Accl1___"),
        StateName("moment", "_momentum", "Accl3___"),
    ),
    "centered_rmsprop": (
        StateName("mean_square", "_mean_square", "Accl1___"),
        StateName("mean_grad", "_mean_grad", "Accl2___"),
        StateName("moment", "_momentum", "Accl3___"),
    ),
}
_STATE_TABLE["adamw"] = _STATE_TABLE["adam"]
_STATE_TABLE["lamb"] = _STATE_TABLE["adam"]


def state_names(opt_type: str) -> tuple[StateName, ...]:
    """The optimizer-state tensors one parameter has under ``opt_type``.

    Paddle 3.3 names them ``<param><suffix>_<N>``; ``N`` is a process-wide counter per
    name (``_0`` for the first optimizer built for that parameter, ``_1`` for the next
    ...).  Non-centered RMSProp also creates ``<param>_mean_grad_<N>`` but never reads it.
    """
    try:
        return _STATE_TABLE[opt_type]
    except KeyError:
        raise NotSupportedError(
            f"unknown optimizer type {opt_type!r}; expected one of {', '.join(OPTIMIZER_TYPES)}"
        ) from None


def split_state_name(param: str, var_name: str, opt_type: str) -> tuple[StateName, int] | None:
    """Parse ``var_name`` as a state variable of ``param``: its entry and counter ``N``.

    ``split_state_name("w", "w_moment1_3", "adam")`` is ``(StateName("moment1", ...), 3)``;
    a name that is not a state of ``param`` under ``opt_type`` gives ``None``.
    """
    if not var_name.startswith(param):
        return None
    rest = var_name[len(param) :]
    for entry in state_names(opt_type):
        match = re.fullmatch(re.escape(entry.suffix) + r"_(\d+)", rest)
        if match:
            return entry, int(match.group(1))
    return None


@dataclass(frozen=True)
class ParamSlot:
    """One trainable parameter and what its update needs.

    Attributes:
        name: the parameter's Paddle name (also its ONNX initializer name).
        grad: the raw gradient ``pir.Value`` in the source program (before clipping
            and regularisation).  Not part of equality, hashing or ``repr``.
        state: role -> Paddle variable name of each optimizer-state tensor, e.g.
            ``{"moment1": "fc_0.w_0_moment1_0", ...}``; roles as in :func:`state_names`.
        weight_decay: this parameter's decay coefficient, read per parameter because
            Paddle allows it to differ (ParamAttr regularizers, AdamW's
            ``apply_decay_param_fun``, Lamb's ``exclude_from_weight_decay_fn``).  Its
            meaning follows :attr:`OptimizerConfig.weight_decay_mode`.
        clip: whether the gradient takes part in global-norm clipping
            (``need_clip`` of the parameter).
        shape: the parameter's shape.
        dtype: the parameter's dtype name (``"float32"``).
    """

    name: str
    grad: Any = field(default=None, compare=False, hash=False, repr=False)
    state: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    weight_decay: float = 0.0
    clip: bool = True
    shape: tuple[int, ...] = ()
    dtype: str = "float32"


@dataclass(frozen=True)
class OptimizerConfig:
    """Everything needed to run a Paddle optimizer on a device, without Paddle objects
    (except :attr:`ParamSlot.grad`).

    Update rules per type (g: the gradient after reduction, clipping and, in
    ``l2_regularization`` mode, ``g + wd * w``):

    ======================  ===================================================
    ``sgd``                 ``w -= lr * g``
    ``momentum``            ``v = momentum * v + g; w -= lr * v``
    ``adam``                Adam, Paddle's bias correction (see host_optim)
    ``adamw``               ``w *= 1 - lr * wd`` then Adam (decoupled decay)
    ``adamax``              AdaMax
    ``lamb``                Lamb; ``wd`` enters the trust-ratio numerator
    ``adagrad``             ``m += g*g; w -= lr * g / (sqrt(m) + epsilon)``
    ``adadelta``            AdaDelta with ``rho``, ``epsilon`` (lr multiplies the step)
    ``rmsprop``             ``ms = rho*ms + (1-rho) g^2``; momentum on ``lr*g/sqrt(ms+eps)``
    ``centered_rmsprop``    as rmsprop, denominator ``sqrt(ms - mg^2 + eps)``
    ======================  ===================================================

    Attributes:
        type: one of :data:`OPTIMIZER_TYPES`.
        params: one :class:`ParamSlot` per updated parameter, in program order.
        lr_name: the Paddle variable holding the learning rate (``learning_rate_0``).
        lr: the learning rate in the scope when the program was compiled (0.0 when the
            variable was not initialised yet).  The executor re-reads ``lr_name`` each
            run when :attr:`lr_scheduler` is set.
        lr_scheduler: the program carries an ``LRScheduler``: the lr changes between
            runs and must be pushed to the device before each run.
        loss_name: the name the caller gave the loss (compile-time fetch name).
        weight_decay: the common decay coefficient (the value most parameters carry;
            per-parameter values are in :attr:`ParamSlot.weight_decay`).
        weight_decay_mode: ``"none"``, ``"l2_regularization"`` (added to the gradient
            before the update: Paddle's ``weight_decay=`` / L2Decay; PopART
            ``WeightDecayMode.L2Regularization``) or ``"decay"`` (decoupled: AdamW and
            Lamb; PopART ``WeightDecayMode.Decay``).
        momentum: Momentum's ``mu``, RMSProp's ``momentum``; 0 otherwise.
        beta1, beta2: Adam/AdamW/Adamax/Lamb moment decays.
        epsilon: the optimizer's epsilon.
        rho: Adadelta's ``rho``, RMSProp's ``rho`` (op attribute ``decay``).
        centered: RMSProp centered (also encoded in :attr:`type`).
        lamb_always_adapt: Lamb applies the trust ratio even with zero decay.
        clip_norm: ``ClipGradByGlobalNorm``'s ``clip_norm``, or ``None``.
        loss_scaling: static loss scaling (from the IpuStrategy; 1.0 = off).  The
            program does not carry it; the compiler fills it in.
        accl1_type, accl2_type, accl3_type: ``"FLOAT"`` or ``"FLOAT16"``: the dtype of
            the Accl1/Accl2/Accl3 states (from the state variables; the IpuStrategy
            options of the same names may override).
        no_bias: Adam, AdamW and Lamb without bias correction (PopART's AdamNoBias and
            LambNoBias; the IpuStrategy's ``use_no_bias_optimizer``), by PopART's
            documented rule (willow/include/popart/adam.hpp).
        max_weight_norm: with :attr:`no_bias`, Lamb's bound of the weight norm in the
            trust ratio (``phi(r1) = min(r1, max_weight_norm)``; the IpuStrategy's
            option of that name).
    """

    type: str
    params: tuple[ParamSlot, ...] = ()
    lr_name: str = ""
    lr: float = 0.0
    lr_scheduler: bool = False
    loss_name: str = ""
    weight_decay: float = 0.0
    weight_decay_mode: str = "none"
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    rho: float = 0.95
    centered: bool = False
    lamb_always_adapt: bool = False
    clip_norm: float | None = None
    loss_scaling: float = 1.0
    accl1_type: str = "FLOAT"
    accl2_type: str = "FLOAT"
    accl3_type: str = "FLOAT"
    no_bias: bool = False
    max_weight_norm: float = 65504.0

    @property
    def param_names(self) -> list[str]:
        return [slot.name for slot in self.params]

    def param(self, name: str) -> ParamSlot:
        for slot in self.params:
            if slot.name == name:
                return slot
        raise KeyError(name)

    def state_var_names(self) -> list[str]:
        """Every optimizer-state variable (Paddle names), parameter by parameter."""
        return [var for slot in self.params for var in slot.state.values()]

    def all_names(self, weights: Mapping[str, str]) -> dict[str, str]:
        """Device name -> Paddle name of every tensor a training session keeps in sync
        with the Paddle scope (the seed's GetOptPrePostfix table): the weights
        (``weights``: ONNX name -> Paddle name), their optimizer state under PopART's
        prefixes, and the state PopART has no tensor for (``beta2_pow``) under its
        Paddle name.  The one name mapping the executor and the backends share."""
        onnx_of = {paddle: onnx for onnx, paddle in weights.items()}
        names = dict(self.device_names(onnx_of))
        for onnx_name, paddle_name in weights.items():
            names.setdefault(onnx_name, paddle_name)
        known = set(names.values())
        for var in self.state_var_names():
            if var not in known:
                names[var] = var
        return names

    def device_names(self, onnx_names: Mapping[str, str] | None = None) -> dict[str, str]:
        """Device (PopART) tensor name -> Paddle variable name, weights included.

        ``onnx_names`` maps a Paddle parameter name to its ONNX/device name when the
        two differ.  States without a device counterpart (``beta2_pow``) are left out.
        """
        table: dict[str, str] = {}
        for slot in self.params:
            dev = onnx_names.get(slot.name, slot.name) if onnx_names else slot.name
            table[dev] = slot.name
            for entry in state_names(self.type):
                var = slot.state.get(entry.role)
                if var is not None and entry.device_prefix:
                    table[entry.device_prefix + dev] = var
        return table


# --------------------------------------------------------------------------- reading PIR


def _defining_op(value: Any) -> Any | None:
    if value is None or not value.initialized():
        return None
    try:
        return value.get_defining_op()
    except Exception:
        return None


def _var_name(value: Any) -> str | None:
    """The name of a value defined by a data / parameter op, else None."""
    op = _defining_op(value)
    if op is None:
        return None
    name = op.name()
    attrs = op.attrs()
    if name == "pd_op.data":
        return str(attrs.get("name"))
    if name == "builtin.parameter":
        return str(attrs.get("parameter_name"))
    return None


def _const_value(value: Any) -> float | None:
    """The scalar of a ``pd_op.full`` / ``full_`` value, else None."""
    op = _defining_op(value)
    if op is None or op.name() not in ("pd_op.full", "pd_op.full_"):
        return None
    return float(op.attrs()["value"])


def _inputs(op: Any) -> dict[str, Any]:
    names = op.get_input_names()
    return {name: op.operand_source(i) for i, name in enumerate(names)}


def _scale_coeff(op: Any) -> float | None:
    """The multiplier of a ``pd_op.scale`` op (attribute or ``full`` input), bias 0."""
    attrs = op.attrs()
    if float(attrs.get("bias", 0.0)) != 0.0:
        return None
    if op.num_operands() > 1:
        return _const_value(op.operand_source(1))
    return float(attrs.get("scale", 1.0))


@dataclass
class _GradTrace:
    raw: Any
    l2: float | None = None
    clip_norm: float | None = None


def _trace_grad(grad: Any, param: Any, param_name: str) -> _GradTrace:
    """Walk from an update op's gradient operand back to the backward pass's output,
    collecting regularisation and clipping on the way."""
    trace = _GradTrace(raw=grad)
    value = grad
    for _ in range(8):
        op = _defining_op(value)
        if op is None:
            break
        name = op.name()
        if name == "pd_op.add_n":
            combine = _defining_op(op.operand_source(0))
            if (
                combine is None
                or combine.name() != "builtin.combine"
                or combine.num_operands() != 2
            ):
                break
            first, second = combine.operand_source(0), combine.operand_source(1)
            reg = _defining_op(second)
            if reg is None or reg.name() != "pd_op.scale":
                break
            src = _defining_op(reg.operand_source(0))
            if src is not None and src.name() == "pd_op.sign":
                raise NotSupportedError(
                    f"L1 weight decay (paddle.regularizer.L1Decay) on {param_name!r} is not "
                    "supported on the IPU; use L2Decay or a float weight_decay"
                )
            if reg.operand_source(0).id != param.id:
                break
            coeff = _scale_coeff(reg)
            if coeff is None:
                raise NotSupportedError(
                    f"the regularization of {param_name!r} has a coefficient that is not a "
                    "constant; only constant L2 decay is supported"
                )
            trace.l2 = coeff
            value = first
            continue
        if name == "pd_op.multiply":
            norm = _global_norm_clip(op.operand_source(1))
            if norm is None:
                break
            trace.clip_norm = norm
            value = op.operand_source(0)
            continue
        if name in ("pd_op.clip_by_norm", "pd_op.clip_by_norm_"):
            raise NotSupportedError(
                f"per-tensor gradient clipping (ClipGradByNorm) on {param_name!r} is not "
                "supported on the IPU; use paddle.nn.ClipGradByGlobalNorm"
            )
        if name in ("pd_op.clip", "pd_op.clip_"):
            raise NotSupportedError(
                f"gradient clipping by value (ClipGradByValue) on {param_name!r} is not "
                "supported on the IPU; use paddle.nn.ClipGradByGlobalNorm"
            )
        if name == "pd_op.cast" and _same_dtype(op.result(0), param):
            # Paddle 2.x's cast_model_to_fp16 on a legacy training program: the
            # backward runs in float16 and its gradient is cast to the float32
            # parameter's dtype for the update.  That cast belongs to the backward
            # pass: its output is the gradient the update reads.
            break
        if name == "pd_op.cast":
            raise NotSupportedError(
                f"the gradient of {param_name!r} is cast before its update (mixed "
                "precision / multi_precision), which the IPU path does not support"
            )
        break
    trace.raw = value
    return trace


def _same_dtype(a: Any, b: Any) -> bool:
    try:
        return dtypes.name_of(a.dtype) == dtypes.name_of(b.dtype)
    except Exception:
        return False


def _global_norm_clip(factor: Any) -> float | None:
    """Match ``clip_norm / maximum(sqrt(sum ...), clip_norm)``; return ``clip_norm``."""
    div = _defining_op(factor)
    if div is None or div.name() != "pd_op.divide":
        return None
    clip = _const_value(div.operand_source(0))
    mx = _defining_op(div.operand_source(1))
    if clip is None or mx is None or mx.name() != "pd_op.maximum":
        return None
    sq = _defining_op(mx.operand_source(0))
    if sq is None or sq.name() != "pd_op.sqrt":
        return None
    return clip


def _accl_type(value: Any | None) -> str:
    if value is None:
        return "FLOAT"
    return "FLOAT16" if dtypes.name_of(value.dtype) in ("float16", "bfloat16") else "FLOAT"


def _check_attrs(op: Any, opt_type: str, param_name: str) -> None:
    attrs = op.attrs()
    if attrs.get("multi_precision"):
        raise NotSupportedError(
            f"multi_precision=True ({opt_type} on {param_name!r}) is not supported on the "
            "IPU; use IpuStrategy.set_precision_config(enable_fp16=True) instead"
        )
    if attrs.get("lazy_mode"):
        raise NotSupportedError(f"lazy_mode=True ({opt_type}) is not supported on the IPU")
    if attrs.get("amsgrad"):
        raise NotSupportedError(f"amsgrad=True ({opt_type}) is not supported on the IPU")
    if attrs.get("use_nesterov"):
        raise NotSupportedError(
            f"use_nesterov=True (Momentum on {param_name!r}) is not supported on the IPU"
        )
    if attrs.get("use_global_beta_pow"):
        raise NotSupportedError(f"use_global_beta_pow=True ({opt_type}) is not supported")
    method = attrs.get("regularization_method", "")
    if method not in ("", "l2_decay"):
        raise NotSupportedError(
            f"regularization_method={method!r} (Momentum on {param_name!r}) is not supported "
            "on the IPU; only L2 decay is"
        )
    if float(attrs.get("rescale_grad", 1.0)) != 1.0:
        raise NotSupportedError(
            f"rescale_grad={attrs['rescale_grad']} (Momentum) is not supported on the IPU; "
            "use the IpuStrategy loss_scaling option"
        )
    if float(attrs.get("lr_ratio", 1.0)) != 1.0:
        raise NotSupportedError(f"AdamW lr_ratio on {param_name!r} is not supported on the IPU")


def _scalar_input(inputs: Mapping[str, Any], key: str, attrs: Mapping[str, Any]) -> float:
    if key in attrs:
        return float(attrs[key])
    value = inputs.get(key)
    if value is not None and value.initialized():
        const = _const_value(value)
        if const is None:
            raise NotSupportedError(
                f"the optimizer's {key} is a tensor computed at run time; only constants "
                "are supported on the IPU"
            )
        return const
    raise CompileError(f"the optimizer op has no {key}")


def find_optimizer_ops(program: Any) -> list[Any]:
    """The update ops of ``program``'s global block, in program order."""
    found = []
    for op in program.global_block().ops:
        name = op.name()
        if name in _REJECTED_OPS:
            raise NotSupportedError(f"{_REJECTED_OPS[name]} ({name}) is not supported on the IPU")
        if name in _OP_TYPES:
            found.append(op)
    return found


def _scope_scalar(scope: Any, name: str) -> float:
    if scope is None or not name:
        return 0.0
    var = scope.find_var(name)
    if var is None:
        return 0.0
    try:
        import numpy as np

        arr = np.array(var.get_tensor())
    except Exception:
        return 0.0
    return float(arr.reshape(-1)[0]) if arr.size else 0.0


def _most_common(values: Iterable[float]) -> float:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    if not counts:
        return 0.0
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]


def extract_optimizer(
    program: Any,
    *,
    scope: Any = None,
    loss_name: str = "",
    loss_scaling: float = 1.0,
) -> OptimizerConfig:
    """Fold the optimizer of a PIR training program into an :class:`OptimizerConfig`.

    Args:
        program: a ``paddle.pir.Program`` after ``optimizer.minimize(loss)``.
        scope: where to read the current learning rate (default: the global scope).
        loss_name: recorded in the config as :attr:`OptimizerConfig.loss_name`.
        loss_scaling: recorded as :attr:`OptimizerConfig.loss_scaling`.

    Raises:
        CompileError: the program has no optimizer ops, or mixes optimizers.
        NotSupportedError: a setting the IPU cannot honour (Nesterov, L1 decay,
            lazy_mode, multi_precision, amsgrad, clip by value / by norm ...); the
            message names it.
    """
    if scope is None:
        import paddle

        scope = paddle.static.global_scope()
    ops = find_optimizer_ops(program)
    if not ops:
        raise CompileError(
            "the program has no optimizer ops: compiling for training needs "
            "optimizer.minimize(loss) on the program (or set is_training=False)"
        )
    kinds = {_OP_TYPES[op.name()] for op in ops}
    if len(kinds) > 1:
        raise CompileError(
            f"the program mixes optimizers ({', '.join(sorted(kinds))}); the IPU runs one"
        )
    kind = kinds.pop()
    first_attrs = ops[0].attrs()
    if kind == "rmsprop" and first_attrs.get("centered"):
        kind = "centered_rmsprop"

    slots: list[ParamSlot] = []
    lr_names: set[str] = set()
    clip_norms: set[float] = set()
    hyper: dict[str, set[float]] = {}
    accl_values: dict[str, Any] = {}
    l2_any = False

    for op in ops:
        inputs = _inputs(op)
        attrs = op.attrs()
        param = inputs["param"]
        param_name = _var_name(param)
        if param_name is None:
            raise CompileError(f"{op.name()} updates a value that is not a parameter")
        _check_attrs(op, kind, param_name)
        if kind in ("rmsprop", "centered_rmsprop") and bool(attrs.get("centered")) != (
            kind == "centered_rmsprop"
        ):
            raise CompileError("the program mixes centered and non-centered RMSProp")
        lr_name = _var_name(inputs["learning_rate"])
        if lr_name is None:
            raise NotSupportedError(
                f"the learning rate of {param_name!r} is computed in the program; it must be "
                "a learning-rate variable (a float or an LRScheduler)"
            )
        lr_names.add(lr_name)

        trace = _trace_grad(inputs["grad"], param, param_name)
        if trace.clip_norm is not None:
            clip_norms.add(trace.clip_norm)

        def note(key: str, value: float) -> None:
            hyper.setdefault(key, set()).add(value)

        decay = 0.0
        if kind == "momentum":
            note("momentum", float(attrs["mu"]))
            if attrs.get("regularization_method") == "l2_decay":
                decay = float(attrs.get("regularization_coeff", 0.0))
        elif kind in ("adam", "adamw"):
            for key in ("beta1", "beta2", "epsilon"):
                note(key, _scalar_input(inputs, key, attrs))
            if kind == "adamw":
                decay = float(attrs["coeff"]) if attrs.get("with_decay", True) else 0.0
        elif kind == "adamax":
            for key in ("beta1", "beta2", "epsilon"):
                note(key, float(attrs[key]))
        elif kind == "lamb":
            for key in ("beta1", "beta2", "epsilon"):
                note(key, float(attrs[key]))
            note("always_adapt", float(bool(attrs.get("always_adapt", False))))
            decay = float(attrs["weight_decay"])
        elif kind == "adagrad":
            note("epsilon", float(attrs["epsilon"]))
        elif kind == "adadelta":
            note("rho", float(attrs["rho"]))
            note("epsilon", float(attrs["epsilon"]))
        elif kind in ("rmsprop", "centered_rmsprop"):
            note("rho", float(attrs["decay"]))
            note("epsilon", float(attrs["epsilon"]))
            note("momentum", float(attrs["momentum"]))
        if trace.l2 is not None:
            if kind in ("adamw", "lamb"):
                raise NotSupportedError(
                    f"a regularizer on {param_name!r} combined with {kind}'s decoupled weight "
                    "decay is not supported on the IPU"
                )
            decay = trace.l2
        if kind not in ("adamw", "lamb") and decay:
            l2_any = True

        state: dict[str, str] = {}
        for entry in state_names(kind):
            value = inputs.get(entry.role)
            if value is None or not value.initialized():
                continue
            var = _var_name(value)
            if var is None:
                raise CompileError(f"the {entry.role} state of {param_name!r} is not a variable")
            state[entry.role] = var
            prefix = entry.device_prefix
            if prefix.startswith("Accl"):
                key = {"Accl___": "accl1", "Accl1___": "accl1"}.get(prefix, prefix[:5].lower())
                accl_values.setdefault(key, value)

        slots.append(
            ParamSlot(
                name=param_name,
                grad=trace.raw,
                state=state,
                weight_decay=decay,
                clip=trace.clip_norm is not None,
                shape=tuple(int(d) for d in param.shape),
                dtype=dtypes.name_of(param.dtype),
            )
        )

    if len(lr_names) > 1:
        raise NotSupportedError(
            f"parameters use different learning-rate variables ({', '.join(sorted(lr_names))})"
        )
    if len(clip_norms) > 1:
        raise NotSupportedError("more than one global-norm clip in one program")
    for key, values in hyper.items():
        if len(values) > 1:
            raise NotSupportedError(
                f"parameters use different {key} values ({sorted(values)}); the IPU "
                "optimizer takes one"
            )
    lr_name = lr_names.pop()

    def get(key: str, default: float) -> float:
        values = hyper.get(key)
        return next(iter(values)) if values else default

    if kind in ("adamw", "lamb"):
        mode = "decay" if any(s.weight_decay for s in slots) else "none"
    else:
        mode = "l2_regularization" if l2_any else "none"
    lr_sched = getattr(program, "lr_scheduler", None) is not None and (
        getattr(program, "lr_name", lr_name) == lr_name
    )
    defaults = {"epsilon": 1e-6 if kind in ("lamb", "adagrad", "adadelta") else 1e-8}
    return OptimizerConfig(
        type=kind,
        params=tuple(slots),
        lr_name=lr_name,
        lr=_scope_scalar(scope, lr_name),
        lr_scheduler=lr_sched,
        loss_name=loss_name,
        weight_decay=_most_common(s.weight_decay for s in slots),
        weight_decay_mode=mode,
        momentum=get("momentum", 0.0),
        beta1=get("beta1", 0.9),
        beta2=get("beta2", 0.999),
        epsilon=get("epsilon", defaults["epsilon"]),
        rho=get("rho", 0.95),
        centered=kind == "centered_rmsprop",
        lamb_always_adapt=bool(get("always_adapt", 0.0)),
        clip_norm=clip_norms.pop() if clip_norms else None,
        loss_scaling=loss_scaling,
        accl1_type=_accl_type(accl_values.get("accl1")),
        accl2_type=_accl_type(accl_values.get("accl2")),
        accl3_type=_accl_type(accl_values.get("accl3")),
    )
