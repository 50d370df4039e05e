"""PP-OCR served as one model (paddle_ipu.serving.ocr's pipeline, in process) against
rapidocr-paddle's own pipeline in a process pool of the same size: images/s.

    python bench/ocr_serving.py [--concurrency 1,8,32] [--rounds 3] [--requests 24]
                                [--json FILE]

The inputs are the twelve rendered text images of tests/conformance/trained/images.py,
as PNG bytes (each side decodes them).  For each concurrency C:

- ``pipeline``: C threads calling ``Pipeline.run`` (one image each call) of the
  pipeline over the repository :func:`paddle_ipu.serving.ocr.write_repository` lays
  out (the host backend; each model's runtime batches the rows of concurrent calls);
- ``pool``: a ``ProcessPoolExecutor`` of C processes, each with rapidocr-paddle's
  ``RapidOCR`` (Paddle Inference on the CPU, as the package configures it), one image
  per task.

Untimed first: the pipeline answers every image once (compiling its shapes) and again
at each concurrency; the pool answers every image at least once and at least C images
(each worker starts its engine), and its texts are compared with the pipeline's.  Then
``--rounds`` rounds of ``--requests`` images (the images in turn); the median images/s
is reported, with the resident memory.  The two sides run one after the other, not
side by side (the pipeline's process is closed before the pool starts): on a machine
of 24 GiB they do not fit together.  ``--pool`` sets the pool sizes when they must
differ from the concurrency (a rapidocr-paddle process holds 2-3 GB here).  Needs the
extra: pip install 'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))

_engine: Any = None


def _start_worker() -> None:
    global _engine
    from rapidocr_paddle import RapidOCR

    _engine = RapidOCR()


def _read(png: bytes) -> list[str]:
    result, _ = _engine(png)
    return [str(line[1]) for line in result or []]


def _pngs() -> list[bytes]:
    import cv2
    import images

    out = []
    for image in images.render_all():
        ok, png = cv2.imencode(".png", image.image)
        assert ok
        out.append(png.tobytes())
    return out


def _timed(call: Any, pngs: list[bytes], requests: int, workers: Any) -> float:
    """images/s of ``requests`` calls (the images in turn) over ``workers``."""
    start = time.perf_counter()
    futures = [workers.submit(call, pngs[i % len(pngs)]) for i in range(requests)]
    for f in futures:
        f.result()
    return requests / (time.perf_counter() - start)


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument(
        "--pool", default="", help="pool sizes (default: --concurrency; none: no pool)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    pool_arg = args.pool or args.concurrency
    pools = [] if pool_arg == "none" else [int(c) for c in pool_arg.split(",")]

    from paddle_ipu.serving.ocr import write_repository
    from paddle_ipu.serving.repository import ModelRepository

    # spawn: a fork of this process (ONNX Runtime's and the pipeline's threads) may
    # inherit a held lock
    spawn = multiprocessing.get_context("spawn")
    pngs = _pngs()
    result: dict[str, Any] = {"pipeline": {}, "pool": {}}
    with tempfile.TemporaryDirectory() as tmp:
        repo = ModelRepository(write_repository(Path(tmp) / "models"))
        with repo.open_pipeline("ocr") as pipeline:

            def run(png: bytes) -> list[str]:
                feed = {"image": np.array([png], dtype=object)}
                return [t.decode() for t in pipeline.run(feed)["text"]]

            start = time.perf_counter()
            texts = [run(png) for png in pngs]
            print(f"pipeline: every shape compiled in {time.perf_counter() - start:.1f} s")
            for c in levels:
                with ThreadPoolExecutor(c) as threads:
                    _timed(run, pngs, len(pngs), threads)
                    rounds = [_timed(run, pngs, args.requests, threads) for _ in range(args.rounds)]
                result["pipeline"][c] = {"median": statistics.median(rounds), "rounds": rounds}
                print(
                    f"pipeline, {c:2d} callers: {statistics.median(rounds):.2f} images/s "
                    f"(rounds {[round(x, 2) for x in rounds]}), RSS {_rss_mb(os.getpid()):.0f} MB",
                    flush=True,
                )
    for c in pools:
        with ProcessPoolExecutor(c, mp_context=spawn, initializer=_start_worker) as pool:
            warm = list(pool.map(_read, pngs * max(1, -(-c // len(pngs)))))
            assert warm[: len(pngs)] == texts, (warm[: len(pngs)], texts)
            rounds = [_timed(_read, pngs, args.requests, pool) for _ in range(args.rounds)]
            rss = sum(_rss_mb(p.pid) for p in pool._processes.values())
        result["pool"][c] = {"median": statistics.median(rounds), "rounds": rounds, "rss_mb": rss}
        print(
            f"rapidocr-paddle pool of {c:2d}: {statistics.median(rounds):.2f} images/s "
            f"(rounds {[round(x, 2) for x in rounds]}), RSS of its processes {rss:.0f} MB",
            flush=True,
        )
    print(f"cores: {os.cpu_count()}, load average {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
