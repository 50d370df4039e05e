"""Models that leave input dimensions open, as Paddle's libraries export trained models
(an OCR detector's ``[-1, 3, -1, -1]``): compiled for concrete input shapes, each
compile against Paddle's own CPU executor on the same feed, in both IRs."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

import paddle_ipu
from paddle_ipu.compiler import compile_program
from paddle_ipu.errors import CompileError
from paddle_ipu.executor import executor_for

TOL = dict(rtol=2e-5, atol=2e-5)


def _detector_like() -> tuple[Any, Any]:
    """The operators that need sizes to lower: a strided conv, a squeeze-excite block
    (adaptive pooling to 1x1), a nearest upsampling by a scale, an adaptive pooling
    whose bins do not divide every input, and a reshape computed from a shape."""
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 8, 3, stride=2, padding=1)(x))
    se = paddle.nn.functional.adaptive_avg_pool2d(h, [1, 1])
    h = h * paddle.nn.functional.hardsigmoid(paddle.nn.Conv2D(8, 8, 1)(se))
    up = paddle.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest")
    pooled = paddle.nn.functional.adaptive_avg_pool2d(up, [3, 5])
    flat = paddle.reshape(pooled, [paddle.shape(pooled)[0], -1])
    return x, [up, flat]


def _build(legacy: bool) -> tuple[Any, Any, Any, Any]:
    with fresh_programs(5) as (main, startup, scope):
        x, fetches = _detector_like()
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, scope, x, fetches


@pytest.mark.parametrize("legacy", [False, True], ids=["pir", "legacy"])
def test_open_dimensions_compile_for_each_input_shape(legacy: bool) -> None:
    guard = paddle.pir_utils.OldIrGuard() if legacy else paddle.pir_utils.IrGuard()
    with guard:
        main, scope, _, fetches = _build(legacy)
        cpu = paddle.static.Executor(paddle.CPUPlace())
        for shape in ((2, 3, 32, 48), (2, 3, 20, 36)):
            feed = np.random.default_rng(sum(shape)).standard_normal(shape).astype("float32")
            with paddle.static.scope_guard(scope):
                want = cpu.run(main, feed={"x": feed}, fetch_list=fetches)
                model = compile_program(
                    main, ["x"], fetches, scope=scope, micro_batch_size=2,
                    input_shapes={"x": shape},
                )  # fmt: skip
            assert [s.shape for s in model.outputs] == [w.shape for w in want]
            strategy = paddle_ipu.IpuStrategy()
            strategy.set_graph_config(is_training=False, micro_batch_size=2)
            executor = executor_for(model, strategy)
            got = executor.run({"x": feed})
            executor.reset()
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, **TOL)


def test_the_shapes_come_from_paddle_without_holding_the_activations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the compile takes from its CPU runs of the program is each value's shape,
    not the value: fetching every activation held all of them at once (past 24 GB for
    PP-OCRv5's detector at 960x3424).  The compiled graph still matches Paddle's CPU."""
    real = paddle.static.Executor.run
    fetched: list[np.ndarray] = []

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        fetched.extend(np.asarray(o) for o in out)
        return out

    with paddle.pir_utils.IrGuard():
        main, scope, _, fetches = _build(False)
        shape = (1, 3, 96, 128)
        feed = np.random.default_rng(7).standard_normal(shape).astype("float32")
        with paddle.static.scope_guard(scope):
            want = paddle.static.Executor(paddle.CPUPlace()).run(
                main, feed={"x": feed}, fetch_list=fetches
            )
            monkeypatch.setattr(paddle.static.Executor, "run", recording)
            model = compile_program(main, ["x"], fetches, scope=scope, input_shapes={"x": shape})
            monkeypatch.undo()
    # the probe ran (twice: one and two rows) and fetched shapes: 1-d integers
    assert len(fetched) >= 2 * 8
    assert all(f.ndim == 1 and f.dtype.kind == "i" for f in fetched), {f.shape for f in fetched}
    assert sum(f.nbytes for f in fetched) < 1024
    strategy = paddle_ipu.IpuStrategy()
    strategy.set_graph_config(is_training=False, micro_batch_size=1)
    executor = executor_for(model, strategy)
    for g, w in zip(executor.run({"x": feed}), want):
        np.testing.assert_allclose(g, w, **TOL)
    executor.reset()


