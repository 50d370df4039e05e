"""The data-dependent tail of a saved inference model, split off to run on the host.

A detector exported with its post-processing ends in non-maximum suppression
(PaddleDetection's exporter writes ``multiclass_nms3`` unless told ``-o
exclude_nms=True``): how many boxes it keeps depends on the data, and the IPU compiles
static shapes.  So does a decoder's output cut to the steps its loop took
(``buf[:, :step + 1]``, a slice whose bounds the data decides: :data:`DATA_BOUNDED`).
:func:`split_tail` cuts such a PIR program in two:

- the *static part*: every operator the fetches need up to the first data-dependent
  operator, compiled for the IPU as usual; its outputs (:attr:`TailSplit.static_fetches`)
  are the values the tail reads;
- the *tail*: the data-dependent operators (:data:`DATA_DEPENDENT`), every operator
  downstream of them, and what only they read that costs nothing to recompute
  (constants, lists of values, operators on values without the batch dimension, such as
  a feed's first row).  It is written as a PIR program of its own
  (:attr:`TailSplit.program`, reading the static part's outputs and the model's feeds as
  its feeds, giving the model's fetches in their order) that Paddle's CPU kernels run
  after the compiled graph (:mod:`paddle_ipu.serving.host_tail`).

A legacy program (a ``.pdmodel``) is split through its PIR translation (the one the
compiler reads it by): the tail is cut from the translation, and the static part is
compiled from the legacy program with the variables that hold what the tail reads as
its fetches.

The tail stays small by construction, and the split is refused (naming the operator
and the exporter's switch) where it would not be: where weights or a convolution or
matrix product run after a data-dependent operator (the data-dependent result feeds
back into the model's own compute, a loop or a branch among them).  A value the tail
reads without the batch dimension (a decoder's step count, shared by its rows) is handed
over as the compiled graph computes it for one run: such a model takes requests of one
run's rows (:func:`paddle_ipu.executor.feeds.check_row_split`, and the host tail checks
the shapes it is handed).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from paddle_ipu.compiler.pir_values import is_dense, is_real, reads, type_text
from paddle_ipu.errors import CompileError

log = logging.getLogger("paddle_ipu")

__all__ = ["COMPILED_PREFIX", "DATA_DEPENDENT", "TailSplit", "split_tail"]

_NMS = "non-maximum suppression keeps a number of boxes that depends on the data"

#: operators whose result size depends on the values they read, and why
DATA_DEPENDENT: dict[str, str] = {
    **dict.fromkeys(
        ("pd_op.multiclass_nms3", "pd_op.multiclass_nms", "pd_op.matrix_nms", "pd_op.nms"), _NMS
    ),
    "pd_op.nonzero": "the number of nonzero elements depends on the data",
    "pd_op.masked_select": "the number of selected elements depends on the data",
    "pd_op.unique": "the number of distinct values depends on the data",
}

#: operators whose result size depends on the data when their bounds do (operand
#: indices of the bounds), and why: a slice ``buf[:, :step + 1]`` whose end a decoder's
#: loop counts (a table or text decoder cut to the tokens it produced)
DATA_BOUNDED: dict[str, tuple[tuple[int, ...], str]] = {
    "pd_op.slice": ((1, 2), "a slice whose bounds are computed from the data (a decoder's "
                    "step count) has a size that depends on the data"),
    "pd_op.strided_slice": ((1, 2, 3), "a strided slice whose bounds are computed from the "
                            "data has a size that depends on the data"),
}  # fmt: skip

#: the legacy operators of DATA_BOUNDED, and the inputs that carry their bounds as tensors
_LEGACY_BOUNDS: dict[str, tuple[str, ...]] = {
    "slice": ("StartsTensor", "EndsTensor", "StartsTensorList", "EndsTensorList"),
    "strided_slice": (
        "StartsTensor", "EndsTensor", "StridesTensor",
        "StartsTensorList", "EndsTensorList", "StridesTensorList",
    ),
}  # fmt: skip


def reason(name: str) -> str:
    """Why operator ``name`` (of DATA_DEPENDENT or DATA_BOUNDED) has a data-dependent size."""
    if name in DATA_DEPENDENT:
        return DATA_DEPENDENT[name]
    return DATA_BOUNDED[name][1]


#: the tail's feeds that the compiled graph gives: this prefix and the output's index
COMPILED_PREFIX = "paddle_ipu_compiled_"

#: the exporter switch named in a refusal of an NMS tail
EXPORT_HINT = (
    "export the detector without it -- PaddleDetection's exporter takes -o exclude_nms=True "
    "-- and run NMS on the boxes and scores it then returns, after the predictor"
)
#: what to do instead, in a refusal of another data-dependent tail
_OTHER_HINT = (
    "export the model with outputs of a fixed size (the whole buffer and the count), and "
    "cut them after the predictor"
)


def _hint(first: str) -> str:
    return EXPORT_HINT if DATA_DEPENDENT.get(first) == _NMS else _OTHER_HINT


# Operators that are the model's own compute: after a data-dependent operator they
# would run on the host, so the split is refused instead.
_COMPUTE = frozenset(
    {
        "pd_op.conv2d", "pd_op.depthwise_conv2d", "pd_op.conv2d_transpose",
        "pd_op.conv3d", "pd_op.matmul", "pd_op.bmm", "pd_op.mm", "pd_op.fused_gemm_epilogue",
        "pd_op.multihead_matmul", "pd_op.embedding", "pd_op.lstm", "pd_op.rnn",
    }
)  # fmt: skip
_STRUCTURE = frozenset({"pd_op.data", "pd_op.feed", "pd_op.fetch", "builtin.parameter"})
_SHAPE_OF = frozenset({"pd_op.shape", "pd_op.shape64"})
# Operators without a tensor result the tail cannot take as a feed, pulled into it.
_LISTS = frozenset({"builtin.combine", "builtin.split", "builtin.slice"})


@dataclass
class TailSplit:
    """A PIR program split into its static part and its host tail (module docstring)."""

    #: the data-dependent operators, program order (PIR names)
    first: list[str]
    #: every operator of the tail, program order (PIR names)
    ops: list[str]
    #: values of the program: what the compiled static part computes, in order
    static_fetches: list[Any]
    #: the tail program's feeds: COMPILED_PREFIX + i for static_fetches[i], and the model's
    #: feeds the tail reads, by name
    feeds: list[str]
    #: the tail program (a saved PIR ``.json``), its fetches the model's
    program: bytes = b""
    #: the model's fetches: names, dtypes, declared shapes
    outputs: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)

    def describe(self) -> str:
        """The compile log's line: which operators run on the host, and why."""
        kinds = sorted(set(self.ops))
        return (
            f"{len(self.ops)} operator(s) from {', '.join(sorted(set(self.first)))} to the "
            f"outputs run on the host with Paddle's CPU kernels after the compiled graph "
            f"({', '.join(kinds)}): {reason(self.first[0])}, and the IPU compiles "
            f"static shapes; the compiled graph computes the {len(self.static_fetches)} "
            "value(s) they read"
        )


