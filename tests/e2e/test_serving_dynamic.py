"""Dynamic models of the C++ server (paddle_ipu/serving/dynamic.py): requests of any
shape and BYTES tensors, parsed in C++ and handed to a Python handler.

Real clients (tritonclient http and grpc, raw HTTP): against a small Python handler
served in this process, and against a model saved with open image dimensions served by
``paddle-ipu serve`` in its own process, whose answers equal Paddle's CPU executor."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs
from support.serving_models import ServerProcess, raw

from paddle_ipu.errors import FeedError, OptionError
from paddle_ipu.serving.dynamic import FunctionModel, TensorSpec
from paddle_ipu.serving.server import InferenceServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")


def _strings(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    text = feed["text"]
    if any(b"!" in t for t in text.reshape(-1)):
        raise FeedError("input 'text': '!' is not taken")
    upper = np.array([t.upper() for t in text.reshape(-1)], dtype=object).reshape(text.shape)
    lengths = np.array([len(t) for t in text.reshape(-1)], np.int64).reshape(text.shape)
    return {"upper": upper, "length": lengths, "total": feed["pixels"].astype(np.int64).sum(-1)}


_INPUTS = [TensorSpec("text", "BYTES", (-1,)), TensorSpec("pixels", "UINT8", (-1, 3))]
_OUTPUTS = [
    TensorSpec("upper", "BYTES", (-1,)),
    TensorSpec("length", "INT64", (-1,)),
    TensorSpec("total", "INT64", (-1,)),
]


@pytest.fixture
def strings() -> Iterator[InferenceServer]:
    model = FunctionModel(_strings, _INPUTS, _OUTPUTS)
    srv = InferenceServer(model, name="strings", port=0, grpc_port=0).start()
    try:
        yield srv
    finally:
        srv.stop()


TEXT = np.array([b"abc", b"", "h\u00e9llo w\u00f6rld".encode(), b"x" * 300, b"z\0"], dtype=object)
PIXELS = np.array([[1, 2, 250], [0, 0, 255], [7, 8, 9], [255, 255, 255], [3, 0, 1]], np.uint8)


def _want() -> dict[str, np.ndarray]:
    return _strings({"text": TEXT, "pixels": PIXELS})


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bytes_and_uint8_over_http(strings: InferenceServer, binary: bool) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{strings.port}")
    text = httpclient.InferInput("text", list(TEXT.shape), "BYTES")
    text.set_data_from_numpy(TEXT, binary_data=binary)
    pixels = httpclient.InferInput("pixels", list(PIXELS.shape), "UINT8")
    pixels.set_data_from_numpy(PIXELS, binary_data=binary)
    outs = [httpclient.InferRequestedOutput(s.name, binary_data=binary) for s in _OUTPUTS]
    answer = client.infer("strings", [text, pixels], outputs=outs)
    want = _want()
    upper = answer.as_numpy("upper")
    # JSON carries strings (tritonclient gives str), the binary extension bytes.
    got = [u.encode() if isinstance(u, str) else u for u in upper.reshape(-1)]
    assert got == list(want["upper"])
    np.testing.assert_array_equal(answer.as_numpy("length"), want["length"])
    np.testing.assert_array_equal(answer.as_numpy("total"), want["total"])


def test_bytes_and_uint8_over_grpc(strings: InferenceServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{strings.grpc_port}")
    text = grpcclient.InferInput("text", list(TEXT.shape), "BYTES")
    text.set_data_from_numpy(TEXT)
    pixels = grpcclient.InferInput("pixels", list(PIXELS.shape), "UINT8")
    pixels.set_data_from_numpy(PIXELS)
    answer = client.infer("strings", [text, pixels])
    want = _want()
    assert list(answer.as_numpy("upper")) == list(want["upper"])
    np.testing.assert_array_equal(answer.as_numpy("length"), want["length"])
    np.testing.assert_array_equal(answer.as_numpy("total"), want["total"])
    meta = client.get_model_metadata("strings", as_json=True)
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [
        ("text", "BYTES"),
        ("pixels", "UINT8"),
    ]


def _post(srv: InferenceServer, doc: dict[str, Any]) -> tuple[int, dict[str, str], dict]:
    status, headers, body = raw(srv, "POST", "/v2/models/strings/infer", json.dumps(doc).encode())
    return status, headers, json.loads(body or b"{}")


def _request(text: list[Any], pixels: list[list[int]] | None = None) -> dict[str, Any]:
    pixels = pixels if pixels is not None else [[0, 0, 0]] * len(text)
    return {
        "inputs": [
            {"name": "text", "shape": [len(text)], "datatype": "BYTES", "data": text},
            {"name": "pixels", "shape": [len(pixels), 3], "datatype": "UINT8", "data": pixels},
        ]
    }


def test_bad_requests_are_refused_by_name(strings: InferenceServer) -> None:
    status, _, doc = _post(strings, _request(["a", 3]))
    assert status == 400 and "input 'text'" in doc["error"], doc
    assert "3 is not a string value" in doc["error"], doc
    doc = _request(["a"])
    doc["inputs"][1]["shape"] = [1, 4]
    doc["inputs"][1]["data"] = [[1, 2, 3, 4]]
    status, _, answer = _post(strings, doc)
    assert status == 400 and "expected shape [-1, 3]" in answer["error"], answer
    status, _, doc = _post(strings, _request(["a"], [[1, 2, 256]]))
    assert status == 400 and "input 'pixels'" in doc["error"], doc
    # The handler's own refusal (a FeedError: bad input) is a 400 naming it.
    status, _, doc = _post(strings, _request(["no!"]))
    assert status == 400 and "'!' is not taken" in doc["error"], doc
    # The binary extension: BYTES elements are length-prefixed; a size that cuts one
    # is refused.
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 6},
                },
                {"name": "pixels", "shape": [1, 3], "datatype": "UINT8", "data": [1, 2, 3]},
            ]
        }
    ).encode()
    blob = (5).to_bytes(4, "little") + b"ab"
    status, _, body = raw(
        strings,
        "POST",
        "/v2/models/strings/infer",
        head + blob,
        {"Inference-Header-Content-Length": str(len(head))},
    )
    assert status == 400 and b"length-prefixed" in body, body


def test_a_handler_that_fails_or_answers_wrongly_is_a_500() -> None:
    def broken(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if feed["x"].shape[0] == 1:
            raise RuntimeError("boom")
        return {"y": feed["x"].astype(np.float64)}  # the model declares FP32

    model = FunctionModel(
        broken, [TensorSpec("x", "FP32", (-1,))], [TensorSpec("y", "FP32", (-1,))]
    )
    srv = InferenceServer(model, name="broken", port=0).start()
    try:
        for n, words in ((1, "boom"), (2, "its handler gave float64")):
            doc = {"inputs": [{"name": "x", "shape": [n], "datatype": "FP32", "data": [0.0] * n}]}
            status, _, body = raw(srv, "POST", "/v2/models/broken/infer", json.dumps(doc).encode())
            assert status == 500 and words in json.loads(body)["error"], body
    finally:
        srv.stop()


def test_the_queue_bound_the_timeout_and_a_client_gone() -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(int(feed["x"][0]))
        release.wait(30)
        return {"y": feed["x"]}

    model = FunctionModel(
        slow, [TensorSpec("x", "INT32", (1,))], [TensorSpec("y", "INT32", (1,))], workers=1
    )
    srv = InferenceServer(model, name="slow", port=0, request_timeout_ms=300)
    srv.add_model(FunctionModel(slow, model.inputs, model.outputs), "bounded", queue_limit=1)
    srv.start()

    def body(v: int) -> bytes:
        return json.dumps(
            {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [v]}]}
        ).encode()

    try:
        # The request timeout: the handler does not answer within 300 ms: 504.
        t0 = time.monotonic()
        status, _, answer = raw(srv, "POST", "/v2/models/slow/infer", body(1))
        assert status == 504 and b"did not answer within the request's timeout" in answer
        assert 0.25 < time.monotonic() - t0 < 10
        # The bound: one request in flight; the next is refused at once with Retry-After.
        first = threading.Thread(
            target=raw, args=(srv, "POST", "/v2/models/bounded/infer", body(2))
        )
        first.start()
        deadline = time.monotonic() + 10
        while 2 not in calls and time.monotonic() < deadline:
            time.sleep(0.01)
        status, headers, answer = raw(srv, "POST", "/v2/models/bounded/infer", body(3))
        assert status == 503 and "Retry-After" in headers, answer
        assert b"1 of 1 requests in flight" in answer
        # A client that goes away while its request waits: dropped, counted.
        sock = socket.create_connection(("127.0.0.1", srv.port))
        b = body(4)
        sock.sendall(
            b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(b)}\r\n\r\n".encode()
            + b
        )
        time.sleep(0.1)
        sock.close()
        # The handler stays blocked until the server has seen the client go (under
        # load the close can take a while to be read; a released handler would answer
        # first, and there would be no one left to drop).
        deadline = time.monotonic() + 30
        counts: dict[tuple[str, str], float] = {}
        while time.monotonic() < deadline:
            counts = _counters(raw(srv, "GET", "/metrics")[2].decode())
            if counts.get(("paddle_ipu_disconnected_total", "slow")):
                break
            time.sleep(0.05)
        release.set()
        first.join(30)
        counts = _counters(raw(srv, "GET", "/metrics")[2].decode())
    finally:
        release.set()
        srv.stop()
    assert counts[("paddle_ipu_disconnected_total", "slow")] == 1
    assert counts[("paddle_ipu_timed_out_total", "slow")] == 1
    assert counts[("paddle_ipu_rejected_total", "bounded")] == 1
    assert calls == [1, 2, 4] or calls == [1, 2], calls  # 4: taken before its client left


def _counters(text: str) -> dict[tuple[str, str], float]:
    """/metrics' samples: (name, model label) -> value."""
    out = {}
    for line in text.splitlines():
        found = re.match(r'(\w+)\{[^}]*model="([^"]*)"[^}]*\} (\S+)$', line)
        if found:
            out[(found[1], found[2])] = float(found[3])
    return out


