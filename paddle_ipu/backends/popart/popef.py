"""Serving a PopART inference session through the Poplar SDK's model runtime.

With ``enable_model_runtime_executor`` on an inference graph, the ``popart`` session
exports its executable as a PopEF file (``InferenceSession.compileAndExport``),
releases its device, and runs every step through ``model_runtime.ModelRunner`` over
that file instead of ``session.run(PyStepIO)``: the role of ``PreparePopefSession``
and ``RunPopef`` in Paddle 2.x's executor, which used the C++ API of the same library.

Only calls found in use or documented are made (docs/backends.md lists each with its
source):

* ``model_runtime.ModelRunnerConfig()`` and its ``device_wait_config``, a
  ``model_runtime.DeviceWaitConfig(model_runtime.DeviceWaitStrategy.WAIT_WITH_TIMEOUT,
  timeout=timedelta, sleepTime=timedelta)``;
* ``model_runtime.ModelRunner(popef_path, config=config)``;
* ``runner.getExecuteInputs()`` / ``getExecuteOutputs()``: descriptions with ``name``,
  ``shape`` and ``data_type``; ``popef.popefTypeToNumpyDType(data_type)``;
* ``model_runtime.InputMemoryView()``, filled as ``view[name] = array``;
* ``runner.executeAsync(view)``, whose result is waited for (``wait()``) and indexed by
  output name, giving a buffer read with ``numpy.frombuffer``.

The ModelRunner is released by dropping it: the model runtime guide says destroying the
instance stops the model and unloads it from the IPU; no close method was found.

Not confirmed, so refused: how a ModelRunner feeds an executable compiled with
``batches_per_step > 1`` or replicas (one ``execute`` per micro-batch, or one per step of
every micro-batch), so the PopEF path takes ``batches_per_step == 1`` and one replica.

This path has not run on an SDK or IPU; it is tested against a double of the two
modules (tests/contract/popart_double).
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from paddle_ipu._util.env import env_flag
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.backends.layout import buffer_error
from paddle_ipu.errors import (
    BackendError,
    BackendUnavailableError,
    IpuError,
    NotSupportedError,
    OptionError,
)

#: The SDK modules the PopEF path imports, in the order they are imported.
MODULES = ("model_runtime", "popef")


def import_runtime() -> tuple[Any, Any]:
    """``(model_runtime, popef)``; BackendUnavailableError naming the module that
    cannot be imported (the Poplar SDK's Python packages, enabled with its
    enable.sh)."""
    found: list[Any] = []
    for name in MODULES:
        try:
            found.append(importlib.import_module(name))
        except ImportError as exc:
            raise BackendUnavailableError(
                f"enable_model_runtime_executor on the popart backend serves the graph "
                f"through the Poplar SDK's {name!r} Python module, which cannot be imported "
                f"here ({exc}); enable the SDK's model runtime, or set "
                f"enable_model_runtime_executor=False to run through PopART's session"
            ) from exc
    return found[0], found[1]


@contextmanager
def _sdk(what: str) -> Iterator[None]:
    """Model runtime exceptions as BackendError, naming what was being done."""
    try:
        yield
    except IpuError:
        raise
    except Exception as exc:
        raise BackendError(
            f"model_runtime failed while {what}: {type(exc).__name__}: {exc or type(exc).__name__}"
        ) from exc


@dataclass(frozen=True)
class TensorDesc:
    """One input or output of the executable, as the ModelRunner describes it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


