"""The IPU executor: prepare, run, weight sync and reset over a backend Session.

This is Paddle 2.x's ``ipu_executor.cc`` in Python.  It owns the IPU semantics --
the step layout, feed validation, weight and optimizer-state sync with the Paddle
scope (under Paddle's names), fp16 <-> fp32 conversion of weights, lr updates and
eval mode -- and leaves running the graph to the backend.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu.backends.base import AnchorReturnType, Session, SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import BackendError, FeedError, IpuError
from paddle_ipu.layout import StepLayout
from paddle_ipu.tensor_view import as_numpy

log = logging.getLogger("paddle_ipu")

#: where IPU_COMPILE_ONLY=1 writes the offline executable (Paddle 2.x's path)
OFFLINE_CACHE = "./offline_cache.popart"

# Casts a feed may take silently: the graph's dtype from the fed dtype.
_SAFE_CASTS = {
    ("int64", "int32"),  # IPUs compute in int32; values are range-checked
    ("int32", "int64"),
    ("bool", "int32"),
    ("float64", "float32"),
}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Executor:
    """Runs one CompiledModel on one backend session.

    Args:
        model: the compiled graph.
        strategy: the IpuStrategy it was compiled with.
        scope: the Paddle scope holding the weights (default: the global scope).
        backend: a backend name ("host", "popart", "auto"); default: the strategy's.
        lr_scheduler: the program's ``paddle.optimizer.lr.LRScheduler``, read at
            every run (Paddle's executor wrote it into the scope the same way).
    """

    def __init__(
        self,
        model: CompiledModel,
        strategy: Any,
        scope: Any = None,
        backend: str | None = None,
        lr_scheduler: Any = None,
    ) -> None:
        self.model = model
        self.lr_scheduler = lr_scheduler
        self.strategy = strategy
        self._scope = scope
        self._backend_name = backend or strategy.get("backend")
        self.session: Session | None = None
        self.compile_only = False
        #: the exception of the last failed run (kept for Paddle's op path)
        self.last_error: BaseException | None = None
        self._optimizer_key: tuple[bool, float] | None = None
        bps = int(strategy.batches_per_step)
        af = int(strategy.accumulation_factor) if strategy.is_training else 1
        rf = int(strategy.replication_factor)
        self.layout = StepLayout(bps, af, rf)
        self._training = bool(strategy.is_training)
        self._output_names = [spec.name for spec in model.outputs]
        # Feeds that need no cast and already have the step layout's shape are
        # passed through as they are (the common case, checked first).
        self._feed_plan = [
            (
                spec.paddle_name or spec.name,
                spec.name,
                spec.numpy_dtype,
                self.layout.input_shape(spec.shape),
            )
            for spec in model.inputs
        ]

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
        s = self.strategy
        kind = str(s.get("anchor_return_type")).upper()
        period = int(s.get("anchor_return_period"))
        anchors = {spec.name: AnchorReturnType(kind, period) for spec in self.model.outputs}
        seed = s.get("random_seed")
        return SessionConfig(
            batches_per_step=self.layout.batches_per_step,
            accumulation_factor=self.layout.accumulation_factor,
            replication_factor=self.layout.replication_factor,
            anchors=anchors,
            is_training=bool(s.is_training),
            enable_fp16=bool(s.enable_fp16),
            random_seed=None if seed is None else int(seed),
            num_threads=int(s.get("host_num_threads")),
            gradient_reduction=s.gradient_reduction,
            options=s.popart_options(),
            strategy=s,
        )

    # -- prepare / reset ------------------------------------------------------
    def prepare(self) -> None:
        """Create the session, load it on the device and copy the weights there.

        With ``IPU_COMPILE_ONLY=1`` the graph is compiled and exported to
        ``./offline_cache.popart`` and runs are skipped.
        """
        from paddle_ipu.backends import create_session

        self.reset()
        self._optimizer_key = None
        self.compile_only = _env_flag("IPU_COMPILE_ONLY")
        session = create_session(self.backend, self.model, self.session_config())
        self.session = session
        if self.compile_only:
            session.compile_and_export(OFFLINE_CACHE)
            log.warning(
                "IPU_COMPILE_ONLY is set: compiled and exported %s; runs are skipped",
                OFFLINE_CACHE,
            )
            return
        session.prepare_device()
        self.weights_from_host()
        seed = self.strategy.get("random_seed")
        if seed is not None:
            session.set_random_seed(int(seed))

    def reset(self) -> None:
        """Release the session and its device (Paddle 2.x's Reset)."""
        if self.session is not None:
            self.session.close()
        self.session = None

    def _require_session(self) -> Session:
        if self.session is None:
            raise BackendError("the executor is not prepared: call prepare() first")
        return self.session

    # -- run ------------------------------------------------------------------
    def run(self, feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run one step group: numpy (or array-like) feeds in, fetches out, in
        the compiled fetch order and PopART's layout."""
        session = self._require_session()
        if self.compile_only:
            log.info("IPU_COMPILE_ONLY is set: skipping the run")
            return [np.empty((0,), spec.numpy_dtype) for spec in self.model.outputs]
        inputs = self.check_feed(feed)
        if self._training:
            self._before_run(session)
        outputs = session.run(inputs)
        return [outputs[name] for name in self._output_names]

    def _before_run(self, session: Session) -> None:
        """Training: send the optimizer the current lr, or the eval optimizer
        (lr 0, no weight decay) when ``runtime_options.enable_eval`` is on.

        The lr comes from the program's lr scheduler variable (read from the scope
        every run, Paddle 2.x's with_lr_sched path) or from the ``lr`` option when
        it was set.  The session is updated only when the optimizer changes."""
        optimizer = self.model.optimizer
        if not self.strategy.is_training or optimizer is None:
            return
        import dataclasses

        eval_mode = bool(self.strategy.get("runtime_options.enable_eval"))
        if eval_mode:
            params = tuple(dataclasses.replace(p, weight_decay=0.0) for p in optimizer.params)
            wanted = dataclasses.replace(optimizer, lr=0.0, weight_decay=0.0, params=params)
        else:
            wanted = dataclasses.replace(optimizer, lr=self._current_lr(optimizer))
        key = (eval_mode, float(wanted.lr))
        if key != self._optimizer_key:
            session.update_optimizer(wanted)
            session.set_eval(eval_mode)
            self._optimizer_key = key

    def _current_lr(self, optimizer: Any) -> float:
        # An lr option set away from its default (0.0) wins, as in Paddle 2.x.
        # (Not changed_options(): it copies every option, on every run.)
        if self.strategy.get("lr") != 0.0 or self.strategy.get("is_dynamic"):
            return float(self.strategy.get("lr"))
        if self.lr_scheduler is not None:
            return float(self.lr_scheduler())
        if optimizer.lr_name:
            tensor = self._scope_tensor(optimizer.lr_name)
            if tensor is not None and tensor._is_initialized():
                return float(np.array(tensor).reshape(-1)[0])
        return float(optimizer.lr)

    def check_feed(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate feeds against the compiled inputs: names, dtypes and shapes.

        Returns ONNX input name -> array in the step layout (no copy unless a
        dtype cast is needed).
        """
        if len(feed) == len(self._feed_plan):
            fast: dict[str, np.ndarray] = {}
            for feed_name, onnx_name, dtype, shape in self._feed_plan:
                value = feed.get(feed_name)
                if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                    break
                fast[onnx_name] = value
            else:
                return fast
        expected = self.check_feed_names(feed)
        out: dict[str, np.ndarray] = {}
        for name, spec in expected.items():
            array = self.coerce_feed(name, feed[name], spec)
            out[spec.name] = self.layout.to_step_buffer(name, array, spec.shape)
        return out

    def check_feed_names(self, feed: Mapping[str, Any]) -> dict[str, TensorSpec]:
        """Raise FeedError for unknown or missing feeds; return name -> spec."""
        expected = {spec.paddle_name or spec.name: spec for spec in self.model.inputs}
        unknown = [name for name in feed if name not in expected]
        if unknown:
            raise FeedError(
                f"unknown feed {', '.join(repr(n) for n in unknown)}: the compiled program "
                f"takes {sorted(expected)}"
            )
        missing = [name for name in expected if name not in feed]
        if missing:
            raise FeedError(
                f"missing feed {', '.join(repr(n) for n in missing)}: the compiled program "
                f"takes {sorted(expected)}"
            )
        return expected

    @staticmethod
    def coerce_feed(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
        """``value`` as an array of the graph's dtype: the same dtype as is, a safe
        cast (int64 -> int32 range-checked), or a FeedError naming both dtypes."""
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        want = spec.numpy_dtype
        if array.dtype == want:
            return array
        pair = (array.dtype.name, want.name)
        if pair not in _SAFE_CASTS:
            raise FeedError(
                f"feed {name!r}: expected dtype {want.name}, received {array.dtype.name}"
            )
        if pair == ("int64", "int32") and array.size:
            lo, hi = int(array.min()), int(array.max())
            info = np.iinfo(np.int32)
            if lo < info.min or hi > info.max:
                raise FeedError(
                    f"feed {name!r}: int64 values in [{lo}, {hi}] do not fit the graph's int32"
                )
        return array.astype(want)

    # -- weights --------------------------------------------------------------
    def _weight_pairs(self) -> list[tuple[str, str]]:
        """(device name, Paddle name) for every weight and optimizer-state tensor the
        session keeps in sync (the seed's GetOptPrePostfix table, from the
        optimizer's own state names)."""
        pairs = dict(self.model.weights)
        optimizer = self.model.optimizer
        if self.strategy.is_training and optimizer is not None:
            onnx_of = {paddle: onnx for onnx, paddle in self.model.weights.items()}
            pairs.update(optimizer.device_names(onnx_of))
            # State without a PopART name (beta2_pow) under its Paddle name, for
            # backends that keep it.
            known = set(pairs.values())
            pairs.update({v: v for v in optimizer.state_var_names() if v not in known})
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
        session = self._require_session()
        batch: dict[str, np.ndarray] = {}
        for device_name, paddle_name in self._weight_pairs():
            tensor = self._scope_tensor(paddle_name)
            if tensor is None or not tensor._is_initialized():
                continue
            # A zero-copy view: the session makes the one copy it keeps.
            value = as_numpy(tensor, readonly=True)
            info = session.get_info(device_name)
            batch[device_name] = _convert(value, info.numpy_dtype, device_name, paddle_name)
        if batch:
            session.write_weights(batch)

    def weights_to_host(self) -> None:
        """Copy weights and optimizer state from the device into the Paddle scope,
        under Paddle's names, in the dtype each Paddle variable has."""
        session = self._require_session()
        if self.compile_only:
            return
        if not self.strategy.is_training:
            log.warning("an inference graph does not change its weights; nothing to copy back")
            return
        pairs = self._weight_pairs()
        values = session.read_weights([d for d, _ in pairs])
        import paddle

        for device_name, paddle_name in pairs:
            tensor = self._scope_tensor(paddle_name)
            if tensor is None:
                continue
            current = np.array(tensor, copy=False)
            value = _convert(values[device_name], current.dtype, device_name, paddle_name)
            tensor.set(np.ascontiguousarray(value), paddle.CPUPlace())

    def save_model(self, path: str) -> None:
        """Copy the weights back to the scope, then write the model (ONNX on the
        host backend, PopART's model proto on IPUs) to ``path``."""
        session = self._require_session()
        if self.strategy.is_training:
            self.weights_to_host()
        session.model_to_host(path)


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
    from paddle_ipu import fp16

    if np.dtype(dtype) == np.float16:
        return fp16.to_fp16(np.ascontiguousarray(value))
    return fp16.to_fp32(np.ascontiguousarray(value))


def run_numpy(
    executor: Executor, feed: Mapping[str, Any], names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Run and return fetches by name (a convenience over :meth:`Executor.run`)."""
    outs = executor.run(feed)
    keys = [spec.paddle_name or spec.name for spec in executor.model.outputs]
    result = dict(zip(keys, outs))
    if names is None:
        return result
    return {n: result[n] for n in names}
