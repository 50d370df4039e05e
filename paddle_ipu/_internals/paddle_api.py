"""PaddlePaddle's private interfaces, as paddle-ipu uses them (checked on 3.3.1, 3.2.2,
3.1.1 and 3.0.0; see :data:`CHECKED_ON`).

Scope tensors (``DenseTensor``) have no public API for what a zero-copy plugin needs
(is it allocated, where, at what address, share its storage), PIR has no public way to
emit a ``fetch`` or keep a value in the scope, and an optimizer's hyper-parameters are
attributes with a leading underscore.  Each of those is wrapped here, with its probe.
A public fallback is used where one exists; otherwise a missing interface raises
:class:`~paddle_ipu.errors.PrivateApiError` naming it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from paddle_ipu._internals import Unavailable, broken, fallback_used, interface, signature_of

CHECKED_ON = "3.3.1, 3.2.2, 3.1.1, 3.0.0"
_DEP = "paddlepaddle"


def _missing(name: str, exc: BaseException) -> Exception:
    return broken(_DEP, name, CHECKED_ON, f"is not usable ({type(exc).__name__}: {exc})")


# -- DenseTensor (scope tensors) ----------------------------------------------------


def is_initialized(tensor: Any) -> bool:
    """Whether a scope tensor holds memory (``DenseTensor._is_initialized``)."""
    try:
        return bool(tensor._is_initialized())
    except AttributeError as exc:
        raise _missing("DenseTensor._is_initialized()", exc) from None


def place_of(tensor: Any) -> Any:
    """The place of a scope tensor (``DenseTensor._place``)."""
    try:
        return tensor._place()
    except AttributeError as exc:
        raise _missing("DenseTensor._place()", exc) from None


def dtype_of(tensor: Any) -> Any:
    """The dtype of a scope tensor (``DenseTensor._dtype``)."""
    try:
        return tensor._dtype()
    except AttributeError as exc:
        raise _missing("DenseTensor._dtype()", exc) from None


def data_ptr(tensor: Any) -> int:
    """The address of a scope tensor's first element (``DenseTensor._ptr``)."""
    try:
        return int(tensor._ptr())
    except AttributeError as exc:
        raise _missing("DenseTensor._ptr()", exc) from None


def numel(tensor: Any) -> int:
    """The element count of a scope tensor (``DenseTensor._numel``; public fallback:
    the product of ``shape()``)."""
    fn = getattr(tensor, "_numel", None)
    if fn is None:
        return int(np.prod(tensor.shape(), dtype=np.int64))
    return int(fn())


def to_dlpack(tensor: Any) -> Any:
    """A DLPack capsule sharing a CPU scope tensor (``DenseTensor._to_dlpack``)."""
    try:
        return tensor._to_dlpack()
    except AttributeError as exc:
        raise _missing("DenseTensor._to_dlpack()", exc) from None


def share_data(dst: Any, src: Any) -> None:
    """Make ``dst`` share ``src``'s storage (``DenseTensor._share_data_with``)."""
    try:
        dst._share_data_with(src)
    except AttributeError as exc:
        raise _missing("DenseTensor._share_data_with()", exc) from None


def dense_from_dlpack(capsule: Any) -> Any:
    """A ``DenseTensor`` (not an eager Tensor, in static and dygraph mode alike) over a
    DLPack capsule (``paddle.base.core.from_dlpack``)."""
    import paddle

    try:
        fn = paddle.base.core.from_dlpack
    except AttributeError as exc:
        raise _missing("paddle.base.core.from_dlpack", exc) from None
    return fn(capsule)


def dense_from_array(arr: np.ndarray) -> Any:
    """A ``DenseTensor`` sharing a C-contiguous array's memory (``core.from_dlpack`` of
    an unversioned capsule the compiled core makes).  Not numpy's own capsules: Paddle
    before 3.3 takes no versioned one, numpy makes no unversioned one of a read-only
    array (the compiled model's weights are read-only), and numpy's deleter takes the
    GIL on whatever thread Paddle frees the tensor, which deadlocked Paddle 3.1.1 (its
    interpreter's destructor joins its garbage collector thread with the GIL held)."""
    from paddle_ipu import _core

    return dense_from_dlpack(_core.export_dlpack(arr))


