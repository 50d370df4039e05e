"""Reading a legacy-IR program (``FLAGS_enable_pir_api=0``, ``paddle.pir_utils.OldIrGuard``).

Paddle 2.x scripts and the legacy-only layers (``paddle.static.nn.conv2d``,
``batch_norm``, ``layer_norm``, ``embedding``) build ``paddle.base.framework.Program``
objects.  Rather than a second reader over the legacy op set, the program is
translated by Paddle's own ProgramDesc -> PIR translator
(``paddle.pir.translate_to_pir_with_param_map``, the one Paddle's executor uses
for legacy programs), and everything after that is the PIR path: the same
:class:`~paddle_ipu.compiler.pir_reader.PirReader`, op checks, lowering, optimizer
extraction and gradient program.  What the translation loses is put back here:

- fetches by variable name: the translator's name map gives each variable's
  value; the names become the compiled outputs' names;
- the loss: legacy ``minimize`` seeds the backward with ``fill_constant`` (PIR's
  with ``full_like(loss)``, which the training compiler looks for); the seed is
  rewritten to ``full_like``;
- ``ipu_index`` / ``ipu_stage`` op attributes (legacy ``ipu_shard_guard``): the
  translator drops unknown attributes, so they are carried over per variable --
  every PIR op that computes a variable of a sharded legacy op gets its placement;
- ``lr_scheduler``: the program's scheduler is kept on the translation.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.pir_reader import PirForwardGraph
from paddle_ipu.compiler.pir_values import IPU_INDEX_ATTR, IPU_STAGE_ATTR, is_dense
from paddle_ipu.errors import CompileError

# op_role of the op that seeds the backward with d(loss) = 1 (Backward | Loss).
_LOSS_SEED_ROLE = 0x0001 | 0x0100


_pir_lock = threading.Lock()
_pir_users = 0
_pir_guard: Any = None


def _pir_flag() -> bool:
    import paddle

    return bool(paddle.get_flags("FLAGS_enable_pir_api")["FLAGS_enable_pir_api"])


@contextlib.contextmanager
def pir_mode() -> Iterator[None]:
    """Paddle's PIR mode for the duration: a no-op when it is on already, else
    Paddle's IrGuard, entered by the first user and left by the last (the mode is
    process-wide, and legacy compiled programs run from several threads at once).
    While it is on, other threads building legacy programs would see PIR mode:
    build programs before compiling and running them."""
    global _pir_users, _pir_guard
    with _pir_lock:
        if _pir_users == 0 and _pir_flag():
            owner = False
        else:
            owner = True
            if _pir_users == 0:
                import paddle

                _pir_guard = paddle.pir_utils.IrGuard()
                _pir_guard.__enter__()
            _pir_users += 1
    try:
        yield
    finally:
        if owner:
            with _pir_lock:
                _pir_users -= 1
                if _pir_users == 0:
                    guard, _pir_guard = _pir_guard, None
                    guard.__exit__(None, None, None)


def is_legacy(program: Any) -> bool:
    import paddle

    legacy = getattr(getattr(paddle, "base", None), "framework", None)
    return legacy is not None and isinstance(program, legacy.Program)


def is_legacy_variable(value: Any) -> bool:
    import paddle

    legacy = getattr(getattr(paddle, "base", None), "framework", None)
    return legacy is not None and isinstance(value, legacy.Variable)


@dataclass
class Translation:
    """A legacy program as PIR, with the legacy names of its feeds and fetches."""

    program: Any
    feed_list: list[Any]
    fetch_list: list[Any]
    #: the legacy variable name of each fetch ("" when it was given as a name the
    #: PIR program knows itself: a data op or parameter)
    fetch_names: list[str]
    values: dict[str, list[Any]] = field(default_factory=dict)


def _var_name(item: Any, what: str) -> str:
    if isinstance(item, str):
        return item
    name = getattr(item, "name", None)
    if isinstance(name, str):
        return name
    raise CompileError(
        f"{what} of a legacy program holds {type(item).__name__}; expected a variable "
        "name or a paddle.static Variable"
    )


def _seed_loss(program: Any, legacy: Any, values: dict[str, list[Any]]) -> None:
    """Rewrite the legacy loss seed (``fill_constant`` of ``loss@GRAD``) as
    ``full_like(loss, 1)``, the form PIR's own ``minimize`` writes."""
    import paddle

    for op in legacy.global_block().ops:
        if op.type != "fill_constant" or int(op.attr("op_role")) != _LOSS_SEED_ROLE:
            continue
        grad = op.output_arg_names[0]
        if not grad.endswith("@GRAD"):
            continue
        loss_values = values.get(grad[: -len("@GRAD")])
        seed_values = values.get(grad)
        if not loss_values or not seed_values:
            continue
        seed = seed_values[0]
        seed_op = seed.get_defining_op()
        loss = loss_values[-1]
        try:
            paddle.pir.set_insertion_point(seed_op)
            one = paddle_api.pir_ops().full_like(
                loss, float(op.attr("value")), loss.dtype, paddle.CPUPlace()
            )
        finally:
            paddle.pir.reset_insertion_point_to_end()
        seed.replace_all_uses_with(one)
        program.global_block().remove_op(seed_op)
        values[grad] = [one]


