"""A model repository in Triton's layout, served by one :class:`InferenceServer`
(``paddle-ipu serve --model-repository DIR``).

Layout::

    DIR/<model>/config.json            optional: the model's options (below)
    DIR/<model>/<version>/model.pdipu  a package (paddle-ipu compile), or
    DIR/<model>/<version>/model.json   a saved inference model (or model.pdmodel),
    DIR/<model>/<version>/model.pdiparams   compiled on load through the compile cache

Versions are directories named by a positive integer.  ``config.json`` (every key
optional)::

    {"micro_batch_size": 8,      rows per micro-batch when compiling a saved model
     "timeout_ms": 2.0,          the batching timeout (0: a request is one micro-batch)
     "num_buffers": 64,          the queue's bound, in micro-batches
     "precision": "bfloat16",    the host backend's (float32 by default; bfloat16: on
                                 OpenVINO, a CPU with AVX512-BF16 or AMX)
     "version_policy": {"latest": {"num_versions": 1}}
                       | {"all": {}} | {"specific": {"versions": [1, 3]}},
     "pipeline": {...}}          a pipeline over other models (serving.pipeline), not
                                 a model: its version directories are empty

A model whose inputs leave dimensions open besides the batch (an image's height and
width; :mod:`paddle_ipu.executor.shapes`) also takes::

     "input_shapes": [{"x": [-1, 3, 736, 736]}],   shapes compiled when it loads
     "shape_buckets": {"x": {"2": [736, 1024], "3": {"min": 736, "max": 4096, "step": 256}}}
                      | "auto",  grids its open dimensions are padded up to
     "pad_values": {"x": 0.0},   what each bucketed input is padded with (0), or
                                 "edge": its edge repeated
     "specialisation_memory_mb": 1024,   the memory its shapes hold at once
     "max_specialisations": 16,  and at most this many (none by default)
     "warmup": true              its declared shapes (input_shapes, then every bucket,
                                 as many as the memory holds) are made when it loads,
                                 before it is READY

The default policy serves the newest version.  Model control modes, as Triton's:
``none`` loads every model at start and refuses load / unload requests (400 /
INVALID_ARGUMENT); ``explicit`` loads the models named at start (``load``; none by
default) and takes load / unload requests.  A load of a loaded model loads it again:
the versions its policy now selects load, the others unload; versions already
served stay as they are.  An unload refuses the model's new requests (404), answers
those in flight, then closes its runtimes; no other model is touched.  A version
that fails to load is UNAVAILABLE in the index with the error as its reason, and the
load answers 400 naming it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from paddle_ipu.errors import OptionError

log = logging.getLogger("paddle_ipu")

__all__ = ["CONTROL_MODES", "ModelConfig", "ModelRepository", "read_config"]

CONTROL_MODES = ("none", "explicit")
CONFIG_FILE = "config.json"
PACKAGE_FILE = "model.pdipu"
#: the keys of a model compiled per input shape (not a pipeline's)
_SHAPE_KEYS = (
    "input_shapes",
    "shape_buckets",
    "pad_values",
    "specialisation_memory_mb",
    "max_specialisations",
    "warmup",
)
_CONFIG_KEYS = (
    "micro_batch_size",
    "timeout_ms",
    "num_buffers",
    "version_policy",
    "pipeline",
    "precision",
    *_SHAPE_KEYS,
)
_PRECISIONS = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model's ``config.json``: None means the server's default."""

    micro_batch_size: int | None = None
    timeout_ms: float | None = None
    num_buffers: int | None = None
    # ("latest", n) | ("all", 0) | ("specific", (versions...))
    policy: tuple[str, Any] = ("latest", 1)
    #: a pipeline's definition (serving.pipeline.PipelineConfig), None for a model
    pipeline: Any = None
    #: the host backend's precision (host_precision)
    precision: str | None = None
    #: a model compiled per input shape: compile_model's options of its shapes
    shapes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: make its declared shapes when it loads
    warmup: bool = False

    def select(self, versions: Sequence[int]) -> list[int]:
        """The versions (of those present, ascending) the policy serves."""
        kind, arg = self.policy
        if kind == "all":
            return list(versions)
        if kind == "latest":
            return list(versions)[-int(arg) :]
        return [v for v in versions if v in arg]


