"""A plain static program on the "ipu" place -- no IpuCompiledProgram -- trains and
infers exactly as Paddle's CPU executor does on the same program from the same
weights (the oracle), or raises; it never runs op by op where an in-place update
would be lost."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from support.helpers import run_python  # noqa: E402

import paddle_ipu  # noqa: E402
from paddle_ipu.errors import NotSupportedError  # noqa: E402
from paddle_ipu.frontends import implicit  # noqa: E402

IPU = paddle.CustomPlace("ipu", 0)
STEPS = 12


@contextlib.contextmanager
def _guard(seed: int) -> Iterator[tuple[Any, Any]]:
    paddle.seed(seed)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        yield main, startup


def _params(main: Any) -> list[str]:
    return sorted(
        str(op.attrs()["parameter_name"])
        for op in main.global_block().ops
        if op.name() == "builtin.parameter"
    )


def build_classifier(make_opt: Callable[[], Any] | None, seed: int = 5) -> tuple[Any, ...]:
    with _guard(seed) as (main, startup):
        x = paddle.static.data("x", [-1, 12], "float32")
        y = paddle.static.data("y", [-1, 1], "int64")
        h = paddle.nn.functional.relu(paddle.static.nn.fc(x, 16))
        logits = paddle.static.nn.fc(h, 5)
        loss = paddle.nn.functional.cross_entropy(logits, y)
        if make_opt is not None:
            make_opt().minimize(loss)
    return main, startup, loss, logits


def build_cnn(seed: int = 9) -> tuple[Any, ...]:
    with _guard(seed) as (main, startup):
        x = paddle.static.data("x", [-1, 1, 6, 6], "float32")
        y = paddle.static.data("y", [-1, 1], "int64")
        conv = paddle.nn.Conv2D(1, 4, 3, padding=1)
        bn = paddle.nn.BatchNorm2D(4)
        fc = paddle.nn.Linear(4 * 3 * 3, 3)
        h = paddle.nn.functional.max_pool2d(paddle.nn.functional.relu(bn(conv(x))), 2)
        logits = fc(paddle.flatten(h, 1))
        loss = paddle.nn.functional.cross_entropy(logits, y)
        paddle.optimizer.Momentum(0.05, momentum=0.9).minimize(loss)
    return main, startup, loss, logits


def batches(n: int, shape: tuple[int, ...] = (12,), classes: int = 5, rows: int = 8) -> list:
    rng = np.random.default_rng(11)
    return [
        {
            "x": rng.standard_normal((rows, *shape)).astype("float32"),
            "y": rng.integers(0, classes, (rows, 1)).astype("int64"),
        }
        for _ in range(n)
    ]


def train(place: Any, build: Callable[[], tuple[Any, ...]], feeds: list) -> dict[str, Any]:
    """Run startup + the training loop on ``place`` in a fresh scope."""
    main, startup, loss, _ = build()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(place)
        exe.run(startup)
        # Positions, not names: two builds of one model get different unique names.
        init = {i: np.array(scope.find_var(n).get_tensor()) for i, n in enumerate(_params(main))}
        losses = [np.asarray(exe.run(main, feed=f, fetch_list=[loss])[0]) for f in feeds]
    final = {i: np.array(scope.find_var(n).get_tensor()) for i, n in enumerate(_params(main))}
    return {"losses": losses, "init": init, "final": final, "scope": scope, "main": main}


OPTIMIZERS = {
    "sgd": lambda: paddle.optimizer.SGD(0.1),
    "momentum": lambda: paddle.optimizer.Momentum(0.05, momentum=0.9),
    "adam": lambda: paddle.optimizer.Adam(0.01),
    "adamw": lambda: paddle.optimizer.AdamW(0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_plain_training_loop_on_ipu_place_matches_cpu(name: str) -> None:
    feeds = batches(STEPS)
    build = lambda: build_classifier(OPTIMIZERS[name])  # noqa: E731
    cpu = train(paddle.CPUPlace(), build, feeds)
    ipu = train(IPU, build, feeds)
    for n in cpu["init"]:
        np.testing.assert_array_equal(ipu["init"][n], cpu["init"][n])
    moved = sum(float(np.abs(cpu["final"][n] - cpu["init"][n]).sum()) for n in cpu["final"])
    assert moved > 1e-3  # the CPU run did train
    for step, (a, b) in enumerate(zip(ipu["losses"], cpu["losses"])):
        assert a.shape == b.shape, f"step {step}: loss shape {a.shape} != CPU's {b.shape}"
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=f"loss of step {step}")
    for n in cpu["final"]:
        np.testing.assert_allclose(
            ipu["final"][n], cpu["final"][n], rtol=1e-4, atol=1e-5, err_msg=f"weight {n}"
        )


def test_set_device_ipu_and_default_executor_train() -> None:
    feeds = batches(6)
    build = lambda: build_classifier(OPTIMIZERS["adam"])  # noqa: E731
    cpu = train(paddle.CPUPlace(), build, feeds)
    previous = paddle.get_device()
    paddle.set_device("ipu")
    try:
        main, startup, loss, _ = build()
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor()
            exe.run(startup)
            losses = [float(exe.run(main, feed=f, fetch_list=[loss])[0]) for f in feeds]
            final = {
                i: np.array(scope.find_var(n).get_tensor()) for i, n in enumerate(_params(main))
            }
    finally:
        paddle.set_device(previous)
    np.testing.assert_allclose(losses, [float(v) for v in cpu["losses"]], rtol=2e-5)
    for n in final:
        np.testing.assert_allclose(final[n], cpu["final"][n], rtol=1e-4, atol=1e-5)


def test_batchnorm_cnn_trains_with_running_stats_like_cpu() -> None:
    feeds = batches(6, shape=(1, 6, 6), classes=3)
    cpu = train(paddle.CPUPlace(), build_cnn, feeds)
    ipu = train(IPU, build_cnn, feeds)
    np.testing.assert_allclose(
        [float(v) for v in ipu["losses"]], [float(v) for v in cpu["losses"]], rtol=1e-4
    )
    for n in cpu["final"]:
        np.testing.assert_allclose(ipu["final"][n], cpu["final"][n], rtol=1e-3, atol=1e-5)
    # The running mean and variance are persistable state the CPU updates too.
    stats = [
        n
        for n in ipu["scope"].local_var_names()
        if n.startswith("batch_norm") and ("mean" in n or "variance" in n)
    ]
    for n in stats:
        got = np.array(ipu["scope"].find_var(n).get_tensor())
        want = np.array(cpu["scope"].find_var(n).get_tensor())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=n)


def test_weights_reach_the_scope_after_each_step_for_save_and_cpu() -> None:
    """paddle.static.save and a CPU executor see the updates of every step."""
    feeds = batches(4)
    main, startup, loss, logits = build_classifier(OPTIMIZERS["sgd"])
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        before = {n: np.array(scope.find_var(n).get_tensor()) for n in _params(main)}
        exe.run(main, feed=feeds[0], fetch_list=[loss])
        after = {n: np.array(scope.find_var(n).get_tensor()) for n in _params(main)}
        assert any(not np.array_equal(before[n], after[n]) for n in before)
        # The scope holds the updated weights: the forward computed from them in
        # numpy is what the next run's logits are (a CPU executor reads the same).
        names = _params(main)  # b_0, w_0 of fc_0, then of fc_1
        w = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
        b1, w1, b2, w2 = (w[n] for n in names)
        x = feeds[1]["x"]
        want = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        sgd_main, _, _, sgd_logits = main, None, None, logits
        got = exe.run(sgd_main, feed=feeds[1], fetch_list=[sgd_logits, loss])[0]
    # The fetched logits are the forward of this step, before its update.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_paddle_static_save_after_implicit_training_holds_the_update(tmp_path) -> None:
    main, startup, loss, _ = build_classifier(OPTIMIZERS["adam"])
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        for f in batches(3):
            exe.run(main, feed=f, fetch_list=[loss])
        trained = {n: np.array(scope.find_var(n).get_tensor()) for n in _params(main)}
        paddle.static.save(main, str(tmp_path / "m"))
    fresh = paddle.static.Scope()
    with paddle.static.scope_guard(fresh):
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        paddle.static.load(main, str(tmp_path / "m"))
        for n, value in trained.items():
            np.testing.assert_array_equal(np.array(fresh.find_var(n).get_tensor()), value)


def test_scope_changes_between_runs_reach_the_device() -> None:
    """A weight set in the scope between two runs (a load, another program) is used."""
    main, startup, _loss, logits = build_classifier(None)
    feed = batches(1)[0]
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        first = exe.run(main, feed=feed, fetch_list=[logits])[0]
        name = _params(main)[0]
        tensor = scope.find_var(name).get_tensor()
        tensor.set(np.array(tensor) + 0.5, paddle.CPUPlace())
        second = exe.run(main, feed=feed, fetch_list=[logits])[0]
        want = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=feed, fetch_list=[logits])[
            0
        ]
    assert not np.allclose(first, second)
    np.testing.assert_allclose(second, want, rtol=1e-5, atol=1e-6)


def test_inference_program_matches_cpu_and_caches_per_shape(monkeypatch) -> None:
    main, startup, loss, logits = build_classifier(None)
    compiles: list[int] = []
    original = implicit._ImplicitCompile.compile.__func__

    def counting(cls: Any, *args: Any, **kwargs: Any) -> Any:
        compiles.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(implicit._ImplicitCompile, "compile", classmethod(counting))
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        cpu = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        for rows in (8, 8, 3, 8, 3):
            feed = batches(1, rows=rows)[0]
            got = exe.run(main, feed=feed, fetch_list=[logits, loss])
            want = cpu.run(main, feed=feed, fetch_list=[logits, loss])
            for g, w in zip(got, want):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert len(compiles) == 2  # one per feed shape, then cached


def test_return_numpy_false_gives_tensors() -> None:
    main, startup, _loss, logits = build_classifier(None)
    feed = batches(1)[0]
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        (out,) = exe.run(main, feed=feed, fetch_list=[logits], return_numpy=False)
        want = exe.run(main, feed=feed, fetch_list=[logits])[0]
    assert not isinstance(out, np.ndarray)
    np.testing.assert_array_equal(np.array(out), want)


def test_training_without_fetches_still_trains() -> None:
    main, startup, _loss, _ = build_classifier(OPTIMIZERS["sgd"])
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        before = {n: np.array(scope.find_var(n).get_tensor()) for n in _params(main)}
        assert exe.run(main, feed=batches(1)[0]) == []
        after = {n: np.array(scope.find_var(n).get_tensor()) for n in _params(main)}
    assert any(not np.array_equal(before[n], after[n]) for n in before)


def test_switched_off_it_raises_instead_of_losing_updates(monkeypatch) -> None:
    monkeypatch.setenv(implicit.ENV_FLAG, "0")
    main, startup, loss, _ = build_classifier(OPTIMIZERS["sgd"])
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)  # the startup program writes nothing in place: it runs
        with pytest.raises(NotSupportedError, match=r"sgd_.*PADDLE_IPU_IMPLICIT_COMPILE"):
            exe.run(main, feed=batches(1)[0], fetch_list=[loss])


def test_switched_off_inference_runs_on_paddles_executor(monkeypatch) -> None:
    monkeypatch.setenv(implicit.ENV_FLAG, "0")
    main, startup, _loss, logits = build_classifier(None)
    feed = batches(1)[0]
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        got = exe.run(main, feed=feed, fetch_list=[logits])[0]
        want = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=feed, fetch_list=[logits])
    np.testing.assert_allclose(got, want[0], rtol=1e-6)
    assert not getattr(main, implicit._CACHE_ATTR, None)


def test_cpu_place_is_untouched() -> None:
    main, startup, loss, _ = build_classifier(OPTIMIZERS["sgd"])
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        exe.run(main, feed=batches(1)[0], fetch_list=[loss])
    assert not getattr(main, implicit._CACHE_ATTR, None)


def test_program_changed_after_first_run_recompiles() -> None:
    main, startup, _loss, logits = build_classifier(None)
    feed = batches(1)[0]
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        exe.run(main, feed=feed, fetch_list=[logits])
        with paddle.static.program_guard(main, startup):
            doubled = paddle.scale(logits, 2.0)
        got = exe.run(main, feed=feed, fetch_list=[doubled])[0]
        want = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=feed, fetch_list=[doubled])[
            0
        ]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_patch_is_reversible() -> None:
    from paddle_ipu.frontends import run_hook as _patch

    patched = paddle.static.Executor.run
    assert _patch.installed()
    paddle_ipu.uninstall_hooks()
    try:
        assert paddle.static.Executor.run is patched.__paddle_ipu_original__
        # Without the hook a training program on the ipu place is Paddle's again.
        assert not _patch.installed()
    finally:
        paddle_ipu.install_hooks()
    assert paddle.static.Executor.run is not patched.__paddle_ipu_original__


def test_dygraph_on_ipu_place_matches_cpu_bit_for_bit(dygraph: None) -> None:
    def run(place: str) -> tuple[list[float], np.ndarray]:
        paddle.set_device(place)
        paddle.seed(3)
        net = paddle.nn.Sequential(paddle.nn.Linear(6, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))
        opt = paddle.optimizer.Adam(0.01, parameters=net.parameters())
        rng = np.random.default_rng(2)
        losses = []
        for _ in range(5):
            x = paddle.to_tensor(rng.standard_normal((4, 6)).astype("float32"))
            loss = (net(x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.clear_grad()
            losses.append(float(loss))
        return losses, net[0].weight.numpy()

    previous = paddle.get_device()
    try:
        cpu = run("cpu")
        ipu = run("ipu")
    finally:
        paddle.set_device(previous)
    assert ipu[0] == cpu[0]
    np.testing.assert_array_equal(ipu[1], cpu[1])


# A plain training loop on the ipu place, as a fresh interpreter runs it.
_FRESH_TRAINING = """
import sys
import numpy as np, paddle{extra_import}
print("LOADED", "paddle_ipu" in sys.modules)
paddle.enable_static()
paddle.set_device("ipu")
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 4], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 1) ** 2)
    paddle.optimizer.SGD(0.1).minimize(loss)
