"""The double of PopART's Python API, written line by line against graphcore/popart
(tags sdk/poplar/3.0.0 to 3.4.0).  Each behaviour names the upstream file it copies:

* python/popart/popart_core/popart.cpp (``popart.cpp``): the pybind11 bindings -- class,
  method and argument names, enum members, which fields are bound at all.
* python/popart/__init__.py.in: the import-order check, the ``engineOptions`` family.
* python/popart/python_files/session.py (``session.py``): InferenceSession and
  TrainingSession, initAnchorArrays, compileAndExport's directory handling.
* willow/include/popart/sessionoptions.hpp: field types and defaults.
* willow/src/session.cpp: getInfo/getAllTensorIds need the executable; writeWeights
  with constantWeights; compileAndExport only for IPU and offline IPU devices.
* willow/src/adam.cpp, sgd.cpp, adaptive.cpp: the optimizer keys each class accepts.
* willow/src/patterns/adamdecompose.cpp: Step___ is a 0-d float32 step count.

pybind11's conversions are imitated where the adapter depends on them: an enum field
takes only a member of its enum (never an int), a ``std::set`` field only a Python
set, a settings field only its settings object, a ``std::string`` only a str; nested
settings are handed out by reference (``def_readwrite``), containers as copies.

Numbers: an inference graph runs in ONNX Runtime, one micro-batch at a time, in
PopART's step-IO layout ``[bps, af, rf, *shape]`` (size-1 factors removed).  A
training session runs the forward graph and advances the Adam-family step counts by
one per step; it computes no gradients and leaves weights and moments alone (tests
of the update rules use the host backend against Paddle's kernels).
"""

from __future__ import annotations

import copy
import os
from typing import Any, ClassVar

import numpy as np

__version__ = "3.4.0-double"


def versionString() -> str:
    return __version__


class popart_exception(RuntimeError):
    pass


class OutOfMemoryException(popart_exception):
    pass


# --------------------------------------------------------------------------- enums


class _EnumMember:
    """A pybind11 enum value: its type is the enum (with ``__members__``), int()
    works, and it never equals an int."""

    __slots__ = ("name", "value")
    __members__: ClassVar[dict[str, Any]] = {}

    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.value == self.value  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.value))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"


def _enum(name: str, members: list[tuple[str, int]]) -> Any:
    cls = type(name, (_EnumMember,), {"__slots__": ()})
    table: dict[str, Any] = {}
    for member, value in members:
        # popart.cpp binds some C++ enumerators twice (Fwd / Forward)
        same = next((m for m in table.values() if m.value == value), None)
        obj = same if same is not None else cls(member, value)
        table[member] = obj
        setattr(cls, member, obj)
    cls.__members__ = dict(table)
    return cls


def _seq(*names: str) -> list[tuple[str, int]]:
    return [(n, i) for i, n in enumerate(names)]


# Values are the C++ enumerators' (sessionoptions.hpp); names are popart.cpp's.
RecomputationType = _enum(
    "RecomputationType",
    [("NoRecompute", 0), ("Standard", 1), ("NormOnly", 2), ("Pipeline", 3), ("RecomputeAll", 4)],
)
MergeVarUpdateType = _enum(
    "MergeVarUpdateType", [("Off", 0), ("All", 1), ("AutoLoose", 2), ("AutoTight", 3)]
)
VirtualGraphMode = _enum("VirtualGraphMode", _seq("Off", "Manual", "Auto", "ExecutionPhases"))
SyntheticDataMode = _enum(
    "SyntheticDataMode", _seq("Off", "Zeros", "RandomNormal", "RandomUniform")
)
Instrumentation = _enum("Instrumentation", _seq("Outer", "Inner"))
BatchSerializationBatchSchedule = _enum(
    "BatchSerializationBatchSchedule",
    _seq("Scheduler", "Isomorphic", "OverlapOnIo", "OverlapOnCompute"),
)
BatchSerializationTransformContext = _enum(
    "BatchSerializationTransformContext", [("Fwd", 0), ("Bwd", 1), ("Forward", 0), ("Backward", 1)]
)
BatchSerializationMethod = _enum(
    "BatchSerializationMethod", _seq("UnrollDynamic", "UnrollStatic", "Loop")
)
AccumulateOuterFragmentSchedule = _enum(
    "AccumulateOuterFragmentSchedule",
    _seq("Scheduler", "Serial", "OverlapCycleOptimized", "OverlapMemoryOptimized"),
)
SubgraphCopyingStrategy = _enum("SubgraphCopyingStrategy", _seq("OnEnterAndExit", "JustInTime"))
MeanReductionStrategy = _enum("MeanReductionStrategy", _seq("Running", "Post"))
AutodiffStitchStrategy = _enum(
    "AutodiffStitchStrategy",
    _seq("RecomputeMinimal", "RecomputeAllNonInputs", "AddFwdOutputs", "SafeAddFwdOutputs"),
)
ReductionType = _enum("ReductionType", _seq("Sum", "Mean", "NoReduction"))
TensorStorage = _enum("TensorStorage", _seq("OnChip", "OffChip"))
TileSet = _enum("TileSet", _seq("Compute", "IO"))
ReplicatedTensorSharding = _enum("ReplicatedTensorSharding", _seq("Off", "On"))
CommGroupType = _enum("CommGroupType", _seq("All", "Consecutive", "Orthogonal", "Ungrouped"))
ExecutionPhaseIOSchedule = _enum("ExecutionPhaseIOSchedule", _seq("Preload", "OnDemand"))
ExecutionPhaseSchedule = _enum(
    "ExecutionPhaseSchedule", _seq("Interleaving", "Batch", "BatchClusteredIO")
)
GradientTensorTrackingMethod = _enum(
    "GradientTensorTrackingMethod",
    _seq("AllNonViewChangingGradientTensors", "ConvAndMatmulGradients",
         "GradientsOfUserSpecifiedTensors"),
)  # fmt: skip
DataType = _enum(
    "DataType",
    _seq("UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "UINT32", "UINT64", "BOOL",
         "FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE", "COMPLEX64", "COMPLEX128", "STRING",
         "UNDEFINED"),
)  # fmt: skip
WeightDecayMode = _enum("WeightDecayMode", _seq("Decay", "L2Regularization"))
SGDAccumulatorAndMomentum = _enum("SGDAccumulatorAndMomentum", _seq("Combined", "Separate"))
AdamMode = _enum("AdamMode", _seq("Adam", "AdamNoBias", "Lamb", "LambNoBias", "AdaMax"))
AdaptiveMode = _enum("AdaptiveMode", _seq("AdaGrad", "RMSProp", "CenteredRMSProp", "AdaDelta"))
AnchorReturnTypeId = _enum("AnchorReturnTypeId", _seq("Final", "EveryN", "All", "Sum"))
DeviceType = _enum("DeviceType", _seq("IpuModel", "Cpu", "Ipu", "OfflineIpu", "Sim"))
DeviceConnectionType = _enum("DeviceConnectionType", _seq("Always", "OnDemand", "Never"))
SyncPattern = _enum("SyncPattern", _seq("Full", "SinglePipeline", "ReplicaAndLadder"))
DeviceSelectionCriterion = _enum("DeviceSelectionCriterion", _seq("First", "Random"))
ExchangeStrategy = _enum(
    "ExchangeStrategy", _seq("JustInTime", "OverlapInnerLoop", "OverlapLoops", "OverlapStep")
)