def legacy_fp16_type() -> Any:
    """The legacy IR's float16 variable type (``paddle.base.core.VarDesc.VarType.FP16``)."""
    import paddle

    try:
        return paddle.base.core.VarDesc.VarType.FP16
    except AttributeError as exc:
        raise _missing("paddle.base.core.VarDesc.VarType.FP16", exc) from None


def legacy_fp32_type() -> Any:
    """The legacy IR's float32 variable type (``paddle.base.core.VarDesc.VarType.FP32``)."""
    import paddle

    try:
        return paddle.base.core.VarDesc.VarType.FP32
    except AttributeError as exc:
        raise _missing("paddle.base.core.VarDesc.VarType.FP32", exc) from None


def set_legacy_var_dtype(var: Any, dtype: Any) -> None:
    """Change a legacy-IR variable's declared dtype (``Variable.desc.set_dtype``)."""
    try:
        var.desc.set_dtype(dtype)
    except AttributeError as exc:
        raise _missing("Variable.desc.set_dtype()", exc) from None


def paddle_core() -> Any:
    """``paddle.base.core`` (the compatibility layer installs 2.x names into it)."""
    import paddle

    return paddle.base.core


def legacy_program_type() -> Any:
    """The legacy IR's Program class (``paddle.base.framework.Program``)."""
    import paddle

    return paddle.base.framework.Program


def legacy_op_types(serialized: bytes) -> set[str]:
    """The operator types of a serialized legacy program (a ``.pdmodel``), in any block,
    read from its protobuf alone (``paddle.base.proto.framework_pb2.ProgramDesc``)."""
    try:
        from paddle.base.proto import framework_pb2

        desc = framework_pb2.ProgramDesc.FromString(serialized)  # type: ignore[attr-defined]
    except (ImportError, AttributeError) as exc:
        raise _missing("paddle.base.proto.framework_pb2.ProgramDesc", exc) from None
    return {op.type for block in desc.blocks for op in block.ops}


def set_legacy_op_attr(op: Any, name: str, value: Any) -> None:
    """Set an attribute of a legacy-IR operator (``Operator._set_attr``)."""
    try:
        op._set_attr(name, value)
    except AttributeError as exc:
        raise _missing("Operator._set_attr()", exc) from None


def insert_legacy_op(block: Any, index: int, **op: Any) -> Any:
    """Insert a legacy-IR operator at ``index`` of ``block`` (``Block._insert_op``:
    ``type``, ``inputs``, ``outputs``, ``attrs``)."""
    try:
        return block._insert_op(index, **op)
    except AttributeError as exc:
        raise _missing("Block._insert_op()", exc) from None


def remove_legacy_op(block: Any, index: int) -> None:
    """Remove the legacy-IR operator at ``index`` of ``block`` (``Block._remove_op``)."""
    try:
        block._remove_op(index)
    except AttributeError as exc:
        raise _missing("Block._remove_op()", exc) from None


# -- PIR ------------------------------------------------------------------------------


def retype_like(value: Any, like: Any) -> None:
    """Give PIR ``value`` the element type of ``like``, keeping its shape
    (``Value.set_type`` of ``pir.create_shaped_type``)."""
    import paddle

    try:
        make = paddle.base.libpaddle.pir.create_shaped_type
        value.set_type(make(like.type(), list(value.shape)))
    except AttributeError as exc:
        raise _missing("pir.create_shaped_type() / Value.set_type()", exc) from None


def pir_ops() -> Any:
    """PIR's op builders (``paddle._pir_ops``): the graph rewrites emit ops through it."""
    import paddle

    try:
        return paddle._pir_ops
    except AttributeError as exc:
        raise _missing("paddle._pir_ops", exc) from None


