"""Paddle 1.x's sequence operators, spelled in operators the converter lowers.

A legacy model's LoD input reaches the compiled graph as one sequence (its rows), or,
with a :class:`LodLayout`, as sequences padded to one length with their lengths as one
more feed (:mod:`paddle_ipu.frontends.lod_runner`); these operators run either:

- ``gru`` (``fluid.layers.dynamic_gru``; Baidu's LAC holds four): an ONNX ``GRU``.  The
  operator is written as a ``pd_op.rnn`` GRU (which the converter lowers to an ONNX
  ``GRU`` node) whose weights are the ``gru``'s laid out for it, marked with
  :data:`GRU_MARK`; :func:`paddle_ipu.compiler.converter_fixes.correct_lowerings` then
  gives that node the ``gru``'s semantics: the reset gate applied before the
  candidate's matrix product (``linear_before_reset=0``), the activations where they
  are not ONNX's defaults.  Paddle's ``gru`` weight holds the update and reset gates'
  matrix ``[D, 2D]`` in its first ``2 D^2`` elements and the candidate's ``[D, D]``
  after; its input and bias hold the gates in the order update, reset, candidate.
  With ``origin_mode=False`` (the default) Paddle computes ``h = (1 - u) h' + u c``,
  ONNX ``h = z h' + (1 - z) c``: the update gate's inputs are negated, ``z =
  sigmoid(-a) = 1 - u`` (so only a sigmoid update gate lowers in that mode).  A
  reverse ``gru`` is a forward GRU over each sequence read backwards within its
  length, its outputs put back the same way; padding after a sequence then never
  reaches its rows.  A ``gru`` whose input is a fully connected layer's output takes
  that layer's input, its matrix as the GRU's own.
- ``crf_decoding`` (Viterbi): the forward pass keeping each tag's best score and best
  previous tag per step (written out step by step when the number of steps is known
  at compile time, up to :data:`UNROLL_STEPS`; else a loop), and the backtrack by
  doubling; with its ``Length`` input (padded rows), every row decoded to its length
  and zeros after, as Paddle's kernel does; with its ``Label``, 1 where the path
  equals it.  Ties go to the first tag, as the kernel's strict comparisons do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.pir_values import copy_placement, is_real, shape_of
from paddle_ipu.errors import UnsupportedOpError

__all__ = [
    "GRU_MARK", "LENGTHS_FEED", "LodLayout", "add_lengths_feed", "check_row_wise",
    "rewrite_crf_decoding", "rewrite_gru",
]  # fmt: skip

#: the attribute a ``pd_op.rnn`` standing in for a ``gru`` carries (JSON: the ONNX GRU
#: attributes it needs); erased before the program is written for the converter
GRU_MARK = "paddle_ipu_gru"

#: Paddle's activation names -> ONNX RNN activations (identity: Affine, 1 x + 0)
_ACTIVATIONS: dict[str, str] = {
    "sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "identity": "Affine", "": "Affine",
}  # fmt: skip


#: the feed a :class:`LodLayout` adds: the sequences' lengths, int64 ``[sequences]``
LENGTHS_FEED = "paddle_ipu_lod_lengths"


@dataclass(frozen=True)
class LodLayout:
    """The rows of the LoD feeds ``feeds`` are ``sequences`` sequences, each padded to
    the same length (the micro-batch is ``sequences`` times that length); their lengths
    come in a feed of their own (:data:`LENGTHS_FEED`).  The sequence operators run them
    as a batch with those lengths; every other operator that reads the rows must treat
    each row alone (:func:`check_row_wise`), so that the padding rows change nothing."""

    sequences: int
    feeds: tuple[str, ...]


@dataclass(frozen=True)
class Padded:
    """A :class:`LodLayout` in the program being rewritten: the value of its lengths
    feed, and the length every sequence is padded to."""

    lengths: Any
    steps: int


def add_lengths_feed(program: Any, layout: LodLayout) -> Any:
    """The :data:`LENGTHS_FEED` data op, added at the top of ``program``'s block."""
    block = program.global_block()
    first = block.ops[0]
    with paddle.static.program_guard(program):
        lengths = paddle.static.data(LENGTHS_FEED, [layout.sequences], "int64")
    lengths.get_defining_op().move_before(first)
    return lengths