# --------------------------------------------------------------------------- bound structs


class _Bound:
    """A pybind11 class with def_readwrite fields: no new attributes, typed setters."""

    _FIELDS: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        for name, default in self._FIELDS.items():
            object.__setattr__(self, "_v_" + name, copy.deepcopy(default))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_v_") or name not in self._FIELDS:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        value = object.__getattribute__(self, "_v_" + name)
        # Containers come back as new Python objects; structs by reference.
        return copy.copy(value) if isinstance(value, (set, list, dict)) else value

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)  # the __init__.py.in properties
            return
        if name not in self._FIELDS:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        object.__setattr__(self, "_v_" + name, _cast(self._FIELDS[name], value, name))


def _incompatible(name: str, value: Any) -> TypeError:
    return TypeError(
        f"(): incompatible function arguments. The following argument types are "
        f"supported for {name}: got {type(value).__name__} {value!r}"
    )


def _cast(default: Any, value: Any, name: str) -> Any:
    """pybind11's argument conversion for a field whose default is ``default``."""
    if isinstance(default, _EnumMember):
        if type(value) is type(default):
            return value
        raise _incompatible(name, value)
    if isinstance(default, bool):
        if isinstance(value, (bool, np.bool_)) or (
            isinstance(value, int) and not isinstance(value, float)
        ):
            return bool(value)
        raise _incompatible(name, value)
    if isinstance(default, int):
        if isinstance(value, (int, np.integer)):
            if default >= 0 and name in _UNSIGNED and int(value) < 0:
                raise _incompatible(name, value)
            return int(value)
        raise _incompatible(name, value)
    if isinstance(default, float):
        if isinstance(value, (int, float, np.integer, np.floating)):
            return float(value)
        raise _incompatible(name, value)
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise _incompatible(name, value)
    if isinstance(default, set):
        if not isinstance(value, (set, frozenset)):  # pybind11 set_caster: anyset only
            raise _incompatible(name, value)
        return set(value)
    if isinstance(default, list):
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
            raise _incompatible(name, value)
        return list(value)
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise _incompatible(name, value)
        if name in _STRING_MAPS and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise _incompatible(name, value)
        return dict(value)
    if isinstance(value, type(default)):
        return value
    raise _incompatible(name, value)


_UNSIGNED = {"defaultBufferingDepth", "defaultPrefetchBufferingDepth"}
_STRING_MAPS = {
    "_engineOptions", "_convolutionOptions", "_lstmOptions", "_matmulOptions",
    "_reportOptions", "_gclOptions",
}  # fmt: skip


class CommGroup(_Bound):
    # popart._internal.ir bindings/commgroup.cpp
    _FIELDS: ClassVar[dict[str, Any]] = {"type": CommGroupType.All, "replicaGroupSize": 0}

    def __init__(self, type: Any = None, replicaGroupSize: int = 0) -> None:
        super().__init__()
        if type is not None:
            self.type = type
        self.replicaGroupSize = replicaGroupSize


class TensorLocation(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "storage": TensorStorage.OnChip,
        "loadTileSet": TileSet.Compute,
        "storageTileSet": TileSet.Compute,
        "replicatedTensorSharding": ReplicatedTensorSharding.Off,
        "shardingDomain": CommGroup(),
    }


class TensorLocationSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "location": TensorLocation(),
        "minElementsForOffChip": 2,
        "minElementsForReplicatedTensorSharding": 8192,
    }


class BatchSerializationSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "factor": 0,
        "concatOnVirtualGraphChange": True,
        "concatOnExecutionPhaseChange": True,
        "concatOnPipelineStageChange": True,
        "transformContext": BatchSerializationTransformContext.Fwd,
        "method": BatchSerializationMethod.UnrollDynamic,
        "batchSchedule": BatchSerializationBatchSchedule.Isomorphic,
    }


class ExecutionPhaseSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "phases": 0,
        "stages": 2,
        "weightIOSchedule": ExecutionPhaseIOSchedule.Preload,
        "activationIOSchedule": ExecutionPhaseIOSchedule.Preload,
        "optimizerStateIOSchedule": ExecutionPhaseIOSchedule.OnDemand,
        "accumulatorIOSchedule": ExecutionPhaseIOSchedule.Preload,
        "schedule": ExecutionPhaseSchedule.Interleaving,
    }


class AutomaticLossScalingSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "enabled": False,
        "binEdgeLocation": 0.125,
        "thresholdUpperCountProportion": 1e-7,
        "toTrackTensors": [],
        "updatePeriod": 1,
        "gradientTensorTrackingMethod": (
            GradientTensorTrackingMethod.AllNonViewChangingGradientTensors
        ),
    }


class ReplicatedCollectivesSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "prepareScheduleForMergingCollectives": False,
        "mergeAllReduceCollectives": False,
        "mergeReduceScatterCollectives": False,
        "mergeAllGatherCollectives": False,
    }


class AccumulateOuterFragmentSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {
        "schedule": AccumulateOuterFragmentSchedule.Serial,
        "excludedVirtualGraphs": [],
    }