def test_add_model_refuses_what_it_cannot_serve() -> None:
    srv = InferenceServer(port=0)
    with pytest.raises(Exception, match="no model this server serves"):
        srv.add_model(object(), "x")
    model = FunctionModel(_strings, _INPUTS, _OUTPUTS)
    with pytest.raises(OptionError, match="queue_limit"):
        srv.add_model(model, "x", queue_limit=0)
    model.close()


def _detector_like() -> tuple[Any, Any]:
    """An OCR detector's open input ``[-1, 3, -1, -1]`` (as in
    tests/conformance/test_open_shapes.py): a strided conv, a squeeze-excite block, a
    nearest upsampling, an adaptive pooling."""
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 8, 3, stride=2, padding=1)(x))
    se = paddle.nn.functional.adaptive_avg_pool2d(h, [1, 1])
    h = h * paddle.nn.functional.hardsigmoid(paddle.nn.Conv2D(8, 8, 1)(se))
    up = paddle.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest")
    pooled = paddle.nn.functional.adaptive_avg_pool2d(up, [3, 5])
    return x, [up, paddle.reshape(pooled, [paddle.shape(pooled)[0], -1])]


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [True, False], ids=["a-shape-compiled-ahead", "none-compiled"])
def test_serve_a_model_with_open_image_dimensions_as_paddles_cpu_executor(
    tmp_path: Path, ahead: bool
) -> None:
    """Served with a shape compiled ahead (saved under PIR), or with none (saved as a
    legacy .pdmodel, as trained OCR models ship, on a fresh cache: the metadata from the
    model's declared tensors, every shape compiled on its first request)."""
    guard = paddle.pir_utils.IrGuard() if ahead else paddle.pir_utils.OldIrGuard()
    with guard, fresh_programs(5) as (main, startup, _scope):
        x, fetches = _detector_like()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        prefix = str(tmp_path / "model")
        paddle.static.save_inference_model(prefix, [x], fetches, exe, program=main)

        def cpu(feed: np.ndarray) -> list[np.ndarray]:
            return [np.asarray(v) for v in exe.run(main, feed={"x": feed}, fetch_list=fetches)]

        env = {"PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}
        args = ["--name", "det", "--micro-batch", "2"]
        args += ["--input-shapes", "x:-1x3x32x48"] if ahead else []
        srv = ServerProcess(prefix, *args, env=env)
        try:
            http = httpclient.InferenceServerClient(srv.url)
            grpc = grpcclient.InferenceServerClient(srv.grpc_url)
            meta = http.get_model_metadata("det")
            assert meta["inputs"][0]["shape"] == [-1, 3, -1, -1], meta
            assert [o["shape"] for o in meta["outputs"]] == [[-1] * 4, [-1] * 2], meta
            names = [o["name"] for o in meta["outputs"]]
            rng = np.random.default_rng(3)
            # A compiled shape, and one compiled on its first request.
            for shape in ((2, 3, 32, 48), (1, 3, 20, 36)):
                image = rng.standard_normal(shape).astype(np.float32)
                want = cpu(image)
                feed = httpclient.InferInput("x", list(shape), "FP32")
                feed.set_data_from_numpy(image, binary_data=True)
                answer = http.infer("det", [feed])
                for name, w in zip(names, want):
                    np.testing.assert_allclose(answer.as_numpy(name), w, rtol=2e-5, atol=2e-5)
                gfeed = grpcclient.InferInput("x", list(shape), "FP32")
                gfeed.set_data_from_numpy(image)
                ganswer = grpc.infer("det", [gfeed])
                for name, w in zip(names, want):
                    np.testing.assert_allclose(ganswer.as_numpy(name), w, rtol=2e-5, atol=2e-5)
            status, _, body = raw(
                srv,
                "POST",
                "/v2/models/det/infer",
                json.dumps(
                    {
                        "inputs": [
                            {
                                "name": "x",
                                "shape": [1, 4, 8, 8],
                                "datatype": "FP32",
                                "data": [0.0] * 256,
                            }
                        ]
                    }
                ).encode(),
            )
            assert status == 400 and b"expected shape [-1, 3, -1, -1]" in body, body
        finally:
            code, _, stderr = srv.terminate()
        assert code == 0, stderr


def test_a_repository_serves_and_unloads_a_bucketed_package(tmp_path: Path) -> None:
    """A package of sequence buckets in a model repository is served as a dynamic model
    (HTTP and gRPC, answers equal to the decoder's dygraph forward), counted in its
    statistics, and unloaded over the repository extension."""
    from support.serving_models import decoder_reference, save_decoder

    from paddle_ipu.serving.repository import ModelRepository
    from paddle_ipu.serving.saved_model import compile_model

    prefix, layer = save_decoder(tmp_path)
    root = tmp_path / "repository"
    package, _ = compile_model(prefix, micro_batch_size=2, seq_buckets=[4, 8], cache=False)
    (root / "lm" / "1").mkdir(parents=True)
    package.save(root / "lm" / "1" / "model.pdipu")
    repository = ModelRepository(root, control_mode="explicit", load=["lm"])
    srv = InferenceServer(port=0, grpc_port=0, repository=repository).start()
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        assert http.is_model_ready("lm")
        out = http.get_model_metadata("lm")["outputs"][0]["name"]
        rng = np.random.default_rng(5)
        for rows, length in ((1, 3), (2, 8)):
            ids = rng.integers(0, 50, (rows, length)).astype(np.int64)
            want = decoder_reference(layer, ids)
            feed = httpclient.InferInput("input_ids", [rows, length], "INT64")
            feed.set_data_from_numpy(ids, binary_data=True)
            got = http.infer("lm", [feed]).as_numpy(out)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            gfeed = grpcclient.InferInput("input_ids", [rows, length], "INT64")
            gfeed.set_data_from_numpy(ids)
            got = grpc.infer("lm", [gfeed]).as_numpy(out)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        stats = http.get_inference_statistics("lm")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 4
        http.unload_model("lm")
        assert not http.is_model_ready("lm")
        index = {(m["name"], m.get("state")) for m in http.get_model_repository_index()}
        assert ("lm", "UNAVAILABLE") in index
    finally:
        srv.stop()


def test_bytes_contents_over_grpc(strings: InferenceServer) -> None:
    """gRPC's typed contents: BYTES as ``bytes_contents`` (tritonclient sends raw
    contents), UINT8 as ``uint_contents``; the outputs come back length-prefixed in
    ``raw_output_contents``."""
    grpc = pytest.importorskip("grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="strings")
    text = request.inputs.add(name="text", datatype="BYTES", shape=[2])
    text.contents.bytes_contents.extend([b"ab", b"c\0d"])
    pixels = request.inputs.add(name="pixels", datatype="UINT8", shape=[2, 3])
    pixels.contents.uint_contents.extend([1, 2, 3, 4, 5, 255])
    with grpc.insecure_channel(f"127.0.0.1:{strings.grpc_port}") as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    outputs = {o.name: i for i, o in enumerate(answer.outputs)}
    upper = answer.raw_output_contents[outputs["upper"]]
    assert upper == b"\2\0\0\0AB" + b"\3\0\0\0C\0D"
    total = np.frombuffer(answer.raw_output_contents[outputs["total"]], np.int64)
    np.testing.assert_array_equal(total, [6, 264])
    assert list(answer.outputs[outputs["upper"]].shape) == [2]
