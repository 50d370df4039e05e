"""The engines that run a host inference graph: ONNX Runtime, and OpenVINO.

ONNX Runtime runs every graph of the host backend: training's, the IPU's float16
arithmetic (fp16_graph), the floating-point checks.  An inference graph in float32 or
bfloat16 may run on OpenVINO instead (the ``openvino`` extra), as ``host_engine``
says:

- ``"onnxruntime"``: ONNX Runtime.
- ``"openvino"``: OpenVINO (refused when it is not installed).
- ``"auto"`` (the default): the faster of the two on this graph, measured.  Without
  OpenVINO installed, ONNX Runtime, and nothing is measured.  Otherwise the graph's
  first session times ONNX Runtime on a feed of zeros; a graph that runs in under
  :data:`MEASURE_FROM_MS` stays on ONNX Runtime (OpenVINO's compile, seconds on big
  graphs, is not worth what it could save there).  A bigger one is compiled by
  OpenVINO too, both outputs are compared (OpenVINO's must agree, :func:`_agree`), and
  the two take turns for :data:`PAIRS` pairs of calls: OpenVINO is chosen when the
  median of its time over ONNX Runtime's, pair by pair, is at most :data:`WIN` (times
  by :func:`_clock`).  The choice is kept in
  ``host_engines.json`` of the compile cache's directory (``PADDLE_IPU_CACHE_DIR``),
  under the graph's operators, the thread count, the CPU and both engines' releases,
  so that a later load of the model -- or another input shape of it -- does not measure
  again.

``host_precision="bfloat16"`` runs the graph's matmuls and convolutions in bfloat16 on
OpenVINO (``INFERENCE_PRECISION_HINT=bf16``), on a CPU with bfloat16 arithmetic
(AVX512-BF16 or AMX-BF16); :func:`bf16_missing` says why not elsewhere.  ONNX Runtime's
CPU provider has no bfloat16 matmul on x86.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from paddle_ipu.errors import BackendError, NotSupportedError

log = logging.getLogger("paddle_ipu.host")

ENGINES = ("auto", "onnxruntime", "openvino")
PRECISIONS = ("float32", "bfloat16")
#: OpenVINO releases checked (the openvino extra's range in pyproject.toml)
OPENVINO_RANGE = ">=2025.0,<2027"
#: graphs ONNX Runtime runs faster than this stay on it without measuring OpenVINO
MEASURE_FROM_MS = 10.0
#: pairs of timed calls (ONNX Runtime, OpenVINO) of the measurement
PAIRS = 7
#: OpenVINO is chosen when its time over ONNX Runtime's is at most this (median of pairs)
WIN = 0.98
#: the CPU flags (Linux's names) of bfloat16 arithmetic
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CHOICES_FILE = "host_engines.json"

Runner = Callable[[Sequence[str], Mapping[str, np.ndarray]], list[Any]]

_lock = threading.Lock()
_core: list[Any] = []
#: choices made or read in this process: key -> record
_choices: dict[str, dict[str, Any]] = {}


def openvino_installed() -> bool:
    return importlib.util.find_spec("openvino") is not None


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise NotSupportedError(
            f"OpenVINO is not importable ({exc}): install the extra, "
            f"pip install 'paddle-ipu[openvino]' (openvino{OPENVINO_RANGE})"
        ) from exc
    return openvino


def check_openvino() -> None:
    """Refuse ``host_engine="openvino"`` without OpenVINO (NotSupportedError naming the
    extra)."""
    _openvino()


def summary() -> str:
    """What ``paddle-ipu info`` says of the second engine (nothing imported)."""
    if not openvino_installed():
        return "; OpenVINO: not installed (the openvino extra)"
    from importlib.metadata import version

    flags = _cpu_flags()
    bf16 = "unknown" if flags is None else "yes" if flags.intersection(BF16_FLAGS) else "no"
    return f"; OpenVINO {version('openvino')}; CPU bfloat16: {bf16}"


def _ov_core() -> Any:
    with _lock:
        if not _core:
            _core.append(_openvino().Core())
        return _core[0]


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux's /proc/cpuinfo); None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def bf16_missing() -> str | None:
    """Why this CPU cannot run bfloat16 arithmetic (None: it can): it needs AVX512-BF16
    or AMX-BF16, and OpenVINO's CPU plugin must report BF16 among its capabilities."""
    flags = _cpu_flags()
    if flags is not None and not flags.intersection(BF16_FLAGS):
        return (
            f"this CPU ({platform.processor() or platform.machine()}) has neither of the "
            f"bfloat16 features {' nor '.join(BF16_FLAGS)} (read from /proc/cpuinfo)"
        )
    capabilities = _ov_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" not in capabilities:
        return (
            "OpenVINO's CPU plugin does not report bfloat16 on this CPU (its capabilities: "
            f"{', '.join(capabilities)}); bfloat16 arithmetic needs AVX512-BF16 or AMX-BF16"
        )
    return None


