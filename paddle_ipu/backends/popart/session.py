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
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
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
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np

from paddle_ipu._infra.env import env_flag
from paddle_ipu.backends.base import AnchorReturnType, OptionSupport, Session, SessionConfig
from paddle_ipu.backends.layout import StepLayout
from paddle_ipu.backends.popart import popef as popef_runtime
from paddle_ipu.backends.popart.optimizer import specific_decay_weights, to_popart_optimizer
from paddle_ipu.backends.popart.options import EXTRAS, popart_options, set_session_option
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.optimizer import STATE_PREFIXES, OptimizerConfig
from paddle_ipu.errors import (
    BackendError,
    BackendUnavailableError,
    FeedError,
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
        "host_fp16_arithmetic": "the host backend's arithmetic (the IPU computes in float16)",
    },
)


DEFAULT_DEVICE_WAIT_S = 30.0
_TILES_PER_IPU = {"ipu1": 1216, "ipu2": 1472, "ipu21": 1472}

# Indirection so tests can replace the clock without sleeping.
_monotonic = time.monotonic
_sleep = time.sleep


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


def create_session(model: CompiledModel, config: SessionConfig) -> PopartSession:
    """The backend factory the registry calls."""
    ok, reason = available()
    if not ok:
        raise BackendUnavailableError(f"the popart backend is not available: {reason}")
    return PopartSession(model, config)


