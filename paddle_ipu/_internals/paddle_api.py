"""PaddlePaddle's private interfaces, as paddle-ipu uses them (checked on 3.3.1).

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

from paddle_ipu._internals import broken, fallback_used, interface, signature_of

CHECKED_ON = "3.3.1"
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


def set_legacy_op_attr(op: Any, name: str, value: Any) -> None:
    """Set an attribute of a legacy-IR operator (``Operator._set_attr``)."""
    try:
        op._set_attr(name, value)
    except AttributeError as exc:
        raise _missing("Operator._set_attr()", exc) from None


# -- PIR ------------------------------------------------------------------------------


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
    shared = dense_from_dlpack(arr.__dlpack__(max_version=(1, 0)))
    target = scope.var("from_dlpack").get_tensor()
    share_data(target, shared)
    assert data_ptr(target) == arr.ctypes.data and isinstance(target, paddle.base.core.DenseTensor)
    return "views, shares and adopts storage without a copy"


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
    "core.VarDesc.VarType.FP16/FP32, framework.Program, Operator._set_attr, "
    "Variable.desc.set_dtype",
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
    return "the float16 type, Program class and attribute setter as checked"


# -- paddle.distributed.launch's device detection ---------------------------------

#: the launcher module whose device detection sees custom devices
LAUNCHER_DEVICE_MODULE = "paddle.distributed.launch.context.device"
_launcher_originals: dict[str, Any] = {}


def _without_ipu_types(original: Any) -> Any:
    def get_all_custom_device_type() -> Any:
        types = original()
        return [t for t in types or [] if t != "ipu"] if types is not None else types

    get_all_custom_device_type.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
    return get_all_custom_device_type


def _without_ipu_devices(original: Any) -> Any:
    def get_available_custom_device() -> Any:
        devices = original()
        if devices is None:
            return devices
        return [d for d in devices if str(d).split(":")[0] != "ipu"]

    get_available_custom_device.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
    return get_available_custom_device


def _patch_launcher_module(module: Any) -> None:
    for name, wrap in (
        ("get_all_custom_device_type", _without_ipu_types),
        ("get_available_custom_device", _without_ipu_devices),
    ):
        current = getattr(module, name, None)
        if current is None or hasattr(current, "__paddle_ipu_original__"):
            continue
        _launcher_originals[name] = current
        setattr(module, name, wrap(current))


class _LauncherWatcher:
    """Patches the launcher's device module when it is first imported (nothing of the
    launcher is imported otherwise)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != LAUNCHER_DEVICE_MODULE:
            return None
        import importlib.util
        import sys

        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class _Loader:
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                _patch_launcher_module(module)

        spec.loader = _Loader()  # type: ignore[assignment]
        return spec


def hide_ipu_from_launcher() -> None:
    """Keep ``python -m paddle.distributed.launch`` choosing its devices as without the
    ipu plugin.

    The launcher (``launch/context/device.py``, ``Device.parse_device`` and
    ``detect_device``) takes the first registered custom device type as the job's device
    and gives each process one of its devices: with the one emulated IPU, a CPU job of
    ``--nproc_per_node 2`` failed in ``_build_pod_with_master`` (IndexError).  Its two
    imported names ``get_all_custom_device_type`` and ``get_available_custom_device`` are
    replaced, in that module only, by versions that leave out "ipu".  Undone by
    :func:`show_ipu_to_launcher`; not installed when ``PADDLE_IPU_DEFAULT_DEVICE`` is on.
    """
    import sys

    module = sys.modules.get(LAUNCHER_DEVICE_MODULE)
    if module is not None:
        _patch_launcher_module(module)
    elif not any(isinstance(f, _LauncherWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _LauncherWatcher())


def show_ipu_to_launcher() -> None:
    """Undo :func:`hide_ipu_from_launcher`."""
    import sys

    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _LauncherWatcher)]
    module = sys.modules.get(LAUNCHER_DEVICE_MODULE)
    if module is not None:
        for name, original in _launcher_originals.items():
            setattr(module, name, original)
    _launcher_originals.clear()


