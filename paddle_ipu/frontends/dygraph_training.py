"""What training a traced Layer needs (used by :mod:`paddle_ipu.frontends.dygraph`):
its loss, found the way PopTorch finds it (:func:`find_loss`; the rule is in the
dygraph module's docstring), and a static-graph optimizer of the dygraph optimizer's
kind and settings (:func:`static_optimizer`)."""

from __future__ import annotations

from typing import Any

from paddle_ipu._internals import paddle_api, paddle_jit
from paddle_ipu.compiler.pir_values import dtype_name, is_dense, shape_of
from paddle_ipu.errors import CompileError, NotSupportedError

_FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16", "uint16"})
# Operators that only group values (a list operand), which a gradient passes through.
_TRANSPARENT_OPS = frozenset({"builtin.combine", "builtin.split", "builtin.slice"})


def static_optimizer(optimizer: Any) -> Any:
    """A static-graph optimizer of the same kind and settings as ``optimizer``."""
    import paddle

    opt = paddle.optimizer

    def attr(name: str) -> Any:
        return paddle_api.optimizer_attr(optimizer, name)

    common = {
        "learning_rate": attr("learning_rate"),
        "grad_clip": paddle_api.optimizer_attr(optimizer, "grad_clip", None),
    }
    kind = type(optimizer)
    decay = {"weight_decay": optimizer.regularization, **common}

    def adam_like() -> dict[str, Any]:
        return {
            "beta1": float(attr("beta1")),
            "beta2": float(attr("beta2")),
            "epsilon": float(attr("epsilon")),
        }

    if kind is opt.SGD:
        return opt.SGD(**decay)
    if kind is opt.Momentum:
        return opt.Momentum(
            momentum=float(attr("momentum")), use_nesterov=bool(attr("use_nesterov")), **decay
        )
    if kind is opt.Adam:
        return opt.Adam(**adam_like(), **decay)
    if kind is opt.AdamW:
        return opt.AdamW(weight_decay=float(attr("weight_decay")), **adam_like(), **common)
    if kind is opt.Adamax:
        return opt.Adamax(**adam_like(), **decay)
    if kind is opt.Lamb:
        return opt.Lamb(lamb_weight_decay=float(attr("lamb_weight_decay")), **adam_like(), **common)
    if kind is opt.Adagrad:
        return opt.Adagrad(
            epsilon=float(attr("epsilon")),
            initial_accumulator_value=float(optimizer.initial_accumulator_value),
            **decay,
        )
    if kind is opt.Adadelta:
        return opt.Adadelta(epsilon=float(attr("epsilon")), rho=float(attr("rho")), **decay)
    if kind is opt.RMSProp:
        return opt.RMSProp(
            rho=float(attr("rho")),
            epsilon=float(attr("epsilon")),
            momentum=float(attr("momentum")),
            centered=bool(attr("centered")),
            **decay,
        )
    raise NotSupportedError(
        f"training_model: {kind.__name__} is not supported; use SGD, Momentum, Adam, AdamW, "
        "Adamax, Lamb, Adagrad, Adadelta or RMSProp"
    )


# ----------------------------------------------------------------------------------
# finding the loss
# ----------------------------------------------------------------------------------


def _users(value: Any) -> list[Any]:
    try:
        return list(value.all_used_ops())
    except Exception:
        return []


def _operands(op: Any) -> list[Any]:
    return [v for v in op.operands_source() if v is not None and v.initialized()]


def _feeds_identity_loss(value: Any) -> bool:
    """Whether ``value`` is read, directly or through other operators, by an
    ``identity_loss`` (PopTorch: a marked loss used by another is part of it)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        for op in _users(v):
            if op.name() == "pd_op.identity_loss":
                return True
            if op.id() in seen:
                continue
            seen.add(op.id())
            stack.extend(op.results())
    return False


def _reaches_parameter(value: Any) -> bool:
    """Whether a gradient flows from ``value`` back to a trainable parameter: through
    floating-point values and operators that have a backward rule."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v.id in seen or not is_dense_float(v):
            continue
        seen.add(v.id)
        op = v.get_defining_op()
        if op is None:
            continue
        name = op.name()
        if name == "builtin.parameter":
            if not v.stop_gradient:
                return True
            continue
        if name not in _TRANSPARENT_OPS and not paddle_jit.op_has_gradient(op):
            continue
        stack.extend(_operands(op))
    return False


