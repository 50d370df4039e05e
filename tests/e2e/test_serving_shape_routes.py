"""A model compiled per input shape, served: the first request of a shape goes through
the Python handler (it compiles that shape), every later one of that shape runs in C++
on the shape's runtime (csrc/serving/shape_routes.h), no Python per request.

Real clients (tritonclient over HTTP and gRPC) in this process against the server's
threads; the answers against Paddle's CPU executor on the saved program."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs
from support.serving_models import ServedInProcess

from paddle_ipu.serving.bucketed_runtime import runtime_for
from paddle_ipu.serving.saved_model import compile_model
from paddle_ipu.serving.server import InferenceServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
VOCAB = 11


class Served(ServedInProcess):
    def __init__(self, srv: InferenceServer, runtime: Any, cpu: Any) -> None:
        super().__init__(srv, runtime)
        self.cpu = cpu

    @property
    def routes(self) -> int:
        return int(self.srv.front_end("seq").routes)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Two inputs with an open sequence axis (token ids, float features), two outputs."""
    tmp = tmp_path_factory.mktemp("routes")
    with fresh_programs(7) as (main, startup, _scope):
        ids = paddle.static.data("ids", [-1, -1], "int64")
        x = paddle.static.data("x", [-1, -1], "float32")
        emb = paddle.nn.Embedding(VOCAB, 4)(ids)
        scaled = paddle.nn.functional.relu(x * 2.0 - 0.5) + paddle.sum(emb, axis=-1)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        prefix = str(tmp / "model")
        paddle.static.save_inference_model(prefix, [ids, x], [emb, scaled], exe, program=main)

        def cpu(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [np.asarray(v) for v in exe.run(main, feed=feed, fetch_list=[emb, scaled])]

        # One length compiled ahead (a PIR program names no fetch: its outputs are
        # read from a compiled shape); the others on their first request.
        shapes = [{"ids": [-1, 5], "x": [-1, 5]}]
        package, _ = compile_model(prefix, micro_batch_size=2, cache=False, input_shapes=shapes)
        assert package.per_shape
        runtime = runtime_for(package, timeout_ms=2.0)
        srv = InferenceServer(runtime, name="seq", port=0, grpc_port=0).start()
        try:
            yield Served(srv, runtime, cpu)
        finally:
            srv.stop()
            runtime.close()


def _feed(rows: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(0, VOCAB, (rows, seq)).astype(np.int64),
        "x": rng.standard_normal((rows, seq)).astype(np.float32),
    }


def _infer(s: Served, feed: dict[str, np.ndarray], grpc: bool) -> list[np.ndarray]:
    return s.infer("seq", feed, {"ids": "INT64", "x": "FP32"}, grpc)


def _check(s: Served, feed: dict[str, np.ndarray], grpc: bool) -> None:
    got = _infer(s, feed, grpc)
    for g, w in zip(got, s.cpu(feed)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_shape_after_its_first_request_runs_without_python(served: Served) -> None:
    _check(served, _feed(2, 5, 0), grpc=False)  # compiles the shape (the handler)
    assert served.python_calls == 1 and served.routes == 1
    # Every later request of that sequence length, any number of rows, both protocols.
    for i in range(12):
        _check(served, _feed(1 + i % 3, 5, 10 + i), grpc=bool(i % 2))
    assert served.python_calls == 1
    # Another length: the handler once more, then routed too.
    _check(served, _feed(1, 7, 30), grpc=True)
    _check(served, _feed(3, 7, 31), grpc=False)
    assert served.python_calls == 2 and served.routes == 2


def test_a_routed_request_is_checked_as_a_fixed_models(served: Served) -> None:
    _check(served, _feed(1, 4, 40), grpc=False)  # the route of length 4
    calls = served.python_calls
    feed = _feed(2, 4, 41)
    feed["ids"][1, 2] = VOCAB + 3
    for grpc in (False, True):
        with pytest.raises(Exception) as raised:
            _infer(served, feed, grpc)
        message = str(raised.value)
        assert "'ids'" in message and str(VOCAB + 3) in message, message
    assert served.python_calls == calls  # refused in C++
    _check(served, _feed(2, 4, 42), grpc=True)  # and the server goes on


def test_statistics_count_the_routed_requests(served: Served) -> None:
    before = served.http.get_inference_statistics("seq")["model_stats"][0]["inference_count"]
    for i in range(4):
        _check(served, _feed(2, 5, 50 + i), grpc=False)
    after = served.http.get_inference_statistics("seq")["model_stats"][0]["inference_count"]
    assert int(after) - int(before) >= 4


def test_statistics_count_each_graph_run_once(served: Served) -> None:
    """A new shape's first request runs through the handler and the shape's queue, later
    ones through the queue alone: three requests sent one after another (each answered
    before the next is sent, so each is a graph run of its own) move Triton's
    execution_count by 3, not by one more for the handler."""

    def executions() -> int:
        doc = served.http.get_inference_statistics("seq")["model_stats"][0]
        return int(doc["execution_count"])

    before, calls = executions(), served.python_calls
    for i in range(3):
        _check(served, _feed(1, 9, 70 + i), grpc=False)  # a length no other test sends
    assert served.python_calls == calls + 1
    assert executions() - before == 3


def test_threads_over_two_routed_shapes_then_an_unload(served: Served) -> None:
    """8 client threads, two lengths routed and one new, every answer right; then the
    model is unloaded: refused (404) from then on, nothing in flight lost."""
    import threading

    s = served
    _check(s, _feed(1, 6, 60), grpc=False)  # a third length, routed from now on
    calls = s.python_calls
    errors: list[BaseException] = []

    names = [o["name"] for o in s.http.get_model_metadata("seq")["outputs"]]
    feeds = [
        [_feed(1 + (t + i) % 3, (5, 6)[(t + i) % 2], 100 * t + i) for i in range(15)]
        for t in range(8)
    ]
    wants = [[s.cpu(feed) for feed in mine] for mine in feeds]  # Paddle's, in this thread

    def client(t: int) -> None:
        try:
            mine = httpclient.InferenceServerClient(f"127.0.0.1:{s.srv.port}")
            for feed, want in zip(feeds[t], wants[t]):
                inputs = []
                for name, value in feed.items():
                    dtype = "INT64" if name == "ids" else "FP32"
                    inp = httpclient.InferInput(name, list(value.shape), dtype)
                    inp.set_data_from_numpy(value)
                    inputs.append(inp)
                answer = mine.infer("seq", inputs)
                for name, w in zip(names, want):
                    np.testing.assert_allclose(answer.as_numpy(name), w, rtol=1e-5, atol=1e-5)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the status and message of each (an InferenceServerException's repr shows neither)
    assert not errors, [
        f"{type(e).__name__} {getattr(e, 'status', lambda: '')()}: {e}" for e in errors[:3]
    ]
    assert s.python_calls == calls  # 120 requests, none through the handler
    assert s.srv.remove_model("seq") == ["1"]
    with pytest.raises(Exception) as raised:
        _infer(s, _feed(1, 5, 99), grpc=False)
    error = raised.value
    assert error.status() == "404" and 'unknown model "seq"' in error.message(), error.message()
