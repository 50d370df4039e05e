"""The graph the host's ONNX Runtime session runs for inference, and the session.

From the compiled graph (without its weights, which the session supplies), one of:

- float32: the compiled graph;
- fp16 with ``host_fp16_arithmetic="float32"``: weights and constants in float16,
  arithmetic in float32 (the fp16 pass's storage part);
- fp16 with ``"float16"`` (the default): the IPU's float16 arithmetic
  (:mod:`.fp16_graph`): prepared, optimised by ONNX Runtime, every operator it runs
  rounded -- or, with the floating-point checks, rounded after every operator of the
  compiled graph (so that a trap names one of them).

With ``enable_floating_point_checks`` the graph also returns the flags of
:mod:`.fp_checks`.  A float16 graph built with lazy saturation also returns a flag
(:data:`.fp16_graph.WATCHED`): a micro-batch whose float outputs, or the operands of
a division, a comparison or a cast to an integer, are not all finite runs again on
the graph that clips every result (:meth:`Plan.saturating`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from paddle_ipu._internals import ort_api
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.backends.host import engines, fp16_graph, fp_checks, numerics
from paddle_ipu.backends.host.fp_checks import FLAGS as FLAGS
from paddle_ipu.backends.host.fp_checks import first_failure as first_failure
from paddle_ipu.backends.host.numerics import Fp16Arithmetic
from paddle_ipu.backends.host.onnx_edit import Editor
from paddle_ipu.errors import FloatingPointCheckError

#: where the weights of a graph "live": nowhere on disk, the session supplies them
IN_MEMORY = "paddle_ipu.in_memory_weights"

_log = logging.getLogger("paddle_ipu")
_arena_lock = threading.Lock()
_arena: list[bool] = []  # [whether the process-wide arena is registered], once decided


def _shared_arena() -> bool:
    """Register one CPU arena in ONNX Runtime's environment, once per process, for every
    host session to allocate its activations from (``session.use_env_allocators``).

    A session with an arena of its own keeps the arena's high-water mark after its runs:
    a model compiled for many input shapes (one session per shape) held the sum of every
    shape's activations -- PP-OCRv4's detector at six image sizes 736 x 1600-2880, 3.7 GB
    resident; with one arena shared and no memory pattern (a pattern is planned per
    shape and pinned with the session), 1.1 GB at the same speed (docs/performance.md).
    False when the environment refuses it (an application registered its own CPU
    allocator first): sessions then keep arenas of their own, said once in the log."""
    with _arena_lock:
        if not _arena:
            import onnxruntime as ort

            try:
                info = ort.OrtMemoryInfo(
                    "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
                )
                ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
                _arena.append(True)
            except Exception as exc:  # the environment refused it: keep per-session arenas
                _log.info(
                    "host sessions keep an arena each: ONNX Runtime's environment refused "
                    "a shared CPU allocator (%s)",
                    exc,
                )
                _arena.append(False)
        return _arena[0]


def _mark_external(init: onnx.TensorProto) -> None:
    init.ClearField("raw_data")
    init.ClearField("float_data")
    init.ClearField("external_data")
    init.data_location = onnx.TensorProto.EXTERNAL
    entry = init.external_data.add()
    entry.key, entry.value = "location", IN_MEMORY


@dataclass
class Built:
    """A session (ONNX Runtime's, or OpenVINO's compiled graph: :mod:`.engines`) and
    what runs with it."""

    session: Any
    keep: list[Any]
    checked: fp_checks.Checked | None = None
    #: outputs must be finite, else the micro-batch runs on the saturating graph
    lazy: bool = False
    #: lazy saturation's flag (fp16_graph.WATCHED), returned after the outputs
    watched: tuple[str, ...] = ()
    #: "onnxruntime" or "openvino"
    engine: str = "onnxruntime"
    #: run(output names, feed) -> outputs: the quickest call of the session
    run: Any = None

    def extra(self) -> list[str]:
        """The outputs a run asks for after the model's: the flags."""
        return [*self.watched, *([FLAGS] if self.checked is not None else [])]


