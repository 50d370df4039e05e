"""Buckets of sequence lengths: a text model saved with a -1 sequence length, compiled
once per length, answering requests of every length as its own dygraph forward does
(the oracle), through packages, the model runtime and the predictor."""

from __future__ import annotations

import gc
import json
import threading
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.serving_models import TinyDecoder, decoder_reference, save_decoder

from paddle_ipu import inference
from paddle_ipu.errors import CompileError, FeedError, NotSupportedError, OptionError
from paddle_ipu.serving import BucketedRuntime, ModelRuntime, runtime_for
from paddle_ipu.serving.package import load_package
from paddle_ipu.serving.saved_model import compile_model

BUCKETS = [4, 8, 16]
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, TinyDecoder]:
    return save_decoder(tmp_path_factory.mktemp("decoder"))


@pytest.fixture(scope="module")
def package(decoder: tuple[str, TinyDecoder], tmp_path_factory: pytest.TempPathFactory) -> Any:
    built, _ = compile_model(decoder[0], micro_batch_size=2, seq_buckets=BUCKETS, cache=False)
    path = built.save(tmp_path_factory.mktemp("package") / "decoder.pdipu")
    return load_package(path)


def _ids(rng: np.random.Generator, rows: int, length: int) -> np.ndarray:
    return rng.integers(0, 50, (rows, length)).astype("int64")


def test_every_length_answers_as_the_dygraph_forward(
    package: Any, decoder: tuple[str, TinyDecoder]
) -> None:
    rng = np.random.default_rng(5)
    with runtime_for(package, timeout_ms=1.0) as runtime:
        assert isinstance(runtime, BucketedRuntime)
        for length in range(1, BUCKETS[-1] + 1):
            ids = _ids(rng, 3, length)
            (got,) = runtime.run({"input_ids": ids})
            assert got.shape == (3, length, 50)
            np.testing.assert_allclose(got, decoder_reference(decoder[1], ids), **TOL)
        stats = runtime.stats()
    # 16 lengths in three buckets, 3 rows each over micro-batches of 2
    assert stats.requests == 16 and stats.units == 48


