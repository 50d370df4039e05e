"""Pipelines (paddle_ipu/serving/pipeline.py): the definition's checks, tensors flowing
between host and model steps, ``each`` steps, failures named by step, cancelling; a
model step's runtime is a stand-in with ``submit`` (the OCR pipeline over real
runtimes is tests/conformance/trained/test_ocr_serving.py)."""

from __future__ import annotations

import gc
import json
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paddle_ipu.errors import FeedError, OptionError, PipelineInputError, PipelineStepError
from paddle_ipu.serving.pipeline import Pipeline, parse_pipeline
from paddle_ipu.serving.repository import ModelRepository, read_config


class AddOne:
    """A model runtime stand-in: output ``y = x + 1`` (and ``rows``), answered on a
    thread of its own; records each request's rows."""

    class _Spec:
        def __init__(self, name: str) -> None:
            self.name = name

    outputs = (_Spec("y"), _Spec("rows"))

    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.pool = ThreadPoolExecutor(2)
        self.requests: list[int] = []
        self.answers: list[weakref.ref[np.ndarray]] = []
        self.fail = fail
        self.gate = gate

    def submit(self, feed: dict[str, np.ndarray]) -> Future[list[np.ndarray]]:
        x = np.asarray(feed["x"])
        self.requests.append(len(x))

        def run() -> list[np.ndarray]:
            if self.gate is not None:
                self.gate.wait(10)
            if self.fail:
                raise RuntimeError("the graph run failed")
            y = x + 1
            self.answers.append(weakref.ref(y))
            return [y, np.array([len(x)])]

        return self.pool.submit(run)


def double(x: np.ndarray) -> dict[str, Any]:
    return {"y": x * 2}


def split(y: np.ndarray) -> dict[str, Any]:
    return {"parts": [y[i : i + 1] for i in range(len(y))] if len(y) else []}


def join(parts: list[np.ndarray]) -> dict[str, Any]:
    if not parts:
        return {"out": np.zeros((0, 3), np.float32)}
    return {"out": np.concatenate(parts).astype(np.float32)}


def broken(x: np.ndarray) -> dict[str, Any]:
    raise ValueError("no good")


HERE = __name__  # the host steps below, importable by the name pytest gave this module


def definition(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 3]}],
        "outputs": [{"name": "out", "datatype": "FP32", "dims": [-1, 3]}],
        "steps": [
            {
                "name": "double",
                "function": f"{HERE}:double",
                "inputs": {"x": "x"},
                "outputs": {"y": "doubled"},
            },
            {"name": "add", "model": "add1", "inputs": {"x": "doubled"}, "outputs": {"y": "added"}},
            {
                "name": "split",
                "function": f"{HERE}:split",
                "inputs": {"y": "added"},
                "outputs": {"parts": "parts"},
            },
            {
                "name": "each",
                "model": "add1",
                "each": True,
                "inputs": {"x": "parts"},
                "outputs": {"y": "parts2"},
            },
            {
                "name": "join",
                "function": f"{HERE}:join",
                "inputs": {"parts": "parts2"},
                "outputs": {"out": "out"},
            },
        ],
    }
    doc.update(changes)
    return doc


def test_tensors_flow_through_host_and_model_steps() -> None:
    model = AddOne()
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((n, 3)).astype(np.float32) for n in (1, 4, 0, 2)]
    with Pipeline(definition(), {"add1": model}, name="p") as pipeline:
        assert [s.name for s in pipeline.inputs] == ["x"]
        assert [(s.name, s.datatype, s.dims) for s in pipeline.outputs] == [
            ("out", "FP32", (-1, 3))
        ]
        futures = [pipeline.submit({"x": x}) for x in feeds]
        for x, f in zip(feeds, futures):
            out = f.result(10)
            assert list(out) == ["out"]
            np.testing.assert_array_equal(out["out"], x * 2 + 1 + 1)
            assert out["out"].dtype == np.float32
    # one request per request for "add", one per row for "each"; 0 rows: nothing for each
    assert sorted(model.requests) == sorted([1, 4, 0, 2] + [1] * 7)


