"""The KServe v2 datatype table of the compiled core (``_core.kserve_datatypes``, the one
table the C++ front end and ``serving/runtime.py`` use), checked
against the protocol's own table of tensor data types, numpy, and tritonclient's
conversions (a real client's)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paddle_ipu import _core
from paddle_ipu.serving import runtime

#: The Open Inference Protocol's "Tensor Data Types" table: name -> size in bytes
#: (https://kserve.github.io/website/0.10/modelserving/data_plane/v2_protocol/); BYTES
#: (variable size, up to 2**32: only dynamic models take it, serving/dynamic.py) and BF16
#: (no numpy dtype) are not in the table of fixed-size datatypes.
SPEC = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BYTES": None,
    "BF16": 2,
}
NOT_SERVED = {"BYTES", "BF16"}

ROWS = _core.kserve_datatypes()


def test_the_rows_are_name_numpy_name_and_size() -> None:
    assert isinstance(ROWS, tuple) and ROWS
    for row in ROWS:
        assert isinstance(row, tuple) and len(row) == 3, row
        v2, numpy_name, size = row
        assert isinstance(v2, str) and isinstance(numpy_name, str) and isinstance(size, int)


def test_the_table_is_the_protocols_fixed_size_datatypes() -> None:
    table = {v2: size for v2, _, size in ROWS}
    assert len(table) == len(ROWS), "a datatype is listed twice"
    assert table == {name: size for name, size in SPEC.items() if name not in NOT_SERVED}


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_numpy_agrees(row: tuple[str, str, int]) -> None:
    _, numpy_name, size = row
    dtype = np.dtype(numpy_name)
    assert dtype.name == numpy_name  # numpy's canonical name, as FeedError spells it
    assert dtype.itemsize == size
    assert len({np.dtype(n) for _, n, _ in ROWS}) == len(ROWS), "two rows share a numpy dtype"


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_tritonclient_agrees(row: tuple[str, str, int]) -> None:
    utils = pytest.importorskip("tritonclient.utils")
    v2, numpy_name, _ = row
    assert np.dtype(utils.triton_to_np_dtype(v2)) == np.dtype(numpy_name)
    assert utils.np_to_triton_dtype(np.dtype(numpy_name)) == v2


def test_the_python_side_reads_the_table() -> None:
    pairs = {(v2, np.dtype(n)) for v2, n, _ in ROWS}
    assert {(v2, d) for d, v2 in runtime._NUMPY_TO_V2.items()} == pairs


def test_the_cpp_parser_names_the_table_for_an_unknown_datatype() -> None:
    queue = _core.ServingQueue([np.zeros((4, 2), np.float32)], [4], 4, 16, 0.002, True)
    plan = _core.ServingPlan(
        name="m", version="1", server_version="0", auto_batch=True,
        max_rows=4, capacity=4, limit=16, micro_batch_size=4,
        batch_timeout_us=2000.0, request_timeout_s=0.0, max_body=1 << 20,
        inputs=[_core.ServingTensor(name="x", datatype="FP32", shape=[-1, 2], unit_bytes=8)],
        outputs=[_core.ServingTensor(name="y", datatype="FP32", shape=[-1, 1], unit_bytes=4)],
    )  # fmt: skip
    fe = _core.ServingFrontEnd(queue, plan)
    try:
        body = {"inputs": [{"name": "x", "datatype": "BF16", "shape": [1, 2], "data": [1, 2]}]}
        status, message, parsed = fe.parse_http(json.dumps(body).encode())
        assert (status, parsed) == (400, None)
        listed = ", ".join(repr(v2) for v2, _, _ in ROWS)
        assert message == (
            f"input 'x': datatype 'BF16' is not supported; use FP32 (one of [{listed}])"
        )
        # BYTES is a datatype the server knows (dynamic models take it); a fixed
        # model's FP32 input does not.
        body = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
        status, message, parsed = fe.parse_http(json.dumps(body).encode())
        assert (status, parsed) == (400, None)
        assert message == (
            "input 'x': expected datatype FP32, received BYTES (the model takes FP32, FP16, FP64)"
        )
    finally:
        fe.shutdown()
        queue.close()
