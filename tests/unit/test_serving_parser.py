"""The KServe v2 request parsers of the C++ front end (csrc/serving/http_request.cc and
grpc_request.cc), without a model or a server: what a request's inputs become (the
bytes the queue reads, checked against numpy's own conversions), the checks the model
runtime makes (dtype casts, the int32 fit, shapes, index ranges), and the error
messages naming the input.  gRPC
requests are built with tritonclient's generated protobuf messages."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_ipu import _core

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

RANGE = {"low": 0, "high": 5, "allowed": [-100], "column": None, "describe": "[0, 5) (ids)"}


def front(auto: bool = True, max_rows: int = 32, ranges: bool = False) -> Any:
    """x: FP32 [rows, 4]; ids: INT32 [rows, 2] (index range [0, 5) or -100);
    y: FP32 [rows, 3]; micro-batch 8."""
    mbs = 8
    steps = [np.zeros((mbs, 4), np.float32), np.zeros((mbs, 2), np.int32)]
    if not auto:  # one unit is a whole micro-batch
        steps = [s.reshape(1, -1) for s in steps]
    capacity = mbs if auto else 1
    unit = 1 if auto else mbs
    queue = _core.ServingQueue(
        steps, [3 * 4 * unit], capacity, 4 * capacity, 0.002 if auto else 0.0, auto
    )
    lead = -1 if auto else mbs
    plan = _core.ServingPlan(
        name="m",
        version="1",
        server_version="0",
        auto_batch=auto,
        max_rows=max_rows,
        capacity=capacity,
        limit=4 * capacity,
        micro_batch_size=mbs,
        batch_timeout_us=2000.0,
        request_timeout_s=0.0,
        max_body=1 << 20,
        inputs=[
            _core.ServingTensor(name="x", datatype="FP32", shape=[lead, 4], unit_bytes=16 * unit),
            _core.ServingTensor(
                name="ids",
                datatype="INT32",
                shape=[lead, 2],
                unit_bytes=8 * unit,
                ranges=[_core.ServingRange(**RANGE)] if ranges else [],
            ),
        ],
        outputs=[
            _core.ServingTensor(name="y", datatype="FP32", shape=[lead, 3], unit_bytes=12 * unit)
        ],
    )
    return _core.ServingFrontEnd(queue, plan)


def tensor(name: str, a: np.ndarray, datatype: str, binary: bool = False) -> dict[str, Any]:
    item: dict[str, Any] = {"name": name, "shape": list(a.shape), "datatype": datatype}
    if binary:
        item["parameters"] = {"binary_data_size": a.nbytes}
    else:
        item["data"] = a.tolist()
    return item


def parse(fe: Any, *items: dict[str, Any], blob: bytes = b"", **doc: Any) -> tuple[Any, ...]:
    head = json.dumps({"inputs": list(items), **doc}).encode()
    return tuple(fe.parse_http(head, blob))


def ok(result: tuple[Any, ...]) -> dict[str, Any]:
    status, message, parsed = result
    assert status == 0, message
    return dict(parsed)


X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
IDS = np.array([[0, 1], [2, 3], [4, -100]], np.int32)


def test_json_and_binary_tensors_become_the_same_bytes() -> None:
    fe = front()
    as_json = ok(parse(fe, tensor("x", X, "FP32"), tensor("ids", IDS, "INT32")))
    as_binary = ok(
        parse(
            fe,
            tensor("ids", IDS, "INT32", binary=True),
            tensor("x", X, "FP32", binary=True),
            blob=IDS.tobytes() + X.tobytes(),
        )
    )
    for parsed in (as_json, as_binary):
        assert parsed["units"] == 3 and parsed["rows"] == 3
        assert parsed["inputs"] == [X.tobytes(), IDS.tobytes()]  # in the model's order


@pytest.mark.parametrize(
    ("given", "datatype"),
    [
        (X.astype(np.float64) + 1e-9, "FP64"),
        (X.astype(np.float16), "FP16"),
    ],
)
def test_float_casts_are_numpys(given: np.ndarray, datatype: str) -> None:
    fe = front()
    for binary in (False, True):
        parsed = ok(
            parse(
                fe,
                tensor("x", given, datatype, binary),
                tensor("ids", IDS, "INT32"),
                blob=given.tobytes() if binary else b"",
            )
        )
        assert parsed["inputs"][0] == given.astype(np.float32).tobytes()


@pytest.mark.parametrize("datatype", ["INT64", "BOOL"])
def test_integer_casts_are_numpys(datatype: str) -> None:
    fe = front()
    given = IDS.astype(np.int64) if datatype == "INT64" else (IDS % 2).astype(np.bool_)
    parsed = ok(
        parse(
            fe,
            tensor("x", X, "FP32"),
            tensor("ids", given, datatype, binary=True),
            blob=given.tobytes(),
        )
    )
    assert parsed["inputs"][1] == given.astype(np.int32).tobytes()


def test_int64_that_does_not_fit_int32_is_refused() -> None:
    big = IDS.astype(np.int64)
    big[1, 0] = 2**40
    status, message, _ = parse(front(), tensor("x", X, "FP32"), tensor("ids", big, "INT64"))
    assert status == 400
    assert message == f"input 'ids': INT64 values in [-100, {2**40}] do not fit the model's INT32"


def test_dtypes_the_runtime_refuses_are_refused() -> None:
    fe = front()
    status, message, _ = parse(fe, tensor("x", X.astype(np.int32), "INT32"))
    assert status == 400
    assert (
        message
        == "input 'x': expected datatype FP32, received INT32 (the model takes FP32, FP16, FP64)"
    )
    status, message, _ = parse(fe, {"name": "x", "shape": [1, 4], "datatype": "BYTES", "data": []})
    # BYTES is a datatype the server knows (dynamic models take it), not this model's.
    assert status == 400 and message.startswith("input 'x': expected datatype FP32, received BYTES")
    status, message, _ = parse(fe, {"name": "x", "shape": [1, 4], "datatype": "BF16", "data": []})
    assert status == 400 and message.startswith("input 'x': datatype 'BF16' is not supported")


def test_shapes() -> None:
    fe = front(max_rows=4)
    status, message, _ = parse(fe, tensor("x", X[:, :3], "FP32"), tensor("ids", IDS, "INT32"))
    assert status == 400
    assert message.startswith("input 'x': expected shape [rows, 4] (any number of rows")
    assert message.endswith("received [3, 3]")
    status, message, _ = parse(fe, tensor("x", X, "FP32"), tensor("ids", IDS[:2], "INT32"))
    assert status == 400 and message.startswith("inputs 'x' and 'ids' have 3 and 2 rows")
    five = np.zeros((5, 4), np.float32)
    status, message, _ = parse(fe, tensor("x", five, "FP32"), tensor("ids", IDS, "INT32"))
    assert status == 400 and "at most 4 rows (max_request_rows), received 5" in message
    # without auto-batching a request is one micro-batch exactly
    fe = front(auto=False)
    status, message, _ = parse(fe, tensor("x", X, "FP32"), tensor("ids", IDS, "INT32"))
    assert status == 400 and "exactly one micro-batch: expected 8 rows, received 3" in message
    x8, ids8 = np.zeros((8, 4), np.float32), np.zeros((8, 2), np.int32)
    parsed = ok(parse(fe, tensor("x", x8, "FP32"), tensor("ids", ids8, "INT32")))
    assert parsed["units"] == 1 and parsed["rows"] == 8


def test_index_ranges_are_checked_and_named() -> None:
    fe = front(ranges=True)
    ok(parse(fe, tensor("x", X, "FP32"), tensor("ids", IDS, "INT32")))  # -100 is allowed
    bad = IDS.copy()
    bad[2, 0] = 7
    bad[0, 1] = -3
    status, message, _ = parse(fe, tensor("x", X, "FP32"), tensor("ids", bad, "INT32"))
    assert status == 400
    assert message == (
        "input 'ids': value -3 at index [0, 1] is out of range; valid values are "
        "[0, 5) (ids); 2 value(s) of the input are outside it"
    )


def test_the_other_mistakes_of_a_request_are_named() -> None:
    fe = front()
    x, ids = tensor("x", X, "FP32"), tensor("ids", IDS, "INT32")
    cases = [
        (parse(fe, x), "missing input 'ids'"),
        (
            parse(fe, x, ids, tensor("z", X, "FP32")),
            "unknown input 'z': the model takes ['ids', 'x']",
        ),
        (parse(fe, x, ids, x), "input 'x' is given twice"),
        (
            parse(fe, x, dict(ids, data=[1, 2])),
            "input 'ids': shape [3, 2] has 6 elements, data has 2",
        ),
        (parse(fe, x, dict(ids, data=[[1.5, 2]] * 3)), "input 'ids': data is not INT32: 1.5"),
        (parse(fe, x, dict(ids, shape=[3, -2])), "input 'ids': shape must be a list of ints >= 0"),
        (
            parse(fe, x, tensor("ids", IDS, "INT32", binary=True), blob=IDS.tobytes()[:-4]),
            "input 'ids': the body ends 4 bytes before this input's binary data",
        ),
        (
            parse(fe, x, tensor("ids", IDS, "INT32", binary=True), blob=IDS.tobytes() + b"\0"),
            "the body has 1 bytes of binary data that no input claims",
        ),
        (
            parse(
                fe,
                x,
                dict(tensor("ids", IDS, "INT32", binary=True), parameters={"binary_data_size": 5}),
                blob=b"\0" * 5,
            ),
            "input 'ids': binary_data_size is 5, but shape [3, 2] of INT32 takes 24 bytes",
        ),
        (parse(fe, x, ids, outputs=[{"name": "q"}]), "unknown output 'q': the model gives ['y']"),
        (
            parse(fe, x, ids, outputs=[{"name": "y"}, {"name": "y"}]),
            "output 'y' is asked for twice",
        ),
        (
            parse(fe, x, ids, parameters={"timeout": "soon"}),
            "parameter 'timeout' must be an integer",
        ),
    ]
    for (status, message, _), want in cases:
        assert status == 400 and message.startswith(want), (message, want)
    assert tuple(fe.parse_http(b"{nope", b""))[:2] == (
        400,
        "the request is not valid JSON: syntax error",
    )
    assert fe.parse_http(b"[]", b"")[1] == 'the request must be a JSON object with an "inputs" list'


def test_outputs_and_parameters() -> None:
    fe = front()
    x, ids = tensor("x", X, "FP32"), tensor("ids", IDS, "INT32")
    parsed = ok(
        parse(fe, x, ids, id="r1", parameters={"binary_data_output": True, "timeout": 2500})
    )
    assert parsed["want"] == [0] and parsed["binary"] == [True] and parsed["id"] == "r1"
    assert parsed["timeout_s"] == pytest.approx(0.0025)
    parsed = ok(parse(fe, x, ids, outputs=[{"name": "y", "parameters": {"binary_data": False}}]))
    assert parsed["binary"] == [False] and parsed["timeout_s"] == -1


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ({"priority": 0, "sequence_id": 0, "sequence_start": False, "sequence_end": False}, None),
        ({"sequence_id": ""}, None),
        ({"priority": 2}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"sequence_id": 9}, "sequence_id"),
        ({"sequence_id": "s"}, "sequence_id"),
        ({"sequence_start": True}, "sequence_start"),
        ({"sequence_end": True}, "sequence_end"),
        ({"custom": 0}, "custom"),
        ({"timeout": 10, "triton_enable_empty_final_response": True}, "triton_enable_empty_"),
    ],
)
def test_parameters_not_implemented_are_refused_by_name(
    parameters: dict[str, Any], refused: str | None
) -> None:
    fe = front()
    x, ids = tensor("x", X, "FP32"), tensor("ids", IDS, "INT32")
    request = grpc_request(x=(X, "FP32"), ids=(IDS, "INT32"))
    for key, value in parameters.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        elif isinstance(value, float):
            request.parameters[key].double_param = value
        elif isinstance(value, str):
            request.parameters[key].string_param = value
    for result in (
        parse(fe, x, ids, parameters=parameters),
        fe.parse_grpc(request.SerializeToString()),
    ):
        if refused is None:
            ok(result)
            continue
        status, message, _ = result
        assert status == 400 and message.startswith(f"parameter '{refused}")
        assert "is not implemented" in message


def grpc_request(**inputs: tuple[np.ndarray, str]) -> Any:
    request = service_pb2.ModelInferRequest(model_name="m", id="g")
    for name, (array, datatype) in inputs.items():
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
        del tensor
    return request


def test_grpc_raw_and_typed_contents() -> None:
    fe = front()
    request = grpc_request(x=(X, "FP32"), ids=(IDS.astype(np.int64), "INT64"))
    status, message, parsed = fe.parse_grpc(request.SerializeToString())
    assert status == 0, message
    assert parsed["inputs"] == [X.tobytes(), IDS.tobytes()] and parsed["id"] == "g"
    typed = service_pb2.ModelInferRequest(model_name="m")
    t = typed.inputs.add(name="x", datatype="FP32", shape=[3, 4])
    t.contents.fp32_contents.extend(X.reshape(-1).tolist())
    t = typed.inputs.add(name="ids", datatype="INT32", shape=[3, 2])
    t.contents.int_contents.extend(IDS.reshape(-1).tolist())
    typed.outputs.add(name="y")
    status, message, parsed = fe.parse_grpc(typed.SerializeToString())
    assert status == 0, message
    assert parsed["inputs"] == [X.tobytes(), IDS.tobytes()] and parsed["want"] == [0]


def test_grpc_errors() -> None:
    fe = front()
    request = grpc_request(x=(X, "FP32"), ids=(IDS, "INT32"))
    request.model_name = "other"
    assert fe.parse_grpc(request.SerializeToString())[:2] == (
        404,
        "unknown model 'other': this server serves 'm'",
    )
    request = grpc_request(x=(X[:, :2].copy(), "FP32"), ids=(IDS, "INT32"))
    status, message, _ = fe.parse_grpc(request.SerializeToString())
    assert status == 400 and message.startswith("input 'x': expected shape [rows, 4]")
    request = grpc_request(x=(X, "FP32"), ids=(IDS, "INT32"))
    request.raw_input_contents[1] = IDS.tobytes()[:-1]
    status, message, _ = fe.parse_grpc(request.SerializeToString())
    assert status == 400
    assert message == "input 'ids': shape [3, 2] of INT32 takes 24 bytes, received 23"
    assert fe.parse_grpc(b"\xff\xff")[:2] == (
        400,
        "the ModelInferRequest is not a valid protobuf message",
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_refused_not_crashed_on(data: bytes) -> None:
    fe = front(ranges=True)
    status, message, _ = fe.parse_grpc(data)
    assert status in (400, 404) and message
    status, message, _ = fe.parse_http(data, b"")
    assert status == 400 and message
    message.encode("utf-8")  # always text, whatever bytes came in


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_requests_parse_or_are_refused(data: Any) -> None:
    fe = front(ranges=True)
    request = bytearray(grpc_request(x=(X, "FP32"), ids=(IDS, "INT32")).SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(request) - 1))
        request[at] = data.draw(st.integers(0, 255))
    status, message, parsed = fe.parse_grpc(bytes(request))
    if status == 0:  # whatever parsed fits the queue's units exactly
        assert [len(b) for b in parsed["inputs"]] == [16 * parsed["units"], 8 * parsed["units"]]
    else:
        assert status in (400, 404) and message


# -- sizes and values a hostile client sends --------------------------------------------


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ([2**62, 4], "is larger than a 64-bit size can count"),
        ([4, 2**62], "is larger than a 64-bit size can count"),
        ([0, 2**62], "is larger than a 64-bit size can count"),  # numpy would not make it
        ([2**40, 4], "but the request holds"),
        ([0, 2**20], "has no elements, but its other dims take 4194304 bytes"),
    ],
)
def test_shapes_whose_sizes_do_not_fit_are_refused_before_anything_is_allocated(
    shape: list[int], why: str
) -> None:
    fe = front(max_rows=2**62)
    status, message, _ = parse(fe, {"name": "x", "shape": shape, "datatype": "FP32", "data": []})
    assert status == 400 and message.startswith(f"input 'x': shape {shape}") and why in message
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP64", shape=shape)
    request.raw_input_contents.append(b"\0" * 8)
    status, message, _ = fe.parse_grpc(request.SerializeToString())
    assert status == 400 and message.startswith(f"input 'x': shape {shape}"), message


def test_a_byte_size_that_wraps_is_refused() -> None:
    # 8 bytes x (2**61 + 1) elements is 8 in 64-bit arithmetic
    shape = [2**61 + 1, 4]
    head = {"name": "x", "shape": shape, "datatype": "FP64", "parameters": {"binary_data_size": 8}}
    status, message, _ = parse(front(max_rows=2**62), head, blob=b"\0" * 8)
    assert status == 400 and message == (
        f"input 'x': shape {shape} of FP64 is larger than a 64-bit size can count"
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1e400", "data is not FP32: a number is too large for any float (even float64)"),
        ("-3.5e38", "data is not FP32: -3.5e+38 is outside float32's range"),
        ("true", "data is not FP32: true is not a float32 value"),
        ('"1"', 'data is not FP32: "1" is not a float32 value'),
    ],
)
def test_float_values_are_numbers_within_range(text: str, want: str) -> None:
    fe = front()
    row = f"[{text}, 0, 0, 0]"
    body = '{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":ROW}]}'.replace(
        "ROW", row
    )
    status, message, _ = fe.parse_http(body.encode(), b"")
    assert status == 400 and message.startswith("input 'x': ") and want in message, message


def test_the_largest_float32_and_the_values_that_round_to_it_are_taken() -> None:
    fe = front()
    x = np.array([[3.4028235e38, -3.4028235e38, 1e-46, 0.5]])
    parsed = ok(parse(fe, tensor("x", x, "FP32"), tensor("ids", IDS[:1], "INT32")))
    assert parsed["inputs"][0] == x.astype(np.float32).tobytes()


@pytest.mark.parametrize(
    ("data", "want"),
    [
        ([[1.0, 2]], "data is not INT32: 1.0 is not a int32 value"),  # Triton's AsInt
        ([[True, 2]], "data is not INT32: true is not a int32 value"),
        ([[2**31, 2]], "data is not INT32: 2147483648 is outside int32's range"),
    ],
)
def test_integer_values_are_integers_within_range(data: list[Any], want: str) -> None:
    fe = front()
    status, message, _ = parse(
        fe,
        tensor("x", X[:1], "FP32"),
        {"name": "ids", "shape": [1, 2], "datatype": "INT32", "data": data},
    )
    assert status == 400 and message == f"input 'ids': {want}"


def test_fp16_values_within_its_range() -> None:
    fe = front()
    ids = tensor("ids", IDS[:1], "INT32")
    x = {"name": "x", "shape": [1, 4], "datatype": "FP16", "data": [65504, -65519, 0, 1]}
    parsed = ok(parse(fe, x, ids))
    assert (
        parsed["inputs"][0]
        == np.array([65504, -65519, 0, 1], np.float16).astype(np.float32).tobytes()
    )
    status, message, _ = parse(fe, dict(x, data=[65520, 0, 0, 0]), ids)
    assert (
        status == 400 and message == "input 'x': data is not FP16: 65520 is outside float16's range"
    )


@pytest.mark.parametrize(
    ("data", "want"),
    [
        ([[1, 2, 3, 4], [1, 2, 3]], "data is ragged: its lists at depth 1 have 4 and 3 elements"),
        ([[1, 2, 3, 4], 5], "data is ragged: it mixes lists and values at depth 1"),
        ([1, [2, 3, 4, 5]], "data is ragged: it mixes lists and values at depth 1"),
        ([[1, 2], [3, 4], [5, 6], [7, 8]], "data nested as [4, 2] does not fit shape [2, 4]"),
        ([[[1, 2, 3, 4]], [[5, 6, 7, 8]]], "data nested as [2, 1, 4] does not fit shape [2, 4]"),
        (5, "shape [2, 4] has 8 elements, data has 1"),
    ],
)
def test_data_is_flat_or_nested_as_the_shape(data: Any, want: str) -> None:
    fe = front()
    ids = tensor("ids", IDS[:2], "INT32")
    status, message, _ = parse(
        fe, {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": data}, ids
    )
    assert status == 400 and message.startswith(f"input 'x': {want}"), message
    flat = ok(parse(fe, dict(tensor("x", X[:2], "FP32"), data=X[:2].reshape(-1).tolist()), ids))
    nested = ok(parse(fe, tensor("x", X[:2], "FP32"), ids))
    assert flat["inputs"] == nested["inputs"]


def test_binary_values_the_model_dtype_cannot_hold_are_refused() -> None:
    fe = front()
    x = X.astype(np.float64)
    x[1, 2] = -1e300
    status, message, _ = parse(
        fe, tensor("x", x, "FP64", binary=True), tensor("ids", IDS, "INT32"), blob=x.tobytes()
    )
    assert status == 400 and message == (
        "input 'x': FP64 value -1.0000000000000001e+300 at index [1, 2] does not fit the "
        "model's FP32 (largest finite value 3.4028235e+38)"
    )
    flags = np.array([[0, 1], [1, 0], [2, 1]], np.uint8)  # BOOL bytes: only 0 and 1
    status, message, _ = parse(
        fe,
        tensor("x", X, "FP32"),
        dict(tensor("ids", flags.astype(np.bool_), "BOOL", binary=True)),
        blob=flags.tobytes(),
    )
    assert status == 400 and message == (
        "input 'ids': BOOL value 2 at index [2, 0] is neither 0 (false) nor 1 (true)"
    )
    request = grpc_request(x=(x, "FP64"), ids=(IDS, "INT32"))
    status, message, _ = fe.parse_grpc(request.SerializeToString())
    assert status == 400 and "FP64 value -1.0000000000000001e+300 at index [1, 2]" in message
