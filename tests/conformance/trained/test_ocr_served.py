"""PP-OCR served as one model: ``paddle-ipu serve --model-repository DIR`` in its own
process over the repository paddle_ipu.serving.ocr.write_repository lays out (the
pipeline ``ocr`` over ``ocr_det``, ``ocr_cls``, ``ocr_rec``), called by tritonclient's
HTTP and gRPC clients with every rendered image as PNG bytes (BYTES), against
rapidocr-paddle's own pipeline on the CPU: the same text, boxes within a pixel.

Needs the extra: pip install 'paddle-ipu[trained]' (and Debian's fonts-dejavu-core).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import ocr
import pytest
from support.serving_models import ServerProcess

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.slow

SCORE = 1e-3
OUTPUTS = ("boxes", "text", "scores")


def png(image: np.ndarray) -> np.ndarray:
    import cv2

    ok, data = cv2.imencode(".png", image)
    assert ok
    return np.array([data.tobytes()], dtype=object)


def lines(result: Any) -> list[ocr.Line]:
    boxes, text, scores = (result.as_numpy(name) for name in OUTPUTS)
    assert boxes.dtype == np.float32 and boxes.shape[1:] == (4, 2)
    assert scores.dtype == np.float32 and text.dtype == object
    return [ocr.Line(box, t.decode(), float(s)) for box, t, s in zip(boxes, text, scores)]


def check(reference: list[ocr.Line], got: list[ocr.Line], name: str) -> None:
    assert [x.text for x in got] == [x.text for x in reference], name
    for a, b in zip(reference, got):
        assert np.abs(a.box - b.box).max() <= 1.0, (name, a.box, b.box)
        assert abs(a.score - b.score) <= SCORE, (name, a.score, b.score)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, text_images: list[Any]
) -> Iterator[ServerProcess]:
    """The server over an empty compile cache: each model loads from its declared
    tensors and compiles each input shape on its first request."""
    from paddle_ipu.serving.ocr import write_repository

    root = tmp_path_factory.mktemp("ocr_served")
    repo = write_repository(root / "models")
    srv = ServerProcess(
        f"--model-repository={repo}", env={"PADDLE_IPU_CACHE_DIR": str(root / "cache")}
    )
    try:
        yield srv
    finally:
        srv.stop()


def _inputs(module: Any, data: np.ndarray, name: str = "image", datatype: str = "BYTES") -> Any:
    inp = module.InferInput(name, list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    return [inp]


def test_http_and_grpc_read_as_the_cpu_pipeline(
    server: ServerProcess, text_images: list[Any], cpu_lines: list[list[ocr.Line]]
) -> None:
    http = httpclient.InferenceServerClient(server.url, network_timeout=600.0)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    meta = http.get_model_metadata("ocr")
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [
        ("boxes", "FP32"),
        ("text", "BYTES"),
        ("scores", "FP32"),
    ]
    # every image: the detector compiles a graph per image size, and the server's
    # sessions share one activation arena (with an arena each, about a gigabyte per
    # size of the larger images stayed reserved)
    for image, reference in zip(text_images, cpu_lines):
        data = png(image.image)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS]
        result = http.infer("ocr", _inputs(httpclient, data), outputs=outputs)
        check(reference, lines(result), f"http {image.name}")
        result = grpc.infer("ocr", _inputs(grpcclient, data), client_timeout=600)
        check(reference, lines(result), f"grpc {image.name}")
    # the pixels instead of a PNG
    image, reference = text_images[0], cpu_lines[0]
    result = http.infer("ocr_pixels", _inputs(httpclient, image.image, "pixels", "UINT8"))
    check(reference, lines(result), "http pixels")


def test_a_bad_image_is_answered_naming_the_step(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    bad = np.array([b"not an image"], dtype=object)
    with pytest.raises(InferenceServerException, match=r"step 'prepare'.*is no image") as info:
        http.infer("ocr", _inputs(httpclient, bad))
    assert info.value.status() == "400", info.value
    # the server goes on serving
    assert http.is_model_ready("ocr")


def test_repository_index_lists_the_pipeline_and_its_models(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    states = {
        (m["name"], m.get("version", "")): m["state"] for m in http.get_model_repository_index()
    }
    for name in ("ocr", "ocr_pixels", "ocr_det", "ocr_cls", "ocr_rec"):
        assert states[(name, "1")] == "READY", states
