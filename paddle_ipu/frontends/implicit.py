"""Plain static programs on the ``ipu`` place: compiled implicitly, the IPU way.

Without this, ``Executor(CustomPlace("ipu", 0)).run(main, ...)`` of an ordinary
training program runs op by op, the optimizer's in-place kernels fall back to the
CPU and update a copy, and the weights never change -- silently.  Here such a run
compiles the program as one whole graph on its first call (training when it holds
optimizer ops; the micro-batch is the feed's leading dimension; one step per run;
the requested fetches are the anchors) and caches it per (program version, feed
names, shapes and dtypes, fetch list, scope).

The scope stays the source of truth: before a run, weights and optimizer state
that changed in the scope since the last sync (``paddle.static.load``, another
program sharing the parameters, a user's ``tensor.set``) are copied to the
device; after a training run they are copied back, so ``paddle.static.save`` and
a CPU executor see every update.

Programs without fetches and without optimizer ops (the startup program) run on
Paddle's executor, as do programs that cannot be compiled -- but only when no op
writes in place into a persistable tensor (the update would be lost); otherwise
the run raises naming the op.  ``PADDLE_IPU_IMPLICIT_COMPILE=0`` turns implicit
compilation off; such programs then raise instead of running wrongly.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu._util.arrays import same_bytes
from paddle_ipu._util.env import env_flag
from paddle_ipu.errors import NotSupportedError, UnsupportedOpError
from paddle_ipu.executor.feeds import as_array

log = logging.getLogger("paddle_ipu")

ENV_FLAG = "PADDLE_IPU_IMPLICIT_COMPILE"
#: compiled variants kept per program (feed shapes, fetch lists, scopes)
MAX_VARIANTS = 8

_lock = threading.RLock()
_warned: set[int] = set()
_CACHE_ATTR = "_paddle_ipu_implicit"


def _is_ipu_place(place: Any) -> bool:
    import paddle

    try:
        # Paddle 3.0's CustomPlace (what Executor.place is) has no is_custom_place()
        if isinstance(place, paddle.CustomPlace):
            return bool(place.get_device_type() == "ipu")
        return bool(place.is_custom_place()) and place.get_device_type() == "ipu"
    except Exception:
        return False


def targets(exe: Any, program: Any) -> bool:
    """Whether ``exe.run(program, ...)`` is ours: a plain program on the ipu place."""
    if not _is_ipu_place(getattr(exe, "place", None)):
        return False
    if program is None:
        return True
    import paddle

    return isinstance(program, (paddle.pir.Program, paddle.static.Program))


def _normalise_fetches(fetch_list: Any) -> list[Any]:
    if fetch_list is None:
        return []
    if not isinstance(fetch_list, (list, tuple)):
        return [fetch_list]
    out: list[Any] = []
    for item in fetch_list:
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    return out


def _inplace_writes(program: Any) -> list[str]:
    """Ops that write in place into a persistable tensor (an update that an
    op-by-op run on the ipu place would lose), described for an error."""
    found = []
    for index, op in enumerate(program.global_block().ops):
        name = op.name()
        if not name.endswith("_") or name.startswith("builtin."):
            continue
        targets_ = []
        for value in op.operands_source():
            try:
                if value.persistable:
                    targets_.append(_value_label(value))
            except Exception:
                continue
        if targets_:
            found.append(f"op #{index} {name} (writes {', '.join(targets_)})")
    return found


def _value_label(value: Any) -> str:
    try:
        if value.has_name:
            return str(value.name)
    except Exception:
        pass
    return "a persistable tensor"


# Legacy-IR (Paddle 2.x) optimizer op types: their kernels update parameters in place.
_LEGACY_OPTIMIZER_OPS = frozenset(
    {
        "sgd",
        "momentum",
        "lars_momentum",
        "adam",
        "adamw",
        "adamax",
        "lamb",
        "rmsprop",
        "adagrad",
        "decayed_adagrad",
        "adadelta",
        "ftrl",
    }
)


def _legacy_optimizer_ops(program: Any) -> list[str]:
    return [op.type for op in program.global_block().ops if op.type in _LEGACY_OPTIMIZER_OPS]


def run(
    original: Any,
    exe: Any,
    program: Any,
    feed: Any,
    fetch_list: Any,
    options: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``exe.run`` of a plain program on the ipu place."""
    import paddle

    if program is None:
        program = paddle.static.default_main_program()
    if not isinstance(program, paddle.pir.Program):
        # A legacy-IR program: its optimizer kernels would update CPU copies.  It is
        # compiled implicitly through its PIR translation (compiler/legacy_reader.py),
        # the translated program cached on it; PIR mode while it compiles and runs.
        bad = _legacy_optimizer_ops(program)
        fetches = _normalise_fetches(fetch_list)
        if not (bad or fetches) or not env_flag(ENV_FLAG, True):
            if bad:
                kinds = ", ".join(sorted(set(bad)))
                raise NotSupportedError(
                    f"this legacy-IR program updates parameters in place ({kinds}), which "
                    f"the ipu place cannot run op by op: unset {ENV_FLAG} (or set it to 1) "
                    "to compile it implicitly, or run it on paddle.CPUPlace()"
                )
            return original(exe, program, feed, fetch_list, *args, **kwargs)
        from paddle_ipu.compiler.legacy_reader import pir_mode

        translated, pir_fetches = _translation(program, sorted(dict(feed or {})), fetches)
        with pir_mode():
            return run(original, exe, translated, feed, pir_fetches or None, options, args, kwargs)

    fetches = _normalise_fetches(fetch_list)
    if isinstance(feed, (list, tuple)):
        feed = feed[0] if len(feed) == 1 else feed
    feed = dict(feed or {})
    from paddle_ipu.compiler.optimizer import find_optimizer_ops

    version = _program_version(program)
    cached = getattr(program, _TRAINING_ATTR, None)
    if cached is not None and cached[0] == version:
        training = cached[1]
    else:
        training = bool(find_optimizer_ops(program))
        setattr(program, _TRAINING_ATTR, (version, training))
    enabled = env_flag(ENV_FLAG, True)
    if not enabled or (not fetches and not training):
        _check_native(program, enabled)
        return original(exe, program, feed, fetch_list, *args, **kwargs)

    scope = options.get("scope") or paddle.static.global_scope()
    try:
        entry = _entry(program, feed, fetches, scope, training, version)
    except UnsupportedOpError as exc:
        writes = _inplace_writes(program)
        if writes:
            raise UnsupportedOpError(
                f"{exc}\nThe program cannot run op by op on the ipu place either: "
                f"{'; '.join(writes)} would update a copy and lose the update. Run it on "
                "paddle.CPUPlace(), or rewrite the unsupported operators."
            ) from exc
        if id(program) not in _warned:
            _warned.add(id(program))
            log.warning(
                "the program cannot be compiled for the IPU (%s); running it op by op on "
                "the ipu place with Paddle's kernels",
                str(exc).splitlines()[0],
            )
        return original(exe, program, feed, fetch_list, *args, **kwargs)
    outs = entry.run(feed)
    if not fetches:
        return []
    if options.get("return_numpy", True):
        return outs
    from paddle.base import core

    tensors = []
    for array in outs:
        tensor = core.DenseTensor()
        tensor.set(array, paddle.CPUPlace())
        tensors.append(tensor)
    return tensors