def emit_fetch(value: Any, name: str, column: int) -> Any:
    """Append ``pd_op.fetch`` of ``value`` as ``name`` (column ``column``)."""
    fetched = pir_ops().fetch(value, name, column)
    fetched.persistable = True
    return fetched


def keep_in_scope(value: Any, name: str) -> None:
    """Make the executor leave ``value`` in the run's scope under ``name``, as a startup
    program leaves parameters (``_pir_ops.set_persistable_value``)."""
    value.persistable = True
    pir_ops().set_persistable_value(value, name)


def set_static_shape(value: Any, shape: Sequence[int]) -> None:
    """Give a dense-tensor PIR value the static ``shape`` (its dtype and layout kept):
    ``paddle.pir.create_shaped_type`` and ``Value.set_type``, which ``Value.set_shape``
    wraps for dy2static only."""
    import paddle

    try:
        value.set_type(paddle.pir.create_shaped_type(value.type(), [int(d) for d in shape]))
    except AttributeError as exc:
        raise _missing("paddle.pir.create_shaped_type / Value.set_type", exc) from None


# -- Python ops (PIR) -----------------------------------------------------------------


def python_ops() -> tuple[Any, Any] | None:
    """``(paddle.static.MetaTensor, paddle.static.register_op)``: PIR's Python ops, which
    let Paddle's own executor run a compiled program (Paddle 3.3 on); None before."""
    import paddle

    meta = getattr(paddle.static, "MetaTensor", None)
    register = getattr(paddle.static, "register_op", None)
    if meta is None or register is None:
        return None
    return meta, register


# -- custom operators (PIR) -----------------------------------------------------------------

_custom_libraries: dict[str, list[str]] = {}


def load_custom_operators(path: str) -> list[str]:
    """Register the custom operators of the library ``path`` (built against the installed
    Paddle with ``paddle/extension.h``) with Paddle, once per process; returns their
    names (``paddle.utils.cpp_extension``'s ``load_op_meta_info_and_register_op``)."""
    loaded = _custom_libraries.get(path)
    if loaded is not None:
        return loaded
    try:
        from paddle.utils.cpp_extension.extension_utils import (
            load_op_meta_info_and_register_op,
        )
    except ImportError as exc:
        name = "paddle.utils.cpp_extension.load_op_meta_info_and_register_op"
        raise _missing(name, exc) from None
    names = list(load_op_meta_info_and_register_op(path))
    _custom_libraries[path] = names
    return names


