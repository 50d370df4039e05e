"""Reading a PIR program (Paddle 3.x's default IR) into a ForwardGraph.

The program is cloned, so the caller's program is never modified.  On the
clone: fetch ops are dropped, everything the fetches do not depend on (the
backward pass, optimizer updates, metrics) is pruned, ``is_test`` is set, and
the few operator forms paddle2onnx cannot convert but that have an equivalent
it can are rewritten.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import paddle

from paddle_ipu import dtypes
from paddle_ipu._internals import p2o_api, paddle_api
from paddle_ipu.compiler.ops import STRUCTURAL_OPS, OpUse
from paddle_ipu.compiler.reader import FeedInfo, FetchInfo, OpInfo
from paddle_ipu.errors import CompileError, FeedError, UnsupportedOpError

_DATA_OPS = ("pd_op.data", "pd_op.feed")
# Reductions whose "all axes" form (an empty axis list) the converter cannot
# read; the same reduction over every axis, spelled out, converts fine.
_REDUCTIONS = frozenset(
    {"pd_op.mean", "pd_op.sum", "pd_op.max", "pd_op.min", "pd_op.prod", "pd_op.all", "pd_op.any"}
)

_PIR_OPS: Any = paddle_api.pir_ops()

IPU_INDEX_ATTR = "ipu_index"
IPU_STAGE_ATTR = "ipu_stage"


def _is_dense(value: Any) -> bool:
    """True for a value of a dense tensor type; False for the list values of
    ``builtin.combine`` / ``builtin.split``, tensor arrays and null types, whose
    ``dtype`` and ``shape`` Paddle refuses with a bare ValueError."""
    try:
        return bool(value.is_dense_tensor_type())
    except Exception:
        return False


def _type_text(value: Any) -> str:
    try:
        return str(value.type())
    except Exception:
        return "?"


def dtype_name(value: Any) -> str:
    """numpy spelling of a PIR value's dtype (``paddle.float32`` -> ``float32``)."""
    if not _is_dense(value):
        return _type_text(value)
    return dtypes.name_of(value.dtype)


def _shape(value: Any) -> tuple[int, ...]:
    if not _is_dense(value):
        return ()
    try:
        return tuple(int(d) for d in value.shape)
    except Exception:
        return ()


def _dense_type(value: Any) -> tuple[str, tuple[int, ...]] | None:
    if not _is_real(value) or not _is_dense(value):
        return None
    return dtype_name(value), _shape(value)


def _type_desc(value: Any) -> str:
    """``float32[3, 4]`` for a dense tensor, Paddle's own type text otherwise."""
    if not _is_dense(value):
        return _type_text(value)
    return f"{dtype_name(value)}{list(_shape(value))}"


# Attribute values that are not plain data (places, dtypes, op call stacks)
# are kept as their text; the checks and corrections only read numbers,
# booleans and strings.
_SKIPPED_ATTRS = frozenset({"op_callstack", "stop_gradient", "struct_name", "persistable"})