_TRANSLATION_ATTR = "_paddle_ipu_translation"
# (program version, whether it holds optimizer ops), cached on the program
_TRAINING_ATTR = "_paddle_ipu_training"


def _translation(program: Any, feeds: list[str], fetches: list[Any]) -> tuple[Any, list[Any]]:
    """The PIR translation of a legacy program (cached on it per op count and
    fetch list) and the fetches as its values."""
    from paddle_ipu.compiler.legacy_reader import translate

    key = (
        len(program.global_block().ops),
        tuple(f if isinstance(f, str) else str(f.name) for f in fetches),
        tuple(feeds),
    )
    with _lock:
        cached = getattr(program, _TRANSLATION_ATTR, None)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        t = translate(program, feeds, fetches)
        setattr(program, _TRANSLATION_ATTR, (key, t.program, t.fetch_list))
        return t.program, t.fetch_list


def _check_native(program: Any, enabled: bool) -> None:
    writes = _inplace_writes(program)
    if not writes:
        return
    how = (
        f"unset {ENV_FLAG} (or set it to 1) to compile it implicitly, "
        if not enabled
        else "fetch the loss (or any value) so that it can be compiled, "
    )
    raise NotSupportedError(
        f"this program writes in place into persistable tensors ({'; '.join(writes)}); run "
        "op by op on the ipu place, the update would be lost. Compile it with "
        f"paddle_ipu.IpuCompiledProgram, {how}or run it on paddle.CPUPlace()"
    )