exe = paddle.static.Executor()
exe.run(startup)
feed = {{"x": np.ones((2, 4), "float32")}}
a = float(exe.run(main, feed=feed, fetch_list=[loss])[0])
b = float(exe.run(main, feed=feed, fetch_list=[loss])[0])
print("LOSSES", a, b)
"""


def _fresh_losses(result: Any) -> tuple[float, float]:
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(s for s in result.stdout.splitlines() if s.startswith("LOSSES"))
    a, b = (float(v) for v in line.split()[1:])
    return a, b


def test_plain_training_in_a_fresh_process() -> None:
    """The README's promise from a clean interpreter: import, set_device, train."""
    a, b = _fresh_losses(run_python(_FRESH_TRAINING.format(extra_import=", paddle_ipu")))
    assert b < a


def test_import_paddle_alone_routes_the_ipu_place() -> None:
    """The installed import hook loads paddle_ipu once paddle is imported, so a script
    that never imports paddle_ipu trains on the ipu place too; it can be turned off."""
    code = _FRESH_TRAINING.format(extra_import="")
    result = run_python(code)
    a, b = _fresh_losses(result)
    assert "LOADED True" in result.stdout
    assert b < a
    off = run_python(code, env={"PADDLE_IPU_AUTOLOAD": "0"})
    assert "LOADED False" in off.stdout, off.stderr[-2000:]


