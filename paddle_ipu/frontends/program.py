"""IpuCompiledProgram: a Paddle program compiled into one whole-graph IPU op.

``compile(feed_list, fetch_list)`` returns a runnable PIR program holding the feeds,
one ``ipu_graph`` op (the whole graph, run by :class:`paddle_ipu.executor.IpuExecutor`
on the backend) and the fetches, so ``exe.run(prog, feed=..., fetch_list=...)``
works as it did in Paddle 2.x, on ``Executor(CustomPlace("ipu", 0))`` or on the CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import CompileError, FetchError, OptionError, RuntimeClosedError
from paddle_ipu.executor.ipu_executor import IpuExecutor
from paddle_ipu.frontends import fetch_names
from paddle_ipu.frontends.graph_op import build_graph_program
from paddle_ipu.frontends.ipu_backend import IpuBackend, set_last_compiled
from paddle_ipu.pipeline import compile_executor, compile_lock, progress_reporter

if TYPE_CHECKING:
    from paddle_ipu.serving.model_runtime import ModelRuntime


#: attribute a PIR program gets from Paddle 2.x's ``cast_model_to_fp16`` (see
#: paddle_ipu.compat): compile it in float16
FP16_ATTR = "_paddle_ipu_fp16"


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
            ipu_strategy = IpuStrategy.unpatched()
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
        #: fetch lists of names already resolved (fetch_index), by their tuple of names
        self._fetch_cache: dict[tuple[str, ...], list[int]] = {}
        from paddle_ipu.compiler.legacy_reader import is_legacy

        #: a legacy-IR program (compiled through its PIR translation)
        self._legacy = is_legacy(program)
        #: serialises runs that go through Paddle's executor (PADDLE_IPU_DIRECT_RUN=0)
        self.paddle_run_lock = threading.Lock()

    @property
    def source_program(self) -> Any:
        """The program this was created from (the one ``compile()`` compiles)."""
        return self._program

    @property
    def scope(self) -> Any:
        """The scope holding the program's weights."""
        return self._scope

    @property
    def strategy(self) -> Any:
        return self._strategy

    @property
    def _backend(self) -> IpuBackend:
        """Paddle 2.x's ``IpuCompiledProgram._backend``: weights_to_host,
        weights_from_host, reset, detach, save_model_proto of this program."""
        return IpuBackend(self)

    def compile(self, feed_list: Sequence[Any], fetch_list: Sequence[Any]) -> Any:
        """Compile and load the graph; return the runnable program.

        ``feed_list``: feed names or data Values; ``fetch_list``: Values or names.
        The returned program has attributes ``org_program``, ``fetch_names`` and
        ``ipu_compiled_program`` (this object).  Compiles are serialised process-wide
        (Paddle's static-graph state is not thread-safe); compiling again closes the
        previous executor and releases its device.
        """
        from paddle_ipu.compiler.compile import static_mode

        # A program can be compiled from dygraph mode too (Paddle's static-graph
        # APIs, which building the runnable program uses, assert otherwise).
        with compile_lock, static_mode():
            return self._compile(feed_list, fetch_list)

    def _compile(self, feed_list: Sequence[Any], fetch_list: Sequence[Any]) -> Any:
        s = self._strategy
        s.validate()

        source = self._program
        if self._legacy and s.is_training and _holds_fp16(self._program):
            # Training a legacy program cast by Paddle's cast_model_to_fp16: its float32
            # twin, compiled in float16 (see legacy_reader.float32_twin), as a PIR
            # program marked by cast_model_to_fp16 is.
            from paddle_ipu.compiler.legacy_reader import float32_twin

            source = float32_twin(self._program)
            if not s.enable_fp16:
                s = s.copy()
                s.set_precision_config(enable_fp16=True)
        elif self._legacy and s.enable_fp16 and _holds_fp16(self._program):
            # A legacy program cast by Paddle's cast_model_to_fp16 is float16
            # already: it is compiled as it is, without a second conversion.
            s = s.copy()
            s.set_precision_config(enable_fp16=False)
        elif getattr(self._program, FP16_ATTR, False) and not s.enable_fp16:
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
        progress = progress_reporter(
            s.get("compilation_progress_logger"), int(s.get("compilation_progress_total"))
        )
        if isinstance(feed_list, (str, bytes)) or not isinstance(feed_list, Sequence):
            feed_list = [feed_list]
        if not isinstance(fetch_list, Sequence) or isinstance(fetch_list, (str, bytes)):
            fetch_list = [fetch_list]
        # Strings 2.x code takes from ``var.name`` of intermediate values (names
        # made up by paddle_ipu.frontends.fetch_names), and names of data ops and parameters,
        # become the program's Values; the string stays a way to fetch them.
        given = list(fetch_list)
        fetch_list = _resolve_fetch_names(self._program, given)
        executor = compile_executor(
            source, self._scope, s, list(feed_list), list(fetch_list), progress
        )
        # Fetches given as Values of the original program can be fetched by that
        # Value from the compiled one too (and by the name it was given as).
        self._fetch_cache = {}
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
            prog = build_graph_program(self, shapes=shapes)
        prog.org_program = self._program
        prog.ipu_compiled_program = self
        scheduler = getattr(self._program, "lr_scheduler", None)
        if scheduler is not None:
            # 2.x's compiled program carried the scheduler (its tests step
            # ``program.lr_sheduler``: paddle_ipu.compat spells it so too); the
            # executor reads it each run.
            setattr(prog, "lr_scheduler", scheduler)  # noqa: B010
        set_last_compiled(self)
        progress(100)
        return prog

    # -- Paddle 2.x's backend calls --------------------------------------------
    def require_executor(self) -> IpuExecutor:
        if self.executor is None:
            raise CompileError("the program is not compiled yet: call compile() first")
        return self.executor

    def weights_to_host(self) -> None:
        """Copy weights and optimizer state from the device into the scope."""
        self.require_executor().weights_to_host()

    def weights_from_host(self) -> None:
        """Copy weights and optimizer state from the scope to the device."""
        self.require_executor().weights_from_host()

    def save_model(self, path: str) -> None:
        self.require_executor().save_model(path)

    def save_model_proto(self, path: str) -> None:
        """Write the compiled ONNX model."""
        self.require_executor().model.save_model_proto(path)

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
        with compile_lock:
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
            return self.require_executor().run(feed)
        try:
            return runtime.run(feed)
        except RuntimeClosedError:
            # Closed before the request was admitted (a recompile began): the
            # request never ran; take it to the runtime of the new compile.
            runtime = self._request_runtime()
            if runtime is None:
                return self.require_executor().run(feed)
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
        outputs = self.require_executor().model.outputs
        return [spec.paddle_name or spec.name for spec in outputs]

    def fetch_index(self, fetch_list: Any) -> list[int]:
        """Positions of ``fetch_list`` among the compiled outputs (names, or the
        original program's Values); FetchError for an item that is not one of them.
        ``None`` (or nothing) fetches every output."""
        # The same list of names every run (``prog.fetch_names``): resolved once.
        key = _names_key(fetch_list)
        if key is not None:
            found = self._fetch_cache.get(key)
            if found is not None and self.executor is not None:
                return found
        index = self._fetch_index(fetch_list)
        if key is not None and len(self._fetch_cache) < _FETCH_CACHE_SIZE:
            self._fetch_cache[key] = index
        return index

    def _fetch_index(self, fetch_list: Any) -> list[int]:
        executor = self.require_executor()
        outputs = executor.model.outputs
        if fetch_list is None:
            return list(range(len(outputs)))
        items = _flatten_fetches(fetch_list)
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


