"""ONNX Runtime's private interface, as paddle-ipu uses it (checked on 1.32.0).

``InferenceSession.run`` re-checks the input names and builds its output list in Python
on every call; the executor has already validated the feed, so the host backend calls the
binding under it (``InferenceSession._sess.run``) directly.  The public ``run`` is the
fallback, chosen when the binding is missing or its signature changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu._internals import fallback_used, interface, signature_of

CHECKED_ON = "1.32.0"
_DEP = "onnxruntime"

# run(self, names: Sequence[str], feeds: Mapping[str, object], options: RunOptions) -> list
_RUN_SIGNATURE = re.compile(
    r"^run\(self: \S+, arg0: \S*\[str\], arg1: \S*\[str, object\], arg2: \S*RunOptions\)"
    r" -> list$"
)
_warned = False

Runner = Callable[[Sequence[str], Mapping[str, np.ndarray]], list[Any]]


def fast_run(session: Any) -> Runner:
    """``run(output_names, feed) -> list of arrays`` for an ``InferenceSession``: the
    binding under ``InferenceSession.run`` when it is the one checked, else the public
    ``run``."""
    global _warned
    binding = getattr(session, "_sess", None)
    run = getattr(binding, "run", None)
    signature = signature_of(run) if run is not None else ""
    if run is not None and _RUN_SIGNATURE.match(signature):
        return lambda names, feed: run(names, feed, None)
    if not _warned:
        _warned = True
        why = f"has signature {signature!r}" if run is not None else "is missing"
        fallback_used(_DEP, "InferenceSession._sess.run", why, "InferenceSession.run")
    return lambda names, feed: session.run(list(names), dict(feed))


@interface(
    _DEP,
    "InferenceSession._sess.run",
    "host inference hot path",
    fallback="InferenceSession.run (re-checks input names per call)",
)
def _probe_run() -> str:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(
        model.SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    run = getattr(getattr(session, "_sess", None), "run", None)
    assert run is not None, "InferenceSession._sess.run is missing"
    signature = signature_of(run)
    assert _RUN_SIGNATURE.match(signature), f"signature changed: {signature}"
    (out,) = fast_run(session)(["y"], {"x": np.array([1, 2], np.float32)})
    assert out.tolist() == [2.0, 4.0]
    return signature
