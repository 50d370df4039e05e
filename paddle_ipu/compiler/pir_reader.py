"""Reading a PIR program (Paddle 3.x's default IR) into a ForwardGraph.

The program is cloned, so the caller's program is never modified.  On the
clone: fetch ops are dropped, everything the fetches do not depend on (the
backward pass, optimizer updates, metrics) is pruned, ``is_test`` is set, and
the few operator forms paddle2onnx cannot convert but that have an equivalent
it can are rewritten.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import paddle

from paddle_ipu._internals import p2o_api, paddle_api
from paddle_ipu.compiler import custom_ops
from paddle_ipu.compiler.ops import CONTROL_FLOW, STRUCTURAL_OPS, OpUse
from paddle_ipu.compiler.pir_values import (
    HINT_ATTRS,
    IPU_INDEX_ATTR,
    IPU_STAGE_ATTR,
    dense_type,
    dtype_name,
    has_name,
    is_real,
    nested_ops,
    op_hints,
    op_int_attr,
    plain_attrs,
    reads,
    shape_of,
    type_desc,
)
from paddle_ipu.compiler.program_rewrites import rewrite_for_converter
from paddle_ipu.compiler.reader import FeedInfo, FetchInfo, OpInfo
from paddle_ipu.compiler.sequence_rewrites import (
    GRU_MARK,
    LENGTHS_FEED,
    LodLayout,
    Padded,
    add_lengths_feed,
    check_row_wise,
)
from paddle_ipu.compiler.specialise import specialise
from paddle_ipu.errors import CompileError

_DATA_OPS = ("pd_op.data", "pd_op.feed")


@dataclass
class PirForwardGraph:
    feeds: list[FeedInfo]
    fetches: list[FetchInfo]
    ops: list[OpInfo]
    parameters: dict[str, tuple[tuple[int, ...], str]]
    program: Any = None
    feed_values: list[Any] = field(default_factory=list)
    fetch_values: list[Any] = field(default_factory=list)
    scope: Any = None

    def write_inference_model(
        self, directory: str, placeholders: Collection[str] = ()
    ) -> tuple[str, str]:
        prefix = os.path.join(directory, "model")
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = self.scope if self.scope is not None else paddle.static.global_scope()
        _fill_empty_parameters(scope, self.parameters)
        saved_from = _placeholder_scope(scope, self.parameters, placeholders)
        try:
            with paddle.static.scope_guard(saved_from if saved_from is not None else scope):
                paddle.static.save_inference_model(
                    prefix,
                    self.feed_values,
                    self.fetch_values,
                    exe,
                    program=self.program,
                )
        except Exception as exc:
            missing = [
                name
                for name in self.parameters
                if scope.find_var(name) is None
                or not paddle_api.is_initialized(scope.find_var(name).get_tensor())
            ]
            hint = (
                f"; parameters without a value in the scope: {', '.join(missing)} "
                "(run the startup program first)"
                if missing
                else ""
            )
            raise CompileError(f"could not serialise the forward program: {exc}{hint}") from exc
        finally:
            if saved_from is not None:
                # Paddle keeps every Scope made from Python until the process exits
                saved_from.erase(saved_from.local_var_names())
        params = prefix + ".pdiparams"
        # A program without parameters is saved without a parameter file; the
        # converter reads an empty path as "no parameters".
        return prefix + ".json", params if os.path.exists(params) else ""


def _placeholder_scope(
    scope: Any, parameters: dict[str, tuple[tuple[int, ...], str]], placeholders: Collection[str]
) -> Any:
    """A scope to save the program from: the parameters named in ``placeholders`` as
    one element (every dimension 1), the others sharing the scope's tensors (no
    copy).  None when there are no placeholders (save from ``scope`` itself)."""
    import numpy as np

    if not placeholders:
        return None
    out = paddle.static.Scope()
    for name, (shape, dtype) in parameters.items():
        var = scope.find_var(name)
        if name in placeholders:
            out.var(name).get_tensor().set(
                np.zeros((1,) * len(shape), np.dtype(dtype)), paddle.CPUPlace()
            )
        elif var is not None and paddle_api.is_initialized(var.get_tensor()):
            paddle_api.share_data(out.var(name).get_tensor(), var.get_tensor())
    return out


def _fill_empty_parameters(scope: Any, parameters: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Give zero-element parameters that have no buffer an empty CPU tensor.

    ``paddle.nn.LSTM`` / ``GRU`` declare a ``dropout_state`` parameter of shape
    ``[0]``.  The startup program run on the ipu place leaves it without a buffer
    (a zero-byte allocation), and the serialiser then refuses the whole program.
    An empty tensor is exactly what the same startup program leaves on the CPU;
    no operator reads a value from it at inference."""
    import numpy as np

    for name, (shape, dtype) in parameters.items():
        if 0 not in shape:
            continue
        var = scope.find_var(name)
        if var is None or paddle_api.is_initialized(var.get_tensor()):
            continue
        try:
            np_dtype = np.dtype(dtype)
        except TypeError:
            continue
        var.get_tensor().set(np.zeros(shape, np_dtype), paddle.CPUPlace())


