"""Host sessions share one activation arena: a model compiled for many input shapes (one
session per shape) holds the largest shape's activations, not the sum of every shape's.
Measured in a fresh process (the arena is process-wide) by its resident memory, with
bench/run_memory.py's run of a three-layer convolution net at six widths."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench" / "run_memory.py"


def test_shapes_share_one_activation_arena(tmp_path: Any) -> None:
    """Six input widths 1 x 3 x 512 x 1024-704, the largest first: one activation of the
    largest is 32 x 512 x 1024 float32 = 64 MiB.  With an arena per session, each
    smaller shape's session kept its own activations after its runs: resident memory
    grew by 1.2 GB over the five smaller shapes (measured).  Sharing one arena, they
    reuse what the largest shape's runs reserved: 125-130 MB (their graphs and
    compiles) in the same runs."""
    spec = importlib.util.spec_from_file_location("run_memory", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.run("conv", "shared", 1, str(tmp_path))
    assert result["sessions"] == [["1", False]] * 6
    first, last = result["rss"][0], result["rss"][-1]
    assert last - first < 400, result["rss"]
