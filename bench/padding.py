"""Why the shape policy pads nothing: padding changes what trained models answer.

rapidocr-paddle's OCR pipeline (the ``trained`` extra) runs on the CPU over the twelve
rendered images of tests/conformance/trained; every input its detector and recogniser
get is recorded, then run again on Paddle Inference (the package's own engine) padded
to a bucket -- the detector's height and width to a multiple of ``--det-step`` with
zeros, white (the image's background after normalisation) or its edge repeated; the
recogniser's width to a multiple of ``--rec-step`` with zeros (its own padding) -- and
the outputs cut back to the real size are compared with the unpadded run:

- detector: pixels of the probability map that cross the pipeline's threshold (0.3);
- recogniser: text lines whose per-column choice of character (argmax) changes.

    python bench/padding.py [--det-step 64] [--rec-step 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))

THRESHOLD = 0.3  # rapidocr's Det.thresh


def record() -> tuple[dict[str, list[np.ndarray]], dict[str, Any], Any]:
    """The pipeline on the CPU over the images: every detector and recogniser input,
    the engines (by kind) and the engine's own call."""
    import images
    from rapidocr_paddle import RapidOCR
    from rapidocr_paddle.utils import infer_engine

    seen: dict[str, list[np.ndarray]] = {"det": [], "cls": [], "rec": []}
    engines: dict[str, Any] = {}
    call = infer_engine.PaddleInferSession.__call__
    init = infer_engine.PaddleInferSession.__init__

    def recording_init(self: Any, config: Any, mode: Any = None) -> None:
        init(self, config, mode)
        path = str(config["model_path"])
        self.kind = "det" if "det" in path else "cls" if "cls" in path else "rec"
        engines[self.kind] = self

    def recording_call(self: Any, img: np.ndarray) -> Any:
        seen[self.kind].append(img.copy())
        return call(self, img)

    infer_engine.PaddleInferSession.__init__ = recording_init  # type: ignore[method-assign]
    infer_engine.PaddleInferSession.__call__ = recording_call  # type: ignore[method-assign]
    try:
        pipeline = RapidOCR()
        for image in images.render_all():
            pipeline(image.image)
    finally:
        infer_engine.PaddleInferSession.__init__ = init  # type: ignore[method-assign]
        infer_engine.PaddleInferSession.__call__ = call  # type: ignore[method-assign]
    return seen, engines, call


def up(n: int, step: int) -> int:
    return -(-n // step) * step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--det-step", type=int, default=64)
    parser.add_argument("--rec-step", type=int, default=128)
    args = parser.parse_args()
    seen, engines, call = record()

    def run(kind: str, x: np.ndarray) -> np.ndarray:
        return np.asarray(call(engines[kind], x)[0])

    print(f"detector: {len(seen['det'])} inputs, padded to multiples of {args.det_step}")
    for mode in ("zeros", "white", "edge"):
        flips = []
        for x in seen["det"]:
            h, w = x.shape[2:]
            widths = ((0, 0), (0, 0), (0, up(h, args.det_step) - h), (0, up(w, args.det_step) - w))
            if mode == "edge":
                padded = np.pad(x, widths, mode="edge")
            else:
                padded = np.pad(x, widths, constant_values=1.0 if mode == "white" else 0.0)
            exact, cut = run("det", x), run("det", padded)[..., :h, :w]
            flips.append(int(((exact > THRESHOLD) != (cut > THRESHOLD)).sum()))
        sizes = [x.shape[2] * x.shape[3] for x in seen["det"]]
        print(
            f"  {mode:5}: pixels across the threshold per image {min(flips):,} to "
            f"{max(flips):,} (of maps of {min(sizes):,} to {max(sizes):,} pixels)"
        )
    changed = 0
    lines = 0
    for x in seen["rec"]:
        w = x.shape[3]
        padded = np.pad(x, ((0, 0), (0, 0), (0, 0), (0, up(w, args.rec_step) - w)))
        exact, cut = run("rec", x), run("rec", padded)
        steps = exact.shape[1]
        for row in range(exact.shape[0]):
            lines += 1
            changed += int((exact[row].argmax(-1) != cut[row, :steps].argmax(-1)).any())
    print(
        f"recogniser: widths padded to multiples of {args.rec_step}: the per-column choice "
        f"of character changed on {changed} of {lines} text lines"
    )


if __name__ == "__main__":
    main()