class PirReader:
    """The ProgramReader for PIR programs."""

    def read(
        self,
        program: Any,
        feed_list: Sequence[Any],
        fetch_list: Sequence[Any],
        scope: Any = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        batch: int = 1,
        lod: LodLayout | None = None,
    ) -> PirForwardGraph:
        if not fetch_list:
            raise CompileError("fetch_list is empty: nothing to compile")
        block = program.global_block()
        feed_values = [_resolve_feed(block, f) for f in feed_list]
        feed_names = [str(v.get_defining_op().attrs()["name"]) for v in feed_values]
        if len(set(feed_names)) != len(feed_names):
            raise CompileError(f"feed_list names a feed twice: {feed_names}")
        fetch_values, fetch_names = zip(*(resolve_fetch(block, f) for f in fetch_list))
        own_ops = {op.id() for op in block.ops}
        for value, given in zip(fetch_values, fetch_list):
            if value.get_defining_op().id() not in own_ops:
                raise CompileError(f"fetch {given!r} is a value of another program")

        mapping = paddle.pir.IrMapping()
        clone = program.clone(mapping)
        cfeeds = [mapping.look_up(v) for v in feed_values]
        cfetches = [mapping.look_up(v) for v in fetch_values]
        cblock = clone.global_block()
        _prune(cblock, cfetches, {v.get_defining_op().id() for v in cfeeds})
        _set_is_test(cblock)
        if input_shapes is not None:
            specialise(cblock, dict(zip(feed_names, cfeeds)), input_shapes, scope, batch)
        padded = None
        if lod is not None:  # sequences padded into a batch, with their lengths
            missing = sorted(set(lod.feeds) - set(feed_names))
            if missing:
                raise CompileError(f"the LoD feeds {missing} are not in feed_list {feed_names}")
            check_row_wise(cblock, lod, dict(zip(feed_names, cfeeds)))
            lengths = add_lengths_feed(clone, lod)
            padded = Padded(lengths, batch // lod.sequences)
            cfeeds.append(lengths)
            feed_names.append(LENGTHS_FEED)
        replaced = rewrite_for_converter(cblock, padded=padded)
        cfetches = [replaced.get(v.id, v) for v in cfetches]
        # what a rewrite left unread (a fully connected layer a gru took over) goes, as
        # Paddle's save drops it: the converter numbers the operators it is given
        _prune(cblock, cfetches, {v.get_defining_op().id() for v in cfeeds})

        kept_ids = {op.id() for op in cblock.ops}
        used = [v.get_defining_op().id() in kept_ids and not v.use_empty() for v in cfeeds]
        feed_op_ids = {v.get_defining_op().id() for v in cfeeds}
        stray = [
            str(op.attrs()["name"])
            for op in cblock.ops
            if op.name() in _DATA_OPS and op.id() not in feed_op_ids
        ]
        if stray:
            raise CompileError(
                f"the fetches depend on data that is not in feed_list: {', '.join(stray)}"
            )

        ops, index_of = _describe_ops(cblock, cfetches, fetch_names)
        # Placement lives in OpInfo now; the serialiser rejects unknown attributes
        # on some operators, so the clone drops them.
        # So does the mark of a gru's stand-in, which OpInfo keeps for the converter fix.
        for op in cblock.ops:
            for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR, GRU_MARK, *HINT_ATTRS, *custom_ops.ATTRS):
                if op.has_attr(attr):
                    op.erase_attr(attr)
        fetches: list[FetchInfo] = []
        for i, (value, name) in enumerate(zip(cfetches, fetch_names)):
            op = value.get_defining_op()
            producer = index_of.get(op.id(), -1)
            if producer >= 0:
                info = ops[producer]
                base = info.type.split(".", 1)[-1]
                default = f"{base}_{info.onnx_names[0].split('.')[-2]}"
                if value.index() > 0:
                    default += f".{value.index()}"
            else:
                default = f"fetch_{i}"
            fetches.append(
                FetchInfo(
                    paddle_name=name,
                    default_name=default,
                    dtype=dtype_name(value),
                    shape=shape_of(value),
                    producer=producer,
                    result=int(value.index()),
                )
            )
        feeds = [
            FeedInfo(name=n, dtype=dtype_name(v), shape=shape_of(v), used=u)
            for n, v, u in zip(feed_names, cfeeds, used)
        ]
        parameters = {
            str(op.attrs()["parameter_name"]): (shape_of(op.result(0)), dtype_name(op.result(0)))
            for op in cblock.ops
            if op.name() == "builtin.parameter"
        }
        return PirForwardGraph(
            feeds=feeds,
            fetches=fetches,
            ops=ops,
            parameters=parameters,
            program=clone,
            feed_values=[v for v, u in zip(cfeeds, used) if u],
            fetch_values=list(cfetches),
            scope=scope,
        )