def _with_lgamma(training: bool) -> tuple[Any, ...]:
    """A program holding an operator that does not lower (lgamma)."""
    with _guard(13) as (main, startup):
        x = paddle.static.data("x", [-1, 12], "float32")
        h = paddle.static.nn.fc(x, 4)
        out = paddle.lgamma(paddle.nn.functional.softplus(h) + 1.0)
        loss = paddle.mean(out)
        if training:
            paddle.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss, out


def test_uncompilable_inference_program_runs_op_by_op_like_cpu(caplog) -> None:
    main, startup, _loss, out = _with_lgamma(False)
    feed = {"x": batches(1)[0]["x"]}
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        with caplog.at_level("WARNING", logger="paddle_ipu"):
            got = exe.run(main, feed=feed, fetch_list=[out])[0]
        want = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=feed, fetch_list=[out])
    np.testing.assert_allclose(got, want[0], rtol=1e-6)
    assert "lgamma" in caplog.text and "op by op" in caplog.text


def test_uncompilable_training_program_raises_naming_the_in_place_op() -> None:
    main, startup, loss, _out = _with_lgamma(True)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(IPU)
        exe.run(startup)
        with pytest.raises(paddle_ipu.UnsupportedOpError, match=r"(?s)lgamma.*sgd_.*CPUPlace"):
            exe.run(main, feed={"x": batches(1)[0]["x"]}, fetch_list=[loss])


