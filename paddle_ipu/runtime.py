"""Former name of :mod:`paddle_ipu.serving` (the model runtime), kept for imports."""

from __future__ import annotations

from paddle_ipu.serving import MAX_REQUEST_RUNS, ModelRuntime, RuntimeStats

__all__ = ["MAX_REQUEST_RUNS", "ModelRuntime", "RuntimeStats"]
