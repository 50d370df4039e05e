"""Models with open input dimensions in a model repository, served by ``paddle-ipu
serve --model-repository`` in its own process to tritonclient clients: a PIR saved
model whose input is ``[-1, -1]`` loads and answers every shape; an image model takes
more sizes than its bound holds (the least recently used leave memory; every request
answered; the statistics and /metrics say so); a model with shape buckets and a
warm-up has its buckets made before it is ready and cuts padded answers back -- all
against Paddle's own CPU executor; and their configuration and statistics over gRPC as
over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs
from support.kserve_forms import config_and_statistics
from support.serving_models import ServerProcess, raw

httpclient = pytest.importorskip("tritonclient.http")

TOL = {"rtol": 2e-5, "atol": 2e-5}


class Model:
    """A PIR program saved as ``DIR/<name>/1/model.json``, and Paddle's CPU run of it."""

    def __init__(self, root: Path, name: str, build: Any, config: dict[str, Any]) -> None:
        with paddle.pir_utils.IrGuard(), fresh_programs(5) as (main, startup, scope):
            x, fetches = build()
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            version = root / name / "1"
            version.mkdir(parents=True)
            paddle.static.save_inference_model(
                str(version / "model"), [x], fetches, exe, program=main
            )
        (root / name / "config.json").write_text(json.dumps(config))
        self.main, self.scope, self.fetches = main, scope, fetches

    def cpu(self, feed: np.ndarray) -> np.ndarray:
        with paddle.pir_utils.IrGuard(), paddle.static.scope_guard(self.scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            return exe.run(self.main, feed={"x": feed}, fetch_list=self.fetches)[0]


def _ids() -> tuple[Any, list[Any]]:
    x = paddle.static.data("x", [-1, -1], "int64")
    return x, [paddle.tanh(paddle.nn.Embedding(50, 4)(x))]


def _image() -> tuple[Any, list[Any]]:
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 4, 3, padding=1)(x))
    return x, [paddle.nn.Conv2D(4, 2, 1)(h)]


def _pointwise() -> tuple[Any, list[Any]]:
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    return x, [paddle.nn.Conv2D(3, 2, 1)(paddle.nn.functional.relu(x))]


BUCKETS = {"x": {"2": [8, 16], "3": [8, 16]}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict]]:
    paddle.enable_static()
    root = tmp_path_factory.mktemp("open_models")
    models = {
        "ids": Model(root, "ids", _ids, {"micro_batch_size": 2}),
        "image": Model(root, "image", _image, {"micro_batch_size": 2, "max_specialisations": 2}),
        "buckets": Model(
            root,
            "buckets",
            _pointwise,
            {
                "micro_batch_size": 2,
                "shape_buckets": BUCKETS,
                "pad_values": {"x": 1.0},
                "input_shapes": [{"x": [-1, 3, 8, 8]}],
                "warmup": True,
            },
        ),
    }
    cache = tmp_path_factory.mktemp("cache")
    srv = ServerProcess(f"--model-repository={root}", env={"PADDLE_IPU_CACHE_DIR": str(cache)})
    try:
        yield srv, models
    finally:
        srv.stop()


def _infer(srv: ServerProcess, name: str, feed: np.ndarray, client: Any = None) -> np.ndarray:
    client = client or httpclient.InferenceServerClient(srv.url)
    datatype = "INT64" if feed.dtype == np.int64 else "FP32"
    inp = httpclient.InferInput("x", list(feed.shape), datatype)
    inp.set_data_from_numpy(feed)
    answer = client.infer(name, [inp])
    out = client.get_model_metadata(name)["outputs"][0]["name"]
    return answer.as_numpy(out)


