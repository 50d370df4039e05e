"""The native path into the ServingQueue (csrc/core/queue.cc SubmitNative, the front
end's GrpcInferCall), without a model: a Python worker shaped like ModelRuntime's loop
computes a known function of the packed step buffers, and every request must get its
own rows of it back -- across runs, split over runs, cancelled before its run, timed
out, refused when the queue is full, failed with its run, refused once closed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from paddle_ipu import _core

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

MBS = 4
LIMIT = 8  # rows in flight
# gRPC status codes
OK, CANCELLED, INVALID, DEADLINE, INTERNAL, UNAVAILABLE = 0, 1, 3, 4, 13, 14


class Fixture:
    """x: FP32 [rows, 4], y = 2 * x[:, :3] + 1: FP32 [rows, 3]."""

    def __init__(self, timeout_s: float = 0.05) -> None:
        self.step = np.zeros((MBS, 4), np.float32)
        self.queue = _core.ServingQueue([self.step], [12], MBS, LIMIT, timeout_s, True)
        plan = _core.ServingPlan(
            name="m",
            version="1",
            server_version="0",
            auto_batch=True,
            max_rows=64,
            capacity=MBS,
            limit=LIMIT,
            micro_batch_size=MBS,
            batch_timeout_us=timeout_s * 1e6,
            request_timeout_s=0.0,
            max_body=1 << 20,
            inputs=[_core.ServingTensor(name="x", datatype="FP32", shape=[-1, 4], unit_bytes=16)],
            outputs=[_core.ServingTensor(name="y", datatype="FP32", shape=[-1, 3], unit_bytes=12)],
        )
        self.fe = _core.ServingFrontEnd(self.queue, plan)
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = False
        self.runs: list[int] = []
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:  # ModelRuntime._loop's shape
        while True:
            filled = self.queue.next_batch()
            if filled < 0:
                return
            self.gate.wait()
            self.runs.append(filled)
            if self.fail_next:
                self.fail_next = False
                self.queue.fail(RuntimeError("the run broke"), 0.0)
                continue
            y = np.ascontiguousarray(2 * self.step[:, :3] + 1)
            self.queue.complete([y], 0.001)

    def call(self, x: np.ndarray) -> Any:
        request = service_pb2.ModelInferRequest(model_name="m", id="r")
        request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
        request.raw_input_contents.append(x.tobytes())
        return self.fe.grpc_infer(request.SerializeToString())

    def result(self, call: Any, timeout: float = 0.0) -> tuple[int, Any]:
        code, payload = call.result(timeout, self.fe)
        if code != OK:
            return code, payload
        response = service_pb2.ModelInferResponse.FromString(payload)
        out = response.outputs[0]
        y = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(list(out.shape))
        return code, y

    def close(self) -> None:
        self.gate.set()
        self.queue.close(False)
        self.thread.join(10)


@pytest.fixture
def fx() -> Iterator[Fixture]:
    f = Fixture()
    yield f
    f.close()


def rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def test_every_request_gets_its_own_rows(fx: Fixture) -> None:
    xs = [rows(i, n) for i, n in enumerate([1, 3, 2, 4, 5, 1, 7])]
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        results[i] = fx.result(fx.call(xs[i]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
        time.sleep(0.002)
    for t in threads:
        t.join(10)
    for i, x in enumerate(xs):
        code, y = results[i]
        if code == UNAVAILABLE:  # the 8-row bound refused it: try once more alone
            code, y = fx.result(fx.call(x))
        assert code == OK, y
        np.testing.assert_array_equal(y, 2 * x[:, :3] + 1)
    assert max(fx.runs) <= MBS and sum(fx.runs) >= sum(len(x) for x in xs)


def test_a_request_larger_than_a_run_is_split_across_runs(fx: Fixture) -> None:
    x = rows(1, 3 * MBS + 1)  # larger than the bound too: admitted when alone
    code, y = fx.result(fx.call(x))
    assert code == OK
    np.testing.assert_array_equal(y, 2 * x[:, :3] + 1)
    assert fx.runs[-4:] == [MBS, MBS, MBS, 1]


def test_full_queue_is_refused_at_once(fx: Fixture) -> None:
    fx.gate.clear()  # the worker holds its run
    first = fx.call(rows(1, 3))
    time.sleep(0.2)  # taken into a run (partial: the timeout flushed it), then held
    second = fx.call(rows(2, 5))  # 3 + 5 = 8: fits
    third = fx.call(rows(3, 1))  # 9 > 8
    code, message = fx.result(third)
    assert code == UNAVAILABLE and "busy: 8 of 8 rows in flight" in message
    fx.gate.set()
    assert fx.result(first)[0] == OK and fx.result(second)[0] == OK


def test_cancelled_before_its_run_is_never_computed(fx: Fixture) -> None:
    fx.gate.clear()
    held = fx.call(rows(1, MBS))  # a full run: taken at once, held by the gate
    time.sleep(0.1)
    queued = fx.call(rows(2, 2))
    assert queued.cancel(fx.fe) is True
    assert fx.result(queued) == (CANCELLED, "the client cancelled the call")
    fx.gate.set()
    assert fx.result(held)[0] == OK
    x = rows(3, 1)
    code, y = fx.result(fx.call(x))
    assert code == OK
    np.testing.assert_array_equal(y, 2 * x[:, :3] + 1)
    assert fx.runs == [MBS, 1]  # the cancelled rows never ran
    assert held.cancel(fx.fe) is False  # answered already


def test_not_started_in_time_is_taken_out(fx: Fixture) -> None:
    fx.gate.clear()
    held = fx.call(rows(1, MBS))
    time.sleep(0.1)
    late = fx.call(rows(2, 2))
    t0 = time.monotonic()
    code, message = fx.result(late, timeout=0.1)
    assert code == DEADLINE and "not started within its timeout of 100 ms" in message
    assert time.monotonic() - t0 < 5
    fx.gate.set()
    assert fx.result(held)[0] == OK
    fx.result(fx.call(rows(3, 1)))
    assert fx.runs == [MBS, 1]
    assert 'paddle_ipu_timed_out_total{model="m",version="1"} 1' in fx.fe.prometheus()


def test_a_failed_run_fails_its_requests_only(fx: Fixture) -> None:
    fx.fail_next = True
    code, message = fx.result(fx.call(rows(1, 2)))
    assert code == INTERNAL and message == "inference failed: the run broke"
    x = rows(2, 2)
    code, y = fx.result(fx.call(x))
    assert code == OK
    np.testing.assert_array_equal(y, 2 * x[:, :3] + 1)


def test_bad_requests_never_reach_the_queue(fx: Fixture) -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 5])
    request.raw_input_contents.append(np.zeros((2, 5), np.float32).tobytes())
    code, message = fx.result(fx.fe.grpc_infer(request.SerializeToString()))
    assert code == INVALID and message.startswith("input 'x': expected shape [rows, 4]")
    assert fx.runs == [] and fx.queue.in_flight == 0


def test_closed_queue_refuses(fx: Fixture) -> None:
    fx.queue.close(False)
    code, message = fx.result(fx.call(rows(1, 1)))
    assert code == UNAVAILABLE and "closed" in message
