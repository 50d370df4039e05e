"""The trip count the compiler reads off a Loop's condition
(paddle_ipu/compiler/loop_bounds.py), against the number of iterations ONNX Runtime
runs the same Loop without one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from paddle_ipu.compiler.loop_bounds import bound_loops, unbounded


def _const(name: str, value: object, dtype: object = np.int64) -> onnx.NodeProto:
    array = np.asarray(value, dtype)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def _loop(update: str, factor: int, compare: str, limit: int, start: int) -> onnx.ModelProto:
    """A Loop carrying a counter ``c`` (from ``start``; each step ``c + factor`` or
    ``c * factor``) and a count of its iterations; its condition is
    ``compare(c_next, limit)`` (or its negation for ``Not*``)."""
    i64 = TensorProto.INT64
    body_nodes = [
        _const("f", [factor]),
        helper.make_node(update, ["c", "f"], ["c_next"]),
        _const("one", [1]),
        helper.make_node("Add", ["n", "one"], ["n_next"]),
        _const("lim", [limit]),
    ]
    if compare.startswith("Not"):
        body_nodes += [
            helper.make_node(compare[3:], ["c_next", "lim"], ["raw"]),
            helper.make_node("Not", ["raw"], ["keep1"]),
        ]
    else:
        body_nodes.append(helper.make_node(compare, ["c_next", "lim"], ["keep1"]))
    body_nodes.append(helper.make_node("Squeeze", ["keep1"], ["keep"]))
    body = helper.make_graph(
        body_nodes,
        "body",
        [helper.make_tensor_value_info("it", i64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("c", i64, [1]),
         helper.make_tensor_value_info("n", i64, [1])],
        [helper.make_tensor_value_info("keep", TensorProto.BOOL, []),
         helper.make_tensor_value_info("c_next", i64, [1]),
         helper.make_tensor_value_info("n_next", i64, [1])],
    )  # fmt: skip
    nodes = [
        _const("c0", [start]),
        _const("n0", [0]),
        _const("go", True, np.bool_),
        helper.make_node(
            "Loop", ["", "go", "c0", "n0"], ["c_end", "count"], body=body, name="Loop.0"
        ),
    ]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("count", i64, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _iterations(model: onnx.ModelProto) -> int:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return int(session.run(None, {})[0][0])


@pytest.mark.parametrize(
    ("update", "factor", "compare", "limit", "start"),
    [
        ("Add", 1, "Less", 12, 0),
        ("Add", 3, "Less", 20, 2),
        ("Add", 1, "LessOrEqual", 7, 0),
        ("Mul", 2, "Less", 100, 1),
        ("Add", 2, "NotGreaterOrEqual", 9, 0),
        ("Add", 1, "Less", 0, 5),  # the condition is false after the first iteration
    ],
)
def test_the_bound_is_the_number_of_iterations_onnx_runtime_runs(
    update: str, factor: int, compare: str, limit: int, start: int
) -> None:
    model = _loop(update, factor, compare, limit, start)
    want = _iterations(model)
    found = bound_loops(model)
    assert found == {"Loop.0": want}
    assert unbounded(model) == []
    assert _iterations(model) == want  # the bound and the condition: the same result


def test_a_loop_without_a_counter_keeps_no_trip_count() -> None:
    model = _loop("Mul", 1, "Less", 10, 3)  # c * 1: nothing counts
    assert bound_loops(model) == {"Loop.0": None}
    assert unbounded(model) == ["Loop.0"]
