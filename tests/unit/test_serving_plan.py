"""The server's plan crosses to C++ as a typed class (``_core.ServingPlan``), checked at
the boundary: a wrong type is a TypeError naming the signature, a value the protocol
code would misread a ValueError naming the field; a valid plan reads back as made."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from paddle_ipu import _core


def tensor(**kw: Any) -> Any:
    fields: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": [-1, 4], "unit_bytes": 16}
    return _core.ServingTensor(**{**fields, **kw})


def plan(**kw: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "m",
        "version": "1",
        "server_version": "0",
        "auto_batch": True,
        "max_rows": 8,
        "capacity": 4,
        "limit": 16,
        "micro_batch_size": 4,
        "batch_timeout_us": 2000.0,
        "request_timeout_s": 0.0,
        "max_body": 1 << 20,
        "inputs": [tensor()],
        "outputs": [tensor(name="y", shape=[-1, 3], unit_bytes=12)],
    }
    return _core.ServingPlan(**{**fields, **kw})


def test_a_plan_reads_back_as_made_and_serves() -> None:
    rng = _core.ServingRange(low=0, high=5, allowed=[-100], column=None, describe="[0, 5)")
    ids = tensor(name="ids", datatype="INT32", shape=[-1, 2], unit_bytes=8, ranges=[rng])
    p = plan(inputs=[tensor(), ids], instance_count=2, instance_kind="KIND_MODEL")
    assert (p.name, p.capacity, p.limit, p.instance_count, p.dynamic) == ("m", 4, 16, 2, False)
    assert [(t.name, t.datatype, t.shape, t.unit_bytes) for t in p.inputs] == [
        ("x", "FP32", [-1, 4], 16),
        ("ids", "INT32", [-1, 2], 8),
    ]
    assert (p.inputs[1].ranges[0].high, p.inputs[1].ranges[0].column) == (5, None)
    queue = _core.ServingQueue(
        [np.zeros((4, 4), np.float32), np.zeros((4, 2), np.int32)], [12], 4, 16, 0.002, True
    )
    fe = _core.ServingFrontEnd(queue, p)
    try:
        status, message, _ = fe.parse_http(
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},'
            b' {"name": "ids", "datatype": "INT32", "shape": [1, 2], "data": [1, 7]}]}'
        )
        # the range made in Python is the one the parser checks against
        assert status == 400 and "[0, 5)" in message, message
    finally:
        fe.close()
        queue.close()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"capacity": 0}, "capacity must be >= 1, got 0"),
        ({"limit": -1}, "limit must be >= 1, got -1"),
        ({"batch_timeout_us": -0.5}, "batch_timeout_us must be >= 0, got -0.5"),
        ({"name": ""}, "name and version must be non-empty"),
        ({"instance_kind": "KIND_GPU"}, "instance_kind must be KIND_CPU or KIND_MODEL"),
        ({"inputs": [tensor(unit_bytes=12)]}, "tensor 'x': unit_bytes 12 is not the bytes"),
        ({"inputs": [tensor(shape=[-1, -1])]}, "tensor 'x': dimension 1 is -1"),
        ({"auto_batch": False}, "tensor 'x': dimension 0 is -1"),
        ({"dynamic": True}, "a dynamic model does not auto-batch"),
    ],
)
def test_a_bad_plan_is_a_value_error_naming_the_field(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match="ServingPlan: ") as info:
        plan(**change)
    assert words in str(info.value), info.value


def test_a_wrong_type_or_datatype_is_refused_at_the_boundary() -> None:
    with pytest.raises(TypeError, match="capacity"):
        plan(capacity="4")
    with pytest.raises(TypeError):
        plan(inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 4], "unit_bytes": 16}])
    with pytest.raises(ValueError, match="unknown KServe datatype 'FP128'"):
        tensor(datatype="FP128")
    with pytest.raises(ValueError, match="low 5 > high 0"):
        _core.ServingRange(low=5, high=0, allowed=[], column=None, describe="")


def test_a_dynamic_plan_takes_open_axes() -> None:
    p = plan(
        auto_batch=False,
        max_rows=0,
        capacity=1,
        micro_batch_size=0,
        dynamic=True,
        workers=2,
        inputs=[tensor(shape=[-1, -1], unit_bytes=0)],
        outputs=[tensor(name="y", datatype="BYTES", shape=[-1], unit_bytes=0)],
    )
    assert (p.dynamic, p.workers, p.inputs[0].shape) == (True, 2, [-1, -1])