# Operators that compute each row of the LoD rows on its own (the padding rows of a
# batch of sequences then change no other row), and how each reads them.
_UNARY_ROWS = frozenset(
    {
        "pd_op.relu", "pd_op.tanh", "pd_op.sigmoid", "pd_op.scale", "pd_op.cast",
        "pd_op.exp", "pd_op.gelu", "pd_op.hardswish", "pd_op.hardsigmoid", "pd_op.silu",
        "pd_op.leaky_relu", "pd_op.dropout", "pd_op.assign", "pd_op.abs", "pd_op.sqrt",
        "pd_op.square", "pd_op.log", "pd_op.swish", "pd_op.relu6", "pd_op.elu",
    }
)  # fmt: skip
_BINARY_ROWS = frozenset(
    {"pd_op.add", "pd_op.subtract", "pd_op.multiply", "pd_op.divide", "pd_op.maximum",
     "pd_op.minimum", "pd_op.elementwise_pow"}
)  # fmt: skip
_LAST_AXIS = frozenset({"pd_op.softmax", "pd_op.log_softmax", "pd_op.argmax", "pd_op.argmin"})
_SEQUENCE_OPS = frozenset({"pd_op.gru", "pd_op.crf_decoding"})
_PASS = frozenset({"builtin.combine", "pd_op.fetch", "pd_op.full_int_array"})


def _row_problem(op: Any, rows: set[int]) -> str:
    """Why ``op``, which reads LoD rows (``rows``: value ids), does not treat each row
    alone ("" when it does)."""
    name = op.name()
    operands = [v for v in op.operands_source() if is_real(v)]
    reads = [k for k, v in enumerate(op.operands_source()) if is_real(v) and v.id in rows]
    out = shape_of(op.result(0)) if op.num_results() else ()
    if name in _PASS or name in _UNARY_ROWS or name in _SEQUENCE_OPS:
        return ""
    if name in _BINARY_ROWS:
        for v in operands:
            if v.id not in rows and len(shape_of(v)) >= len(out) and shape_of(v)[:1] != (1,):
                return "its other operand has a first dimension of its own"
        return ""
    if name == "pd_op.embedding":
        return "" if reads == [0] else "the rows are its table"
    if name == "pd_op.matmul":
        attrs = op.attrs()
        if reads != [0] or attrs.get("transpose_x") or len(shape_of(operands[0])) != 2:
            return "the rows are not the left operand of a matrix product of rank 2"
        return ""
    if name in _LAST_AXIS:
        axis = int(op.attrs().get("axis", -1)) if "axis" in op.attrs() else -1
        rank = len(shape_of(operands[0]))
        return "" if axis in (-1, rank - 1) and rank >= 2 else "it reduces across the rows"
    if name in (
        "pd_op.reshape",
        "pd_op.squeeze",
        "pd_op.unsqueeze",
        "pd_op.concat",
        "pd_op.layer_norm",
    ):
        parts = operands
        maker = operands[0].get_defining_op()
        if name == "pd_op.concat" and maker is not None and maker.name() == "builtin.combine":
            parts = [v for v in maker.operands_source() if is_real(v)]  # the list joined
        first = [shape_of(v)[:1] for v in parts if v.id in rows]
        per_row = name != "pd_op.layer_norm" or int(op.attrs().get("begin_norm_axis", 1)) >= 1
        if out[:1] == (-1,) and all(f == (-1,) for f in first) and per_row:
            return ""
        return "it moves values across the rows"
    return "it is not known to treat each row alone"


def check_row_wise(block: Any, layout: LodLayout, feeds: dict[str, Any]) -> None:
    """Refuse (naming the operator) a program whose operators mix the rows of the LoD
    feeds ``feeds`` (name -> value) other than by its sequence operators: padded into a
    batch of sequences, such rows would read the padding."""
    rows = {feeds[name].id for name in layout.feeds}
    for op in block.ops:
        if not any(is_real(v) and v.id in rows for v in op.operands_source()):
            continue
        problem = _row_problem(op, rows)
        if any(True for _ in op.blocks()):
            problem = "a loop or a branch reads them"
        if problem:
            raise UnsupportedOpError(
                f"{op.name()} reads the rows of the LoD input(s) {list(layout.feeds)}, and "
                f"{problem}: sequences padded into a batch lower only through operators "
                "that treat each row alone (and gru, crf_decoding)"
            )
        rows.update(r.id for r in op.results())


