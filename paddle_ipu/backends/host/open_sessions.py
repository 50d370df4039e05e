"""One session for every input shape made from one open graph.

A model served at many input shapes has a static graph per shape, each made from the
model's *open graph* (:class:`~paddle_ipu.compiler.open_shapes.OpenGraph`: its sizes
symbolic).  On the IPU each shape is its own compile; on the host, ONNX Runtime runs
the open graph itself at any size, and gives what the static graph gives at that size
(the same operators on the same weights).  So the host runs every shape made from one
open graph on one ONNX Runtime session of it, built once per process and thread
setting, and held while the open graph is (the model's package): a new shape costs
its static graph (the output shapes, and the memory check that says whether it fits
an IPU) and no session -- 0.03-0.1 s and 30-60 MB less per shape for PP-OCRv4's
detector and recogniser -- and its runs are the session's.

Each shape keeps its own static graph for what the IPU would decide by it: the
memory check, the shapes of its inputs (a feed of another shape is refused as
before) and outputs (an output of another shape is an error), its exported graph.

Shared only where the session is the graph as compiled, in float32 on ONNX Runtime:
inference (no training, no ``enable_fp16``, no floating-point checks, no distributed
job), ``host_precision="float32"`` and ``host_engine`` ``"auto"`` or
``"onnxruntime"`` (OpenVINO compiles per shape: 0.4-0.6 s and 140-160 MB for that
detector's, measured); any other configuration builds a session per shape as before.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import BackendError
from paddle_ipu.options.values import OptionValues

log = logging.getLogger("paddle_ipu.host")

__all__ = ["shared_session", "shares"]

_lock = threading.Lock()
#: open graph -> {(threads, spin): its prepared session}, dropped with the open graph
_held: weakref.WeakKeyDictionary[Any, dict[tuple[int, bool], Any]] = weakref.WeakKeyDictionary()


def shares(model: CompiledModel, config: SessionConfig) -> bool:
    """Whether ``model``'s session is its open graph's (see the module docstring)."""
    return (
        model.origin is not None
        and not model.weights
        and not config.is_training
        and not config.enable_fp16
        and not config.option("enable_floating_point_checks")
        and not config.option("enable_distribution")
        and str(config.option("host_precision")) == "float32"
        and str(config.option("host_engine")) in ("auto", "onnxruntime")
    )


def shared_session(
    model: CompiledModel,
    config: SessionConfig,
    key: tuple[int, bool],
    make: Callable[[CompiledModel, SessionConfig], Any],
) -> Any:
    """The prepared session of ``model``'s open graph for ``key`` (threads, spin):
    ``make(open model, config)`` builds it (its session built too) the first time;
    None when ONNX Runtime refuses the open graph (said once in the log): each shape
    then builds its own."""
    origin = model.origin
    with _lock:
        held = _held.setdefault(origin, {})
        session = held.get(key)
        if session is None:
            # the open graph has no sizes to check (each shape's graph is checked), and
            # no zero feed to measure OpenVINO on: ONNX Runtime, as the static ones
            options = OptionValues(
                {**config.options, "host_memory_check": "off", "host_engine": "onnxruntime"}
            )
            try:
                session = make(origin.session_model(), dataclasses.replace(config, options=options))
            except BackendError as exc:
                # ONNX Runtime refuses the open graph (a size its converted shape
                # arithmetic leaves unknown that the static graph folds): each shape
                # keeps a session of its own, as on the IPU
                log.info(
                    "input shapes made from one open graph each build a session: ONNX "
                    "Runtime does not run the open graph (%s)",
                    str(exc).splitlines()[0][:300],
                )
                session = False
            held[key] = session
        return session or None