def _plain_attrs(op: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        attrs = op.attrs()
    except Exception:
        return out
    for key, value in attrs.items():
        if key in _SKIPPED_ATTRS:
            continue
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(
            isinstance(v, (bool, int, float, str)) for v in value
        ):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


def _has_name(value: Any) -> bool:
    try:
        return bool(value.has_name)
    except Exception:
        return False


def _is_real(value: Any) -> bool:
    """False for the null value PIR puts in an optional operand left empty."""
    try:
        return bool(value.initialized())
    except Exception:
        return False


def _op_int_attr(op: Any, name: str) -> int:
    if not op.has_attr(name):
        return -1
    try:
        return int(op.attrs()[name])
    except Exception:
        return -1


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
    ) -> PirForwardGraph:
        if not fetch_list:
            raise CompileError("fetch_list is empty: nothing to compile")
        block = program.global_block()
        feed_values = [_resolve_feed(block, f) for f in feed_list]
        feed_names = [str(v.get_defining_op().attrs()["name"]) for v in feed_values]
        if len(set(feed_names)) != len(feed_names):
            raise FeedError(f"feed_list names a feed twice: {feed_names}")
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
        with _insertion_guard():
            replaced = _rewrite_empty_axis_reductions(cblock)
            replaced.update(_rewrite_softplus(cblock))
            replaced.update(_rewrite_interp_scale(cblock))
            replaced.update(_rewrite_adaptive_pools(cblock))
        cfetches = [replaced.get(v.id, v) for v in cfetches]

        kept_ids = {op.id() for op in cblock.ops}
        used = [v.get_defining_op().id() in kept_ids and not v.use_empty() for v in cfeeds]
        feed_op_ids = {v.get_defining_op().id() for v in cfeeds}
        stray = [
            str(op.attrs()["name"])
            for op in cblock.ops
            if op.name() in _DATA_OPS and op.id() not in feed_op_ids
        ]
        if stray:
            raise FeedError(
                f"the fetches depend on data that is not in feed_list: {', '.join(stray)}"
            )

        ops, index_of = _describe_ops(cblock, cfetches, fetch_names)
        # Placement lives in OpInfo now; the serialiser rejects unknown attributes
        # on some operators, so the clone drops them.
        for op in cblock.ops:
            for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR):
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
                    shape=_shape(value),
                    producer=producer,
                    result=int(value.index()),
                )
            )
        feeds = [
            FeedInfo(name=n, dtype=dtype_name(v), shape=_shape(v), used=u)
            for n, v, u in zip(feed_names, cfeeds, used)
        ]
        parameters = {
            str(op.attrs()["parameter_name"]): (_shape(op.result(0)), dtype_name(op.result(0)))
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
            raise FeedError(
                f"feed {feed!r} is not a data op of the program "
                f"(data ops: {', '.join(sorted(_data_ops(block))) or 'none'})"
            )
        return op.result(0)
    if isinstance(feed, paddle.pir.Value):
        op = feed.get_defining_op()
        if op is None or op.name() not in _DATA_OPS:
            raise FeedError("a feed must be the output of paddle.static.data")
        return feed
    raise FeedError(f"feed_list holds {type(feed).__name__}; expected str or pir.Value")


def resolve_fetch(block: Any, fetch: Any) -> tuple[Any, str]:
    """A fetch (a Value, or the name of a fetch op, data op or parameter) as
    (Value, name); the one resolver of the compiler."""
    if isinstance(fetch, paddle.pir.Value):
        return fetch, (str(fetch.name) if _has_name(fetch) else "")
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
            for src in op.operands_source():
                if _is_real(src):
                    needed.add(src.id)
    for i in range(len(ops) - 1, -1, -1):
        if not alive[i]:
            block.remove_op(ops[i])


def _set_is_test(block: Any) -> None:
    for op in block.ops:
        if op.has_attr("is_test"):
            op.set_bool_attr("is_test", True)


@contextlib.contextmanager
def _insertion_guard() -> Iterator[None]:
    try:
        yield
    finally:
        paddle.pir.reset_insertion_point_to_end()


def _rewrite_empty_axis_reductions(block: Any) -> dict[int, Any]:
    """``mean(x, axis=[])`` -> ``mean(x, axis=[0, .., rank-1])`` (same for other reductions).

    A reduction of a 0-D tensor (``paddle.mean`` of a loss that is already a mean) is
    the tensor itself: its uses take the input instead.  Returns old value id -> the
    value that replaces it."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in _REDUCTIONS or op.num_operands() < 2:
            continue
        axis_op = op.operand_source(1).get_defining_op()
        if axis_op is None or axis_op.name() != "pd_op.full_int_array":
            continue
        if list(axis_op.attrs().get("value", [None])) != []:
            continue
        rank = len(_shape(op.operand_source(0)))
        if rank == 0:
            source, result = op.operand_source(0), op.result(0)
            if dtype_name(source) == dtype_name(result) and not _shape(result):
                replaced[result.id] = source
                result.replace_all_uses_with(source)
                block.remove_op(op)
                if axis_op.result(0).use_empty():
                    block.remove_op(axis_op)
            continue
        paddle.pir.set_insertion_point(op)
        axes = _PIR_OPS.full_int_array(list(range(rank)), paddle.int64, paddle.CPUPlace())
        op.operand(1).set_source(axes)
        if axis_op.result(0).use_empty():
            block.remove_op(axis_op)
    return replaced


def _rewrite_softplus(block: Any) -> dict[int, Any]:
    """``softplus(x, beta, threshold)`` -> the same formula in operators that lower.

    paddle2onnx aborts on every PIR softplus (it checks beta and threshold
    against attributes it cannot read).  Paddle's kernel computes
    ``x if beta * x > threshold else log(1 + exp(beta * x)) / beta``; so does
    this.  Returns old result id -> new value, for the fetches.
    """
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() != "pd_op.softplus":
            continue
        attrs = op.attrs()
        beta = float(attrs.get("beta", 1.0))
        threshold = float(attrs.get("threshold", 20.0))
        x = op.operand_source(0)
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        xb = _PIR_OPS.scale(x, beta, 0.0, True)
        soft = _PIR_OPS.scale(
            _PIR_OPS.log(_PIR_OPS.scale(_PIR_OPS.exp(xb), 1.0, 1.0, True)), 1.0 / beta, 0.0, True
        )
        limit = _PIR_OPS.full_like(xb, threshold, x.dtype, paddle.CPUPlace())
        out = _PIR_OPS.where(_PIR_OPS.greater_than(xb, limit), x, soft)
        for new_op in block.ops:
            if new_op.id() in before:
                continue
            for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR):
                if op.has_attr(attr):
                    new_op.set_int_attr(attr, _op_int_attr(op, attr))
        old = op.result(0)
        replaced[old.id] = out
        old.replace_all_uses_with(out)
        block.remove_op(op)
    return replaced


_INTERPS = frozenset(
    {
        "pd_op.linear_interp",
        "pd_op.bilinear_interp",
        "pd_op.trilinear_interp",
        "pd_op.nearest_interp",
        "pd_op.bicubic_interp",
    }
)


def _copy_placement(block: Any, op: Any, before: set[int]) -> None:
    for new_op in block.ops:
        if new_op.id() in before:
            continue
        for attr in (IPU_INDEX_ATTR, IPU_STAGE_ATTR):
            if op.has_attr(attr):
                new_op.set_int_attr(attr, _op_int_attr(op, attr))


def _rewrite_interp_scale(block: Any) -> dict[int, Any]:
    """``interpolate(x, scale_factor=s)`` -> ``interpolate(x, size=in * s)``.

    paddle2onnx cannot read the ``scale`` attribute (stored as doubles, read as
    floats) and stops.  Paddle samples a scaled output at ``1 / s``; the size form
    samples at ``in / out``, which is the same number when ``in * s`` is a whole
    number.  Any other case (a fractional ``in * s``, an unknown spatial size) is
    refused by name rather than approximated."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in _INTERPS:
            continue
        attrs = op.attrs()
        scale = [float(v) for v in attrs.get("scale", [])]
        if not scale or any(_is_real(op.operand_source(i)) for i in range(1, op.num_operands())):
            continue
        x = op.operand_source(0)
        shape = _shape(x)
        fmt = str(attrs.get("data_format", "NCHW"))
        spatial = list(shape[1:-1] if fmt.endswith("C") and fmt != "NC" else shape[2:])
        if len(scale) == 1:
            scale = scale * len(spatial)
        sizes = [d * s for d, s in zip(spatial, scale)]
        # Paddle's own output size (it rounds in float32) must be that whole number.
        result_shape = _shape(op.result(0))
        declared = list(result_shape[1:-1] if fmt.endswith("C") else result_shape[2:])
        bad = len(scale) != len(spatial) or any(
            d < 0 or s <= 0 or abs(v - round(v)) > 1e-9 or o != round(v)
            for d, s, v, o in zip(spatial, scale, sizes, declared)
        )
        if bad:
            raise UnsupportedOpError(
                f"{op.name()} with scale_factor={scale} on an input of spatial size "
                f"{spatial}: only a scale that gives a whole output size on a known input "
                "size lowers exactly; pass size= instead"
            )
        out = [round(v) for v in sizes]
        out_d, out_h, out_w = ([-1] * (3 - len(out)) + out)[-3:]
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        fn = getattr(_PIR_OPS, op.name().split(".", 1)[1])
        new = fn(
            x,
            None,
            None,
            None,
            fmt,
            out_d,
            out_h,
            out_w,
            [],
            str(attrs.get("interp_method", "")),
            bool(attrs.get("align_corners", False)),
            int(attrs.get("align_mode", 1)),
        )
        _copy_placement(block, op, before)
        old = op.result(0)
        replaced[old.id] = new
        old.replace_all_uses_with(new)
        block.remove_op(op)
    return replaced


_ADAPTIVE_POOLS = frozenset({"pd_op.pool2d", "pd_op.max_pool2d_with_index"})


def _adaptive_bins(size_in: int, size_out: int) -> list[tuple[int, int]]:
    """Paddle's adaptive bins: ``[floor(i * in / out), ceil((i + 1) * in / out))``."""
    return [
        ((i * size_in) // size_out, -((-(i + 1) * size_in) // size_out)) for i in range(size_out)
    ]


def _adaptive_matrix(size_in: int, size_out: int) -> Any:
    """[size_out, size_in]: row i averages adaptive bin i."""
    import numpy as np

    m = np.zeros((size_out, size_in), dtype=np.float64)
    for i, (start, end) in enumerate(_adaptive_bins(size_in, size_out)):
        m[i, start:end] = 1.0 / (end - start)
    return m


def _rewrite_adaptive_pools(block: Any) -> dict[int, Any]:
    """Adaptive average pooling whose output size does not divide the input size.

    paddle2onnx lowers every adaptive pool to a fixed-window pool with stride
    ``in // out``: right when ``out`` divides ``in``, wrong numbers otherwise, and
    a zero stride (a division by zero that kills the process in ONNX shape
    inference) when ``out > in``.  Paddle's bins overlap and vary in size there;
    an average over bins is separable, so it is two matrix products with constant
    bin matrices (rows, then columns); a maximum over bins is separable too (a
    slice and a reduction per bin).  Other layouts and unknown sizes are refused by
    name."""
    replaced: dict[int, Any] = {}
    for op in list(block.ops):
        if op.name() not in _ADAPTIVE_POOLS or not bool(op.attrs().get("adaptive", False)):
            continue
        attrs = op.attrs()
        if op.name() == "pd_op.pool2d":
            size_op = op.operand_source(1).get_defining_op()
            if size_op is None or size_op.name() != "pd_op.full_int_array":
                continue
            out_hw = [int(v) for v in size_op.attrs().get("value", [])]
        else:  # max_pool2d_with_index: always max, the size is an attribute
            size_op = None
            out_hw = [int(v) for v in attrs.get("kernel_size", [])]
        x = op.operand_source(0)
        shape = _shape(x)
        fmt = str(attrs.get("data_format", "NCHW"))
        if len(shape) != 4 or len(out_hw) != 2:
            continue
        in_hw = list(shape[1:3] if fmt == "NHWC" else shape[2:4])
        out_hw = [i if o == -1 else o for i, o in zip(in_hw, out_hw)]  # -1 keeps the size
        if all(i >= 0 and o > 0 and i % o == 0 for i, o in zip(in_hw, out_hw)):
            continue  # the converter's fixed window is exact
        kind = str(attrs.get("pooling_type", "max"))
        if op.name() == "pd_op.max_pool2d_with_index" and not op.result(1).use_empty():
            continue  # the mask is refused by name (ops.attribute_problem)
        if kind not in ("avg", "max") or fmt != "NCHW" or any(i < 0 for i in in_hw):
            raise UnsupportedOpError(
                f"{op.name()} with adaptive=True, pooling_type={kind!r}, "
                f"data_format={fmt!r}: output size {out_hw} does not divide the input size "
                f"{in_hw}; only adaptive pooling in NCHW with a known input size lowers "
                "exactly there"
            )
        before = {o.id() for o in block.ops}
        paddle.pir.set_insertion_point(op)
        if kind == "avg":
            dtype = dtype_name(x)
            rows = paddle.assign(_adaptive_matrix(in_hw[0], out_hw[0]).astype(dtype))
            cols = paddle.assign(_adaptive_matrix(in_hw[1], out_hw[1]).T.astype(dtype).copy())
            new = _PIR_OPS.matmul(_PIR_OPS.matmul(rows, x, False, False), cols, False, False)
        else:
            # A maximum over a rectangle is the maximum over its rows of the maxima
            # over its columns: one slice and reduction per bin, rows then columns.
            new = x
            for axis, size_in, size_out in ((2, in_hw[0], out_hw[0]), (3, in_hw[1], out_hw[1])):
                parts = [
                    paddle.max(paddle.slice(new, [axis], [lo], [hi]), axis=axis, keepdim=True)
                    for lo, hi in _adaptive_bins(size_in, size_out)
                ]
                new = paddle.concat(parts, axis=axis) if len(parts) > 1 else parts[0]
        _copy_placement(block, op, before)
        old = op.result(0)
        replaced[old.id] = new
        old.replace_all_uses_with(new)
        block.remove_op(op)
        if size_op is not None and size_op.result(0).use_empty():
            block.remove_op(size_op)
    return replaced


def _value_desc(value: Any, producers: dict[int, tuple[int, str]]) -> str:
    if _has_name(value):
        label = str(value.name)
    else:
        op = value.get_defining_op()
        idx, typ = producers.get(op.id(), (-1, op.name())) if op is not None else (-1, "?")
        label = f"{typ}#{idx}:{value.index()}" if idx >= 0 else f"{typ}:{value.index()}"
    return f"{label} {_type_desc(value)}"


def _source(value: Any, index_of: dict[int, int]) -> tuple[int, int] | str | None:
    """Where an operand comes from, in the terms the ONNX corrections use."""
    if not _is_real(value):
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


def _describe_op(
    op: Any, idx: int, k: int, producers: dict[int, tuple[int, str]], index_of: dict[int, int]
) -> OpInfo:
    name = op.name()
    operands = list(op.operands_source())
    use = OpUse(
        index=idx,
        op=name,
        operands=[_value_desc(v, producers) if _is_real(v) else "None" for v in operands],
        results=[_type_desc(r) for r in op.results()],
        attrs=_plain_attrs(op),
        sources=[_source(v, index_of) for v in operands],
        operand_types=[_dense_type(v) for v in operands],
        result_types=[_dense_type(r) for r in op.results()],
    )
    return OpInfo(
        use=use,
        onnx_names=[p2o_api.result_name(name, k, j) for j in range(op.num_results())],
        ipu_index=_op_int_attr(op, IPU_INDEX_ATTR),
        ipu_stage=_op_int_attr(op, IPU_STAGE_ATTR),
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
            stack.extend(v for v in op.operands_source() if _is_real(v))
    fetched = {v.id for v in fetches}
    for op in block.ops:
        idx = index_of.get(op.id(), -1)
        if idx >= 0:
            infos[idx].use.feeds_fetches = sorted(reach.get(op.id(), set()))
            infos[idx].use.results_used = [
                r.id in fetched or not r.use_empty() for r in op.results()
            ]
    return infos, index_of