def _replace(block: Any, op: Any, index: int, value: Any, replaced: dict[int, Any]) -> None:
    old = op.result(index)
    replaced[old.id] = value
    old.replace_all_uses_with(value)
    block.remove_op(op)


def rewrite_gru(block: Any, nested: bool = False, padded: Padded | None = None) -> dict[int, Any]:
    """Every ``pd_op.gru`` -> a marked ``pd_op.rnn`` GRU (module docstring); in a
    control-flow block (``nested``) refused: the converter fix reads the program's
    top-level operators.  ``padded`` (a :class:`LodLayout`'s): the input's rows are
    sequences padded to one length, with their lengths."""
    lengths = padded.lengths if padded is not None else None
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.gru":
            continue
        what = f"pd_op.gru (input {list(shape_of(op.operand_source(0)))})"
        if nested:
            raise UnsupportedOpError(f"{what}: a gru inside a loop or a branch does not lower")
        if any(not op.result(k).use_empty() for k in range(3)):
            raise UnsupportedOpError(
                f"{what}: its batch_gate, batch_reset_hidden_prev and batch_hidden "
                "outputs (the kernel's internal reordering of the LoD batch) are read; "
                "only hidden lowers"
            )
        attrs = op.attrs()
        gate, act = str(attrs.get("gate_activation", "sigmoid")), str(attrs["activation"])
        origin = bool(attrs.get("origin_mode", False))
        for name in (gate, act):
            if name not in _ACTIVATIONS:
                raise UnsupportedOpError(
                    f"{what}: activation {name!r} (sigmoid, tanh, relu and identity lower)"
                )
        if not origin and gate != "sigmoid":
            raise UnsupportedOpError(
                f"{what}: gate_activation={gate!r} with origin_mode=False: the update gate "
                "enters as 1 - u, which ONNX's GRU computes only for a sigmoid gate"
            )
        x, h0, weight, bias = (op.operand_source(k) for k in range(4))
        d = shape_of(weight)[0] if len(shape_of(weight)) == 2 else -1
        if d <= 0 or list(shape_of(weight)) != [d, 3 * d] or shape_of(x)[-1:] != (3 * d,):
            raise UnsupportedOpError(
                f"{what}: weight {list(shape_of(weight))}: expected [D, 3 D] with an input "
                "of 3 D columns"
            )
        if is_real(h0) and (shape_of(h0) != (1, d) or lengths is not None):
            raise UnsupportedOpError(
                f"{what}: an initial state H0 of shape {list(shape_of(h0))}: it lowers as "
                f"[1, {d}] for one sequence at a time only"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        reverse = bool(attrs.get("is_reverse", False))
        out, rnn = _gru_as_rnn(x, h0, weight, bias, d, origin, reverse, lengths)
        mark: dict[str, Any] = {}
        activations = [_ACTIVATIONS[gate], _ACTIVATIONS[act]]
        if activations != ["Sigmoid", "Tanh"]:  # ONNX's defaults: PopART takes only them
            mark["activations"] = activations
        if "Affine" in activations:  # identity: 1 x + 0 (read in order)
            mark["activation_alpha"] = [1.0, 1.0]
            mark["activation_beta"] = [0.0, 0.0]
        rnn.set_str_attr(GRU_MARK, json.dumps(mark))
        copy_placement(block, op, before)
        _replace(block, op, 3, out, replaced)
    return replaced


def _gru_as_rnn(
    x: Any, h0: Any, weight: Any, bias: Any, d: int, origin: bool, reverse: bool, lengths: Any
) -> tuple[Any, Any]:
    """The ``gru`` over ``x`` ``[rows, 3 D]`` as a ``pd_op.rnn`` GRU: its ``[rows, D]``
    result, and the ``rnn`` operator.  The rows are one sequence, or (``lengths``) that
    many sequences each padded to ``rows / len(lengths)``, run as a batch with their
    lengths (a reverse gru reads each backwards within its length: :func:`_backwards`).

    ``rnn`` takes its gates in the order reset, update, candidate, with the input's
    matrix ``[3 D, input]`` and the state's ``[3 D, D]`` (each row one unit's weights),
    and the converter reorders them to ONNX's update, reset, candidate."""
    sign = 1.0 if origin else -1.0
    flat = paddle.reshape(weight, [3 * d * d])
    gate_w = paddle.reshape(flat[: 2 * d * d], [d, 2 * d])  # update, reset
    state = paddle.reshape(flat[2 * d * d :], [d, d])
    hidden_w = paddle.concat(
        [
            paddle.transpose(gate_w[:, d:], [1, 0]),
            paddle.scale(paddle.transpose(gate_w[:, :d], [1, 0]), sign),
            paddle.transpose(state, [1, 0]),
        ],
        axis=0,
    )

    def reorder(v: Any) -> Any:  # [3 D, ...] in update, reset, candidate -> rnn's order
        return paddle.concat([v[d : 2 * d], paddle.scale(v[:d], sign), v[2 * d :]], axis=0)

    projection = _projection(x, d)
    if projection is not None:  # x = inp @ w + b: the GRU's own input matrix is w's
        x, w, b = projection
        input_w = reorder(paddle.transpose(w, [1, 0]))
        extra = b
    else:  # x is the gates' input already: the input matrix selects them
        eye = np.eye(3 * d, dtype=np.float32)
        input_w = paddle.assign(np.concatenate([eye[d : 2 * d], sign * eye[:d], eye[2 * d :]]))
        extra = None
    total = paddle.reshape(bias, [3 * d]) if is_real(bias) else None
    if extra is not None:
        total = (
            paddle.reshape(extra, [3 * d])
            if total is None
            else total + paddle.reshape(extra, [3 * d])
        )
    input_b = reorder(total) if total is not None else paddle.zeros([3 * d], "float32")
    hidden_b = paddle.zeros([3 * d], "float32")
    count = 1 if lengths is None else int(shape_of(lengths)[0])
    width = int(shape_of(x)[-1])
    if lengths is None:  # time-major: [steps, 1, width]
        steps = paddle.reshape(x, [-1, 1, width])
    else:  # [count, steps, width] -> time-major
        steps = paddle.transpose(paddle.reshape(x, [count, -1, width]), [1, 0, 2])
    if reverse:  # each sequence backwards, within its length (the padding after it)
        steps = _backwards(steps, lengths)
    start = paddle.reshape(h0, [1, 1, d]) if is_real(h0) else paddle.zeros([1, count, d])
    rnn: Any = paddle._C_ops.rnn
    out = rnn(
        steps, [start], [input_w, hidden_w, input_b, hidden_b], None,
        paddle.zeros([0], "uint8"), 0.0, False, width, d, 1, "GRU", 0, True,
    )[0]  # fmt: skip
    op = out.get_defining_op()
    if reverse:
        out = _backwards(out, lengths)
    if lengths is not None:
        out = paddle.transpose(out, [1, 0, 2])
    return paddle.reshape(out, [-1, d]), op


def _source(value: Any, names: tuple[str, ...]) -> Any:
    """The operator that makes ``value``, past reshapes that keep its shape."""
    op = value.get_defining_op()
    while op is not None and op.name() == "pd_op.reshape":
        if shape_of(op.operand_source(0)) != shape_of(op.result(0)):
            break
        op = op.operand_source(0).get_defining_op()
    return op if op is not None and op.name() in names else None


def _backwards(steps: Any, lengths: Any) -> Any:
    """``steps`` ``[time, count, width]`` with each sequence's steps in reverse order
    within its length (``lengths``; None: all of them), the padding after it in place:
    a reverse GRU is a forward one over these, its outputs put back the same way.  (An
    ONNX GRU's own ``reverse`` direction and ``sequence_lens`` would do it on ONNX
    Runtime; PopART spells the direction ``backward``, keeps its outputs reversed and
    ignores ``sequence_lens``: willow/src/op/gru.cpp, popx/op/grux.cpp.)"""
    time = paddle.arange(0, paddle.shape(steps)[0], 1, "int64")
    if lengths is None:  # (flip needs the number of steps at compile time)
        return paddle.gather(steps, paddle.max(time) - time, axis=0)
    time = paddle.unsqueeze(time, 1)
    sizes = paddle.unsqueeze(lengths, 0)
    index = paddle.where(time < sizes, sizes - 1 - time, time + paddle.zeros_like(sizes))
    count, width = (int(d) for d in shape_of(steps)[1:])
    # step index[t, n] of sequence n: row index[t, n] * count + n of the steps' rows
    rows = index * count + paddle.unsqueeze(paddle.arange(0, count, 1, "int64"), 0)
    flat = paddle.gather(paddle.reshape(steps, [-1, width]), paddle.reshape(rows, [-1]), axis=0)
    return paddle.reshape(flat, [-1, count, width])


def _pick(table: Any, index: Any, rows: int, tags: int) -> Any:
    """``table[t, n, index[t, n, j]]`` (``take_along_axis`` on the last axis) for
    ``table`` ``[steps, rows, tags]``, as a ``Gather`` of its elements: ONNX's
    ``GatherElements``, which take_along_axis lowers to, has no op creator in PopART's
    sources (graphcore/popart willow/src/op: gather.cpp registers Gather only)."""
    time = paddle.unsqueeze(paddle.arange(0, paddle.shape(table)[0], 1, "int64"), 1)
    cells = (time * rows + paddle.arange(0, rows, 1, "int64")) * tags  # (t, n)'s first
    flat = paddle.unsqueeze(cells, 2) + index
    picked = paddle.gather(paddle.reshape(table, [-1]), paddle.reshape(flat, [-1]), axis=0)
    return paddle.reshape(picked, paddle.shape(index))


def _projection(x: Any, d: int) -> tuple[Any, Any, Any] | None:
    """``(inp, w, b)`` when the gru's input ``x`` is ``inp @ w + b`` (a fully connected
    layer, as ``dynamic_gru``'s users wrote it): ``inp`` ``[rows, in]``, ``w`` a static
    ``[in, 3 D]``, ``b`` a ``[3 D]`` (or ``[1, 3 D]``) that is the same for every row.
    The ONNX GRU then multiplies ``inp`` by ``w`` itself (its input matrix is ``w``'s
    columns in its gate order, exactly), instead of an identity after a matrix product
    of its own: a third of the work."""
    add = _source(x, ("pd_op.add",))
    if add is None:
        return None
    for k in (0, 1):
        product, b = add.operand_source(k), add.operand_source(1 - k)
        if shape_of(b) not in ((3 * d,), (1, 3 * d)):
            continue
        matmul = _source(product, ("pd_op.matmul",))
        if matmul is None or matmul.attrs().get("transpose_x") or matmul.attrs().get("transpose_y"):
            continue
        inp, w = matmul.operand_source(0), matmul.operand_source(1)
        size = shape_of(w)
        if len(shape_of(inp)) == 2 and len(size) == 2 and size[1] == 3 * d and size[0] > 0:
            return inp, w, b
    return None


def rewrite_crf_decoding(block: Any, padded: Padded | None = None) -> dict[int, Any]:
    """Every ``pd_op.crf_decoding`` -> the Viterbi decode in loops (module docstring);
    ``padded`` as for :func:`rewrite_gru` (for an emission without a ``Length``)."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.crf_decoding":
            continue
        emission, transition, label, length = (op.operand_source(k) for k in range(4))
        shape = list(shape_of(emission))
        what = f"pd_op.crf_decoding (emission {shape})"
        with_length = is_real(length)
        rank = 3 if with_length else 2
        if len(shape) != rank or any(s < 0 for s in shape[1:]):
            raise UnsupportedOpError(
                f"{what}: an emission of rank {rank} with static sizes after the first lowers"
            )
        tags = shape[-1]
        if list(shape_of(transition)) != [tags + 2, tags]:
            raise UnsupportedOpError(
                f"{what}: transition {list(shape_of(transition))}, expected [{tags + 2}, {tags}]"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if with_length:
            scores = emission
            count = int(shape[0])
            if count < 0:
                raise UnsupportedOpError(f"{what}: the number of rows must be static")
            sizes = paddle.reshape(paddle.cast(length, "int64"), [count])
        elif padded is not None:  # sequences padded to one length, and their lengths
            count = int(shape_of(padded.lengths)[0])
            scores = paddle.reshape(emission, [count, padded.steps, tags])
            sizes = padded.lengths
        else:  # one sequence: every row
            count = 1
            scores = paddle.unsqueeze(emission, 0)
            sizes = paddle.cast(paddle.shape(emission)[0:1], "int64")
        path = _viterbi(scores, transition, sizes, count, tags)  # [count, steps]
        if is_real(label):
            truth = paddle.reshape(paddle.cast(label, "int64"), [count, -1])
            hits = paddle.equal(truth, path)
            if with_length:
                hits = paddle.logical_and(hits, _inside(scores, sizes))
            path = paddle.cast(hits, "int64")
        if not with_length:
            path = paddle.reshape(path, [-1, 1])
        copy_placement(block, op, before)
        _replace(block, op, 0, path, replaced)
        _int64_after(path)
    return replaced


#: operators whose result has their first operand's element type
_SAME_TYPE = frozenset(
    {"pd_op.scale", "pd_op.assign", "pd_op.reshape", "pd_op.squeeze", "pd_op.unsqueeze",
     "pd_op.flatten", "pd_op.transpose"}
)  # fmt: skip


def _int64_after(path: Any) -> None:
    """Paddle declares crf_decoding's result float (its InferMeta sets no type; the
    kernel writes int64): the operators after it that keep their operand's type (a
    saved model's ``scale`` before the fetch) are declared int64, as they compute it,
    so that the converter does not cast the path to float."""
    stack = [path]
    while stack:
        value = stack.pop()
        for user in value.all_used_ops():
            if user.name() not in _SAME_TYPE or user.num_results() < 1:
                continue
            result = user.result(0)
            if is_real(result) and result.dtype != path.dtype:
                paddle_api.retype_like(result, path)
                stack.append(result)


def _inside(emission: Any, lengths: Any) -> Any:
    """``[count, steps]``: whether each step of ``emission`` ``[count, steps, tags]``
    is within its row's length."""
    steps = paddle.cast(paddle.shape(emission)[1], "int64")
    time = paddle.arange(0, steps, 1, "int64")
    return paddle.unsqueeze(time, 0) < paddle.unsqueeze(lengths, 1)