def run_custom_op(name: str, *args: Any) -> list[Any]:
    """Build the registered custom operator ``name`` in the PIR program being built:
    its inputs, then its attributes in declaration order (``_C_ops._run_custom_op``,
    what ``paddle.utils.cpp_extension``'s generated functions call); its results."""
    from paddle import _C_ops

    try:
        run = getattr(_C_ops, "_run_custom_op")  # noqa: B009 - private, not in the stubs
    except AttributeError as exc:
        raise _missing("paddle._C_ops._run_custom_op", exc) from None
    out = run(name, *args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


# -- the static executor ------------------------------------------------------------------

_CACHE_PARAMS = (
    "self",
    "program",
    "feed",
    "fetch_list",
    "feed_var_name",
    "fetch_var_name",
    "place",
    "scope",
    "plan",
)
_FEED_PARAMS = ("self", "program", "feed", "scope", "data_op_infos")
_runner_checked: bool | None = None


def _executor_internals_match() -> bool:
    """Whether Paddle's executor cache has the signatures the fast runner calls."""
    global _runner_checked
    if _runner_checked is None:
        import paddle

        why = ""
        try:
            exe_type = paddle.static.Executor
            cache_fn = paddle.base.executor._ExecutorCache.get_pir_program_and_executor
            feed_fn = exe_type._pir_feed_data
            if tuple(inspect.signature(cache_fn).parameters) != _CACHE_PARAMS:
                why = f"get_pir_program_and_executor{inspect.signature(cache_fn)} changed"
            elif tuple(inspect.signature(feed_fn).parameters) != _FEED_PARAMS:
                why = f"_pir_feed_data{inspect.signature(feed_fn)} changed"
        except (AttributeError, TypeError, ValueError) as exc:
            why = f"missing ({exc})"
        if why:
            fallback_used(_DEP, "Executor._executor_cache", why, "Executor.run")
        _runner_checked = not why
    return _runner_checked


class CachedProgramRunner:
    """``Executor.run(program, feed, fetch_list, scope)`` for one program, one fetch list
    and one scope, run many times.

    ``Executor.run`` looks its compiled program up in a cache keyed on ``str(program)``,
    which prints the whole program on every call; for small models that costs as much
    as running it.  The runner asks Paddle's executor cache once per feed signature
    (names, shapes, dtypes) and then feeds and runs the cached interpreter, as
    ``Executor.run`` itself does after its lookup: the same kernels, the same results.
    When those internals are missing or their signatures changed it uses the public
    ``Executor.run``.
    """

    def __init__(self, exe: Any, program: Any, fetch_list: Sequence[Any], scope: Any) -> None:
        self._exe = exe
        self._program = program
        self._fetch_list = list(fetch_list)
        self._scope = scope
        self._cache: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}
        self.fast = _executor_internals_match()

    def run(self, feed: dict[str, np.ndarray]) -> list[Any]:
        if not self.fast:
            return list(
                self._exe.run(
                    self._program, feed=feed, fetch_list=self._fetch_list, scope=self._scope
                )
            )
        key = tuple((k, v.shape, v.dtype.str) for k, v in feed.items())
        entry = self._cache.get(key)
        if entry is None:
            entry = self._exe._executor_cache.get_pir_program_and_executor(
                self._program,
                feed,
                self._fetch_list,
                "feed",
                "fetch",
                self._exe.place,
                self._scope,
                self._exe.plan,
            )
            self._cache[key] = entry
        program, interpreter, data_ops = entry
        self._exe._pir_feed_data(program, feed, self._scope, data_ops)
        return list(interpreter.run(list(feed), True, False))


# -- optimizers ---------------------------------------------------------------------------


def optimizer_attr(optimizer: Any, name: str, default: Any = inspect.Parameter.empty) -> Any:
    """A dygraph optimizer's hyper-parameter (``optimizer._<name>``: ``_learning_rate``,
    ``_beta1``, ``_epsilon``, ...); a missing one raises naming it unless ``default``
    is given."""
    try:
        return getattr(optimizer, "_" + name)
    except AttributeError as exc:
        if default is not inspect.Parameter.empty:
            return default
        raise _missing(f"{type(optimizer).__name__}._{name}", exc) from None


def optimizer_accumulators(optimizer: Any) -> dict[str, Any]:
    """A dygraph optimizer's state tensors by kind (``optimizer._accumulators``)."""
    return dict(getattr(optimizer, "_accumulators", None) or {})


def create_accumulators(optimizer: Any, block: Any, parameters: list[Any]) -> bool:
    """Create a dygraph optimizer's state before its first step
    (``optimizer._create_accumulators``); False when the optimizer has no such hook."""
    create = getattr(optimizer, "_create_accumulators", None)
    if create is None:
        return False
    create(block, parameters)
    return True


@contextlib.contextmanager
def thread_static_mode() -> Iterator[None]:
    """Static mode in a thread other than the one that imported paddle, where
    ``paddle.enable_static()`` changes nothing (its dygraph context is that thread's):
    the thread's tracer taken away for the block (``framework._dygraph_guard(None)``)."""
    from paddle.base import framework

    with framework._dygraph_guard(None):
        yield


# -- probes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def probe_mode(static: bool) -> Iterator[None]:
    """Run a probe in static or dygraph mode, restoring the caller's mode after."""
    import paddle

    was_static = not paddle.in_dynamic_mode()
    if static:
        paddle.enable_static()
    else:
        paddle.disable_static()
    try:
        yield
    finally:
        if was_static:
            paddle.enable_static()
        else:
            paddle.disable_static()