def test_a_finished_request_lets_its_tensors_go_without_the_garbage_collector() -> None:
    """The pipeline's request, its futures and their callbacks referred to each other:
    every tensor of a finished request stayed until a collection found the cycle, and
    with few, large arrays it rarely runs (PP-OCR's pipeline grew by 0.5-0.7 GB per
    pass over twelve images).  Reference counting alone now frees them."""
    model = AddOne()
    gc.collect()
    gc.disable()
    try:
        with Pipeline(definition(), {"add1": model}) as pipeline:
            for rows in (4, 2):
                out = pipeline.run({"x": np.ones((rows, 3), np.float32)})
                assert out["out"].shape == (rows, 3)
        assert len(model.answers) == (1 + 4) + (1 + 2)  # the whole batch, then each row
        alive = [r for r in model.answers if r() is not None]
        assert alive == [], f"{len(alive)} model answers of finished requests still held"
    finally:
        gc.enable()


def test_a_failing_step_fails_its_request_naming_the_step() -> None:
    doc = definition()
    doc["steps"][2]["function"] = f"{HERE}:broken"
    doc["steps"][2]["inputs"] = {"x": "added"}
    with Pipeline(doc, {"add1": AddOne()}, name="p") as pipeline:
        with pytest.raises(
            PipelineStepError, match=r"pipeline 'p', step 'split' .*ValueError: no good"
        ) as info:
            pipeline.run({"x": np.ones((2, 3), np.float32)}, timeout=10)
        assert info.value.step == "split" and isinstance(info.value.__cause__, ValueError)
        # the step's ValueError: the request's fault (answered 400 when served)
        assert isinstance(info.value, PipelineInputError)
    failing = Pipeline(definition(), {"add1": AddOne(fail=True)}, name="p")
    with (
        failing as pipeline,
        pytest.raises(
            PipelineStepError, match=r"step 'add' \(model 'add1'\).*graph run failed"
        ) as failed,
    ):
        pipeline.run({"x": np.ones((2, 3), np.float32)}, timeout=10)
    assert not isinstance(failed.value, ValueError)  # a RuntimeError: the server's fault
    # a model that is not there: named with the step
    missing = Pipeline(definition(), {"other": AddOne()}, name="p")
    with (
        missing as pipeline,
        pytest.raises(PipelineStepError, match=r"step 'add'.*'add1' is not given"),
    ):
        pipeline.run({"x": np.ones((2, 3), np.float32)}, timeout=10)


def test_an_output_the_model_lacks_is_named() -> None:
    doc = definition()
    doc["steps"][1]["outputs"] = {"z": "added"}
    lacking = Pipeline(doc, {"add1": AddOne()})
    with lacking as pipeline, pytest.raises(PipelineStepError, match=r"'add'.*no output 'z'"):
        pipeline.run({"x": np.ones((1, 3), np.float32)}, timeout=10)


def test_bad_requests_name_the_input() -> None:
    with Pipeline(definition(), {"add1": AddOne()}, name="p") as pipeline:
        with pytest.raises(FeedError, match="input 'x' is missing"):
            pipeline.submit({})
        with pytest.raises(FeedError, match=r"unknown inputs \['y'\]"):
            pipeline.submit({"x": np.ones((1, 3), np.float32), "y": 1})
        with pytest.raises(FeedError, match=r"'x' must be FP32 \(float32\), got int64"):
            pipeline.submit({"x": np.ones((1, 3), np.int64)})
        with pytest.raises(FeedError, match=r"'x' must have shape \[-1, 3\] .*got \[1, 4\]"):
            pipeline.submit({"x": np.ones((1, 4), np.float32)})