#: a decode of at most this many steps, known at compile time, is written out step by
#: step (ONNX Runtime spends more on a Loop's iteration than on its few operators)
UNROLL_STEPS = 256


def _viterbi(emission: Any, transition: Any, lengths: Any, rows: int, tags: int) -> Any:
    """The best tag path of each row of ``emission`` ``[rows, steps, tags]`` over its
    first ``lengths[row]`` steps (zeros after; a row of length 0 all zeros), as
    Paddle's crf_decoding kernel decodes one sequence: row 0 of ``transition`` the start
    weights, row 1 the end weights, rows 2.. the weights from tag j to tag i.

    The forward pass keeps, per step, each tag's best score and best previous tag.
    With a number of steps known at compile time (up to :data:`UNROLL_STEPS`) it is
    written out step by step; else it is a loop (the steps known at run time only: the
    graph's shapes are static once the rows fed are), time-major, writing one step's
    row of its buffer at a time (``scatter``)."""
    start, end, moves = transition[0], transition[1], transition[2:]
    known = int(shape_of(emission)[1])
    steps = paddle.cast(paddle.shape(emission)[1:2], "int64")
    scores = paddle.transpose(emission, [1, 0, 2])  # [steps, rows, tags]
    alpha = paddle.unsqueeze(start, 0) + scores[0]

    def step(alpha: Any, here: Any, going: Any) -> tuple[Any, Any]:
        total = paddle.unsqueeze(alpha, 2) + paddle.unsqueeze(moves, 0)  # [rows, from, to]
        best = paddle.max(total, axis=1)
        came = paddle.argmax(total, axis=1)  # the first of equal scores, as the kernel
        return paddle.where(going, best + here, alpha), came  # rows past their end keep

    if 0 < known <= UNROLL_STEPS:
        time = paddle.arange(0, known, 1, "int64")
        going = paddle.unsqueeze(time, 1) < paddle.unsqueeze(lengths, 0)  # [steps, rows]
        going = paddle.expand(paddle.unsqueeze(going, 2), [known, rows, tags])
        cames = [paddle.zeros([rows, tags], "int64")]
        for k in range(1, known):
            alpha, came = step(alpha, scores[k], going[k])
            cames.append(came)
        track = paddle.stack(cames)  # [steps, rows, tags]: the best previous tag
    else:
        track = paddle.zeros_like(scores, "int64")

        def forward_more(k: Any, alpha: Any, track: Any) -> Any:
            return k < steps

        def forward(k: Any, alpha: Any, track: Any) -> list[Any]:
            here = paddle.reshape(paddle.gather(scores, k, axis=0), [rows, tags])
            going = paddle.expand(paddle.unsqueeze(k < lengths, 1), [rows, tags])
            alpha, came = step(alpha, here, going)
            track = paddle.scatter(track, k, paddle.unsqueeze(came, 0), overwrite=True)
            return [k + 1, alpha, track]

        one = paddle.full([1], 1, "int64")
        _, alpha, track = paddle.static.nn.while_loop(forward_more, forward, [one, alpha, track])
    last = paddle.argmax(alpha + paddle.unsqueeze(end, 0), axis=1)  # [rows]
    shape = paddle.shape(scores)
    path = _backtrack(track, last, lengths, steps, known, shape, rows, tags)
    return paddle.transpose(path, [1, 0])


