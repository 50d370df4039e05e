"""The popart adapter's calls into the PopART Python API, checked against a FAKE SDK.

The ``popart`` module used here is a small stand-in defined in this file and put into
``sys.modules`` for each test only.  It records every call the adapter makes, and
implements just enough behaviour (anchor arrays in PopART's documented layout, a
weight store, shape checks on PyStepIO) to let the adapter run.  It checks the
adapter's call sequence and arguments ONLY: it is not coverage of the real SDK, and
nothing here ran on IPUs.  The tests marked ``popart`` at the end need the real SDK
and are skipped without it.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any, ClassVar

import numpy as np
import pytest

import paddle_ipu.backends as backends
import paddle_ipu.backends.popart.device as popart_device
import paddle_ipu.backends.popart.optimizer as popart_optimizer
import paddle_ipu.backends.popart.session as adapter
from paddle_ipu.backends.base import AnchorReturnType, SessionConfig
from paddle_ipu.compiler.model import CompiledModel, ShardSpec, TensorSpec
from paddle_ipu.compiler.optimizer import OptimizerConfig, ParamSlot
from paddle_ipu.errors import (
    BackendError,
    FeedError,
    NotSupportedError,
    OptionError,
    UnknownOptionError,
)

# ----------------------------------------------------------------------------- fake SDK


class FakePopartError(Exception):
    pass


class OutOfMemoryException(FakePopartError):
    pass


class FakeSDK:
    """State shared by the fake module's objects: the call log and the tensor table."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        # name -> (shape, dtype) for every tensor a session "holds"
        self.tensors: dict[str, tuple[tuple[int, ...], str]] = {}
        self.device_values: dict[str, np.ndarray] = {}
        self.acquire_failures = 0
        self.fail_prepare: Exception | None = None
        self.sessions: list[Any] = []
        self.devices: list[Any] = []

    def log(self, name: str, arg: Any = None) -> None:
        self.calls.append((name, arg))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def make_fake_popart(sdk: FakeSDK) -> types.ModuleType:
    mod = types.ModuleType("popart")

    class ReductionType(enum.Enum):
        Mean = 0
        Sum = 1
        NoReduction = 2

    class MeanReductionStrategy(enum.Enum):
        Running = 0
        Post = 1

    class VirtualGraphMode(enum.Enum):
        Off = 0
        Manual = 1
        Auto = 2

    class DataType(enum.Enum):
        UNDEFINED = 0
        FLOAT = 1
        FLOAT16 = 2

    class AdamMode(enum.Enum):
        Adam = 0
        AdamNoBias = 1
        Lamb = 2
        LambNoBias = 3
        AdaMax = 4

    class SGDAccumulatorAndMomentum(enum.Enum):
        Combined = 0
        Separate = 1

    class AdaptiveMode(enum.Enum):
        AdaGrad = 0
        RMSProp = 1
        CenteredRMSProp = 2
        AdaDelta = 3

    class WeightDecayMode(enum.Enum):
        Decay = 0
        L2Regularization = 1

    class AnchorReturnType:
        def __init__(self, kind: str, period: int | None = None) -> None:
            if (period is None) == (kind.lower() == "everyn"):
                raise FakePopartError("a return period is needed for EveryN only")
            self.kind, self.period = kind.lower(), period

    class DataFlow:
        def __init__(self, batchesPerStep: int, anchorTensors: dict[str, Any]) -> None:
            self.bps, self.anchors = batchesPerStep, dict(anchorTensors)
            sdk.log("DataFlow", self)

    class SessionOptions:
        _fields: ClassVar[dict[str, Any]] = {
            "enableReplicatedGraphs": False,
            "replicatedGraphCount": 1,
            "enableGradientAccumulation": False,
            "accumulationFactor": 1,
            "accumulationAndReplicationReductionType": ReductionType.Sum,
            "meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
            "virtualGraphMode": VirtualGraphMode.Off,
            "enableEngineCaching": False,
            "cachePath": "session_cache",
            "enableStochasticRounding": False,
            "enableDistributedReplicatedGraphs": False,
            "globalReplicationFactor": 1,
            "constantWeights": True,
        }

        def __init__(self) -> None:
            object.__setattr__(self, "values", dict(self._fields))
            sdk.log("SessionOptions", self)

        def __getattr__(self, name: str) -> Any:
            try:
                return self.values[name]
            except KeyError:
                raise AttributeError(name) from None

        def __setattr__(self, name: str, value: Any) -> None:
            if name not in self.values:
                raise AttributeError(name)
            if type(value) is not type(self.values[name]):
                raise TypeError(f"{name}: incompatible type {type(value).__name__}")
            self.values[name] = value

    class Device:
        def __init__(self, kind: str, arg: Any) -> None:
            self.kind, self.arg, self._attached = kind, arg, True
            sdk.devices.append(self)

        @property
        def isAttached(self) -> bool:
            return self._attached

        def detach(self) -> None:
            sdk.log("detach", self.kind)
            self._attached = False

    class DeviceManager:
        def acquireAvailableDevice(self, numIpus: int) -> Device | None:
            sdk.log("acquireAvailableDevice", numIpus)
            if sdk.acquire_failures:
                sdk.acquire_failures -= 1
                raise FakePopartError(f"Failed to acquire device with {numIpus} IPUs")
            return Device("ipu", numIpus)

        def createIpuModelDevice(self, opts: dict[str, str]) -> Device:
            sdk.log("createIpuModelDevice", dict(opts))
            return Device("model", opts)

        def createOfflineIPUDevice(self, opts: dict[str, str]) -> Device:
            sdk.log("createOfflineIPUDevice", dict(opts))
            return Device("offline", opts)

    class TensorInfo:
        def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
            self._shape, self._dtype = shape, dtype

        def shape(self) -> list[int]:
            return list(self._shape)

        def data_type_lcase(self) -> str:
            return self._dtype

    class PyStepIO:
        def __init__(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]):
            self.inputs, self.outputs = inputs, outputs

    class PyWeightsIO:
        def __init__(self, weights: dict[str, np.ndarray]) -> None:
            for name, arr in weights.items():
                if not arr.flags.c_contiguous:
                    raise FakePopartError(f"{name} is not c-contiguous")
            self.weights = weights

    class Optimizer:
        def __init__(self, values: dict[str, tuple[float, bool]], *args: Any, **kw: Any):
            self.values, self.args, self.kw = dict(values), args, kw
            self.specific: dict[str, dict[str, tuple[float, bool]]] = {}

        def insertSpecific(self, weight: str, values: dict[str, tuple[float, bool]]) -> None:
            self.specific[weight] = values

    class SGD(Optimizer):
        pass

    class Adam(Optimizer):
        pass

    class Adaptive(Optimizer):
        pass

    class ClipNormSettings:
        @staticmethod
        def clipAllWeights(norm: float) -> tuple[str, float]:
            return ("all", norm)

        @staticmethod
        def clipWeights(ids: list[str], norm: float) -> tuple[list[str], float]:
            return (list(ids), norm)

    class Patterns:
        def __init__(self) -> None:
            self.enabled: dict[str, bool] = {}

        def enablePattern(self, name: str, on: bool) -> None:
            self.enabled[name] = on

    class _Session:
        kind = ""

        def __init__(self, **kw: Any) -> None:
            self.kw = kw
            self.opts = kw["userOptions"]
            self.dataflow = kw["dataFlow"]
            self.prepared = False
            sdk.sessions.append(self)
            sdk.log(self.kind, kw)

        @property
        def replicationFactor(self) -> int:
            o = self.opts
            return o.replicatedGraphCount if o.enableReplicatedGraphs else 1

        @property
        def accumulationFactor(self) -> int:
            o = self.opts
            return o.accumulationFactor if o.enableGradientAccumulation else 1

        def getInfo(self, name: str) -> TensorInfo:
            if name not in sdk.tensors:
                raise FakePopartError(f"no tensor {name}")
            return TensorInfo(*sdk.tensors[name])

        def prepareDevice(self) -> None:
            sdk.log("prepareDevice")
            if sdk.fail_prepare is not None:
                raise sdk.fail_prepare
            self.prepared = True

        def compileAndExport(self, path: str) -> None:
            sdk.log("compileAndExport", path)

        def setRandomSeed(self, seed: int) -> None:
            assert self.prepared, "setRandomSeed before prepareDevice"
            sdk.log("setRandomSeed", seed)

        def writeWeights(self, io: PyWeightsIO) -> None:
            sdk.log("writeWeights", {k: (v.dtype, v.shape) for k, v in io.weights.items()})
            self._pending = {k: v.copy() for k, v in io.weights.items()}

        def weightsFromHost(self) -> None:
            assert self.prepared
            sdk.log("weightsFromHost")
            sdk.device_values.update(self._pending)

        def weightsToHost(self) -> None:
            sdk.log("weightsToHost")

        def readWeights(self, io: PyWeightsIO) -> None:
            sdk.log("readWeights", sorted(io.weights))
            for name, buf in io.weights.items():
                buf[...] = sdk.device_values.get(name, np.full(buf.shape, 7, buf.dtype))

        def initAnchorArrays(self) -> dict[str, np.ndarray]:
            # PopART's documented layout, written independently of the adapter.
            out = {}
            bps, af, rf = self.dataflow.bps, self.accumulationFactor, self.replicationFactor
            for name, art in self.dataflow.anchors.items():
                shape, dtype = sdk.tensors[name]
                if art.kind == "all":
                    lead = [bps, af, rf]
                elif art.kind == "everyn":
                    lead = [bps // art.period, af, rf]
                else:
                    lead = [rf]
                out[name] = np.empty([d for d in lead if d != 1] + list(shape), dtype)
            sdk.log("initAnchorArrays")
            return out

        def run(self, stepio: PyStepIO) -> None:
            assert self.prepared
            sdk.log(
                "run",
                {
                    "inputs": {k: (v.dtype, v.shape) for k, v in stepio.inputs.items()},
                    "outputs": {k: (v.dtype, v.shape) for k, v in stepio.outputs.items()},
                },
            )
            for i, buf in enumerate(stepio.outputs.values()):
                buf[...] = i + 1

        def modelToHost(self, path: str) -> None:
            sdk.log("modelToHost", path)

    class InferenceSession(_Session):
        kind = "InferenceSession"

        def getAllTensorIds(self) -> list[str]:
            return list(sdk.tensors)

    class TrainingSession(_Session):
        kind = "TrainingSession"

        def updateOptimizerFromHost(self, opt: Optimizer) -> None:
            sdk.log("updateOptimizerFromHost", opt)

        # PopART binds getTensorIds on TrainingSession, getAllTensorIds on InferenceSession
        def getTensorIds(self) -> list[str]:
            return list(sdk.tensors)

    for obj in (
        ReductionType, MeanReductionStrategy, VirtualGraphMode, DataType, AdamMode,
        AdaptiveMode, SGDAccumulatorAndMomentum, WeightDecayMode, AnchorReturnType, DataFlow,
        SessionOptions,
        DeviceManager, PyStepIO, PyWeightsIO, Optimizer, SGD, Adam, Adaptive,
        ClipNormSettings, Patterns, InferenceSession, TrainingSession,
    ):  # fmt: skip
        setattr(mod, obj.__name__, obj)
    mod.OutOfMemoryException = OutOfMemoryException  # type: ignore[attr-defined]
    mod.versionString = lambda: "fake-0.0"  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> FakeSDK:
    state = FakeSDK()
    monkeypatch.setitem(sys.modules, "popart", make_fake_popart(state))
    for var in ("POPLAR_IPUMODEL", "IPU_COMPILE_ONLY", "IPU_CACHE_PATH"):
        monkeypatch.delenv(var, raising=False)
    state.tensors.update(
        {
            "x": ((2, 3), "float32"),
            "ids": ((2,), "int32"),
            "y": ((2, 4), "float32"),
            "loss": ((), "float32"),
            "w": ((3, 4), "float32"),
            "b": ((4,), "float32"),
            "Accl1___w": ((3, 4), "float32"),
            "Accl2___w": ((3, 4), "float32"),
            "Step___w": ((), "float32"),
        }
    )
    return state


def model(training: bool = False, **kw: Any) -> CompiledModel:
    opt = OptimizerConfig(
        type="adam",
        params=(ParamSlot("w", weight_decay=0.01), ParamSlot("b", weight_decay=0.0)),
        lr=0.1,
        weight_decay=0.01,
        weight_decay_mode="l2_regularization",
    )
    return CompiledModel(
        onnx=b"onnx-bytes",
        inputs=[TensorSpec("x", "float32", (2, 3), "x"), TensorSpec("ids", "int32", (2,))],
        outputs=[TensorSpec("y", "float32", (2, 4), "out")]
        + ([TensorSpec("loss", "float32", ())] if training else []),
        weights={"w": "w", "b": "b"},
        micro_batch_size=2,
        loss="loss" if training else None,
        optimizer=opt if training else None,
        **kw,
    )


def feeds(bps: int = 1, af: int = 1, rf: int = 1) -> dict[str, np.ndarray]:
    lead = [d for d in (bps, af, rf) if d != 1]
    return {
        "x": np.ones([*lead, 2, 3], np.float32),
        "ids": np.zeros([*lead, 2], np.int64),  # the adapter casts to the device's int32
    }


# ----------------------------------------------------------------------------- tests


def test_available_reports_the_fake_version(sdk: FakeSDK) -> None:
    assert adapter.available() == (True, "popart fake-0.0")
    assert backends.resolve("auto") == "popart"


def test_inference_call_sequence(sdk: FakeSDK) -> None:
    cfg = SessionConfig(batches_per_step=2, extras={"device_wait_seconds": 0})
    with backends.create_session("popart", model(), cfg) as session:
        assert session.backend == "popart"
        assert sdk.calls == []  # nothing is built before prepare_device
        session.prepare_device()
        session.write_weights({"w": np.ones((3, 4), np.float32)})
        out = session.run(feeds(bps=2))
        read = session.read_weights(["w"])
    assert sdk.names() == [
        "DataFlow",
        "SessionOptions",
        "acquireAvailableDevice",
        "InferenceSession",
        "prepareDevice",
        "writeWeights",
        "weightsFromHost",
        "initAnchorArrays",
        "run",
        "weightsToHost",
        "readWeights",
        "detach",
    ]
    dataflow = sdk.calls[0][1]
    assert dataflow.bps == 2 and list(dataflow.anchors) == ["y"]
    assert dataflow.anchors["y"].kind == "all"
    kw = sdk.sessions[0].kw
    assert kw["fnModel"] == b"onnx-bytes" and kw["dataFlow"] is dataflow
    assert kw["deviceInfo"] is sdk.devices[0]
    run_args = dict(sdk.calls)["run"]
    assert run_args["inputs"] == {
        "x": (np.dtype("float32"), (2, 2, 3)),
        "ids": (np.dtype("int32"), (2, 2)),
    }
    assert out["y"].shape == (2, 2, 4) and (out["y"] == 1).all()
    np.testing.assert_array_equal(read["w"], np.ones((3, 4), np.float32))
    assert not sdk.devices[0].isAttached


def test_buffer_layout_is_bps_af_rf_not_the_seeds_reverse(sdk: FakeSDK) -> None:
    cfg = SessionConfig(
        batches_per_step=3,
        accumulation_factor=2,
        replication_factor=4,
        is_training=True,
        anchors={
            "y": AnchorReturnType("ALL"),
            "loss": AnchorReturnType("FINAL"),
        },
        extras={"device_wait_seconds": 0},
    )
    session = backends.create_session("popart", model(training=True), cfg)
    session.prepare_device()
    out = session.run(feeds(3, 2, 4))
    assert out["y"].shape == (3, 2, 4, 2, 4)  # [bps, af, rf, *shape]
    assert out["loss"].shape == (4,)  # FINAL: [rf]
    assert dict(sdk.calls)["acquireAvailableDevice"] == 4  # one IPU per replica
    with pytest.raises(FeedError, match=r"\[3, 2, 4, 2, 3\]"):
        session.run({**feeds(3, 2, 4), "x": np.ones((4, 2, 3, 2, 3), np.float32)})
    session.close()


@pytest.mark.parametrize(
    ("art", "bps", "expected"),
    [
        (AnchorReturnType("ALL"), 6, (6, 2, 4)),
        (AnchorReturnType("EVERYN", 3), 6, (2, 2, 4)),
        (AnchorReturnType("FINAL"), 6, (2, 4)),
        (AnchorReturnType("SUM"), 6, (2, 4)),
        (AnchorReturnType("ALL"), 1, (2, 4)),
    ],
)
def test_anchor_types_reach_popart_and_shape_the_buffers(
    sdk: FakeSDK, art: AnchorReturnType, bps: int, expected: tuple[int, ...]
) -> None:
    cfg = SessionConfig(batches_per_step=bps, anchors={"y": art})
    session = adapter.create_session(model(), cfg)
    session.prepare_device()
    out = session.run(feeds(bps))
    assert out["y"].shape == expected
    popart_art = dict(sdk.calls)["DataFlow"].anchors["y"]
    assert popart_art.kind == art.kind.lower()
    assert popart_art.period == (art.period if art.kind == "EVERYN" else None)


def test_everyn_period_must_divide_batches_per_step(sdk: FakeSDK) -> None:
    cfg = SessionConfig(batches_per_step=4, anchors={"y": AnchorReturnType("EVERYN", 3)})
    with pytest.raises(OptionError, match="does not divide"):
        adapter.create_session(model(), cfg)


def test_caller_output_buffers_are_filled_in_place(sdk: FakeSDK) -> None:
    session = adapter.create_session(model(), SessionConfig(batches_per_step=2))
    session.prepare_device()
    mine = {"y": np.zeros((2, 2, 4), np.float32)}
    out = session.run(feeds(2), mine)
    assert out["y"] is mine["y"] and (mine["y"] == 1).all()
    assert "initAnchorArrays" not in sdk.names()
    with pytest.raises(FeedError, match="ALL anchor needs"):
        session.run(feeds(2), {"y": np.zeros((2, 4), np.float32)})


def test_training_session_options_and_optimizer(sdk: FakeSDK) -> None:
    cfg = SessionConfig(
        batches_per_step=1,
        accumulation_factor=4,
        replication_factor=2,
        is_training=True,
        gradient_reduction="mean",
        random_seed=42,
        # IpuStrategy names; the backend spells them in PopART's
        options={"enable_stochastic_rounding": True, "virtual_graph_mode": 2},
        explicit=frozenset({"enable_stochastic_rounding", "virtual_graph_mode"}),
    )
    session = adapter.create_session(model(training=True), cfg)
    session.prepare_device()
    opts = sdk.sessions[0].opts
    assert opts.enableReplicatedGraphs is True and opts.replicatedGraphCount == 2
    assert opts.enableGradientAccumulation is True and opts.accumulationFactor == 4
    popart = sys.modules["popart"]
    assert opts.accumulationAndReplicationReductionType == popart.ReductionType.Mean
    assert opts.meanAccumulationAndReplicationReductionStrategy.name == "Post"
    assert opts.enableStochasticRounding is True
    assert opts.virtualGraphMode == popart.VirtualGraphMode.Auto
    kw = sdk.sessions[0].kw
    assert sdk.sessions[0].kind == "TrainingSession" and kw["loss"] == "loss"
    opt = kw["optimizer"]
    assert isinstance(opt, popart.Adam)
    assert opt.values["defaultLearningRate"] == (0.1, False)
    assert opt.values["defaultWeightDecay"] == (0.01, False)
    assert opt.kw["mode"] == popart.AdamMode.Adam
    assert opt.kw["weight_decay_mode"] == popart.WeightDecayMode.L2Regularization
    assert opt.specific == {"b": {"weightDecay": (0.0, False)}}
    names = sdk.names()
    assert names.index("prepareDevice") < names.index("setRandomSeed")
    assert dict(sdk.calls)["setRandomSeed"] == 42

    # eval mode / lr schedule: same specific weights, new values, non-const lr
    import dataclasses

    evaluation = dataclasses.replace(model(training=True).optimizer, lr=0.0, weight_decay=0.0)
    session.update_optimizer(evaluation)
    new = dict(sdk.calls)["updateOptimizerFromHost"]
    assert new.values["defaultLearningRate"] == (0.0, False)
    assert set(new.specific) == {"b"}
    assert sorted(session.read_weights()) == ["Accl1___w", "Accl2___w", "Step___w", "b", "w"]


def test_sum_reduction_and_bad_reduction(sdk: FakeSDK) -> None:
    cfg = SessionConfig(is_training=True, gradient_reduction="sum")
    adapter.create_session(model(training=True), cfg).prepare_device()
    popart = sys.modules["popart"]
    opts = sdk.sessions[0].opts
    assert opts.accumulationAndReplicationReductionType == popart.ReductionType.Sum
    cfg = SessionConfig(is_training=True, gradient_reduction="max")
    with pytest.raises(OptionError, match="gradient_reduction"):
        adapter.create_session(model(training=True), cfg).prepare_device()


def test_unknown_or_mistyped_option_is_refused_before_a_device_is_taken(
    sdk: FakeSDK,
) -> None:
    session = adapter.create_session(
        model(), SessionConfig(extras={"session_options": {"enableStochastic": True}})
    )
    with pytest.raises(UnknownOptionError, match="enableStochastic"):
        session.prepare_device()
    session = adapter.create_session(
        model(), SessionConfig(extras={"session_options": {"virtualGraphMode": "Sideways"}})
    )
    with pytest.raises(OptionError, match="Manual"):
        session.prepare_device()
    session = adapter.create_session(
        model(), SessionConfig(extras={"session_options": {"replicatedGraphCount": "2"}})
    )
    with pytest.raises(OptionError, match="refused"):
        session.prepare_device()
    assert "acquireAvailableDevice" not in sdk.names()


def test_ipu_count_is_rounded_up_and_acquisition_retries(
    sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(popart_device, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(popart_device, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    sdk.acquire_failures = 2
    cfg = SessionConfig(options={"num_ipus": 3}, extras={"device_wait_seconds": 10})
    session = adapter.create_session(model(), cfg)
    session.prepare_device()
    asks = [arg for name, arg in sdk.calls if name == "acquireAvailableDevice"]
    assert asks == [4, 4, 4]


def test_acquisition_gives_up_with_a_clear_error(
    sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(popart_device, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(popart_device, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    sdk.acquire_failures = 10**6
    cfg = SessionConfig(options={"num_ipus": 3}, extras={"device_wait_seconds": 5})
    session = adapter.create_session(model(), cfg)
    with pytest.raises(BackendError) as info:
        session.prepare_device()
    text = str(info.value)
    assert "could not acquire 4 IPU(s) (asked for 3" in text
    assert "Failed to acquire device with 4 IPUs" in text
    assert clock[0] == pytest.approx(5.0)
    assert "InferenceSession" not in sdk.names()


def test_ipu_model_device(sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPLAR_IPUMODEL", "1")
    shards = {"n0": ShardSpec(ipu_index=0), "n1": ShardSpec(ipu_index=1)}
    session = adapter.create_session(model(shards=shards), SessionConfig())
    session.prepare_device()
    assert dict(sdk.calls)["createIpuModelDevice"] == {
        "numIPUs": "2",
        "tilesPerIPU": "4",
        "ipuVersion": "ipu2",
    }
    popart = sys.modules["popart"]
    assert sdk.sessions[0].opts.virtualGraphMode == popart.VirtualGraphMode.Manual
    assert "acquireAvailableDevice" not in sdk.names()


def test_compile_only_exports_and_refuses_to_run(
    sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("IPU_COMPILE_ONLY", "1")
    path = str(tmp_path / "exe.popef")
    session = adapter.create_session(model(), SessionConfig(extras={"export_path": path}))
    session.prepare_device()
    session.write_weights({"w": np.ones((3, 4), np.float32)})  # no device: skipped
    assert dict(sdk.calls)["createOfflineIPUDevice"]["tilesPerIPU"] == "1472"
    assert dict(sdk.calls)["compileAndExport"] == path
    assert "prepareDevice" not in sdk.names() and "writeWeights" not in sdk.names()
    with pytest.raises(NotSupportedError, match="IPU_COMPILE_ONLY"):
        session.run(feeds())


def test_engine_cache_from_environment(
    sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    cache = tmp_path / "cache" / "nested"
    monkeypatch.setenv("IPU_CACHE_PATH", str(cache))
    adapter.create_session(model(), SessionConfig()).prepare_device()
    opts = sdk.sessions[0].opts
    assert opts.enableEngineCaching is True and opts.cachePath == str(cache)
    assert cache.is_dir()


def test_unusable_engine_cache_path_is_an_error(
    sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("IPU_CACHE_PATH", str(blocker / "cache"))
    with pytest.raises(BackendError, match="cannot be created"):
        adapter.create_session(model(), SessionConfig()).prepare_device()
    assert "acquireAvailableDevice" not in sdk.names()


def test_fp16_weights_are_converted_to_the_device_dtype(sdk: FakeSDK) -> None:
    # The device dtype decides (the fp16 pass itself is checked on the PopART double).
    sdk.tensors["w"] = ((3, 4), "float16")
    session = adapter.create_session(model(), SessionConfig())
    session.prepare_device()
    session.write_weights({"w": np.full((3, 4), 0.5, np.float32)})
    assert dict(sdk.calls)["writeWeights"] == {"w": (np.dtype("float16"), (3, 4))}
    back = session.read_weights(["w"])["w"]
    assert back.dtype == np.float16 and (back == 0.5).all()
    with pytest.raises(FeedError, match="weight 'w'"):
        session.write_weights({"w": np.ones((4, 4), np.float32)})


def test_sdk_errors_become_backend_errors_with_hints(sdk: FakeSDK) -> None:
    sdk.fail_prepare = OutOfMemoryException("tile 12 needs 700 KB")
    session = adapter.create_session(model(), SessionConfig())
    with pytest.raises(BackendError, match=r"ran out of IPU memory.*availableMemoryProportion"):
        session.prepare_device()
    session.close()
    sdk.fail_prepare = FakePopartError("bad graph")
    session = adapter.create_session(model(), SessionConfig())
    with pytest.raises(BackendError, match=r"prepareDevice.*bad graph"):
        session.prepare_device()


def test_use_before_prepare_and_inference_optimizer_are_errors(sdk: FakeSDK) -> None:
    session = adapter.create_session(model(), SessionConfig())
    with pytest.raises(BackendError, match="before prepare_device"):
        session.run(feeds())
    session.prepare_device()
    with pytest.raises(OptionError, match="not a training session"):
        session.update_optimizer(model(training=True).optimizer)
    with pytest.raises(OptionError, match="training only"):
        adapter.create_session(model(), SessionConfig(accumulation_factor=2))


def test_get_info_model_to_host_and_export(sdk: FakeSDK, tmp_path: Any) -> None:
    session = adapter.create_session(model(), SessionConfig())
    assert session.get_info("x") == TensorSpec("x", "float32", (2, 3), "x")
    assert sdk.calls == []  # known from the model: no device taken
    session.prepare_device()
    assert session.get_info("w") == TensorSpec("w", "float32", (3, 4))
    assert session.get_info("y") == TensorSpec("y", "float32", (2, 4), "out")
    session.model_to_host(str(tmp_path / "m.onnx"))
    session.compile_and_export(str(tmp_path / "m.popef"))
    assert dict(sdk.calls)["modelToHost"] == str(tmp_path / "m.onnx")
    session.close()
    session.close()  # idempotent
    assert sdk.names().count("detach") == 1


def test_distribution_uses_popdist(sdk: FakeSDK, monkeypatch: pytest.MonkeyPatch) -> None:
    popdist = types.ModuleType("popdist")
    popdist_popart = types.ModuleType("popdist.popart")
    seen: list[Any] = []
    popdist_popart.getDevice = lambda n: seen.append(("getDevice", n)) or "dist-device"  # type: ignore[attr-defined]
    popdist_popart.configureSessionOptions = lambda o: seen.append(("configure", o))  # type: ignore[attr-defined]
    popdist.popart = popdist_popart  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "popdist", popdist)
    monkeypatch.setitem(sys.modules, "popdist.popart", popdist_popart)
    shards = {"a": ShardSpec(ipu_index=0), "b": ShardSpec(ipu_index=1)}
    cfg = SessionConfig(options={"enable_distribution": True})
    session = adapter.create_session(model(shards=shards), cfg)
    session.prepare_device()
    assert seen[0] == ("configure", sdk.sessions[0].opts)
    assert seen[1] == ("getDevice", 2)
    assert sdk.sessions[0].kw["deviceInfo"] == "dist-device"


# ---------------------------------------------------------------- optimizer translation


@pytest.mark.parametrize(
    ("kind", "cls", "mode", "extra"),
    [
        ("sgd", "SGD", None, {}),
        ("momentum", "SGD", None, {"defaultMomentum": (0.9, True)}),
        ("adam", "Adam", "Adam", {"defaultBeta1": (0.9, True)}),
        ("adamw", "Adam", "Adam", {}),
        ("adamax", "Adam", "AdaMax", {}),
        ("lamb", "Adam", "Lamb", {}),
        ("adagrad", "Adaptive", "AdaGrad", {}),
        ("adadelta", "Adaptive", "AdaDelta", {"defaultAlpha": (0.95, True)}),
        ("rmsprop", "Adaptive", "RMSProp", {"defaultMomentum": (0.9, True)}),
        ("centered_rmsprop", "Adaptive", "CenteredRMSProp", {}),
    ],
)
def test_optimizer_translation(
    sdk: FakeSDK, kind: str, cls: str, mode: str | None, extra: dict[str, Any]
) -> None:
    popart = sys.modules["popart"]
    cfg = OptimizerConfig(type=kind, lr=0.5, momentum=0.9, weight_decay=0.0)
    opt = popart_optimizer.to_popart_optimizer(cfg, popart)
    assert type(opt).__name__ == cls
    assert opt.values["defaultLearningRate"] == (0.5, False)
    for key, value in extra.items():
        assert opt.values[key] == value
    if mode is not None:
        enum_type = popart.AdamMode if cls == "Adam" else popart.AdaptiveMode
        assert opt.kw["mode"] == getattr(enum_type, mode)
    if kind == "adamw":
        assert opt.kw["weight_decay_mode"] == popart.WeightDecayMode.Decay
    if cls == "Adaptive":
        assert opt.kw["rmsprop_tf_variant"] is kind.endswith("rmsprop")


def test_optimizer_clipping_and_rejections(sdk: FakeSDK) -> None:
    popart = sys.modules["popart"]
    params = (ParamSlot("w", clip=True), ParamSlot("b", clip=False))
    opt = popart_optimizer.to_popart_optimizer(
        OptimizerConfig(type="sgd", clip_norm=1.0, params=params), popart, {"w": "w_dev"}
    )
    assert opt.args[0] == [(["w_dev"], 1.0)]
    with pytest.raises(NotSupportedError, match="clipping"):
        popart_optimizer.to_popart_optimizer(OptimizerConfig(type="rmsprop", clip_norm=1.0), popart)
    with pytest.raises(NotSupportedError, match="decoupled"):
        popart_optimizer.to_popart_optimizer(
            OptimizerConfig(type="momentum", weight_decay_mode="decay"), popart
        )
    with pytest.raises(NotSupportedError, match="ftrl"):
        popart_optimizer.to_popart_optimizer(OptimizerConfig(type="ftrl"), popart)


# ---------------------------------------------------------------- real SDK only


@pytest.mark.popart
@pytest.mark.skipif(not adapter.available()[0], reason=adapter.available()[1])
def test_real_sdk_is_importable_and_reports_a_version() -> None:
    ok, text = adapter.available()
    assert ok and text.startswith("popart")
