"""The IPU's float16 arithmetic and floating-point checks in the host's gradient
program (training).

The host trains with Paddle's CPU kernels (:mod:`.gradients`); with ``enable_fp16``
and ``host_fp16_arithmetic="float16"`` every operator of the gradient program, the
backward pass's included, has its float results rounded to float16 as the IPU
rounds them (:mod:`.numerics`): to nearest, or stochastically, an overflow
saturating at +-65504 (an infinity from a division by zero or an infinite operand
staying one), or, with the floating-point checks, an infinity that the checks
report.  Each rounding is one operator put after the operator: the host's
``ipu_round_fp16`` (csrc/ops/round_op.cc, the compiled core's rounding: its random
stream per rounding, the micro-batch's random state fed as :data:`SEED_FEED`).  Where
that operator does not load, Paddle operators spell it (``cast`` to float16 and back,
after ``where(isinf(x), x, clip(x))`` for the saturation; stochastic rounding from
float operators and ``uniform``, the same construction as the inference graph's,
:meth:`.onnx_edit.Editor.round_to`): 5 operators per rounding, 20 stochastic, which
Paddle's executor takes far longer to prepare (its in-place pass grows faster than
the program).

With ``enable_floating_point_checks`` every operator whose results are not values of
its operands gets two flags (how many NaN and infinities its result holds), fetched
with the loss; the trainer stops at the first operator with a flag above zero,
before any update.

Loss scaling (``loss_scaling``): in float16 arithmetic the backward pass starts from
the loss gradient times the scaling, and the trainer divides the gradients by it
before the update, as PopART does; in float32 it cancels out and is not applied.

Float16 matmul partials (``enable_half_partial``, ``partials_type_matmuls="half"``):
every matmul of the program, the backward pass's included, is computed in passes of
:data:`~.numerics.AMP_PASS` products (one batched float32 matmul gives the passes'
sums) and the passes accumulated into a float16 partial by the host's
``ipu_accumulate_fp16``, as the inference graph does (:mod:`.fp16_ops`).  Convolution
partials stay float32 in training: float16 convolution partials are refused
(:mod:`.support`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from paddle_ipu._internals import paddle_api
from paddle_ipu.backends.host.numerics import AMP_PASS, FP16_MAX, FP16_TINY, Fp16Arithmetic
from paddle_ipu.errors import NotSupportedError

log = logging.getLogger("paddle_ipu.host")

#: operators whose float results are values of their operands: no rounding, no check
EXACT = frozenset(
    {
        "pd_op.data", "builtin.parameter", "builtin.combine", "builtin.split",
        "builtin.slice", "builtin.shadow_output", "pd_op.fetch", "pd_op.full",
        "pd_op.full_like", "pd_op.full_int_array", "pd_op.shape", "pd_op.shape64",
        "pd_op.reshape", "pd_op.transpose", "pd_op.slice", "pd_op.strided_slice",
        "pd_op.concat", "pd_op.split", "pd_op.split_with_num", "pd_op.squeeze",
        "pd_op.unsqueeze", "pd_op.flatten", "pd_op.gather", "pd_op.gather_nd",
        "pd_op.index_select", "pd_op.relu", "pd_op.maximum", "pd_op.minimum",
        "pd_op.assign", "pd_op.expand", "pd_op.tile", "pd_op.where", "pd_op.cast",
        "pd_op.reshape_grad", "pd_op.transpose_grad", "pd_op.squeeze_grad",
        "pd_op.unsqueeze_grad", "pd_op.flatten_grad", "pd_op.relu_grad",
        "pd_op.slice_grad", "pd_op.concat_grad", "pd_op.uniform",
    }
)  # fmt: skip
#: results that alias persistable variables (BatchNorm's running statistics, which
#: the trainer rounds itself): operator -> the indices of those results
_ALIASES = {"pd_op.batch_norm_": (1, 2), "pd_op.batch_norm": (1, 2)}


@dataclass
class Rewritten:
    """What :func:`rewrite` changed: the program's values to fetch now, and the flags.

    Attributes:
        loss, fetches, grads: the rounded values (the same Values without rounding).
        flags: the checks' flags, a float tensor [2 per operator watched]: the NaN
            and the infinities in its result (None without checks).
        checked: per operator watched: its index among the program's operators
            and its name.
    """

    loss: Any
    fetches: list[Any]
    grads: list[Any]
    flags: Any = None
    #: the feed of the rounding operator's random state ("" without it)
    seed_feed: str = ""
    checked: list[tuple[int, str]] = field(default_factory=list)


def _float(value: Any) -> bool:
    import paddle

    try:
        return bool(value.dtype == paddle.float32)
    except Exception:  # a vector result (builtin.combine ...)
        return False


#: the feed of the rounding operator's random state (:data:`ROUND_OP`)
SEED_FEED = "paddle_ipu_round_seed"
#: the host's rounding operator (csrc/ops/round_op.cc), one per rounding
ROUND_OP = "ipu_round_fp16"
#: the host's float16 partials of a matmul's passes (csrc/ops/round_op.cc)
ACCUMULATE_OP = "ipu_accumulate_fp16"


def round_op_available() -> bool:
    """Whether the host's rounding operator is registered with Paddle
    (:func:`paddle_ipu.device.load_host_operators`; without it the rounding is spelt in
    Paddle's own operators, 5 per rounding, 20 stochastic, and the program takes
    Paddle's executor much longer to prepare)."""
    from paddle_ipu import device

    return ROUND_OP in device.load_host_operators()


class _Rounder:
    """Rounds values of one program: with the host's operator (one per value, each its
    own random stream, the micro-batch's random state fed as :data:`SEED_FEED`), or in
    Paddle's operators."""

    def __init__(self, program: Any, arith: Fp16Arithmetic, with_op: bool) -> None:
        import paddle

        self.arith = arith
        self.seed: Any = None
        self.streams = 0
        if with_op:
            block = program.global_block()
            first = next(iter(block.ops), None)
            if first is not None:
                paddle.pir.set_insertion_point(first)
            self.seed = paddle.static.data(SEED_FEED, [1], "int64")

    def __call__(self, value: Any) -> Any:
        if self.seed is None:
            return _round(value, self.arith)
        self.streams += 1
        (out,) = paddle_api.run_custom_op(
            ROUND_OP, value, self.seed, self.arith.stochastic, self.arith.saturate, self.streams
        )
        return out

    def accumulate(self, sums: Any) -> Any:
        """The float16 partial of the passes' float32 sums along axis 0 (the host's
        ``ipu_accumulate_fp16``: each pass's sum added to the partial, rounded)."""
        self.streams += 1
        (out,) = paddle_api.run_custom_op(
            ACCUMULATE_OP, sums, self.seed, self.arith.stochastic, self.arith.saturate, self.streams
        )
        return out

    def matmul(self, a: Any, b: Any, where: str) -> Any:
        """``a @ b`` (``b`` of rank 2, or of ``a``'s rank) with float16 partials: the
        products in passes of :data:`~.numerics.AMP_PASS` along the reduced axis, one
        batched float32 matmul for the passes' sums, then their float16 accumulation."""
        import paddle

        k = int(a.shape[-1])
        if k <= AMP_PASS or k < 0:  # one pass: the float32 sum rounded once
            return self(paddle.matmul(a, b))
        passes = -(-k // AMP_PASS)
        pad = passes * AMP_PASS - k
        if pad:  # zero products change no sum
            a = paddle.concat([a, paddle.zeros([*a.shape[:-1], pad], a.dtype)], axis=-1)
            b = paddle.concat(
                [b, paddle.zeros([*b.shape[:-2], pad, b.shape[-1]], b.dtype)], axis=-2
            )
        rank = len(a.shape)
        # a: [..., M, K] -> [..., P, M, 16];  b: [..., K, N] -> [..., P, 16, N]
        ra = paddle.reshape(a, [*a.shape[:-1], passes, AMP_PASS])
        ta = paddle.transpose(ra, [*range(rank - 2), rank - 1, rank - 2, rank])
        rb = paddle.reshape(b, [*b.shape[:-2], passes, AMP_PASS, b.shape[-1]])
        sums = paddle.matmul(ta, rb)  # [..., P, M, N]
        axis = len(sums.shape) - 3
        order = [axis, *[i for i in range(len(sums.shape)) if i != axis]]
        return self.accumulate(paddle.transpose(sums, order))


def _swap(x: Any) -> Any:
    import paddle

    rank = len(x.shape)
    return paddle.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


def _half_partial_matmuls(
    block: Any, rounder: _Rounder, replaced: dict[int, Any], wanted: set[int]
) -> set[int]:
    """Float16 partials of every matmul of the gradient program, forward and backward
    (PopART's partialsTypeMatMuls covers the gradient matmuls too): each ``matmul``,
    and each ``matmul_grad``'s two products (those read, or in ``wanted``: the
    gradients and fetches), computed by :meth:`_Rounder.matmul`.
    ``replaced`` gets old value id -> new value; returns the ids of the operators it
    made (their values are the AMP's own, rounded as it rounds: the rewrite leaves
    them alone).  NotSupportedError for a batched matmul whose operands' batch
    dimensions differ."""
    import paddle

    before = {op.id() for op in block.ops}
    for op in list(block.ops):
        name = op.name()
        if name not in ("pd_op.matmul", "pd_op.matmul_grad"):
            continue
        attrs = op.attrs()
        tx, ty = bool(attrs.get("transpose_x")), bool(attrs.get("transpose_y"))
        x, y = op.operand_source(0), op.operand_source(1)
        rx, ry = len(x.shape), len(y.shape)
        if rx < 2 or ry < 2 or (ry > 2 and (rx != ry or list(x.shape[:-2]) != list(y.shape[:-2]))):
            raise NotSupportedError(
                f"float16 partials in training: {name} of operands {list(x.shape)} and "
                f"{list(y.shape)}: the host emulates them for 2-D right operands and batched "
                "operands of equal batch dimensions"
            )
        paddle.pir.set_insertion_point(op)
        a = _swap(x) if tx else x
        b = _swap(y) if ty else y
        if name == "pd_op.matmul":
            new = rounder.matmul(a, b, name)
            replaced[op.result(0).id] = new
            op.result(0).replace_all_uses_with(new)
        else:
            dout = op.operand_source(2)
            results = [op.result(0), op.result(1)]
            if not results[0].use_empty() or results[0].id in wanted:
                da = rounder.matmul(dout, _swap(b), name)
                da = _swap(da) if tx else da
                replaced[results[0].id] = da
                results[0].replace_all_uses_with(da)
            if not results[1].use_empty() or results[1].id in wanted:
                if ry == 2 and rx > 2:  # y broadcast over x's batch: the sum over it
                    a2 = paddle.reshape(a, [-1, a.shape[-1]])
                    d2 = paddle.reshape(dout, [-1, dout.shape[-1]])
                    db = rounder.matmul(_swap(a2), d2, name)
                else:
                    db = rounder.matmul(_swap(a), dout, name)
                db = _swap(db) if ty else db
                replaced[results[1].id] = db
                results[1].replace_all_uses_with(db)
        block.remove_op(op)
    return {op.id() for op in block.ops} - before


def _round(value: Any, arith: Fp16Arithmetic) -> Any:
    """``value`` rounded to float16 (values held in float32), as ``arith`` says, in
    Paddle's own operators."""
    import paddle

    x = value
    if arith.saturate:
        x = paddle.where(paddle.isinf(x), x, paddle.clip(x, -FP16_MAX, FP16_MAX))
    if not arith.stochastic:
        return paddle.cast(paddle.cast(x, "float16"), "float32")
    # stochastic rounding: the float construction of onnx_edit.Editor._round_stochastic
    a = paddle.abs(x)
    r = paddle.cast(paddle.cast(a, "float16"), "float32")
    d = a - r
    up = paddle.cast(paddle.cast(r * (1 + 2**-11 + 2**-20), "float16"), "float32")
    dn = paddle.cast(paddle.cast(r * (1 - 2**-11 - 2**-20), "float16"), "float32")
    s_up = paddle.clip(up - r, min=FP16_TINY)
    s_dn = paddle.clip(r - dn, min=FP16_TINY)
    above = d >= 0
    s = paddle.where(above, s_up, s_dn)
    lo = paddle.where(above, r, r - s_dn)
    frac = (a - lo) / s
    u = paddle.uniform(paddle.shape(a), dtype="float32", min=0.0, max=1.0)
    mag = lo + s * paddle.cast(u < frac, "float32")
    rounded = mag * paddle.sign(x)
    # beyond float16's range (an infinity, or an overflow without saturation)
    nearest = paddle.cast(paddle.cast(x, "float16"), "float32")
    return paddle.where(a > FP16_MAX, nearest, rounded)


def _flag(value: Any) -> Any:
    """[NaN count, infinity count] of ``value`` (float32: exact up to 2^24)."""
    import paddle

    nan = paddle.sum(paddle.cast(paddle.isnan(value), "float32")).reshape([1])
    inf = paddle.sum(paddle.cast(paddle.isinf(value), "float32")).reshape([1])
    return paddle.concat([nan, inf])


def rewrite(
    program: Any,
    loss: Any,
    fetches: Sequence[Any],
    grads: Sequence[Any],
    *,
    arith: Fp16Arithmetic | None,
    checks: bool,
    loss_scaling: float = 1.0,
) -> Rewritten:
    """Round the results of every operator of ``program`` (a pruned gradient program)
    as ``arith`` says (None: float32, no rounding), add the checks' flags, and scale
    the loss gradient by ``loss_scaling`` (float16 arithmetic only).  In place."""
    import paddle

    block = program.global_block()
    replaced: dict[int, Any] = {}
    # (ids taken now: the half partials remove matmuls whose results these may be)
    loss_id, fetch_ids, grad_ids = loss.id, [v.id for v in fetches], [v.id for v in grads]
    watched: list[tuple[int, str, Any]] = []
    rounding = arith is not None and arith.rounded
    # (gradients.build_gradient_program loads the operator before it clones the program)
    with_op = rounding and round_op_available()
    with paddle.static.program_guard(program):
        rounder = _Rounder(program, arith, with_op) if arith is not None and rounding else None
        if rounder is not None and arith is not None and arith.half_partials_matmul:
            if rounder.seed is None:
                raise NotSupportedError(
                    "float16 matmul partials in training need the host's operators "
                    "(libpaddle-ipu-ops.so), which did not register with Paddle here"
                )
            wanted = {loss_id, *fetch_ids, *grad_ids}
            amp_ops = _half_partial_matmuls(block, rounder, replaced, wanted)
        else:
            amp_ops = set()
        ops = list(block.ops)
        for index, op in enumerate(ops):
            name = op.name()
            if name in EXACT or name.startswith("builtin.") or op.id() in amp_ops:
                continue
            skip = _ALIASES.get(name, ())
            for k, value in enumerate(op.results()):
                if k in skip or not _float(value) or value.use_empty():
                    continue
                paddle.pir.set_insertion_point_after(_last_after(op, value))
                new = value
                if rounder is not None:
                    new = rounder(value)
                    _redirect(value, new)
                if checks:
                    watched.append((index, name, new))
                replaced[value.id] = new
        if arith is not None and arith.rounded and loss_scaling != 1.0:
            _scale_loss_gradient(ops, loss, loss_scaling, replaced)
        flags = None
        if watched:
            paddle.pir.set_insertion_point_to_block_end(block)
            flags = paddle.concat([_flag(v) for _, _, v in watched])
    return Rewritten(
        seed_feed=SEED_FEED if rounder is not None and rounder.seed is not None else "",
        loss=replaced.get(loss_id, loss),
        fetches=[replaced.get(i, v) for i, v in zip(fetch_ids, fetches)],
        grads=[replaced.get(i, v) for i, v in zip(grad_ids, grads)],
        flags=flags,
        checked=[(i, n) for i, n, _ in watched],
    )


def _last_after(op: Any, value: Any) -> Any:
    """Where the rounding of ``value`` goes: after ``op``."""
    del value
    return op


def _redirect(value: Any, new: Any) -> None:
    """Every use of ``value`` reads ``new`` instead, but the rounding's own first
    operator (which must read ``value``)."""
    first = _first_reader(new, value)
    value.replace_all_uses_with(new)
    for op, index in first:
        op.operand(index).set_source(value)


def _first_reader(new: Any, value: Any) -> list[tuple[Any, int]]:
    """The operators of ``new``'s construction that read ``value`` (and which operand)."""
    seen: set[int] = set()
    stack, found = [new.get_defining_op()], []
    while stack:
        op = stack.pop()
        # op.id(): Python's id() of a wrapper can be reused once it is freed
        if op is None or op.id() in seen:
            continue
        seen.add(op.id())
        for i, source in enumerate(op.operands_source()):
            if source is None:
                continue
            if source.id == value.id:
                found.append((op, i))
            elif source.initialized():
                stack.append(source.get_defining_op())
    return found


def _scale_loss_gradient(
    ops: Sequence[Any], loss: Any, scaling: float, replaced: dict[int, Any]
) -> None:
    """Multiply the backward pass's seed (``full_like(loss, 1.0)``) by ``scaling``."""
    import paddle

    loss_ids = {loss.id, getattr(replaced.get(loss.id), "id", loss.id)}  # loss: not a matmul
    for op in ops:
        if op.name() != "pd_op.full_like":
            continue
        source = op.operands_source()[0]
        if source is None or source.id not in loss_ids:
            continue
        seed = op.result(0)
        paddle.pir.set_insertion_point_after(op)
        scaled = paddle.scale(seed, scale=float(scaling))
        _redirect(seed, scaled)
        return