def _scope_tensor() -> Any:
    import paddle

    scope = paddle.static.Scope()
    tensor = scope.var("probe").get_tensor()
    tensor.set(np.arange(6, dtype=np.float32).reshape(2, 3), paddle.CPUPlace())
    return scope, tensor


@interface(_DEP, "DenseTensor._is_initialized, _place, _dtype, _ptr, _numel", "scope I/O")
def _probe_dense() -> str:
    scope, tensor = _scope_tensor()
    empty = scope.var("empty").get_tensor()
    assert is_initialized(tensor) and not is_initialized(empty)
    assert place_of(tensor).is_cpu_place()
    assert str(dtype_of(tensor)) == "paddle.float32", repr(dtype_of(tensor))
    assert numel(tensor) == 6
    view = np.asarray(tensor)  # numpy copies; compare contents through the address
    assert data_ptr(tensor) != 0 and view.shape == (2, 3)
    return "allocated/empty, place, dtype, address and size as expected"


@interface(_DEP, "DenseTensor._to_dlpack, _share_data_with, core.from_dlpack", "zero copy")
def _probe_sharing() -> str:
    import paddle

    scope, tensor = _scope_tensor()
    from paddle_ipu import _core

    view = _core.TensorView._from_dlpack(to_dlpack(tensor), tensor, True)
    assert np.asarray(view).tolist() == [[0, 1, 2], [3, 4, 5]]
    other = scope.var("other").get_tensor()
    share_data(other, tensor)
    assert data_ptr(other) == data_ptr(tensor)
    arr = np.full((4,), 7.0, np.float32)
    shared = dense_from_array(arr)
    target = scope.var("from_dlpack").get_tensor()
    share_data(target, shared)
    assert data_ptr(target) == arr.ctypes.data and isinstance(target, paddle.base.core.DenseTensor)
    frozen = np.full((4,), 5.0, np.float32)
    frozen.flags.writeable = False
    adopted = dense_from_array(frozen)
    assert data_ptr(adopted) == frozen.ctypes.data
    return "views, shares and adopts storage (read-only arrays too) without a copy"


@interface(_DEP, "paddle._pir_ops (fetch, set_persistable_value, ...)", "graph rewrites")
def _probe_pir_ops() -> str:
    import paddle

    ops = pir_ops()
    # every builder the rewrites call (pir_reader, legacy_reader, gradients, program)
    used = (
        "fetch",
        "set_persistable_value",
        "full_like",
        "full_int_array",
        "scale",
        "exp",
        "log",
        "where",
        "greater_than",
        "matmul",
        "builtin_split",
    )
    missing = [n for n in used if not hasattr(ops, n)]
    assert not missing, f"missing builders: {missing}"
    with probe_mode(static=True), paddle.pir_utils.IrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [2, 3], "float32")
            y = paddle.scale(x, 2.0)
            keep_in_scope(y, "kept")
            emit_fetch(y, "y", 0)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        feed = {"x": np.ones((2, 3), np.float32)}
        (out,) = exe.run(main, feed=feed, fetch_list=[], scope=scope)
        kept = np.asarray(scope.find_var("kept").get_tensor())
    assert np.array_equal(out, 2 * feed["x"]) and np.array_equal(kept, out)
    return "fetch and set_persistable_value behave; every builder used exists"


@interface(_DEP, "paddle.pir.create_shaped_type, Value.set_type", "open input shapes")
def _probe_shapes() -> str:
    import paddle

    with probe_mode(static=True), paddle.pir_utils.IrGuard():
        main = paddle.static.Program()
        with paddle.static.program_guard(main, paddle.static.Program()):
            x = paddle.static.data("x", [-1, 3, -1], "float32")
        set_static_shape(x, [2, 3, 5])
        assert list(x.shape) == [2, 3, 5] and x.is_dense_tensor_type(), x.shape
    return "a value's shape set, its dtype kept"


