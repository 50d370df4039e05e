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


#: words the images of many sizes are written with
WORDS = (
    "Invoice", "Total", "Order", "Station", "Road", "Cambridge", "Berlin", "Welcome",
    "Graphcore", "Paddle", "Model", "compiled", "seconds", "Temperature", "quick", "brown",
    "jumps", "lazy", "Sale", "OPEN", "Monday", "Friday", "Service", "Number", "Date",
    "Amount", "Price", "Hello", "World", "Street", "Avenue", "Receipt", "Tax", "Delivery",
)  # fmt: skip
FONTS = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")


def render_sized(index: int, width: int, height: int) -> TextImage:
    """A text image of exactly ``width`` x ``height`` pixels: one to three lines of
    words (chosen by ``index``) in a font sized to fill about half the height, on white,
    the text block in the top left quarter's corner region."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(index)
    count = int(rng.integers(1, 4)) if height >= 96 else 1
    font = FONTS[index % len(FONTS)]
    path = font_path(font)
    if path is None:
        raise FileNotFoundError(f"font {font} not found in {FONT_DIRS}")
    size = max(12, min(64, int(height * 0.6 / count)))
    lines = []
    for _ in range(count):
        words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, 4)))]
        number = f" {int(rng.integers(10, 999))}" if rng.random() < 0.5 else ""
        lines.append(" ".join(words) + number)
    face = ImageFont.truetype(str(path), size)
    # the lines shortened until they fit the width
    while lines and max(face.getbbox(line)[2] for line in lines) > width * 0.9:
        longest = max(range(len(lines)), key=lambda k: face.getbbox(lines[k])[2])
        words = lines[longest].split()
        if len(words) == 1:
            size = max(8, size - 4)
            face = ImageFont.truetype(str(path), size)
            if size == 8:
                break
        else:
            lines[longest] = " ".join(words[:-1])
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    margin_x = max(2, int(width * 0.04))
    y = max(2, int((height - count * size * 1.3) / 2))
    for line in lines:
        box = face.getbbox(line)
        draw.text((margin_x - box[0], y - box[1]), line, font=face, fill=(20, 20, 20))
        y += int(size * 1.3)
    rgb = np.asarray(canvas, dtype=np.uint8)
    return TextImage(f"sized{index:04d}", tuple(lines), font, size, False, rgb[:, :, ::-1].copy())


def random_sizes(count: int, seed: int = 0) -> list[tuple[int, int]]:
    """``count`` distinct (width, height) pairs, 160-1800 x 48-900 pixels."""
    rng = np.random.default_rng(seed)
    out: dict[tuple[int, int], None] = {}
    while len(out) < count:
        out[(int(rng.integers(160, 1801)), int(rng.integers(48, 901)))] = None
    return list(out)