def test_shapes_the_model_does_not_take_are_refused_by_name() -> None:
    main, scope, _, fetches = _build(legacy=False)
    with paddle.static.scope_guard(scope):
        with pytest.raises(CompileError, match=r"input shape \[2, 4, 32, 48\] for feed 'x'"):
            compile_program(main, ["x"], fetches, scope=scope, input_shapes={"x": (2, 4, 32, 48)})
        with pytest.raises(CompileError, match=r"no input shape"):
            compile_program(main, ["x"], fetches, scope=scope, input_shapes={})
        with pytest.raises(CompileError, match=r"not feeds of the program"):
            compile_program(main, ["x"], fetches, scope=scope, input_shapes={"y": (1, 2)})


# -- the shape policy: a saved model with open dimensions through every route ----------


@pytest.fixture
def cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    d = tmp_path / "cache"
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The detector-like model saved as Paddle saves inference models (PIR .json), and
    Paddle's CPU executor on it: the oracle."""
    directory = tmp_path_factory.mktemp("open")
    main, scope, x, fetches = _build(legacy=False)
    prefix = str(directory / "model")
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        paddle.static.save_inference_model(prefix, [x], fetches, exe, program=main)

    def cpu(feed: np.ndarray) -> list[np.ndarray]:
        with paddle.static.scope_guard(scope):
            return [np.asarray(v) for v in exe.run(main, feed={"x": feed}, fetch_list=fetches)]

    return prefix, cpu