def _data_ops(block: Any) -> dict[str, Any]:
    return {str(op.attrs()["name"]): op for op in block.ops if op.name() in _DATA_OPS}


def _resolve_feed(block: Any, feed: Any) -> Any:
    if isinstance(feed, str):
        op = _data_ops(block).get(feed)
        if op is None:
            raise CompileError(
                f"feed {feed!r} is not a data op of the program "
                f"(data ops: {', '.join(sorted(_data_ops(block))) or 'none'})"
            )
        return op.result(0)
    if isinstance(feed, paddle.pir.Value):
        op = feed.get_defining_op()
        if op is None or op.name() not in _DATA_OPS:
            raise CompileError("a feed must be the output of paddle.static.data")
        return feed
    raise CompileError(f"feed_list holds {type(feed).__name__}; expected str or pir.Value")


def resolve_fetch(block: Any, fetch: Any) -> tuple[Any, str]:
    """A fetch (a Value, or the name of a fetch op, data op or parameter) as
    (Value, name); the one resolver of the compiler."""
    if isinstance(fetch, paddle.pir.Value):
        return fetch, (str(fetch.name) if has_name(fetch) else "")
    if not isinstance(fetch, str):
        raise CompileError(f"fetch_list holds {type(fetch).__name__}; expected str or pir.Value")
    for op in block.ops:
        if op.name() == "pd_op.fetch" and op.attrs().get("name") == fetch:
            return op.operand_source(0), fetch
    data = _data_ops(block).get(fetch)
    if data is not None:
        return data.result(0), fetch
    for op in block.ops:
        if op.name() == "builtin.parameter" and op.attrs().get("parameter_name") == fetch:
            return op.result(0), fetch
    raise CompileError(
        f"fetch {fetch!r} names no fetch op, data op or parameter of the program; "
        "pass the pir.Value instead"
    )


def _prune(block: Any, targets: Sequence[Any], keep: set[int]) -> None:
    """Remove every op the targets do not depend on (data ops in ``keep`` stay)."""
    needed = {v.id for v in targets}
    ops = list(block.ops)
    alive = [False] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.name() == "pd_op.fetch":
            continue
        if op.id() in keep or any(r.id in needed for r in op.results()):
            alive[i] = True
            for src in reads(op):  # a loop body's captured values too
                needed.add(src.id)
    for i in range(len(ops) - 1, -1, -1):
        if not alive[i]:
            block.remove_op(ops[i])


def _set_is_test(block: Any) -> None:
    for op in block.ops:
        if op.has_attr("is_test"):
            op.set_bool_attr("is_test", True)


def _value_desc(value: Any, producers: dict[int, tuple[int, str]]) -> str:
    if has_name(value):
        label = str(value.name)
    else:
        op = value.get_defining_op()
        idx, typ = producers.get(op.id(), (-1, op.name())) if op is not None else (-1, "?")
        label = f"{typ}#{idx}:{value.index()}" if idx >= 0 else f"{typ}:{value.index()}"
    return f"{label} {type_desc(value)}"