def _field(path: Path, key: str, value: Any, kind: type, low: float) -> Any:
    ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
    if not ok or isinstance(value, bool) or value < low:
        raise OptionError(
            f"{path}: {key!r} must be {'an integer' if kind is int else 'a number'} >= "
            f"{low:g}, got {value!r}"
        )
    return kind(value)


def _policy(path: Path, value: Any) -> tuple[str, Any]:
    expected = '{"latest": {"num_versions": N}}, {"all": {}} or {"specific": {"versions": [..]}}'
    if not isinstance(value, dict) or len(value) != 1:
        raise OptionError(f"{path}: 'version_policy' must be {expected}, got {value!r}")
    ((kind, arg),) = value.items()
    if kind == "all" and arg in ({}, None):
        return ("all", 0)
    if kind == "latest" and isinstance(arg, dict) and set(arg) <= {"num_versions"}:
        return ("latest", _field(path, "num_versions", arg.get("num_versions", 1), int, 1))
    if kind == "specific" and isinstance(arg, dict) and set(arg) == {"versions"}:
        versions = arg["versions"]
        if isinstance(versions, list) and versions:
            return (
                "specific",
                tuple(_field(path, "versions", v, int, 1) for v in versions),
            )
    raise OptionError(f"{path}: 'version_policy' must be {expected}, got {value!r}")