def test_legacy_ir_training_program_on_ipu_place_compiles() -> None:
    """A legacy-IR training program on the ipu place is compiled implicitly through
    its PIR translation: it trains as on the CPU, and the scope sees the updates."""
    code = """
import numpy as np, paddle, paddle_ipu
paddle.enable_static()
out = {}
for place in ("cpu", "ipu"):
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        scope = paddle.static.Scope()
        paddle.seed(1)
        with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 4], "float32")
            loss = paddle.mean(paddle.static.nn.fc(x, 1) ** 2)
            paddle.optimizer.SGD(0.1).minimize(loss)
            exe = paddle.static.Executor(
                paddle.CPUPlace() if place == "cpu" else paddle.CustomPlace("ipu", 0))
            exe.run(startup)
            feed = {"x": np.arange(8, dtype="float32").reshape(2, 4) / 8}
            losses = [float(exe.run(main, feed=feed, fetch_list=[loss])[0]) for _ in range(5)]
            w = np.asarray(scope.find_var("fc_0.w_0").get_tensor()).copy()
    out[place] = (losses, w)
assert out["cpu"][0][0] != out["cpu"][0][-1]
np.testing.assert_allclose(out["ipu"][0], out["cpu"][0], rtol=1e-6)
np.testing.assert_allclose(out["ipu"][1], out["cpu"][1], rtol=1e-6)
print("SAME")
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "SAME" in result.stdout


def test_legacy_ir_training_program_refused_without_implicit_compile() -> None:
    code = """
