"""Text images rendered at test time (PIL and Debian's DejaVu fonts): the inputs of the
trained-weights tier.  Nothing is downloaded and no image is committed.

Twelve images of different sizes and line counts, some turned 180 degrees so that the
direction classifier decides what the recogniser reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FONT_DIRS = ("/usr/share/fonts/truetype/dejavu",)


@dataclass(frozen=True)
class TextImage:
    name: str
    lines: tuple[str, ...]
    font: str
    size: int
    rotated: bool
    image: np.ndarray  # H x W x 3, uint8, BGR as OpenCV reads files


def font_path(name: str) -> Path | None:
    for base in FONT_DIRS:
        path = Path(base) / name
        if path.is_file():
            return path
    return None


# (lines, font file, font size in pixels, margin, rotated 180 degrees)
SPECS: tuple[tuple[tuple[str, ...], str, int, int, bool], ...] = (
    (("Hello World",), "DejaVuSans.ttf", 40, 24, False),
    (("Invoice 2024-117", "Total: 394.50 EUR"), "DejaVuSans-Bold.ttf", 32, 30, False),
    (("The quick brown fox", "jumps over the lazy dog"), "DejaVuSerif.ttf", 30, 28, False),
    (("PaddlePaddle",), "DejaVuSansMono.ttf", 56, 40, True),
    (("Order No. 58213",), "DejaVuSans.ttf", 28, 20, False),
    (("Graphcore IPU", "Bow 2000"), "DejaVuSans.ttf", 44, 36, True),
    (("OPEN 9:00 - 18:00",), "DejaVuSans-Bold.ttf", 48, 32, False),
    (("Station Road 12", "Cambridge CB1 2AB", "United Kingdom"), "DejaVuSerif.ttf", 26, 24, False),
    (("Temperature 21.5 C",), "DejaVuSansMono-Bold.ttf", 36, 26, True),
    (("Sale 50% off",), "DejaVuSans.ttf", 64, 44, False),
    (("Model compiled", "in 3 seconds"), "DejaVuSerif-Bold.ttf", 34, 30, True),
    (("Welcome to Berlin",), "DejaVuSans-Bold.ttf", 30, 22, False),
)


def render_all() -> list[TextImage]:
    """The twelve images (raises FileNotFoundError naming a missing font)."""
    return [render(i, *spec) for i, spec in enumerate(SPECS)]


def render(
    index: int, lines: tuple[str, ...], font: str, size: int, margin: int, rotated: bool
) -> TextImage:
    from PIL import Image, ImageDraw, ImageFont

    path = font_path(font)
    if path is None:
        raise FileNotFoundError(
            f"font {font} not found in {FONT_DIRS} (Debian: apt-get install fonts-dejavu-core "
            "fonts-dejavu-extra)"
        )
    face = ImageFont.truetype(str(path), size)
    spacing = size // 2
    boxes = [face.getbbox(line) for line in lines]
    width = max(b[2] - b[0] for b in boxes) + 2 * margin
    height = sum(b[3] - b[1] for b in boxes) + spacing * (len(lines) - 1) + 2 * margin
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    y = margin
    for line, box in zip(lines, boxes):
        draw.text((margin - box[0], y - box[1]), line, font=face, fill=(20, 20, 20))
        y += box[3] - box[1] + spacing
    if rotated:
        canvas = canvas.rotate(180)
    rgb = np.asarray(canvas, dtype=np.uint8)
    return TextImage(f"img{index:02d}", lines, font, size, rotated, rgb[:, :, ::-1].copy())
