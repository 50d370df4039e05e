"""Pipelines: one served model made of steps (Triton's ensembles, in spirit).

A pipeline's steps are *model steps* -- models of the repository (or of a mapping
given in-process), called through their runtimes' ``submit``, so that each model
batches a pipeline's rows with every other request's -- and *host steps*: Python
callables for pre- and post-processing.  Tensors flow between steps by name, in the
process: no client round trip.  A pipeline is a dynamic model
(a :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"handler"``): ``inputs`` /
``outputs`` (specs), ``submit(feed)`` (a future of ``{output name: array}``), and
``run(feed)``.

Its definition (``config.json``'s ``"pipeline"`` key in a model repository, or the
same dictionary given to :func:`parse_pipeline`)::

    {"inputs":  [{"name": "image", "datatype": "BYTES", "dims": [1]}],
     "outputs": [{"name": "text", "datatype": "BYTES", "dims": [-1]}],
     "host_workers": 4,
     "steps": [
        {"name": "prepare", "function": "mymodule:prepare",
         "inputs": {"image": "image"}, "outputs": {"x": "det_input"}},
        {"name": "det", "model": "ocr_det", "version": "1",
         "inputs": {"x": "det_input"}, "outputs": {"sigmoid_0.tmp_0": "det_map"}},
        {"name": "cls", "model": "ocr_cls", "each": true,
         "inputs": {"x": "cls_batches"}, "outputs": {"softmax_0.tmp_0": "cls_probs"}},
        ...]}

- ``inputs`` / ``outputs``: the pipeline's tensors: a KServe v2 ``datatype`` and
  ``dims`` (-1: any size); every input is required.
- a step is a model step (``model``, optional ``version``: the newest served one
  without) or a host step (``function``: ``"module:function"``, a module importable
  from the repository's directory -- ``DIR/module.py`` -- or installed).  ``inputs``
  maps the step's own names (a model's input, a function's keyword argument) to the
  pipeline's tensors; ``outputs`` maps the step's own names (a model's output, a key
  of the dict the function returns) to new pipeline tensors.
- ``each`` (model steps): the step's inputs are lists of arrays; the model gets one
  request per element (all submitted at once) and the step's outputs are lists; an
  empty list submits nothing.
- a tensor is produced once (by a pipeline input or one step) and read only after:
  the steps run in their order.  Between host steps a tensor may be any Python value.
- ``host_workers``: the threads that run host steps (default 4).

A bad definition is refused when the model loads, with an :class:`OptionError`
naming the key (``pipeline.steps[2].inputs``).  A request missing an input, or with
a wrong datatype or shape, gets a :class:`FeedError` naming the input.  A step that
fails fails its request only, with a :class:`PipelineStepError` naming the pipeline,
the step and the cause (a :class:`PipelineInputError`, also a ValueError, when the
step's own exception was a ValueError: the request's fault, answered 400 when served).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu import _core
from paddle_ipu.errors import (
    OptionError,
    PipelineInputError,
    PipelineStepError,
    RuntimeClosedError,
)
from paddle_ipu.executor import feeds
from paddle_ipu.serving.runtime import Answers, Runtime, RuntimeKind, RuntimeStats, TensorSpec

__all__ = ["Pipeline", "PipelineConfig", "Step", "parse_pipeline"]

#: numpy dtypes of the KServe v2 datatypes (BYTES: object arrays of bytes)
_V2_TO_NUMPY = {v2: np.dtype(numpy) for v2, numpy, _ in _core.kserve_datatypes()}
_V2_TO_NUMPY["BYTES"] = np.dtype(object)

#: a model step's runtime, found by (model name, version; "" the newest)
ModelLookup = Callable[[str, str], Any]


@dataclass(frozen=True)
class Step:
    """One step: ``kind`` is "model" (``target`` a model name) or "host" (``target``
    "module:function"); ``inputs`` / ``outputs`` map the step's names to the
    pipeline's tensors."""

    name: str
    kind: str
    target: str
    version: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    each: bool = False