@interface(
    _DEP,
    "distributed.launch.context.device: get_all_custom_device_type, "
    "get_available_custom_device, Device.detect_device",
    "CPU jobs under paddle.distributed.launch with the ipu plugin installed",
)
def _probe_launcher() -> str:
    import importlib

    module = importlib.import_module(LAUNCHER_DEVICE_MODULE)
    for name in ("get_all_custom_device_type", "get_available_custom_device"):
        assert callable(getattr(module, name)), name
    device = module.Device.detect_device()
    if "ipu" in (module.get_all_custom_device_type() or []):
        raise AssertionError("the launcher still sees the ipu device type")
    return f"the launcher's device detection sees {device.dtype!r} without the ipu device"


# -- Paddle APIs that refuse the ipu device in Python --------------------------------

_REFUSALS = {
    # module attribute path -> what to say instead of Paddle's message
    "paddle.tensor.linalg.lstsq": (
        "Only support lstsq api for CPU or CUDA device",
        "paddle.linalg.lstsq checks paddle.get_device() and runs on the CPU and CUDA only "
        "(Paddle's own rule, paddle/tensor/linalg.py); on the ipu device, call it on CPU "
        "tensors under paddle.set_device('cpu'): x.cpu(), y.cpu()",
    ),
}
#: (module, attribute, Paddle's function) for every name explain_ipu_refusals replaced
_refusal_patches: list[tuple[Any, str, Any]] = []


def explain_ipu_refusals() -> None:
    """Make the few Paddle APIs that refuse the ipu device in Python (not in a kernel)
    say how to run them: their error becomes a NotSupportedError naming the API and the
    way out.  Only the error changes; :func:`restore_ipu_refusals` undoes it."""
    import functools
    import importlib
    import sys

    import paddle

    from paddle_ipu.errors import NotSupportedError

    if _refusal_patches:
        return
    for path, (paddle_message, ours) in _REFUSALS.items():
        module_name, name = path.rsplit(".", 1)
        original = getattr(importlib.import_module(module_name), name)

        def wrapper(
            *args: Any,
            __original: Any = original,
            __paddle: str = paddle_message,
            __ours: str = ours,
            **kwargs: Any,
        ) -> Any:
            try:
                return __original(*args, **kwargs)
            except RuntimeError as exc:
                if __paddle in str(exc) and str(paddle.get_device()).startswith("ipu"):
                    raise NotSupportedError(__ours) from exc
                raise

        functools.update_wrapper(wrapper, original)
        wrapper.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
        # Every module of paddle that exports it (paddle.linalg, paddle.tensor, ...).
        for module_path, module in list(sys.modules.items()):
            if module is None or not (module_path == "paddle" or module_path.startswith("paddle.")):
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, wrapper)
                    _refusal_patches.append((module, attr, original))


def restore_ipu_refusals() -> None:
    """Undo :func:`explain_ipu_refusals`."""
    for module, attr, original in _refusal_patches:
        setattr(module, attr, original)
    _refusal_patches.clear()


@interface(
    _DEP,
    "paddle.tensor.linalg.lstsq refusing devices other than CPU and CUDA",
    "a NotSupportedError naming the way out on the ipu device",
    fallback="Paddle's own RuntimeError",
)
def _probe_refusals() -> str:
    import inspect as _inspect

    import paddle

    source = _inspect.getsource(
        getattr(paddle.tensor.linalg.lstsq, "__paddle_ipu_original__", paddle.tensor.linalg.lstsq)
    )
    for path, (message, _) in _REFUSALS.items():
        assert message in source, f"{path} no longer raises {message!r}"
    return "lstsq's device refusal as checked"


# -- paddle.static.load on a scope that lives on the ipu place ------------------------