def _bind_xshapes(program: Any, legacy: Any, values: dict[str, list[Any]]) -> None:
    """Legacy reshape-like ops (flatten_contiguous_range, reshape2, squeeze2,
    unsqueeze2, transpose2) have an ``XShape`` output that their grad op reads; PIR's
    forward ops have none, and the translator leaves a dangling ``pd_op.data`` of the
    input's shape in its place.  The grad op wants the forward input: use it."""
    block = legacy.global_block()
    producers = {
        name: op for op in block.ops if "XShape" in op.output_names for name in op.output("XShape")
    }
    for op in list(program.global_block().ops):
        if op.name() != "pd_op.data" or op.attrs().get("persistable", [False])[0]:
            continue
        name = str(op.attrs()["name"])
        forward = producers.get(name)
        if forward is None:
            continue
        outs = values.get(forward.output("Out")[0]) if forward.output("Out") else None
        pir_forward = outs[0].get_defining_op() if outs else None
        if pir_forward is None or pir_forward.num_operands() == 0:
            raise CompileError(
                f"the legacy program's {forward.type} (XShape {name!r}) has no PIR "
                "counterpart to take its input from"
            )
        source = pir_forward.operand_source(0)
        if list(source.shape) != list(op.result(0).shape):
            raise CompileError(
                f"{forward.type}'s XShape {name!r} has shape {list(op.result(0).shape)}, "
                f"its input {list(source.shape)}: cannot rebind its gradient"
            )
        op.result(0).replace_all_uses_with(source)
        program.global_block().remove_op(op)


def _carry_shards(legacy: Any, values: dict[str, list[Any]]) -> None:
    """ipu_index / ipu_stage of legacy ops onto the PIR ops computing their outputs."""
    for op in legacy.global_block().ops:
        placement = {
            attr: int(op.attr(attr))
            for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR)
            if op.has_attr(attr) and int(op.attr(attr)) >= 0
        }
        if not placement:
            continue
        for name in op.output_arg_names:
            for value in values.get(name, []):
                pir_op = value.get_defining_op()
                if pir_op is None or pir_op.name() in ("pd_op.data", "builtin.parameter"):
                    continue
                for attr, number in placement.items():
                    if not pir_op.has_attr(attr):
                        pir_op.set_int_attr(attr, number)


_DTYPE_ATTRS = ("dtype", "in_dtype", "out_dtype")