class PopefRunner:
    """A ModelRunner over one PopEF file, running one micro-batch per call.

    Args:
        path: the PopEF file (``compileAndExport``'s output).
        inputs, outputs: the graph's input and anchor names mapped to the shape and
            dtype PopART's session gives them (``getInfo``); the executable's own
            descriptions must agree, or BackendError names the difference.
        device_wait_s: how long the runner waits for a free IPU.
        modules: ``(model_runtime, popef)`` already imported.
    """

    def __init__(
        self,
        path: str,
        inputs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        *,
        device_wait_s: float = 30.0,
        modules: tuple[Any, Any] | None = None,
    ) -> None:
        self._mr, self._popef = modules if modules is not None else import_runtime()
        self.path = path
        mr = self._mr
        wait = max(0.0, float(device_wait_s))
        with _sdk(f"loading {path!r} (ModelRunner)"):
            config = mr.ModelRunnerConfig()
            config.device_wait_config = mr.DeviceWaitConfig(
                mr.DeviceWaitStrategy.WAIT_WITH_TIMEOUT,
                timeout=timedelta(seconds=wait),
                sleepTime=timedelta(seconds=min(1.0, wait)),
            )
            self._runner: Any = mr.ModelRunner(path, config=config)
            self.inputs = [self._desc(d) for d in self._runner.getExecuteInputs()]
            self.outputs = [self._desc(d) for d in self._runner.getExecuteOutputs()]
        self._check(inputs, outputs)

    def _desc(self, desc: Any) -> TensorDesc:
        dtype = np.dtype(self._popef.popefTypeToNumpyDType(desc.data_type))
        return TensorDesc(str(desc.name), tuple(int(d) for d in desc.shape), dtype)

    def _check(
        self,
        inputs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    ) -> None:
        have_in = {d.name: d for d in self.inputs}
        have_out = {d.name: d for d in self.outputs}
        extra = sorted(set(have_in) - set(inputs))
        missing = sorted(set(inputs) - set(have_in))
        if extra or missing:
            raise BackendError(
                f"the PopEF executable {self.path!r} takes the inputs {sorted(have_in)}, the "
                f"graph feeds {sorted(inputs)}: how model_runtime fills inputs the graph does "
                "not feed is not confirmed, so the PopEF path refuses it"
            )
        missing = sorted(set(outputs) - set(have_out))
        if missing:
            raise BackendError(
                f"the PopEF executable {self.path!r} has no output {', '.join(missing)} "
                f"(it returns {sorted(have_out)})"
            )
        for kind, want, have in (("input", inputs, have_in), ("output", outputs, have_out)):
            for name, (shape, dtype) in want.items():
                desc = have[name]
                if desc.shape != tuple(shape) or desc.dtype != np.dtype(dtype):
                    raise BackendError(
                        f"{kind} {name!r}: the PopEF executable has {desc.dtype}"
                        f"{list(desc.shape)}, PopART's session {np.dtype(dtype)}{list(shape)}"
                    )
        self._wanted_outputs = [have_out[name] for name in outputs]

    @property
    def closed(self) -> bool:
        return self._runner is None

    def execute(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one micro-batch: ``feeds`` maps every input name to an array of its
        described shape (converted to the described dtype, as PopART's step IO
        does); returns new arrays, one per graph output."""
        runner = self._runner
        if runner is None:
            raise BackendError(f"the ModelRunner over {self.path!r} is closed")
        # The input arrays must stay alive until the result is back (the runtime
        # reads them in place): ``kept`` holds them.
        kept: list[np.ndarray] = []
        with _sdk("preparing the inputs (InputMemoryView)"):
            view = self._mr.InputMemoryView()
            for desc in self.inputs:
                array = np.ascontiguousarray(feeds[desc.name], dtype=desc.dtype)
                if array.shape != desc.shape:
                    raise buffer_error(
                        f"input {desc.name!r} is {list(array.shape)}; the PopEF executable "
                        f"takes {list(desc.shape)}"
                    )
                kept.append(array)
                view[desc.name] = array
        with _sdk(f"running {self.path!r} (executeAsync)"):
            result = runner.executeAsync(view)
            result.wait()
            out = {
                desc.name: np.frombuffer(result[desc.name], dtype=desc.dtype)
                .reshape(desc.shape)
                .copy()
                for desc in self._wanted_outputs
            }
        del kept
        return out

    def close(self) -> None:
        """Release the runner (and with it the IPU): dropping the last reference
        destroys it."""
        self._runner = None


TensorInfos = Mapping[str, tuple[tuple[int, ...], np.dtype]]


class PopefServing:
    """A popart session's PopEF path: the checks at prepare time, the export, the
    ModelRunner over it, and the files it leaves.

    The session calls :meth:`check` at prepare time, :meth:`runner` at each run (it
    exports and loads at the first run after the weights were written, as Paddle 2.x's
    PreparePopefSession did), :meth:`drop_runner` when new weights make the export
    stale, and :meth:`close` when it closes.

    Args:
        extras: the popart backend's own settings (``popef_path``,
            ``device_wait_seconds``).
    """

    def __init__(self, extras: Mapping[str, Any], device_wait_s: float) -> None:
        self._extras = extras
        self._device_wait_s = device_wait_s
        self._modules: tuple[Any, Any] | None = None
        self._runner: PopefRunner | None = None
        self._dir: str | None = None  # a temporary directory this path made
        #: the PopEF file the runner serves (None before the first export)
        self.path: str | None = None
        #: PopART's device was detached for model_runtime: no device call after this
        self.exported = False

    def check(self, config: SessionConfig) -> None:
        """At prepare time, before a device is taken: the SDK modules import, and the
        session is one the PopEF path can serve."""
        bps = config.batches_per_step
        rf = max(1, config.replication_factor)
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
        self._modules = import_runtime()

    def _target(self) -> str:
        asked = self._extras.get("popef_path")
        if asked:
            return str(asked)
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="paddle-ipu-popef-")
        return os.path.join(self._dir, "model.popef")

    def runner(
        self,
        export: Callable[[str], str],
        detach: Callable[[], None],
        inputs: TensorInfos,
        outputs: TensorInfos,
    ) -> PopefRunner:
        """The ModelRunner, made at the first call after the weights were written:
        ``export(path)`` (returning the file written), ``detach()`` PopART's device
        so the runner can take the IPU, then load the PopEF file.  ``inputs`` and
        ``outputs`` are the shapes and dtypes PopART's session gives them."""
        runner = self._runner
        if runner is not None:
            return runner
        self.path = export(self._target())
        self.exported = True
        detach()
        runner = PopefRunner(
            self.path,
            inputs,
            outputs,
            device_wait_s=self._device_wait_s,
            modules=self._modules,
        )
        self._runner = runner
        return runner

    def refuse_after_export(self, what: str) -> None:
        """NotSupportedError for a device call once the device was given up."""
        if self.exported:
            raise NotSupportedError(
                f"{what}: the graph runs through model_runtime over a PopEF export and "
                "PopART's device is detached; no device call is made after the export"
            )

    def drop_runner(self) -> None:
        """Release the runner (the next :meth:`runner` exports again)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()

    def close(self) -> None:
        """Release the runner and remove the temporary export."""
        try:
            self.drop_runner()
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


__all__ = ["MODULES", "PopefRunner", "PopefServing", "TensorDesc", "import_runtime"]