def _stats(srv: ServerProcess, name: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(srv.url)
    return client.get_inference_statistics(name)["model_stats"][0]


def test_a_saved_model_with_an_open_non_batch_dimension_loads_and_answers(served: Any) -> None:
    srv, models = served
    client = httpclient.InferenceServerClient(srv.url)
    states = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert states == {"ids": "READY", "image": "READY", "buckets": "READY"}
    assert client.get_model_metadata("ids")["inputs"][0]["shape"] == [-1, -1]
    rng = np.random.default_rng(0)
    for shape in ((1, 5), (2, 9), (3, 17), (1, 5)):
        feed = rng.integers(0, 50, shape).astype(np.int64)
        np.testing.assert_allclose(_infer(srv, "ids", feed), models["ids"].cpu(feed), **TOL)


def test_more_sizes_than_the_bound_holds_are_all_answered(served: Any) -> None:
    srv, models = served
    sizes = [(6, 6), (6, 10), (10, 6), (7, 7), (6, 6), (9, 4), (4, 9), (11, 5)]
    feeds = {
        (h, w, k): np.random.default_rng(h * 100 + w * 10 + k)
        .standard_normal((1, 3, h, w))
        .astype(np.float32)
        for h, w in sizes
        for k in range(3)
    }
    # Paddle's executor over one scope is not for several threads: the answers first
    want = {key: models["image"].cpu(feed) for key, feed in feeds.items()}
    failures: list[str] = []

    def client(offset: int) -> None:
        c = httpclient.InferenceServerClient(srv.url)
        for k in range(len(sizes)):
            h, w = sizes[(k + offset) % len(sizes)]
            try:
                got = _infer(srv, "image", feeds[(h, w, offset)], c)
            except Exception as exc:
                failures.append(f"{h}x{w}: {exc}")
                continue
            if not np.allclose(got, want[(h, w, offset)], **TOL):
                failures.append(f"{h}x{w}: not Paddle's answer")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    stats = _stats(srv, "image")
    shapes = stats["specialisations"]
    assert shapes["resident"] <= 2 and shapes["evicted"] >= len(set(sizes)) - 2
    assert shapes["made"] == len(set(sizes))
    assert stats["memory_usage"][0]["byte_size"] == shapes["resident_bytes"] > 0
    # every request counted, those of the shapes that left memory included
    assert stats["inference_count"] == 3 * len(sizes)
    status, _, body = raw(srv, "GET", "/metrics")
    assert status == 200
    text = body.decode()
    evicted = 'paddle_ipu_specialisations_evicted_total{model="image",version="1"} '
    assert evicted + str(shapes["evicted"]) in text
    assert 'paddle_ipu_specialisation_bound_bytes{model="image",version="1"}' in text


def test_buckets_are_made_before_ready_and_padded_answers_are_cut_back(served: Any) -> None:
    srv, models = served
    before = _stats(srv, "buckets")["specialisations"]
    assert before["made"] == before["resident"] == 4  # every bucket, by the warm-up
    for h, w in ((5, 7), (8, 8), (9, 3), (16, 16), (12, 15)):
        feed = np.random.default_rng(h + w).standard_normal((2, 3, h, w)).astype(np.float32)
        got = _infer(srv, "buckets", feed)
        assert got.shape == (2, 2, h, w)
        np.testing.assert_allclose(got, models["buckets"].cpu(feed), **TOL)
    assert _stats(srv, "buckets")["specialisations"]["made"] == 4  # nothing more made


def test_concurrent_first_requests_of_a_new_size_make_it_once(served: Any) -> None:
    srv, models = served
    made = _stats(srv, "image")["specialisations"]["made"]
    feed = np.random.default_rng(1).standard_normal((1, 3, 13, 13)).astype(np.float32)
    start = threading.Barrier(4)
    answers: list[Any] = []

    def client() -> None:
        c = httpclient.InferenceServerClient(srv.url)
        start.wait()
        try:
            answers.append(_infer(srv, "image", feed, c))
        except Exception as exc:
            answers.append(exc)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 4
    for got in answers:
        assert not isinstance(got, Exception), got
        np.testing.assert_allclose(got, models["image"].cpu(feed), **TOL)
    assert _stats(srv, "image")["specialisations"]["made"] == made + 1


def test_grpc_configuration_and_statistics_say_what_http_says(served: Any) -> None:
    """Models compiled per input shape (their statistics with memory_usage, and the
    JSON's own "specialisations"), after requests, over tritonclient.grpc."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    srv, models = served
    http = httpclient.InferenceServerClient(srv.url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    rng = np.random.default_rng(5)
    _infer(srv, "ids", rng.integers(0, 50, (2, 7)).astype(np.int64), http)
    for name in ("image", "buckets"):
        _infer(srv, name, rng.standard_normal((1, 3, 8, 8)).astype(np.float32), http)
    for name in models:
        doc = config_and_statistics(http, grpc, name)["model_stats"][0]
        assert doc["inference_count"] > 0 and doc["execution_count"] > 0, doc
        assert doc["memory_usage"][0]["byte_size"] > 0, doc
    config_and_statistics(http, grpc)
    grpc.close()