class ExperimentalSettings(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = {"createHostTransferableTensorWithOffset": False}


class NumIOTiles:
    """Bound with ``init<>`` and ``init<int>`` only, and no implicit conversion."""

    def __init__(self, n: int = 0) -> None:
        if not isinstance(n, int):
            raise _incompatible("NumIOTiles", n)
        self.n = n


# sessionoptions.hpp (3.4.0): every field popart.cpp binds, with its default.
# Not here, because no binding exists: compilationProgressLogger,
# compilationProgressTotal, enableSerializedMatmuls, looseThresholdAtPeak,
# autodiffSettings.
_SESSION_FIELDS: dict[str, Any] = {
    "logDir": "", "dotChecks": set(), "firstDotOp": 0, "finalDotOp": 10000,
    "dotOpNames": False, "exportPoplarComputationGraph": False,
    "exportPoplarVertexGraph": False, "separateCallOpPdfs": True, "enableOutlining": True,
    "enableOutliningCopyCostPruning": True, "outlineThreshold": 1.0,
    "outlineSequenceBreakCost": 10000.0,
    "subgraphCopyingStrategy": SubgraphCopyingStrategy.OnEnterAndExit,
    "autoRecomputation": RecomputationType.NoRecompute,
    "mergeVarUpdate": MergeVarUpdateType.Off, "mergeVarUpdateMemThreshold": 1000000,
    "transitiveClosureOptimizationThreshold": 100000,
    "rearrangeAnchorsOnHost": True, "rearrangeStreamsOnHost": False,
    "enablePrefetchDatastreams": True, "defaultBufferingDepth": 1,
    "defaultPrefetchBufferingDepth": 1, "bufferingDepthMap": {},
    "prefetchBufferingDepthMap": {}, "enableNonStableSoftmax": False,
    "enableReplicatedGraphs": False, "enableGradientAccumulation": False,
    "accumulationAndReplicationReductionType": ReductionType.Sum,
    "meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
    "replicatedGraphCount": 1, "accumulationFactor": 1,
    "virtualGraphMode": VirtualGraphMode.Off, "virtualGraphSplitRatios": [],
    "enablePipelining": False, "syntheticDataMode": SyntheticDataMode.Off,
    "instrumentWithHardwareCycleCounter": False,
    "hardwareInstrumentations": {Instrumentation.Outer},
    "disableGradAccumulationTensorStreams": False,
    "disableOptimizerStateTensorStreams": False, "compileEngine": True,
    "constantWeights": True, "enableEngineCaching": False, "enableVariablesCaching": True,
    "cachePath": "session_cache", "enableFloatingPointChecks": False,
    "enableStochasticRounding": False, "_enableRngStateManagement": False,
    "enableLoadAndOffloadRNGState": False,
    "executionPhaseSettings": ExecutionPhaseSettings(),
    "accumulateOuterFragmentSettings": AccumulateOuterFragmentSettings(),
    "explicitRecomputation": False, "numIOTiles": NumIOTiles(), "aliasZeroCopy": False,
    "batchSerializationSettings": BatchSerializationSettings(), "delayVarUpdates": True,
    "scheduleNonWeightUpdateGradientConsumersEarly": False,
    "enableFullyConnectedPass": True, "partialsTypeMatMuls": "", "enableStableNorm": False,
    "experimentalSettings": ExperimentalSettings(), "customCodelets": [],
    "updatableNamedBuffers": [], "customCodeletCompileFlags": "",
    "timeLimitScheduler": 1e9, "swapLimitScheduler": 1000000000, "kahnTieBreaker": "greedy",
    "decomposeGradSum": False,
    "replicatedCollectivesSettings": ReplicatedCollectivesSettings(),
    "enableDistributedReplicatedGraphs": False, "globalReplicationFactor": 1,
    "globalReplicaOffset": 0, "groupHostSync": False, "strictOpVersions": True,
    "opxAliasChecking": False, "opxModifyChecking": False, "useHostCopyOps": False,
    "enableEfficientOverlapIOTopoCons": False,
    "activationTensorLocationSettings": TensorLocationSettings(),
    "weightTensorLocationSettings": TensorLocationSettings(),
    "optimizerStateTensorLocationSettings": TensorLocationSettings(),
    "accumulatorTensorLocationSettings": TensorLocationSettings(),
    "_tensorLocationSettingsOverride": {},
    "automaticLossScalingSettings": AutomaticLossScalingSettings(),
    "enableSupportedDataTypeCasting": True, "enableExplicitMainLoops": False,
    "groupNormStridedChannelGrouping": False, "enableMergeExchange": True,
    "ensureFp32LossScaleTensor": False, "enableInplaceAmbiguityChecking": False,
    "createImplicitPipeliningFwdOnlyProgram": False, "throwIfLog2ScaleTensorNotInRange": True,
    "enableConstantFoldingOfMultipleConsumers": True, "useLoopCandidateCreator": False,
    "stashAllTensorsInferencePipeline": False, "enableExplicitIR": False,
    "serializedPoprithmsShiftGraphsDir": "", "serializedPoprithmsAnnealGraphsDir": "",
    "_engineOptions": {}, "_convolutionOptions": {}, "_lstmOptions": {},
    "_matmulOptions": {}, "_reportOptions": {}, "_gclOptions": {},
}  # fmt: skip


class SessionOptions(_Bound):
    _FIELDS: ClassVar[dict[str, Any]] = _SESSION_FIELDS


def _options_dict(field: str) -> property:
    # popart/__init__.py.in: SessionOptions.engineOptions = property(...) over
    # the bound "_engineOptions" (a dict copy whose item assignment writes back).
    def get(self: SessionOptions) -> dict[str, str]:
        return dict(getattr(self, field))

    def put(self: SessionOptions, value: Any) -> None:
        setattr(self, field, value)

    return property(get, put)


for _public, _bound in (
    ("engineOptions", "_engineOptions"), ("convolutionOptions", "_convolutionOptions"),
    ("lstmOptions", "_lstmOptions"), ("matmulOptions", "_matmulOptions"),
    ("reportOptions", "_reportOptions"), ("gclOptions", "_gclOptions"),
):  # fmt: skip
    setattr(SessionOptions, _public, _options_dict(_bound))


# --------------------------------------------------------------------------- data flow


class AnchorReturnType:
    def __init__(
        self,
        anchorReturnTypeString: str,
        returnPeriod: int | None = None,
        tileSet: Any = None,
        exchangeStrategy: Any = None,
    ) -> None:
        key = anchorReturnTypeString.upper()
        ids = {"FINAL": AnchorReturnTypeId.Final, "EVERYN": AnchorReturnTypeId.EveryN,
               "ALL": AnchorReturnTypeId.All, "SUM": AnchorReturnTypeId.Sum}  # fmt: skip
        if key not in ids:
            raise popart_exception(f"Invalid anchor return type ID supplied: {key}")
        if (key == "EVERYN") != (returnPeriod is not None):
            raise popart_exception("A return period should only be supplied for EveryN")
        self._id, self._rp = ids[key], returnPeriod or 0

    def id(self) -> Any:
        return self._id

    def rp(self) -> int:
        return self._rp


class DataFlow:
    def __init__(self, batchesPerStep: int, anchorTensors: dict[str, AnchorReturnType]) -> None:
        if not isinstance(batchesPerStep, int) or not isinstance(anchorTensors, dict):
            raise _incompatible("DataFlow", anchorTensors)
        self._bps, self._anchors = batchesPerStep, dict(anchorTensors)

    def batchesPerStep(self) -> int:
        return self._bps

    def anchors(self) -> list[str]:
        return list(self._anchors)

    def art(self, anchor: str) -> AnchorReturnType:
        return self._anchors[anchor]


class InputShapeInfo:
    pass


# --------------------------------------------------------------------------- devices


class DeviceInfo:
    def __init__(self, kind: Any, num_ipus: int, tiles: int) -> None:
        self.type, self.numIpus, self.tilesPerIPU = kind, num_ipus, tiles
        self._attached = kind == DeviceType.Ipu

    @property
    def isAttached(self) -> bool:
        return self._attached

    def detach(self) -> None:
        self._attached = False

    def attach(self) -> bool:
        self._attached = True
        return True


def _device_dict(opts: Any) -> dict[str, str]:
    # popart.cpp getDictionary: every value is cast to std::string.
    if not isinstance(opts, dict) or not all(isinstance(v, str) for v in opts.values()):
        raise _incompatible("opts", opts)
    return dict(opts)


class DeviceManager:
    #: IPUs the double pretends are free (none: acquireAvailableDevice throws).
    free_ipus: ClassVar[int] = 0

    def acquireAvailableDevice(
        self,
        numIpus: int = 1,
        tilesPerIpu: int = 0,
        pattern: Any = None,
        connectionType: Any = None,
        selectionCriterion: Any = None,
    ) -> DeviceInfo:
        # devicemanager.cpp: throws when no device of that size can be attached.
        if numIpus > DeviceManager.free_ipus or numIpus & (numIpus - 1):
            raise popart_exception(f"Failed to acquire device with {numIpus} IPUs")
        return DeviceInfo(DeviceType.Ipu, numIpus, tilesPerIpu or 1472)

    def createIpuModelDevice(self, opts: dict[str, str]) -> DeviceInfo:
        o = _device_dict(opts)
        return DeviceInfo(DeviceType.IpuModel, int(o.get("numIPUs", "1")),
                          int(o.get("tilesPerIPU", "1216")))  # fmt: skip

    def createOfflineIPUDevice(self, opts: dict[str, str]) -> DeviceInfo:
        o = _device_dict(opts)
        return DeviceInfo(DeviceType.OfflineIpu, int(o.get("numIPUs", "1")),
                          int(o.get("tilesPerIPU", "1472")))  # fmt: skip

    def createCpuDevice(self) -> DeviceInfo:
        return DeviceInfo(DeviceType.Cpu, 1, 1)


# --------------------------------------------------------------------------- IO


def _contiguous(arrays: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            raise popart_exception(
                f"{what} is unable to use the numpy array for tensor '{name}' as it is "
                "not c-contiguous"
            )
    return arrays


class PyStepIO:
    def __init__(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        self.inputs = _contiguous(dict(inputs), "PyStepIO")
        self.outputs = _contiguous(dict(outputs), "PyStepIO")


class PyWeightsIO:
    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = _contiguous(dict(weights), "PyWeightsIO")


class Patterns:
    def __init__(self, *args: Any) -> None:
        self.enabled: dict[str, bool] = {}

    def enablePattern(self, pattern: str, enable: bool) -> None:
        if not isinstance(pattern, str) or not isinstance(enable, bool):
            raise _incompatible("enablePattern", pattern)
        self.enabled[pattern] = enable

    def isPatternEnabled(self, pattern: str) -> bool:
        return self.enabled.get(pattern, False)


# --------------------------------------------------------------------------- optimizers


def _values(pyd: Any, allowed: tuple[str, ...], kind: str) -> dict[str, tuple[float, bool]]:
    if not isinstance(pyd, dict):
        raise _incompatible(kind, pyd)
    out = {}
    for key, value in pyd.items():
        if key not in allowed:
            raise popart_exception(
                f"Invalid {kind} key, {key}, the allowed keys are ( {' '.join(allowed)} )"
            )
        if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], bool)):
            raise popart_exception(f"{kind} value for {key} must be a (float, bool) pair")
        out[key] = (float(value[0]), value[1])
    return out