def _batch_spellings(feeds: Sequence[Any]) -> frozenset[int]:
    """How the feeds spell their batch dimension: ``-1`` (open), or a static size.
    Exporters mix the two -- PaddleDetection's PicoDet configs declare the image
    ``[1, 3, 416, 416]`` and the exporter its ``scale_factor`` ``[-1, 2]`` -- so ``1``
    and ``-1`` together are both the batch.  Any other mix has no batch dimension the
    split can rely on (empty)."""
    dims = frozenset(int(v.shape[0]) for v in feeds if v.is_dense_tensor_type() and len(v.shape))
    if len(dims) == 1 or dims == frozenset({-1, 1}):
        return dims
    return frozenset()


def _from_feed_values(ops: Sequence[Any], feeds: Sequence[Any]) -> set[int]:
    """The ids of the values computed from the feeds' values (a shape alone carries no
    row of the batch: ``shape(image)[2]`` is the same for every row)."""
    out = {v.id for v in feeds}
    for op in ops:
        if op.name() in _SHAPE_OF:
            continue
        if any(v.id in out for v in reads(op)):
            out.update(r.id for r in op.results())
    return out


def split_tail(
    program: Any, feeds: Sequence[Any], fetches: Sequence[Any], fetch_names: Sequence[str]
) -> TailSplit | None:
    """Split a loaded PIR inference program (``feeds``: its data ops' values,
    ``fetches``: its fetch values) at its first data-dependent operator; None when it has
    none.  Raises CompileError naming the operator where the tail cannot run on its own."""
    import paddle

    if not isinstance(program, paddle.pir.Program):
        return _split_legacy(program, feeds, fetches, fetch_names)
    block = program.global_block()
    ops = [op for op in block.ops if op.name() != "pd_op.fetch"]
    tail_ids: set[int] = set()
    producer: dict[int, Any] = {}
    for op in ops:
        for r in op.results():
            producer[r.id] = op
    spellings = _batch_spellings(feeds)
    rows = _from_feed_values(ops, feeds)
    first: list[str] = []
    for op in ops:
        if _data_dependent(op, rows):
            first.append(op.name())
            tail_ids.add(op.id())
            continue
        if tail_ids and any(
            _source_op(v, producer) is not None and _source_op(v, producer).id() in tail_ids
            for v in op.operands_source()
        ):
            tail_ids.add(op.id())
    if not first:
        return None
    hint = _hint(first[0])

    def batched(value: Any) -> bool:
        return _batched(value, spellings) and value.id in rows

    # Pull in what only the tail reads and that the compiled graph cannot hand over:
    # lists, constants, values without the batch dimension.
    changed = True
    while changed:
        changed = False
        for op in reversed(ops):
            if op.id() in tail_ids or op.name() in _STRUCTURE:
                continue
            users = [u for r in op.results() for u in r.all_used_ops()]
            if not users or any(
                u.id() not in tail_ids and u.name() != "pd_op.fetch" for u in users
            ):
                continue
            if any(u.name() == "pd_op.fetch" for u in users):
                continue  # a fetch of the static part: the compiled graph gives it
            cheap = (
                op.name() not in _COMPUTE
                and not _has_blocks(op)  # a loop or a branch: the model's compute
                and not any(_is_parameter(v, producer) for v in reads(op))
            )
            handover = (
                op.name() not in _LISTS
                and op.num_operands() > 0
                and all(batched(r) for r in op.results())
            )
            if cheap and not handover:
                tail_ids.add(op.id())
                changed = True
    tail_ops = [op for op in ops if op.id() in tail_ids]
    heavy = [op.name() for op in tail_ops if op.name() in _COMPUTE or _has_blocks(op)]
    weights = [op.name() for op in tail_ops if any(_is_parameter(v, producer) for v in reads(op))]
    if heavy or weights:
        what = sorted(set(heavy + weights))
        raise CompileError(
            f"{first[0]}: {reason(first[0])}, and its result feeds the model's own "
            f"compute ({', '.join(what)} after it), which the IPU compiles for static shapes: "
            f"the tail after it cannot run on the host alone; {hint}"
        )
    # What the tail reads from outside: the model's feeds by name, the rest from the
    # compiled graph.
    feed_ids = {v.id: str(v.get_defining_op().attrs()["name"]) for v in feeds}
    cut: list[Any] = []
    cut_ids: set[int] = set()

    def read(v: Any) -> None:
        if not is_real(v) or v.id in feed_ids or v.id in cut_ids:
            return
        src = _source_op(v, producer)
        if src is None or src.id() in tail_ids:
            return
        if not is_dense(v):
            raise CompileError(
                f"{first[0]}: {reason(first[0])}; the host tail after it reads a "
                f"{type_text(v)} of {src.name()} that the compiled graph would compute, "
                f"which is not a tensor: the split is not supported here; {hint}"
            )
        # A value without the batch dimension (a decoder's step count, shared by the
        # rows) is handed over as the compiled graph computes it for its micro-batch:
        # a request is then not split into micro-batches (feeds.check_row_split, and
        # HostTail.run checks its shape).
        cut.append(v)
        cut_ids.add(v.id)

    for op in tail_ops:
        for v in op.operands_source():
            read(v)
    for v in fetches:
        read(v)
    split = TailSplit(
        first=first,
        ops=[op.name() for op in tail_ops],
        static_fetches=cut,
        feeds=[],
    )
    split.program, split.feeds = _tail_program(program, cut, feed_ids, tail_ids, fetches)
    from paddle_ipu._util import dtypes

    # unnamed values by their fetch ops' names, as Paddle Inference names its outputs
    fetch_ops = {
        op.operand_source(0).id: str(op.attrs().get("name", ""))
        for op in block.ops
        if op.name() == "pd_op.fetch"
    }
    split.outputs = [
        (name or fetch_ops.get(v.id, "") or f"output_{i}", dtypes.name_of(v.dtype),
         tuple(int(d) for d in v.shape))
        for i, (name, v) in enumerate(zip(fetch_names, fetches))
    ]  # fmt: skip
    return split


