"""The compiled graph as one op of a Paddle program.

``IpuCompiledProgram.compile()`` returns a PIR program holding the feeds, one
``ipu_graph`` op and the fetches, so that ``exe.run(prog, feed=..., fetch_list=...)``
works as in Paddle 2.x.  The op is a ``paddle.static.register_op`` Python op whose
function runs the compiled program's executor; the program returned holds the
compiled program strongly, the op only weakly, so dropping the program releases the
executor.  Paddle before 3.3 has no Python op: the program then holds the feeds only,
and the Executor.run hook runs every compiled program directly.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api, paddle_process
from paddle_ipu.errors import CompileError

_graph_ids = iter(range(1 << 62))


def build_graph_program(
    compiled: Any,
    shapes: tuple[list[list[int]], list[list[int]]] | None = None,
) -> Any:
    """A PIR program: data ops -> one ipu_graph op -> fetch ops.

    The op runs ``compiled.run``; ``shapes``: the feed and fetch shapes of one
    request (default: the step layout's), -1 for any size.  Paddle keeps a
    registered op's function for the life of the process, so the function holds
    the compiled program only weakly: the returned program holds it strongly (its
    ``ipu_compiled_program``), and dropping both releases the executor."""
    import paddle

    ops = paddle_api.python_ops()
    if ops is None:
        return _build_shell_program(compiled, shapes)
    MetaTensor, register_op = ops

    paddle_process.prime_paddle_inference()
    # before the first Python op of the process (see device.load_host_operators)
    from paddle_ipu import device

    device.load_host_operators()

    executor = compiled.require_executor()
    model = executor.model
    layout = executor.layout
    config = executor.session_config()
    compiled_ref = weakref.ref(compiled)
    feed_names = [spec.paddle_name or spec.name for spec in model.inputs]
    out_meta: list[tuple[list[int], str]] = []
    fetch_names: list[str] = []
    for k, spec in enumerate(model.outputs):
        art = config.anchors[spec.name]
        shape = list(layout.anchor_shape(spec.shape, art.kind, art.period))
        if shapes is not None:
            shape = shapes[1][k]
        out_meta.append((shape, spec.dtype))
        fetch_names.append(spec.paddle_name or spec.name)

    def infer_meta(*_inputs: Any) -> Any:
        # An exception escaping infer_meta aborts the process: build from data
        # fixed at compile time only.
        metas = []
        for shape, dtype in out_meta:
            meta = MetaTensor()
            meta.set_shape(shape)
            meta.set_dtype(dtype)
            metas.append(meta)
        return metas[0] if len(metas) == 1 else tuple(metas)

    def ipu_graph(*tensors: Any) -> Any:
        owner = compiled_ref()
        if owner is None or owner.executor is None:
            raise CompileError(
                "this ipu_graph op's IpuCompiledProgram was released or reset: compile again"
            )
        current = owner.executor
        current.last_error = None
        try:
            feed = {name: _host_array(t) for name, t in zip(feed_names, tensors)}
            outs = owner.run(feed)
        except Exception as exc:
            # Paddle turns any exception of a Python op into a SystemError; keep
            # ours so that the executor hook can raise it as it was.
            current.last_error = exc
            raise
        result = [paddle.to_tensor(o) for o in outs]
        return result[0] if len(result) == 1 else tuple(result)

    op = register_op(
        name=f"ipu_graph_{next(_graph_ids)}",
        infer_meta=_positional(infer_meta, len(feed_names)),
        input_names=[f"feed_{i}" for i in range(len(feed_names))],
        output_names=[f"fetch_{i}" for i in range(len(fetch_names))],
    )(_positional(ipu_graph, len(feed_names)))

    prog = paddle.static.Program()
    with paddle.static.program_guard(prog, paddle.static.Program()):
        datas = [
            paddle.static.data(
                name,
                list(layout.input_shape(spec.shape)) if shapes is None else shapes[0][k],
                _paddle_dtype(spec.dtype),
            )
            for k, (name, spec) in enumerate(zip(feed_names, model.inputs))
        ]
        outs = op(*datas)
        if len(fetch_names) == 1:
            outs = [outs]
        for col, (value, name) in enumerate(zip(outs, fetch_names)):
            paddle_api.emit_fetch(value, name, col)
    # pir.Program takes new attributes; Paddle 2.x's compiled program had these.
    setattr(prog, "fetch_names", fetch_names)  # noqa: B010
    setattr(prog, "feed_names", feed_names)  # noqa: B010
    return prog


def _build_shell_program(
    compiled: Any,
    shapes: tuple[list[list[int]], list[list[int]]] | None = None,
) -> Any:
    """Before Paddle 3.3 (no PIR Python op): a program with the compiled program's data
    ops and names only.  The Executor.run hook runs it directly whatever the options
    (paddle_ipu.frontends.run_hook); Paddle's own executor, with the hooks uninstalled,
    finds no fetch in it and says so."""
    import paddle

    executor = compiled.require_executor()
    model = executor.model
    layout = executor.layout
    feed_names = [spec.paddle_name or spec.name for spec in model.inputs]
    fetch_names = [spec.paddle_name or spec.name for spec in model.outputs]
    prog = paddle.static.Program()
    with paddle.static.program_guard(prog, paddle.static.Program()):
        for k, (name, spec) in enumerate(zip(feed_names, model.inputs)):
            paddle.static.data(
                name,
                list(layout.input_shape(spec.shape)) if shapes is None else shapes[0][k],
                _paddle_dtype(spec.dtype),
            )
    setattr(prog, "fetch_names", fetch_names)  # noqa: B010
    setattr(prog, "feed_names", feed_names)  # noqa: B010
    return prog


def _host_array(tensor: Any) -> np.ndarray:
    """A feed tensor as numpy: a zero-copy view when it lives on the ipu place
    (where ``Tensor.numpy()`` costs a device copy), else ``numpy()``, which is
    the cheapest for small CPU tensors."""
    if tensor.place.is_custom_place():
        from paddle_ipu._tensors.views import as_numpy

        return as_numpy(tensor, readonly=True)
    return np.asarray(tensor.numpy())


def _paddle_dtype(dtype: str) -> str:
    # Feeds keep Paddle's own dtypes: int64 stays int64 and is cast by the executor.
    return dtype


def _positional(fn: Any, n: int) -> Any:
    """register_op binds arguments by signature and drops ``*args``: give it a
    function with one named parameter per feed."""
    params = ", ".join(f"x{i}" for i in range(n))
    namespace: dict[str, Any] = {"_fn": fn}
    exec(f"def ipu_graph({params}):\n    return _fn({params})\n", namespace)
    return namespace["ipu_graph"]