def _check_enum(value: Any, enum: type, name: str) -> Any:
    if not isinstance(value, enum):
        raise _incompatible(name, value)
    return value


class ClipNormSettings:
    def __init__(self, weightIds: list[str], maxNorm: float) -> None:
        self.weightIds, self.maxNorm = list(weightIds), float(maxNorm)

    @staticmethod
    def clipWeights(weightIds: list[str], maxNorm: float) -> ClipNormSettings:
        return ClipNormSettings(weightIds, maxNorm)

    @staticmethod
    def clipAllWeights(maxNorm: float) -> ClipNormSettings:
        return ClipNormSettings([], maxNorm)


class Optimizer:
    _KEYS: ClassVar[tuple[str, ...]] = ()
    _SPECIFIC: ClassVar[tuple[str, ...]] = ()

    def _init(self, values: Any, clip: Any) -> None:
        self.values = _values(values, self._KEYS, type(self).__name__)
        if not isinstance(clip, list) or not all(isinstance(c, ClipNormSettings) for c in clip):
            raise _incompatible("clip_norm_settings", clip)
        self.clip = clip
        self.specific: dict[str, dict[str, tuple[float, bool]]] = {}

    def insertSpecific(self, id: str, pyd: dict[str, tuple[float, bool]]) -> None:
        self.specific[id] = _values(pyd, self._SPECIFIC, type(self).__name__ + " specific")


class SGD(Optimizer):
    # willow/src/sgd.cpp getComplete / getSpecificNames
    _KEYS = ("defaultLearningRate", "defaultWeightDecay", "defaultMomentum",
             "defaultDampening", "defaultVelocityScaling", "lossScaling", "nesterov")  # fmt: skip
    _SPECIFIC = ("learningRate", "weightDecay", "momentum", "dampening", "velocityScaling",
                 "nesterov")  # fmt: skip

    def __init__(
        self,
        pyd: Any,
        clip_norm_settings: Any = None,
        accumulatorAndMomentum: Any = SGDAccumulatorAndMomentum.Combined,
        accumType: Any = DataType.UNDEFINED,
        accl1Type: Any = DataType.UNDEFINED,
        debugContext: str = "sgd",
    ) -> None:
        self._init(pyd, [] if clip_norm_settings is None else clip_norm_settings)
        self.accumulatorAndMomentum = _check_enum(
            accumulatorAndMomentum, SGDAccumulatorAndMomentum, "accumulatorAndMomentum"
        )
        self.accl1Type = _check_enum(accl1Type, DataType, "accl1Type")
        _check_enum(accumType, DataType, "accumType")