def _has_blocks(op: Any) -> bool:
    """A control-flow operator (a loop, a branch): blocks of the model's compute."""
    return any(True for _ in op.blocks())


def _data_dependent(op: Any, rows: set[int]) -> bool:
    """Whether ``op``'s result size depends on the data: an operator of DATA_DEPENDENT,
    or one of DATA_BOUNDED whose bounds are computed from the feeds' values (``rows``)."""
    name = op.name()
    if name in DATA_DEPENDENT:
        return True
    if name not in DATA_BOUNDED:
        return False
    operands = op.operands_source()
    return any(
        k < len(operands) and is_real(operands[k]) and operands[k].id in rows
        for k in DATA_BOUNDED[name][0]
    )


def _legacy_candidate(op: Any) -> bool:
    """A legacy operator that may be data-dependent (its PIR translation decides)."""
    if "pd_op." + op.type in DATA_DEPENDENT:
        return True
    bounds = _LEGACY_BOUNDS.get(op.type, ())
    return any(op.input(k) for k in bounds if k in op.input_names)


def _source_op(value: Any, producer: dict[int, Any]) -> Any:
    if not is_real(value) or value.id not in producer:
        return None
    return producer[value.id]


def _is_parameter(value: Any, producer: dict[int, Any]) -> bool:
    op = _source_op(value, producer)
    return op is not None and op.name() == "builtin.parameter"


