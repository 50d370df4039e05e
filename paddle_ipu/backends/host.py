"""The ``host`` backend: an emulated IPU on the CPU (the "IPU Model" role).

The compiled ONNX graph runs on ONNX Runtime's CPU provider.  One ``run`` executes
``batches_per_step`` steps of ``accumulation_factor`` micro-batches on each of
``replication_factor`` emulated replicas, in the device's order, and returns the
anchors in PopART's layout.  Weights live in the session between runs, in the
device's dtype (fp16 when ``enable_fp16`` is on).

Training runs the host backend's gradient program (Paddle's CPU kernels) per
micro-batch and applies the optimizer update on the session's weights; see
:mod:`paddle_ipu.backends.host_optim`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu.backends.base import AnchorReturnType, Session, SessionConfig
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.errors import BackendError, NotSupportedError
from paddle_ipu.layout import StepLayout

log = logging.getLogger("paddle_ipu.host")

# PopART session options that change results and that the host cannot emulate.
_UNSUPPORTED_OPTIONS = {
    "enableStochasticRounding": "stochastic rounding is a property of IPU hardware",
    "enableFloatingPointChecks": "floating-point exceptions are a property of IPU hardware",
    "partialsTypeMatMuls": "half-precision matmul partials cannot be emulated exactly",
    "convolutionOptions": "Poplar convolution options cannot be emulated",
    "enableHalfPartial": "half-precision partials cannot be emulated exactly",
}


def available() -> tuple[bool, str]:
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - a hard dependency
        return False, f"onnxruntime is not importable: {exc}"
    return True, f"emulated IPU on the CPU (onnxruntime {onnxruntime.__version__})"


def create_session(model: CompiledModel, config: SessionConfig) -> HostSession:
    return HostSession(model, config)


def _check_options(config: SessionConfig) -> None:
    for name, value in config.options.items():
        reason = _UNSUPPORTED_OPTIONS.get(name)
        if reason is not None and value not in (False, None, "", {}, "float", "FLOAT"):
            raise NotSupportedError(
                f"option {name}={value!r} changes results on an IPU but the host backend "
                f"cannot emulate it ({reason}); unset it, or run on the popart backend"
            )


def _to_fp16(array: np.ndarray) -> np.ndarray:
    try:
        from paddle_ipu import fp16

        return fp16.to_fp16(np.ascontiguousarray(array, dtype=np.float32))
    except ImportError:
        return array.astype(np.float16)


class HostSession(Session):
    backend = "host"

    def __init__(self, model: CompiledModel, config: SessionConfig) -> None:
        super().__init__(model, config)
        _check_options(config)
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
        self._graph: bytes | None = None
        self._ort: Any = None
        self._dirty = True
        self._trainer: Any = None
        self._seed: int | None = config.random_seed

    # -- device ---------------------------------------------------------------
    def prepare_device(self) -> None:
        import onnx

        proto = onnx.load_from_string(self.model.onnx)
        params = set(self.model.weights)
        for init in proto.graph.initializer:
            if init.name not in params:
                continue
            array = onnx.numpy_helper.to_array(init)
            device_dtype = array.dtype
            if self.config.enable_fp16 and array.dtype == np.float32:
                device_dtype = np.dtype(np.float16)
            self._weight_info[init.name] = TensorSpec(
                init.name, device_dtype.name, tuple(array.shape), self.model.weights[init.name]
            )
            self._weights[init.name] = (
                _to_fp16(array) if device_dtype == np.float16 else np.array(array, copy=True)
            )
        if self.config.enable_fp16:
            proto = self._convert_fp16(proto)
        self._graph = proto.SerializeToString()
        if self.config.is_training:
            self._trainer = self._make_trainer()
        self._dirty = True

    def _convert_fp16(self, proto: Any) -> Any:
        from onnxconverter_common import float16

        try:
            return float16.convert_float_to_float16(
                proto, keep_io_types=True, disable_shape_infer=False
            )
        except Exception as exc:  # the converter raises plain exceptions
            raise BackendError(f"converting the graph to fp16 failed: {exc}") from exc

    def _make_trainer(self) -> Any:
        raise NotSupportedError(
            "training on the host backend needs the compiled gradient program; "
            "this CompiledModel has none"
        )

    def _session(self) -> Any:
        if self._graph is None:
            raise BackendError("the host session is not prepared: call prepare_device() first")
        if self._ort is None or self._dirty:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            threads = self.config.num_threads or (os.cpu_count() or 1)
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            keep = []
            for name, array in self._weights.items():
                value = ort.OrtValue.ortvalue_from_numpy(array)
                keep.append(value)
                opts.add_initializer(name, value)
            if self._seed is not None:
                ort.set_seed(int(self._seed))
            try:
                self._ort = ort.InferenceSession(
                    self._graph, sess_options=opts, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:
                raise BackendError(
                    f"ONNX Runtime could not load the compiled graph: {exc}"
                ) from exc
            # ONNX Runtime reads the initializers' memory at load; keep them alive anyway.
            self._ort_values = keep
            self._out_names = [o.name for o in self._ort.get_outputs()]
            self._dirty = False
        return self._ort

    # -- weights --------------------------------------------------------------
    def get_info(self, name: str) -> TensorSpec:
        if name in self._weight_info:
            return self._weight_info[name]
        if self._trainer is not None:
            info = self._trainer.get_info(name)
            if info is not None:
                return info
        return super().get_info(name)

    def has_info(self, name: str) -> bool:
        try:
            self.get_info(name)
        except KeyError:
            return False
        return True

    def write_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        for name, value in weights.items():
            if self._trainer is not None and self._trainer.has_state(name):
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
            self._weights[name] = np.array(value, dtype=current.dtype, copy=True)
            if self._trainer is not None:
                self._trainer.write({name: self._weights[name]})
        self._dirty = True

    def read_weights(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        if self._trainer is not None:
            self._weights.update(
                {k: v for k, v in self._trainer.read().items() if k in self._weights}
            )
        wanted = list(self._weights) if names is None else list(names)
        out: dict[str, np.ndarray] = {}
        for name in wanted:
            if name in self._weights:
                out[name] = self._weights[name].copy()
            elif self._trainer is not None and self._trainer.has_state(name):
                out[name] = self._trainer.read([name])[name]
            else:
                raise KeyError(f"the session holds no weight named {name!r}")
        return out

    def set_random_seed(self, seed: int) -> None:
        self._seed = int(seed)
        self._dirty = True
        if self._trainer is not None:
            self._trainer.set_random_seed(self._seed)

    def update_optimizer(self, optimizer: Any) -> None:
        if self._trainer is None:
            super().update_optimizer(optimizer)
        self._trainer.update_optimizer(optimizer)

    # -- run ------------------------------------------------------------------
    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        layout = self.layout
        bps, af, rf = layout.factors()
        steps: dict[str, np.ndarray] = {}
        for spec in self.model.inputs:
            if spec.name not in inputs:
                raise BackendError(f"missing input {spec.name!r}")
            steps[spec.name] = layout.to_step_buffer(spec.name, inputs[spec.name], spec.shape)

        if self._trainer is not None:
            per_micro = self._trainer.run_steps(steps, layout)
        else:
            per_micro = self._infer(steps, bps, af, rf)
        return self._anchor_outputs(per_micro, outputs)

    def _infer(
        self, steps: Mapping[str, np.ndarray], bps: int, af: int, rf: int
    ) -> dict[str, np.ndarray]:
        sess = self._session()
        names = [spec.name for spec in self.model.outputs]
        results = {
            spec.name: np.empty((bps, af, rf, *spec.shape), dtype=spec.numpy_dtype)
            for spec in self.model.outputs
        }
        for b in range(bps):
            for a in range(af):
                for r in range(rf):
                    feed = {k: np.ascontiguousarray(v[b, a, r]) for k, v in steps.items()}
                    try:
                        outs = sess.run(names, feed)
                    except Exception as exc:
                        raise BackendError(
                            f"the emulated IPU failed to run the graph: {exc}"
                        ) from exc
                    for name, value in zip(names, outs):
                        results[name][b, a, r] = value
        return results

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
        """The host's offline artefact is the ONNX graph it runs, with its weights."""
        self.prepare_device()
        self.model_to_host(path)

    def model_to_host(self, path: str) -> None:
        import onnx

        if self._graph is None:
            raise BackendError("the host session is not prepared: call prepare_device() first")
        proto = onnx.load_from_string(self._graph)
        current = self.read_weights()
        for init in proto.graph.initializer:
            if init.name in current:
                init.CopyFrom(onnx.numpy_helper.from_array(current[init.name], init.name))
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        onnx.save(proto, path)

    def close(self) -> None:
        self._ort = None
        self._dirty = True
