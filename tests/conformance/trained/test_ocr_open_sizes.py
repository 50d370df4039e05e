"""PP-OCR served to images of many sizes: ``paddle-ipu serve --model-repository`` in its
own process over ``write_repository`` (an empty compile cache, each model's shapes
bounded to 300 MB so that they leave memory and come back), tritonclient's HTTP client
in this process:

- 40 images of 40 sizes (160-1800 x 48-900 pixels), each sent once: every one answered,
  the CPU pipeline's text on every image the CPU reads stably (a draw of one grey level
  of noise does not change its text), and the detector's shapes left memory and came back;
- then three clients send them at random for two minutes (``bench/ocr_soak.py`` runs
  the long version): no error, the same texts, the server's resident memory flat after
  the first minute;
- and the same 40 images through rapidocr-paddle's own pipeline changed by one line,
  ``config.enable_ipu()`` (the predictor), its shapes bounded to 300 MB too.

Needs the extra: pip install 'paddle-ipu[trained]' (and Debian's fonts-dejavu-core).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import images
import pytest
import soak

pytestmark = pytest.mark.slow

pytest.importorskip("tritonclient.http")

SIZES = images.random_sizes(40, seed=7)


@pytest.fixture(scope="module")
def pngs() -> list[bytes]:
    return [soak.png(images.render_sized(k, w, h).image) for k, (w, h) in enumerate(SIZES)]


@pytest.fixture(scope="module")
def refs(pngs: list[bytes]) -> list[soak.Reference]:
    return soak.cpu_reference(pngs, draws=1, timed=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[soak.Server]:
    from paddle_ipu.serving.ocr import write_repository

    root = tmp_path_factory.mktemp("ocr_sizes")
    srv = soak.Server(write_repository(root / "models", memory_mb=300), root)
    try:
        yield srv
    finally:
        srv.stop()


def test_every_size_is_answered_with_the_cpu_text(
    server: soak.Server, pngs: list[bytes], refs: list[soak.Reference]
) -> None:
    answers = soak.pass_over(server, pngs, list(range(len(pngs))))
    refused = [f"image {a.image}: {a.status} {a.error}" for a in answers if a.status != 200]
    assert not refused
    assert not soak.wrong_texts(answers, refs)
    assert sum(r.stable for r in refs) >= len(refs) // 2  # the check has images to check
    det = server.stats("ocr_det")["specialisations"]
    assert det["made"] >= 30 and det["evicted"] > 0, det  # past the bound, none refused


def test_a_soak_of_random_sizes_keeps_its_memory(
    server: soak.Server, pngs: list[bytes], refs: list[soak.Reference]
) -> None:
    result = soak.soak(server, pngs, clients=3, seconds=120.0)
    errors = [f"image {a.image}: {a.status} {a.error}" for a in result.answers if a.status != 200]
    assert not errors, f"{len(errors)} of {len(result.answers)} answers were errors: {errors[:5]}"
    assert len(result.answers) >= 20, f"{len(result.answers)} answers in {result.seconds:.0f} s"
    wrong = soak.wrong_texts(result.answers, refs)
    assert not wrong, f"{len(wrong)} stably-read images not read as the CPU reads them: {wrong[:5]}"
    high, grew = soak.growth_mb(result.memory, after=60.0)
    det: Any = server.stats("ocr_det")["specialisations"]
    rec: Any = server.stats("ocr_rec")["specialisations"]
    assert grew <= max(0.1 * high, 150.0), (
        f"resident memory grew {grew:.0f} MB after the first minute (high-water mark then "
        f"{high:.0f} MB); det {det}; rec {rec}; memory (s, MB) {result.memory[::10]}"
    )
    assert det["restored"] > 0, f"no detector shape came back after it left memory: {det}"


def test_the_predictor_reads_every_size(pngs: list[bytes], refs: list[soak.Reference]) -> None:
    import cv2
    import numpy as np
    import ocr

    predictors: list[Any] = []
    # a bound the detector's shapes pass: as measured, its 32 shapes of the 40 sizes held 200 MB
    with ocr.ported_engine(memory_mb=32, made=predictors):
        pipeline = ocr.new_pipeline()
    answers = []
    for k, data in enumerate(pngs):
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        answers.append(soak.Answer(k, 200, 0.0, [line.text for line in ocr.read(pipeline, image)]))
    assert not soak.wrong_texts(answers, refs)
    det = max((p._shared.shapes.stats() for p in predictors), key=lambda s: s.made)
    assert det.made >= 30 and det.evicted > 0, det  # past the bound, none refused
