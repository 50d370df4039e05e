"""A double of the Poplar SDK's ``model_runtime`` Python module, for tests.

Only the high-level API the popart adapter's PopEF path calls, each behaviour from
the source it was read in:

* open-mmlab/mmdeploy, mmdeploy/backend/ipu/wrapper.py (``wrapper.py``): an IPU
  backend written with Graphcore -- ``ModelRunnerConfig()`` with a
  ``device_wait_config`` of ``DeviceWaitConfig(DeviceWaitStrategy.WAIT_WITH_TIMEOUT,
  timeout=timedelta, sleepTime=timedelta)``; ``ModelRunner(popef_file, config=...)``
  (also given ``PopefPaths(popef_file)``); ``getExecuteInputs()`` /
  ``getExecuteOutputs()`` returning descriptions with ``name``, ``shape`` (a list the
  caller may change) and ``data_type``; ``InputMemoryView()`` filled with
  ``view[name] = ndarray``; ``executeAsync(view)`` whose result has ``wait()`` and is
  indexed by output name, giving a buffer ``numpy.frombuffer`` reads; ``execute(view)``
  giving the same result at once.
* docs.graphcore.ai/projects/model-runtime/en/latest/model_runner.html (the model
  runtime guide, "Using ModelRunner"): execute() blocks until the result is there,
  executeAsync() returns a future; input memory must stay valid until the result is
  returned (the view holds the caller's arrays, it does not copy them); destroying the
  ModelRunner stops the model and unloads it from the IPU.

Numbers: the PopEF file is the PopART double's stand-in (popart/_core.py
``_popef_bytes``): its ONNX model, with the weights it was exported with, runs in
ONNX Runtime, one micro-batch per request.  Executables of several micro-batches per
step (batches per step, replicas) are not modelled: how the real runner feeds them is
not confirmed, so the double refuses them.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, ClassVar

import numpy as np
import popef

#: What the double was asked to do, in order (tests read it).
events: list[str] = []


class DeviceWaitStrategy:
    # wrapper.py uses WAIT_WITH_TIMEOUT; the other members were not checked.
    WAIT_WITH_TIMEOUT = "WAIT_WITH_TIMEOUT"


class DeviceWaitConfig:
    def __init__(
        self,
        strategy: Any = DeviceWaitStrategy.WAIT_WITH_TIMEOUT,
        timeout: timedelta = timedelta(0),
        sleepTime: timedelta = timedelta(0),
    ) -> None:
        if not isinstance(timeout, timedelta) or not isinstance(sleepTime, timedelta):
            raise TypeError("DeviceWaitConfig(): timeout and sleepTime are timedelta values")
        self.strategy, self.timeout, self.sleepTime = strategy, timeout, sleepTime


class ModelRunnerConfig:
    __slots__ = ("device_wait_config",)

    def __init__(self) -> None:
        self.device_wait_config = DeviceWaitConfig()


class PopefPaths(list):  # type: ignore[type-arg]
    """The PopEF files of one model (wrapper.py builds it from one path)."""

    def __init__(self, *paths: str) -> None:
        super().__init__(str(p) for p in paths)


class DataDesc:
    """A tensor description: ``name``, ``shape``, ``data_type`` (wrapper.py) and
    ``size_in_bytes`` (mmdeploy's C++ IPU backend reads it)."""

    def __init__(self, name: str, shape: list[int], dtype: str) -> None:
        self.name = name
        self._shape = list(shape)
        self.data_type = popef.DataType(dtype)
        self.size_in_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    @property
    def shape(self) -> list[int]:
        return list(self._shape)  # a new list each time: wrapper.py changes it

    def __repr__(self) -> str:
        return f"DataDesc(name={self.name!r}, shape={self._shape}, data_type={self.data_type})"


class InputMemoryView(dict):  # type: ignore[type-arg]
    """Input name -> the caller's array (held, never copied)."""

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
            raise TypeError(f"InputMemoryView[{name!r}]: expected a C-contiguous numpy array")
        super().__setitem__(name, value)


class _Result:
    """executeAsync's result: wait(), then one buffer per output name."""

    def __init__(self, outputs: dict[str, bytearray]) -> None:
        self._outputs = outputs
        self._done = False

    def wait(self) -> None:
        self._done = True

    def __getitem__(self, name: str) -> memoryview:
        if not self._done:
            raise RuntimeError("the result was read before wait()")
        return memoryview(self._outputs[name])

    def keys(self) -> list[str]:
        return list(self._outputs)


class ModelRunner:
    #: runners not yet destroyed (the guide: destruction unloads the model)
    live: ClassVar[int] = 0

    def __init__(self, popef_paths: Any, config: ModelRunnerConfig | None = None) -> None:
        import onnx
        import onnxruntime as ort

        paths = list(popef_paths) if isinstance(popef_paths, PopefPaths) else [popef_paths]
        if len(paths) != 1 or not isinstance(paths[0], str):
            raise TypeError("ModelRunner(): expected a PopEF path")
        if config is not None and not isinstance(config, ModelRunnerConfig):
            raise TypeError("ModelRunner(): config must be a ModelRunnerConfig")
        with open(paths[0], "rb") as fh:
            header, meta_line, model = fh.read().split(b"\n", 2)
        if header != b"POPEF-double":
            raise RuntimeError(f"{paths[0]} is not a PopEF file")
        meta = json.loads(meta_line)
        if meta["batchesPerStep"] != 1 or meta["replicationFactor"] != 1:
            raise RuntimeError(
                "the model_runtime double does not model executables of several "
                "micro-batches per step"
            )
        self._inputs = [DataDesc(a["name"], a["shape"], a["dtype"]) for a in meta["inputs"]]
        self._outputs = [DataDesc(a["name"], a["shape"], a["dtype"]) for a in meta["outputs"]]
        proto = onnx.load_from_string(model)
        if proto.ir_version < 4:
            proto.ir_version = 4
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self._ort = ort.InferenceSession(
            proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        self.path = paths[0]
        events.append("ModelRunner")
        ModelRunner.live += 1
        self._alive = True

    def __del__(self) -> None:
        if getattr(self, "_alive", False):
            self._alive = False
            ModelRunner.live -= 1
            events.append("~ModelRunner")

    def getExecuteInputs(self) -> list[DataDesc]:
        return list(self._inputs)

    def getExecuteOutputs(self) -> list[DataDesc]:
        return list(self._outputs)

    def _run(self, view: InputMemoryView) -> dict[str, bytearray]:
        if not isinstance(view, InputMemoryView):
            raise TypeError("execute(): expected an InputMemoryView")
        feeds = {}
        for desc in self._inputs:
            if desc.name not in view:
                raise RuntimeError(f"input {desc.name!r} is missing from the InputMemoryView")
            array = view[desc.name]
            if array.nbytes != desc.size_in_bytes:
                raise RuntimeError(
                    f"input {desc.name!r}: {array.nbytes} bytes given, {desc.size_in_bytes} "
                    "expected"
                )
            dtype = popef.popefTypeToNumpyDType(desc.data_type)
            feeds[desc.name] = np.frombuffer(array.tobytes(), dtype=dtype).reshape(desc.shape)
        names = [d.name for d in self._outputs]
        values = self._ort.run(names, feeds)
        out = {}
        for desc, value in zip(self._outputs, values):
            dtype = popef.popefTypeToNumpyDType(desc.data_type)
            out[desc.name] = bytearray(np.ascontiguousarray(value, dtype=dtype).tobytes())
        return out

    def execute(self, view: InputMemoryView) -> _Result:
        events.append("execute")
        result = _Result(self._run(view))
        result.wait()
        return result

    def executeAsync(self, view: InputMemoryView) -> _Result:
        events.append("executeAsync")
        return _Result(self._run(view))


__all__ = [
    "DataDesc",
    "DeviceWaitConfig",
    "DeviceWaitStrategy",
    "InputMemoryView",
    "ModelRunner",
    "ModelRunnerConfig",
    "PopefPaths",
    "events",
]