def is_dense_float(value: Any) -> bool:
    if not is_dense(value):
        # builtin.combine results (lists) carry the gradient of their members.
        op = value.get_defining_op()
        return op is not None and op.name() in _TRANSPARENT_OPS
    return dtype_name(value) in _FLOAT_DTYPES


def _ancestors(value: Any) -> set[int]:
    """Ids of every value ``value`` is computed from."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        op = v.get_defining_op()
        if op is None:
            continue
        for src in _operands(op):
            if src.id not in seen:
                seen.add(src.id)
                stack.append(src)
    return seen


def one_element(value: Any) -> bool:
    shape = shape_of(value)
    return is_dense(value) and all(d == 1 for d in shape)


def _describe_output(index: int, value: Any) -> str:
    op = value.get_defining_op()
    kind = op.name() if op is not None else "?"
    return f"output {index} ({kind}, {dtype_name(value)}{list(shape_of(value))})"


def take_identity_losses(program: Any, outputs: list[Any]) -> list[Any]:
    """Replace every ``identity_loss`` with what it computes (its reduction: it only
    marks the loss) and return the values of the final ones -- the marked losses no
    other marked loss reads (PopTorch's rule).  ``outputs`` follows the replacement."""
    import paddle

    block = program.global_block()
    marks = [op for op in block.ops if op.name() == "pd_op.identity_loss"]
    finals = {op.id() for op in marks if not _feeds_identity_loss(op.result(0))}
    losses = []
    for op in marks:
        source = op.operand_source(0)
        reduction = int(op.attrs().get("reduction", 1))
        if reduction not in (0, 1, 2):
            raise CompileError(
                f"identity_loss: reduction must be 0 (sum), 1 (mean) or 2 (none), "
                f"received {reduction}"
            )
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
        result.replace_all_uses_with(value)
        block.remove_op(op)
        if op.id() in finals:
            losses.append(value)
    return losses


def find_loss(program: Any, outputs: list[Any], owner: str) -> tuple[Any, int | None]:
    """The loss of a traced forward and its position among ``outputs`` (None when
    the forward does not return it): see the module docstring.  ``identity_loss``
    ops are taken out of ``program``; ``outputs`` follows.  CompileError, naming the
    outputs, when the loss cannot be determined."""
    marked = take_identity_losses(program, outputs)
    if len(marked) > 1:
        raise CompileError(
            f"{owner} marks {len(marked)} independent losses with "
            "paddle.incubate.identity_loss: the graph must have one final loss (pass their "
            "sum through identity_loss)"
        )
    if marked:
        loss = marked[0]
        for i, out in enumerate(outputs):
            if out.id == loss.id:
                return loss, i
        return loss, None
    candidates = [(i, v) for i, v in enumerate(outputs) if one_element(v) and _reaches_parameter(v)]
    described = ", ".join(_describe_output(i, v) for i, v in enumerate(outputs)) or "nothing"
    if not candidates:
        raise CompileError(
            f"{owner} returns {described}: none can be the loss (a loss holds one "
            "floating-point element computed from trainable parameters); return the "
            "loss, or mark it with paddle.incubate.identity_loss(loss, reduction)"
        )
    # A candidate read by another candidate is a part of that loss (PopTorch's rule
    # for marked losses, applied to the returned ones).
    parts: set[int] = set()
    for _, v in candidates:
        parts |= _ancestors(v)
    finals = [(i, v) for i, v in candidates if v.id not in parts]
    if len(finals) != 1:
        which = ", ".join(_describe_output(i, v) for i, v in finals)
        raise CompileError(
            f"{owner} returns {len(finals)} values that could each be the loss ({which}): "
            "mark the one to train with paddle.incubate.identity_loss(loss, reduction), "
            "or return their sum"
        )
    index, loss = finals[0]
    return loss, index