def float32_twin(program: Any) -> Any:
    """A copy of a legacy program cast by Paddle's ``cast_model_to_fp16``, in float32:
    every float16 variable declared float32, every float16 ``dtype`` / ``in_dtype`` /
    ``out_dtype`` attribute (the casts the pass inserted, constants) float32, so each
    inserted cast casts float32 to float32.  Compiled with ``enable_fp16`` it runs in
    float16 the way a PIR program marked by ``cast_model_to_fp16`` does -- which a
    training program needs: its gradient program runs on Paddle's CPU kernels, and
    Paddle has no float16 CPU kernel for convolutions.  The original is not changed."""
    fp16, fp32 = paddle_api.legacy_fp16_type(), paddle_api.legacy_fp32_type()
    twin = program.clone()
    for block in twin.blocks:
        for var in list(block.vars.values()):
            if getattr(var, "dtype", None) == fp16:
                paddle_api.set_legacy_var_dtype(var, fp32)
        for op in block.ops:
            for attr in _DTYPE_ATTRS:
                if op.has_attr(attr) and op.attr(attr) == fp16:
                    paddle_api.set_legacy_op_attr(op, attr, fp32)
    scheduler = getattr(program, "lr_scheduler", None)
    if scheduler is not None:
        twin.lr_scheduler = scheduler
    return twin


_pir_primed = False


def _prime_pir() -> None:
    """Build one PIR program before the first translation of the process.

    Paddle's translator fails with "(Fatal) The input data pointer is null" when no
    PIR program was ever built in the process (the types it needs are registered
    then), the case of a process that builds and compiles legacy programs only."""
    global _pir_primed
    if _pir_primed:
        return
    import paddle

    with pir_mode(), paddle.pir_utils.IrGuard():
        program = paddle.static.Program()
        with paddle.static.program_guard(program, paddle.static.Program()):
            paddle.static.data("prime", [1], "float32")
    _pir_primed = True


def _legacy_output_index(legacy: Any, name: str) -> int:
    """The position of variable ``name`` in the output list of the legacy op that
    writes it (``split``'s ``Out: [t0, t1, t2]``), -1 when not found."""
    for op in legacy.global_block().ops:
        for slot in op.output_names:
            names = list(op.output(slot))
            if name in names and len(names) > 1:
                return names.index(name)
    return -1


def _element(program: Any, legacy: Any, name: str, value: Any) -> Any:
    """A fetch of one output of a multi-output legacy op (``split``, ``unstack``,
    ``meshgrid``): its translation is one list value; the element is taken out of it
    with ``builtin.split`` (an existing one, or one added)."""
    import paddle

    index = _legacy_output_index(legacy, name)
    if index < 0:
        raise CompileError(
            f"fetch {name!r}: its translation is a list value ({value.type()}) and the "
            "legacy op that writes it was not found"
        )
    for user in value.all_used_ops():
        if user.name() == "builtin.split":
            return user.result(index)
    try:
        paddle.pir.set_insertion_point_after(value.get_defining_op())
        parts = paddle_api.pir_ops().builtin_split(value)
    finally:
        paddle.pir.reset_insertion_point_to_end()
    return parts[index]


#: legacy operators without a PIR counterpart -> what to use instead
_REPLACEMENTS = {
    "multiclass_nms": (
        "; PaddleDetection's later exporters write multiclass_nms3 (which runs on the host "
        "after the compiled graph): export the detector again, or with -o exclude_nms=True "
        "and NMS after the predictor"
    ),
}


def _version() -> str:
    import paddle

    return str(paddle.__version__)


def _lookup_tables_v1(program: Any) -> Any:
    """Paddle 1.x's ``lookup_table`` (ids with a last dimension of 1, which its output
    drops) as ``lookup_table_v2`` of the ids squeezed, in a copy of ``program`` (or
    ``program`` itself without one).  Paddle's translation to PIR gives the ``v1``
    operator the declared output shape and then squeezes it once more: a LAC-shaped
    ``[-1, 1]`` of word ids became ``[128]``, and the fully connected layer after it
    reshaped that to ``[128, 1]``."""
    if not any(op.type == "lookup_table" for op in program.global_block().ops):
        return program
    copy = program.clone()
    block = copy.global_block()
    for index in reversed(range(len(block.ops))):
        op = block.ops[index]
        if op.type != "lookup_table":
            continue
        ids = block.var(op.input("Ids")[0])
        if list(ids.shape)[-1:] != [1]:
            continue  # the kernel refuses it: left for Paddle to say so
        name = f"{ids.name}.squeezed.{index}"
        squeezed = block.create_var(name=name, shape=list(ids.shape)[:-1], dtype=ids.dtype)
        shape = block.create_var(name=name + ".xshape", shape=[0, *ids.shape], dtype=ids.dtype)
        attrs = {a: op.attr(a) for a in ("padding_idx", "is_sparse", "is_distributed")}
        outputs = {"Out": [block.var(op.output("Out")[0])]}
        weight = block.var(op.input("W")[0])
        paddle_api.remove_legacy_op(block, index)
        paddle_api.insert_legacy_op(
            block, index, type="lookup_table_v2", inputs={"Ids": [squeezed], "W": [weight]},
            outputs=outputs, attrs=attrs,
        )  # fmt: skip
        paddle_api.insert_legacy_op(
            block, index, type="squeeze2", inputs={"X": [ids]},
            outputs={"Out": [squeezed], "XShape": [shape]}, attrs={"axes": [-1]},
        )  # fmt: skip
    return copy