import numpy as np, paddle, paddle_ipu
paddle.enable_static()
with paddle.pir_utils.OldIrGuard():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        loss = paddle.mean(paddle.static.nn.fc(x, 1) ** 2)
        paddle.optimizer.SGD(0.1).minimize(loss)
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    exe.run(startup)
    try:
        exe.run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[loss])
    except paddle_ipu.NotSupportedError as exc:
        print("REFUSED", exc)
"""
    result = run_python(code, env={"PADDLE_IPU_IMPLICIT_COMPILE": "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "REFUSED" in result.stdout and "(sgd)" in result.stdout


def test_lr_scheduler_steps_like_cpu() -> None:
    feeds = batches(8)

    def run(place: Any, step: bool = True) -> list[float]:
        with _guard(21) as (main, startup):
            x = paddle.static.data("x", [-1, 12], "float32")
            y = paddle.static.data("y", [-1, 1], "int64")
            loss = paddle.nn.functional.cross_entropy(paddle.static.nn.fc(x, 5), y)
            sched = paddle.optimizer.lr.ExponentialDecay(0.5, gamma=0.5)
            paddle.optimizer.SGD(sched).minimize(loss)
        scope = paddle.static.Scope()
        out = []
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(place)
            exe.run(startup)
            for f in feeds:
                out.append(float(exe.run(main, feed=f, fetch_list=[loss])[0]))
                if step:
                    sched.step()
        return out

    cpu, ipu = run(paddle.CPUPlace()), run(IPU)
    np.testing.assert_allclose(ipu, cpu, rtol=2e-5)
    # The schedule matters here: without its steps the losses differ.
    constant = run(IPU, step=False)
    assert not np.allclose(constant, cpu, rtol=1e-3)


def test_training_with_a_changing_batch_size_matches_cpu() -> None:
    """Each feed shape is its own compiled variant; they share the scope's state."""
    rng = np.random.default_rng(4)
    feeds = []
    for rows in (8, 8, 3, 8, 5, 3, 8):
        feeds.append(
            {
                "x": rng.standard_normal((rows, 12)).astype("float32"),
                "y": rng.integers(0, 5, (rows, 1)).astype("int64"),
            }
        )
    build = lambda: build_classifier(OPTIMIZERS["adam"])  # noqa: E731
    cpu = train(paddle.CPUPlace(), build, feeds)
    ipu = train(IPU, build, feeds)
    np.testing.assert_allclose(
        [float(v) for v in ipu["losses"]], [float(v) for v in cpu["losses"]], rtol=2e-5
    )
    for n in cpu["final"]:
        np.testing.assert_allclose(ipu["final"][n], cpu["final"][n], rtol=1e-4, atol=1e-5)