def test_concurrent_requests_of_different_lengths_get_their_own_answers(
    package: Any, decoder: tuple[str, TinyDecoder]
) -> None:
    rng = np.random.default_rng(6)
    requests = [_ids(rng, int(rng.integers(1, 3)), int(rng.integers(1, 17))) for _ in range(24)]
    answers: dict[int, np.ndarray] = {}
    with runtime_for(package, timeout_ms=5.0) as runtime:
        futures = [runtime.submit({"input_ids": ids}) for ids in requests[:12]]

        def client(k: int) -> None:
            answers[k] = runtime.run({"input_ids": requests[k]})[0]

        threads = [threading.Thread(target=client, args=(k,)) for k in range(12, 24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, f in enumerate(futures):
            answers[k] = f.result(timeout=60)[0]
    for k, ids in enumerate(requests):
        np.testing.assert_allclose(answers[k], decoder_reference(decoder[1], ids), **TOL)


def test_a_finished_request_is_freed_without_the_garbage_collector(package: Any) -> None:
    """A bucketed request's future held the bucket's future, whose callback held the
    first: their outputs stayed until a collection found the cycle.  Reference counting
    alone frees them now, for the bucket's own runtime's futures too."""
    rng = np.random.default_rng(7)
    gc.collect()
    gc.disable()
    try:
        with runtime_for(package, timeout_ms=1.0) as runtime:
            refs = []
            for length in (3, 9):
                future = runtime.submit({"input_ids": _ids(rng, 2, length)})
                inner = future._inner  # type: ignore[attr-defined]
                (got,) = future.result(timeout=60)
                assert got.shape == (2, length, 50)
                refs += [weakref.ref(future), weakref.ref(inner), weakref.ref(got)]
                del future, inner, got
            assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        gc.enable()


def test_the_package_reports_its_buckets(package: Any, tmp_path: Path) -> None:
    path = package.save(tmp_path / "again.pdipu")
    with zipfile.ZipFile(path) as zf:
        meta = json.loads(zf.read("meta.json"))
        names = set(zf.namelist())
    buckets = meta["buckets"]
    assert buckets["lengths"] == BUCKETS
    assert buckets["feeds"] == {"input_ids": [1]}
    assert list(buckets["outputs"].values()) == [[1]]
    assert buckets["pad_values"] == {"input_ids": 0.0}
    graphs = [g for g in meta["graphs"] if g["kind"] == "bucket"]
    assert [int(g["key"]) for g in graphs] == BUCKETS
    assert {"model.onnx", "buckets/4.onnx", "buckets/8.onnx", "weights.safetensors"} <= names
    assert meta["options"]["seq_buckets"] == BUCKETS
    assert [list(g["inputs"][0]["shape"]) for g in graphs] == [[2, n] for n in BUCKETS]
    # the weights once: every bucket's parameters are the same stored arrays
    stored = [set(g["weights"].values()) for g in graphs]
    assert stored[0] and all(s == stored[0] for s in stored)


def test_request_shapes_leave_the_sequence_open(package: Any) -> None:
    with runtime_for(package, timeout_ms=1.0) as runtime:
        assert runtime.request_shapes() == ([[-1, -1]], [[-1, -1, 50]])
    with runtime_for(package, timeout_ms=0.0) as runtime:
        assert runtime.request_shapes() == ([[2, -1]], [[2, -1, 50]])


def test_lengths_outside_the_buckets_are_feed_errors(package: Any) -> None:
    with runtime_for(package, timeout_ms=1.0) as runtime:
        with pytest.raises(FeedError, match=r"sequence length 17: expected 1 to 16"):
            runtime.run({"input_ids": np.zeros((1, 17), np.int64)})
        with pytest.raises(FeedError, match=r"sequence length 0"):
            runtime.submit({"input_ids": np.zeros((1, 0), np.int64)})
        with pytest.raises(FeedError, match=r"feed 'input_ids': expected a sequence axis 1"):
            runtime.run({"input_ids": np.zeros((3,), np.int64)})


def test_a_bucketed_package_has_no_single_executor(package: Any) -> None:
    with pytest.raises(NotSupportedError, match="runtime_for"):
        package.executor()
    executors = package.executors()
    assert sorted(executors) == BUCKETS
    for e in executors.values():
        e.reset()


def test_the_predictor_takes_any_length(decoder: tuple[str, TinyDecoder]) -> None:
    prefix, layer = decoder
    config = inference.Config(prefix)
    config.enable_ipu(ipu_micro_batch_size=1)
    config.set_ipu_sequence_buckets([8, 4])
    config.disable_compile_cache()
    predictor = inference.create_predictor(config)
    try:
        handle = predictor.get_input_handle("input_ids")
        assert handle.shape() == [1, -1]
        rng = np.random.default_rng(7)
        for length in (2, 4, 7):
            ids = _ids(rng, 1, length)
            (got,) = predictor.run([ids])
            np.testing.assert_allclose(got, decoder_reference(layer, ids), **TOL)
    finally:
        predictor.close()


def test_fp16_buckets(decoder: tuple[str, TinyDecoder]) -> None:
    built, _ = compile_model(decoder[0], seq_buckets=[8], enable_fp16=True, cache=False)
    ids = _ids(np.random.default_rng(8), 1, 5)
    with runtime_for(built, timeout_ms=0.0) as runtime:
        (got,) = runtime.run({"input_ids": ids})
    ref = decoder_reference(decoder[1], ids)
    assert np.max(np.abs(got - ref)) <= 1e-2 * np.max(np.abs(ref))


def test_a_model_whose_outputs_see_the_padding_is_refused(tmp_path: Path) -> None:
    prefix, _ = save_decoder(tmp_path, causal=False)
    with pytest.raises(CompileError, match=r"changes .* with what the padding to 4 holds"):
        compile_model(prefix, seq_buckets=[4, 8], cache=False)


def test_a_mask_feed_padded_with_its_value_makes_an_encoder_exact(tmp_path: Path) -> None:
    prefix, layer = save_decoder(tmp_path, causal=False, masked=True)
    with pytest.raises(CompileError, match=r"pad_values=\{'attention_mask': 0\}"):
        compile_model(prefix, seq_buckets=[8], cache=False)
    built, _ = compile_model(prefix, seq_buckets=[8], pad_values={"attention_mask": 0}, cache=False)
    assert built.sequence is not None and built.sequence.explicit == ("attention_mask",)
    rng = np.random.default_rng(9)
    ids = _ids(rng, 1, 6)
    mask = np.ones((1, 6), np.int64)
    mask[0, 5] = 0
    with runtime_for(built, timeout_ms=0.0) as runtime:
        (got,) = runtime.run({"input_ids": ids, "attention_mask": mask})
        np.testing.assert_allclose(got, decoder_reference(layer, ids, mask), **TOL)
        with pytest.raises(FeedError, match=r"feed 'attention_mask': expected sequence length 6"):
            runtime.run({"input_ids": ids, "attention_mask": mask[:, :5]})


def test_bad_bucket_options(decoder: tuple[str, TinyDecoder], tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="seq_buckets must be ints >= 1"):
        compile_model(decoder[0], seq_buckets=[0, 4], cache=False)
    with pytest.raises(OptionError, match="pad_values is given without seq_buckets"):
        compile_model(decoder[0], pad_values={"input_ids": 0}, cache=False)
    with pytest.raises(OptionError, match=r"names \['labels'\], which are not sequence feeds"):
        compile_model(decoder[0], seq_buckets=[4], pad_values={"labels": 0}, cache=False)


def test_buckets_on_a_model_without_a_sequence_axis_are_refused(tmp_path: Path) -> None:
    from support.models import build
    from support.serving_models import save

    prefix = save(build("mlp"), tmp_path)
    with pytest.raises(OptionError, match="no feed has a -1 dimension besides the batch"):
        compile_model(prefix, seq_buckets=[4], cache=False)


def test_a_plain_package_still_gets_a_plain_runtime(tmp_path: Path) -> None:
    from support.models import build
    from support.serving_models import save

    built, _ = compile_model(save(build("mlp"), tmp_path), cache=False)
    with runtime_for(built, timeout_ms=1.0) as runtime:
        assert type(runtime) is ModelRuntime


def test_buckets_of_a_legacy_pdmodel(tmp_path: Path) -> None:
    """A model saved by the legacy IR (a .pdmodel, as Paddle 2.x and most deployed
    models are) takes set_ipu_sequence_buckets too, and answers as Paddle's CPU
    executor does on the unpadded request."""
    import paddle

    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard(), paddle.utils.unique_name.guard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        scope = paddle.static.Scope()
        with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            x = paddle.static.data("x", [-1, -1, 8], "float32")
            y = paddle.nn.functional.relu(paddle.nn.Linear(8, 4)(x))
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            paddle.static.save_inference_model(str(tmp_path / "m"), [x], [y], exe, program=main)
            feed = np.random.default_rng(0).standard_normal((2, 5, 8)).astype("float32")
            (want,) = exe.run(main, feed={"x": feed}, fetch_list=[y])
    assert (tmp_path / "m.pdmodel").exists()
    config = inference.Config(str(tmp_path / "m"))
    config.enable_ipu(ipu_micro_batch_size=2)
    config.set_ipu_sequence_buckets([4, 8])
    config.disable_compile_cache()
    predictor = inference.create_predictor(config)
    (got,) = predictor.run([feed])
    predictor.close()
    assert got.shape == (2, 5, 4)
    np.testing.assert_allclose(got, want, **TOL)