class Adam(Optimizer):
    # willow/src/adam.cpp getComplete ("maxWeightNorm" is a deprecated alias)
    _KEYS = ("defaultLearningRate", "defaultWeightDecay", "defaultBeta1", "defaultBeta2",
             "defaultEps", "lossScaling", "defaultMaxWeightNorm", "maxWeightNorm")  # fmt: skip
    _SPECIFIC = ("learningRate", "weightDecay", "beta1", "beta2", "eps", "maxWeightNorm")

    def __init__(
        self,
        values: Any,
        mode: Any = AdamMode.Adam,
        weight_decay_mode: Any = WeightDecayMode.Decay,
        accum_type: Any = DataType.UNDEFINED,
        accl1_type: Any = DataType.FLOAT,
        accl2_type: Any = DataType.FLOAT,
        clip_norm_settings: Any = None,
        scaled_optimizer_state: bool = False,
        debugContext: str = "adam",
    ) -> None:
        self._init(values, [] if clip_norm_settings is None else clip_norm_settings)
        self.mode = _check_enum(mode, AdamMode, "mode")
        self.weight_decay_mode = _check_enum(weight_decay_mode, WeightDecayMode, "wd mode")
        for t in (accum_type, accl1_type, accl2_type):
            _check_enum(t, DataType, "accl type")
        if not isinstance(scaled_optimizer_state, bool):
            raise _incompatible("scaled_optimizer_state", scaled_optimizer_state)
        self.scaled_optimizer_state = scaled_optimizer_state
        # adam.hpp getUnsetMaxWeightNorm: {10.0f, true}
        self.max_weight_norm = self.values.get(
            "defaultMaxWeightNorm", self.values.get("maxWeightNorm", (10.0, True))
        )[0]


class Adaptive(Optimizer):
    # willow/src/adaptive.cpp getComplete
    _KEYS = ("defaultLearningRate", "defaultWeightDecay", "defaultAlpha", "defaultMomentum",
             "defaultEps", "lossScaling")  # fmt: skip
    _SPECIFIC = ("learningRate", "weightDecay", "alpha", "momentum", "eps")

    def __init__(
        self,
        values: Any,
        mode: Any = AdaptiveMode.RMSProp,
        weight_decay_mode: Any = WeightDecayMode.Decay,
        accum_type: Any = DataType.UNDEFINED,
        accl1_type: Any = DataType.FLOAT,
        accl2_type: Any = DataType.FLOAT,
        accl3_type: Any = DataType.UNDEFINED,
        rmsprop_tf_variant: bool = False,
        debugContext: str = "adaptive",
    ) -> None:
        self._init(values, [])
        self.mode = _check_enum(mode, AdaptiveMode, "mode")
        self.weight_decay_mode = _check_enum(weight_decay_mode, WeightDecayMode, "wd mode")
        self.rmsprop_tf_variant = bool(rmsprop_tf_variant)


# --------------------------------------------------------------------------- sessions


class _TensorInfo:
    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._shape, self._dtype = list(shape), np.dtype(dtype)

    def shape(self) -> list[int]:
        return list(self._shape)

    def data_type_lcase(self) -> str:
        return self._dtype.name


def _makedirs_and_check_writable(path: str) -> None:
    # session.py makedirsAndCheckWritable: os.makedirs("") raises FileNotFoundError.
    os.makedirs(path, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise OSError(f"Unable to write to {path}")


# ------------------------------------------------------- PopART's built-in operators

#: ai.graphcore operators the double runs (written from PopART's sources, below)
_GRAPHCORE_OPS = ("Detach", "Nll")


def _check_builtins(proto: Any) -> None:
    """The checks of PopART's op creators and setup() for the ai.graphcore operators the
    double knows (willow/src/op/nll.cpp: ``reduction`` a String of Sum/Mean/None
    (loss.cpp reductionTypeFromString), ``ignoreIndex`` and ``inputIsLogProbability``
    Int; NllOp::setup: the label's shape is the probabilities' without the last
    dimension), and no creator for any other operator of an unknown domain."""
    from onnx import AttributeProto, shape_inference

    inferred = shape_inference.infer_shapes(proto)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
        if v.type.tensor_type.HasField("shape")
    }
    for node in proto.graph.node:
        if node.domain in ("", "ai.onnx"):
            continue
        if node.domain != "ai.graphcore" or node.op_type not in _GRAPHCORE_OPS:
            raise popart_exception(
                f"No definition found for {node.domain}:{node.op_type}:1 (a custom op must "
                "be registered with PopART before the session is made)"
            )
        if node.op_type != "Nll":
            continue
        attrs = {a.name: a for a in node.attribute}
        red = attrs.get("reduction")
        if red is None or red.type != AttributeProto.STRING:
            raise popart_exception(f"Nll {node.name}: attribute reduction is not a String")
        if red.s.decode() not in ("Sum", "Mean", "None"):
            raise popart_exception(
                f"Unexpected ReductionType string, {red.s.decode()}. Cannot convert to "
                "ReductionType"
            )
        for key in ("ignoreIndex", "inputIsLogProbability"):
            if key in attrs and attrs[key].type != AttributeProto.INT:
                raise popart_exception(f"Nll {node.name}: attribute {key} is not an Int")
        probs, label = (shapes.get(n) for n in node.input[:2])
        if probs is not None and label is not None and label != probs[:-1]:
            raise popart_exception(
                f"The label tensor ({label}) must have shape {probs[:-1]} to match all but "
                f"the final dimension of the probabilities tensor ({probs}) in Op Nll"
            )