def translate(program: Any, feed_list: Sequence[Any], fetch_list: Sequence[Any]) -> Translation:
    """``program`` (legacy IR) as a PIR program, with feeds and fetches resolved."""
    import paddle

    _prime_pir()
    program = _lookup_tables_v1(program)
    try:
        pir_program, values = paddle.pir.translate_to_pir_with_param_map(program.desc)
    except Exception as exc:
        missing = re.search(r"Op (\w+) should have corresponding OpInfo (\S+)", str(exc))
        if missing:
            op, pir = missing.group(1), missing.group(2).rstrip(".")
            raise CompileError(
                f"the legacy program uses operator {op!r}, which Paddle {_version()} has no "
                f"PIR operator for ({pir} does not exist): Paddle's translation of the "
                f"program to PIR, which the IPU compiler reads it by, stops there"
                f"{_REPLACEMENTS.get(op, '')}"
            ) from exc
        raise CompileError(
            f"Paddle could not translate the legacy program to PIR: {type(exc).__name__}: {exc}"
        ) from exc
    values = {str(k): list(v) for k, v in dict(values).items()}
    block = program.global_block()
    feeds: list[Any] = []
    for item in feed_list:
        name = _var_name(item, "feed_list")
        if not block.has_var(name):
            raise CompileError(f"feed {name!r} is not a variable of the program")
        feeds.append(name)
    fetches: list[Any] = []
    fetch_names: list[str] = []
    for item in fetch_list:
        name = _var_name(item, "fetch_list")
        if not block.has_var(name):
            raise CompileError(f"fetch {name!r} is not a variable of the program")
        var = block.var(name)
        found = values.get(name)
        if var.persistable or (name in feeds and len(found or []) <= 1):
            # Parameters and data keep their names in PIR (a feed a later operator
            # writes -- a while loop's carried value -- is fetched as written last).
            fetches.append(name)
            fetch_names.append("")
            continue
        if not found:
            raise CompileError(
                f"fetch {name!r}: the legacy program's translation to PIR has no value for it"
            )
        value = found[-1]
        if not is_dense(value):
            with pir_mode():
                value = _element(pir_program, program, name, value)
        fetches.append(value)
        fetch_names.append(name)
    _seed_loss(pir_program, program, values)
    _bind_xshapes(pir_program, program, values)
    _carry_shards(program, values)
    # the seed's replacement may have been fetched (rare); refresh the fetch values
    scheduler = getattr(program, "lr_scheduler", None)
    if scheduler is not None:
        pir_program.lr_scheduler = scheduler
    return Translation(pir_program, feeds, fetches, fetch_names, values)


_CONTROL_FLOW = frozenset({"while", "conditional_block", "conditional_block_infer"})


