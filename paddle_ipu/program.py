"""IpuCompiledProgram: a Paddle program compiled into one whole-graph IPU op.

``compile(feed_list, fetch_list)`` returns a runnable PIR program holding the feeds,
one ``ipu_runtime`` op (the whole graph, run by :class:`paddle_ipu.executor.Executor`
on the backend) and the fetches, so ``exe.run(prog, feed=..., fetch_list=...)``
works as it did in Paddle 2.x, on ``Executor(CustomPlace("ipu", 0))`` or on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import CompileError, OptionError
from paddle_ipu.executor import Executor

if TYPE_CHECKING:
    from paddle_ipu.runtime import ModelRuntime

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
        self.executor: Executor | None = None
        #: the model runtime (serving), when enable_model_runtime_executor is set
        self.runtime: ModelRuntime | None = None
        self._fetch_ids: dict[Any, int] = {}

    @property
    def strategy(self) -> Any:
        return self._strategy

    def compile(self, feed_list: Sequence[Any], fetch_list: Sequence[Any]) -> Any:
        """Compile and load the graph; return the runnable program.

        ``feed_list``: feed names or data Values; ``fetch_list``: Values or names.
        The returned program has attributes ``org_program``, ``fetch_names`` and
        ``ipu_compiled_program`` (this object).
        """
        from paddle_ipu.compiler import compile_program

        s = self._strategy
        s.validate()
        serving = bool(s.get("enable_model_runtime_executor"))
        if serving and s.is_training:
            raise OptionError(
                "enable_model_runtime_executor serves inference graphs only: compile with "
                "is_training=False, or unset enable_model_runtime_executor to train"
            )
        self.close_runtime()
        progress = _progress_reporter(
            s.get("compilation_progress_logger"), int(s.get("compilation_progress_total"))
        )
        progress(0)
        if isinstance(feed_list, (str, bytes)) or not isinstance(feed_list, Sequence):
            feed_list = [feed_list]
        if not isinstance(fetch_list, Sequence) or isinstance(fetch_list, (str, bytes)):
            fetch_list = [fetch_list]
        model = compile_program(
            self._program,
            list(feed_list),
            list(fetch_list),
            scope=self._scope,
            micro_batch_size=int(s.micro_batch_size),
            enable_manual_shard=bool(s.enable_manual_shard),
            enable_pipelining=bool(s.enable_pipelining),
            onnx_dump_path=str(s.get("onnx_dump_path") or ""),
        )
        progress(40)
        if s.is_training:
            from paddle_ipu.compiler.training import attach_training

            model = attach_training(
                model,
                self._program,
                list(fetch_list),
                scope=self._scope,
                loss_scaling=float(s.get("loss_scaling")),
            )
        # Fetches given as Values of the original program can be fetched by that
        # Value from the compiled one too.
        self._fetch_ids = {
            _value_id(item): i for i, item in enumerate(fetch_list) if not isinstance(item, str)
        }
        executor = Executor(
            model, s, self._scope, lr_scheduler=getattr(self._program, "lr_scheduler", None)
        )
        progress(60)
        executor.prepare()
        progress(90)
        self.model = model
        self.executor = executor
        if serving and not executor.compile_only:
            from paddle_ipu.runtime import ModelRuntime

            self.runtime = ModelRuntime(executor)
        shapes = self.runtime.request_shapes() if self.runtime is not None else None
        prog = build_runtime_program(executor, run=self.run, shapes=shapes)
        prog.org_program = self._program
        prog.ipu_compiled_program = self
        install_executor_hook()
        progress(100)
        return prog

    # -- Paddle 2.x's backend calls --------------------------------------------
    def _require(self) -> Executor:
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

    def reset(self) -> None:
        """Release the device (after the model runtime answered its queued requests)."""
        self.close_runtime()
        if self.executor is not None:
            self.executor.reset()

    def close_runtime(self, cancel: bool = False) -> None:
        """Stop the model runtime, if any (see :meth:`ModelRuntime.close`)."""
        if self.runtime is not None:
            self.runtime.close(cancel=cancel)
            self.runtime = None

    def run(self, feed: dict[str, Any]) -> list[np.ndarray]:
        """The executor's own numpy-in / numpy-out API (no Paddle executor); through
        the model runtime when it is on."""
        runtime = self.runtime
        if runtime is not None:
            return runtime.run(feed)
        return self._require().run(feed)

    def submit(self, feed: dict[str, Any]) -> Future[list[np.ndarray]]:
        """Queue one request on the model runtime; a future of its outputs."""
        runtime = self.runtime
        if runtime is None:
            raise OptionError(
                "submit() needs the model runtime: set enable_model_runtime_executor=True "
                "(and is_training=False) before compile()"
            )
        return runtime.submit(feed)

    def fetch_index(self, fetch_list: Any) -> list[int] | None:
        """Positions of ``fetch_list`` among the compiled outputs (names, or the
        original program's Values), or None when an item is not one of them."""
        executor = self._require()
        outputs = executor.model.outputs
        if fetch_list is None:
            return list(range(len(outputs)))
        items = fetch_list if isinstance(fetch_list, (list, tuple)) else [fetch_list]
        names = [spec.paddle_name or spec.name for spec in outputs]
        index = []
        for item in items:
            if isinstance(item, str):
                if item not in names:
                    return None
                index.append(names.index(item))
            else:
                position = self._fetch_ids.get(_value_id(item))
                if position is None:
                    return None
                index.append(position)
        return index


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
        with tempfile.TemporaryDirectory(prefix="paddle_ipu_", dir=scratch) as tmp:
            prog, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(prog, startup):
                x = paddle.static.data("x", [1], "float32")
                y = paddle.scale(x, 2.0)
            prefix = os.path.join(tmp, "m")
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.static.save_inference_model(prefix, [x], [y], exe, program=prog)
            config = pi.Config(prefix + ".json", "")
            config.disable_glog_info()
            pi.create_predictor(config)
    except Exception as exc:  # priming is a precaution, never a reason to fail
        import logging

        logging.getLogger("paddle_ipu").debug("could not prime paddle.inference: %s", exc)


def build_runtime_program(
    executor: Executor,
    run: Callable[[dict[str, Any]], list[np.ndarray]] | None = None,
    shapes: tuple[list[list[int]], list[list[int]]] | None = None,
) -> Any:
    """A PIR program: data ops -> one ipu_runtime op -> fetch ops.

    ``run`` runs the op (default: ``executor.run``); ``shapes``: the feed and fetch
    shapes of one request (default: the step layout's), -1 for any size."""
    import paddle
    from paddle.static import MetaTensor, register_op

    _prime_paddle_inference()

    model = executor.model
    layout = executor.layout
    config = executor.session_config()
    run_graph = run if run is not None else executor.run
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
        executor.last_error = None
        try:
            feed = {name: _host_array(t) for name, t in zip(feed_names, tensors)}
            outs = run_graph(feed)
        except Exception as exc:
            # Paddle turns any exception of a Python op into a SystemError; keep
            # ours so that the executor hook can raise it as it was.
            executor.last_error = exc
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
            fetched = paddle._pir_ops.fetch(value, name, col)  # type: ignore[attr-defined]
            fetched.persistable = True
    # pir.Program takes new attributes; Paddle 2.x's compiled program had these.
    setattr(prog, "fetch_names", fetch_names)  # noqa: B010
    setattr(prog, "feed_names", feed_names)  # noqa: B010
    return prog


def _host_array(tensor: Any) -> np.ndarray:
    """A feed tensor as numpy: a zero-copy view when it lives on the ipu place
    (where ``Tensor.numpy()`` costs a device copy), else ``numpy()``, which is
    the cheapest for small CPU tensors."""
    if tensor.place.is_custom_place():
        from paddle_ipu.tensor_view import as_numpy

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
    # pir.Value overloads == (it builds an op), so key on its id.
    return getattr(value, "id", None) if not isinstance(value, str) else value


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


# -- exe.run of a compiled program ---------------------------------------------
#
# Paddle's executor runs the ipu_runtime op like any Python op: it adds a fixed
# cost of about 0.3 ms per call (more on the ipu place), and it turns every
# exception the op raises into a bare SystemError.  The hook below sends
# exe.run of a program compiled here straight to its IPU executor -- the same
# code the op runs -- and, when the program does go through Paddle's executor
# (PADDLE_IPU_DIRECT_RUN=0, or arguments only Paddle understands), re-raises the
# op's own exception.

_hook_installed = False


def _direct_run_enabled() -> bool:
    import os

    return os.environ.get("PADDLE_IPU_DIRECT_RUN", "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def install_executor_hook() -> None:
    """Route ``paddle.static.Executor.run`` of compiled IPU programs (idempotent)."""
    global _hook_installed
    if _hook_installed:
        return
    import functools

    import paddle

    original = paddle.static.Executor.run

    @functools.wraps(original)
    def run(
        self: Any,
        program: Any = None,
        feed: Any = None,
        fetch_list: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        compiled = getattr(program, "ipu_compiled_program", None) if program is not None else None
        if compiled is None:
            return original(self, program, feed, fetch_list, *args, **kwargs)
        simple = not args and kwargs.get("return_numpy", True) and kwargs.get("scope") is None
        if simple and _direct_run_enabled():
            index = compiled.fetch_index(fetch_list)
            if index is not None:
                outs = compiled.run(dict(feed or {}))
                return [outs[i] for i in index]
        executor = compiled.executor
        # Paddle's executor fails on unknown or missing feeds with its own
        # errors before the op runs: check the names first.
        executor.check_feed_names(feed or {})
        try:
            return original(self, program, feed, fetch_list, *args, **kwargs)
        except SystemError as exc:
            error = getattr(executor, "last_error", None)
            if error is not None:
                executor.last_error = None
                raise error from exc
            raise

    paddle.static.Executor.run = run  # type: ignore[method-assign]
    _hook_installed = True