#: fetch lists of names a compiled program remembers having resolved
_FETCH_CACHE_SIZE = 64


def _names_key(fetch_list: Any) -> tuple[str, ...] | None:
    """A list (or tuple) of names as a key of the resolved fetch lists; None for any
    other fetch list (Values, nested lists, None)."""
    if type(fetch_list) in (list, tuple) and all(type(item) is str for item in fetch_list):
        return tuple(fetch_list)
    return None


def _flatten_fetches(fetch_list: Any) -> list[Any]:
    """The fetch list as Paddle's executor reads it: nested lists and tuples (2.x's
    ``fetch_list=[fetch_targets]`` from load_inference_model) give their items."""
    if not isinstance(fetch_list, (list, tuple)):
        return [fetch_list]
    out: list[Any] = []
    for item in fetch_list:
        out.extend(_flatten_fetches(item) if isinstance(item, (list, tuple)) else [item])
    return out


def _holds_fp16(program: Any) -> bool:
    """Whether a legacy program computes in float16 (after Paddle's amp cast)."""

    fp16 = paddle_api.legacy_fp16_type()
    return any(_var_dtype(var) == fp16 for var in program.global_block().vars.values())


def _var_dtype(var: Any) -> Any:
    """A legacy variable's dtype; None for one without a tensor (the feed and fetch
    variables of a loaded inference model raise RuntimeError instead)."""
    try:
        return var.dtype
    except (AttributeError, RuntimeError):
        return None


def _resolve_fetch_names(program: Any, fetch_list: list[Any]) -> list[Any]:
    return list(fetch_names.resolve_fetches(program, fetch_list))


def _made_up_key(name: str) -> Any:
    """The value id a name made up by paddle_ipu.frontends.fetch_names stands for."""
    return fetch_names.made_up_key(name)


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


def _value_id(value: Any) -> Any:
    # pir.Value overloads == (it builds an op), so key on its id; a legacy
    # Variable is known by its name.
    if isinstance(value, str):
        return value
    from paddle_ipu.compiler.legacy_reader import is_legacy_variable

    if is_legacy_variable(value):
        return str(value.name)
    return getattr(value, "id", None)
