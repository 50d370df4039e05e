"""Numeric IpuStrategy options are validated when set: NaN, infinities, negative and
out-of-range values raise ``OptionError`` naming the option, the valid range and the value
received, and the strategy is left unchanged.  The limits come from the APIs the options end
in (threading's longest wait, ONNX Runtime's int64 seed and C-int thread count)."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

paddle = pytest.importorskip("paddle")

import paddle_ipu  # noqa: E402
from paddle_ipu.errors import OptionError  # noqa: E402
from paddle_ipu.options import OPTIONS  # noqa: E402

DOUBLES = sorted(name for name, spec in OPTIONS.items() if spec.type == "double")


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("name", DOUBLES)
def test_non_finite_double_is_refused_when_set(name: str, bad: float) -> None:
    s = paddle_ipu.IpuStrategy()
    before = s.get(name)
    with pytest.raises(OptionError) as info:
        s.set_options({name: bad})
    message = str(info.value)
    received = "NaN" if math.isnan(bad) else repr(bad)
    assert repr(name) in message and "finite" in message and received in message, message
    assert s.get(name) == before


def test_timeout_ms_inf_is_refused_naming_option_expected_and_received() -> None:
    s = paddle_ipu.IpuStrategy()
    with pytest.raises(OptionError, match=r"'timeout_ms' expects a finite float in \[0, .*got inf"):
        s.set_options({"timeout_ms": float("inf")})
    assert s.get("timeout_ms") == 0.0


def test_timeout_ms_longer_than_threading_can_wait_is_refused() -> None:
    s = paddle_ipu.IpuStrategy()
    too_long = threading.TIMEOUT_MAX * 1000.0 * 2
    with pytest.raises(OptionError, match="'timeout_ms' must be in"):
        s.set_options({"timeout_ms": too_long})
    # The bound is real: a wait that long is what the serving worker would have attempted.
    with pytest.raises(OverflowError):
        threading.Event().wait(too_long / 1000.0)


def test_negative_doubles_are_refused() -> None:
    s = paddle_ipu.IpuStrategy()
    for name in ("timeout_ms", "lr", "max_weight_norm", "time_limit_scheduler"):
        with pytest.raises(OptionError, match=rf"'{name}' must be >= 0|'{name}' must be in"):
            s.set_options({name: -1.0})
    with pytest.raises(OptionError, match=r"'loss_scaling' must be > 0, got 0.0"):
        s.set_options({"loss_scaling": 0.0})


def test_random_seed_beyond_int64_is_refused() -> None:
    # ONNX Runtime (the host's inference engine) takes an int64 seed.
    ort.set_seed(2**63 - 1)
    with pytest.raises(TypeError):
        ort.set_seed(2**63)
    s = paddle_ipu.IpuStrategy()
    s.set_options({"random_seed": 2**63 - 1})
    with pytest.raises(OptionError, match=r"'random_seed' must be <= 9223372036854775807"):
        s.set_options({"random_seed": 2**63})
    assert s.get("random_seed") == 2**63 - 1


def test_host_num_threads_beyond_c_int_is_refused() -> None:
    opts = ort.SessionOptions()
    with pytest.raises(TypeError):
        opts.intra_op_num_threads = 2**31
    s = paddle_ipu.IpuStrategy()
    with pytest.raises(OptionError, match=r"'host_num_threads' must be <= 2147483647"):
        s.set_options({"host_num_threads": 2**31})


def test_set_options_with_one_bad_number_applies_nothing() -> None:
    s = paddle_ipu.IpuStrategy()
    with pytest.raises(OptionError):
        s.set_options({"loss_scaling": 4.0, "timeout_ms": math.inf})
    assert s.get("loss_scaling") == 1.0 and s.get("timeout_ms") == 0.0


def test_serving_with_the_longest_valid_timeout_answers_on_close() -> None:
    """The largest timeout_ms the strategy accepts does not kill the serving worker: a
    partial run waits for it, and close() flushes it."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        out = paddle.nn.functional.relu(x) * 2.0
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=4)
    s.set_options(
        {
            "enable_model_runtime_executor": True,
            "timeout_ms": OPTIONS["timeout_ms"].maximum,
        }
    )
    compiled = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    compiled.compile(["x"], [out])
    feed = np.arange(-4, 4, dtype="float32").reshape(2, 4)
    future = compiled.submit({"x": feed})
    time.sleep(0.05)
    assert not future.done()
    compiled.reset()
    (got,) = future.result(timeout=10)
    np.testing.assert_array_equal(got, np.maximum(feed, 0) * 2.0)


def test_serving_flush_timer_runs_from_the_oldest_request() -> None:
    """A partial run is flushed timeout_ms after its OLDEST request arrived: a second
    request arriving later joins the same run and does not push the flush back."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        out = x * 3.0 - 1.0
    timeout_s, second_after_s = 0.6, 0.4
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=4)
    s.set_options({"enable_model_runtime_executor": True, "timeout_ms": timeout_s * 1000})
    compiled = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    compiled.compile(["x"], [out])
    first_rows = np.full((1, 4), 2.0, dtype="float32")
    second_rows = np.full((1, 4), -1.0, dtype="float32")
    done: dict[str, float] = {}
    start = time.monotonic()
    first = compiled.submit({"x": first_rows})
    first.add_done_callback(lambda _: done.setdefault("first", time.monotonic() - start))
    time.sleep(second_after_s)
    assert not first.done(), "flushed before timeout_ms"
    second = compiled.submit({"x": second_rows})
    second.add_done_callback(lambda _: done.setdefault("second", time.monotonic() - start))
    try:
        (got_first,) = first.result(timeout=10)
        (got_second,) = second.result(timeout=10)
        assert compiled.runtime is not None
        runs = compiled.runtime.stats().runs
    finally:
        compiled.reset()
    np.testing.assert_array_equal(got_first, first_rows * 3.0 - 1.0)
    np.testing.assert_array_equal(got_second, second_rows * 3.0 - 1.0)
    # From the oldest request: about timeout_s; from the newest it would be
    # second_after_s + timeout_s = 1.0 s.
    assert timeout_s <= done["first"] < second_after_s + timeout_s - 0.1, done
    assert done["second"] < second_after_s + timeout_s - 0.1, done
    assert runs == 1  # both requests in one run


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_model_runtime_override_refuses_non_finite_timeouts(bad: float) -> None:
    """The ModelRuntime's own timeout_ms argument is checked like the option."""
    from paddle_ipu.serving.model_runtime import ModelRuntime

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        out = paddle.static.nn.fc(x, 2)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=2)
    compiled = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    compiled.compile(["x"], [out])
    with pytest.raises(OptionError, match="timeout_ms"):
        ModelRuntime(compiled.executor, timeout_ms=bad)