@dataclass
class Plan:
    """The graph of one session configuration (:func:`plan`), ready for weights."""

    proto: onnx.ModelProto
    arith: Fp16Arithmetic | None
    #: optimise with ONNX Runtime, then round its operators (fp16_graph.finish)
    fused: bool
    checked: fp_checks.Checked | None
    source: onnx.ModelProto = field(repr=False)
    stable_norm: bool = False
    #: weights and constants float16 cannot hold, and those of ``float32``: float32
    keep: frozenset[str] = frozenset()
    #: the nodes that compute in float32 (fp16_black_list)
    float32: frozenset[str] = frozenset()
    #: the tensors fp16_graph.finish leaves unrounded (what fp16_graph.prepare says)
    unrounded: frozenset[str] = frozenset()
    #: float32 and bfloat16 inference: host_engine and host_precision (engines)
    engine: str = "onnxruntime"
    precision: str = "float32"

    @property
    def lazy(self) -> bool:
        a = self.arith
        return a is not None and a.rounded and a.saturate and a.lazy_saturation

    def saturating(self) -> Plan:
        """The same graph clipping every rounded result (see the module docstring)."""
        assert self.arith is not None
        arith = dataclasses.replace(self.arith, lazy_saturation=False)
        return _plan_fp16(
            self.source, arith, self.checked, self.stable_norm, self.keep, self.float32
        )

    def build(
        self,
        weights: Mapping[str, np.ndarray],
        *,
        threads: int,
        spin: bool,
        seed: int | None,
    ) -> Built:
        """A session over this graph with ``weights`` (initializer name -> the array
        the graph's data-less initializer stands for), on the engine the plan names
        (:mod:`.engines`)."""
        if self.precision == "bfloat16" or self.engine == "openvino":
            return self._openvino(weights, threads)
        if self.engine == "auto" and engines.openvino_installed():
            return self._auto(weights, threads=threads, spin=spin, seed=seed)
        return self._onnxruntime(weights, threads=threads, spin=spin, seed=seed)

    def _openvino(self, weights: Mapping[str, np.ndarray], threads: int) -> Built:
        graph = engines.openvino_graph(
            self.proto, weights, threads=threads, precision=self.precision
        )
        return Built(graph, [], engine="openvino", run=graph.run)

    def _auto(
        self, weights: Mapping[str, np.ndarray], *, threads: int, spin: bool, seed: int | None
    ) -> Built:
        """The faster engine on this graph: the choice kept for it, else measured
        (:func:`.engines.measure`) and kept."""
        key = engines.choice_key(self.proto, threads)
        record = engines.recorded(key)
        if record is not None and record["engine"] == "openvino":
            return self._openvino(weights, threads)
        built = self._onnxruntime(weights, threads=threads, spin=spin, seed=seed)
        feed = engines.zero_feed(self.proto)
        if record is not None or feed is None:
            return built
        names = [o.name for o in built.session.get_outputs()]
        try:
            record, graph, keep = engines.measure(
                built.run, lambda: self._openvino(weights, threads).session, names, feed, threads
            )
        except Exception as exc:  # a feed of zeros the graph refuses: nothing measured
            _log.debug("host engine not measured (a feed of zeros fails: %s)", exc)
            return built
        if keep:
            engines.store_choice(key, record)
        _log.info("host engine of this graph: %s", engines.describe(record))
        if graph is not None:
            return Built(graph, [], engine="openvino", run=graph.run)
        return built

    def _onnxruntime(
        self,
        weights: Mapping[str, np.ndarray],
        *,
        threads: int,
        spin: bool,
        seed: int | None,
    ) -> Built:
        import onnxruntime as ort

        proto, values = self.proto, dict(weights)
        level = None
        if self.fused:
            assert self.arith is not None
            proto, values = self._optimized(values, threads)
            level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        if not spin:
            # Idle threads sleep instead of spinning: a server's IO threads and its
            # clients need those cores between runs.
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        if _shared_arena():
            opts.add_session_config_entry("session.use_env_allocators", "1")
            opts.enable_mem_pattern = False
        if level is not None:
            opts.graph_optimization_level = level
        keep = []
        external: tuple[list[str], list[Any]] = ([], [])
        data_less = {
            i.name for i in proto.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL
        }
        for name, array in values.items():
            value = ort.OrtValue.ortvalue_from_numpy(array)
            keep.append(value)
            if name in data_less:
                external[0].append(name)
                external[1].append(value)
            else:
                opts.add_initializer(name, value)
        if external[0]:
            opts.add_external_initializers(*external)
        if seed is not None:
            ort.set_seed(int(seed))
        session = ort.InferenceSession(
            proto.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        watched = tuple(
            o.name for o in session.get_outputs() if o.name.startswith(fp16_graph.WATCHED)
        )
        return Built(session, keep, self.checked, self.lazy, watched, run=ort_api.fast_run(session))

    def _optimized(
        self, weights: dict[str, np.ndarray], threads: int
    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        """ONNX Runtime's optimisation of the prepared graph, every operator of it
        rounded, its float constants held in float16 (fp16_graph)."""
        assert self.arith is not None
        optimized, arrays = fp16_graph.optimize(self.proto, weights, threads)
        fp16_graph.finish(optimized, self.arith, self.unrounded)
        arrays = fp16_graph.round_constants(arrays, self.keep)
        for init in optimized.graph.initializer:
            if init.name in arrays:
                _mark_external(init)
            elif (
                init.data_type == onnx.TensorProto.FLOAT
                and not init.name.startswith("paddle_ipu::")
                and init.name not in self.keep
            ):
                value = numerics.round_fp16(onnx.numpy_helper.to_array(init))
                init.CopyFrom(onnx.numpy_helper.from_array(value, init.name))
        if self.checked is not None:
            fp_checks.add_flags(optimized, self.checked)
        return optimized, arrays


def _plan_fp16(
    source: onnx.ModelProto,
    arith: Fp16Arithmetic,
    checked: fp_checks.Checked | None,
    stable_norm: bool,
    keep: frozenset[str] = frozenset(),
    float32: frozenset[str] = frozenset(),
) -> Plan:
    from paddle_ipu.compiler.fp16_pass import convert_storage

    proto = convert_storage(copy.deepcopy(source), keep)
    if not arith.rounded:
        if checked is not None:
            fp_checks.add_flags(proto, checked)
        return Plan(proto, arith, False, checked, source, stable_norm, keep, float32)
    # With the checks every operator of the compiled graph is rounded where it is,
    # so that a trap names it; else ONNX Runtime optimises first (fp16_graph).
    exact = checked is not None
    unrounded = fp16_graph.prepare(
        proto, arith, exact=exact, stable_norm=stable_norm, float32=float32
    )
    if exact:
        assert checked is not None
        fp_checks.add_flags(proto, checked)
    return Plan(proto, arith, not exact, checked, source, stable_norm, keep, float32, unrounded)


def plan(
    source: onnx.ModelProto,
    config: SessionConfig,
    *,
    replica: int = 0,
    keep: frozenset[str] = frozenset(),
    float32: frozenset[str] = frozenset(),
) -> Plan:
    """The graph ``config`` asks for, from the compiled graph ``source`` (weightless;
    not modified); ``keep``: with enable_fp16, the weights and constants that stay
    float32 (fp16_pass.prepare: float16 cannot hold them; those of ``float32``);
    ``float32``: the nodes that compute in float32 (fp16_black_list)."""
    checks = bool(config.option("enable_floating_point_checks"))
    checked = fp_checks.plan(source) if checks else None
    arith = numerics.from_config(config)
    if arith is None:
        proto = copy.deepcopy(source)
        if checked is not None:
            fp_checks.add_flags(proto, checked)
        plain = checked is None and not config.is_training
        return Plan(
            proto,
            None,
            False,
            checked,
            source,
            engine=str(config.option("host_engine")) if plain else "onnxruntime",
            precision=str(config.option("host_precision")) if plain else "float32",
        )
    arith = dataclasses.replace(
        arith,
        replica_offset=arith.replica_offset + replica,
        lazy_saturation=arith.saturate and not arith.stochastic,
    )
    stable_norm = bool(config.option("enable_stable_norm"))
    return _plan_fp16(source, arith, checked, stable_norm, keep, float32)


def needs_saturation(built: Built, outputs: list[Any]) -> bool:
    """Whether a lazily saturated run must run again on the saturating graph: its
    flag (fp16_graph.WATCHED: an output, or an operand lazy saturation watches, is
    not finite) is not finite.  ``outputs``: the model's outputs, then the flag if
    the graph has one (removed here; the checks' flags, which come last, were
    removed before)."""
    flags = [outputs.pop() for _ in built.watched]
    return built.lazy and not all(math.isfinite(float(f)) for f in flags)


def check_feed(feed: Mapping[str, np.ndarray], where: str, step: int) -> None:
    """With the floating-point checks: a feed holding an infinity or a NaN is refused
    (on the IPU an operation with a NaN operand traps, and the checks name the
    operator that makes the first value that is not finite)."""
    for name, value in feed.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(np.sum(~np.isfinite(array)))
            raise FloatingPointCheckError(
                f"floating-point check: feed {name!r} holds {bad} values that are not "
                f"finite (infinity or NaN) at run {step} ({where}); with "
                "enable_floating_point_checks the IPU traps at the first operation on a NaN",
                node=name,
                step=step,
                kind="invalid operation",
            )


def diagnose(
    plan: Plan,
    weights: Mapping[str, np.ndarray],
    feed: Mapping[str, np.ndarray],
    node: str,
    looked: str,
    *,
    threads: int,
) -> tuple[list[tuple[str, np.ndarray]], np.ndarray]:
    """The operands and result of compiled node ``node`` for one micro-batch: the
    plan's graph run once more, returning them."""
    proto = copy.deepcopy(plan.proto)
    target = next((n for n in proto.graph.node if n.name == node), None)
    operands = [i for i in (target.input if target is not None else []) if i]
    known = {o.name for o in proto.graph.output}
    types = Editor(proto, infer=False).types
    for name in [*operands, looked]:
        if name not in known:
            elem = types.get(name, onnx.TensorProto.FLOAT)
            proto.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
            known.add(name)
    probe = dataclasses.replace(plan, proto=proto, fused=False)
    built = probe.build(weights, threads=threads, spin=False, seed=None)
    values = built.session.run([*operands, looked], dict(feed))
    arrays = [np.asarray(v) for v in values]
    return list(zip(operands, arrays[:-1])), arrays[-1]