def check_bf16() -> None:
    """Refuse ``host_precision="bfloat16"`` where it cannot run (NotSupportedError
    naming what is missing: the extra, or the CPU's feature)."""
    _openvino()
    missing = bf16_missing()
    if missing is not None:
        raise NotSupportedError(f"host_precision='bfloat16': {missing}")


# -- OpenVINO -----------------------------------------------------------------------

_OV_TYPES = {
    onnx.TensorProto.FLOAT: "tensor(float)",
    onnx.TensorProto.DOUBLE: "tensor(double)",
    onnx.TensorProto.FLOAT16: "tensor(float16)",
    onnx.TensorProto.INT64: "tensor(int64)",
    onnx.TensorProto.INT32: "tensor(int32)",
    onnx.TensorProto.BOOL: "tensor(bool)",
    onnx.TensorProto.UINT8: "tensor(uint8)",
    onnx.TensorProto.INT8: "tensor(int8)",
}


@dataclass(frozen=True)
class _Output:
    name: str
    type: str


class OpenVinoGraph:
    """A graph compiled by OpenVINO, with what the host session asks of ONNX Runtime's
    session: ``get_outputs()`` (names and ONNX Runtime's type names) and
    ``run(names, feed)``.  One run at a time (an infer request is not reentrant)."""

    def __init__(self, compiled: Any, outputs: Sequence[_Output], precision: str) -> None:
        self.compiled = compiled
        self.precision = precision
        self._request = compiled.create_infer_request()
        self._outputs = list(outputs)
        self._index = {o.name: i for i, o in enumerate(outputs)}
        self._lock = threading.Lock()

    def get_outputs(self) -> list[_Output]:
        return list(self._outputs)

    def run(self, names: Sequence[str], feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            result = self._request.infer(dict(feed), share_inputs=True)
            return [np.asarray(result[self._index[n]]) for n in names]


def openvino_graph(
    proto: onnx.ModelProto,
    weights: Mapping[str, np.ndarray],
    *,
    threads: int,
    precision: str,
) -> OpenVinoGraph:
    """``proto`` (data-less initializers filled from ``weights``) compiled by OpenVINO's
    CPU plugin on ``threads`` threads, its matmuls and convolutions in ``precision``
    (``INFERENCE_PRECISION_HINT``: f32 is set, never left to the plugin, whose default
    is bf16 on a CPU that has it)."""
    core = _ov_core()
    full = onnx.ModelProto()
    full.CopyFrom(proto)
    for init in full.graph.initializer:
        if init.name in weights:
            init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(weights[init.name]), init.name))
    data = full.SerializeToString()
    outputs = [
        _Output(o.name, _OV_TYPES.get(o.type.tensor_type.elem_type, "tensor(unknown)"))
        for o in full.graph.output
    ]
    del full
    config = {
        "INFERENCE_NUM_THREADS": int(threads),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "bf16" if precision == "bfloat16" else "f32",
    }
    try:
        model = core.read_model(data)
        del data
        compiled = core.compile_model(model, "CPU", config)
    except Exception as exc:
        raise BackendError(f"OpenVINO could not compile the graph: {exc}") from exc
    # OpenVINO names a model's ports by the ONNX names; the session asks by them.
    return OpenVinoGraph(compiled, outputs, precision)


# -- the measured choice --------------------------------------------------------------


def _choices_path() -> Path:
    from paddle_ipu._util.files import compile_cache_dir

    return compile_cache_dir() / CHOICES_FILE