def _batched(value: Any, spellings: frozenset[int]) -> bool:
    """Whether ``value``'s first dimension is spelled as the feeds spell the batch
    (what the compiled graph's outputs must have first: it runs micro-batches)."""
    if not spellings or not value.is_dense_tensor_type():
        return False
    shape = list(value.shape)
    return bool(shape) and int(shape[0]) in spellings


def _tail_program(
    program: Any,
    cut: Sequence[Any],
    feed_ids: dict[int, str],
    tail_ids: set[int],
    fetches: Sequence[Any],
) -> tuple[bytes, list[str]]:
    """The tail as a PIR program of its own, saved; and its feed names."""
    import paddle

    mapping = paddle.pir.IrMapping()
    clone = program.clone(mapping)
    block = clone.global_block()
    old_ops = list(program.global_block().ops)
    new_ops = list(block.ops)
    keep = {new.id() for old, new in zip(old_ops, new_ops) if old.id() in tail_ids}
    first_op = new_ops[0]
    feeds: list[Any] = []
    names: list[str] = []
    handed: dict[int, Any] = {}  # a cut value's id -> the data op that stands for it
    with paddle.static.program_guard(clone):
        for i, value in enumerate(cut):
            name = f"{COMPILED_PREFIX}{i}"
            data = paddle.static.data(name, list(value.shape), value.dtype)
            data.get_defining_op().move_before(first_op)
            mapping.look_up(value).replace_all_uses_with(data)
            keep.add(data.get_defining_op().id())
            feeds.append(data)
            names.append(name)
            handed[value.id] = data
    used_feeds = []
    for vid, name in feed_ids.items():
        old = next(v for op in old_ops for v in op.results() if v.id == vid)
        new = mapping.look_up(old)
        if any(u.id() in keep for u in new.all_used_ops()) or any(f.id == vid for f in fetches):
            keep.add(new.get_defining_op().id())
            used_feeds.append((name, new))
    # a fetch the compiled graph computes (a loop's count beside the cut buffer) is
    # handed over as it is
    outputs = [handed[v.id] if v.id in handed else mapping.look_up(v) for v in fetches]
    for op in reversed(list(block.ops)):
        if op.name() == "pd_op.fetch" or op.id() not in keep:
            block.remove_op(op)
    feeds += [v for _, v in used_feeds]
    names += [n for n, _ in used_feeds]
    with tempfile.TemporaryDirectory(prefix="paddle_ipu_tail_") as directory:
        prefix = os.path.join(directory, "tail")
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()), warnings.catch_warnings():
            # the tail has no weights, which Paddle warns about
            warnings.filterwarnings("ignore", message="no variable in your model")
            paddle.static.save_inference_model(prefix, feeds, outputs, exe, program=clone)
        with open(prefix + ".json", "rb") as f:
            return f.read(), names


