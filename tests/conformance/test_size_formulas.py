"""An open graph's output sizes as formulas of its open sizes (compiler/size_formulas):
every output shape against Paddle's own CPU executor at many sizes, the sizes the
model cannot take refused by name where Paddle's kernels refuse them, and a served
model with buckets cutting its outputs back by the formulas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
from support.helpers import fresh_programs

from paddle_ipu.compiler.open_shapes import OpenGraph, compile_open
from paddle_ipu.errors import CompileError


def _pyramid() -> tuple[Any, list[Any]]:
    """A feature pyramid's size arithmetic: strided convolutions, a transposed
    convolution back up added to its neighbour (so the two must have one size), a
    nearest upsampling to that neighbour's size (Resize of sizes from a Shape), a
    pooling, and a sequence of columns (a reshape from a shape)."""
    F = paddle.nn.functional
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    a = F.relu(paddle.nn.Conv2D(3, 8, 3, stride=2, padding=1)(x))
    b = F.relu(paddle.nn.Conv2D(8, 8, 3, stride=2, padding=1)(a))
    merged = a + paddle.nn.Conv2DTranspose(8, 8, 4, stride=2, padding=1)(b)
    up = F.interpolate(b, size=paddle.shape(a)[2:], mode="nearest")
    pooled = F.max_pool2d(merged + up, 3, stride=2, padding=1)
    columns = paddle.nn.Conv2D(8, 4, (1, 3), padding=(0, 1))(pooled.mean(axis=2, keepdim=True))
    seq = paddle.transpose(paddle.reshape(columns, [paddle.shape(columns)[0], 4, -1]), [0, 2, 1])
    return x, [merged, pooled, seq]


@pytest.fixture(scope="module")
def pyramid() -> tuple[Any, Any, list[Any], OpenGraph]:
    paddle.enable_static()
    with paddle.pir_utils.IrGuard(), fresh_programs(5) as (main, startup, scope):
        _, fetches = _pyramid()
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        with paddle.static.scope_guard(scope):
            model = compile_open(main, ["x"], fetches, scope=scope, micro_batch_size=1)
    return main, scope, fetches, OpenGraph(model)


def _paddle_shapes(pyramid: Any, h: int, w: int) -> list[tuple[int, ...]] | None:
    """The fetches' shapes by Paddle's CPU executor at ``h`` x ``w``; None when Paddle
    refuses that size."""
    main, scope, fetches, _ = pyramid
    feed = np.zeros((1, 3, h, w), "float32")
    with paddle.pir_utils.IrGuard(), paddle.static.scope_guard(scope):
        try:
            got = paddle.static.Executor(paddle.CPUPlace()).run(
                main, feed={"x": feed}, fetch_list=fetches
            )
        except Exception:  # Paddle's kernels refuse it (the add of unequal maps)
            return None
    return [tuple(g.shape) for g in got]


def test_formulas_give_paddles_shapes_and_refuse_what_paddle_refuses(pyramid: Any) -> None:
    graph = pyramid[3]
    formulas = graph.size_formulas()
    assert formulas is not None, "no size formulas for the pyramid"
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(6, 200, size=(30, 2))]
    taken = refused = 0
    for h, w in sizes:
        want = _paddle_shapes(pyramid, h, w)
        if want is None:
            with pytest.raises(CompileError, match=r"cannot take input 'x' axis [23] size \d+"):
                formulas.shapes({"x": (1, 3, h, w)})
            refused += 1
        else:
            assert formulas.shapes({"x": (1, 3, h, w)}) == want, (h, w)
            taken += 1
    assert taken >= 5 and refused >= 5, (taken, refused)  # both kinds were asked


def test_output_shapes_answer_from_formulas_after_they_agree_with_the_fold(
    pyramid: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = OpenGraph(pyramid[3].model)
    assert graph.size_formulas() is not None
    folds: list[Any] = []
    real = graph._folded
    monkeypatch.setattr(graph, "_folded", lambda s: folds.append(s) or real(s))
    for w in (40, 48, 56, 64, 72, 80):
        assert graph.output_shapes({"x": (1, 3, 32, w)}) == _paddle_shapes(pyramid, 32, w)
    assert len(folds) == 2  # the first two checked against the fold, the rest not
    # a size the model cannot take: refused by name, with the nearest sizes it takes
    with pytest.raises(CompileError, match=r"axis 3 size 42 \(the nearest it takes: \d+ and \d+\)"):
        graph.output_shapes({"x": (1, 3, 32, 42)})


def test_one_size_is_folded_without_looking_for_formulas(
    pyramid: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that runs one size (paddle-ipu run) must not spend seconds of a thread
    # beside its run on formulas it will not use, nor one whose shapes the fold's memo
    # answers (a bucketed run's cut rules and size, run again); a second fold starts
    # the search.
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path))
    graph = OpenGraph(pyramid[3].model)
    assert graph.output_shapes({"x": (1, 3, 32, 40)}) == _paddle_shapes(pyramid, 32, 40)
    assert graph._finding is None
    assert graph.output_shapes({"x": (1, 3, 32, 40)}) == _paddle_shapes(pyramid, 32, 40)
    assert graph._finding is None  # the memo's answer: nothing folded
    assert graph.output_shapes({"x": (1, 3, 32, 48)}) == _paddle_shapes(pyramid, 32, 48)
    assert graph._finding is not None
    assert graph.size_formulas() is not None


def test_the_folds_answers_are_kept_for_the_next_process(
    pyramid: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # paddle-ipu run is one process per run: a shape folded once is not folded again
    # by the next process (a new OpenGraph over the same graph and cache directory).
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path))
    first = OpenGraph(pyramid[3].model)
    assert first.output_shapes({"x": (1, 3, 32, 40)}) == _paddle_shapes(pyramid, 32, 40)
    again = OpenGraph(pyramid[3].model)
    monkeypatch.setattr(again, "_static", lambda s: pytest.fail(f"folded again at {s}"))
    assert again.output_shapes({"x": (1, 3, 32, 40)}) == _paddle_shapes(pyramid, 32, 40)
    assert again._finding is None  # answered from the memo: no formula search started
    # a damaged file is an empty memo: the shape is folded again, and kept again
    (memo,) = (tmp_path / "open-graph-shapes").iterdir()
    memo.write_text("{not json")
    third = OpenGraph(pyramid[3].model)
    assert third.output_shapes({"x": (1, 3, 32, 40)}) == _paddle_shapes(pyramid, 32, 40)
    assert '"x=3x32x40"' in memo.read_text()
    # `paddle-ipu cache clear` takes them with the packages
    from paddle_ipu.serving.cache import cache_clear

    cache_clear()
    assert not memo.exists()


def test_formulas_that_differ_from_the_fold_are_dropped(
    pyramid: Any, caplog: pytest.LogCaptureFixture
) -> None:
    graph = OpenGraph(pyramid[3].model)
    formulas = graph.size_formulas()
    assert formulas is not None
    formulas._outputs[0][3] = formulas._outputs[0][3] + 1  # a wrong formula
    with caplog.at_level("WARNING", "paddle_ipu"):
        for w in (40, 48, 56):
            assert graph.output_shapes({"x": (1, 3, 32, w)}) == _paddle_shapes(pyramid, 32, w)
    assert "size formulas gave outputs" in caplog.text and graph._agreed == -1


def test_a_served_model_with_buckets_cuts_by_the_formulas(tmp_path: Path, monkeypatch: Any) -> None:
    """Served with buckets after a warm-up: each size's outputs are cut back to
    Paddle's own shapes at that size, with the graph folded for none of them."""
    from paddle_ipu.serving import runtime_for
    from paddle_ipu.serving.saved_model import compile_model

    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    paddle.enable_static()
    with paddle.pir_utils.IrGuard(), fresh_programs(5) as (main, startup, scope):
        x, fetches = _pyramid()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        prefix = str(tmp_path / "model")
        paddle.static.save_inference_model(prefix, [x], fetches, exe, program=main)
    buckets = {"x": {"2": [32, 64], "3": [64, 128]}}
    package, _ = compile_model(prefix, micro_batch_size=1, shape_buckets=buckets)
    graph = package.open_graph()
    with runtime_for(package, timeout_ms=1.0) as runtime:
        runtime.warm_up()
        assert graph.size_formulas(wait=False) is not None
        folds: list[Any] = []
        real = graph._folded
        monkeypatch.setattr(graph, "_folded", lambda s: folds.append(s) or real(s))
        want_cpu = (main, scope, fetches, graph)
        for h, w in ((28, 60), (20, 100), (60, 36), (12, 124)):
            want = _paddle_shapes(want_cpu, h, w)
            assert want is not None, (h, w)
            got = runtime.run({"x": np.random.default_rng(h).random((1, 3, h, w), "float32")})
            assert [g.shape for g in got] == want, (h, w)
        assert folds == []


def test_a_shape_the_model_cannot_take_is_refused_by_its_size(pyramid: Any) -> None:
    """Made per shape (no buckets), a size Paddle's kernels refuse fails naming that
    size, not a fetch whose shape could not be inferred."""
    graph = OpenGraph(pyramid[3].model)
    assert _paddle_shapes(pyramid, 32, 42) is None
    with pytest.raises(CompileError, match=r"cannot take input 'x' axis 3 size 42"):
        graph.specialise({"x": (1, 3, 32, 42)})
    graph.specialise({"x": (1, 3, 32, 40)})  # a size it takes