def _read_choices() -> dict[str, Any]:
    try:
        doc = json.loads(_choices_path().read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def store_choice(key: str, record: dict[str, Any]) -> None:
    from paddle_ipu._util.files import write_atomically
    from paddle_ipu.errors import OutputFileError

    with _lock:
        _choices[key] = record
        doc = _read_choices()
        doc[key] = record
        try:
            write_atomically(
                _choices_path(), json.dumps(doc, indent=1, sort_keys=True).encode(), make_dirs=True
            )
        except OutputFileError as exc:  # a cache that cannot be written is not an error
            log.warning("host engine choice not kept on disk (%s): measured again next time", exc)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def choice_key(proto: onnx.ModelProto, threads: int) -> str:
    """What a choice is kept under: the graph's operators in order (not its shapes or
    weights: every input shape of a model shares it), its inputs and outputs, the
    thread count, the CPU and both engines' releases."""
    import onnxruntime

    h = hashlib.sha256()
    for node in proto.graph.node:
        h.update(f"{node.domain}:{node.op_type};".encode())
    for value in [*proto.graph.input, *proto.graph.output]:
        h.update(f"{value.name}:{value.type.tensor_type.elem_type};".encode())
    from importlib.metadata import version

    h.update(
        json.dumps([threads, _cpu_name(), onnxruntime.__version__, version("openvino")]).encode()
    )
    return h.hexdigest()


def recorded(key: str) -> dict[str, Any] | None:
    """The choice kept for ``key`` (this process's, else the cache directory's)."""
    with _lock:
        if key in _choices:
            return _choices[key]
    record = _read_choices().get(key)
    if isinstance(record, dict) and record.get("engine") in ("onnxruntime", "openvino"):
        with _lock:
            _choices[key] = record
        return record
    return None


def zero_feed(proto: onnx.ModelProto) -> dict[str, np.ndarray] | None:
    """A feed of zeros for the graph's inputs; None when a shape is not static."""
    from onnx.helper import tensor_dtype_to_np_dtype

    initializers = {i.name for i in proto.graph.initializer}
    feed = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        t = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if any(d < 0 for d in dims):
            return None
        feed[value.name] = np.zeros(dims, dtype=tensor_dtype_to_np_dtype(t.elem_type))
    return feed


def _agree(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> str:
    """Why two engines' outputs differ beyond float32 rounding ("" when they agree)."""
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return f"output {i}: shape {y.shape} against {x.shape}"
        if x.dtype.kind != "f":
            if not np.array_equal(x, y):
                return f"output {i} differs"
            continue
        both = np.isfinite(x) & np.isfinite(y)
        if not np.array_equal(np.isfinite(x), np.isfinite(y)):
            return f"output {i}: its infinities or NaNs differ"
        scale = float(np.abs(x[both]).max()) if both.any() else 0.0
        diff = float(np.abs(x[both].astype(np.float64) - y[both]).max()) if both.any() else 0.0
        if diff > 1e-3 * scale + 1e-5:
            return f"output {i}: largest difference {diff:.3g} (largest value {scale:.3g})"
    return ""


def _clock(threads: int) -> Callable[[], float]:
    """What a call is timed by: on one thread the process's CPU time (the work done,
    which other jobs on the machine move far less than the wall clock: measured 2-4x
    apart on a loaded 2-core machine); on several, the wall clock (the CPU time would
    count threads that wait by spinning as work)."""
    return time.process_time if threads == 1 else time.perf_counter


def measure(
    ort_run: Runner,
    make_ov: Callable[[], OpenVinoGraph],
    names: list[str],
    feed: dict[str, np.ndarray],
    threads: int = 1,
) -> tuple[dict[str, Any], OpenVinoGraph | None, bool]:
    """The measured choice for one graph (see the module docstring): its record,
    OpenVINO's compiled graph when it is the choice, and whether the record is kept
    (not for a graph too small to measure: another input shape of it may not be)."""
    clock = _clock(threads)

    def timed(run: Runner) -> float:
        t = clock()
        run(names, feed)
        return clock() - t

    first = ort_run(names, feed)
    ort_ms = 1e3 * min(timed(ort_run) for _ in range(2))
    if ort_ms < MEASURE_FROM_MS:
        return (
            {
                "engine": "onnxruntime",
                "onnxruntime_ms": round(ort_ms, 3),
                "why": f"ONNX Runtime runs it in under {MEASURE_FROM_MS} ms",
            },
            None,
            False,
        )
    t = time.perf_counter()
    try:
        graph = make_ov()
        answer = graph.run(names, feed)
    except Exception as exc:  # the record says why; ONNX Runtime runs the graph
        return {"engine": "onnxruntime", "why": f"OpenVINO cannot run it: {exc}"[:500]}, None, True
    compile_s = time.perf_counter() - t
    graph.run(names, feed)  # OpenVINO's second call still sets things up
    differs = _agree(first, answer)
    if differs:
        log.warning("OpenVINO's answer differs from ONNX Runtime's (%s): not used", differs)
        return {"engine": "onnxruntime", "why": f"OpenVINO's answer differs: {differs}"}, None, True
    ratios, ort_t, ov_t = [], [], []
    for _ in range(PAIRS):
        a = timed(ort_run)
        b = timed(graph.run)
        ort_t.append(a)
        ov_t.append(b)
        ratios.append(b / a)
    ratio = statistics.median(ratios)
    engine = "openvino" if ratio <= WIN else "onnxruntime"
    record = {
        "engine": engine,
        "openvino_over_onnxruntime": round(ratio, 4),
        "onnxruntime_ms": round(1e3 * statistics.median(ort_t), 3),
        "openvino_ms": round(1e3 * statistics.median(ov_t), 3),
        "openvino_compile_s": round(compile_s, 2),
        "clock": "cpu" if threads == 1 else "wall",
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return record, graph if engine == "openvino" else None, True


def describe(record: Mapping[str, Any]) -> str:
    if "openvino_over_onnxruntime" in record:
        return (
            f"{record['engine']} (OpenVINO {record['openvino_ms']} ms, ONNX Runtime "
            f"{record['onnxruntime_ms']} ms per call, measured)"
        )
    return f"{record['engine']} ({record.get('why', '')})"


def cache_file() -> str:
    """Where the measured choices are kept (for messages and docs)."""
    return os.fspath(_choices_path())
