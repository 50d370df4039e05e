"""Requests of image sizes already made while new sizes are made: their latency through
the served PP-OCR pipeline, without and with makes under way.

    python bench/shape_stall.py [--seconds 60] [--clients 2]

``paddle-ipu serve --model-repository`` over ``write_repository`` runs in its own
process; ``--clients`` clients send one image (its sizes made before the measurement
starts) over and over, for ``--seconds`` in each of three phases:

1. alone;
2. with one more client sending, one after another, images of sizes made already (the
   runs of other sizes beside theirs);
3. with that client sending images of sizes the server has not seen: each a detector
   shape (and recogniser widths) made on the models' worker threads, beside the runs.

Printed per phase: the clients' answers, p50 and p99 in milliseconds, and in phase 3
the makes (from the models' statistics).  A make that held up the requests of sizes
made already would show in phase 3's p99 against phase 2's.  Needs the extra: pip
install 'paddle-ipu[trained]'.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))


def _phase(
    server: Any, hot: bytes, others: list[bytes], clients: int, seconds: float
) -> tuple[list[float], int]:
    """(the latencies of the hot image's requests, how many others were answered)."""
    import soak

    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds
    done = [0]

    def hot_client() -> None:
        c = server.client()
        mine = []
        while time.perf_counter() < stop:
            a = soak.ask(c, hot, 0)
            assert a.status == 200, a.error
            mine.append(a.seconds)
        with lock:
            latencies.extend(mine)

    def other_client() -> None:
        c = server.client()
        for k, data in enumerate(others):
            if time.perf_counter() >= stop:
                break
            a = soak.ask(c, data, k)
            assert a.status == 200, a.error
            done[0] += 1

    threads = [threading.Thread(target=hot_client) for _ in range(clients)]
    if others:
        threads.append(threading.Thread(target=other_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, done[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    import images
    import soak

    from paddle_ipu.serving.ocr import write_repository

    sizes = images.random_sizes(400, seed=21)
    pngs = [soak.png(images.render_sized(500 + k, w, h).image) for k, (w, h) in enumerate(sizes)]
    hot, made, new = pngs[0], pngs[1:9], pngs[9:]
    with tempfile.TemporaryDirectory() as tmp:
        server = soak.Server(write_repository(Path(tmp) / "models"), Path(tmp))
        try:
            client = server.client()
            for data in [hot, *made]:  # their sizes made
                soak.ask(client, data, 0)
            rows = []
            for name, others in (
                ("alone", []),
                ("beside sizes made", made * 100),
                ("beside new sizes", new),
            ):
                before = server.stats("ocr_det")["specialisations"]
                lat, answered = _phase(server, hot, others, args.clients, args.seconds)
                after = server.stats("ocr_det")["specialisations"]
                ms = soak.summary([t * 1e3 for t in lat])
                makes = after["made"] - before["made"]
                p50, p99, top = ms["p50"], ms["p99"], ms["max"]
                rows.append(
                    f"| {name} | {len(lat)} | {p50:.0f} | {p99:.0f} | {top:.0f} | {answered} | "
                    f"{makes} |"
                )
            print("| phase | hot answers | p50 ms | p99 ms | max ms | other images answered | "
                  "detector shapes made |")  # fmt: skip
            print("|---|---:|---:|---:|---:|---:|---:|")
            print("\n".join(rows))
        finally:
            server.stop()
    print(f"\ncores: {os.cpu_count()}, load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
