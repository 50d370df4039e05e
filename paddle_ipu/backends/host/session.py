"""The ``host`` backend: an emulated IPU on the CPU (the "IPU Model" role).

The compiled ONNX graph runs on ONNX Runtime's CPU provider.  One ``run`` executes
``batches_per_step`` steps of ``accumulation_factor`` micro-batches on each of
``replication_factor`` emulated replicas, in the device's order, and returns the
anchors in PopART's layout.  Weights live in the session between runs, in the
device's dtype (fp16 when ``enable_fp16`` is on).

Training runs the host backend's gradient program (Paddle's CPU kernels) per
micro-batch and applies the optimizer update on the session's weights; see
:mod:`paddle_ipu.backends.host.trainer`.  With ``enable_distribution`` the session is one
instance of a job of processes started by Paddle's launcher: the gradients are reduced
over every process's replicas, and the weights written are rank 0's; see
:mod:`paddle_ipu.backends.host.replica_group`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu._util import dtypes
from paddle_ipu._util.arrays import same_bytes
from paddle_ipu.backends.base import AnchorReturnType, Session, SessionConfig
from paddle_ipu.backends.host import inference_graph, open_sessions
from paddle_ipu.backends.host.support import SUPPORT as SUPPORT
from paddle_ipu.backends.layout import StepLayout, check_output_buffer
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import BackendError, NotSupportedError

log = logging.getLogger("paddle_ipu.host")


def available() -> tuple[bool, str]:
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - a hard dependency
        return False, f"onnxruntime is not importable: {exc}"
    from paddle_ipu.backends.host import engines

    return (
        True,
        f"emulated IPU on the CPU (onnxruntime {onnxruntime.__version__}{engines.summary()})",
    )


def create_session(model: CompiledModel, config: SessionConfig) -> HostSession:
    return HostSession(model, config)


def _spin(config: SessionConfig) -> bool:
    """Whether ONNX Runtime's threads spin between runs: ``host_spin_threads`` when it
    was set; unset, not under the model runtime (its callers' threads -- exe.run from
    many threads, a server's IO threads -- need the cores between runs: 16 threads of
    1-row exe.run on mlp512 went from 0.85-1.23x to about 2x one exe.run per request)."""
    if "host_spin_threads" in config.explicit:
        return bool(config.option("host_spin_threads"))
    return not config.option("enable_model_runtime_executor")


def _strip_device_attributes(proto: Any) -> None:
    """Drop IPU placement attributes (``__ipu_number``, ``__pipeline_stage``): they
    mean nothing on the CPU, and ONNX Runtime's fusions reject unknown attributes."""
    for node in proto.graph.node:
        keep = [a for a in node.attribute if not a.name.startswith("__")]
        if len(keep) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(keep)


def _to_fp16(array: np.ndarray) -> np.ndarray:
    from paddle_ipu._tensors import fp16

    return fp16.to_fp16(np.ascontiguousarray(array, dtype=np.float32))


