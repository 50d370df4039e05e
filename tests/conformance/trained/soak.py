"""PP-OCR served to images of many sizes: the pieces of the trained tier's soak test and
of ``bench/ocr_soak.py``.

- :func:`cpu_reference`: rapidocr-paddle's own pipeline on the CPU (Paddle Inference, in
  a process of its own, which returns its memory when done) over each image: its time,
  its text, and whether one grey level of noise changes that text (an image read
  *stably* is one no draw changes);
- :class:`Server`: ``paddle-ipu serve --model-repository DIR`` in its own process over
  an empty compile cache, its log in a file, its resident memory read from /proc;
- :func:`pass_over`: one client sends every image once, one at a time (each a size
  the server has not seen, the first time): every answer's time and text;
- :func:`soak`: several clients send images picked at random for a while: every
  answer's status, time and text, and the server's resident memory every second.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def png(image: np.ndarray) -> bytes:
    import cv2

    ok, data = cv2.imencode(".png", image)
    assert ok
    return data.tobytes()


@dataclass
class Reference:
    """The CPU pipeline on one image."""

    seconds: float
    text: list[str]
    stable: bool


def _cpu_worker(pngs: list[bytes], draws: int, timed: bool) -> list[tuple[float, list[str], bool]]:
    sys.path.insert(0, str(HERE))
    import cv2
    import ocr

    pipeline = ocr.new_pipeline()
    out = []
    for data in pngs:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if timed:
            pipeline(data)  # then timed on its second run
        start = time.perf_counter()
        result, _ = pipeline(data)
        seconds = time.perf_counter() - start
        text = [str(line[1]) for line in result or []]
        stable = all(
            [line.text for line in ocr.read(pipeline, ocr.noisy(image, seed))] == text
            for seed in range(draws)
        )
        out.append((seconds, text, stable))
    return out


def cpu_reference(pngs: list[bytes], draws: int = 2, timed: bool = True) -> list[Reference]:
    """rapidocr-paddle's pipeline on the CPU over ``pngs`` (see the module docstring),
    in a process of its own; with ``timed``, the time of a second run of each image
    (its first run of a size costs about as much: the engine compiles nothing)."""
    import multiprocessing

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = pool.submit(_cpu_worker, pngs, draws, timed).result()
    return [Reference(*r) for r in done]


class Server:
    """``paddle-ipu serve --model-repository`` in its own process (see the module
    docstring)."""

    def __init__(self, repository: Path, work: Path, *args: str) -> None:
        cache = work / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        self.log_path = work / "server.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "paddle_ipu", "serve", "--model-repository", str(repository),
             "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=str(work),
            env=dict(os.environ, PADDLE_IPU_CACHE_DIR=str(cache)),
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.started = time.perf_counter()
        for line in self.proc.stdout:
            if line.startswith("paddle-ipu: serving"):
                words = line.split()
                self.port = int(words[words.index("on") + 1].rsplit(":", 1)[1])
                break
        else:
            raise AssertionError(f"the server did not start: {self.log_path.read_text()[-4000:]}")
        self.url = f"127.0.0.1:{self.port}"
        self.ready_seconds = time.perf_counter() - self.started
        # stdout is read to its end so that the server never blocks on a full pipe
        self._drain = threading.Thread(target=self.proc.stdout.read, daemon=True)
        self._drain.start()

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def client(self) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(self.url, network_timeout=900.0)

    def stats(self, model: str) -> dict[str, Any]:
        return dict(self.client().get_inference_statistics(model)["model_stats"][0])

    def stop(self) -> str:
        """Stop the server; the end of its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.log_path.read_text()[-6000:]


@dataclass
class Answer:
    image: int
    status: int
    seconds: float
    text: list[str] = field(default_factory=list)
    error: str = ""


def ask(client: Any, data: bytes, index: int) -> Answer:
    """One image to the pipeline ``ocr``: its answer (status 200, or the error)."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    inp = httpclient.InferInput("image", [1], "BYTES")
    inp.set_data_from_numpy(np.array([data], dtype=object))
    out = [httpclient.InferRequestedOutput("text", binary_data=True)]
    start = time.perf_counter()
    try:
        result = client.infer("ocr", [inp], outputs=out)
    except InferenceServerException as exc:
        return Answer(index, int(exc.status() or 0), time.perf_counter() - start, error=str(exc))
    seconds = time.perf_counter() - start
    text = [t.decode() for t in result.as_numpy("text")]
    return Answer(index, 200, seconds, text)


def pass_over(server: Server, pngs: list[bytes], order: list[int]) -> list[Answer]:
    """One client, one image at a time, in ``order``."""
    client = server.client()
    return [ask(client, pngs[i], i) for i in order]


@dataclass
class Soak:
    answers: list[Answer]
    #: (seconds since the start, the server's resident memory in MB)
    memory: list[tuple[float, float]]
    seconds: float


def soak(server: Server, pngs: list[bytes], clients: int, seconds: float, seed: int = 0) -> Soak:
    """``clients`` clients each send images picked at random, one after another, for
    ``seconds``; the server's resident memory is read every second."""
    answers: list[Answer] = []
    memory: list[tuple[float, float]] = []
    lock = threading.Lock()
    start = time.perf_counter()
    stop = start + seconds

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        c = server.client()
        mine = []
        while time.perf_counter() < stop:
            i = rng.randrange(len(pngs))
            mine.append(ask(c, pngs[i], i))
        with lock:
            answers.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        memory.append((time.perf_counter() - start, server.rss_mb()))
        time.sleep(1.0)
    for t in threads:
        t.join()
    return Soak(answers, memory, time.perf_counter() - start)


def growth_mb(memory: list[tuple[float, float]], after: float) -> tuple[float, float]:
    """(the resident memory's high-water mark at ``after`` seconds, how much it grew
    from then to the end)."""
    before = [mb for t, mb in memory if t <= after] or [memory[0][1]]
    return max(before), max(mb for _, mb in memory) - max(before)


def wrong_texts(answers: list[Answer], refs: list[Reference]) -> list[str]:
    """The answers of stably-read images whose text is not the CPU's."""
    return [
        f"image {a.image}: {a.text} != {refs[a.image].text}"
        for a in answers
        if a.status == 200 and refs[a.image].stable and a.text != refs[a.image].text
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(values),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


def dump(path: str, doc: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(doc, indent=1, default=float))