def _lower_builtins(proto: Any) -> None:
    """ONNX Runtime has no ai.graphcore operators: each is replaced by ONNX operators
    computing what PopART's Opx computes (willow/src/popx/op/detachx.cpp: a copy;
    nllx.cpp: the probability at the label, ``-log(max(p, eps))`` with eps 1e-7 (6.104e-5
    for float16) unless inputIsLogProbability, ignored labels masked, Sum, Mean over
    the labels not ignored (at least one) or None)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    for node in proto.graph.node:
        if node.domain != "ai.graphcore":
            nodes.append(node)
            continue
        if node.op_type == "Detach":
            nodes.append(helper.make_node("Identity", [node.input[0]], [node.output[0]]))
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        p, label, out = node.input[0], node.input[1], node.output[0]
        t = f"{node.name or out}.nll"

        def const(name: str, value: Any, dtype: Any) -> str:
            proto.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), name))
            return name

        nodes += [
            helper.make_node("Cast", [label], [f"{t}.l64"], to=TensorProto.INT64),
            helper.make_node(
                "Unsqueeze", [f"{t}.l64", const(f"{t}.ax", [-1], np.int64)], [f"{t}.idx0"]
            ),
        ]
        idx = f"{t}.idx0"
        ignore = attrs.get("ignoreIndex")
        if ignore is not None:
            nodes += [
                helper.make_node(
                    "Equal", [f"{t}.l64", const(f"{t}.ign", ignore, np.int64)], [f"{t}.ignored"]
                ),
                helper.make_node("Not", [f"{t}.ignored"], [f"{t}.keep"]),
                helper.make_node("Cast", [f"{t}.keep"], [f"{t}.mask"], to=TensorProto.FLOAT),
                helper.make_node(
                    "Max", [f"{t}.idx0", const(f"{t}.zero", 0, np.int64)], [f"{t}.idx"]
                ),
            ]
            idx = f"{t}.idx"
        nodes += [
            helper.make_node("GatherElements", [p, idx], [f"{t}.g"], axis=-1),
            helper.make_node(
                "Squeeze", [f"{t}.g", const(f"{t}.ax2", [-1], np.int64)], [f"{t}.picked"]
            ),
        ]
        picked = f"{t}.picked"
        if not attrs.get("inputIsLogProbability", 0):
            nodes += [
                helper.make_node(
                    "Max", [picked, const(f"{t}.eps", 1e-7, np.float32)], [f"{t}.clamped"]
                ),
                helper.make_node("Log", [f"{t}.clamped"], [f"{t}.log"]),
            ]
            picked = f"{t}.log"
        nodes.append(helper.make_node("Neg", [picked], [f"{t}.loss"]))
        loss = f"{t}.loss"
        if ignore is not None:
            nodes.append(helper.make_node("Mul", [loss, f"{t}.mask"], [f"{t}.masked"]))
            loss = f"{t}.masked"
        reduction = attrs["reduction"].decode()
        if reduction == "None":
            nodes.append(helper.make_node("Identity", [loss], [out]))
        elif reduction == "Sum" or ignore is None:
            op = "ReduceSum" if reduction == "Sum" else "ReduceMean"
            nodes.append(helper.make_node(op, [loss], [out], keepdims=0))
        else:
            nodes += [
                helper.make_node("ReduceSum", [loss], [f"{t}.sum"], keepdims=0),
                helper.make_node("ReduceSum", [f"{t}.mask"], [f"{t}.count"], keepdims=0),
                helper.make_node(
                    "Max", [f"{t}.count", const(f"{t}.one", 1.0, np.float32)], [f"{t}.n"]
                ),
                helper.make_node("Div", [f"{t}.sum", f"{t}.n"], [out]),
            ]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    kept = [o for o in proto.opset_import if o.domain != "ai.graphcore"]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)


def _check_gru(node: Any) -> None:
    """willow/src/op/gru.cpp's op creator and definition, popx/op/grux.cpp's grow: no
    ``activations`` (nor their alpha, beta) or ``clip``, ``linear_before_reset`` 0 only,
    the direction ``forward`` or ``backward`` (ONNX's ``reverse`` reaches neither branch
    of grow, ``bidirectional`` raises); ``sequence_lens`` is ignored with a warning --
    the double drops it before its ONNX Runtime run, as PopART computes without it."""
    attrs = {a.name: a for a in node.attribute}
    for name in ("activations", "activation_alpha", "activation_beta", "clip"):
        if name in attrs:
            raise popart_exception(f"GRUOp attribute `{name}' is not supported")
    if "linear_before_reset" in attrs and attrs["linear_before_reset"].i != 0:
        raise popart_exception("GRUOp attribute `linear_before_reset' must be 0")
    direction = attrs["direction"].s.decode() if "direction" in attrs else "forward"
    if direction not in ("forward", "backward"):
        raise popart_exception(f"GRU direction {direction!r} is not implemented")
    if len(node.input) > 4 and node.input[4]:
        node.input[4] = ""  # "Gru optional input `sequence_lens' will be ignored"


def _check_loops(proto: Any) -> None:
    """willow/src/op/loop.cpp, the Loop's op creator: every input id of the node is
    looked up as a tensor (``tensors.get``, an empty trip count included), and
    ``LoopOp::connectInTensor`` reads the trip count's data through the graph (a
    constant; Constant nodes are folded into tensors with data when the graph is
    imported).  The loop then runs as a ``Repeat`` of that many iterations, each
    skipped once the condition is false (popx/op/loopx.cpp) -- as ONNX Runtime runs a
    Loop given both."""
    import onnx

    def graphs(graph: Any) -> Any:
        yield graph
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(attr.g)

    for graph in graphs(proto.graph):
        constants = {i.name for i in graph.initializer}
        constants |= {n.output[0] for n in graph.node if n.op_type == "Constant"}
        for node in graph.node:
            if node.op_type == "GRU":
                _check_gru(node)
            if node.op_type != "Loop":
                continue
            trip = node.input[0] if node.input else ""
            if not trip:
                raise popart_exception("No Ir::Tensor with TensorId '' in Tensors::get(..)")
            if trip not in constants:
                raise popart_exception(
                    f"Could not work out tensor data for {trip}: the trip count of a Loop "
                    "must be a constant"
                )


class _Session:
    _training = False

    def __init__(
        self,
        fnModel: bytes,
        dataFlow: DataFlow,
        deviceInfo: DeviceInfo,
        patterns: Any,
        userOptions: SessionOptions,
    ) -> None:
        import onnx

        if not isinstance(dataFlow, DataFlow) or not isinstance(deviceInfo, DeviceInfo):
            raise _incompatible("session", dataFlow)
        if not isinstance(userOptions, SessionOptions):
            raise _incompatible("userOptions", userOptions)
        self._proto = onnx.load_from_string(fnModel)
        _check_loops(self._proto)  # and the GRUs (_check_gru)
        self._flow, self._device, self._opts = dataFlow, deviceInfo, copy.deepcopy(userOptions)
        self._patterns = patterns if patterns is not None else Patterns()
        self._executable = False
        self._weights: dict[str, np.ndarray] = {}  # device values
        self._host: dict[str, np.ndarray] = {}  # host-side copies (weightsToHost)
        self._infos: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self._ort: Any = None
        self._seed: int | None = None
        self.runs = 0

    # session.py properties
    @property
    def dataFlow(self) -> DataFlow:
        return self._flow

    @property
    def replicationFactor(self) -> int:
        o = self._opts
        return o.replicatedGraphCount if o.enableReplicatedGraphs else 1

    @property
    def accumulationFactor(self) -> int:
        o = self._opts
        return o.accumulationFactor if o.enableGradientAccumulation else 1

    def _state_tensors(self, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}

    def prepareDevice(self, loadEngine: bool = True, err: Any = None) -> None:
        import onnx
        from onnx import numpy_helper, shape_inference

        if self._executable:
            # A second prepare (compileAndExport after prepareDevice) keeps the
            # weights: writeWeights reset the IR tensors' data (devicex.cpp
            # Devicex::writeWeights), which lowering does not undo.
            return

        self._read_node_settings()
        _check_builtins(self._proto)
        proto = shape_inference.infer_shapes(self._proto)
        weights = {i.name: numpy_helper.to_array(i).copy() for i in proto.graph.initializer}
        for name, arr in weights.items():
            self._infos[name] = (tuple(arr.shape), arr.dtype)
        for value in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
            t = value.type.tensor_type
            dims = tuple(int(d.dim_value) for d in t.shape.dim)
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
            self._infos.setdefault(value.name, (dims, dtype))
        state = self._state_tensors(weights)
        for name, arr in state.items():
            self._infos[name] = (tuple(arr.shape), arr.dtype)
        self._weights = {**weights, **state}
        self._host = {k: v.copy() for k, v in self._weights.items()}
        self._executable = True

    def _read_node_settings(self) -> None:
        """What PopART's op creators read from node attributes, with their checks:
        willow/src/op/matmul.cpp (``__serialize_matmul_mode`` one of the four modes,
        then ``__serialize_matmul_factor`` and ``__serialize_matmul_precision`` as Int;
        ``__available_memory`` as Float) and willow/src/op/convbase.cpp
        (``__available_memory`` as Float or Floats).  ``node_settings``: node output ->
        what was read, for the tests."""
        from onnx import AttributeProto

        self.node_settings: dict[str, dict[str, Any]] = {}
        for node in self._proto.graph.node:
            attrs = {a.name: a for a in node.attribute}
            read: dict[str, Any] = {}
            amp = attrs.get("__available_memory")
            if amp is not None and node.op_type in ("MatMul", "Conv", "ConvTranspose"):
                kinds = (AttributeProto.FLOAT,)
                if node.op_type != "MatMul":
                    kinds = (AttributeProto.FLOAT, AttributeProto.FLOATS)
                if amp.type not in kinds:
                    raise popart_exception(
                        f"Attribute __available_memory of {node.name} is not a float"
                    )
                read["availableMemoryProportion"] = (
                    amp.f if amp.type == AttributeProto.FLOAT else list(amp.floats)
                )
            mode = attrs.get("__serialize_matmul_mode")
            if mode is not None and node.op_type == "MatMul":
                text = mode.s.decode()
                if text not in ("none", "input_channels", "reducing_dim", "output_channels"):
                    raise popart_exception(f"Unsupport matmul serialisation mode {text}")
                for key in ("__serialize_matmul_factor", "__serialize_matmul_precision"):
                    attr = attrs.get(key)
                    if attr is None or attr.type != AttributeProto.INT:
                        raise popart_exception(f"Attribute {key} of {node.name} is not an Int")
                read["serialise"] = (
                    text,
                    attrs["__serialize_matmul_factor"].i,
                    bool(attrs["__serialize_matmul_precision"].i),
                )
            if read:
                self.node_settings[node.output[0]] = read

    def _assert_executable(self) -> None:
        # session.cpp assertExecutableLoaded
        if not self._executable:
            raise popart_exception(
                "There is no executatable. Try calling Session::prepareDevice first."
            )

    def getInfo(self, id: str) -> _TensorInfo:
        self._assert_executable()
        if id not in self._infos:
            raise popart_exception(f"No Ir::Tensor with TensorId '{id}' in Ir::getTensor(..)")
        return _TensorInfo(*self._infos[id])

    def _all_ids(self) -> list[str]:
        self._assert_executable()
        return list(self._infos)

    def initAnchorArrays(self) -> dict[str, np.ndarray]:
        # session.py _initAnchorArrays
        arrays = {}
        for anchor in self._flow.anchors():
            info = self.getInfo(anchor)
            bps, art = self._flow.batchesPerStep(), self._flow.art(anchor)
            shape = [self.replicationFactor]
            if art.id() == AnchorReturnTypeId.All:
                shape = [bps, self.accumulationFactor, *shape]
            elif art.id() == AnchorReturnTypeId.EveryN:
                if bps % art.rp():
                    raise RuntimeError("Invalid anchor period, is not divisble by batchesPerStep")
                shape = [bps // art.rp(), self.accumulationFactor, *shape]
            shape = [d for d in shape if d != 1] + info.shape()
            arrays[anchor] = np.empty(shape, dtype=info.data_type_lcase())
        return arrays

    def writeWeights(self, weightsIo: PyWeightsIO) -> None:
        self._assert_executable()
        # willow/src/session.cpp (3.1+)
        if self._opts.constantWeights and not self._training:
            raise popart_exception(
                "Cannot call writeWeights when constantWeights is set. Set "
                "`constantWeights` to False in the `SessionOption`s when initialising the "
                "session to enable this behaviour."
            )
        for name, arr in weightsIo.weights.items():
            if name not in self._host:
                continue  # Devicex::writeWeights visits the executable's weights only
            shape, dtype = self._infos[name]
            if tuple(arr.shape) != shape or arr.dtype != dtype:
                raise popart_exception(
                    f"weight {name}: the array is {arr.dtype}{list(arr.shape)}, the tensor "
                    f"is {dtype}{list(shape)}"
                )
            self._host[name] = arr.copy()

    def weightsFromHost(self) -> None:
        self._assert_executable()
        self._weights = {k: v.copy() for k, v in self._host.items()}

    def weightsToHost(self) -> None:
        self._assert_executable()
        self._host = {k: v.copy() for k, v in self._weights.items()}

    def readWeights(self, weightsIo: PyWeightsIO) -> None:
        self._assert_executable()
        for name, buf in weightsIo.weights.items():
            if name not in self._host:
                raise popart_exception(f"No tensor {name} in the executable's weights")
            shape, dtype = self._infos[name]
            if tuple(buf.shape) != shape or buf.dtype != dtype:
                raise popart_exception(f"readWeights {name}: wrong buffer {buf.dtype}{buf.shape}")
            buf[...] = self._host[name]

    def setRandomSeed(self, seedValue: int) -> None:
        self._assert_executable()
        self._seed = int(seedValue)

    def _forward(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime as ort
        from onnx import numpy_helper

        if self._ort is None:
            from onnx import helper

            # Initializers listed as graph inputs too: ORT then takes the device's
            # current values for them on every call.
            proto = copy.deepcopy(self._proto)
            _lower_builtins(proto)
            listed = {i.name for i in proto.graph.input}
            for init in proto.graph.initializer:
                if init.name not in listed:
                    arr = numpy_helper.to_array(init)
                    proto.graph.input.append(
                        helper.make_tensor_value_info(init.name, init.data_type, arr.shape)
                    )
            if proto.ir_version < 4:
                proto.ir_version = 4
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.log_severity_level = 3  # the "initializer in graph inputs" notice
            self._ort = ort.InferenceSession(
                proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        graph_inputs = {i.name for i in self._ort.get_inputs()} | {
            i.name for i in self._ort.get_overridable_initializers()
        }
        names = [o.name for o in self._ort.get_outputs()]
        # initializers ORT exposes as overridable inputs carry the device's values
        weights = {k: v for k, v in self._weights.items() if k in graph_inputs}
        return dict(zip(names, self._ort.run(names, {**feeds, **weights}), strict=True))

    def run(self, stepio: PyStepIO, debugName: str = "") -> None:
        self._assert_executable()
        if self._device.type not in (DeviceType.Ipu, DeviceType.IpuModel):
            raise popart_exception("Cannot run on a device of this type")
        bps, af, rf = self._flow.batchesPerStep(), self.accumulationFactor, self.replicationFactor
        lead = [d for d in (bps, af, rf) if d != 1]
        steps: dict[str, np.ndarray] = {}
        for name, arr in stepio.inputs.items():
            shape, dtype = self._infos[name]
            if list(arr.shape) != lead + list(shape) or arr.dtype != dtype:
                raise popart_exception(
                    f"Unexpected number of input elements for {name}: expected "
                    f"{dtype}{lead + list(shape)}, got {arr.dtype}{list(arr.shape)}"
                )
            steps[name] = arr.reshape(bps, af, rf, *shape)
        results: dict[str, np.ndarray] = {}
        for b in range(bps):
            for a in range(af):
                for r in range(rf):
                    out = self._forward({k: v[b, a, r] for k, v in steps.items()})
                    for name in self._flow.anchors():
                        results.setdefault(
                            name, np.empty((bps, af, rf, *out[name].shape), out[name].dtype)
                        )
                        results[name][b, a, r] = out[name]
            self._after_step()
        for name, buf in stepio.outputs.items():
            art, full = self._flow.art(name), results[name]
            if art.id() == AnchorReturnTypeId.All:
                value = full
            elif art.id() == AnchorReturnTypeId.EveryN:
                value = full[art.rp() - 1 :: art.rp()]
            elif art.id() == AnchorReturnTypeId.Final:
                value = full[-1, -1]
            else:  # Sum over the steps (and micro-batches), per replica
                value = full.sum(axis=(0, 1))
            buf[...] = value.reshape(buf.shape)
        self.runs += 1

    def _after_step(self) -> None:
        pass

    def modelToHost(self, fn: str) -> None:
        import onnx
        from onnx import numpy_helper

        self._assert_executable()
        proto = copy.deepcopy(self._proto)
        for init in proto.graph.initializer:
            if init.name in self._weights:
                init.CopyFrom(numpy_helper.from_array(self._weights[init.name], init.name))
        onnx.save(proto, fn)

    def compileAndExport(self, filename: str, err: Any = None) -> None:
        # session.py: make the directory (of the file), then the C++ side
        filename = os.path.expanduser(filename)
        if os.path.isdir(filename):
            _makedirs_and_check_writable(filename)
        else:
            _makedirs_and_check_writable(os.path.dirname(filename))
        # session.cpp assertDeviceCanCompileOffline
        if self._device.type not in (DeviceType.Ipu, DeviceType.OfflineIpu):
            raise popart_exception(
                f"Executables for device type {self._device.type.name} cannot be saved"
            )
        self.prepareDevice(loadEngine=False)
        with open(filename, "wb") as fh:
            fh.write(self._popef_bytes())

    def _popef_bytes(self) -> bytes:
        """The double's stand-in for a PopEF file (read by tests/contract/
        popart_double/model_runtime): a header line, a JSON line with the main
        program's stream anchors, then the ONNX model whose initializers hold the
        weights' host data -- what writeWeights set (devicex.cpp), which
        executablexserializer.cpp writes as the executable's tensor data."""
        import json

        from onnx import numpy_helper

        proto = copy.deepcopy(self._proto)
        for init in proto.graph.initializer:
            if init.name in self._host:
                init.CopyFrom(numpy_helper.from_array(self._host[init.name], init.name))
        inits = {i.name for i in proto.graph.initializer}

        def anchor(name: str) -> dict[str, Any]:
            shape, dtype = self._infos[name]
            return {"name": name, "shape": list(shape), "dtype": np.dtype(dtype).name}

        meta = {
            "inputs": [anchor(i.name) for i in proto.graph.input if i.name not in inits],
            "outputs": [anchor(name) for name in self._flow.anchors()],
            "batchesPerStep": self._flow.batchesPerStep(),
            "replicationFactor": self.replicationFactor,
        }
        return b"POPEF-double\n" + json.dumps(meta).encode() + b"\n" + proto.SerializeToString()


