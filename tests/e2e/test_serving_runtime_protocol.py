"""The Runtime protocol (paddle_ipu/serving/runtime.py): every runtime kind implements
it, the server dispatches on what it declares (``kind``, ``routes``), and a runtime kind
written against the protocol alone is served unchanged, its answers read by
tritonclient over HTTP."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.models import build

import paddle_ipu
from paddle_ipu.errors import NotSupportedError
from paddle_ipu.serving.bucketed_runtime import BucketedRuntime
from paddle_ipu.serving.dynamic import FunctionModel, RuntimeModel
from paddle_ipu.serving.model_runtime import ModelRuntime
from paddle_ipu.serving.pipeline import Pipeline
from paddle_ipu.serving.runtime import (
    Handler,
    QueueRuntime,
    Route,
    Runtime,
    RuntimeKind,
    RuntimeStats,
    TensorSpec,
    as_runtime,
)
from paddle_ipu.serving.server import InferenceServer
from paddle_ipu.serving.shaped import ShapeRuntime

httpclient = pytest.importorskip("tritonclient.http")

SERVING = Path(paddle_ipu.__file__).parent / "serving"


@pytest.fixture(scope="module")
def mlp_runtime() -> Any:
    paddle.enable_static()
    built = build("mlp")
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=4)
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    cp.compile(built.feeds, built.fetches)
    runtime = ModelRuntime(cp.executor, timeout_ms=1.0)
    yield built, runtime
    runtime.close()
    cp.reset()


def test_every_runtime_kind_declares_the_protocol(mlp_runtime: Any) -> None:
    _, runtime = mlp_runtime
    assert isinstance(runtime, QueueRuntime) and runtime.kind == "queue"
    assert [(t.name, t.datatype, t.dims) for t in runtime.inputs] == [("x", "FP32", (-1, 16))]
    assert runtime.outputs[0].dims == (-1, 10)
    plan = runtime.queue_plan()
    assert (plan.capacity, plan.micro_batch_size, plan.auto_batch) == (4, 4, True)
    assert plan.inputs[0].unit_bytes == 16 * 4
    assert runtime.warmup_feed()["x"].shape == (4, 16)
    for cls in (ShapeRuntime, BucketedRuntime, Pipeline, FunctionModel, RuntimeModel, Handler):
        assert Runtime in cls.__mro__, cls  # (issubclass: not of a Protocol with properties)
        assert cls.kind == "handler", cls
    model = FunctionModel(
        lambda f: f, [TensorSpec("x", "FP32", (-1,))], [TensorSpec("x", "FP32", (-1,))]
    )
    try:
        assert as_runtime(model) is model and isinstance(model.stats(), RuntimeStats)
    finally:
        model.close()


class _Doubles:
    """A user's model written against DynamicModel only (no kind, stats, routes)."""

    inputs = (TensorSpec("x", "FP32", (-1,)),)
    outputs = (TensorSpec("y", "FP32", (-1,)),)

    def submit(self, feed: Mapping[str, np.ndarray]) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result({"y": feed["x"] * 2})
        return future


def test_a_dynamic_model_is_served_as_a_handler_and_anything_else_is_refused() -> None:
    user = _Doubles()
    runtime = as_runtime(user)
    assert isinstance(runtime, Handler) and runtime.kind == "handler"
    runtime.submit({"x": np.ones(3, np.float32)}).result()
    assert runtime.stats().requests == 1
    with pytest.raises(NotSupportedError, match="no model this server serves"):
        as_runtime(object())
    with pytest.raises(NotSupportedError, match="no model this server serves"):
        InferenceServer(object(), port=0)


class _RoutedSquares(Runtime):
    """A runtime kind of its own, written against the protocol alone: its requests of
    16 features go to a model runtime's queue (its route, served from C++), the others
    are squared here in Python."""

    kind: RuntimeKind = "handler"

    def __init__(self, queue: QueueRuntime) -> None:
        self.queue = queue
        self.handled = 0
        self.closed = False

    @property
    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec("x", "FP32", (-1, -1))]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(self.queue.outputs[0].name, "FP32", (-1, -1))]

    def submit(self, feed: Mapping[str, Any]) -> Future[Any]:
        self.handled += 1
        future: Future[Any] = Future()
        future.set_result([np.square(feed["x"])])
        return future

    def routes(self, route: Route) -> None:
        route(self.queue, None)

    def stats(self) -> RuntimeStats:
        return RuntimeStats(requests=self.handled)

    def close(self) -> None:
        self.closed = True


def test_a_new_runtime_kind_is_served_through_the_protocol(mlp_runtime: Any) -> None:
    built, queue = mlp_runtime
    routed = _RoutedSquares(queue)
    srv = InferenceServer(routed, name="kind", port=0).start()
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}")
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        before = queue.stats().requests
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("kind", [inp]).as_numpy(queue.outputs[0].name)
        # 16 features: the route's queue answered, as Paddle's CPU executor does
        np.testing.assert_allclose(got, built.run_cpu({"x": x})[0], rtol=1e-5, atol=1e-6)
        assert queue.stats().requests == before + 1 and routed.handled == 0
        y = np.arange(6, dtype=np.float32).reshape(2, 3)
        inp = httpclient.InferInput("x", list(y.shape), "FP32")
        inp.set_data_from_numpy(y)
        out = client.infer("kind", [inp]).as_numpy(queue.outputs[0].name)
        np.testing.assert_array_equal(out, y * y)
        assert routed.handled == 1
    finally:
        srv.stop()
    assert routed.closed


def test_the_server_dispatches_on_the_protocol_not_on_attributes() -> None:
    """No hasattr / getattr / isinstance of a runtime kind in the server: what it does
    with a model follows from the protocol's declarations."""
    tree = ast.parse((SERVING / "server.py").read_text())
    found = []
    kinds = {"ModelRuntime", "ShapeRuntime", "BucketedRuntime", "Pipeline", "FunctionModel"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("hasattr", "getattr"):
                found.append(ast.unparse(node))
            if node.func.id == "isinstance" and any(
                isinstance(a, ast.Name) and a.id in kinds for a in ast.walk(node.args[1])
            ):
                found.append(ast.unparse(node))
        # a private attribute of an object other than the server itself
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "_core"))
        ):
            found.append(ast.unparse(node))
    assert not found, found