def next_power_of_two(n: int) -> int:
    """IPUs are handed out in groups of a power of two."""
    if n < 1:
        raise OptionError(f"the number of IPUs must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


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
        self._optimizer_cfg: OptimizerConfig | None = (
            model.optimizer if isinstance(model.optimizer, OptimizerConfig) else None
        )
        # InferenceSession's constantWeights (True by default, sessionoptions.hpp)
        # makes writeWeights raise (willow/src/session.cpp, 3.1+): the executor loads
        # the scope's weights after prepare, so it is off unless asked for.
        raw = dict(self._extras.get("session_options") or {})
        self._constant_weights = bool(raw.get("constantWeights", False))
        self.compile_only = env_flag("IPU_COMPILE_ONLY")
        self.export_path: str | None = None
        if config.is_training and not model.loss:
            raise OptionError("a training session needs the model's loss tensor (model.loss)")
        if config.is_training and model.optimizer is None:
            raise OptionError("a training session needs an optimizer (model.optimizer)")
        if not config.is_training and config.accumulation_factor > 1:
            raise OptionError(
                "gradient accumulation (accumulation_factor > 1) applies to training only"
            )
        self._anchors = self._anchor_types()
        # The PopEF path (see paddle_ipu/backends/popef.py): inference only.
        self.model_runtime = not config.is_training and bool(
            config.option("enable_model_runtime_executor")
        )
        self._runtime_modules: tuple[Any, Any] | None = None
        self._popef: popef_runtime.PopefRunner | None = None
        self._popef_dir: str | None = None  # a temporary directory this session made
        self.popef_path: str | None = None
        self._exported = False  # PopART's device was detached for model_runtime

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

    def _num_ipus(self) -> int:
        needed = self._ipus_per_replica() * max(1, self.config.replication_factor)
        if not self.config.changed("num_ipus"):
            return needed
        asked = self.config.option("num_ipus")
        if int(asked) < needed:
            raise OptionError(
                f"num_ipus is {int(asked)}, but {self._ipus_per_replica()} IPU(s) per "
                f"replica x {max(1, self.config.replication_factor)} replica(s) need {needed}"
            )
        return int(asked)

    def _ipus_per_replica(self) -> int:
        indices = [s.ipu_index for s in self.model.shards.values() if s.ipu_index >= 0]
        return max(indices) + 1 if indices else 1

    def _device_opts(self, for_offline: bool) -> dict[str, str]:
        version = str(self._extras.get("ipu_version", "ipu2"))
        tiles: Any = None
        if not for_offline or self.config.changed("tiles_per_ipu"):
            tiles = self.config.option("tiles_per_ipu")
        if tiles is None:
            # Paddle 2.x used 4 tiles for the IPU Model; an offline executable meant
            # for real IPUs is compiled for the whole chip unless told otherwise.
            tiles = _TILES_PER_IPU.get(version, 1472) if for_offline else 4
        return {"numIPUs": str(self._num_ipus()), "tilesPerIPU": str(tiles), "ipuVersion": version}

    def _acquire_device(self) -> Any:
        popart = self._popart
        manager = popart.DeviceManager()
        if self.compile_only:
            # Before POPLAR_IPUMODEL: compileAndExport refuses an IPU Model device
            # ("Executables for device type ... cannot be saved", session.cpp
            # assertDeviceCanCompileOffline; only Ipu and OfflineIpu devices can).
            return manager.createOfflineIPUDevice(self._device_opts(for_offline=True))
        if env_flag("POPLAR_IPUMODEL"):
            return manager.createIpuModelDevice(self._device_opts(for_offline=False))
        if self._distributed():
            popdist_popart = self._import_popdist()
            device = popdist_popart.getDevice(self._ipus_per_replica())
            if device is None:
                raise BackendError(
                    f"popdist could not attach {self._ipus_per_replica()} IPU(s) per replica"
                )
            return device
        return self._acquire_hardware(manager)

    def _acquire_hardware(self, manager: Any) -> Any:
        asked = self._num_ipus()
        request = next_power_of_two(asked)
        wait = float(self._extras.get("device_wait_seconds", DEFAULT_DEVICE_WAIT_S))
        deadline = _monotonic() + max(0.0, wait)
        delay = 0.5
        attempts = 0
        last_error: str = "no device was returned"
        while True:
            attempts += 1
            try:
                device = manager.acquireAvailableDevice(request)
            except Exception as exc:  # the SDK raises when none is free
                device = None
                last_error = str(exc) or type(exc).__name__
            if device is not None:
                return device
            remaining = deadline - _monotonic()
            if remaining <= 0:
                break
            _sleep(min(delay, remaining))
            delay = min(delay * 2, 5.0)
        rounded = f" (asked for {asked}, rounded up to a power of two)" if request != asked else ""
        raise BackendError(
            f"could not acquire {request} IPU(s){rounded} after {attempts} attempt(s) over "
            f"{wait:g} s: {last_error}. Other processes may hold the IPUs (see `gc-monitor`); "
            "raise extras['device_wait_seconds'] to wait longer, or set POPLAR_IPUMODEL=1 "
            "to use the simulated IPU Model."
        )

    def _distributed(self) -> bool:
        return bool(self.config.option("enable_distribution"))

    def _import_popdist(self) -> Any:
        try:
            importlib.import_module("popdist")
            return importlib.import_module("popdist.popart")
        except ImportError as exc:
            raise BackendUnavailableError(
                f"enable_distribution needs popdist (run under poprun): {exc}"
            ) from exc

    def _session_options(self) -> Any:
        popart = self._popart
        cfg = self.config
        opts = popart.SessionOptions()
        rf = max(1, cfg.replication_factor)
        af = max(1, cfg.accumulation_factor)
        if rf > 1:
            opts.enableReplicatedGraphs = True
            opts.replicatedGraphCount = rf
        if cfg.is_training and af > 1:
            opts.enableGradientAccumulation = True
            opts.accumulationFactor = af
        if cfg.is_training:
            reduction = cfg.gradient_reduction.lower()
            if reduction == "mean":
                opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
                opts.meanAccumulationAndReplicationReductionStrategy = (
                    popart.MeanReductionStrategy.Post
                )
            elif reduction == "sum":
                opts.accumulationAndReplicationReductionType = popart.ReductionType.Sum
            else:
                raise OptionError(
                    f"gradient_reduction {cfg.gradient_reduction!r} is not 'mean' or 'sum'"
                )
        if any(s.ipu_index >= 0 for s in self.model.shards.values()):
            opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        if not cfg.is_training:
            opts.constantWeights = self._constant_weights
        cache = os.environ.get("IPU_CACHE_PATH", "").strip()
        if cache:
            opts.enableEngineCaching = True
            opts.cachePath = cache
        fields = popart_options(cfg.options, cfg.explicit)
        fields.update(self._extras.get("session_options") or {})
        for name, value in fields.items():
            self._set_option(opts, name, value)
        if self._distributed():
            self._import_popdist().configureSessionOptions(opts)
        if getattr(opts, "enableEngineCaching", False):
            self._check_cache_dir(str(opts.cachePath))
        return opts

    def _set_option(self, opts: Any, name: str, value: Any) -> None:
        set_session_option(self._popart, opts, name, value)

    @staticmethod
    def _check_cache_dir(path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise BackendError(
                f"the engine cache directory {path!r} cannot be created: {exc}"
            ) from exc
        if not os.access(path, os.W_OK):
            raise BackendError(f"the engine cache directory {path!r} is not writable")

    def _patterns(self) -> Any:
        """IpuStrategy.enable_pattern / disable_pattern, then extras["patterns"]."""
        wanted: dict[str, bool] = dict(self.config.patterns)
        wanted.update(dict(self._extras.get("patterns") or {}))
        if not wanted:
            return None
        patterns = self._popart.Patterns()
        for name, enabled in wanted.items():
            with self._sdk(f"setting pattern {name!r}"):
                patterns.enablePattern(str(name), bool(enabled))
        return patterns

    def _graph(self) -> bytes:
        """The model's ONNX, through the fp16 compiler pass when enable_fp16 is on
        (the same pass the host backend runs)."""
        if not self.config.enable_fp16:
            return self.model.onnx
        from paddle_ipu.compiler.fp16_pass import convert_model

        return convert_model(self.model.onnx)

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
            self._device = self._acquire_device()
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
        optimizer = self._with_strategy(optimizer)
        self._optimizer_cfg = optimizer
        device_names = {paddle: onnx for onnx, paddle in self.model.weights.items()}
        if self._specific is None:
            self._specific = specific_decay_weights(optimizer, device_names)
        # Paddle's lamb kernel has no bound: only a max_weight_norm set explicitly sets one.
        bound = (
            self.config.option("max_weight_norm")
            if self.config.changed("max_weight_norm")
            else None
        )
        return to_popart_optimizer(
            optimizer,
            self._popart,
            device_names,
            self._specific,
            max_weight_norm=None if bound is None else float(bound),
            scaled_optimizer_state=bool(self.config.option("scaled_optimizer_state")),
            no_bias=bool(self.config.option("use_no_bias_optimizer")),
        )

    def _with_strategy(self, cfg: OptimizerConfig) -> OptimizerConfig:
        """The IpuStrategy's weight_decay_mode and accl*_type override the program's."""
        import dataclasses

        changes: dict[str, Any] = {}
        mode = self.config.option("weight_decay_mode")
        if mode:
            changes["weight_decay_mode"] = str(mode)
        for field in ("accl1_type", "accl2_type", "accl3_type"):
            if self.config.changed(field):
                changes[field] = str(self.config.option(field))
        return dataclasses.replace(cfg, **changes) if changes else cfg

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
            self._check_model_runtime()
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
        step = self._beta2_pow_steps().get(name)
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

    # -- Adam-family step count --------------------------------------------------

    def _step_beta1(self, name: str) -> float | None:
        """beta1 when ``name`` is PopART's step count of an Adam-family weight."""
        cfg = self._optimizer_cfg
        if not name.startswith("Step___") or cfg is None:
            return None
        if cfg.type not in ("adam", "adamw", "adamax", "lamb"):
            return None
        return float(cfg.beta1)

    @staticmethod
    def _beta1_pow_to_step(name: str, value: np.ndarray, beta1: float) -> np.ndarray:
        """Paddle's ``beta1_pow_acc`` -> PopART's ``Step___``.

        Paddle's beta1_pow starts at beta1 and is multiplied by beta1 after each
        update, so after k updates it is beta1**(k+1).  PopART's Step___ is a float
        count that starts at 0 and is incremented before the bias correction
        1 - beta1**t (adamdecompose.cpp, adamupdaterx.cpp): after k updates it is k.
        The count is kept fractional, so the device corrects by exactly 1 - pow."""
        pow_ = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
        if not 0.0 < beta1 < 1.0:
            return np.zeros((), np.float64)  # bias correction is 1 - beta1**t = 1 - 0 / 0
        if not 0.0 < pow_ <= 1.0:
            raise FeedError(f"optimizer state {name!r}: beta1_pow must be in (0, 1], got {pow_!r}")
        return np.asarray(math.log(pow_) / math.log(beta1) - 1.0, dtype=np.float64)

    def _beta2_pow_steps(self) -> dict[str, str]:
        """Paddle's ``beta2_pow_acc`` variable -> the ``Step___`` tensor it follows.

        PopART keeps one step count per weight and derives both bias corrections
        from it (adamupdaterx.cpp), so Paddle's beta2_pow has no device tensor: it
        is read as beta2**(t+1) and never written (the count comes from beta1_pow)."""
        cfg = self._optimizer_cfg
        if cfg is None or cfg.type not in ("adam", "adamw", "lamb"):
            return {}
        onnx_of = {paddle: onnx for onnx, paddle in self.model.weights.items()}
        return {
            var: "Step___" + onnx_of.get(slot.name, slot.name)
            for slot in cfg.params
            if (var := slot.state.get("beta2_pow"))
        }

    @staticmethod
    def _step_to_beta1_pow(value: np.ndarray, beta1: float) -> np.ndarray:
        step = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
        return np.asarray([beta1 ** (step + 1.0)], dtype=np.float32)

    # -- weights -------------------------------------------------------------------

    def _to_device_buffers(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        buffers: dict[str, np.ndarray] = {}
        for name, array in weights.items():
            shape, dtype = self._info(name)
            arr = np.asarray(array)
            beta1 = self._step_beta1(name)
            if beta1 is not None:
                arr = self._beta1_pow_to_step(name, arr, beta1)
            if arr.size != int(np.prod(shape, dtype=np.int64)):
                raise FeedError(f"weight {name!r} has shape {arr.shape}; the session holds {shape}")
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
        derived = self._beta2_pow_steps()
        buffers = self._to_device_buffers({k: v for k, v in weights.items() if k not in derived})
        if not buffers:
            return
        if self._exported:
            # PopART's device is detached and model_runtime runs the exported
            # executable: writeWeights sets the host data of the weights
            # (devicex.cpp), which the next export writes into the PopEF file.
            self._close_popef()
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
        self._refuse_after_export("read_weights")
        wanted = list(names) if names is not None else self.weight_names()
        derived = self._beta2_pow_steps()
        steps = {derived[n] for n in wanted if n in derived}
        raw = self._read_raw(session, [n for n in wanted if n not in derived] + sorted(steps))
        buffers: dict[str, np.ndarray] = {}
        for name in wanted:
            if name in derived:
                beta2 = float(self._optimizer_cfg.beta2)  # type: ignore[union-attr]
                buffers[name] = self._step_to_beta1_pow(raw[derived[name]], beta2)
                continue
            beta1 = self._step_beta1(name)
            buffers[name] = (
                raw[name] if beta1 is None else self._step_to_beta1_pow(raw[name], beta1)
            )
        return buffers

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
                raise FeedError(f"input {spec.name!r} is missing from the run's inputs")
            shape, dtype = self._info(spec.name)
            # The executor checked the feeds (StepLayout.to_step_buffer, the one check).
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
                raise FeedError(f"output buffer for anchor {name!r} is missing")
            shape, dtype = self._info(name)
            expected = layout.anchor_shape(shape, art.kind, art.period)
            buf = outputs[name]
            if buf.shape != expected or buf.dtype != dtype:
                raise FeedError(
                    f"output buffer {name!r} is {buf.dtype}{list(buf.shape)}; "
                    f"the {art.kind} anchor needs {dtype}{list(expected)}"
                )
            if not buf.flags.c_contiguous or not buf.flags.writeable:
                raise FeedError(f"output buffer {name!r} must be C-contiguous and writable")
            anchors[name] = buf
        return anchors

    # -- the PopEF path (enable_model_runtime_executor) ------------------------------

    def _check_model_runtime(self) -> None:
        """At prepare time, before a device is taken: the SDK modules import, and
        the session is one the PopEF path can serve."""
        bps = self.config.batches_per_step
        rf = max(1, self.config.replication_factor)
        if bps > 1 or rf > 1:
            raise NotSupportedError(
                f"enable_model_runtime_executor on the popart backend takes batches_per_step=1 "
                f"and one replica (got batches_per_step={bps}, replication_factor={rf}): how "
                "model_runtime's ModelRunner feeds a PopEF executable of several micro-batches "
                "per step is not confirmed; set batches_per_step=1, or turn "
                "enable_model_runtime_executor off"
            )
        if env_flag("POPLAR_IPUMODEL"):
            raise OptionError(
                "enable_model_runtime_executor runs a PopEF export, and PopART exports "
                "executables only for IPU and offline IPU devices (session.cpp "
                "assertDeviceCanCompileOffline), not the IPU Model: unset POPLAR_IPUMODEL, or "
                "turn enable_model_runtime_executor off"
            )
        self._runtime_modules = popef_runtime.import_runtime()

    def _popef_target(self) -> str:
        asked = self._extras.get("popef_path")
        if asked:
            return str(asked)
        if self._popef_dir is None:
            self._popef_dir = tempfile.mkdtemp(prefix="paddle-ipu-popef-")
        return os.path.join(self._popef_dir, "model.popef")

    def _popef_runner(self) -> popef_runtime.PopefRunner:
        """The ModelRunner, made at the first run after the weights were written
        (Paddle 2.x's PreparePopefSession order): export, detach PopART's device so
        the runner can take the IPU, then load the PopEF file."""
        runner = self._popef
        if runner is not None:
            return runner
        inputs = {s.name: self._info(s.name) for s in self.model.inputs}
        outputs = {name: self._info(name) for name in self._anchors}
        self.compile_and_export(self._popef_target())
        self.popef_path = self.export_path
        self._exported = True
        self._detach()
        runner = popef_runtime.PopefRunner(
            str(self.popef_path),
            inputs,
            outputs,
            device_wait_s=float(self._extras.get("device_wait_seconds", DEFAULT_DEVICE_WAIT_S)),
            modules=self._runtime_modules,
        )
        self._popef = runner
        return runner

    def _run_popef(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None,
        layout: StepLayout,
    ) -> dict[str, np.ndarray]:
        runner = self._popef_runner()
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

    def _refuse_after_export(self, what: str) -> None:
        if self._exported:
            raise NotSupportedError(
                f"{what}: the graph runs through model_runtime over a PopEF export and "
                "PopART's device is detached; no device call is made after the export"
            )

    def _close_popef(self) -> None:
        runner, self._popef = self._popef, None
        if runner is not None:
            runner.close()

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
        self._refuse_after_export("set_random_seed")
        with self._sdk("setting the random seed"):
            self._session.setRandomSeed(int(seed))
        self._pending_seed = None

    def get_info(self, name: str) -> TensorSpec:
        if name in self._beta2_pow_steps():
            return TensorSpec(name=name, dtype="float32", shape=(1,), paddle_name=name)
        if self._session is None:
            # Inputs and outputs are known without building (and taking a device).
            with suppress(KeyError):
                return super().get_info(name)
        shape, dtype = self._info(name)
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
            self._close_popef()
            self._detach()
        finally:
            self._device = None
            self._session = None
            self._prepared = False
            if self._popef_dir is not None:
                shutil.rmtree(self._popef_dir, ignore_errors=True)
                self._popef_dir = None


__all__ = [
    "DEFAULT_DEVICE_WAIT_S",
    "NAME",
    "SUPPORT",
    "PopartSession",
    "available",
    "create_session",
    "next_power_of_two",
]