def _backtrack(
    track: Any, last: Any, lengths: Any, steps: Any, known: int, shape: Any, rows: int, tags: int
) -> Any:
    """The path ``[steps, rows]`` back from ``last``: ``path[k] = g_k(path[k + 1])``
    with ``g_k = track[k + 1]`` (the best tag at step k given the tag at step k + 1),
    the identity from each row's last step on.  Each ``path[k]`` is the composition
    ``g_k o g_(k+1) o ...`` applied to ``last``; the compositions come by doubling
    (``S[k] <- S[k] o S[k + d]``, d = 1, 2, 4, ...: log2(steps) rounds over the whole
    buffer, each a gather; written out when ``known``, the steps known at compile time,
    else a loop), not one step at a time.  ``shape``: the buffer's, read off the
    emission (a loop's result has no shape to fold)."""
    time = paddle.arange(0, steps, 1, "int64")  # [steps]
    ident = paddle.expand(paddle.arange(0, tags, 1, "int64"), [1, rows, tags])
    following = paddle.minimum(time + 1, steps - 1)
    maps = paddle.gather(track, following, axis=0)  # [steps, rows, tags]: track[k + 1]
    inside = paddle.unsqueeze(time, 1) + 1 < paddle.unsqueeze(lengths, 0)  # [steps, rows]
    every = paddle.expand(ident, shape)
    inside = paddle.expand(paddle.unsqueeze(inside, 2), shape)
    maps = paddle.where(inside, maps, every)

    def double(d: Any, maps: Any) -> Any:
        ahead = time + d
        later = paddle.gather(maps, paddle.minimum(ahead, steps - 1), axis=0)
        beyond = paddle.expand(paddle.reshape(ahead >= steps, [-1, 1, 1]), shape)
        later = paddle.where(beyond, every, later)
        return _pick(maps, later, rows, tags)

    if known > 0:
        d = 1
        while d < known:
            maps = double(paddle.full([1], d, "int64"), maps)
            d *= 2
    else:

        def more(d: Any, maps: Any) -> Any:
            return d < steps

        def again(d: Any, maps: Any) -> list[Any]:
            return [d * 2, double(d, maps)]

        one = paddle.full([1], 1, "int64")
        _, maps = paddle.static.nn.while_loop(more, again, [one, maps])
    ends = paddle.expand(paddle.reshape(last, [1, rows, 1]), [shape[0], rows, 1])
    path = paddle.reshape(_pick(maps, ends, rows, tags), [-1, rows])
    real = paddle.unsqueeze(time, 1) < paddle.unsqueeze(lengths, 0)
    return paddle.where(real, path, paddle.zeros_like(path))