def _split_legacy(
    program: Any, feeds: Sequence[Any], fetches: Sequence[Any], fetch_names: Sequence[str]
) -> TailSplit | None:
    """A legacy program (a ``.pdmodel``) split through its PIR translation (the one the
    compiler reads it by: :mod:`.legacy_reader`): the tail is cut from the translation;
    the static part's fetches are the legacy variables that hold what it reads."""
    block = program.global_block()
    if not any(_legacy_candidate(op) for op in block.ops):
        return None
    from paddle_ipu.compiler.legacy_reader import pir_mode, translate

    feed_names = [str(getattr(f, "name", f)) for f in feeds]
    legacy_fetches = [str(getattr(f, "name", f)) for f in fetches]
    translation = translate(program, feed_names, legacy_fetches)
    with pir_mode():
        pir_block = translation.program.global_block()
        data = {
            str(op.attrs()["name"]): op.result(0)
            for op in pir_block.ops
            if op.name() in ("pd_op.data", "pd_op.feed")
        }
        pir_fetches = [v if not isinstance(v, str) else data.get(v) for v in translation.fetch_list]
        if any(v is None for v in pir_fetches):
            raise CompileError(
                f"{legacy_fetches}: a fetch of a parameter, with data-dependent operators "
                f"in the program, is not supported; {EXPORT_HINT}"
            )
        split = split_tail(translation.program, [data[n] for n in feed_names], pir_fetches,
                           fetch_names)  # fmt: skip
    if split is None:  # slices with tensor bounds, none computed from the data
        return None
    # the legacy variable whose final value each cut value is (the static part is
    # compiled from the legacy program, by these names)
    final = {vs[-1].id: name for name, vs in translation.values.items() if vs}
    names: list[str] = []
    for value in split.static_fetches:
        name = final.get(value.id)
        if name is None:
            raise CompileError(
                f"{split.first[0]}: {reason(split.first[0])}; the host tail after it "
                f"reads a value of shape {list(value.shape)} that no variable of the legacy "
                f"program holds: the split is not supported here; save the model again under "
                f"PIR, or {_hint(split.first[0])}"
            )
        names.append(name)
    split.static_fetches = names
    return split