def read_config(model_dir: Path) -> ModelConfig:
    """``model_dir/config.json`` (the defaults when there is none)."""
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return ModelConfig()
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise OptionError(f"{path}: not a JSON file: {exc}") from None
    if not isinstance(doc, dict):
        raise OptionError(f"{path}: must hold a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(_CONFIG_KEYS))
    if unknown:
        raise OptionError(f"{path}: unknown keys {unknown}: the keys are {list(_CONFIG_KEYS)}")
    config = ModelConfig()
    if "micro_batch_size" in doc:
        mbs = _field(path, "micro_batch_size", doc["micro_batch_size"], int, 1)
        config = dataclasses.replace(config, micro_batch_size=mbs)
    if "timeout_ms" in doc:
        config = dataclasses.replace(
            config, timeout_ms=_field(path, "timeout_ms", doc["timeout_ms"], float, 0)
        )
    if "num_buffers" in doc:
        config = dataclasses.replace(
            config, num_buffers=_field(path, "num_buffers", doc["num_buffers"], int, 1)
        )
    if "version_policy" in doc:
        config = dataclasses.replace(config, policy=_policy(path, doc["version_policy"]))
    if "precision" in doc:
        if doc["precision"] not in _PRECISIONS:
            raise OptionError(
                f"{path}: precision must be one of {list(_PRECISIONS)}, got {doc['precision']!r}"
            )
        config = dataclasses.replace(config, precision=doc["precision"])
    shapes = _shape_options(path, doc)
    if shapes or "warmup" in doc:
        warmup = doc.get("warmup", False)
        if not isinstance(warmup, bool):
            raise OptionError(f"{path}: 'warmup' must be true or false, got {warmup!r}")
        config = dataclasses.replace(config, shapes=shapes, warmup=warmup)
    if "pipeline" in doc:
        from paddle_ipu.serving.pipeline import parse_pipeline

        batching = sorted(
            set(doc) & {"micro_batch_size", "timeout_ms", "num_buffers", "precision", *_SHAPE_KEYS}
        )
        if batching:
            raise OptionError(
                f"{path}: {batching} are a model's: a pipeline's steps batch in their "
                "own models' runtimes"
            )
        config = dataclasses.replace(config, pipeline=parse_pipeline(doc["pipeline"], str(path)))
    return config


def _shape_options(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """compile_model's options of a model compiled per input shape, from ``doc``
    (checked here, by key; the model's own shapes check them again when it loads)."""
    from paddle_ipu.executor.shapes import ShapeBuckets, check_pad_values

    out: dict[str, Any] = {}
    if "input_shapes" in doc:
        shapes = doc["input_shapes"]
        if not isinstance(shapes, list) or not all(
            isinstance(d, dict)
            and all(isinstance(v, list) and all(_is_int(x) for x in v) for v in d.values())
            for d in shapes
        ):
            raise OptionError(
                f"{path}: 'input_shapes' must be a list of {{input: shape}} objects, got {shapes!r}"
            )
        out["input_shapes"] = shapes
    pads = doc.get("pad_values")
    if pads is not None:
        if not isinstance(pads, dict):
            raise OptionError(f"{path}: 'pad_values' must map inputs to numbers, got {pads!r}")
        try:
            pads = check_pad_values(pads)
        except OptionError as exc:
            raise OptionError(f"{path}: 'pad_values': {exc}") from None
    if "shape_buckets" in doc:
        buckets = doc["shape_buckets"]
        if buckets != "auto":
            try:
                buckets = ShapeBuckets.parse(buckets, pads, where=f"{path}: 'shape_buckets'")
            except OptionError as exc:
                raise OptionError(str(exc)) from None
        out["shape_buckets"] = buckets
    if pads is not None:
        if "shape_buckets" not in doc:
            raise OptionError(f"{path}: 'pad_values' pads 'shape_buckets', which it does not set")
        out["pad_values"] = pads
    if "specialisation_memory_mb" in doc:
        out["memory_mb"] = _field(
            path, "specialisation_memory_mb", doc["specialisation_memory_mb"], float, 1
        )
    if "max_specialisations" in doc:
        out["max_specialisations"] = _field(
            path, "max_specialisations", doc["max_specialisations"], int, 1
        )
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _error(message: str) -> str:
    return json.dumps({"error": message})


class ModelRepository:
    """The models of a directory in Triton's layout (see the module docstring).

    Args:
        path: the repository's directory.
        control_mode: ``none`` or ``explicit``.
        load: in ``explicit`` mode, the models to load at start.
        micro_batch_size, timeout_ms, num_buffers: the defaults of a model's
            ``config.json``.
        backend: the backend the runtimes run on (None: each package's own).
        spin: let the host backend's threads spin between runs.
        host_options: the host backend's options of every model (host_precision,
            host_engine); a model's ``precision`` replaces host_precision.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        control_mode: str = "none",
        load: Sequence[str] = (),
        micro_batch_size: int = 16,
        timeout_ms: float = 2.0,
        num_buffers: int = 64,
        backend: str | None = None,
        spin: bool = False,
        host_options: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise OptionError(f"model repository {str(self.path)!r} is not a directory")
        if control_mode not in CONTROL_MODES:
            raise OptionError(
                f"model control mode must be one of {list(CONTROL_MODES)}, got {control_mode!r}"
            )
        if load and control_mode != "explicit":
            raise OptionError(
                "models to load at start are named in control mode 'explicit' only (in "
                "'none' every model loads)"
            )
        self.control_mode = control_mode
        self.initial = list(load)
        self.defaults = ModelConfig(micro_batch_size, float(timeout_ms), num_buffers)
        self.backend = backend
        self.spin = spin
        self.host_options = dict(host_options or {})
        self._server: Any = None
        self._lock = threading.Lock()  # one load or unload at a time

    # -- what the directory holds ---------------------------------------------------
    def names(self) -> list[str]:
        """The models: the repository's subdirectories."""
        return sorted(p.name for p in self.path.iterdir() if p.is_dir())

    def versions(self, name: str) -> list[int]:
        """A model's versions: its subdirectories named by a positive integer."""
        out = []
        for p in (self.path / name).iterdir():
            if p.is_dir() and p.name.isdigit() and int(p.name) > 0:
                out.append(int(p.name))
        return sorted(out)

    # -- the server's side ----------------------------------------------------------
    def attach(self, server: Any) -> None:
        if self._server is not None:
            raise OptionError("this model repository is served by another server already")
        self._server = server

    def start(self) -> None:
        """Load the models of the control mode; list the others as unloaded."""
        chosen = self.names() if self.control_mode == "none" else self.initial
        missing = sorted(set(chosen) - set(self.names()))
        if missing:
            raise OptionError(
                f"models {missing} are not in the model repository {str(self.path)!r} "
                f"(it holds {self.names()})"
            )
        for name in self.names():
            if name in chosen:
                status, answer = self._load(name)
                if status != 200:
                    log.warning("model %r did not load: %s", name, json.loads(answer)["error"])
            else:
                for v in self.versions(name):
                    self._server.server.set_state(name, str(v), "UNAVAILABLE", "unloaded")

    def control(self, action: str, name: str, body: bytes | dict[str, Any]) -> tuple[int, str]:
        """A load or unload request: (HTTP status, JSON answer)."""
        if self.control_mode != "explicit":
            return 400, _error(
                f"model control mode is {self.control_mode!r}: models are not loaded or "
                f"unloaded on request (serve with --model-control-mode explicit)"
            )
        try:
            doc = json.loads(body or b"{}") if isinstance(body, bytes) else body
        except ValueError as exc:
            return 400, _error(f"the request body is not JSON: {exc}")
        if not isinstance(doc, dict):
            return 400, _error(f"the request body must be a JSON object, got {doc!r}")
        params = doc.get("parameters") or {}
        ignored = {"unload_dependents"} if action == "unload" else set()
        refused = sorted(set(params) - ignored)
        if refused:
            return 400, _error(
                f"{action} parameters {refused} are not supported: a model loads from its "
                f"directory in the repository, with its config.json"
            )
        if "/" in name or name in ("", ".", "..") or not (self.path / name).is_dir():
            return 404, _error(
                f"no model {name!r} in the model repository {str(self.path)!r} (it holds "
                f"{self.names()})"
            )
        return self._load(name) if action == "load" else self._unload(name)

    def _load(self, name: str) -> tuple[int, str]:
        server = self._server
        core = server.server
        with self._lock:
            versions = self.versions(name)
            try:
                config = read_config(self.path / name)
            except OptionError as exc:
                for v in versions:
                    self._drop(name, v, f"config: {exc}")
                return 400, _error(f"failed to load model {name!r}: {exc}")
            chosen = config.select(versions)
            if not chosen:
                reason = (
                    f"no version directory in {self.path / name} is selected by its version "
                    f"policy {config.policy} (versions: {versions})"
                )
                for v in versions:
                    self._drop(name, v, reason)
                return 400, _error(f"failed to load model {name!r}: {reason}")
            served = {v for (n, v) in server.served() if n == name}
            failed = []
            for v in chosen:
                if str(v) in served:
                    continue
                core.set_state(name, str(v), "LOADING", "")
                try:
                    runtime = self._runtime(name, v, config)
                    try:
                        server.add_model(runtime, name, str(v))
                    except BaseException:
                        runtime.close()
                        raise
                except Exception as exc:  # recorded: the index shows it, the answer names it
                    reason = f"{type(exc).__name__}: {exc}"
                    core.set_state(name, str(v), "UNAVAILABLE", reason)
                    failed.append(f"version {v}: {reason}")
            for v in versions:
                if v not in chosen:
                    self._drop(name, v, "unloaded")
        if failed:
            return 400, _error(f"failed to load model {name!r}: " + "; ".join(failed))
        log.info("loaded model %r versions %s", name, chosen)
        return 200, "{}"

    def _drop(self, name: str, version: int, reason: str) -> None:
        """Version ``version`` of ``name`` unloaded (if served) and UNAVAILABLE."""
        server = self._server
        if (name, str(version)) in server.served():
            server._unload(name, str(version), None, forget=False, reason=reason)
        else:
            server.server.set_state(name, str(version), "UNAVAILABLE", reason)

    def _unload(self, name: str) -> tuple[int, str]:
        with self._lock:
            served = sorted(v for (n, v) in self._server.served() if n == name)
            for v in served:
                self._server._unload(name, v, None, forget=False)
        log.info("unloaded model %r versions %s", name, served)
        return 200, "{}"

    def _served(self, name: str, version: str) -> Any:
        """The runtime the server serves as ``name`` / ``version`` ("": the newest)."""
        served = self._server.served()
        if version:
            runtime = served.get((name, version))
        else:
            versions = sorted((int(v), rt) for (n, v), rt in served.items() if n == name)
            runtime = versions[-1][1] if versions else None
        if runtime is None:
            raise OptionError(
                f"model {name!r}"
                + (f" version {version!r}" if version else "")
                + f" is not served (served: {sorted(served)})"
            )
        return runtime

    def open_pipeline(self, name: str, version: int | None = None) -> Any:
        """The pipeline ``name`` of this repository in this process, without a server:
        its steps' models loaded here (their newest versions, or those the steps name)
        and closed with it."""
        versions = self.versions(name)
        config = read_config(self.path / name)
        if config.pipeline is None:
            raise OptionError(f"model {name!r} of {str(self.path)!r} is not a pipeline")
        if not versions:
            raise OptionError(f"{self.path / name} has no version directory")
        from paddle_ipu.serving.pipeline import Pipeline

        runtimes: dict[tuple[str, str], Any] = {}
        try:
            for step in config.pipeline.steps:
                if step.kind != "model" or (step.target, step.version) in runtimes:
                    continue
                model_versions = (
                    self.versions(step.target) if (self.path / step.target).is_dir() else []
                )
                if not model_versions:
                    raise OptionError(
                        f"pipeline {name!r}, step {step.name!r}: no model {step.target!r} "
                        f"with a version in {str(self.path)!r}"
                    )
                v = int(step.version) if step.version else model_versions[-1]
                runtimes[(step.target, step.version)] = self._runtime(
                    step.target, v, read_config(self.path / step.target)
                )
        except BaseException:
            for rt in runtimes.values():
                rt.close()
            raise
        return Pipeline(
            config.pipeline,
            lambda model, v: runtimes[(model, v)],
            name=name,
            search=self.path,
            owned=list(runtimes.values()),
        )

    def _runtime(self, name: str, version: int, config: ModelConfig) -> Any:
        """The started runtime of one version directory."""
        from paddle_ipu.serving.bucketed_runtime import runtime_for
        from paddle_ipu.serving.package import load_package
        from paddle_ipu.serving.saved_model import compile_model

        d = self.path / name / str(version)
        if config.pipeline is not None:
            from paddle_ipu.serving.pipeline import Pipeline

            return Pipeline(config.pipeline, self._served, name=name, search=self.path)
        mbs = config.micro_batch_size or self.defaults.micro_batch_size or 1
        if (d / PACKAGE_FILE).is_file():
            package = load_package(d / PACKAGE_FILE)
        elif (d / "model.json").is_file() or (d / "model.pdmodel").is_file():
            package, _ = compile_model(str(d / "model"), micro_batch_size=mbs, **config.shapes)
        else:
            raise OptionError(
                f"{d} holds neither {PACKAGE_FILE} nor a saved inference model (model.json or "
                f"model.pdmodel, with model.pdiparams)"
            )
        timeout_ms = (
            config.timeout_ms if config.timeout_ms is not None else self.defaults.timeout_ms
        )
        num_buffers = config.num_buffers or self.defaults.num_buffers
        options = {"host_spin_threads": self.spin, **self.host_options}
        if config.precision is not None:
            options["host_precision"] = config.precision
        if (d / PACKAGE_FILE).is_file() and config.shapes:
            raise OptionError(
                f"{d / PACKAGE_FILE} is a package: its shapes were chosen when it was compiled "
                f"({sorted(config.shapes)} are a saved model's options)"
            )
        runtime = runtime_for(
            package,
            self.backend,
            executor_options=options,
            timeout_ms=timeout_ms,
            num_buffers=num_buffers,
            name=name,
        )
        if config.warmup:
            from paddle_ipu.serving.shaped import ShapeRuntime

            if not isinstance(runtime, ShapeRuntime):
                runtime.close()
                raise OptionError(
                    f"model {name!r}: 'warmup' makes the declared shapes of a model compiled "
                    "per input shape; this one has one graph"
                )
            try:
                made = runtime.warm_up()
            except BaseException:
                runtime.close()
                raise
            log.info("model %r: warmed up %d input shape(s)", name, len(made))
        return runtime