_load_patch: list[tuple[Any, str, Any]] = []


def keep_custom_place_on_load() -> None:
    """Let ``paddle.static.load`` (PIR) write into tensors on the ipu place whatever the
    default device is.

    ``paddle/static/pir_io.py``'s ``set_var`` writes each loaded array back on its
    tensor's place, but names a custom place by the *default* device's type
    (``paddle.device.get_device().split(':')[0]``): with the CPU as the default (see
    docs/device.md), a scope trained on the ipu place could not be loaded ("Invalid
    CustomPlace(cpu, 0)").  The replacement uses the tensor's own device type and hands
    every other place to Paddle's function; :func:`restore_custom_place_on_load` undoes
    it."""
    import paddle
    from paddle.static import pir_io

    if _load_patch:
        return
    original = pir_io.set_var

    def set_var(name: str, ndarray: Any) -> Any:
        tensor = paddle.static.global_scope().find_var(name).get_tensor()
        place = tensor._place()
        if not place.is_custom_place():
            return original(name, ndarray)
        custom = paddle.base.core.Place()
        custom.set_place(place)
        target = paddle.base.CustomPlace(custom.custom_device_type(), custom.custom_device_id())
        tensor.set(ndarray, target)
        return None

    set_var.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
    pir_io.set_var = set_var
    _load_patch.append((pir_io, "set_var", original))


def restore_custom_place_on_load() -> None:
    """Undo :func:`keep_custom_place_on_load`."""
    for module, name, original in _load_patch:
        setattr(module, name, original)
    _load_patch.clear()


@interface(
    _DEP,
    "static.pir_io.set_var(name, ndarray), Place.custom_device_type",
    "paddle.static.load into a scope on the ipu place",
    fallback="Paddle's own set_var (needs paddle.set_device('ipu') before loading)",
)
def _probe_load() -> str:
    import inspect as _inspect

    from paddle.static import pir_io

    original = getattr(pir_io.set_var, "__paddle_ipu_original__", pir_io.set_var)
    params = list(_inspect.signature(original).parameters)
    assert params == ["name", "ndarray"], params
    assert "paddle.device.get_device().split(':')[0]" in _inspect.getsource(original)
    return "pir_io.set_var as checked"


# -- paddle.inference after register_op ------------------------------------------------

_inference_primed = False


def prime_paddle_inference() -> None:
    """Create one Paddle Inference predictor before the first Python op exists.

    In Paddle 3.3.1, once ``register_op`` has added a Python op, creating the
    process's first ``paddle.inference`` predictor aborts the process (a glog
    CHECK on the Python op's unvalidated proto).  Predictor creation validates
    the op registry only once, so doing it first -- with a one-op model in a
    temporary folder, about 40 ms once per process -- keeps later predictors
    working.
    """
    global _inference_primed
    if _inference_primed:
        return
    _inference_primed = True
    import os
    import tempfile
    import warnings

    import paddle

    try:
        import paddle.inference as pi

        scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        # The pid in the name lets a later compile remove it if this process is killed.
        with tempfile.TemporaryDirectory(prefix=f"paddle_ipu_{os.getpid()}_", dir=scratch) as tmp:
            prog, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(prog, startup):
                x = paddle.static.data("x", [1], "float32")
                y = paddle.scale(x, 2.0)
            prefix = os.path.join(tmp, "m")
            exe = paddle.static.Executor(paddle.CPUPlace())
            # The one-op model has no variables, which Paddle warns about: not the
            # user's concern.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                paddle.static.save_inference_model(prefix, [x], [y], exe, program=prog)
            config = pi.Config(prefix + ".json", "")
            config.disable_glog_info()
            pi.create_predictor(config)
    except Exception as exc:  # priming is a precaution, never a reason to fail
        import logging

        logging.getLogger("paddle_ipu").debug("could not prime paddle.inference: %s", exc)
