"""The specialisations of a model compiled per input shape: bounded in memory (the least
recently used leave and come back without a compile), one make per shape whoever asks,
a make never holding up the requests of shapes already made, and shape buckets (padded
up, outputs cut back) -- every answer against Paddle's own CPU executor."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

from paddle_ipu.errors import NotSupportedError

TOL = dict(rtol=2e-5, atol=2e-5)


def _pointwise() -> tuple[Any, list[Any]]:
    """1x1 convolutions: each output pixel sees its input pixel only, so a request
    padded up to a bucket and cut back is exact."""
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 8, 1)(x))
    return x, [paddle.nn.Conv2D(8, 2, 1)(h)]


def _flattened() -> tuple[Any, list[Any]]:
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.Conv2D(3, 2, 1)(x)
    return x, [paddle.reshape(h, [paddle.shape(h)[0], -1])]


def _pooled() -> tuple[Any, list[Any]]:
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.Conv2D(3, 4, 1)(x)
    return x, [h, paddle.nn.functional.adaptive_avg_pool2d(h, [1, 1])]


class Saved:
    def __init__(self, tmp: Path, net: Any) -> None:
        with paddle.pir_utils.IrGuard(), fresh_programs(11) as (main, startup, scope):
            x, fetches = net()
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            self.prefix = str(tmp / "model")
            paddle.static.save_inference_model(self.prefix, [x], fetches, exe, program=main)
        self.main, self.scope, self.fetches = main, scope, fetches

    def cpu(self, feed: np.ndarray) -> list[np.ndarray]:
        with paddle.pir_utils.IrGuard(), paddle.static.scope_guard(self.scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            return exe.run(self.main, feed={"x": feed}, fetch_list=self.fetches)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def pointwise(tmp_path: Path, cache_dir: Path) -> Saved:
    paddle.enable_static()
    return Saved(tmp_path, _pointwise)


def _image(h: int, w: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(h * 1000 + w).standard_normal((rows, 3, h, w)).astype("float32")


def _runtime(saved: Saved, **compile_options: Any) -> Any:
    from paddle_ipu.serving import runtime_for
    from paddle_ipu.serving.saved_model import compile_model

    package, _ = compile_model(saved.prefix, micro_batch_size=2, **compile_options)
    assert package.open is not None
    return runtime_for(package, timeout_ms=1.0)


def test_beyond_the_memory_bound_shapes_leave_and_come_back_without_a_compile(
    pointwise: Saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paddle_ipu.pipeline as pipeline

    with _runtime(pointwise, max_specialisations=2) as runtime:
        compiles: list[Any] = []
        real = pipeline.compile_model
        monkeypatch.setattr(
            pipeline, "compile_model", lambda *a, **k: compiles.append(k) or real(*a, **k)
        )
        sizes = [(8, 8), (8, 12), (12, 8), (16, 4), (8, 8), (8, 12), (4, 4)]
        for h, w in sizes:
            feed = _image(h, w, rows=3)
            for got, want in zip(runtime.run({"x": feed}), pointwise.cpu(feed)):
                np.testing.assert_allclose(got, want, **TOL)
            assert len(runtime.shapes.specialisations()) <= 2
        stats = runtime.specialisation_stats()
        assert (stats.made, stats.restored, stats.resident) == (5, 2, 2)
        assert stats.evicted == 5
        assert not compiles  # every shape made from the open graph
        assert sorted(runtime.runtimes) == ["x=3x4x4", "x=3x8x12"]  # the others closed
        # the counters of the runtimes closed stay in the model's
        assert runtime.stats().requests == len(sizes)


def test_a_shape_that_leaves_memory_is_freed_without_the_garbage_collector(
    pointwise: Saved,
) -> None:
    """Its runtime and executor held each other (the executor refuses direct runs once
    its runtime is closed): every shape that left stayed in memory, with its graph and
    its queue's buffers, until the collector's next full pass, and a server's memory
    grew with the sizes it had seen (issue 39's soak)."""
    import gc
    import weakref

    with _runtime(pointwise, max_specialisations=1) as runtime:
        gc.collect()
        gc.disable()
        try:
            left = []
            for h, w in [(8, 8), (8, 12), (12, 8), (4, 4)]:
                runtime.run({"x": _image(h, w)})
                left.append(
                    weakref.ref(runtime.shapes.resident(runtime.shapes.specialisations()[0]))
                )
            alive = [k for k, ref in enumerate(left[:-1]) if ref() is not None]
            assert not alive, f"shapes {alive} left memory but their executors are still alive"
            assert left[-1]() is not None  # the one in memory
        finally:
            gc.enable()


def test_concurrent_first_requests_of_one_new_shape_make_it_once(pointwise: Saved) -> None:
    with _runtime(pointwise) as runtime:
        feeds = [_image(8, 20, rows=1 + k % 3) for k in range(8)]
        start = threading.Barrier(len(feeds))
        answers: list[Any] = [None] * len(feeds)

        def client(k: int) -> None:
            start.wait()
            answers[k] = runtime.submit({"x": feeds[k]}).result(60)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(feeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for feed, got in zip(feeds, answers):
            np.testing.assert_allclose(got[0], pointwise.cpu(feed)[0], **TOL)
        assert runtime.specialisation_stats().made == 1


def test_a_make_under_way_holds_up_no_request_of_a_shape_made(
    pointwise: Saved, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The make of a new shape is held on a lock; requests of a shape already made are
    answered meanwhile, and the new shape's request once the make goes on."""
    with _runtime(pointwise) as runtime:
        made = _image(8, 8)
        runtime.run({"x": made})
        graph = runtime.package.open_graph()
        hold, entered = threading.Event(), threading.Event()
        real = graph.specialise

        def held(shapes: Any) -> Any:
            entered.set()
            assert hold.wait(60)
            return real(shapes)

        monkeypatch.setattr(graph, "specialise", held)
        new = _image(12, 12)
        pending = runtime.submit({"x": new})
        assert entered.wait(60)
        for _ in range(20):  # answered while the make is held
            got = runtime.submit({"x": made}).result(10)
            np.testing.assert_allclose(got[0], pointwise.cpu(made)[0], **TOL)
        assert not pending.done()
        hold.set()
        np.testing.assert_allclose(pending.result(60)[0], pointwise.cpu(new)[0], **TOL)


BUCKETS = {"x": {"2": [8, 16], "3": {"min": 8, "max": 24, "step": 8}}}


@pytest.mark.parametrize("pad", [0.5, "edge"])
def test_buckets_pad_requests_up_and_cut_their_outputs_back(pointwise: Saved, pad: Any) -> None:
    with _runtime(pointwise, shape_buckets=BUCKETS, pad_values={"x": pad}) as runtime:
        sizes = [(5, 7), (8, 8), (3, 20), (16, 9), (13, 24), (15, 17)]
        for h, w in sizes:
            feed = _image(h, w, rows=2)
            got = runtime.run({"x": feed})
            want = pointwise.cpu(feed)
            assert got[0].shape == want[0].shape == (2, 2, h, w)
            np.testing.assert_allclose(got[0], want[0], **TOL)
        # past the grid's largest size: its own specialisation, never a refusal
        feed = _image(20, 30)
        np.testing.assert_allclose(runtime.run({"x": feed})[0], pointwise.cpu(feed)[0], **TOL)
        keys = sorted(runtime.shapes.specialisations())
        assert keys == ["x=3x16x16", "x=3x16x24", "x=3x20x30", "x=3x8x24", "x=3x8x8"]


def test_buckets_of_an_output_that_cannot_be_cut_back_are_refused(
    tmp_path: Path, cache_dir: Path
) -> None:
    paddle.enable_static()
    saved = Saved(tmp_path, _flattened)
    with pytest.raises(NotSupportedError, match=r"output .* axis 1 follows input .* and input"):
        _runtime(saved, shape_buckets=BUCKETS)


def test_an_output_that_follows_no_bucketed_axis_is_not_cut(
    tmp_path: Path, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paddle.enable_static()
    saved = Saved(tmp_path, _pooled)
    with caplog.at_level("INFO", "paddle_ipu"), _runtime(saved, shape_buckets=BUCKETS) as rt:
        feed = _image(8, 8)  # a bucket's own size: nothing padded, the pooling exact
        for got, want in zip(rt.run({"x": feed}), saved.cpu(feed)):
            np.testing.assert_allclose(got, want, **TOL)
        got = rt.run({"x": _image(5, 7)})
        assert got[0].shape == (1, 4, 5, 7) and got[1].shape == (1, 4, 1, 1)
    assert "follows no bucketed axis: it is not cut back" in caplog.text


def test_the_predictor_takes_buckets_and_a_memory_bound(pointwise: Saved) -> None:
    from paddle_ipu import inference

    config = inference.Config(pointwise.prefix)
    config.enable_ipu(ipu_micro_batch_size=2)
    config.set_ipu_shape_buckets(BUCKETS, {"x": -1.0})
    config.set_ipu_specialisation_memory(1e-6)  # every new shape sends the others out
    predictor = inference.create_predictor(config)
    for h, w in ((5, 7), (9, 9), (3, 20), (5, 7)):
        feed = _image(h, w, rows=3)
        np.testing.assert_allclose(predictor.run([feed])[0], pointwise.cpu(feed)[0], **TOL)
    shapes = predictor._shared.shapes
    assert shapes.specialisations() == ["x=3x8x8"]
    stats = shapes.stats()
    assert (stats.made, stats.restored, stats.evicted) == (3, 1, 3)
    predictor.close()


def test_paddles_own_config_takes_buckets_and_a_memory_bound(pointwise: Saved) -> None:
    """``paddle.inference.Config`` (with ``import paddle_ipu``) hands the buckets and the
    memory bound on: its predictor pads and evicts as paddle_ipu's own Config's does, and
    answers as Paddle Inference's CPU predictor of the same Config without the IPU."""
    import paddle.inference as paddle_inference

    from paddle_ipu import inference

    def run(predictor: Any, feed: np.ndarray) -> np.ndarray:
        predictor.get_input_handle("x").copy_from_cpu(feed)
        predictor.run()
        out = predictor.get_output_handle(predictor.get_output_names()[0])
        return np.asarray(out.copy_to_cpu())

    files = (f"{pointwise.prefix}.json", f"{pointwise.prefix}.pdiparams")
    cpu = paddle_inference.create_predictor(paddle_inference.Config(*files))
    predictors = []
    for config in (paddle_inference.Config(*files), inference.Config(*files)):
        config.enable_ipu(ipu_micro_batch_size=2)
        config.set_ipu_shape_buckets(BUCKETS, {"x": -1.0})
        config.set_ipu_specialisation_memory(1e-6)
        predictors.append(
            (
                paddle_inference if isinstance(config, paddle_inference.Config) else inference
            ).create_predictor(config)
        )
    paddles, ours = predictors
    for h, w in ((5, 7), (9, 9), (3, 20), (5, 7)):
        feed = _image(h, w, rows=3)
        want = run(cpu, feed)
        np.testing.assert_allclose(run(paddles, feed), want, **TOL)
        np.testing.assert_allclose(run(ours, feed), want, **TOL)
    shapes = paddles._shared.shapes
    assert shapes.specialisations() == ours._shared.shapes.specialisations() == ["x=3x8x8"]
    got, expected = shapes.stats(), ours._shared.shapes.stats()
    assert (got.made, got.restored, got.evicted) == (
        expected.made,
        expected.restored,
        expected.evicted,
    )
    assert got.evicted > 0
    for predictor in predictors:
        predictor.close()


def test_a_warm_up_makes_the_declared_shapes(
    pointwise: Saved, caplog: pytest.LogCaptureFixture
) -> None:
    with _runtime(pointwise, shape_buckets=BUCKETS, input_shapes=[{"x": [1, 3, 8, 8]}]) as rt:
        with caplog.at_level("INFO", "paddle_ipu"):
            made = rt.warm_up()
        assert made[0] == "x=3x8x8" and len(made) == 6  # 2 x 3 buckets
        # the largest shape made ran once (its session set up), and no request counted
        assert "warm-up ran input shape x=3x16x24 once, on zeros" in caplog.text
        assert rt.stats().requests == 0 and rt.stats().runs == 0
        before = rt.specialisation_stats().made
        start = time.perf_counter()
        rt.run({"x": _image(16, 20)})
        assert rt.specialisation_stats().made == before, time.perf_counter() - start


def test_a_warm_up_under_the_memory_bound_keeps_the_smallest_buckets(pointwise: Saved) -> None:
    """A warm-up stops before a bucket whose graph and step buffers (a run's rows of its
    input) would pass the bound, and leaves its smallest buckets (made first, the most
    often asked) the most recently used: the largest leave memory first when requests
    bring new shapes."""
    grid = {"x": {"2": [64, 512], "3": [64, 512, 2048]}}  # 512 x 2048: 25 MB of buffers
    with _runtime(pointwise, shape_buckets=grid, memory_mb=30) as rt:
        made = rt.warm_up()
        stats = rt.specialisation_stats()
        assert made[0] == "x=3x64x64" and 3 <= len(made) < 6, made
        assert stats.evicted == 0, stats
        assert stats.resident_bytes <= stats.bound_bytes, stats
        # least recently used first: the largest leave first when new shapes come
        assert rt.shapes.specialisations() == made[::-1]
        feed = _image(500, 2000)  # bucket 512 x 2048, not made: the largest made leaves
        np.testing.assert_allclose(rt.run({"x": feed})[0], pointwise.cpu(feed)[0], **TOL)
        assert "x=3x64x64" in rt.shapes.specialisations()
        assert made[-1] not in rt.shapes.specialisations()


def test_the_command_line_compiles_buckets_and_runs_any_size(
    pointwise: Saved, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from paddle_ipu import cli
    from paddle_ipu.serving.package import load_package

    out = tmp_path / "buckets.pdipu"
    argv = ["compile", pointwise.prefix, "-o", str(out), "--shape-buckets", json.dumps(BUCKETS)]
    assert cli.main([*argv, "--pad-value", "x=0.5"]) == 0
    capsys.readouterr()
    policy = load_package(out).policy
    assert policy is not None and policy.buckets is not None
    assert policy.buckets.grids["x"] == {2: (8, 16), 3: (8, 16, 24)}
    assert policy.buckets.pad_values == {"x": 0.5}
    for h, w in ((5, 7), (11, 19)):
        feed = _image(h, w, rows=2)
        np.save(tmp_path / "x.npy", feed)
        run = ["run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path)]
        assert cli.main(run) == 0
        name = capsys.readouterr().out.split(":")[0]
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), pointwise.cpu(feed)[0], **TOL)
    assert cli.main([*argv[:4], "--shape-buckets", "{not json"]) != 0
    assert "--shape-buckets must be 'auto', a JSON object" in capsys.readouterr().err


def test_on_popart_buckets_are_seeded_by_default(pointwise: Saved) -> None:
    """On the IPU a new input shape is a compile of minutes: a model compiled for the
    popart backend pads up to buckets seeded from its declared shapes by default."""
    from paddle_ipu.serving.saved_model import compile_model

    shapes = [{"x": [1, 3, 32, 48]}, {"x": [1, 3, 16, 64]}]
    package, _ = compile_model(pointwise.prefix, backend="popart", input_shapes=shapes)
    assert package.policy is not None and package.policy.buckets is not None
    assert package.policy.buckets.grids == {"x": {2: (16, 32), 3: (48, 64)}}
    host, _ = compile_model(pointwise.prefix, input_shapes=shapes)
    assert host.policy is not None and host.policy.buckets is None


def test_a_shape_that_does_not_fit_an_ipu_is_refused_by_name(pointwise: Saved) -> None:
    """The host's memory check refuses a shape an IPU cannot hold (8 x 4000 x 4000
    float32 activations: 512 MB, and more); the error names that shape, and the model
    goes on answering the shapes that fit."""
    from paddle_ipu.errors import IpuMemoryError

    with _runtime(pointwise) as runtime:
        big = np.zeros((1, 3, 4000, 4000), "float32")
        with pytest.raises(
            IpuMemoryError, match=r"input shape x=3x4000x4000: the model does not fit"
        ):
            runtime.run({"x": big})
        feed = _image(8, 8)
        np.testing.assert_allclose(runtime.run({"x": feed})[0], pointwise.cpu(feed)[0], **TOL)


def test_a_warm_up_stops_at_a_bucket_that_does_not_fit_an_ipu(
    pointwise: Saved, caplog: pytest.LogCaptureFixture
) -> None:
    """A grid's bucket an IPU cannot hold ends the warm-up with a warning, and the model
    serves the shapes that fit; a declared shape that does not fit fails the warm-up."""
    from paddle_ipu.errors import IpuMemoryError

    grid = {"x": {"2": [8, 4000], "3": [8, 4000]}}
    with _runtime(pointwise, shape_buckets=grid) as rt:
        with caplog.at_level("WARNING", "paddle_ipu"):
            made = rt.warm_up()
        assert made == ["x=3x8x8", "x=3x8x4000", "x=3x4000x8"]
        assert "warm-up stops after 3 of 4 shapes: input shape x=3x4000x4000: the model" in (
            caplog.text
        )
        feed = _image(5, 7)
        np.testing.assert_allclose(rt.run({"x": feed})[0], pointwise.cpu(feed)[0], **TOL)
    declared = [{"x": [1, 3, 4000, 4000]}]
    with (
        _runtime(pointwise, shape_buckets=grid, input_shapes=declared) as rt,
        pytest.raises(IpuMemoryError, match="input shape x=3x4000x4000"),
    ):
        rt.warm_up()