def _fetch_key(item: Any) -> tuple[str, Any]:
    if isinstance(item, str):
        return ("name", item)
    return ("value", getattr(item, "id", id(item)))


def _feed_signature(feed: dict[str, Any]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    sig = []
    for name in sorted(feed):
        value = feed[name]
        shape = tuple(int(d) for d in getattr(value, "shape", np.shape(value)))
        dtype = str(getattr(value, "dtype", np.asarray(value).dtype))
        sig.append((name, shape, dtype))
    return tuple(sig)


def _program_version(program: Any) -> tuple[int, int]:
    block = program.global_block()
    n = int(block.num_ops())
    last = block.back().id() if n else -1
    return n, int(last)


def _entry(
    program: Any,
    feed: dict[str, Any],
    fetches: list[Any],
    scope: Any,
    training: bool,
    version: tuple[int, int] | None = None,
) -> _ImplicitCompile:
    key = (
        version or _program_version(program),
        _feed_signature(feed),
        tuple(_fetch_key(f) for f in fetches),
        id(scope),
    )
    with _lock:
        cache: OrderedDict[Any, _ImplicitCompile] | None = getattr(program, _CACHE_ATTR, None)
        if cache is None:
            cache = OrderedDict()
            setattr(program, _CACHE_ATTR, cache)
        entry = cache.get(key)
        if entry is not None and entry.scope is scope:
            cache.move_to_end(key)
            return entry
        entry = _ImplicitCompile.compile(program, feed, fetches, scope, training)
        cache[key] = entry
        while len(cache) > MAX_VARIANTS:
            _, old = cache.popitem(last=False)
            old.close()
        return entry


def _micro_batch(program: Any, feed: dict[str, Any]) -> int:
    """The leading dimension of the first fed data op whose batch dimension is -1."""
    for op in program.global_block().ops:
        if op.name() != "pd_op.data":
            continue
        name = str(op.attrs()["name"])
        if name not in feed:
            continue
        shape = list(op.result(0).shape)
        value_shape = getattr(feed[name], "shape", np.shape(feed[name]))
        if shape and shape[0] == -1 and len(value_shape):
            return max(int(value_shape[0]), 1)
    return 1


class _ImplicitCompile:
    """One compiled variant and the scope state it was last synced with.

    After a training step the scope tensors are pointed at the session's own new
    arrays where the session has them (:meth:`Session.share_into`; the host trainer's
    float32 weights and optimizer state): no copy, and a write into such a tensor
    between steps is what the next step reads.  Such a tensor has changed only if it
    no longer holds that memory (``tensor.set`` with another size, a new variable).
    The rest is synced by comparing the scope's bytes with what was last written
    there, and updates are written into the scope tensors' own memory (their place
    and allocation stay), through zero-copy views cached per allocation."""

    def __init__(self, executor: Any, scope: Any, fetch_count: int) -> None:
        self.executor = executor
        self.scope = scope
        self.fetch_count = fetch_count
        self.lock = threading.Lock()
        self._synced: dict[str, np.ndarray] = {}
        # scope name -> (address, shape as Paddle lists it) of the session array its
        # tensor shares
        self._shared: dict[str, tuple[int, list[int]]] = {}
        self._float32: Any = None  # Paddle's float32 dtype, as a shared tensor has it
        self._pairs: list[tuple[str, str]] = []
        self._views: dict[str, tuple[int, np.ndarray]] = {}

    @classmethod
    def compile(
        cls, program: Any, feed: dict[str, Any], fetches: list[Any], scope: Any, training: bool
    ) -> _ImplicitCompile:
        from paddle_ipu.compiler.training import find_loss
        from paddle_ipu.pipeline import compile_executor
        from paddle_ipu.strategy import IpuStrategy

        strategy = IpuStrategy.unpatched()
        strategy.set_graph_config(
            num_ipus=1, is_training=training, micro_batch_size=_micro_batch(program, feed)
        )
        compiled_fetches = list(fetches) if fetches else [find_loss(program)]
        feed_names = sorted(feed)
        log.debug(
            "compiling the program implicitly for the ipu place (%s, feeds %s)",
            "training" if training else "inference",
            feed_names,
        )
        executor = compile_executor(program, scope, strategy, feed_names, compiled_fetches)
        entry = cls(executor, scope, len(fetches))
        entry._pairs = list(executor.weight_pairs())
        entry._record()
        return entry

    def close(self) -> None:
        self.executor.reset()

    # -- scope sync ---------------------------------------------------------
    def _view(self, name: str) -> np.ndarray | None:
        var = self.scope.find_var(name)
        if var is None:
            return None
        tensor = var.get_tensor()
        if not paddle_api.is_initialized(tensor):
            return None
        ptr = paddle_api.data_ptr(tensor)
        cached = self._views.get(name)
        if (
            cached is not None
            and cached[0] == ptr
            and tuple(cached[1].shape) == tuple(tensor.shape())
        ):
            return cached[1]
        from paddle_ipu._tensors.views import as_numpy

        array = as_numpy(tensor)
        self._views[name] = (ptr, array)
        return array

    def _record(self) -> None:
        self._shared = {}
        synced = {}
        for _, name in self._pairs:
            view = self._view(name)
            if view is not None:
                synced[name] = view.copy()
        self._synced = synced

    def _scope_changed(self) -> bool:
        for _, name in self._pairs:
            shared = self._shared.get(name)
            if shared is not None:
                var = self.scope.find_var(name)
                if var is None:
                    return True
                tensor = var.get_tensor()
                if (
                    not paddle_api.is_initialized(tensor)
                    or paddle_api.data_ptr(tensor) != shared[0]
                    or tensor.shape() != shared[1]
                    # a smaller dtype set in place keeps the address
                    or paddle_api.dtype_of(tensor) != self._float32
                ):
                    return True
                continue
            view = self._view(name)
            old = self._synced.get(name)
            if view is None or old is None:
                if view is not None or old is not None:
                    return True
                continue
            if not same_bytes(view, old):  # bytes, not values: NaN == NaN here
                return True
        return False

    def _write_back(self) -> None:
        """Training: the device's weights and optimizer state into the scope."""
        session = self.executor.session
        names = [d for d, _ in self._pairs]
        values = session.read_weights(names, copy=False)  # copied once, into the scope
        tensors: dict[str, Any] = {}
        for device_name, name in self._pairs:
            # a tensor that shares last step's array is float32 of this shape
            if name in self._shared or self._fits(name, values[device_name]):
                tensors[device_name] = self.scope.find_var(name).get_tensor()
        addresses = session.share_into(tensors) if tensors else {}
        synced: dict[str, np.ndarray] = {}
        shared: dict[str, tuple[int, list[int]]] = {}
        for device_name, name in self._pairs:
            value = values[device_name]
            address = addresses.get(device_name)
            if address is not None:
                if self._float32 is None:
                    self._float32 = paddle_api.dtype_of(tensors[device_name])
                shared[name] = (address, list(value.shape))
                self._views.pop(name, None)
                continue
            view = self._view(name)
            if view is None or not self._fits(name, value):
                # Not a plain copy (an uninitialised variable, a dtype change):
                # the executor's general path handles it.
                self.executor.weights_to_host()
                self._record()
                return
            np.copyto(view, value)
            synced[name] = value
        self._synced = synced
        self._shared = shared

    def _fits(self, name: str, value: np.ndarray) -> bool:
        view = self._view(name)
        return view is not None and view.shape == value.shape and view.dtype == value.dtype

    def run(self, feed: dict[str, Any]) -> list[np.ndarray]:
        executor = self.executor
        arrays = {name: as_array(value, name) for name, value in feed.items()}
        with self.lock:
            if self._scope_changed():
                executor.weights_from_host()
                self._record()
            outs = executor.run(arrays)
            if executor.config.is_training:
                self._write_back()
        return list(outs[: self.fetch_count])
