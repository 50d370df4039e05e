"""A package of sequence buckets, served: a request of any length up to the longest
bucket runs in C++ (csrc/serving/shape_routes.h): padded to the shortest bucket that
holds it, run on that bucket's runtime, its outputs cut back to its length, with no
Python per request; what the C++ route does not take goes through the handler.

Real clients (tritonclient over HTTP and gRPC) in this process against the server's
threads; the answers against the encoder's own dygraph forward at the request's
length."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.serving_models import ServedInProcess, decoder_reference, save_decoder

from paddle_ipu.serving.bucketed_runtime import BucketedRuntime, runtime_for
from paddle_ipu.serving.saved_model import compile_model
from paddle_ipu.serving.server import InferenceServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
VOCAB = 50
TOL = {"rtol": 1e-4, "atol": 1e-4}


class Served(ServedInProcess):
    def __init__(self, srv: InferenceServer, runtime: BucketedRuntime, layer: Any) -> None:
        super().__init__(srv, runtime)
        self.layer = layer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """An encoder that ignores the masked positions: token ids padded with 7, the mask
    with 0; buckets of lengths 4 and 8."""
    tmp: Path = tmp_path_factory.mktemp("buckets")
    prefix, layer = save_decoder(tmp, causal=False, masked=True)
    package, _ = compile_model(
        prefix,
        micro_batch_size=2,
        seq_buckets=[4, 8],
        pad_values={"attention_mask": 0, "input_ids": 7},
        cache=False,
    )
    runtime = runtime_for(package, timeout_ms=2.0, max_request_rows=4)
    assert isinstance(runtime, BucketedRuntime)
    srv = InferenceServer(runtime, name="enc", port=0, grpc_port=0).start()
    try:
        yield Served(srv, runtime, layer)
    finally:
        srv.stop()
        runtime.close()


def _feed(rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((rows, length), np.int64)
    mask[:, length - 1] = rng.integers(0, 2, rows)  # some rows hide their last token
    mask[:, 0] = 1
    return {
        "input_ids": rng.integers(0, VOCAB, (rows, length)).astype(np.int64),
        "attention_mask": mask,
    }


def _infer(
    s: Served,
    feed: dict[str, np.ndarray],
    grpc: bool,
    clients: tuple[Any, Any] | None = None,
    binary: bool = True,
) -> np.ndarray:
    types = {name: "INT64" for name in feed}
    (out,) = s.infer("enc", feed, types, grpc, binary=binary, clients=clients)
    return out


def _want(s: Served, feed: dict[str, np.ndarray]) -> np.ndarray:
    return decoder_reference(s.layer, feed["input_ids"], feed["attention_mask"])


def test_every_length_runs_without_python(served: Served) -> None:
    assert served.srv.front_end("enc").routes == 2  # both buckets, before any request
    for length in range(1, 9):
        for rows in (1, 2, 3):
            feed = _feed(rows, length, 10 * length + rows)
            # HTTP with JSON or binary data, and gRPC
            got = _infer(served, feed, grpc=bool((length + rows) % 2), binary=rows != 2)
            assert got.shape == (rows, length, VOCAB)
            np.testing.assert_allclose(got, _want(served, feed), **TOL)
    assert served.python_calls == 0
    # The buckets' runtimes ran the requests, padded: every length 1..8 in a bucket.
    stats = served.runtime.stats()
    assert stats.requests >= 24


def test_what_the_route_does_not_take_goes_to_the_handler(served: Served) -> None:
    calls = served.python_calls
    for grpc in (False, True):
        with pytest.raises(Exception) as raised:  # longer than the longest bucket
            _infer(served, _feed(1, 9, 1), grpc)
        message = str(raised.value)
        assert "sequence length 9" in message, message
        if not grpc:
            assert raised.value.status() == "400"
        feed = _feed(2, 6, 2)
        feed["attention_mask"] = feed["attention_mask"][:, :5]  # lengths disagree
        with pytest.raises(Exception) as raised:
            _infer(served, feed, grpc)
        message = str(raised.value)
        assert "'attention_mask'" in message and "sequence length 6" in message, message
    assert served.python_calls == calls + 4
    feed = _feed(2, 5, 3)  # and the server goes on, without Python
    np.testing.assert_allclose(_infer(served, feed, grpc=True), _want(served, feed), **TOL)
    assert served.python_calls == calls + 4
    # More rows than the runtime's max_request_rows (4): the handler's, which refuses.
    with pytest.raises(Exception) as raised:
        _infer(served, _feed(5, 3, 5), grpc=False)
    assert raised.value.status() == "400", raised.value
    assert "at most 4 rows (max_request_rows), received 5" in str(raised.value)
    assert served.python_calls == calls + 5


def test_an_index_out_of_range_is_refused_in_cpp_by_name(served: Served) -> None:
    calls = served.python_calls
    feed = _feed(2, 3, 4)
    feed["input_ids"][1, 2] = VOCAB + 3
    for grpc in (False, True):
        with pytest.raises(Exception) as raised:
            _infer(served, feed, grpc)
        message = str(raised.value)
        assert "'input_ids'" in message and str(VOCAB + 3) in message, message
    assert served.python_calls == calls  # refused in C++


def test_threads_over_every_bucket(served: Served) -> None:
    """6 client threads, lengths 1..8 mixed (both buckets batch padded requests of
    several lengths together), every answer right, no Python."""
    import threading

    s = served
    calls = s.python_calls
    errors: list[BaseException] = []
    feeds = [
        [_feed(1 + (t + i) % 3, 1 + (t * 3 + i) % 8, 100 * t + i) for i in range(12)]
        for t in range(6)
    ]
    wants = [[_want(s, feed) for feed in mine] for mine in feeds]

    def client(t: int) -> None:
        try:  # a client of each protocol per thread
            mine = (
                httpclient.InferenceServerClient(f"127.0.0.1:{s.srv.port}"),
                grpcclient.InferenceServerClient(f"127.0.0.1:{s.srv.grpc_port}"),
            )
            for i, (feed, want) in enumerate(zip(feeds[t], wants[t])):
                got = _infer(s, feed, grpc=bool(i % 2), clients=mine)
                np.testing.assert_allclose(got, want, **TOL)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the status and message of each (an InferenceServerException's repr shows neither)
    assert not errors, [
        f"{type(e).__name__} {getattr(e, 'status', lambda: '')()}: {e}" for e in errors[:3]
    ]
    assert s.python_calls == calls


def test_statistics_count_the_buckets_runs(served: Served) -> None:
    """Triton's statistics of the model sum the buckets' runs (their queues')."""

    def stats() -> tuple[int, int]:
        doc = served.http.get_inference_statistics("enc")["model_stats"][0]
        return int(doc["inference_count"]), int(doc["execution_count"])

    inferences, executions = stats()
    calls = served.python_calls
    for length in (2, 7):
        feed = _feed(1, length, 60 + length)
        np.testing.assert_allclose(_infer(served, feed, grpc=False), _want(served, feed), **TOL)
    assert served.python_calls == calls
    after = stats()
    assert after[0] - inferences == 2 and after[1] - executions >= 1, (
        after,
        inferences,
        executions,
    )