def test_cancel_takes_the_model_request_out() -> None:
    gate = threading.Event()
    model = AddOne(gate=gate)
    with Pipeline(definition(), {"add1": model}) as pipeline:
        future = pipeline.submit({"x": np.ones((1, 3), np.float32)})
        deadline = threading.Event()
        while not model.requests and not deadline.wait(0.01):
            pass
        assert future.cancel()
        gate.set()
        assert future.cancelled()
    assert model.requests == [1]  # the steps after the cancelled one never ran


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"steps": []}, "pipeline.steps", "non-empty list"),
        (
            {"inputs": [{"name": "x", "datatype": "FLOAT", "dims": [1]}]},
            "pipeline.inputs[0].datatype",
            "FLOAT",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "dims": [-2]}]},
            "pipeline.inputs[0].dims",
            "-2",
        ),
        (
            {"outputs": [{"name": "nope", "datatype": "FP32", "dims": [1]}]},
            "pipeline.outputs",
            "'nope'",
        ),
        ({"extra": 1}, "pipeline", "unknown keys ['extra']"),
        ({"host_workers": 0}, "pipeline.host_workers", ">= 1"),
    ],
)
def test_bad_definitions_name_the_key(change: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_pipeline(definition(**change), "cfg.json")
    assert f"cfg.json: {key!r}" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    ("index", "change", "key", "words"),
    [
        (
            1,
            {"inputs": {"x": "later"}},
            "pipeline.steps[1].inputs",
            "'later', which no pipeline input",
        ),
        (
            1,
            {"outputs": {"y": "doubled"}},
            "pipeline.steps[1].outputs",
            "pipeline.steps[0] produces",
        ),
        (1, {"function": "m:f"}, "pipeline.steps[1]", "either a 'model' or"),
        (0, {"function": "nocolon"}, "pipeline.steps[0].function", "'module:function'"),
        (0, {"each": True}, "pipeline.steps[0].each", "model steps only"),
        (1, {"version": "v2"}, "pipeline.steps[1].version", "positive integer"),
        (1, {"name": "double"}, "pipeline.steps[1].name", "unique"),
        (1, {"batch": 3}, "pipeline.steps[1]", "unknown keys ['batch']"),
    ],
)
def test_bad_steps_name_the_key(index: int, change: dict[str, Any], key: str, words: str) -> None:
    doc = definition()
    doc["steps"][index].update(change)
    with pytest.raises(OptionError) as info:
        parse_pipeline(doc, "cfg.json")
    assert f"cfg.json: {key!r}" in str(info.value) and words in str(info.value), str(info.value)


def test_a_missing_function_is_named() -> None:
    doc = definition()
    doc["steps"][0]["function"] = f"{HERE}:nothing_here"
    with pytest.raises(OptionError, match="has no function 'nothing_here'"):
        Pipeline(doc, {"add1": AddOne()})


def test_a_repository_pipeline_with_its_own_module(tmp_path: Path) -> None:
    """config.json's "pipeline" key; a host function from DIR/steps.py; the batching
    keys of a model refused beside it."""
    (tmp_path / "steps.py").write_text("def triple(x):\n    return {'y': x * 3}\n")
    doc = {
        "inputs": [{"name": "x", "datatype": "INT64", "dims": [-1]}],
        "outputs": [{"name": "y", "datatype": "INT64", "dims": [-1]}],
        "steps": [
            {"name": "t", "function": "steps:triple", "inputs": {"x": "x"}, "outputs": {"y": "y"}}
        ],
    }
    (tmp_path / "tri" / "1").mkdir(parents=True)
    (tmp_path / "tri" / "config.json").write_text(json.dumps({"pipeline": doc}))
    config = read_config(tmp_path / "tri")
    assert config.pipeline is not None and config.pipeline.steps[0].target == "steps:triple"
    repo = ModelRepository(tmp_path)
    with repo.open_pipeline("tri") as pipeline:
        np.testing.assert_array_equal(pipeline.run({"x": np.arange(4)})["y"], np.arange(4) * 3)
    (tmp_path / "tri" / "config.json").write_text(json.dumps({"pipeline": doc, "timeout_ms": 1}))
    with pytest.raises(OptionError, match=r"\['timeout_ms'\] are a model's"):
        read_config(tmp_path / "tri")
    doc["steps"][0]["inputs"] = {"x": "y"}
    (tmp_path / "tri" / "config.json").write_text(json.dumps({"pipeline": doc}))
    with pytest.raises(OptionError, match=r"config.json: 'pipeline.steps\[0\].inputs'"):
        read_config(tmp_path / "tri")