@interface(
    _DEP,
    "Executor._executor_cache.get_pir_program_and_executor, Executor._pir_feed_data",
    "host training step",
    fallback="Executor.run (a small MLP trains about 1.4x slower per step)",
)
def _probe_runner() -> str:
    import paddle

    with probe_mode(static=True), paddle.pir_utils.IrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [2, 3], "float32")
            y = paddle.scale(x, 3.0)
        exe = paddle.static.Executor(paddle.CPUPlace())
        runner = CachedProgramRunner(exe, main, [y], paddle.static.Scope())
        (out,) = runner.run({"x": np.ones((2, 3), np.float32)})
    assert runner.fast, "the executor internals changed: Executor.run is used instead"
    assert np.array_equal(np.asarray(out), np.full((2, 3), 3.0, np.float32))
    return "the cached interpreter runs ({})".format(
        signature_of(paddle.base.executor._ExecutorCache.get_pir_program_and_executor)
        or "signature as checked"
    )


@interface(_DEP, "optimizer._learning_rate, _beta1, ... _accumulators", "dygraph training")
def _probe_optimizer() -> str:
    import paddle

    with probe_mode(static=False):
        layer = paddle.nn.Linear(2, 2)
        opt = paddle.optimizer.Adam(0.1, beta1=0.8, parameters=layer.parameters())
        values = [optimizer_attr(opt, n) for n in ("learning_rate", "beta1", "beta2", "epsilon")]
        mom = paddle.optimizer.Momentum(0.1, momentum=0.7, parameters=layer.parameters())
        assert optimizer_attr(mom, "momentum") == 0.7
        assert optimizer_attr(mom, "use_nesterov") is False
        assert isinstance(optimizer_accumulators(opt), dict)
        assert callable(getattr(opt, "_create_accumulators", None))
    assert values == [0.1, 0.8, 0.999, 1e-8], values
    return "hyper-parameters and accumulator hooks as checked"


@interface(
    _DEP,
    "paddle.static.register_op, MetaTensor (Paddle 3.3 on)",
    "compiled programs run by Paddle's executor (PADDLE_IPU_DIRECT_RUN=0, exe.run options)",
    fallback="the Executor.run hook runs every compiled program directly",
)
def _probe_python_ops() -> str:
    import paddle

    if python_ops() is None:
        raise Unavailable(f"PaddlePaddle {paddle.__version__} has no PIR Python ops")
    return "present"


@interface(
    _DEP,
    "core.VarDesc.VarType.FP16/FP32, framework.Program, Operator._set_attr, "
    "Variable.desc.set_dtype, proto.framework_pb2.ProgramDesc",
    "legacy IR",
)
def _probe_legacy() -> str:
    import paddle

    assert legacy_fp16_type() is not None
    with probe_mode(static=True), paddle.pir_utils.OldIrGuard():
        main = paddle.static.Program()
        assert isinstance(main, legacy_program_type())
        with paddle.static.program_guard(main, paddle.static.Program()):
            x = paddle.static.data("x", [2], "float32")
            paddle.scale(x, 2.0)
        op = main.global_block().ops[-1]
        set_legacy_op_attr(op, "probe_attr", 3)
        assert op.attr("probe_attr") == 3
        half = paddle.static.data("half", [2], "float16")
        set_legacy_var_dtype(half, legacy_fp32_type())
        assert half.dtype == legacy_fp32_type()
        assert "scale" in legacy_op_types(main.desc.serialize_to_string())
    return "the float16 type, Program class, attribute setter and ProgramDesc as checked"


@interface(
    _DEP,
    "framework._dygraph_guard(None)",
    "loading and compiling a saved model on a thread of its own (a shape a runtime meets)",
)
def _probe_thread_static() -> str:
    import threading

    import paddle

    seen: list[bool] = []

    def probe() -> None:
        seen.append(paddle.in_dynamic_mode())
        with thread_static_mode():
            seen.append(paddle.in_dynamic_mode())
        seen.append(paddle.in_dynamic_mode())

    with probe_mode(static=False):
        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
    assert seen == [True, False, True], seen
    return "a thread's tracer taken away and given back"
