"""rapidocr-paddle's OCR pipeline changed by one line (``config.enable_ipu()``) against
the same pipeline on the CPU, warm: images/s, one image per call.

    python bench/ocr_pipeline.py [--rounds 3] [--pairs 3] [--fp16]

The pipeline is the package's ``RapidOCR`` with its default configuration (PP-OCRv4
det and rec, the mobile v2 direction classifier, trained; its engine on
``paddle.inference``, one thread as the package leaves it); the port is
tests/conformance/trained/ocr.py's ``ported_engine`` (``enable_ipu()`` added just
before ``create_predictor``).  The inputs are the twelve rendered text images of
tests/conformance/trained/images.py.  Each engine runs in a fresh process: every image
once untimed (the ported pipeline compiles its input shapes then), its texts compared
with the CPU's, then ``--rounds`` rounds over the twelve images, timed; the engines take
turns ``--pairs`` times.  Reported: the median images/s per engine and the median of the
pairs' ratios (> 1: the ported pipeline is faster).  Needs the extra: pip install
'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, sys, time
sys.path.insert(0, TRAINED)
import images, ocr
engine, rounds, fp16 = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
pictures = [t.image for t in images.render_all()]
if engine == "ipu":
    options = {"ipu_enable_fp16": True} if fp16 else {}
    with ocr.ported_engine(**options):
        pipeline = ocr.new_pipeline()
else:
    pipeline = ocr.new_pipeline()
start = time.perf_counter()
texts = [[line.text for line in ocr.read(pipeline, p)] for p in pictures]
first = time.perf_counter() - start
times = []
for _ in range(rounds):
    start = time.perf_counter()
    for p in pictures:
        ocr.read(pipeline, p)
    times.append(time.perf_counter() - start)
print(json.dumps({"texts": texts, "first_s": first,
                  "images_per_s": [len(pictures) / t for t in times]}))
""".replace("TRAINED", repr(str(ROOT / "tests" / "conformance" / "trained")))


def _run(engine: str, rounds: int, fp16: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, engine, str(rounds), "1" if fp16 else "0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{engine} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--fp16", action="store_true", help="the port with ipu_enable_fp16")
    args = parser.parse_args()
    medians: dict[str, list[float]] = {"cpu": [], "ipu": []}
    for pair in range(args.pairs):
        got = {}
        for engine in ("cpu", "ipu"):
            got[engine] = _run(engine, args.rounds, args.fp16)
            medians[engine].append(statistics.median(got[engine]["images_per_s"]))
            rates = [round(r, 2) for r in got[engine]["images_per_s"]]
            print(f"pair {pair + 1} {engine}: first pass {got[engine]['first_s']:.1f} s, "
                  f"warm images/s {rates}", flush=True)  # fmt: skip
        same = sum(a == b for a, b in zip(got["cpu"]["texts"], got["ipu"]["texts"]))
        print(f"pair {pair + 1}: the CPU's text on {same} of {len(got['cpu']['texts'])} images")
    cpu, ipu = statistics.median(medians["cpu"]), statistics.median(medians["ipu"])
    ratio = statistics.median(i / c for c, i in zip(medians["cpu"], medians["ipu"]))
    print(f"warm images/s, medians: CPU {cpu:.2f}, enable_ipu() {ipu:.2f}; "
          f"ratio ipu / cpu, median of pairs: {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