def test_mean_of_an_already_reduced_loss_trains_like_cpu() -> None:
    """``paddle.mean(F.cross_entropy(...))``: the mean of a 0-D loss (a common Paddle 2.x
    idiom) compiles, and trains as on the CPU."""

    def build() -> tuple[Any, ...]:
        with _guard(31) as (main, startup):
            x = paddle.static.data("x", [-1, 12], "float32")
            y = paddle.static.data("y", [-1, 1], "int64")
            logits = paddle.static.nn.fc(x, 5)
            loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, y))
            paddle.optimizer.Adam(0.01).minimize(loss)
        return main, startup, loss, logits

    feeds = batches(4)
    cpu = train(paddle.CPUPlace(), build, feeds)
    ipu = train(IPU, build, feeds)
    np.testing.assert_allclose(
        [float(v) for v in ipu["losses"]], [float(v) for v in cpu["losses"]], rtol=2e-5
    )


@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_scope_writes_between_training_steps_are_what_the_next_step_uses(name: str) -> None:
    """After a step the scope's weights and optimizer state share the trainer's memory;
    writes into them between steps (``tensor.set`` of the same size writes in place, a
    CPU executor's step updates in place) must reach the next ipu step exactly as
    they reach the next CPU step."""
    feeds = batches(7)

    def run(place: Any) -> dict[str, Any]:
        main, startup, loss, _ = build_classifier(OPTIMIZERS[name])
        params = _params(main)
        scope = paddle.static.Scope()
        losses = []
        with paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(place)
            cpu = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            state = sorted(n for n in scope.local_var_names() if "moment1" in n or "velocity" in n)
            assert state
            for f in feeds[:2]:
                losses.append(exe.run(main, feed=f, fetch_list=[loss])[0])
            w = scope.find_var(params[1]).get_tensor()
            w.set(np.array(w) * 0.5, paddle.CPUPlace())
            m = scope.find_var(state[0]).get_tensor()
            m.set(np.full(np.array(m).shape, 0.25, "float32"), paddle.CPUPlace())
            losses.append(exe.run(main, feed=feeds[2], fetch_list=[loss])[0])
            losses.append(cpu.run(main, feed=feeds[3], fetch_list=[loss])[0])
            for f in feeds[4:]:
                losses.append(exe.run(main, feed=f, fetch_list=[loss])[0])
            final = {i: np.array(scope.find_var(n).get_tensor()) for i, n in enumerate(params)}
            moments = [np.array(scope.find_var(n).get_tensor()) for n in state]
        return {"losses": losses, "final": final, "moments": moments}

    want, got = run(paddle.CPUPlace()), run(IPU)
    for step, (a, b) in enumerate(zip(got["losses"], want["losses"])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=f"loss of step {step}")
    for n in want["final"]:
        np.testing.assert_allclose(
            got["final"][n], want["final"][n], rtol=1e-4, atol=1e-5, err_msg=f"weight {n}"
        )
    for a, b in zip(got["moments"], want["moments"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _adam_trained_twice(feeds: list) -> tuple[Any, ...]:
    """(main, loss, scope, exe, host trainer) of the Adam classifier after two steps
    on the ipu place (feeds[0] and feeds[1])."""
    import gc

    main, startup, loss, _ = build_classifier(OPTIMIZERS["adam"])
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(IPU)
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        exe.run(main, feed=feeds[0], fetch_list=[loss])
        exe.run(main, feed=feeds[1], fetch_list=[loss])
    entry = next(
        o for o in gc.get_objects() if isinstance(o, implicit._ImplicitCompile) and o.scope is scope
    )
    return main, loss, scope, exe, entry.executor.session._trainer.trainer


def test_training_on_the_ipu_place_frees_each_steps_old_weights() -> None:
    """The scope shares the trainer's arrays (no copy per step); the arrays a step
    replaced are freed, not kept alive by the scope (Paddle never frees an array
    that from_dlpack took twice, so each is exported once)."""
    import gc
    import weakref

    feeds = batches(4)
    main, loss, scope, exe, trainer = _adam_trained_twice(feeds)
    params = _params(main)
    with paddle.static.scope_guard(scope):
        # the scope holds the trainer's memory
        for n in params:
            tensor = scope.find_var(n).get_tensor()
            assert tensor._ptr() == trainer.weights[n].ctypes.data
            assert tensor._place().is_cpu_place()  # as the README says
        old = [weakref.ref(a) for a in (*trainer.weights.values(), *trainer.state.values())]
        exe.run(main, feed=feeds[2], fetch_list=[loss])
        exe.run(main, feed=feeds[3], fetch_list=[loss])
    gc.collect()
    alive = sum(r() is not None for r in old)
    assert alive == 0, f"{alive} of {len(old)} arrays replaced two steps ago are still alive"


def test_a_failed_training_step_restores_and_leaks_nothing(monkeypatch) -> None:
    """A step that fails inside the update leaves the weights it started from (in the
    trainer and the scope), and restoring them exports no array twice: the arrays
    are freed once later steps replace them."""
    import gc
    import weakref

    from paddle_ipu.backends.host.trainer import HostTrainer

    feeds = batches(5)
    main, loss, scope, exe, trainer = _adam_trained_twice(feeds)
    params = _params(main)
    with paddle.static.scope_guard(scope):
        before = {n: np.array(scope.find_var(n).get_tensor()) for n in params}
        old = [weakref.ref(a) for a in trainer.weights.values()]

        def fail(self: Any, grads: Any) -> None:
            raise RuntimeError("update failed")

        with monkeypatch.context() as m:
            m.setattr(HostTrainer, "apply_gradients", fail)
            with pytest.raises(RuntimeError, match="update failed"):
                exe.run(main, feed=feeds[2], fetch_list=[loss])
        for n in params:
            np.testing.assert_array_equal(np.array(scope.find_var(n).get_tensor()), before[n])
            np.testing.assert_array_equal(trainer.weights[n], before[n])
        exe.run(main, feed=feeds[3], fetch_list=[loss])
        exe.run(main, feed=feeds[4], fetch_list=[loss])
    gc.collect()
    alive = sum(r() is not None for r in old)
    assert alive == 0, f"{alive} of {len(old)} restored weight arrays are still alive"
