"""The ``popart`` backend: a thin adapter from :class:`~paddle_ipu.backends.base.Session`
to Graphcore's PopART Python API (Poplar SDK 3.x).

Checked against the PopART sources of tags ``sdk/poplar/3.0.0`` to ``sdk/poplar/3.4.0``
(python/popart/popart_core/popart.cpp, python/popart/__init__.py.in,
python/popart/python_files/session.py, willow/include/popart/sessionoptions.hpp,
adam.hpp, sgd.hpp, willow/src/session.cpp); docs/backends.md lists every call with
the file it was checked against.  It is tested against a double of that API
(tests/contract/popart_double); it has not run against the real SDK or on IPUs.

Import order.  ``import popart`` raises ImportError when ``onnx`` is already imported
(popart/__init__.py.in).  This module imports the SDK, when it is installed, before
anything of its own that imports onnx, and ``import paddle_ipu`` imports this module
first on machines where ``popart`` can be found.

Options.  ``SessionConfig.options`` holds the IpuStrategy options by their names; the
ones passed through to PopART become ``SessionOptions`` fields under PopART's names
(:mod:`.options`), the rest are read here (``num_ipus``, ``tiles_per_ipu``,
``enable_distribution``, the optimizer settings).  ``SessionConfig.extras`` holds this
backend's own settings (:data:`.options.EXTRAS`).

Environment (the names Paddle 2.x used):

* ``POPLAR_IPUMODEL=1``: run on the simulated IPU Model device.
* ``IPU_COMPILE_ONLY=1``: compile for an offline device and export the executable;
  :meth:`PopartSession.run` then raises.
* ``IPU_CACHE_PATH=dir``: turn on PopART's engine cache in ``dir``.

Serving (``enable_model_runtime_executor`` on an inference graph): after the weights
are written, the first run exports the executable as PopEF (``compileAndExport``),
detaches PopART's device and runs every step through the SDK's ``model_runtime``
(:mod:`.popef`), as Paddle 2.x's PreparePopefSession/RunPopef did.

This module is the adapter over the Session protocol; the rest of the backend is in
its neighbours: :mod:`.device` (taking a device), :mod:`.options` (``SessionOptions``),
:mod:`.optimizer` (the PopART optimizer), :mod:`.state` (optimizer state between
Paddle's and PopART's forms), :mod:`.popef` (the serving path).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys


def _preload_sdk() -> None:
    """Import popart before anything imports onnx: popart/__init__.py.in raises
    ImportError("popart must be imported before onnx") otherwise."""
    if "popart" in sys.modules or "onnx" in sys.modules:
        return
    try:
        if importlib.util.find_spec("popart") is None:
            return
        importlib.import_module("popart")
    except Exception:  # available() reports the reason when it is asked
        return


_preload_sdk()

# ruff: noqa: E402 - the SDK must be imported before these (they import onnx)
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np

from paddle_ipu._util.env import env_flag
from paddle_ipu.backends.base import AnchorReturnType, OptionSupport, Session, SessionConfig
from paddle_ipu.backends.layout import (
    StepLayout,
    buffer_error,
    check_output_buffer,
    check_weight_size,
)
from paddle_ipu.backends.popart.device import (
    DEFAULT_DEVICE_WAIT_S,
    DeviceRequest,
    device_wait_seconds,
    next_power_of_two,
)
from paddle_ipu.backends.popart.optimizer import (
    session_optimizer,
    specific_decay_weights,
    with_strategy,
)
from paddle_ipu.backends.popart.options import EXTRAS, session_options, wanted_patterns
from paddle_ipu.backends.popart.popef import PopefServing
from paddle_ipu.backends.popart.state import StepCounts
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.optimizer import STATE_PREFIXES, OptimizerConfig
from paddle_ipu.errors import (
    BackendError,
    BackendUnavailableError,
    IpuError,
    NotSupportedError,
    OptionError,
    UnknownOptionError,
)

log = logging.getLogger(__name__)

NAME = "popart"

#: What this backend does with the IpuStrategy options (the rest are honoured).
SUPPORT = OptionSupport(
    ignored={
        "host_num_threads": "the host backend's thread count",
        "host_spin_threads": "the host backend's threads",
        "host_fp16_arithmetic": "the host backend's arithmetic (the IPU computes in float16)",
        "host_memory_check": "the host backend's check (the Poplar compile refuses a model "
        "that does not fit itself)",
        "host_engine": "the host backend's engine (Poplar runs the graph)",
    },
    unsupported={
        "host_precision": "the IPU computes float32 or float16 (enable_fp16), not bfloat16",
    },
)


def _import_popart() -> Any:
    try:
        return importlib.import_module("popart")
    except ImportError as exc:
        if "popart" not in sys.modules and "onnx" in sys.modules and "onnx" in str(exc):
            raise ImportError(
                f"{exc} (popart/__init__.py.in refuses to load after onnx: import "
                "paddle_ipu, or popart, before onnx and paddle2onnx)"
            ) from exc
        raise


def available() -> tuple[bool, str]:
    """Whether PopART can be imported here, and why not when it cannot."""
    try:
        popart = _import_popart()
    except Exception as exc:  # ImportError, or a broken SDK install raising anything
        if _sdk_installed():
            # The SDK is installed but unusable: "auto" falls back to host, say why.
            log.warning("the Poplar SDK is installed but popart cannot be imported: %s", exc)
        return False, f"popart is not importable: {exc}"
    version = getattr(popart, "versionString", None)
    detail = f" {version()}" if callable(version) else ""
    return True, f"popart{detail}"


def _check_trip_counts(graph: bytes) -> None:
    """Refuse, naming them, the ONNX Loops without a trip count: PopART's importer
    takes a Loop's ``M`` as a constant and runs the loop for at most that many
    iterations (willow/src/op/loop.cpp, popx/op/loopx.cpp's ``Repeat``); the compiler
    gives a Loop the bound its condition puts on it
    (:mod:`paddle_ipu.compiler.loop_bounds`) where it can."""
    if b"Loop" not in graph:  # an op type is stored as its bytes: no loop, no parse
        return
    import onnx

    from paddle_ipu.compiler.loop_bounds import unbounded

    names = unbounded(onnx.load_from_string(graph))
    if names:
        raise NotSupportedError(
            f"the compiled graph's ONNX Loop(s) {names} have no trip count: PopART runs a "
            "Loop for at most its trip count M, a constant, and the model's condition does "
            "not bound its iterations the way the compiler reads a bound (a counter that "
            "grows by a constant from a constant start, compared with a constant: i < n); "
            "bound the loop in the model that way"
        )


def create_session(model: CompiledModel, config: SessionConfig) -> PopartSession:
    """The backend factory the registry calls."""
    ok, reason = available()
    if not ok:
        raise BackendUnavailableError(f"the popart backend is not available: {reason}")
    return PopartSession(model, config)


def _sdk_installed() -> bool:
    """Whether a ``popart`` package can be found, without importing it."""
    try:
        return importlib.util.find_spec("popart") is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec
        return "popart" in sys.modules


class PopartSession(Session):
    """One compiled graph in one PopART session on one acquired device."""

    backend = NAME

    def __init__(self, model: CompiledModel, config: SessionConfig) -> None:
        super().__init__(model, config)
        self._popart: Any = _import_popart()
        self._extras: dict[str, Any] = dict(config.extras)
        unknown = sorted(set(self._extras) - set(EXTRAS))
        if unknown:
            raise UnknownOptionError(
                f"unknown popart backend setting(s) {unknown}; known: {', '.join(sorted(EXTRAS))}"
            )
        self._device: Any = None
        self._session: Any = None
        self._prepared = False
        self._pending_seed: int | None = config.random_seed
        self._specific: list[str] | None = None  # weights with their own decay
        self._eval = False
        self._steps = StepCounts(
            model.optimizer if isinstance(model.optimizer, OptimizerConfig) else None,
            model.weights,
        )
        # InferenceSession's constantWeights (True by default, sessionoptions.hpp)
        # makes writeWeights raise (willow/src/session.cpp, 3.1+): the executor loads
        # the scope's weights after prepare, so it is off unless asked for.
        raw = dict(self._extras.get("session_options") or {})
        self._constant_weights = bool(raw.get("constantWeights", False))
        self.compile_only = env_flag("IPU_COMPILE_ONLY")
        self.export_path: str | None = None
        self._request = DeviceRequest(model, config, self._extras, self.compile_only)
        if config.is_training and not model.loss:
            raise OptionError("a training session needs the model's loss tensor (model.loss)")
        if config.is_training and model.optimizer is None:
            raise OptionError("a training session needs an optimizer (model.optimizer)")
        if not config.is_training and config.accumulation_factor > 1:
            raise OptionError(
                "gradient accumulation (accumulation_factor > 1) applies to training only"
            )
        self._anchors = self._anchor_types()
        # The PopEF path (:mod:`.popef`): inference only.
        self.model_runtime = not config.is_training and bool(
            config.option("enable_model_runtime_executor")
        )
        self._serving = PopefServing(self._extras, device_wait_seconds(self._extras))

    @property
    def popef_path(self) -> str | None:
        """The PopEF file the model runtime serves (after the first run)."""
        return self._serving.path

    # ---------------------------------------------------------------- building

    def _anchor_types(self) -> dict[str, AnchorReturnType]:
        """Every model output (ALL unless configured) plus any extra configured anchor."""
        anchors = {
            spec.name: self.config.anchors.get(spec.name, AnchorReturnType("ALL"))
            for spec in self.model.outputs
        }
        for name, art in self.config.anchors.items():
            anchors.setdefault(name, art)
        bps = self.config.batches_per_step
        for name, art in anchors.items():
            if art.kind == "EVERYN" and bps % art.period:
                raise OptionError(
                    f"anchor {name!r}: EVERYN period {art.period} does not divide "
                    f"batches_per_step {bps}"
                )
        return anchors

    def _session_options(self) -> Any:
        return session_options(
            self._popart,
            self.config,
            self.model,
            self._extras,
            constant_weights=self._constant_weights,
            distributed=self._request.distributed,
        )

    def _patterns(self) -> Any:
        """IpuStrategy.enable_pattern / disable_pattern, then extras["patterns"]."""
        wanted = wanted_patterns(self.config, self._extras)
        if not wanted:
            return None
        patterns = self._popart.Patterns()
        for name, enabled in wanted.items():
            with self._sdk(f"setting pattern {name!r}"):
                patterns.enablePattern(str(name), bool(enabled))
        return patterns

    def _graph(self) -> bytes:
        """The model's ONNX with each custom operator's region replaced by its PopART
        node (:func:`paddle_ipu.compiler.custom_regions.fuse`), through the fp16
        compiler pass when enable_fp16 is on (the same pass the host backend runs)."""
        _check_trip_counts(self.model.onnx)
        graph = self.model.onnx
        if b"__ipu_custom_op" in graph:
            import onnx

            from paddle_ipu.compiler import custom_regions

            proto = onnx.load_from_string(graph)
            custom_regions.fuse(proto)
            graph = proto.SerializeToString()
        if not self.config.enable_fp16:
            return graph
        from paddle_ipu.compiler.float32_ops import for_session
        from paddle_ipu.compiler.fp16_pass import convert_model

        float32 = for_session(self.model, self.config)
        return convert_model(graph, synced=self.model.weights, float32=float32)

    def _build(self) -> Any:
        """Create the device, the DataFlow, the options and the PopART session."""
        if self._session is not None:
            return self._session
        popart = self._popart
        art_map = {
            name: (
                popart.AnchorReturnType(art.kind, art.period)
                if art.kind == "EVERYN"
                else popart.AnchorReturnType(art.kind)
            )
            for name, art in self._anchors.items()
        }
        dataflow = popart.DataFlow(self.config.batches_per_step, art_map)
        opts = self._session_options()
        patterns = self._patterns()
        with self._sdk("acquiring the device"):
            self._device = self._request.acquire(popart)
        kwargs: dict[str, Any] = {
            "fnModel": self._graph(),
            "dataFlow": dataflow,
            "deviceInfo": self._device,
            "userOptions": opts,
        }
        if patterns is not None:
            kwargs["patterns"] = patterns
        try:
            with self._sdk("building the session"):
                if self.config.is_training:
                    optimizer = self._to_optimizer(self.model.optimizer)
                    self._session = popart.TrainingSession(
                        loss=self.model.loss, optimizer=optimizer, **kwargs
                    )
                else:
                    self._session = popart.InferenceSession(**kwargs)
        except BaseException:
            with suppress(IpuError):
                self._detach()
            self._device = None
            raise
        return self._session

    def _to_optimizer(self, optimizer: Any) -> Any:
        """An OptimizerConfig translated, or a ready popart.Optimizer as it is."""
        base = getattr(self._popart, "Optimizer", None)
        if isinstance(base, type) and isinstance(optimizer, base):
            return optimizer
        if not isinstance(optimizer, OptimizerConfig):
            raise OptionError(
                f"expected an OptimizerConfig or a popart.Optimizer, got {type(optimizer).__name__}"
            )
        optimizer = with_strategy(optimizer, self.config)
        self._steps.optimizer = optimizer
        if self._specific is None:
            device_names = {paddle: onnx for onnx, paddle in self.model.weights.items()}
            self._specific = specific_decay_weights(optimizer, device_names)
        return session_optimizer(
            optimizer, self._popart, self.config, self.model.weights, self._specific
        )

    @contextmanager
    def _sdk(self, what: str) -> Iterator[None]:
        """Turn SDK exceptions into BackendError with a hint a user can act on."""
        try:
            yield
        except IpuError:
            raise
        except Exception as exc:
            name = type(exc).__name__
            text = str(exc) or name
            if "OutOfMemory" in name or "out of memory" in text.lower():
                raise BackendError(
                    f"PopART ran out of IPU memory while {what}: {text}. Try a smaller "
                    "micro_batch_size, a lower availableMemoryProportion, more IPUs "
                    "(sharding), or optimizer state off-chip."
                ) from exc
            raise BackendError(f"PopART failed while {what}: {name}: {text}") from exc

    # ---------------------------------------------------------------- protocol

    def prepare_device(self) -> None:
        if self.compile_only:
            path = str(self._extras.get("export_path", "offline_cache.popart"))
            self.compile_and_export(path)
            return
        if self.model_runtime:
            self._serving.check(self.config)
        session = self._build()
        with self._sdk("compiling and loading the graph (prepareDevice)"):
            session.prepareDevice()
        self._prepared = True
        if self._pending_seed is not None:
            self.set_random_seed(self._pending_seed)

    def _require_prepared(self, what: str) -> Any:
        if self.compile_only:
            raise NotSupportedError(
                f"IPU_COMPILE_ONLY is set: the graph was only compiled"
                f"{' and exported to ' + self.export_path if self.export_path else ''}; "
                f"{what} needs a device"
            )
        if not self._prepared:
            raise BackendError(f"{what} before prepare_device()")
        return self._session

    def has_info(self, name: str) -> bool:
        # No 3.x binding has Session.hasInfo (popart.cpp): ask for the tensor ids,
        # which need the executable (session.cpp assertExecutableLoaded).
        step = self._steps.beta2_pow_steps().get(name)
        if step is not None:
            return self.has_info(step)
        if not self._prepared:
            return super().has_info(name)
        with self._sdk(f"looking up tensor {name!r}"):
            return name in self._tensor_ids(self._session)

    def _info(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        with self._sdk(f"looking up tensor {name!r}"):
            info = self._build().getInfo(name)
            return tuple(int(d) for d in info.shape()), np.dtype(info.data_type_lcase())

    # -- weights -------------------------------------------------------------------

    def _to_device_buffers(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        buffers: dict[str, np.ndarray] = {}
        for name, array in weights.items():
            shape, dtype = self._info(name)
            arr = self._steps.to_device(name, np.asarray(array))
            check_weight_size(name, arr, shape)
            # The exact shape (a 0-d Step___ stays 0-d: np.ascontiguousarray would
            # make it (1,)), the device dtype (fp16 for enable_fp16), C order.
            buffers[name] = np.array(arr.reshape(shape), dtype=dtype, order="C", copy=True)
        return buffers

    def write_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        if self.compile_only:
            return  # nothing to load: there is no device (the seed skips this too)
        session = self._require_prepared("write_weights")
        if not self.config.is_training and self._constant_weights and weights:
            raise OptionError(
                "SessionOptions.constantWeights is True: PopART compiles the weights into "
                "the executable and refuses writeWeights (willow/src/session.cpp); leave "
                "constantWeights unset to load weights after compiling"
            )
        derived = self._steps.beta2_pow_steps()
        buffers = self._to_device_buffers({k: v for k, v in weights.items() if k not in derived})
        if not buffers:
            return
        if self._serving.exported:
            # PopART's device is detached and model_runtime runs the exported
            # executable: writeWeights sets the host data of the weights
            # (devicex.cpp), which the next export writes into the PopEF file.
            self._serving.drop_runner()
            with self._sdk("writing weights"):
                session.writeWeights(self._popart.PyWeightsIO(dict(buffers)))
            return
        self._write_raw(session, buffers)

    def _write_raw(self, session: Any, buffers: Mapping[str, np.ndarray]) -> None:
        with self._sdk("writing weights"):
            session.writeWeights(self._popart.PyWeightsIO(dict(buffers)))
            session.weightsFromHost()

    def _read_raw(self, session: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
        buffers = {}
        for name in names:
            shape, dtype = self._info(name)
            buffers[name] = np.empty(shape, dtype=dtype)
        if buffers:
            with self._sdk("reading weights"):
                session.weightsToHost()
                session.readWeights(self._popart.PyWeightsIO(buffers))
        return buffers

    def weight_names(self) -> list[str]:
        """The weights and the optimizer state the session holds."""
        session = self._build()
        ids = self._tensor_ids(session) if self._prepared else set()
        names: list[str] = []
        for weight in self.model.weights:
            for candidate in (weight, *(p + weight for p in STATE_PREFIXES)):
                if candidate in ids or (not ids and candidate == weight):
                    names.append(candidate)
        return names

    @staticmethod
    def _tensor_ids(session: Any) -> set[str]:
        # InferenceSession binds getAllTensorIds, TrainingSession getTensorIds
        # (popart.cpp, 3.0-3.4).
        for attr in ("getAllTensorIds", "getTensorIds"):
            fn = getattr(session, attr, None)
            if callable(fn):
                return set(fn())
        return set()

    def read_weights(
        self, names: Sequence[str] | None = None, *, copy: bool = True
    ) -> dict[str, np.ndarray]:
        del copy  # readWeights fills new arrays: always copies
        session = self._require_prepared("read_weights")
        self._serving.refuse_after_export("read_weights")
        wanted = list(names) if names is not None else self.weight_names()
        derived = self._steps.beta2_pow_steps()
        steps = {derived[n] for n in wanted if n in derived}
        raw = self._read_raw(session, [n for n in wanted if n not in derived] + sorted(steps))
        return {name: self._steps.from_device(name, raw) for name in wanted}

    def snapshot(self) -> Any:
        # Raw device values: no step-count conversion on the way back.
        session = self._require_prepared("snapshot")
        return self._read_raw(session, self.weight_names())

    def restore(self, snapshot: Any) -> None:
        session = self._require_prepared("restore")
        self._write_raw(session, snapshot)

    def set_eval(self, enabled: bool) -> None:
        """Eval mode.  PopART's optimizers move Adam's moments and step count even at
        lr 0 (adam.hpp), so an eval run puts every weight and state tensor back."""
        self._eval = bool(enabled) and self.config.is_training

    def _layout(self) -> StepLayout:
        """The step layout the session was built with (popdist may set the replicas)."""
        session = self._session
        af = getattr(session, "accumulationFactor", None)
        rf = getattr(session, "replicationFactor", None)
        if not isinstance(af, int):
            af = self.config.accumulation_factor if self.config.is_training else 1
        if not isinstance(rf, int):
            rf = self.config.replication_factor
        return StepLayout(self.config.batches_per_step, max(1, af), max(1, rf))

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        session = self._require_prepared("run")
        layout = self._layout()
        feeds = self._step_feeds(inputs, layout)
        if self.model_runtime:
            return self._run_popef(feeds, outputs, layout)

        if outputs is None:
            with self._sdk("allocating anchors"):
                anchors: dict[str, np.ndarray] = dict(session.initAnchorArrays())
        else:
            anchors = self._output_buffers(outputs, layout)
        saved = self.snapshot() if self._eval else None
        try:
            with self._sdk("running the graph"):
                session.run(self._popart.PyStepIO(feeds, anchors))
        finally:
            if saved is not None:
                self.restore(saved)
        return anchors

    def _step_feeds(
        self, inputs: Mapping[str, np.ndarray], layout: StepLayout
    ) -> dict[str, np.ndarray]:
        """The run's inputs in PopART's step layout, in the dtypes the session holds."""
        feeds: dict[str, np.ndarray] = {}
        for spec in self.model.inputs:
            if spec.name not in inputs:
                raise buffer_error(f"input {spec.name!r} is missing from the run's inputs")
            shape, dtype = self._info(spec.name)
            # The executor checked the feeds (paddle_ipu.executor.feeds, the one check).
            buf = layout.full_view(spec.name, inputs[spec.name], shape)
            # PopART wants the size-1 factors removed.  Only a dtype change (int64 ->
            # int32, fp32 -> fp16) or a non-contiguous buffer makes a copy.
            buf = buf.reshape(layout.input_shape(shape))
            feeds[spec.name] = np.ascontiguousarray(buf, dtype=dtype)
        return feeds

    def _output_buffers(
        self, outputs: Mapping[str, np.ndarray], layout: StepLayout
    ) -> dict[str, np.ndarray]:
        """The caller's anchor buffers, checked against each anchor's layout."""
        anchors = {}
        for name, art in self._anchors.items():
            if name not in outputs:
                raise buffer_error(f"output buffer for anchor {name!r} is missing")
            shape, dtype = self._info(name)
            expected = layout.anchor_shape(shape, art.kind, art.period)
            anchors[name] = check_output_buffer(name, outputs[name], expected, dtype, art.kind)
        return anchors

    # -- the PopEF path (enable_model_runtime_executor) ------------------------------

    def _export_for_serving(self, path: str) -> str:
        self.compile_and_export(path)
        return str(self.export_path)

    def _run_popef(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None,
        layout: StepLayout,
    ) -> dict[str, np.ndarray]:
        runner = self._serving.runner(
            self._export_for_serving,
            self._detach,
            {s.name: self._info(s.name) for s in self.model.inputs},
            {name: self._info(name) for name in self._anchors},
        )
        result = runner.execute(feeds)
        anchors = self._output_buffers(outputs, layout) if outputs is not None else {}
        for name, art in self._anchors.items():
            shape, _ = self._info(name)
            # One micro-batch per run (batches_per_step 1, one replica): every
            # anchor type returns the tensor itself.
            value = result[name].reshape(layout.anchor_shape(shape, art.kind, art.period))
            if name in anchors:
                anchors[name][...] = value
            else:
                anchors[name] = value
        return anchors

    def update_optimizer(self, optimizer: Any) -> None:
        if not self.config.is_training:
            super().update_optimizer(optimizer)
        session = self._require_prepared("update_optimizer")
        popart_opt = self._to_optimizer(optimizer)
        with self._sdk("updating the optimizer"):
            session.updateOptimizerFromHost(popart_opt)

    def set_random_seed(self, seed: int) -> None:
        if not self._prepared:
            self._pending_seed = int(seed)  # applied by prepare_device
            return
        self._serving.refuse_after_export("set_random_seed")
        with self._sdk("setting the random seed"):
            self._session.setRandomSeed(int(seed))
        self._pending_seed = None

    def get_info(self, name: str) -> TensorSpec:
        if name in self._steps.beta2_pow_steps():
            return TensorSpec(name=name, dtype="float32", shape=(1,), paddle_name=name)
        if self._session is None:
            # Inputs and outputs are known without building (and taking a device).
            with suppress(KeyError):
                return super().get_info(name)
        try:
            shape, dtype = self._info(name)
        except BackendError:
            # The protocol's answer for a tensor the session does not hold (has_info
            # relies on it); any other failure of the lookup is PopART's to report.
            if self._prepared and name not in self._tensor_ids(self._session):
                raise KeyError(name) from None
            raise
        paddle_name = ""
        for spec in (*self.model.inputs, *self.model.outputs):
            if spec.name == name:
                paddle_name = spec.paddle_name
        return TensorSpec(name=name, dtype=dtype.name, shape=shape, paddle_name=paddle_name)

    def compile_and_export(self, path: str) -> None:
        # popart/session.py makes os.path.dirname(filename): "" for a bare file name,
        # which os.makedirs refuses.  An absolute path always has a directory.
        target = os.path.abspath(os.path.expanduser(path))
        session = self._build()
        device_kind = str(getattr(getattr(self._device, "type", None), "name", ""))
        if device_kind in ("IpuModel", "Cpu", "Sim"):
            raise OptionError(
                f"cannot export an executable for a {device_kind} device: PopART saves "
                "executables only for IPU and offline IPU devices (session.cpp); set "
                "IPU_COMPILE_ONLY=1 to compile for an offline IPU"
            )
        with self._sdk(f"exporting the executable to {target!r}"):
            session.compileAndExport(target)
        self.export_path = target

    def model_to_host(self, path: str) -> None:
        session = self._require_prepared("model_to_host")
        with self._sdk(f"writing the model to {path!r}"):
            session.modelToHost(path)

    def _detach(self) -> None:
        device = self._device
        if device is None:
            return
        attached = getattr(device, "isAttached", True)
        if attached:
            with self._sdk("detaching the device"):
                device.detach()

    def close(self) -> None:
        try:
            self._serving.drop_runner()
            self._detach()
        finally:
            self._device = None
            self._session = None
            self._prepared = False
            self._serving.close()  # the temporary export


__all__ = [
    "DEFAULT_DEVICE_WAIT_S",
    "NAME",
    "SUPPORT",
    "PopartSession",
    "available",
    "create_session",
    "next_power_of_two",
]
