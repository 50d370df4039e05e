"""The IPU executor: prepare, run, weight sync and reset over a backend Session.

This is Paddle 2.x's ``ipu_executor.cc`` in Python.  It owns the IPU semantics --
the step layout, the feed check (:mod:`paddle_ipu.executor.feeds`), weight and
optimizer-state sync with the Paddle scope (under Paddle's names), fp16 <-> fp32
conversion of weights, lr updates and eval mode -- and leaves running the graph to the
backend.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu._tensors.views import as_numpy
from paddle_ipu._util.env import env_flag
from paddle_ipu._util.files import write_atomically
from paddle_ipu.backends.base import Session, SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import BackendError, IpuError, RuntimeClosedError
from paddle_ipu.executor.config import ConfigSource, ExecutorConfig
from paddle_ipu.executor.feeds import FeedPlan

log = logging.getLogger("paddle_ipu")

#: where IPU_COMPILE_ONLY=1 writes the offline executable (Paddle 2.x's path)
OFFLINE_CACHE = "./offline_cache.popart"


class Server(Protocol):
    """What the executor asks of a model runtime that serves it (it sets
    ``IpuExecutor.serving``): once the runtime is closed, direct runs are refused."""

    @property
    def closed(self) -> bool: ...

    def is_worker_thread(self) -> bool: ...


class IpuExecutor:
    """Runs one CompiledModel on one backend session.

    Thread safety: runs, weight copies, prepare and reset of one executor are
    serialised by a lock, so concurrent runs of a training program give exactly
    the weights of some sequential order of those runs.  Feeds are validated
    before the lock is taken.

    Args:
        model: the compiled graph.
        strategy: the IpuStrategy it was compiled with, or its
            :class:`~paddle_ipu.executor.config.ExecutorConfig` (what the executor reads
            of it, made and checked once by ``IpuStrategy.executor_config()``).
        scope: the Paddle scope holding the weights (default: the global scope).
        backend: a backend name ("host", "popart", "auto"); default: the strategy's.
        lr_scheduler: the program's ``paddle.optimizer.lr.LRScheduler``, read at
            every run (Paddle's executor wrote it into the scope the same way).
    """

    def __init__(
        self,
        model: CompiledModel,
        strategy: ExecutorConfig | ConfigSource,
        scope: Any = None,
        backend: str | None = None,
        lr_scheduler: Any = None,
        training_source: Any = None,
    ) -> None:
        config = strategy if isinstance(strategy, ExecutorConfig) else strategy.executor_config()
        #: what the executor reads of its strategy (typed, checked when it was made)
        self.config = config
        self.model = model
        self.lr_scheduler = lr_scheduler
        #: the Paddle program a training model was compiled from
        #: (:class:`paddle_ipu.compiler.training.TrainingSource`), given to the backend
        self.training_source = training_source
        self._scope = scope
        self._backend_name = backend or config.backend
        self.session: Session | None = None
        self.compile_only = False
        #: the exception of the last failed run (kept for Paddle's op path)
        self.last_error: BaseException | None = None
        self._optimizer_key: tuple[bool, float] | None = None
        # Serialises everything that touches the session or the weight state.
        # Re-entrant: prepare() calls reset(), save_model() weights_to_host().
        self._lock = threading.RLock()
        #: True after reset(): the device is released until prepare() runs again
        self.released = False
        #: the model runtime serving this executor, when one was started over it
        self.serving: Server | None = None
        self.layout = config.layout
        self._training = config.is_training
        self._output_names = [spec.name for spec in model.outputs]
        #: the feed check (the one in paddle_ipu.executor.feeds)
        self.feeds = FeedPlan(model.inputs, self.layout)

    # -- properties -----------------------------------------------------------
    @property
    def scope(self) -> Any:
        if self._scope is None:
            import paddle

            self._scope = paddle.static.global_scope()
        return self._scope

    @property
    def backend(self) -> str:
        from paddle_ipu.backends import resolve

        return resolve(self._backend_name)

    def session_config(self) -> SessionConfig:
        c = self.config
        return SessionConfig(
            batches_per_step=self.layout.batches_per_step,
            accumulation_factor=self.layout.accumulation_factor,
            replication_factor=self.layout.replication_factor,
            anchors={spec.name: c.anchor for spec in self.model.outputs},
            is_training=c.is_training,
            enable_fp16=c.enable_fp16,
            random_seed=c.random_seed,
            num_threads=c.host_num_threads,
            gradient_reduction=c.gradient_reduction,
            options=c.options,
            explicit=c.explicit,
            patterns=dict(c.patterns),
            training_source=self.training_source,
        )

    # -- prepare / reset ------------------------------------------------------
    def prepare(self) -> None:
        """Create the session, load it on the device and copy the weights there.

        With ``IPU_COMPILE_ONLY=1`` the graph is compiled and exported to
        ``./offline_cache.popart`` and runs are skipped.
        """
        from paddle_ipu.backends import create_session

        with self._lock:
            self._close_session()
            self.released = False
            self._optimizer_key = None
            self.compile_only = env_flag("IPU_COMPILE_ONLY")
            session = create_session(self.backend, self.model, self.session_config())
            self.session = session
            if self.compile_only:
                path = write_atomically(OFFLINE_CACHE, session.compile_and_export)
                log.warning(
                    "IPU_COMPILE_ONLY is set: compiled and exported %s; runs are skipped", path
                )
                return
            session.prepare_device()
            self.weights_from_host()
            seed = self.config.random_seed
            if seed is not None:
                session.set_random_seed(seed)

    def reset(self) -> None:
        """Release the session and its device (Paddle 2.x's Reset).  Later runs
        raise until the program is compiled (or the executor prepared) again."""
        with self._lock:
            self._close_session()
            self.released = True

    def _close_session(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None

    def _require_session(self) -> Session:
        session = self.session
        if session is None:
            if self.released:
                raise BackendError(
                    "the program was reset (its device is released) and is not prepared: "
                    "call compile() again"
                )
            raise BackendError("the executor is not prepared: compile the program first")
        return session

    # -- run ------------------------------------------------------------------
    def run(self, feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run one step group: numpy (or array-like) feeds in, fetches out, in
        the compiled fetch order and PopART's layout.

        A training run is all or nothing: every step's feed is validated before the
        first update, and a failure inside the run restores the weights and the
        optimizer state the run started from."""
        self._require_session()
        self._check_serving()
        if self.compile_only:
            log.info("IPU_COMPILE_ONLY is set: skipping the run")
            return [np.empty((0,), spec.numpy_dtype) for spec in self.model.outputs]
        inputs = self.feeds.check(feed)
        with self._lock:
            session = self._require_session()  # a reset may have come in between
            if not self._training:
                outputs = session.run(inputs)
            else:
                self._before_run(session)
                snapshot = session.snapshot()
                try:
                    outputs = session.run(inputs)
                except BaseException:
                    session.restore(snapshot)
                    raise
        return [outputs[name] for name in self._output_names]

    def _check_serving(self) -> None:
        """A program that serves through the model runtime takes its requests
        there; once that runtime is closed (by a recompile or reset()), a request
        that reaches the executor directly gets this error instead of a feed check
        made for the runtime's request shapes."""
        runtime = self.serving
        if runtime is None or not runtime.closed or runtime.is_worker_thread():
            return
        raise RuntimeClosedError(
            "the model runtime serving this program is closed (the program is being "
            "recompiled, or was reset or closed): wait for compile() to return and retry "
            "on the new program"
        )

    def _before_run(self, session: Session) -> None:
        """Training: send the optimizer the current lr, or the eval optimizer
        (lr 0, no weight decay) when ``runtime_options.enable_eval`` is on.

        The lr comes from the program's lr scheduler variable (read from the scope
        every run, Paddle 2.x's with_lr_sched path) or from the ``lr`` option when
        it was set.  The session is updated only when the optimizer changes."""
        optimizer = self.model.optimizer
        if not self._training or optimizer is None:
            return
        import dataclasses

        run_time = self.config.run_time()
        eval_mode = run_time.enable_eval
        if eval_mode:
            params = tuple(dataclasses.replace(p, weight_decay=0.0) for p in optimizer.params)
            wanted = dataclasses.replace(optimizer, lr=0.0, weight_decay=0.0, params=params)
        else:
            wanted = dataclasses.replace(optimizer, lr=self._current_lr(optimizer, run_time.lr))
        key = (eval_mode, float(wanted.lr))
        if key != self._optimizer_key:
            session.update_optimizer(wanted)
            session.set_eval(eval_mode)
            self._optimizer_key = key

    def _current_lr(self, optimizer: Any, option: float | None) -> float:
        # An lr option set away from its default (0.0) wins, as in Paddle 2.x.
        if option is not None:
            return option
        if self.lr_scheduler is not None:
            return float(self.lr_scheduler())
        if optimizer.lr_name:
            tensor = self._scope_tensor(optimizer.lr_name)
            if tensor is not None and paddle_api.is_initialized(tensor):
                return float(np.array(tensor).reshape(-1)[0])
        return float(optimizer.lr)

    def check_feed(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate feeds against the compiled inputs (:class:`FeedPlan`, the one feed
        check): ONNX input name -> array in the step layout (no copy unless a dtype cast
        is needed)."""
        return self.feeds.check(feed)

    def check_feed_names(self, feed: Mapping[str, Any]) -> dict[str, TensorSpec]:
        """Raise FeedError for unknown or missing feeds; return name -> spec."""
        return self.feeds.check_names(feed)

    # -- weights --------------------------------------------------------------
    def weight_pairs(self) -> list[tuple[str, str]]:
        """(device name, Paddle name) for every weight and optimizer-state tensor the
        session keeps in sync (:meth:`OptimizerConfig.all_names`, the one mapping)."""
        pairs = dict(self.model.weights)
        optimizer = self.model.optimizer
        if self._training and optimizer is not None:
            pairs = optimizer.all_names(self.model.weights)
        session = self._require_session()
        return [(d, p) for d, p in pairs.items() if session.has_info(d)]

    def _scope_tensor(self, paddle_name: str) -> Any:
        var = self.scope.find_var(paddle_name)
        if var is None:
            return None
        return var.get_tensor()

    def weights_from_host(self) -> None:
        """Copy weights (and optimizer state) from the Paddle scope to the device,
        converting fp32 <-> fp16 to the device's dtype."""
        with self._lock:
            self._weights_from_host()

    def _weights_from_host(self) -> None:
        session = self._require_session()
        batch: dict[str, np.ndarray] = {}
        for device_name, paddle_name in self.weight_pairs():
            tensor = self._scope_tensor(paddle_name)
            if tensor is None or not paddle_api.is_initialized(tensor):
                continue
            # A zero-copy view: the session makes the one copy it keeps.
            value = as_numpy(tensor, readonly=True)
            info = session.get_info(device_name)
            batch[device_name] = _convert(value, info.numpy_dtype, device_name, paddle_name)
        if batch:
            session.write_weights(batch)

    def weights_to_host(self) -> None:
        """Copy weights and optimizer state from the device into the Paddle scope,
        under Paddle's names, in the dtype each Paddle variable has, on the place
        each variable lives on."""
        with self._lock:
            self._weights_to_host()

    def _weights_to_host(self) -> None:
        session = self._require_session()
        if self.compile_only:
            return
        if not self._training:
            log.warning("an inference graph does not change its weights; nothing to copy back")
            return
        pairs = self.weight_pairs()
        # tensor.set copies: the session's own arrays are enough
        values = session.read_weights([d for d, _ in pairs], copy=False)
        for device_name, paddle_name in pairs:
            tensor = self._scope_tensor(paddle_name)
            if tensor is None:
                continue
            current = np.array(tensor, copy=False)
            value = _convert(values[device_name], current.dtype, device_name, paddle_name)
            tensor.set(np.ascontiguousarray(value), _place_of(tensor, paddle_name))

    def save_model(self, path: str) -> None:
        """Copy the weights back to the scope, then write the model (ONNX on the
        host backend, PopART's model proto on IPUs) to ``path``."""
        with self._lock:
            session = self._require_session()
            if self._training:
                self._weights_to_host()
            session.model_to_host(path)


def executor_for(
    model: CompiledModel,
    strategy: ExecutorConfig | ConfigSource,
    scope: Any = None,
    *,
    backend: str | None = None,
    lr_scheduler: Any = None,
    training_source: Any = None,
    prepare: bool = True,
) -> IpuExecutor:
    """An executor over ``model`` on its backend session (prepared unless asked not
    to): the step every front door ends in, a package's load included."""
    executor = IpuExecutor(
        model,
        strategy,
        scope,
        backend=backend,
        lr_scheduler=lr_scheduler,
        training_source=training_source,
    )
    if prepare:
        executor.prepare()
    return executor


def _place_of(tensor: Any, paddle_name: str) -> Any:
    """The place a scope tensor lives on, as ``DenseTensor.set`` takes it."""
    import paddle

    if not paddle_api.is_initialized(tensor):
        return paddle.CPUPlace()
    place = paddle_api.place_of(tensor)
    if place.is_cpu_place():
        return paddle.CPUPlace()
    if place.is_custom_place():
        return paddle.CustomPlace(place.custom_device_type(), place.custom_device_id())
    if place.is_gpu_place():
        return paddle.CUDAPlace(place.gpu_device_id())
    raise IpuError(f"weight {paddle_name!r} lives on {place}, which paddle-ipu cannot write to")


def _convert(value: np.ndarray, dtype: np.dtype, device_name: str, paddle_name: str) -> np.ndarray:
    """Convert a weight between Paddle's dtype and the device's (the seed's
    ConvertWeights table, with fp16 Paddle <-> fp32 device supported too)."""
    if value.dtype == dtype:
        return value
    kinds = {value.dtype.name, np.dtype(dtype).name}
    if not kinds <= {"float16", "float32"}:
        raise IpuError(
            f"weight {paddle_name!r} (device {device_name!r}): cannot convert "
            f"{value.dtype.name} to {np.dtype(dtype).name}; only float16 and float32 convert"
        )
    from paddle_ipu._tensors import fp16

    if np.dtype(dtype) == np.float16:
        return fp16.to_fp16(np.ascontiguousarray(value))
    return fp16.to_fp32(np.ascontiguousarray(value))
