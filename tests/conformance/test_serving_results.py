"""paddle_ipu.inference: Paddle Inference's Config / create_predictor API on the IPU,
checked against Paddle Inference's own CPU predictor on the same saved model."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import paddle
import paddle.inference as paddle_inference
import pytest
from support.models import Built, build
from support.serving_models import save

from paddle_ipu import inference
from paddle_ipu.errors import FeedError, FetchError, NotSupportedError, OptionError


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, str]:
    paddle.enable_static()
    built = build("cnn")
    return built, save(built, tmp_path_factory.mktemp("saved"))


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))


def paddle_cpu(prefix: str, x: np.ndarray) -> np.ndarray:
    """Paddle Inference's CPU predictor: the oracle."""
    config = paddle_inference.Config(prefix + ".json", prefix + ".pdiparams")
    config.disable_gpu()
    predictor = paddle_inference.create_predictor(config)
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    handle.reshape(list(x.shape))
    handle.copy_from_cpu(x)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def test_handles_as_in_paddle_inference(saved: tuple[Built, str]) -> None:
    _, prefix = saved
    config = inference.Config(prefix + ".json", prefix + ".pdiparams")
    config.enable_ipu(ipu_device_num=1, ipu_micro_batch_size=4)
    config.set_ipu_config(ipu_enable_fp16=False)
    predictor = inference.create_predictor(config)
    assert predictor.get_input_names() == ["x"]
    x_handle = predictor.get_input_handle("x")
    # the declared shape, -1 for any number of rows (Paddle Inference answers [0] before
    # it holds data)
    assert x_handle.shape() == [-1, 1, 8, 8] and x_handle.type() == np.float32
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((4, 1, 8, 8)).astype(np.float32)
        x_handle.reshape([4, 1, 8, 8])
        x_handle.copy_from_cpu(x)
        predictor.run()
        out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
        np.testing.assert_allclose(out, paddle_cpu(prefix, x), rtol=1e-5, atol=1e-6)
    # run(list) returns the outputs, as in Paddle 2.5+
    (out,) = predictor.run([x])  # type: ignore[misc]
    np.testing.assert_allclose(out, paddle_cpu(prefix, x), rtol=1e-5, atol=1e-6)
    # another row count, as Paddle Inference takes any batch: in micro-batches of 4
    x3 = np.random.default_rng(7).standard_normal((3, 1, 8, 8)).astype(np.float32)
    x_handle.reshape([3, 1, 8, 8])
    x_handle.copy_from_cpu(x3)
    predictor.run()
    out_handle = predictor.get_output_handle(predictor.get_output_names()[0])
    np.testing.assert_allclose(
        out_handle.copy_to_cpu(), paddle_cpu(prefix, x3), rtol=1e-5, atol=1e-6
    )
    # a run that fails leaves no older result behind
    x_handle.copy_from_cpu(np.zeros((4, 1, 9, 9), np.float32))
    with pytest.raises(FeedError, match="'x'"):
        predictor.run()
    with pytest.raises(FetchError, match="holds no data"):
        out_handle.copy_to_cpu()
    with pytest.raises(FeedError, match="unknown input 'y'"):
        predictor.get_input_handle("y")
    with pytest.raises(FetchError, match="unknown output"):
        predictor.get_output_handle("nope")
    predictor.close()


def test_model_runtime_batches_clones_across_threads(saved: tuple[Built, str]) -> None:
    _, prefix = saved
    config = inference.Config(prefix)
    config.enable_ipu(ipu_micro_batch_size=8)
    config.set_ipu_config(ipu_enable_model_runtime_executor=True)
    first = inference.create_predictor(config)
    assert first.get_input_handle("x").shape() == [-1, 1, 8, 8]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((int(n), 1, 8, 8)).astype(np.float32) for n in rng.integers(1, 8, 12)]
    results: dict[int, np.ndarray] = {}

    def worker(i: int) -> None:
        p = first.clone()
        h = p.get_input_handle("x")
        h.reshape(list(xs[i].shape))
        h.copy_from_cpu(xs[i])
        p.run()
        results[i] = p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, x in enumerate(xs):
        np.testing.assert_allclose(results[i], paddle_cpu(prefix, x), rtol=1e-5, atol=1e-6)
    first.close()


def test_config_errors(saved: tuple[Built, str], tmp_path: Path) -> None:
    _, prefix = saved
    config = inference.Config(prefix)
    with pytest.raises(OptionError, match="enable_ipu"):
        inference.create_predictor(config)
    with pytest.raises(OptionError, match="ipu_micro_batch_size"):
        config.enable_ipu(ipu_micro_batch_size=0)
    with pytest.raises(NotSupportedError, match="ipu_replica_num=2"):
        config.set_ipu_config(ipu_replica_num=2)
    with pytest.raises(OptionError, match="ipu_available_memory_proportion"):
        config.set_ipu_config(ipu_available_memory_proportion=1.5)
    with pytest.raises(NotSupportedError, match="share"):
        inference.Config(prefix + ".json", str(tmp_path / "other.pdiparams"))
    # a model directory with one saved model is found
    assert inference.Config(str(Path(prefix).parent)).model_prefix() == prefix
