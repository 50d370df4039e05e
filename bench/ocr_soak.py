"""PP-OCR served to images of every size for a while, against rapidocr-paddle's own
pipeline on the CPU: first answers of new sizes, warm answers, and a soak.

    python bench/ocr_soak.py [--images 200] [--first 60] [--minutes 30] [--clients 4]
                             [--configs plain,buckets,predictor] [--memory-mb 1024]
                             [--json FILE] [--logs DIR]

The images: ``--images`` rendered text images of distinct sizes, 160-1800 x 48-900
pixels (tests/conformance/trained/images.py), as PNG bytes.  rapidocr-paddle's own
pipeline (Paddle Inference on the CPU, its default configuration, one image at a time
in a process of its own) reads each: its time on a second run of the image, its text,
and whether two draws of one grey level of noise change that text (an image read
*stably* is one neither draw changes).  Then, for each server configuration -- ``plain``:
``write_repository`` as it is, every size its own specialisation; ``buckets``: its
declared buckets and warm-up (``write_repository(buckets=True, warmup=True)``) --
``paddle-ipu serve --model-repository`` starts in its own process over an empty
compile cache and:

1. first answers: one client sends the first ``--first`` images once each, one at a
   time: each a size the server has not seen; the time of each answer over the CPU's
   time on that image (one image of another size goes first, not counted: the
   pipeline's host steps make rapidocr-paddle's engine on their first call);
2. warm answers: the same images again;
3. soak: ``--clients`` clients send images of the whole set picked at random for
   ``--minutes``; the server's resident memory every second.

``predictor`` (not run unless named in ``--configs``): the other route to open shapes,
rapidocr-paddle's own pipeline with its engine changed by one line (``enable_ipu()``,
its shapes bounded by ``--memory-mb`` when given), in a process of its own over an
empty compile cache: the first ``--first`` images, each run twice in a row (its first
answer, then warm), one image at a time; no soak.

Printed: the ratios (median, 90th percentile, max over the images), p50 and p99 of
the answers, errors, images whose text differs from the CPU's among those read
stably, the resident memory's high-water mark after the first third of the soak and
how much it grew from then on, and each model's specialisations (made, made again,
dropped from memory).  The two sides run one after the other, never side by side.
Needs the extra: pip install 'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))


def _ratios(answers: list[Any], refs: list[Any]) -> dict[str, float]:
    ratios = sorted(a.seconds / refs[a.image].seconds for a in answers if a.status == 200)
    return {
        "median": statistics.median(ratios),
        "p90": ratios[min(len(ratios) - 1, int(0.9 * len(ratios)))],
        "max": ratios[-1],
    }


def _line(name: str, answers: list[Any], refs: list[Any]) -> str:
    import soak

    ok = [a for a in answers if a.status == 200]
    failed = [a for a in answers if a.status != 200]
    if failed:
        errors = sorted({f"{a.status} {a.error[:300]}" for a in failed})
        print(f"  {name:6}: {len(failed)} of {len(answers)} not answered: {errors[:3]}")
    if not ok:
        return f"  {name:6}: none of {len(answers)} answered"
    t = soak.summary([a.seconds * 1e3 for a in ok])
    cpu = soak.summary([refs[a.image].seconds * 1e3 for a in ok])
    r = _ratios(answers, refs)
    return (
        f"  {name:6}: {len(ok)}/{len(answers)} answered; p50 {t['p50']:.0f} ms, p99 "
        f"{t['p99']:.0f} ms (CPU on those images: p50 {cpu['p50']:.0f}, p99 {cpu['p99']:.0f}); "
        f"time / CPU time per image: median {r['median']:.2f}, p90 {r['p90']:.2f}, max "
        f"{r['max']:.2f}; texts not the CPU's (stable images): "
        f"{len(soak.wrong_texts(answers, refs))}"
    )


def run_config(
    name: str, pngs: list[bytes], refs: list[Any], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    import soak

    from paddle_ipu.serving.ocr import write_repository

    buckets = name == "buckets"
    repo = write_repository(
        work / "models", buckets=buckets, warmup=buckets, memory_mb=args.memory_mb
    )
    server = soak.Server(repo, work)
    out: dict[str, Any] = {"ready_seconds": server.ready_seconds}
    try:
        print(f"{name}: the server is up in {server.ready_seconds:.1f} s", flush=True)
        for entry in server.client().get_model_repository_index():
            if entry.get("state") != "READY":
                print(f"  {entry.get('name')} is {entry.get('state')}: {entry.get('reason')}")
        # Not counted: the pipeline's host steps make rapidocr-paddle's engine on their
        # first call, whatever the size.
        import images

        setup = soak.png(images.render_sized(10**6, 300, 100).image)
        soak.ask(server.client(), setup, -1)
        order = list(range(min(args.first, len(pngs))))
        first = soak.pass_over(server, pngs, order)
        print(_line("first", first, refs), flush=True)
        warm = soak.pass_over(server, pngs, order)
        print(_line("warm", warm, refs), flush=True)
        result = soak.soak(server, pngs, args.clients, args.minutes * 60.0)
        errors = [a for a in result.answers if a.status != 200]
        high, grew = soak.growth_mb(result.memory, after=result.seconds / 3)
        took = soak.summary([a.seconds * 1e3 for a in result.answers if a.status == 200])
        print(
            f"  soak  : {len(result.answers)} answers from {args.clients} clients in "
            f"{result.seconds / 60:.1f} min, {len(errors)} errors, p50 {took['p50']:.0f} ms, "
            f"p99 {took['p99']:.0f} ms; texts not the CPU's (stable images): "
            f"{len(soak.wrong_texts(result.answers, refs))}; resident memory after the first "
            f"third {high:.0f} MB, grew {grew:.0f} MB to the end (last "
            f"{result.memory[-1][1]:.0f} MB)",
            flush=True,
        )
        for model in ("ocr_det", "ocr_cls", "ocr_rec"):
            s = server.stats(model).get("specialisations", {})
            held, bound = s.get("resident_bytes", 0) / 2**20, s.get("bound_bytes", 0) / 2**20
            print(
                f"  {model}: {s.get('resident')} shapes in memory ({held:.0f} of {bound:.0f} "
                f"MB), made {s.get('made')}, made again {s.get('restored')}, left memory "
                f"{s.get('evicted')}, {s.get('make_seconds', 0):.1f} s making them",
                flush=True,
            )
            out[model] = s
        out.update(
            first=[vars(a) for a in first],
            warm=[vars(a) for a in warm],
            soak={
                "answers": len(result.answers),
                "errors": [vars(a) for a in errors],
                "memory": result.memory,
                "wrong": soak.wrong_texts(result.answers, refs),
                "latency_ms": took,
            },
        )
    finally:
        log = server.stop()
        if out.get("soak", {}).get("errors"):
            print(log)
        if args.logs:
            Path(args.logs).mkdir(parents=True, exist_ok=True)
            shutil.copy(server.log_path, Path(args.logs) / f"{name}-server.log")
    return out


def _predictor_worker(
    pngs: list[bytes], order: list[int], memory_mb: float | None, cache: str
) -> list[tuple[float, float, list[str]]]:
    """rapidocr-paddle's pipeline changed by one line (``enable_ipu()``) over an empty
    compile cache: per image of ``order``, its first time, its second time, its text."""
    os.environ["PADDLE_IPU_CACHE_DIR"] = cache
    import images
    import ocr
    import soak

    with ocr.ported_engine(memory_mb=memory_mb):
        pipeline = ocr.new_pipeline()
    # not counted: the pipeline's first call sets up what no size changes
    pipeline(soak.png(images.render_sized(10**6, 300, 100).image))
    out = []
    for k in order:
        times = []
        for _ in range(2):
            start = time.perf_counter()
            result, _ = pipeline(pngs[k])
            times.append(time.perf_counter() - start)
        out.append((times[0], times[1], [str(line[1]) for line in result or []]))
    return out


def run_predictor(
    pngs: list[bytes], refs: list[Any], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """The predictor's route: the first and second time of each of the first
    ``--first`` images through the ported pipeline, in a process of its own."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import soak

    order = list(range(min(args.first, len(pngs))))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = pool.submit(
            _predictor_worker, pngs, order, args.memory_mb, str(work / "cache")
        ).result()
    first = [soak.Answer(k, 200, t1, text) for k, (t1, _, text) in zip(order, done)]
    warm = [soak.Answer(k, 200, t2, text) for k, (_, t2, text) in zip(order, done)]
    print(_line("first", first, refs), flush=True)
    print(_line("warm", warm, refs), flush=True)
    return {"first": [vars(a) for a in first], "warm": [vars(a) for a in warm]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--first", type=int, default=60)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--configs", default="plain,buckets")
    parser.add_argument("--memory-mb", type=float, default=None)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", default="")
    parser.add_argument("--logs", default="", help="a folder to keep each server's log in")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    import images
    import soak

    sizes = images.random_sizes(args.images, seed=args.seed)
    pngs = [soak.png(images.render_sized(k, w, h).image) for k, (w, h) in enumerate(sizes)]
    start = time.perf_counter()
    refs = soak.cpu_reference(pngs, draws=2)
    cpu_ms = soak.summary([r.seconds * 1e3 for r in refs])
    print(
        f"CPU pipeline (rapidocr-paddle, Paddle Inference): {len(refs)} images, p50 "
        f"{cpu_ms['p50']:.0f} ms, p99 {cpu_ms['p99']:.0f} ms; {sum(r.stable for r in refs)} read "
        f"stably ({time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    result: dict[str, Any] = {"sizes": sizes, "cpu": [vars(r) for r in refs]}
    for name in args.configs.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if name == "predictor":
                print("predictor: rapidocr-paddle's pipeline with enable_ipu()", flush=True)
                result[name] = run_predictor(pngs, refs, args, Path(tmp))
            else:
                result[name] = run_config(name, pngs, refs, args, Path(tmp))
    print(f"cores: {os.cpu_count()}, load average {os.getloadavg()}")
    if args.json:
        soak.dump(args.json, result)


if __name__ == "__main__":
    main()