@dataclass(frozen=True)
class PipelineConfig:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[Step, ...]
    host_workers: int = 4


def _fail(where: str, key: str, message: str) -> OptionError:
    return OptionError(f"{where}: {key!r} {message}")


def _tensors(where: str, key: str, value: Any) -> list[TensorSpec]:
    if not isinstance(value, list) or not value:
        raise _fail(where, key, f"must be a non-empty list of tensors, got {value!r}")
    specs = []
    for i, doc in enumerate(value):
        k = f"{key}[{i}]"
        if not isinstance(doc, dict) or not {"name", "datatype", "dims"} <= set(doc):
            raise _fail(where, k, f"must be {{'name', 'datatype', 'dims'}}, got {doc!r}")
        extra = sorted(set(doc) - {"name", "datatype", "dims"})
        if extra:
            raise _fail(where, k, f"has unknown keys {extra}")
        name, datatype, dims = doc["name"], doc["datatype"], doc["dims"]
        if not isinstance(name, str) or not name:
            raise _fail(where, f"{k}.name", f"must be a non-empty string, got {name!r}")
        if datatype not in _V2_TO_NUMPY:
            raise _fail(
                where, f"{k}.datatype", f"must be one of {sorted(_V2_TO_NUMPY)}, got {datatype!r}"
            )
        if not isinstance(dims, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in dims
        ):
            raise _fail(where, f"{k}.dims", f"must be a list of sizes (-1: any), got {dims!r}")
        specs.append(TensorSpec(name, datatype, tuple(dims)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise _fail(where, key, f"names a tensor twice: {names}")
    return specs


def _mapping(where: str, key: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
    ):
        raise _fail(where, key, f"must map names to tensor names (strings), got {value!r}")
    return tuple(value.items())


def parse_pipeline(doc: Any, where: str = "pipeline") -> PipelineConfig:
    """A pipeline's definition checked (see the module docstring); ``where`` names its
    file in the errors."""
    if not isinstance(doc, dict):
        raise _fail(where, "pipeline", f"must be a JSON object, got {doc!r}")
    unknown = sorted(set(doc) - {"inputs", "outputs", "steps", "host_workers"})
    if unknown:
        raise _fail(
            where,
            "pipeline",
            f"has unknown keys {unknown}: the keys are "
            "['inputs', 'outputs', 'steps', 'host_workers']",
        )
    for key in ("inputs", "outputs", "steps"):
        if key not in doc:
            raise _fail(where, f"pipeline.{key}", "is missing")
    inputs = _tensors(where, "pipeline.inputs", doc["inputs"])
    outputs = _tensors(where, "pipeline.outputs", doc["outputs"])
    workers = doc.get("host_workers", 4)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise _fail(where, "pipeline.host_workers", f"must be an integer >= 1, got {workers!r}")
    steps_doc = doc["steps"]
    if not isinstance(steps_doc, list) or not steps_doc:
        raise _fail(
            where, "pipeline.steps", f"must be a non-empty list of steps, got {steps_doc!r}"
        )
    produced = {s.name: "pipeline.inputs" for s in inputs}
    steps: list[Step] = []
    for i, sd in enumerate(steps_doc):
        key = f"pipeline.steps[{i}]"
        if not isinstance(sd, dict):
            raise _fail(where, key, f"must be a JSON object, got {sd!r}")
        extra = sorted(
            set(sd) - {"name", "model", "version", "function", "each", "inputs", "outputs"}
        )
        if extra:
            raise _fail(where, key, f"has unknown keys {extra}")
        name = sd.get("name", f"step{i}")
        if not isinstance(name, str) or not name or name in {s.name for s in steps}:
            raise _fail(where, f"{key}.name", f"must be a unique non-empty string, got {name!r}")
        if ("model" in sd) == ("function" in sd):
            raise _fail(where, key, "must name either a 'model' or a host 'function'")
        if "model" in sd:
            kind, target = "model", sd["model"]
            if not isinstance(target, str) or not target or "/" in target:
                raise _fail(where, f"{key}.model", f"must be a model's name, got {target!r}")
        else:
            kind, target = "host", sd["function"]
            if not isinstance(target, str) or target.count(":") != 1 or target.startswith(":"):
                raise _fail(where, f"{key}.function", f"must be 'module:function', got {target!r}")
            for k in ("version", "each"):
                if k in sd:
                    raise _fail(where, f"{key}.{k}", "is for model steps only")
        version = sd.get("version", "")
        if isinstance(version, int) and not isinstance(version, bool) and version > 0:
            version = str(version)
        if not isinstance(version, str) or (version and not version.isdigit()):
            raise _fail(where, f"{key}.version", f"must be a positive integer, got {version!r}")
        each = sd.get("each", False)
        if not isinstance(each, bool):
            raise _fail(where, f"{key}.each", f"must be true or false, got {each!r}")
        ins = _mapping(where, f"{key}.inputs", sd.get("inputs"))
        outs = _mapping(where, f"{key}.outputs", sd.get("outputs"))
        for _, tensor in ins:
            if tensor not in produced:
                raise _fail(
                    where,
                    f"{key}.inputs",
                    f"reads tensor {tensor!r}, which no pipeline input or earlier step "
                    f"produces (produced so far: {sorted(produced)})",
                )
        for _, tensor in outs:
            if tensor in produced:
                raise _fail(
                    where,
                    f"{key}.outputs",
                    f"produces tensor {tensor!r}, which {produced[tensor]} produces already",
                )
            produced[tensor] = key
        steps.append(Step(name, kind, target, version, ins, outs, each))
    for spec in outputs:
        if spec.name not in produced:
            raise _fail(where, "pipeline.outputs", f"names {spec.name!r}, which no step produces")
    return PipelineConfig(tuple(inputs), tuple(outputs), tuple(steps), workers)


def load_function(target: str, search: Path | None = None) -> Callable[..., Any]:
    """``"module:function"``: from ``search/module.py`` when that file exists (the
    module's dots are directories), else an installed module."""
    module_name, _, attr = target.partition(":")
    module: Any = None
    if search is not None:
        path = search.joinpath(*module_name.split(".")).with_suffix(".py")
        if path.is_file():
            unique = f"paddle_ipu_pipeline_{abs(hash(str(path.resolve())))}_{module_name}"
            module = sys.modules.get(unique)
            if module is None:
                spec = importlib.util.spec_from_file_location(unique, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[unique] = module
    if module is None:
        module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise OptionError(
            f"host function {target!r}: module {module_name!r} has no function {attr!r}"
        )
    return fn


class _Request:
    """One request's tensors and where it is in the steps."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.future: Future[dict[str, np.ndarray]] = Future()
        self.pending: list[Future[Any]] = []  # the model requests of the current step


class Pipeline(Runtime):
    """A dynamic model running the steps of ``config`` (see the module docstring): a
    :class:`~paddle_ipu.serving.runtime.Runtime` of kind ``"handler"``.

    Args:
        config: a :class:`PipelineConfig` (:func:`parse_pipeline`) or its dictionary.
        models: the model steps' runtimes: a mapping of model name to runtime, or a
            function ``(name, version) -> runtime`` (version "" for the newest).
        name: the pipeline's name in errors.
        search: where host steps' modules are looked for first (the repository).
        owned: runtimes closed with the pipeline.
    """

    kind: RuntimeKind = "handler"

    def __init__(
        self,
        config: PipelineConfig | Mapping[str, Any],
        models: Mapping[str, Any] | ModelLookup,
        *,
        name: str = "pipeline",
        search: Path | None = None,
        owned: Sequence[Any] = (),
    ) -> None:
        self.config = config if isinstance(config, PipelineConfig) else parse_pipeline(config)
        self.name = name
        if isinstance(models, Mapping):
            table = dict(models)

            def lookup(model: str, version: str) -> Any:
                if model not in table:
                    raise OptionError(f"model {model!r} is not given (given: {sorted(table)})")
                return table[model]

            self._lookup: ModelLookup = lookup
        else:
            self._lookup = models
        self._functions = {
            s.name: load_function(s.target, search) for s in self.config.steps if s.kind == "host"
        }
        self._owned = list(owned)
        self._pool = ThreadPoolExecutor(
            self.config.host_workers, thread_name_prefix=f"paddle-ipu-pipeline-{name}"
        )
        self._names: dict[int, tuple[Any, list[str]]] = {}
        self._closed = False
        self._in_flight = 0
        self._idle = threading.Condition()
        self._answers = Answers()

    @property
    def inputs(self) -> Sequence[TensorSpec]:
        return self.config.inputs

    @property
    def outputs(self) -> Sequence[TensorSpec]:
        return self.config.outputs

    # -- requests ---------------------------------------------------------------------
    def _check(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        declared = [
            (s.name, s.datatype, _V2_TO_NUMPY[s.datatype], s.dims) for s in self.config.inputs
        ]
        return dict(feeds.check_typed_request(f"pipeline {self.name!r}", declared, feed))

    def submit(self, feed: Mapping[str, Any]) -> Future[dict[str, np.ndarray]]:
        """Start a request; a future of ``{output name: array}``.  Cancelling it stops
        the request at its next step (and takes its model requests out of their
        queues when they have not started)."""
        request = _Request(self._check(feed))
        with self._idle:
            if self._closed:
                raise RuntimeClosedError(f"pipeline {self.name!r} is closed: no new requests")
            self._in_flight += 1
        request.future.add_done_callback(lambda f: self._done(request, f))
        request.future.add_done_callback(self._answers.count)
        self._pool.submit(self._advance, request, 0)
        return request.future

    def run(self, feed: Mapping[str, Any], timeout: float | None = None) -> dict[str, np.ndarray]:
        """:meth:`submit` and wait: ``{output name: array}``."""
        return self.submit(feed).result(timeout)

    def _done(self, request: _Request, future: Future[Any]) -> None:
        if future.cancelled():
            for f in list(request.pending):
                f.cancel()
        # The future holds this callback and the callback the request: a reference
        # cycle that only the garbage collector frees, and it runs rarely when the
        # objects are few and the arrays large (PP-OCR's pipeline grew by 0.5-0.7 GB
        # per 12 images).  Let the request's tensors go now.
        request.values = {}
        request.pending = []
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    @property
    def in_flight(self) -> int:
        """Requests submitted and not answered yet."""
        return self._in_flight

    def stats(self) -> RuntimeStats:
        """Requests answered and failed (each model step's runtime counts its own)."""
        return self._answers.stats()

    def _error(self, request: _Request, step: Step, exc: BaseException) -> None:
        what = f"model {step.target!r}" if step.kind == "model" else f"function {step.target!r}"
        kind = PipelineInputError if isinstance(exc, ValueError) else PipelineStepError
        error = kind(
            f"pipeline {self.name!r}, step {step.name!r} ({what}): {type(exc).__name__}: {exc}",
            step=step.name,
        )
        error.__cause__ = exc
        if request.future.set_running_or_notify_cancel():
            request.future.set_exception(error)

    def _advance(self, request: _Request, index: int) -> None:
        """Run the steps from ``index``: host steps here, up to the next model step,
        which continues on the pool once its model has answered."""
        steps = self.config.steps
        while index < len(steps):
            if request.future.cancelled():
                return
            step = steps[index]
            try:
                if step.kind == "host":
                    self._host(request, step)
                else:
                    self._model(request, step, index)
                    return
            except Exception as exc:  # the request's own failure: answered, named
                self._error(request, step, exc)
                return
            index += 1
        self._finish(request)

    def _host(self, request: _Request, step: Step) -> None:
        kwargs = {arg: request.values[tensor] for arg, tensor in step.inputs}
        result = self._functions[step.name](**kwargs)
        if not isinstance(result, Mapping):
            raise TypeError(f"the function returned {type(result).__name__}, not a dict")
        missing = sorted(k for k, _ in step.outputs if k not in result)
        if missing:
            raise KeyError(f"the function's result has no {missing} (it has {sorted(result)})")
        for key, tensor in step.outputs:
            request.values[tensor] = result[key]

    def _model(self, request: _Request, step: Step, index: int) -> None:
        runtime = self._lookup(step.target, step.version)
        feeds: list[dict[str, Any]]
        if step.each:
            lists = {name: request.values[tensor] for name, tensor in step.inputs}
            lengths = {name: len(v) for name, v in lists.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"the lists the step reads differ in length: {lengths}")
            count = next(iter(lengths.values()), 0)
            feeds = [{name: v[i] for name, v in lists.items()} for i in range(count)]
        else:
            feeds = [{name: request.values[tensor] for name, tensor in step.inputs}]
        if not feeds:
            for _, tensor in step.outputs:
                request.values[tensor] = []
            self._pool.submit(self._advance, request, index + 1)
            return
        futures = [runtime.submit(feed) for feed in feeds]
        request.pending = futures
        remaining = [len(futures)]
        lock = threading.Lock()

        def done(_: Future[Any]) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            # on the model's worker thread: hand the rest to the pool
            self._pool.submit(self._collect, request, step, index, runtime, futures)

        for f in futures:
            f.add_done_callback(done)

    def _collect(
        self, request: _Request, step: Step, index: int, runtime: Any, futures: list[Future[Any]]
    ) -> None:
        request.pending = []
        # The model requests' futures hold the callback that holds this list: emptied,
        # the futures and their outputs go when their answers have been read.
        answered = list(futures)
        futures.clear()
        if request.future.cancelled():
            return
        try:
            answers = [f.result() for f in answered]
            names = self._model_outputs(runtime)
            by_name = [dict(a) if isinstance(a, Mapping) else dict(zip(names, a)) for a in answers]
            for key, tensor in step.outputs:
                if key not in by_name[0]:
                    raise KeyError(f"the model has no output {key!r} (its outputs: {names})")
                values = [np.asarray(a[key]) for a in by_name]
                request.values[tensor] = values if step.each else values[0]
        except Exception as exc:
            self._error(request, step, exc)
            return
        self._advance(request, index + 1)

    def _model_outputs(self, runtime: Any) -> list[str]:
        found = self._names.get(id(runtime))
        if found is None or found[0] is not runtime:
            found = (runtime, [spec.name for spec in runtime.outputs])
            self._names[id(runtime)] = found
        return found[1]

    def _finish(self, request: _Request) -> None:
        out: dict[str, np.ndarray] = {}
        try:
            for spec in self.config.outputs:
                value = request.values[spec.name]
                expected = _V2_TO_NUMPY[spec.datatype]
                array = np.asarray(value, dtype=object if spec.datatype == "BYTES" else None)
                if array.dtype != expected or len(array.shape) != len(spec.dims):
                    raise PipelineStepError(
                        f"pipeline {self.name!r}: output {spec.name!r} must be {spec.datatype} "
                        f"with {len(spec.dims)} dims, its step gave {array.dtype} "
                        f"{list(array.shape)}"
                    )
                out[spec.name] = array
        except PipelineStepError as exc:
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(exc)
            return
        if request.future.set_running_or_notify_cancel():
            request.future.set_result(out)

    # -- lifecycle --------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """No new requests; those started are answered (waiting at most ``timeout``
        seconds); then the runtimes it owns close."""
        with self._idle:
            if self._closed:
                return
            self._closed = True
            self._idle.wait_for(lambda: self._in_flight == 0, timeout)
        self._pool.shutdown(wait=True)
        for runtime in self._owned:
            runtime.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
