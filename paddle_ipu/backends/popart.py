"""The ``popart`` backend: a thin adapter from :class:`~paddle_ipu.backends.base.Session`
to Graphcore's PopART Python API (Poplar SDK 3.x).

Nothing here imports the SDK at module import time: :func:`available` and the session
import ``popart`` when they are called, so ``import paddle_ipu`` works on machines
without the SDK.

The adapter is written against PopART's documented Python API.  It has been checked
only against a fake ``popart`` module that records calls (tests/contract); it has not
run against the real SDK or on IPUs.

Options.  ``SessionConfig.options`` holds PopART ``SessionOptions`` attributes under
their own camelCase names (``enableStochasticRounding``, ``virtualGraphMode`` ...),
set as given; a string is turned into the enum member of that name when the option is
an enum.  A few snake_case keys are read by the adapter itself and never reach
``SessionOptions`` (see :data:`ADAPTER_OPTIONS`).

Environment (the names Paddle 2.x used):

* ``POPLAR_IPUMODEL=1``: run on the simulated IPU Model device.
* ``IPU_COMPILE_ONLY=1``: compile for an offline device and export the executable;
  :meth:`PopartSession.run` then raises.
* ``IPU_CACHE_PATH=dir``: turn on PopART's engine cache in ``dir``.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np

from paddle_ipu.backends.base import AnchorReturnType, Session, SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.optimizer import OptimizerConfig
from paddle_ipu.errors import (
    BackendError,
    BackendUnavailableError,
    FeedError,
    IpuError,
    NotSupportedError,
    OptionError,
    UnknownOptionError,
)
from paddle_ipu.layout import StepLayout

NAME = "popart"

#: Keys of ``SessionConfig.options`` that the adapter reads itself.
ADAPTER_OPTIONS: dict[str, str] = {
    "num_ipus": "IPUs to acquire, replicas included (default: shards x replicas)",
    "tiles_per_ipu": "tiles per IPU for the IPU Model / offline device",
    "ipu_version": 'IPU architecture for the IPU Model / offline device (default "ipu2")',
    "enable_distribution": "take the device and replica layout from popdist (poprun)",
    "device_wait_seconds": "how long to retry acquiring busy IPUs (default 30)",
    "patterns": "PopART pattern name -> enabled",
    "export_path": 'where IPU_COMPILE_ONLY writes the executable ("offline_cache.popart")',
}

#: Prefixes PopART gives optimizer state and accumulator tensors of a weight.
STATE_PREFIXES = ("Accl___", "Accl1___", "Accl2___", "Accl3___", "Accum___", "Step___")

DEFAULT_DEVICE_WAIT_S = 30.0
_TILES_PER_IPU = {"ipu1": 1216, "ipu2": 1472, "ipu21": 1472}
_TRUE = {"1", "true", "yes", "on"}

# Indirection so tests can replace the clock without sleeping.
_monotonic = time.monotonic
_sleep = time.sleep


def _import_popart() -> Any:
    return importlib.import_module("popart")


def available() -> tuple[bool, str]:
    """Whether PopART can be imported here, and why not when it cannot."""
    try:
        popart = _import_popart()
    except Exception as exc:  # ImportError, or a broken SDK install raising anything
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


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def next_power_of_two(n: int) -> int:
    """IPUs are handed out in groups of a power of two."""
    if n < 1:
        raise OptionError(f"the number of IPUs must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


# --------------------------------------------------------------------------- optimizer


# The largest float32: a weight-norm bound that never applies.
_NO_WEIGHT_NORM_BOUND = 3.4028234663852886e38


def _accl_type(popart: Any, value: Any, default: Any) -> Any:
    if value is None or value == "":
        return default
    text = str(value).upper()
    if text in ("FLOAT", "FLOAT32", "FP32"):
        return popart.DataType.FLOAT
    if text in ("FLOAT16", "HALF", "FP16"):
        return popart.DataType.FLOAT16
    raise OptionError(f"optimizer state type {value!r} is not FLOAT or FLOAT16")


def specific_decay_weights(
    cfg: OptimizerConfig, device_names: Mapping[str, str] | None = None
) -> list[str]:
    """Device names of the parameters whose decay differs from the common one
    (ParamAttr regularizers, AdamW's apply_decay_param_fun, Lamb's exclusions)."""
    names = device_names or {}
    return [
        names.get(slot.name, slot.name)
        for slot in cfg.params
        if float(slot.weight_decay) != float(cfg.weight_decay)
    ]


def to_popart_optimizer(
    cfg: OptimizerConfig,
    popart: Any,
    device_names: Mapping[str, str] | None = None,
    specific: Sequence[str] | None = None,
) -> Any:
    """Translate an :class:`~paddle_ipu.compiler.optimizer.OptimizerConfig` into a
    ``popart.SGD``, ``popart.Adam`` or ``popart.Adaptive``.

    Fields read: ``type``, ``lr``, ``weight_decay``, ``weight_decay_mode``,
    ``momentum``, ``beta1``, ``beta2``, ``epsilon``, ``rho``, ``clip_norm``,
    ``loss_scaling``, ``accl1_type``/``accl2_type``/``accl3_type``, and per parameter
    ``params[i].name``, ``.weight_decay`` and ``.clip``.  ``device_names`` maps a
    Paddle parameter name to its device tensor name where the two differ.

    Per-parameter decays go in with ``insertSpecific`` for the weights in
    ``specific`` (default: :func:`specific_decay_weights`).  A replacement optimizer
    must carry the same specific weights as the one the session was built with, so
    the session passes the list it started with on every update.

    The learning rate and the weight decay are non-const (``(value, False)``) so that
    lr schedules and eval mode (lr 0, decay 0) can change them through
    ``updateOptimizerFromHost``; the other hyper-parameters are const.
    """
    kind = cfg.type
    names = dict(device_names or {})
    wd_mode_name = (cfg.weight_decay_mode or "none").lower()
    if wd_mode_name not in ("none", "decay", "l2_regularization"):
        raise OptionError(
            f"weight_decay_mode {cfg.weight_decay_mode!r} is not one of "
            "'none', 'decay', 'l2_regularization'"
        )
    values: dict[str, tuple[float, bool]] = {
        "defaultLearningRate": (float(cfg.lr), False),
        "defaultWeightDecay": (float(cfg.weight_decay), False),
        "lossScaling": (float(cfg.loss_scaling), True),
    }

    clip: list[Any] = []
    if cfg.clip_norm:
        clipped = [names.get(p.name, p.name) for p in cfg.params if p.clip]
        if not cfg.params or len(clipped) == len(cfg.params):
            clip = [popart.ClipNormSettings.clipAllWeights(float(cfg.clip_norm))]
        elif clipped:
            clip = [popart.ClipNormSettings.clipWeights(clipped, float(cfg.clip_norm))]

    def decay_mode(default: str) -> Any:
        mode = default if wd_mode_name == "none" else wd_mode_name
        if mode == "decay":
            return popart.WeightDecayMode.Decay
        return popart.WeightDecayMode.L2Regularization

    opt: Any
    if kind in ("sgd", "momentum"):
        if wd_mode_name == "decay":
            raise NotSupportedError(
                f"decoupled weight decay with {kind} has no PopART SGD equivalent"
            )
        # Paddle's sgd and momentum kernels have neither dampening nor velocity scaling;
        # PopART's dampening scales the gradient even without momentum (its SGD0
        # update is w -= lr * (1 - dm) * (g + wd * w)), so it is set in both cases.
        values["defaultDampening"] = (0.0, True)
        values["defaultVelocityScaling"] = (1.0, True)
        # PopART's SGD adds the decay to the gradient, as Paddle's L2 regularizer does.
        if kind == "momentum" and cfg.momentum:
            values["defaultMomentum"] = (float(cfg.momentum), True)
            # Separate keeps Paddle's velocity as it is in Accl1___<w>.  The default,
            # Combined, stores in Accl___<w> the next step's precomputed
            # "v * mm / rf + wd * vs * w" (PopART's sgd.hpp), which is not Paddle's
            # velocity: weights_to_host and a resumed checkpoint would be wrong.
            opt = popart.SGD(
                values,
                clip,
                accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate,
                accl1Type=_accl_type(popart, cfg.accl1_type, popart.DataType.UNDEFINED),
            )
        else:
            opt = popart.SGD(values, clip)
    elif kind in ("adam", "adamw", "adamax", "lamb"):
        values["defaultBeta1"] = (float(cfg.beta1), True)
        values["defaultBeta2"] = (float(cfg.beta2), True)
        values["defaultEps"] = (float(cfg.epsilon), True)
        if kind == "lamb":
            # Paddle's lamb kernel does not bound the weight norm of its trust ratio;
            # PopART's Lamb bounds it by maxWeightNorm, 10 when unset (adam.hpp).
            values["maxWeightNorm"] = (_NO_WEIGHT_NORM_BOUND, True)
        mode = {
            "adam": popart.AdamMode.Adam,
            "adamw": popart.AdamMode.Adam,
            "adamax": popart.AdamMode.AdaMax,
            "lamb": popart.AdamMode.Lamb,
        }[kind]
        opt = popart.Adam(
            values,
            mode=mode,
            # adam/adamax: Paddle adds the decay to the gradient; adamw/lamb: decoupled.
            weight_decay_mode=decay_mode(
                "decay" if kind in ("adamw", "lamb") else "l2_regularization"
            ),
            accl1_type=_accl_type(popart, cfg.accl1_type, popart.DataType.FLOAT),
            accl2_type=_accl_type(popart, cfg.accl2_type, popart.DataType.FLOAT),
            clip_norm_settings=clip,
        )
    elif kind in ("adagrad", "rmsprop", "centered_rmsprop", "adadelta"):
        mode = {
            "adagrad": popart.AdaptiveMode.AdaGrad,
            "adadelta": popart.AdaptiveMode.AdaDelta,
            "rmsprop": popart.AdaptiveMode.RMSProp,
            "centered_rmsprop": popart.AdaptiveMode.CenteredRMSProp,
        }[kind]
        values["defaultEps"] = (float(cfg.epsilon), True)
        if kind != "adagrad":
            values["defaultAlpha"] = (float(cfg.rho), True)
        if kind in ("rmsprop", "centered_rmsprop"):
            values["defaultMomentum"] = (float(cfg.momentum), True)
        if clip:
            raise NotSupportedError(
                f"global-norm gradient clipping with {kind} has no PopART equivalent "
                "(PopART clips only SGD and Adam-family optimizers)"
            )
        opt = popart.Adaptive(
            values,
            mode=mode,
            weight_decay_mode=decay_mode("l2_regularization"),
            accl1_type=_accl_type(popart, cfg.accl1_type, popart.DataType.FLOAT),
            accl2_type=_accl_type(popart, cfg.accl2_type, popart.DataType.FLOAT),
            accl3_type=_accl_type(popart, cfg.accl3_type, popart.DataType.UNDEFINED),
            # Paddle's rmsprop adds eps inside the square root and applies lr to the
            # momentum term: PopART's "TF variant" of RMSProp.
            rmsprop_tf_variant=kind in ("rmsprop", "centered_rmsprop"),
        )
    else:
        raise NotSupportedError(
            f"optimizer type {kind!r} has no PopART equivalent (supported: sgd, momentum, "
            "adam, adamw, adamax, lamb, adagrad, adadelta, rmsprop, centered_rmsprop)"
        )
    decays = {names.get(slot.name, slot.name): float(slot.weight_decay) for slot in cfg.params}
    wanted = specific_decay_weights(cfg, names) if specific is None else specific
    for weight in wanted:
        decay = decays.get(weight, float(cfg.weight_decay))
        opt.insertSpecific(weight, {"weightDecay": (decay, False)})
    return opt


# --------------------------------------------------------------------------- session


class PopartSession(Session):
    """One compiled graph in one PopART session on one acquired device."""

    backend = NAME

    def __init__(self, model: CompiledModel, config: SessionConfig) -> None:
        super().__init__(model, config)
        self._popart: Any = _import_popart()
        self._options: dict[str, Any] = dict(config.options)
        self._device: Any = None
        self._session: Any = None
        self._prepared = False
        self._pending_seed: int | None = config.random_seed
        self._specific: list[str] | None = None  # weights with their own decay
        self.compile_only = _env_flag("IPU_COMPILE_ONLY")
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
        explicit = self._options.get("num_ipus")
        if explicit is not None:
            return int(explicit)
        return self._ipus_per_replica() * max(1, self.config.replication_factor)

    def _ipus_per_replica(self) -> int:
        indices = [s.ipu_index for s in self.model.shards.values() if s.ipu_index >= 0]
        return max(indices) + 1 if indices else 1

    def _device_opts(self, for_offline: bool) -> dict[str, str]:
        version = str(self._options.get("ipu_version", "ipu2"))
        tiles = self._options.get("tiles_per_ipu")
        if tiles is None:
            # Paddle 2.x used 4 tiles everywhere; an offline executable meant for real
            # IPUs must be compiled for the whole chip.
            tiles = _TILES_PER_IPU.get(version, 1472) if for_offline else 4
        return {"numIPUs": str(self._num_ipus()), "tilesPerIPU": str(tiles), "ipuVersion": version}

    def _acquire_device(self) -> Any:
        popart = self._popart
        manager = popart.DeviceManager()
        if _env_flag("POPLAR_IPUMODEL"):
            return manager.createIpuModelDevice(self._device_opts(for_offline=False))
        if self.compile_only:
            return manager.createOfflineIPUDevice(self._device_opts(for_offline=True))
        if self._options.get("enable_distribution"):
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
        wait = float(self._options.get("device_wait_seconds", DEFAULT_DEVICE_WAIT_S))
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
            "raise options['device_wait_seconds'] to wait longer, or set POPLAR_IPUMODEL=1 "
            "to use the simulated IPU Model."
        )

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
        cache = os.environ.get("IPU_CACHE_PATH", "").strip()
        if cache:
            opts.enableEngineCaching = True
            opts.cachePath = cache
        for name, value in self._options.items():
            if name in ADAPTER_OPTIONS:
                continue
            self._set_option(opts, name, value)
        if self._options.get("enable_distribution"):
            self._import_popdist().configureSessionOptions(opts)
        if getattr(opts, "enableEngineCaching", False):
            self._check_cache_dir(str(opts.cachePath))
        return opts

    @staticmethod
    def _set_option(opts: Any, name: str, value: Any) -> None:
        if not hasattr(opts, name):
            raise UnknownOptionError(
                f"{name!r} is not a PopART SessionOptions attribute (nor one of the "
                f"adapter's options: {', '.join(sorted(ADAPTER_OPTIONS))})"
            )
        current = getattr(opts, name)
        enum_type = type(current)
        if isinstance(value, str) and hasattr(enum_type, "__members__"):
            members = enum_type.__members__
            if value not in members:
                raise OptionError(
                    f"SessionOptions.{name}: {value!r} is not one of {', '.join(members)}"
                )
            value = members[value]
        try:
            setattr(opts, name, value)
        except (TypeError, ValueError, AttributeError) as exc:
            raise OptionError(f"SessionOptions.{name} = {value!r} was refused: {exc}") from exc

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
        wanted = self._options.get("patterns")
        if not wanted:
            return None
        patterns = self._popart.Patterns()
        for name, enabled in dict(wanted).items():
            patterns.enablePattern(str(name), bool(enabled))
        return patterns

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
            "fnModel": self.model.onnx,
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
        device_names = {paddle: onnx for onnx, paddle in self.model.weights.items()}
        if self._specific is None:
            self._specific = specific_decay_weights(optimizer, device_names)
        return to_popart_optimizer(optimizer, self._popart, device_names, self._specific)

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
        session = self._build()
        if self.compile_only:
            path = str(self._options.get("export_path", "offline_cache.popart"))
            with self._sdk("compiling for the offline device"):
                session.compileAndExport(path)
            self.export_path = path
            return
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
        if self._session is None:
            return super().has_info(name)
        with self._sdk(f"looking up tensor {name!r}"):
            return bool(self._session.hasInfo(name))

    def _info(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        with self._sdk(f"looking up tensor {name!r}"):
            info = self._build().getInfo(name)
            return tuple(int(d) for d in info.shape()), np.dtype(info.data_type_lcase())

    def write_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        if self.compile_only:
            return  # nothing to load: there is no device (the seed skips this too)
        session = self._require_prepared("write_weights")
        buffers: dict[str, np.ndarray] = {}
        for name, array in weights.items():
            shape, dtype = self._info(name)
            arr = np.asarray(array)
            if arr.size != int(np.prod(shape, dtype=np.int64)):
                raise FeedError(f"weight {name!r} has shape {arr.shape}; the session holds {shape}")
            # fp32 -> fp16 (enable_fp16) or any other dtype change is a copy.
            buffers[name] = np.ascontiguousarray(arr.reshape(shape), dtype=dtype)
        if not buffers:
            return
        with self._sdk("writing weights"):
            session.writeWeights(self._popart.PyWeightsIO(buffers))
            session.weightsFromHost()

    def weight_names(self) -> list[str]:
        """The weights and the optimizer state the session holds."""
        session = self._build()
        ids = self._tensor_ids(session)
        names: list[str] = []
        for weight in self.model.weights:
            for candidate in (weight, *(p + weight for p in STATE_PREFIXES)):
                if candidate in ids or (not ids and candidate == weight):
                    names.append(candidate)
        return names

    @staticmethod
    def _tensor_ids(session: Any) -> set[str]:
        # InferenceSession binds getAllTensorIds, TrainingSession getTensorIds.
        for attr in ("getAllTensorIds", "getTensorIds"):
            fn = getattr(session, attr, None)
            if callable(fn):
                return set(fn())
        return set()

    def read_weights(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        session = self._require_prepared("read_weights")
        wanted = list(names) if names is not None else self.weight_names()
        buffers = {}
        for name in wanted:
            shape, dtype = self._info(name)
            buffers[name] = np.empty(shape, dtype=dtype)
        if not buffers:
            return {}
        with self._sdk("reading weights"):
            session.weightsToHost()
            session.readWeights(self._popart.PyWeightsIO(buffers))
        return buffers

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
        unknown = set(inputs) - {s.name for s in self.model.inputs}
        if unknown:
            raise FeedError(f"unknown inputs: {', '.join(sorted(unknown))}")
        feeds: dict[str, np.ndarray] = {}
        for spec in self.model.inputs:
            if spec.name not in inputs:
                raise FeedError(f"input {spec.name!r} is missing from the run's inputs")
            shape, dtype = self._info(spec.name)
            buf = layout.to_step_buffer(spec.name, np.asarray(inputs[spec.name]), shape)
            # PopART wants the size-1 factors removed.  Only a dtype change (int64 ->
            # int32, fp32 -> fp16) or a non-contiguous buffer makes a copy.
            buf = buf.reshape(layout.input_shape(shape))
            feeds[spec.name] = np.ascontiguousarray(buf, dtype=dtype)

        if outputs is None:
            with self._sdk("allocating anchors"):
                anchors: dict[str, np.ndarray] = dict(session.initAnchorArrays())
        else:
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
        with self._sdk("running the graph"):
            session.run(self._popart.PyStepIO(feeds, anchors))
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
        with self._sdk("setting the random seed"):
            self._session.setRandomSeed(int(seed))
        self._pending_seed = None

    def get_info(self, name: str) -> TensorSpec:
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
        session = self._build()
        with self._sdk(f"exporting the executable to {path!r}"):
            session.compileAndExport(path)
        self.export_path = path

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
            self._detach()
        finally:
            self._device = None
            self._session = None
            self._prepared = False


__all__ = [
    "ADAPTER_OPTIONS",
    "NAME",
    "PopartSession",
    "available",
    "create_session",
    "next_power_of_two",
    "specific_decay_weights",
    "to_popart_optimizer",
]