def _default_threads(replicas: Any) -> int:
    """All cores, shared out among this host's processes of a distributed job."""
    cores = os.cpu_count() or 1
    if replicas is None:
        return cores
    return max(1, cores // max(1, replicas.job.local_count))


# Where the graph's weights "live" as external data: nowhere on disk, the session
# supplies them from memory.
_IN_MEMORY = "paddle_ipu.in_memory_weights"


class HostSession(Session):
    backend = "host"

    def __init__(self, model: CompiledModel, config: SessionConfig) -> None:
        super().__init__(model, config)
        self.layout = StepLayout(
            config.batches_per_step, config.accumulation_factor, config.replication_factor
        )
        self._anchors = {
            spec.name: config.anchors.get(spec.name, AnchorReturnType("ALL"))
            for spec in model.outputs
        }
        for spec in model.outputs:
            art = self._anchors[spec.name]
            self.layout.anchor_shape(spec.shape, art.kind, art.period)  # validates EVERYN
        self._weights: dict[str, np.ndarray] = {}
        self._weight_info: dict[str, TensorSpec] = {}
        # weights the graph holds as external data (their values come from _weights)
        self._external: set[str] = set()
        self._plan: Any = None
        self._source: Any = None
        # enable_fp16: the weights and constants float16 cannot hold (kept float32)
        self._kept: frozenset[str] = frozenset()
        # enable_fp16 with fp16_black_list: the nodes that compute in float32
        self._float32: frozenset[str] = frozenset()
        self._built: Any = None
        # the graph that clips every rounded result (lazy saturation), built when needed
        self._saturating: Any = None
        # stochastic rounding with replicas: a session per replica (its own seed)
        self._replica_built: dict[int, Any] = {}
        #: runs so far (a floating-point check names the run)
        self._runs = 0
        self._ort: Any = None
        self._dirty = True
        self._trainer: Any = None
        #: enable_fp16: what the fp16 pass folded and kept float32 (an Fp16Report)
        self.fp16_report: Any = None
        self._seed: int | None = config.random_seed
        self._direct = False
        self._ort_run: Any = None
        self._output_names = [spec.name for spec in model.outputs]
        #: the replicas in other processes (enable_distribution), joined at prepare
        self.replicas: Any = None
        #: the session of the open graph this shape's graph was made from, when its runs
        #: are that session's (open_sessions)
        self._shared: HostSession | None = None

    # -- device ---------------------------------------------------------------
    def prepare_device(self) -> None:
        from paddle_ipu.backends.host import replica_group

        # The job first: a process that cannot take part fails before any work, and
        # the ranks wait for each other here (compiles take different times) rather
        # than in the first all-reduce, whose wait gloo bounds at 30 s.
        self.replicas = replica_group.for_session(self.config)
        if self.replicas is not None:
            self.replicas.barrier("the start of training (every rank compiled its program)")
        # Will it fit: the Poplar compile refuses a model that does not (compiler.memory).
        self.check_memory()
        if open_sessions.shares(self.model, self.config):
            key = (self._threads(), _spin(self.config))
            self._shared = open_sessions.shared_session(self.model, self.config, key, _prepared)
            if self._shared is not None:
                self._dirty = True
                return
        self._prepare_graph()

    def _threads(self) -> int:
        return self.config.num_threads or _default_threads(self.replicas)

    def _prepare_graph(self) -> None:
        import onnx

        from paddle_ipu.compiler.weights import split_weights

        # The weights come out as read-only views of the model's bytes (no copy); the
        # graph marks them external, and the session hands ONNX Runtime the arrays
        # (add_external_initializers).  The fp16 pass runs on that weightless graph too:
        # it only retypes a data-less initializer, and the weights are converted here.
        proto, views = split_weights(self.model.onnx, self.model.weights, external=_IN_MEMORY)
        self._external = set(views)
        _strip_device_attributes(proto)
        params = set(self.model.weights)
        arrays: dict[str, tuple[np.ndarray, bool]] = {}
        for init in proto.graph.initializer:
            if init.name in params:
                view = views.get(init.name)
                if view is not None:
                    arrays[init.name] = (view, True)
                else:
                    arrays[init.name] = (onnx.numpy_helper.to_array(init), False)
        kept: frozenset[str] = frozenset()
        float32: frozenset[str] = frozenset()
        if self.config.enable_fp16:
            from paddle_ipu.compiler.float32_ops import for_session, weights_read_by

            # Trained weights first: BatchNorm folded, what float16 cannot hold kept
            # float32 (compiler/fp16_pass.prepare; refused in training); then the
            # operators fp16_black_list keeps in float32, with their weights.
            float32 = for_session(self.model, self.config)
            kept = self._prepare_fp16(proto, {n: a for n, (a, _) in arrays.items()})
            kept |= weights_read_by(proto, float32)
        elif not self.config.is_training:
            # Constant arithmetic around convolutions (BatchNorm, biases, scales) folded
            # into them: one pass over memory less per operator (the fp16 pass folds
            # the same way).  Weights kept in sync with the scope are never folded.
            from paddle_ipu.compiler.conv_folds import fold_batch_norms

            folds = fold_batch_norms(proto, excluded=params)
            log.debug("folded %d constant operator(s) into convolutions", len(folds))
        # The graph this configuration runs (float32, float16 storage, or the IPU's
        # float16 arithmetic; with the floating-point checks' flags): inference_graph.
        self._source = proto
        self._kept, self._float32 = kept, float32
        self._plan = inference_graph.plan(proto, self.config, keep=kept, float32=float32)
        retyped = {init.name: init.data_type for init in self._plan.proto.graph.initializer}
        for name, (array, is_view) in arrays.items():
            device_dtype = array.dtype
            # a weight read only by an op the pass keeps in float32 stays float32
            if (
                self.config.enable_fp16
                and array.dtype == np.float32
                and retyped.get(name) == onnx.TensorProto.FLOAT16
            ):
                device_dtype = np.dtype(np.float16)
            self._weight_info[name] = TensorSpec(
                name, device_dtype.name, tuple(array.shape), self.model.weights[name]
            )
            if device_dtype == np.float16:
                self._weights[name] = _to_fp16(array)
            else:
                self._weights[name] = array if is_view else array.copy()
        if self.config.is_training:
            self._trainer = self._make_trainer()
            # A prepared session holds the compiled weights, training or not (PopART's
            # do): the trainer shares them until something else is written.
            self._trainer.write(self._weights)
        self._dirty = True

    def check_memory(self) -> None:
        """The memory report of the model on the IPUs this configuration uses, refused
        (``host_memory_check="error"``) or logged (``"warning"``) when an IPU does not
        fit, as the Poplar compile would fail."""
        from paddle_ipu.compiler import memory

        mode = str(self.config.option("host_memory_check"))
        if mode == "off":
            return
        options = {
            **self.config.options,
            "is_training": self.config.is_training,
            "enable_fp16": self.config.enable_fp16,
        }
        memory.check(memory.memory_report(self.model, options), mode)

    def _prepare_fp16(self, proto: Any, weights: Mapping[str, np.ndarray]) -> frozenset[str]:
        """The fp16 pass's rule for trained weights (BatchNorm folded in float32, the
        weights and constants float16 cannot hold kept float32), logged and kept as
        :attr:`fp16_report`; returns the names kept float32."""
        from paddle_ipu.compiler.fp16_pass import prepare

        report = prepare(proto, weights, training=self.config.is_training)
        report.log()
        self.fp16_report = report
        return report.kept_names

    def _make_trainer(self) -> _Training:
        if self.config.training_source is None or self.model.optimizer is None:
            raise NotSupportedError(
                "training on the host backend computes gradients with Paddle's kernels: it "
                "needs the optimizer (CompiledModel.optimizer) and the Paddle program "
                "(SessionConfig.training_source); compile the program with is_training=True"
            )
        return _Training(self.model, self.config, self.replicas)

    def _session(self) -> Any:
        shared = self._shared
        if shared is not None:
            if self._ort is None or self._dirty:
                self._ort = shared._session()
                self._built, self._direct = shared._built, shared._direct
                self._ort_run = shared._ort_run
                self._dirty = False
            return self._ort
        if self._plan is None:
            raise BackendError("the host session is not prepared: call prepare_device() first")
        if self._ort is None or self._dirty:
            self._built, self._saturating, self._replica_built = None, None, {}
            self._built = self._build(self._plan)
            self._ort = self._built.session
            # One micro-batch per run and ORT's output dtypes as compiled: feed
            # ONNX Runtime directly (see _run_direct).
            types = {o.name: o.type for o in self._ort.get_outputs()}
            self._direct = (
                self.layout.micro_batches == 1
                and self._built.checked is None
                and all(
                    types.get(spec.name) == dtypes.ort_type(spec.dtype)
                    for spec in self.model.outputs
                )
            )
            # ONNX Runtime: the binding under InferenceSession.run when it is the one
            # checked (the wrapper only re-checks input names, which the executor has
            # checked); OpenVINO: its compiled graph's run.
            self._ort_run = self._built.run
            self._dirty = False
        return self._ort

    def _build(self, plan: Any) -> Any:
        try:
            return plan.build(
                self._weights,
                threads=self._threads(),
                spin=_spin(self.config),
                seed=self._seed,
            )
        except BackendError:
            raise  # the engine's own message (engines.openvino_graph)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime could not load the compiled graph: {exc}") from exc

    @property
    def engine(self) -> str | None:
        """What runs the inference graph: "onnxruntime" or "openvino" (host_engine,
        host_precision); None before the first run builds it."""
        return self._built.engine if self._built is not None else None

    # -- weights --------------------------------------------------------------
    def get_info(self, name: str) -> TensorSpec:
        if name in self._weight_info:
            return self._weight_info[name]
        if self._trainer is not None:
            info = self._trainer.get_info(name)
            if info is not None:
                return info
        return super().get_info(name)

    def write_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        if self.replicas is not None and self.replicas.size > 1:
            # Every rank writes; rank 0's values are the job's (each rank's startup
            # program drew its own initial weights).
            weights = self.replicas.broadcast_from_first(
                weights, "the weights and optimizer state written"
            )
        for name, value in weights.items():
            if self._trainer is not None and self._trainer.has_state(name):
                current = self._weights.get(name)
                if (
                    current is not None
                    and not current.flags.writeable
                    and same_bytes(np.asarray(value), current)
                ):
                    value = current  # the compiled weights: the trainer shares them
                self._trainer.write({name: value})
                continue
            if name not in self._weights:
                raise KeyError(f"the session holds no weight named {name!r}")
            current = self._weights[name]
            value = np.asarray(value)
            if value.shape != current.shape:
                raise BackendError(
                    f"weight {name!r}: expected shape {list(current.shape)}, "
                    f"received {list(value.shape)}"
                )
            if current.flags.writeable or not same_bytes(value, current):
                # A read-only current value is the compiled model's: keep sharing it
                # while the value written is the same (the first weights_from_host).
                self._weights[name] = np.array(value, dtype=current.dtype, copy=True)
            if self._trainer is not None:
                self._trainer.write({name: self._weights[name]})
        self._dirty = True

    def read_weights(
        self, names: Sequence[str] | None = None, *, copy: bool = True
    ) -> dict[str, np.ndarray]:
        """The named weights and optimizer state (default: every one the session
        holds), one copy each.  ``copy=False``: the session's own arrays where it can
        (read-only for the caller, valid until the next run)."""
        wanted = list(self._weights) if names is None else list(names)
        if names is None and self._trainer is not None:
            wanted += [n for n in self._trainer.names if n not in self._weights]
        out: dict[str, np.ndarray] = {}
        if self._trainer is not None:
            # the trainer holds the current values of everything it trains
            held = [n for n in wanted if self._trainer.has_state(n)]
            out.update(self._trainer.read(held, copy=copy))
        for name in wanted:
            if name in out:
                continue
            if name not in self._weights:
                raise KeyError(f"the session holds no weight named {name!r}")
            out[name] = self._weights[name].copy() if copy else self._weights[name]
        return {n: out[n] for n in wanted}

    def share_into(self, tensors: Mapping[str, Any]) -> dict[str, int]:
        """Training: point the tensors at the trainer's own arrays of those weights
        and state (:meth:`HostTrainer.share_into`)."""
        return {} if self._trainer is None else self._trainer.share_into(tensors)

    def snapshot(self) -> Any:
        """O(number of tensors), no weight copies: the trainer replaces its arrays
        on every update and never writes into them (see :class:`_Training`)."""
        if self._trainer is None:
            return None
        return self._trainer.snapshot()

    def restore(self, snapshot: Any) -> None:
        if self._trainer is not None and snapshot is not None:
            self._trainer.restore(snapshot)

    def set_random_seed(self, seed: int) -> None:
        self._seed = int(seed)
        self._dirty = True
        if self._trainer is not None:
            self._trainer.set_random_seed(self._seed)

    def update_optimizer(self, optimizer: Any) -> None:
        if self._trainer is None:
            super().update_optimizer(optimizer)
        self._trainer.update_optimizer(optimizer)

    def set_eval(self, enabled: bool) -> None:
        if self._trainer is not None:
            self._trainer.eval = bool(enabled)

    # -- run ------------------------------------------------------------------
    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        if self._direct and outputs is None and self._trainer is None:
            result = self._run_direct(inputs)
            if result is not None:
                return result
        if outputs is not None:
            self._check_output_buffers(outputs)
        layout = self.layout
        bps, af, rf = layout.factors()
        # The executor checked the inputs (paddle_ipu.executor.feeds, the one feed check).
        steps = {
            spec.name: layout.full_view(spec.name, inputs[spec.name], spec.shape)
            for spec in self.model.inputs
        }

        if self._trainer is not None:
            per_micro = self._trainer.run_steps(steps, layout)
        else:
            per_micro = self._infer(steps, bps, af, rf)
        return self._anchor_outputs(per_micro, outputs)

    def _check_output_buffers(self, outputs: Mapping[str, np.ndarray]) -> None:
        """The caller's buffers, checked before anything runs (a training run would
        have updated the weights before a bad buffer is found)."""
        for spec in self.model.outputs:
            buf = outputs.get(spec.name)
            if buf is None:
                continue  # returned as a new array
            art = self._anchors[spec.name]
            shape = self.layout.anchor_shape(spec.shape, art.kind, art.period)
            check_output_buffer(spec.name, buf, shape, spec.numpy_dtype, art.kind)

    def _run_direct(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """One micro-batch, every anchor's shape is the tensor's: no layout work.
        Returns None when the inputs are not exactly the compiled shapes."""
        if self._dirty or self._ort is None:
            self._session()
            if not self._direct:
                return None
        feed: dict[str, np.ndarray] = {}
        for spec in self.model.inputs:
            value = inputs.get(spec.name)
            if value is None or value.shape != spec.shape:
                return None
            feed[spec.name] = value
        names = self._output_names
        try:
            outs = self._ort_run(names + self._built.extra(), feed)
        except Exception as exc:
            raise BackendError(f"the emulated IPU failed to run the graph: {exc}") from exc
        if self._shared is not None:
            self._check_shapes(outs)
        if inference_graph.needs_saturation(self._built, outs):
            self._runs += 1
            outs = self._run_micro(self._saturating_built(), names, feed, "micro-batch 0")
        return dict(zip(names, outs))

    def _check_shapes(self, outs: Sequence[np.ndarray]) -> None:
        """The open graph's outputs at this shape are the static graph's shapes."""
        for spec, out in zip(self.model.outputs, outs):
            if tuple(out.shape) != tuple(spec.shape):
                raise BackendError(
                    f"output {spec.paddle_name or spec.name!r}: the open graph gave shape "
                    f"{list(out.shape)} where this input shape's graph gives "
                    f"{list(spec.shape)}"
                )

    def _saturating_built(self) -> Any:
        if self._saturating is None:
            self._saturating = self._build(self._plan.saturating())
        return self._saturating

    def _infer(
        self, steps: Mapping[str, np.ndarray], bps: int, af: int, rf: int
    ) -> dict[str, np.ndarray]:
        self._session()
        self._runs += 1
        names = [spec.name for spec in self.model.outputs]
        results = {
            spec.name: np.empty((bps, af, rf, *spec.shape), dtype=spec.numpy_dtype)
            for spec in self.model.outputs
        }
        for b in range(bps):
            for a in range(af):
                for r in range(rf):
                    feed = {k: np.ascontiguousarray(v[b, a, r]) for k, v in steps.items()}
                    where = f"step {b}, micro-batch {a}, replica {r}"
                    outs = self._run_micro(self._built_for(r), names, feed, where)
                    for name, value in zip(names, outs):
                        results[name][b, a, r] = value
        return results

    def _built_for(self, replica: int) -> Any:
        """The session of ``replica``: its own with stochastic rounding (a seed of its
        own, as on the IPU), else the one session."""
        plan = self._plan
        if self._shared is not None or replica == 0:
            return self._built
        if plan.arith is None or not plan.arith.stochastic:
            return self._built
        if replica not in self._replica_built:
            self._replica_built[replica] = self._build(
                inference_graph.plan(
                    self._source,
                    self.config,
                    replica=replica,
                    keep=self._kept,
                    float32=self._float32,
                )
            )
        return self._replica_built[replica]

    def _run_micro(
        self, built: Any, names: list[str], feed: Mapping[str, np.ndarray], where: str
    ) -> list[np.ndarray]:
        """One micro-batch: the floating-point checks' flags looked at, and with lazy
        saturation a run whose outputs are not all finite run again on the graph that
        clips every result (inference_graph)."""
        checked = built.checked
        if checked is not None:
            inference_graph.check_feed(feed, where, self._runs)
        try:
            outs = built.session.run(names + built.extra(), dict(feed))
        except Exception as exc:
            raise BackendError(f"the emulated IPU failed to run the graph: {exc}") from exc
        if self._shared is not None:
            self._check_shapes(outs)
        if checked is not None:
            failure = inference_graph.first_failure(outs.pop(), checked)
            if failure is not None:
                self._report_trap(failure, feed, where)
        if inference_graph.needs_saturation(built, outs):
            return self._run_micro(self._saturating_built(), names, feed, where)
        return list(outs)

    def _report_trap(self, failure: Any, feed: Mapping[str, np.ndarray], where: str) -> None:
        node, op_type, looked = failure
        operands, result = inference_graph.diagnose(
            self._plan, self._weights, feed, node, looked, threads=1
        )
        index = self.model.node_ops.get(node)
        paddle_op = self.model.source_ops[index] if index is not None else ""
        from paddle_ipu.backends.host.fp_checks import classify, raise_failure

        raise_failure(
            node=node,
            op_type=op_type,
            paddle_op=paddle_op,
            kind=classify(op_type, [v for _, v in operands], result),
            step=self._runs,
            where=where,
            operands=operands,
            result=result,
        )

    def _anchor_outputs(
        self, per_micro: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for spec in self.model.outputs:
            full = per_micro[spec.name]  # [bps, af, rf, *shape]
            art = self._anchors[spec.name]
            if art.kind == "ALL":
                value = full
            elif art.kind == "EVERYN":
                value = full[art.period - 1 :: art.period]
            elif art.kind == "FINAL":
                value = full[-1, -1]
            else:  # SUM over steps and micro-batches, per replica
                value = full.sum(axis=(0, 1), dtype=full.dtype)
            shape = self.layout.anchor_shape(spec.shape, art.kind, art.period)
            value = value.reshape(shape)
            if outputs is not None and spec.name in outputs:
                np.copyto(outputs[spec.name], value)
                out[spec.name] = outputs[spec.name]
            else:
                out[spec.name] = value
        return out

    # -- artefacts ------------------------------------------------------------
    def compile_and_export(self, path: str) -> None:
        """The host's offline artefact is the ONNX graph it runs, with its weights
        (those the program was compiled with: nothing is written to the device)."""
        self.prepare_device()
        self.model_to_host(path)

    def model_to_host(self, path: str) -> None:
        import onnx

        if self._plan is None and self._shared is not None:
            self._prepare_graph()  # the graph of this shape, not the open one
        if self._plan is None:
            raise BackendError("the host session is not prepared: call prepare_device() first")
        proto = self._plan.proto.__deepcopy__()
        current = self.read_weights(list(self._weights))
        for init in proto.graph.initializer:
            if init.name in current:
                init.CopyFrom(onnx.numpy_helper.from_array(current[init.name], init.name))
        from paddle_ipu._util.files import write_atomically

        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        # A temporary file and a rename: never half a model, never through a symlink.
        write_atomically(path, lambda tmp: onnx.save(proto, tmp))

    def close(self) -> None:
        self._ort = None
        self._dirty = True


def _prepared(model: CompiledModel, config: SessionConfig) -> HostSession:
    """A session of ``model``, prepared and built (open_sessions)."""
    session = HostSession(model, config)
    session.prepare_device()
    session._session()
    return session


class _Training:
    """The host's training state: Paddle's CPU kernels compute each micro-batch's
    gradients (the gradient program), the optimizer update runs on the session's
    weights.  Device (PopART) names are translated to Paddle names here."""

    def __init__(self, model: CompiledModel, config: SessionConfig, replicas: Any = None) -> None:
        from paddle_ipu.backends.host import numerics
        from paddle_ipu.backends.host.gradients import ProgramNumerics, build_from_source
        from paddle_ipu.backends.host.trainer import HostTrainer

        assert config.training_source is not None and model.optimizer is not None
        self.model = model
        self.config = config
        arith = numerics.from_config(config)
        optimizer = self._with_strategy(model.optimizer)
        program_numerics = ProgramNumerics(
            arith=arith,
            checks=bool(config.option("enable_floating_point_checks")),
            loss_scaling=float(config.option("loss_scaling")),
        )
        self.trainer = HostTrainer(
            build_from_source(config.training_source, optimizer, program_numerics),
            optimizer,
            accumulation_factor=config.accumulation_factor,
            replication_factor=config.replication_factor,
            gradient_reduction=config.gradient_reduction,
            weight_dtype="float16" if config.enable_fp16 else "float32",
            processes=replicas,
            arith=arith,
        )
        # device name -> Paddle name: weights, optimizer state and buffers.  State
        # with no PopART counterpart (beta2_pow) keeps its Paddle name.
        self.names = model.optimizer.all_names(model.weights)
        known = set(self.trainer.names())
        self.names = {d: p for d, p in self.names.items() if p in known}
        self.fp16 = config.enable_fp16
        self.eval = False
        params = set(model.weights.values())
        self._fetched_params = [
            spec.paddle_name
            for spec in model.outputs
            if spec.paddle_name in params and spec.paddle_name in known
        ]

    def has_state(self, name: str) -> bool:
        return name in self.names

    def get_info(self, name: str) -> TensorSpec | None:
        paddle_name = self.names.get(name)
        if paddle_name is None:
            return None
        value = self.trainer.read([paddle_name], copy=False)[paddle_name]
        return TensorSpec(name, value.dtype.name, tuple(value.shape), paddle_name)

    def write(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.trainer.write({self.names[k]: v for k, v in arrays.items() if k in self.names})

    def read(
        self, names: Sequence[str] | None = None, *, copy: bool = True
    ) -> dict[str, np.ndarray]:
        wanted = list(self.names) if names is None else [n for n in names if n in self.names]
        values = self.trainer.read([self.names[n] for n in wanted], copy=copy)
        return {n: values[self.names[n]] for n in wanted}

    def share_into(self, tensors: Mapping[str, Any]) -> dict[str, int]:
        names = self.names
        by_paddle = {names[n]: (n, t) for n, t in tensors.items() if n in names}
        shared = self.trainer.share_into({p: t for p, (_, t) in by_paddle.items()})
        return {by_paddle[p][0]: ptr for p, ptr in shared.items()}

    def set_random_seed(self, seed: int) -> None:
        import paddle

        paddle.seed(seed)

    def snapshot(self) -> Any:
        return self.trainer.snapshot()

    def restore(self, snapshot: Any) -> None:
        self.trainer.restore(snapshot)

    def _with_strategy(self, optimizer: Any) -> Any:
        """The strategy's optimizer options the program does not carry:
        ``use_no_bias_optimizer`` (PopART's AdamNoBias / LambNoBias) and Lamb's
        ``max_weight_norm`` (read by the no-bias Lamb)."""
        import dataclasses

        if not self.config.option("use_no_bias_optimizer"):
            return optimizer
        return dataclasses.replace(
            optimizer,
            no_bias=True,
            max_weight_norm=float(self.config.option("max_weight_norm")),
        )

    def update_optimizer(self, optimizer: Any) -> None:
        optimizer = self._with_strategy(optimizer)
        self.trainer.optimizer = optimizer
        self.trainer.set_lr(float(optimizer.lr))

    def run_steps(
        self, steps: Mapping[str, np.ndarray], layout: StepLayout
    ) -> dict[str, np.ndarray]:
        """Run bps steps; return every output as ``[bps, af, rf, *shape]``."""
        feed_of = {spec.name: spec.paddle_name or spec.name for spec in self.model.inputs}
        out_names = self.trainer.artifact.output_names
        per_step: list[dict[str, np.ndarray]] = []
        for b in range(layout.batches_per_step):
            feeds = {feed_of[k]: v[b] for k, v in steps.items()}
            if self.eval:
                per_step.append(self._evaluate(feeds))
            else:
                outputs = self.trainer.step(feeds)
                # A fetched parameter is its value after the step's update, as
                # Paddle's executor returns it (fetch ops run after the optimizer).
                for name in self._fetched_params:
                    if name in outputs:
                        post = self.trainer.read([name])[name]
                        outputs[name] = np.broadcast_to(post, outputs[name].shape).copy()
                per_step.append(outputs)
        result: dict[str, np.ndarray] = {}
        for spec in self.model.outputs:
            name = spec.paddle_name or spec.name
            if name not in out_names:
                raise BackendError(f"the training graph does not produce fetch {name!r}")
            result[spec.name] = np.stack([step[name] for step in per_step]).astype(
                spec.numpy_dtype, copy=False
            )
        return result

    def _evaluate(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The training graph without any update: buffers are restored after."""
        trainer = self.trainer
        saved = trainer.read(trainer.buffer_names)
        # no update follows: nothing to reduce across processes
        _, outputs = trainer.compute_gradients(feeds, across_processes=False)
        if saved:
            trainer.write(saved)
        af, rf = trainer.af, trainer.rf
        return {
            name: np.stack([np.stack([outputs[a][r][k] for r in range(rf)]) for a in range(af)])
            for k, name in enumerate(trainer.artifact.output_names)
        }