class InferenceSession(_Session):
    def __init__(
        self,
        fnModel: bytes,
        dataFlow: DataFlow,
        deviceInfo: DeviceInfo,
        inputShapeInfo: Any = None,
        patterns: Any = None,
        userOptions: Any = None,
        name: str = "inference",
    ) -> None:
        super().__init__(fnModel, dataFlow, deviceInfo, patterns,
                         userOptions if userOptions is not None else SessionOptions())  # fmt: skip

    def getAllTensorIds(self) -> list[str]:
        return self._all_ids()


class TrainingSession(_Session):
    _training = True

    def __init__(
        self,
        fnModel: bytes,
        dataFlow: DataFlow,
        loss: str,
        optimizer: Optimizer,
        deviceInfo: DeviceInfo,
        inputShapeInfo: Any = None,
        patterns: Any = None,
        userOptions: Any = None,
        name: str = "training",
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise _incompatible("optimizer", optimizer)
        super().__init__(fnModel, dataFlow, deviceInfo, patterns,
                         userOptions if userOptions is not None else SessionOptions())  # fmt: skip
        self.loss, self.optimizer = loss, optimizer

    def getTensorIds(self) -> list[str]:
        return self._all_ids()

    def _state_tensors(self, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        opt, state = self.optimizer, {}
        for name, w in weights.items():
            if not np.issubdtype(w.dtype, np.floating):
                continue
            if isinstance(opt, Adam):
                # adamdecompose.cpp: Step___ (0-d float32) for Adam, Lamb and AdaMax
                if opt.mode in (AdamMode.Adam, AdamMode.Lamb, AdamMode.AdaMax):
                    state["Step___" + name] = np.zeros((), np.float32)
                state["Accl1___" + name] = np.zeros_like(w, np.float32)
                state["Accl2___" + name] = np.zeros_like(w, np.float32)
            elif isinstance(opt, SGD) and "defaultMomentum" in opt.values:
                prefix = (
                    "Accl1___"
                    if opt.accumulatorAndMomentum == SGDAccumulatorAndMomentum.Separate
                    else "Accl___"
                )
                state[prefix + name] = np.zeros_like(w)
        return state

    def _after_step(self) -> None:
        for name in self._weights:
            if name.startswith("Step___"):
                self._weights[name] = self._weights[name] + np.float32(1)

    def updateOptimizerFromHost(self, optimizer: Optimizer) -> None:
        if type(optimizer) is not type(self.optimizer):
            raise popart_exception("updateOptimizerFromHost: the optimizer type changed")
        if set(optimizer.specific) != set(self.optimizer.specific):
            raise popart_exception("updateOptimizerFromHost: the specific weights changed")
        self.optimizer = optimizer


__all__ = [name for name in list(globals()) if not name.startswith("_") or name in (
    "__version__",)]  # fmt: skip
