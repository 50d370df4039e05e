"""Saved inference models and compiled packages for the serving, CLI and predictor
tests (tests/models.py programs saved with paddle.static.save_inference_model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
from models import Built


def save(built: Built, directory: Path, name: str = "model") -> str:
    """Save ``built`` as an inference model; return its path prefix."""
    prefix = str(directory / name)
    feeds = [
        op.result(0)
        for op in built.main.global_block().ops
        if op.name() == "pd_op.data" and op.attrs()["name"] in built.feeds
    ]
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(built.scope):
        paddle.static.save_inference_model(prefix, feeds, built.fetches, exe, program=built.main)
    return prefix


def reference(built: Built, feed: dict[str, np.ndarray]) -> np.ndarray:
    """Paddle's own CPU executor on the original program: the oracle."""
    return built.run_cpu(feed)[0]