def _source(value: Any, index_of: dict[int, int]) -> tuple[int, int] | str | None:
    """Where an operand comes from, in the terms the ONNX corrections use."""
    if not is_real(value):
        return None
    op = value.get_defining_op()
    if op is None:
        return "?"
    if op.name() in _DATA_OPS:
        return str(op.attrs()["name"])
    if op.name() == "builtin.parameter":
        return str(op.attrs()["parameter_name"])
    idx = index_of.get(op.id(), -1)
    return (idx, int(value.index())) if idx >= 0 else "?"


def _custom_attrs(op: Any) -> dict[str, Any]:
    """The custom-op region marks of ``op`` (:mod:`.custom_ops`) by attribute name."""
    if not op.has_attr(custom_ops.REGION_ATTR):
        return {}
    attrs = op.attrs()
    return {name: attrs[name] for name in custom_ops.ATTRS if name in attrs}


def _describe_op(
    op: Any, idx: int, k: int, producers: dict[int, tuple[int, str]], index_of: dict[int, int]
) -> OpInfo:
    name = op.name()
    operands = list(op.operands_source())
    use = OpUse(
        index=idx,
        op=name,
        operands=[_value_desc(v, producers) if is_real(v) else "None" for v in operands],
        results=[type_desc(r) for r in op.results()],
        attrs=plain_attrs(op),
        sources=[_source(v, index_of) for v in operands],
        operand_types=[dense_type(v) for v in operands],
        result_types=[dense_type(r) for r in op.results()],
    )
    if op.name() in CONTROL_FLOW:
        use.nested = [_nested_use(inner, idx, name) for inner in nested_ops(op)]
    return OpInfo(
        use=use,
        onnx_names=[p2o_api.result_name(name, k, j) for j in range(op.num_results())],
        ipu_index=op_int_attr(op, IPU_INDEX_ATTR),
        ipu_stage=op_int_attr(op, IPU_STAGE_ATTR),
        hints=op_hints(op),
        custom=_custom_attrs(op),
    )


def _nested_use(op: Any, idx: int, parent: str) -> OpUse:
    """An operator of a control-flow operator's block, for the checks."""
    operands = list(op.operands_source())
    return OpUse(
        index=idx,
        op=op.name(),
        operands=[type_desc(v) if is_real(v) else "None" for v in operands],
        results=[type_desc(r) for r in op.results()],
        attrs=plain_attrs(op),
        operand_types=[dense_type(v) for v in operands],
        result_types=[dense_type(r) for r in op.results()],
        inside=f"op #{idx} {parent}",
    )


def _describe_ops(
    block: Any, fetches: Sequence[Any], fetch_names: Sequence[str]
) -> tuple[list[OpInfo], dict[int, int]]:
    """OpInfo for every non-structural op, in order, with the converter's result names."""
    counters: dict[str, int] = {}
    infos: list[OpInfo] = []
    index_of: dict[int, int] = {}
    producers: dict[int, tuple[int, str]] = {}
    for op in block.ops:
        name = op.name()
        if name in STRUCTURAL_OPS:
            continue
        k = counters.get(name, 0)
        counters[name] = k + 1
        idx = len(infos)
        try:
            info = _describe_op(op, idx, k, producers, index_of)
        except Exception as exc:
            # Paddle raises bare ValueErrors for values it cannot describe; the
            # user needs to know which operator of their program it was.
            raise CompileError(
                f"could not read op #{idx} {name} of the program: {type(exc).__name__}: {exc}"
            ) from exc
        index_of[op.id()] = idx
        producers[op.id()] = (idx, name)
        infos.append(info)
    # Which fetches each op contributes to, for error messages.
    reach: dict[int, set[str]] = {}
    for i, (value, name) in enumerate(zip(fetches, fetch_names)):
        label = repr(name) if name else f"#{i}"
        stack = [value]
        seen: set[int] = set()
        while stack:
            v = stack.pop()
            op = v.get_defining_op()
            if op is None or op.id() in seen:
                continue
            seen.add(op.id())
            reach.setdefault(op.id(), set()).add(label)
            stack.extend(reads(op))
    fetched = {v.id for v in fetches}
    for op in block.ops:
        idx = index_of.get(op.id(), -1)
        if idx >= 0:
            infos[idx].use.feeds_fetches = sorted(reach.get(op.id(), set()))
            infos[idx].use.results_used = [
                r.id in fetched or not r.use_empty() for r in op.results()
            ]
    return infos, index_of
