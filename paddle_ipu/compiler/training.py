"""The training part of a compile: the loss and the optimizer.

After ``optimizer.minimize(loss)`` a PIR program holds the forward ops, the
backward ops (starting from ``full_like(loss, 1.0)``, the loss gradient) and the
optimizer ops.  This module finds the loss and extracts the optimizer
(:mod:`paddle_ipu.compiler.optimizer`) into the CompiledModel, which stays plain
data.  The Paddle side of it -- the program, its loss and fetch values -- is a
:class:`TrainingSource`, handed to the backend beside the model
(``SessionConfig.training_source``): a backend that computes gradients with Paddle's
kernels (the host) builds its gradient program from it
(:func:`paddle_ipu.backends.host.gradients.build_from_source`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.compiler.optimizer import extract_optimizer, find_optimizer_ops
from paddle_ipu.errors import CompileError


def find_loss(program: Any) -> Any:
    """The loss Value: the operand of the ``full_like`` op that seeds the backward
    (read by a gradient op directly, or through casts: Paddle's ``cast_model_to_fp16``
    casts a legacy program's seed to float16 before the first gradient op)."""
    ops = list(program.global_block().ops)
    for i, op in enumerate(ops):
        if op.name() != "pd_op.full_like":
            continue
        seeds = {op.result(0).id}
        for later in ops[i + 1 :]:
            sources = {v.id for v in later.operands_source() if v is not None and v.initialized()}
            if not sources & seeds:
                continue
            if later.name().endswith("_grad"):
                return op.operands_source()[0]
            if later.name() == "pd_op.cast":
                seeds.add(later.result(0).id)
    raise CompileError(
        "is_training=True, but the program has no backward pass: build it with "
        "optimizer.minimize(loss) before compiling, or set is_training=False"
    )


def _resolve(program: Any, item: Any) -> Any:
    """A fetch given by name: the same resolution as the forward compile's (one
    resolver for both, so a name that compiles for inference compiles for training)."""
    if not isinstance(item, str):
        return item
    from paddle_ipu.compiler.pir_reader import resolve_fetch

    return resolve_fetch(program.global_block(), item)[0]


@dataclasses.dataclass
class TrainingSource:
    """The Paddle objects a training model was compiled from.

    Attributes:
        program: the ``paddle.pir.Program`` after ``optimizer.minimize``.
        loss: the loss ``pir.Value``.
        fetches: the user's other fetch ``pir.Value`` s.
        fetch_names: their names.
        loss_name: the name of the loss output.
        scope: the scope the program's variables live in (None: the global scope).
    """

    program: Any
    loss: Any
    fetches: list[Any]
    fetch_names: list[str]
    loss_name: str
    scope: Any = None
    #: parameter name -> its raw gradient ``pir.Value`` in :attr:`program`
    grads: dict[str, Any] = dataclasses.field(default_factory=dict)


def attach_training(
    model: CompiledModel,
    program: Any,
    fetch_list: Sequence[Any],
    *,
    scope: Any = None,
    loss_scaling: float = 1.0,
) -> tuple[CompiledModel, TrainingSource]:
    """Add the loss and the optimizer to ``model``; return it with the
    :class:`TrainingSource` a backend builds its training from."""
    if not find_optimizer_ops(program):
        raise CompileError(
            "is_training=True, but the program has no optimizer: call "
            "optimizer.minimize(loss) before compiling, or set is_training=False"
        )
    loss = find_loss(program)
    numel = int(np.prod([d for d in loss.shape])) if len(loss.shape) else 1
    if numel != 1 or any(d < 0 for d in loss.shape):
        raise CompileError(
            f"the loss must be a scalar (one element), but it has shape {list(loss.shape)}; "
            "reduce it (for example with paddle.mean) before optimizer.minimize"
        )
    values = [_resolve(program, item) for item in fetch_list]
    loss_index = next((i for i, v in enumerate(values) if v.id == loss.id), None)
    names = [spec.paddle_name or spec.name for spec in model.outputs]
    loss_name = names[loss_index] if loss_index is not None else "loss"
    others = [(v, n) for i, (v, n) in enumerate(zip(values, names)) if i != loss_index]

    optimizer = extract_optimizer(
        program, scope=scope, loss_name=loss_name, loss_scaling=float(loss_scaling)
    )
    # The gradient Values stay with the program; the model's optimizer is plain data.
    grads = {slot.name: slot.grad for slot in optimizer.params}
    optimizer = dataclasses.replace(
        optimizer, params=tuple(dataclasses.replace(p, grad=None) for p in optimizer.params)
    )
    source = TrainingSource(
        program=program,
        loss=loss,
        fetches=[v for v, _ in others],
        fetch_names=[n for _, n in others],
        loss_name=loss_name,
        scope=scope,
        grads=grads,
    )
    loss_spec = model.outputs[loss_index].name if loss_index is not None else None
    return dataclasses.replace(model, loss=loss_spec, optimizer=optimizer), source