def specialised_copy(
    program: Any, feed_list: Sequence[Any], shapes: Mapping[str, Sequence[int]], batch: int
) -> Any:
    """A copy of the legacy ``program`` whose feeds have ``shapes`` (feed name -> full
    shape; the batch, an open first dimension, stays open) and whose every variable has
    the shape Paddle's own shape inference (each operator's InferShape) gives it.  The
    legacy counterpart of :func:`paddle_ipu.compiler.specialise.specialise`, and exact
    where that one cannot be: a legacy program's declared shapes can be stale (a slice
    declared ``[1]`` that is 0-d), and the translation to PIR reads them."""
    from paddle_ipu.compiler.specialise import check_shapes

    copy = program.clone()
    block = copy.global_block()
    names = [_var_name(item, "feed_list") for item in feed_list]
    declared = {n: tuple(int(d) for d in block.var(n).shape) for n in names if block.has_var(n)}
    wanted = {}
    for name, shape in shapes.items():
        full = [int(d) for d in shape]
        if name in declared and declared[name] and declared[name][0] < 0 and full[0] < 0:
            full[0] = batch
        wanted[name] = full
    given = check_shapes(declared, wanted)
    for name, shape in given.items():
        keep_batch = declared[name] and declared[name][0] < 0
        block.var(name).desc.set_shape([-1, *shape[1:]] if keep_batch else list(shape))
    for op in block.ops:
        if op.type in ("feed", "fetch"):
            continue
        try:
            op.desc.infer_shape(block.desc)
        except Exception as exc:
            shown = {n: list(s) for n, s in given.items()}
            raise CompileError(
                f"the program does not take input shapes {shown}: Paddle's shape inference "
                f"of operator {op.type!r} refused them ({type(exc).__name__}: "
                f"{str(exc).strip()[:600]}); give shapes the model takes"
            ) from exc
    return copy


@dataclass
class LegacyForwardGraph(PirForwardGraph):
    """A PirForwardGraph of a translated legacy program, written in PIR mode."""

    #: the whole translated program (what the compiler reads index ranges from)
    pir_source: Any = None

    def write_inference_model(
        self, directory: str, placeholders: Collection[str] = ()
    ) -> tuple[str, str]:
        with pir_mode():
            return super().write_inference_model(directory, placeholders)


class LegacyReader:
    """The ProgramReader for legacy-IR programs: translate, then read as PIR."""

    def __init__(self) -> None:
        self.translation: Translation | None = None

    def read(
        self,
        program: Any,
        feed_list: Sequence[Any],
        fetch_list: Sequence[Any],
        scope: Any = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        batch: int = 1,
        lod: Any = None,
    ) -> PirForwardGraph:
        import dataclasses

        from paddle_ipu.compiler.pir_reader import PirReader

        # Paddle's InferShape knows no control flow: a program with loops or branches is
        # made static through its PIR translation instead (specialise's CPU runs)
        flow = any(op.type in _CONTROL_FLOW for op in program.global_block().ops)
        shapes: Mapping[str, Sequence[int]] | None = None if input_shapes is None else {}
        if input_shapes and flow:
            shapes = input_shapes
        elif input_shapes:
            program = specialised_copy(program, feed_list, input_shapes, batch)
        translation = translate(program, feed_list, fetch_list)
        self.translation = translation
        with pir_mode():
            graph = PirReader().read(
                translation.program,
                translation.feed_list,
                translation.fetch_list,
                scope,
                shapes,  # specialised above, if asked (and without control flow)
                batch,
                lod,
            )
        fields = {f.name: getattr(graph, f.name) for f in dataclasses.fields(graph)}
        fields["fetches"] = [
            dataclasses.replace(info, paddle_name=name) if name else info
            for info, name in zip(graph.fetches, translation.fetch_names)
        ]
        return LegacyForwardGraph(**fields, pir_source=translation.program)


@contextlib.contextmanager
def legacy_shard_guard(index: int = -1, stage: int = -1) -> Iterator[None]:
    """``ipu_shard_guard`` for legacy-IR programs: the ops created inside get the
    ``ipu_index`` / ``ipu_stage`` attributes Paddle 2.x set (the innermost guard that
    sets a value wins); :func:`translate` carries them over to PIR."""
    import paddle

    program = paddle.static.default_main_program()
    block = program.current_block()
    before = len(block.ops)
    try:
        yield
    finally:
        for op in list(block.ops)[before:]:
            for attr, number in ((IPU_INDEX_ATTR, index), (IPU_STAGE_ATTR, stage)):
                if number >= 0 and not op.has_attr(attr):
                    paddle_api.set_legacy_op_attr(op, attr, number)
