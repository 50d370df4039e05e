"""IpuCompiledProgram: a Paddle program compiled into one whole-graph IPU op.

``compile(feed_list, fetch_list)`` returns a runnable PIR program holding the feeds,
one ``ipu_runtime`` op (the whole graph, run by :class:`paddle_ipu.executor.IpuExecutor`
on the backend) and the fetches, so ``exe.run(prog, feed=..., fetch_list=...)``
works as it did in Paddle 2.x, on ``Executor(CustomPlace("ipu", 0))`` or on the CPU.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import CompileError, FetchError, OptionError, RuntimeClosedError
from paddle_ipu.executor.ipu_executor import IpuExecutor

if TYPE_CHECKING:
    from paddle_ipu.serving.model_runtime import ModelRuntime

_runtime_ids = iter(range(1 << 62))


class IpuCompiledProgram:
    """Compile a Paddle static program for the IPU.

    Args:
        program: the program to compile (default: the default main program).
        scope: the scope holding its parameters (default: the global scope).
        ipu_strategy: an :class:`paddle_ipu.IpuStrategy` (default: a new one).
    """

    def __init__(self, program: Any = None, scope: Any = None, ipu_strategy: Any = None) -> None:
        import paddle

        from paddle_ipu.strategy import IpuStrategy

        if program is None:
            program = paddle.static.default_main_program()
        if ipu_strategy is None:
            ipu_strategy = IpuStrategy()
        elif not isinstance(ipu_strategy, IpuStrategy):
            raise OptionError(
                f"ipu_strategy must be a paddle_ipu.IpuStrategy, got {type(ipu_strategy).__name__}"
            )
        self._program = program
        self._scope = scope if scope is not None else paddle.static.global_scope()
        self._strategy = ipu_strategy
        self.model: CompiledModel | None = None
        self.executor: IpuExecutor | None = None
        #: the model runtime (serving), when enable_model_runtime_executor is set
        self.runtime: ModelRuntime | None = None
        self._fetch_ids: dict[Any, int] = {}
        from paddle_ipu.compiler.legacy_reader import is_legacy

        #: a legacy-IR program (compiled through its PIR translation)
        self._legacy = is_legacy(program)
        #: serialises runs that go through Paddle's executor (PADDLE_IPU_DIRECT_RUN=0)
        self.paddle_run_lock = threading.Lock()

    @property
    def strategy(self) -> Any:
        return self._strategy

    def compile(self, feed_list: Sequence[Any], fetch_list: Sequence[Any]) -> Any:
        """Compile and load the graph; return the runnable program.

        ``feed_list``: feed names or data Values; ``fetch_list``: Values or names.
        The returned program has attributes ``org_program``, ``fetch_names`` and
        ``ipu_compiled_program`` (this object).  Compiles are serialised process-wide
        (Paddle's static-graph state is not thread-safe); compiling again closes the
        previous executor and releases its device.
        """
        from paddle_ipu.compiler.compile import _static_mode

        # A program can be compiled from dygraph mode too (Paddle's static-graph
        # APIs, which building the runnable program uses, assert otherwise).
        with _compile_lock, _static_mode():
            return self._compile(feed_list, fetch_list)

    def _compile(self, feed_list: Sequence[Any], fetch_list: Sequence[Any]) -> Any:
        s = self._strategy
        s.validate()
        from paddle_ipu.compat import wants_fp16

        if self._legacy and s.enable_fp16 and _holds_fp16(self._program):
            # A legacy program cast by Paddle's cast_model_to_fp16 is float16
            # already: it is compiled as it is, without a second conversion.
            s = s.copy()
            s.set_precision_config(enable_fp16=False)
        elif wants_fp16(self._program) and not s.enable_fp16:
            # Paddle 2.x ran a program cast by cast_model_to_fp16 in float16.
            s = s.copy()
            s.set_precision_config(enable_fp16=True)
        serving = bool(s.get("enable_model_runtime_executor"))
        if serving and s.is_training:
            raise OptionError(
                "enable_model_runtime_executor serves inference graphs only: compile with "
                "is_training=False, or unset enable_model_runtime_executor to train"
            )
        self.close_runtime()
        if self.executor is not None:
            self.executor.reset()
            self.executor = None
            self.model = None
        progress = _progress_reporter(
            s.get("compilation_progress_logger"), int(s.get("compilation_progress_total"))
        )
        if isinstance(feed_list, (str, bytes)) or not isinstance(feed_list, Sequence):
            feed_list = [feed_list]
        if not isinstance(fetch_list, Sequence) or isinstance(fetch_list, (str, bytes)):
            fetch_list = [fetch_list]
        # Strings 2.x code takes from ``var.name`` of intermediate values (names
        # made up by paddle_ipu.compat.names), and names of data ops and parameters,
        # become the program's Values; the string stays a way to fetch them.
        given = list(fetch_list)
        fetch_list = _resolve_fetch_names(self._program, given)
        executor = compile_executor(
            self._program, self._scope, s, list(feed_list), list(fetch_list), progress
        )
        # Fetches given as Values of the original program can be fetched by that
        # Value from the compiled one too (and by the name it was given as).
        self._fetch_ids = {
            _value_id(item): i for i, item in enumerate(fetch_list) if not isinstance(item, str)
        }
        for i, item in enumerate(given):
            if isinstance(item, str):
                self._fetch_ids.setdefault(item, i)
        self.model = executor.model
        self.executor = executor
        if serving and not executor.compile_only:
            from paddle_ipu.serving.model_runtime import ModelRuntime

            self.runtime = ModelRuntime(executor)
        shapes = self.runtime.request_shapes() if self.runtime is not None else None
        from paddle_ipu.compiler.legacy_reader import pir_mode

        with pir_mode():  # the runnable program is PIR, whatever the source's IR
            prog = build_runtime_program(self, shapes=shapes)
        prog.org_program = self._program
        prog.ipu_compiled_program = self
        scheduler = getattr(self._program, "lr_scheduler", None)
        if scheduler is not None:
            # 2.x's compiled program carried the scheduler (its tests step
            # ``program.lr_sheduler``: paddle_ipu.compat spells it so too); the
            # executor reads it each run.
            setattr(prog, "lr_scheduler", scheduler)  # noqa: B010
        _set_current_backend(self)
        progress(100)
        return prog

    @property
    def _backend(self) -> Any:
        """Paddle 2.x's ``IpuCompiledProgram._backend``: weights_to_host,
        weights_from_host, reset, detach, save_model_proto of this program."""
        from paddle_ipu.compat import IpuBackend

        return IpuBackend(self)

    # -- Paddle 2.x's backend calls --------------------------------------------
    def _require(self) -> IpuExecutor:
        if self.executor is None:
            raise CompileError("the program is not compiled yet: call compile() first")
        return self.executor

    def weights_to_host(self) -> None:
        """Copy weights and optimizer state from the device into the scope."""
        self._require().weights_to_host()

    def weights_from_host(self) -> None:
        """Copy weights and optimizer state from the scope to the device."""
        self._require().weights_from_host()

    def save_model(self, path: str) -> None:
        self._require().save_model(path)

    def save_model_proto(self, path: str) -> None:
        """Write the compiled ONNX model."""
        self._require().model.save_model_proto(path)

    def save(self, path: str) -> str:
        """Checkpoint weights and optimizer state: copied from the device to the
        scope, then written atomically as safetensors (see :mod:`paddle_ipu.checkpoint`).
        Returns the path written."""
        from paddle_ipu import checkpoint

        return checkpoint.save(self, path)

    def load(self, path: str) -> None:
        """Load a checkpoint written by :meth:`save` (or :func:`paddle_ipu.checkpoint.save`)
        into the scope, checking every name, shape and dtype first, then copy it to the
        device."""
        from paddle_ipu import checkpoint

        checkpoint.load(self, path)

    def reset(self) -> None:
        """Release the device (after the model runtime answered its queued requests)."""
        self.close_runtime()
        if self.executor is not None:
            self.executor.reset()

    def _request_runtime(self) -> ModelRuntime | None:
        """The model runtime a request goes to.  While a compile() is under way (it
        holds the compile lock, and has closed the old runtime) a request waits for
        it and goes to the new runtime, instead of reaching an executor that checks
        it against other shapes.  RuntimeClosedError after close_runtime()."""
        runtime = self.runtime
        if runtime is not None and not runtime.closed:
            return runtime
        if not self._strategy.get("enable_model_runtime_executor"):
            return runtime
        with _compile_lock:
            runtime, executor = self.runtime, self.executor
        if runtime is not None or executor is None or executor.released:
            return runtime  # None: the executor's own error (not compiled, reset)
        if executor.compile_only:
            return None
        raise RuntimeClosedError(
            "the model runtime of this program was closed (close_runtime()): call "
            "compile() again to serve requests"
        )

    def close_runtime(self, cancel: bool = False) -> None:
        """Stop the model runtime, if any (see :meth:`ModelRuntime.close`)."""
        if self.runtime is not None:
            self.runtime.close(cancel=cancel)
            self.runtime = None

    def run(self, feed: dict[str, Any]) -> list[np.ndarray]:
        """The executor's own numpy-in / numpy-out API (no Paddle executor); through
        the model runtime when it is on."""
        if self._legacy:
            # The host backend runs Paddle's PIR gradient program: PIR mode while
            # a legacy-IR program's compiled graph runs.
            from paddle_ipu.compiler.legacy_reader import pir_mode

            with pir_mode():
                return self._run(feed)
        return self._run(feed)

    def _run(self, feed: dict[str, Any]) -> list[np.ndarray]:
        runtime = self._request_runtime()
        if runtime is None:
            return self._require().run(feed)
        try:
            return runtime.run(feed)
        except RuntimeClosedError:
            # Closed before the request was admitted (a recompile began): the
            # request never ran; take it to the runtime of the new compile.
            runtime = self._request_runtime()
            if runtime is None:
                return self._require().run(feed)
            return runtime.run(feed)

    def submit(self, feed: dict[str, Any]) -> Future[list[np.ndarray]]:
        """Queue one request on the model runtime; a future of its outputs."""
        runtime = self._request_runtime()
        if runtime is not None and runtime.closed:  # closed after the check: once more
            runtime = self._request_runtime()
        if runtime is None and self.executor is not None and self.executor.released:
            self.executor._require_session()  # raises: reset, compile again
        if runtime is None:
            raise OptionError(
                "submit() needs the model runtime: set enable_model_runtime_executor=True "
                "(and is_training=False) before compile()"
            )
        return runtime.submit(feed)

    def fetchable(self) -> list[str]:
        """The names the compiled program can be fetched by (its outputs)."""
        outputs = self._require().model.outputs
        return [spec.paddle_name or spec.name for spec in outputs]

    def fetch_index(self, fetch_list: Any) -> list[int]:
        """Positions of ``fetch_list`` among the compiled outputs (names, or the
        original program's Values); FetchError for an item that is not one of them.
        ``None`` (or nothing) fetches every output."""
        executor = self._require()
        outputs = executor.model.outputs
        if fetch_list is None:
            return list(range(len(outputs)))
        items = list(fetch_list) if isinstance(fetch_list, (list, tuple)) else [fetch_list]
        if not items:
            return list(range(len(outputs)))
        names = self.fetchable()
        index = []
        for item in items:
            if isinstance(item, str):
                position = self._fetch_ids.get(item)
                if position is None:
                    position = self._fetch_ids.get(_made_up_key(item))
                if position is not None and item not in names:
                    index.append(position)
                    continue
                if item not in names:
                    raise FetchError(
                        f"fetch {item!r} is not an output of the compiled program; it can "
                        f"fetch {names} (compile with the value in fetch_list to fetch it)"
                    )
                index.append(names.index(item))
                continue
            position = self._fetch_ids.get(_value_id(item))
            if position is None:
                raise FetchError(
                    f"fetch {_describe_value(item)} was not compiled: the compiled program "
                    f"can fetch {names} (by these names, or by the Values given to "
                    "compile()); add it to compile()'s fetch_list to fetch it"
                )
            index.append(position)
        return index

    def fetch_names_for(self, index: Sequence[int]) -> list[str]:
        names = self.fetchable()
        return [names[i] for i in index]


def _holds_fp16(program: Any) -> bool:
    """Whether a legacy program computes in float16 (after Paddle's amp cast)."""

    fp16 = paddle_api.legacy_fp16_type()
    return any(getattr(var, "dtype", None) == fp16 for var in program.global_block().vars.values())


def _resolve_fetch_names(program: Any, fetch_list: list[Any]) -> list[Any]:
    from paddle_ipu.compat import names

    return list(names.resolve_fetches(program, fetch_list))


def _made_up_key(name: str) -> Any:
    """The value id a name made up by paddle_ipu.compat.names stands for."""
    from paddle_ipu.compat import names

    return names.made_up_key(name)


def _set_current_backend(compiled: IpuCompiledProgram) -> None:
    """What Paddle 2.x's ``core.IpuBackend.get_instance()`` acts on: the program
    compiled last."""
    from paddle_ipu.compat import IpuBackend

    IpuBackend._set_current(compiled)


def _describe_value(value: Any) -> str:
    try:
        if value.has_name:
            return repr(str(value.name))
    except Exception:
        pass
    try:
        op = value.get_defining_op()
        return f"<{op.name()} output {value.index()}, shape {list(value.shape)}>"
    except Exception:
        return f"<{type(value).__name__}>"


_compile_lock = threading.RLock()


def compile_executor(
    program: Any,
    scope: Any,
    strategy: Any,
    feed_list: list[Any],
    fetch_list: list[Any],
    progress: Callable[[int], None] | None = None,
) -> IpuExecutor:
    """Compile ``program`` for ``strategy`` and prepare an executor over it (the
    part of a compile that IpuCompiledProgram and implicit compiles share)."""
    from paddle_ipu.compiler.legacy_reader import is_legacy, pir_mode

    if is_legacy(program):
        # A legacy-IR program is translated to PIR by Paddle's own translator and
        # compiled as PIR (paddle_ipu.compiler.legacy_reader); Paddle's static APIs
        # must be in PIR mode meanwhile (a process-wide switch: compiles are
        # serialised by the compile lock).
        from paddle_ipu.compiler.legacy_reader import translate

        with _compile_lock, pir_mode():
            t = translate(program, feed_list, fetch_list)
            return _compile_executor(
                t.program, scope, strategy, t.feed_list, t.fetch_list, progress, t.fetch_names
            )
    return _compile_executor(program, scope, strategy, feed_list, fetch_list, progress)


def _compile_executor(
    program: Any,
    scope: Any,
    strategy: Any,
    feed_list: list[Any],
    fetch_list: list[Any],
    progress: Callable[[int], None] | None = None,
    fetch_names: list[str] | None = None,
) -> IpuExecutor:
    from paddle_ipu.compiler import compile_program

    report = progress or (lambda _percent: None)
    s = strategy
    with _compile_lock:
        report(0)
        model = compile_program(
            program,
            feed_list,
            fetch_list,
            scope=scope,
            micro_batch_size=int(s.micro_batch_size),
            enable_manual_shard=bool(s.enable_manual_shard),
            enable_pipelining=bool(s.enable_pipelining),
            onnx_dump_path=str(s.get("onnx_dump_path") or ""),
        )
        if fetch_names:
            # Outputs the user named (legacy variable names) are fetched by them.
            model = dataclasses.replace(
                model,
                outputs=[
                    dataclasses.replace(spec, paddle_name=name) if name else spec
                    for spec, name in zip(model.outputs, fetch_names)
                ],
            )
        report(40)
        source = None
        if s.is_training:
            from paddle_ipu.compiler.training import attach_training

            model, source = attach_training(
                model,
                program,
                fetch_list,
                scope=scope,
                loss_scaling=float(s.get("loss_scaling")),
            )
        executor = IpuExecutor(
            model,
            s,
            scope,
            lr_scheduler=getattr(program, "lr_scheduler", None),
            training_source=source,
        )
        report(60)
        executor.prepare()
        report(90)
        return executor


_inference_primed = False


def _prime_paddle_inference() -> None:
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


def build_runtime_program(
    compiled: IpuCompiledProgram,
    shapes: tuple[list[list[int]], list[list[int]]] | None = None,
) -> Any:
    """A PIR program: data ops -> one ipu_runtime op -> fetch ops.

    The op runs ``compiled.run``; ``shapes``: the feed and fetch shapes of one
    request (default: the step layout's), -1 for any size.  Paddle keeps a
    registered op's function for the life of the process, so the function holds
    the compiled program only weakly: the returned program holds it strongly (its
    ``ipu_compiled_program``), and dropping both releases the executor."""
    import paddle
    from paddle.static import MetaTensor, register_op

    _prime_paddle_inference()

    executor = compiled._require()
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

    def ipu_runtime(*tensors: Any) -> Any:
        owner = compiled_ref()
        if owner is None or owner.executor is None:
            raise CompileError(
                "this ipu_runtime op's IpuCompiledProgram was released or reset: compile again"
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
        name=f"ipu_runtime_{next(_runtime_ids)}",
        infer_meta=_positional(infer_meta, len(feed_names)),
        input_names=[f"feed_{i}" for i in range(len(feed_names))],
        output_names=[f"fetch_{i}" for i in range(len(fetch_names))],
    )(_positional(ipu_runtime, len(feed_names)))

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


def _host_array(tensor: Any) -> np.ndarray:
    """A feed tensor as numpy: a zero-copy view when it lives on the ipu place
    (where ``Tensor.numpy()`` costs a device copy), else ``numpy()``, which is
    the cheapest for small CPU tensors."""
    if tensor.place.is_custom_place():
        from paddle_ipu._infra.views import as_numpy

        return as_numpy(tensor, readonly=True)
    return np.asarray(tensor.numpy())


def _progress_reporter(logger: Any, total: int) -> Any:
    """Compile progress as ``logger(progress, total)`` (the strategy's
    compilation_progress_logger and compilation_progress_total), or debug log
    lines without a logger.  ``report`` takes a percentage."""
    import logging

    log = logging.getLogger("paddle_ipu")

    def report(percent: int) -> None:
        progress = total * percent // 100
        if logger is None:
            log.debug("compiling: %d/%d", progress, total)
        else:
            logger(progress, total)

    return report


def _value_id(value: Any) -> Any:
    # pir.Value overloads == (it builds an op), so key on its id; a legacy
    # Variable is known by its name.
    if isinstance(value, str):
        return value
    from paddle_ipu.compiler.legacy_reader import is_legacy_variable

    if is_legacy_variable(value):
        return str(value.name)
    return getattr(value, "id", None)


def _paddle_dtype(dtype: str) -> str:
    # Feeds keep Paddle's own dtypes: int64 stays int64 and is cast by the executor.
    return dtype


def _positional(fn: Any, n: int) -> Any:
    """register_op binds arguments by signature and drops ``*args``: give it a
    function with one named parameter per feed."""
    params = ", ".join(f"x{i}" for i in range(n))
    namespace: dict[str, Any] = {"_fn": fn}
    exec(f"def ipu_runtime({params}):\n    return _fn({params})\n", namespace)
    return namespace["ipu_runtime"]