def _image(rows: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(rows * h + w).standard_normal((rows, 3, h, w)).astype("float32")


def test_the_predictor_compiles_once_per_input_shape_never_per_batch(
    saved: tuple[str, Any], cache_dir: Any
) -> None:
    from paddle_ipu import inference

    prefix, cpu = saved
    config = inference.Config(prefix)
    config.enable_ipu(ipu_micro_batch_size=2)
    predictor = inference.create_predictor(config)
    handle = predictor.get_input_handle("x")
    assert handle.shape() == [-1, 3, -1, -1]  # as declared, before a run
    for rows, h, w in ((1, 32, 48), (3, 32, 48), (2, 20, 36), (5, 20, 36), (2, 32, 48)):
        feed = _image(rows, h, w)
        got = predictor.run([feed])
        for g, want in zip(got, cpu(feed)):
            np.testing.assert_allclose(g, want, **TOL)
    shapes = predictor._shared.shapes.specialisations()  # least recently used first
    assert shapes == ["x=3x20x36", "x=3x32x48"]  # two shapes, whatever the rows
    predictor.close()


def test_shapes_beyond_the_bound_leave_memory_and_come_back_without_a_compile(
    saved: tuple[str, Any], cache_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shape is refused: with one specialisation in memory at most, each new shape
    sends the least recently used out, and a shape coming back is had from the compile
    cache (this model does not convert with its dimensions open), not compiled."""
    import paddle_ipu.pipeline as pipeline
    from paddle_ipu import inference

    prefix, cpu = saved
    config = inference.Config(prefix)
    config.enable_ipu()
    config.set_ipu_max_specialisations(1)
    predictor = inference.create_predictor(config)
    compiles: list[Any] = []
    real = pipeline.compile_model
    monkeypatch.setattr(
        pipeline, "compile_model", lambda *a, **k: compiles.append(k) or real(*a, **k)
    )
    shapes = predictor._shared.shapes
    for h, w in ((32, 48), (20, 36), (32, 48), (20, 36)):
        feed = _image(1, h, w)
        for g, want in zip(predictor.run([feed]), cpu(feed)):
            np.testing.assert_allclose(g, want, **TOL)
        assert shapes.specialisations() == [f"x=3x{h}x{w}"]
    stats = shapes.stats()
    assert (stats.made, stats.restored, stats.evicted, stats.resident) == (2, 2, 3, 1)
    assert len(compiles) == 2  # each shape compiled once; back from the compile cache
    predictor.close()


def test_input_shapes_compile_ahead_and_packages_hold_the_weights_once(
    saved: tuple[str, Any], cache_dir: Any, tmp_path: Any
) -> None:
    import json
    import zipfile

    from paddle_ipu.serving import runtime_for
    from paddle_ipu.serving.package import load_package
    from paddle_ipu.serving.saved_model import compile_model

    prefix, cpu = saved
    shapes = [{"x": [-1, 3, 32, 48]}, {"x": [1, 3, 20, 36]}]
    package, cached = compile_model(prefix, micro_batch_size=2, input_shapes=shapes)
    assert not cached and list(package.shapes) == ["x=3x32x48", "x=3x20x36"]
    again, cached = compile_model(prefix, micro_batch_size=2, input_shapes=shapes[:1])
    assert cached and list(again.shapes) == list(package.shapes)  # from the cache
    path = package.save(tmp_path / "open.pdipu")
    with zipfile.ZipFile(path) as zf:
        meta = json.loads(zf.read("meta.json"))
    graphs = meta["graphs"]
    assert [g["key"] for g in graphs] == ["x=3x32x48", "x=3x20x36"]
    # the parameters are stored once: both graphs name the same arrays for them
    params = [n for n in graphs[0]["weights"] if n in graphs[1]["weights"]]
    assert params and all(graphs[0]["weights"][n] == graphs[1]["weights"][n] for n in params)
    loaded = load_package(path)
    with runtime_for(loaded, timeout_ms=1.0) as runtime:
        for rows, h, w in ((3, 32, 48), (1, 20, 36)):
            feed = _image(rows, h, w)
            for g, want in zip(runtime.run({"x": feed}), cpu(feed)):
                np.testing.assert_allclose(g, want, **TOL)
        assert sorted(runtime.runtimes) == ["x=3x20x36", "x=3x32x48"]


def test_a_package_without_its_saved_model_takes_only_its_shapes(
    saved: tuple[str, Any], cache_dir: Any, tmp_path: Any
) -> None:
    import shutil

    from paddle_ipu.errors import NotSupportedError
    from paddle_ipu.serving.package import load_package
    from paddle_ipu.serving.saved_model import compile_model
    from paddle_ipu.serving.shaped import shape_executor

    prefix, _ = saved
    copy = tmp_path / "copy"
    copy.mkdir()
    for ext in (".json", ".pdiparams"):
        shutil.copy(prefix + ext, str(copy / "model") + ext)
    package, _ = compile_model(
        str(copy / "model"), input_shapes=[{"x": [1, 3, 32, 48]}], cache=False
    )
    path = package.save(tmp_path / "p.pdipu")
    shutil.rmtree(copy)
    executor = shape_executor(load_package(path))
    executor.run({"x": _image(1, 32, 48)})
    with pytest.raises(NotSupportedError, match=r"'x=3x20x36' is not among the shapes"):
        executor.run({"x": _image(1, 20, 36)})
    executor.close()


def test_the_command_line_compiles_input_shapes_and_runs_others(
    saved: tuple[str, Any], cache_dir: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from paddle_ipu import cli
    from paddle_ipu.serving.package import load_package

    prefix, cpu = saved
    out = tmp_path / "open.pdipu"
    argv = ["compile", prefix, "-o", str(out), "--input-shapes", "x:-1x3x32x48"]
    assert cli.main(argv) == 0
    assert "input shapes ['x=3x32x48']" in capsys.readouterr().out
    assert list(load_package(out).shapes) == ["x=3x32x48"]
    feed = _image(2, 20, 36)  # a shape the package was not compiled for
    np.save(tmp_path / "x.npy", feed)
    argv = ["run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path)]
    assert cli.main(argv) == 0
    names = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    for name, want in zip(names, cpu(feed)):
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), want, **TOL)
    assert cli.main(["compile", prefix, "-o", str(out), "--input-shapes", "x=1x3"]) != 0
    assert "--input-shapes must be NAME:DxDxD" in capsys.readouterr().err


INFERENCE_YML = """\
Global:
  model_name: detector_like
Hpi:
  backend_configs:
    paddle_infer:
      trt_dynamic_shapes:
        x:
        - [1, 3, 16, 16]
        - [1, 3, 32, 48]
        - [8, 3, 40, 64]
    tensorrt:
      dynamic_shapes:
        x:
        - [1, 3, 16, 16]
        - [1, 3, 32, 48]
        - [8, 3, 40, 64]
PreProcess:
  transform_ops:
  - NormalizeImage:
      mean: [0.485, 0.456, 0.406]
"""


@pytest.fixture
def exported(saved: tuple[str, Any], tmp_path: Any) -> str:
    """The saved model in a directory laid out as a PaddleX export: the model files
    and an ``inference.yml`` with its ``trt_dynamic_shapes``."""
    import shutil

    prefix, _ = saved
    for suffix in (".json", ".pdiparams"):
        shutil.copy(prefix + suffix, tmp_path / ("inference" + suffix))
    (tmp_path / "inference.yml").write_text(INFERENCE_YML)
    return str(tmp_path / "inference")


def test_the_ranges_of_a_paddlex_export_bound_the_open_dimensions(
    saved: tuple[str, Any], exported: str, cache_dir: Any, caplog: Any
) -> None:
    """Inside the ranges, shapes run as Paddle's CPU runs them (a batch over the ranges'
    8 too: rows run in micro-batches); outside, the run is refused naming the input,
    the dimension and its range, before anything compiles; ``set_ipu_shape_ranges({})``
    turns the bounds off."""
    import logging

    from paddle_ipu import inference
    from paddle_ipu.errors import FeedError

    _, cpu = saved
    config = inference.Config(exported)
    config.enable_ipu(ipu_micro_batch_size=2)
    with caplog.at_level(logging.INFO, logger="paddle_ipu"):
        predictor = inference.create_predictor(config)
    assert any("inference.yml" in r.getMessage() for r in caplog.records)
    for image in (_image(12, 32, 48), _image(1, 16, 16), _image(3, 40, 64)):
        for got, want in zip(predictor.run([image]), cpu(image)):
            np.testing.assert_allclose(got, want, **TOL)
    seen = predictor._shared.shapes.specialisations()
    for h, w, axis, size in ((48, 48, 2, 48), (20, 8, 3, 8)):
        with pytest.raises(FeedError, match=rf"'x': dimension {axis} must be in .*got {size}"):
            predictor.run([_image(1, h, w)])
    assert predictor._shared.shapes.specialisations() == seen  # nothing compiled
    predictor.close()

    config = inference.Config(exported)
    config.enable_ipu()
    config.set_ipu_shape_ranges({})
    predictor = inference.create_predictor(config)
    image = _image(1, 48, 48)
    for got, want in zip(predictor.run([image]), cpu(image)):
        np.testing.assert_allclose(got, want, **TOL)
    predictor.close()


def test_shape_ranges_that_do_not_fit_the_model_are_refused(exported: str) -> None:
    from paddle_ipu import inference
    from paddle_ipu.errors import OptionError
    from paddle_ipu.serving.saved_model import compile_model

    for ranges, match in (
        ({"y": [[1, 3, 8, 8], [1, 3, 9, 9]]}, "no feed 'y'"),
        ({"x": [[1, 8, 8], [1, 9, 9]]}, "rank 4"),
        ({"x": [[1, 2, 8, 8], [1, 2, 9, 9]]}, "dimension 1 ranges 2..2"),
        ({"x": [[1, 3, 9, 8], [1, 3, 8, 9]]}, "dimension 2 ranges 9..8"),
    ):
        with pytest.raises(OptionError, match=match):
            compile_model(exported, cache=False, shape_ranges=ranges)
    with pytest.raises(OptionError, match="set_ipu_shape_ranges: expected"):
        inference.Config(exported).set_ipu_shape_ranges({"x": [1, 3, 8, 8]})


def test_the_predictors_model_runtime_takes_open_shapes(
    saved: tuple[str, Any], cache_dir: Any
) -> None:
    """``ipu_enable_model_runtime_executor`` on a model compiled per input shape: the
    handles report the declared shapes before any shape is compiled, and runs of two
    shapes answer as Paddle's CPU executor does."""
    from paddle_ipu import inference

    prefix, cpu = saved
    config = inference.Config(prefix)
    config.enable_ipu()
    config.set_ipu_config(ipu_enable_model_runtime_executor=True)
    predictor = inference.create_predictor(config)
    (name,) = predictor.get_input_names()
    assert predictor.get_input_handle(name).shape() == [-1, 3, -1, -1]
    for image in (_image(3, 32, 48), _image(2, 20, 36)):
        for got, want in zip(predictor.run([image]), cpu(image)):
            np.testing.assert_allclose(got, want, **TOL)
    predictor.close()


def test_a_cache_hit_compiles_new_shapes_from_where_the_model_is_now(
    saved: tuple[str, Any], cache_dir: Any, tmp_path: Any
) -> None:
    """The compile cache keys a model by its files: the same files saved at another
    path (the first one deleted since) hit the cache, and a shape not compiled yet
    compiles from the new path."""
    import shutil

    from paddle_ipu.serving.saved_model import compile_model

    prefix, _ = saved
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        for suffix in (".json", ".pdiparams"):
            shutil.copy(prefix + suffix, d / ("model" + suffix))
    compile_model(str(first / "model"), input_shapes=[{"x": [-1, 3, 32, 48]}])
    shutil.rmtree(first)
    package, _ = compile_model(str(second / "model"), input_shapes=[{"x": [-1, 3, 24, 40]}])
    assert package.source == str(second / "model")
    assert sorted(package.shapes) == ["x=3x24x40", "x=3x32x48"]
