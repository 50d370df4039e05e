"""Optimizer math and weight movement that earlier tests let through, each checked against
something this project did not write: Paddle's own CPU training of the same program, ONNX
Runtime, or PopART's SGD update written out from its documentation (sgd.hpp)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
ort = pytest.importorskip("onnxruntime")

from support.models import build  # noqa: E402
from test_training import (  # noqa: E402
    MBS,
    P,
    assert_close,
    build_mlp,
    compile_ipu,
    mlp_batches,
    train_cpu,
    train_ipu,
)

import paddle_ipu  # noqa: E402
from paddle_ipu.backends.popart import optimizer as popart_optimizer  # noqa: E402
from paddle_ipu.compiler.optimizer import extract_optimizer  # noqa: E402

STEPS = 8
RTOL = 1e-5


def _train_both(make_opt: Callable[[], Any], steps: int = STEPS) -> tuple[Any, Any, Any, Any]:
    """Train the same MLP (same names and initial weights) on the emulated IPU and with
    Paddle's CPU executor; returns (ipu net, cpu net, ipu losses, cpu losses)."""
    batches = mlp_batches(steps, seed=5)
    ipu = build_mlp(make_opt)
    cp, prog = compile_ipu(ipu)
    ipu_losses = train_ipu(ipu, prog, batches)
    cp.weights_to_host()
    cpu = build_mlp(make_opt)
    cpu_losses = train_cpu(cpu, batches)
    return ipu, cpu, ipu_losses, cpu_losses


def _assert_state_matches(ipu: Any, cpu: Any, what: str) -> None:
    names = ipu.persistable_names()
    assert names == cpu.persistable_names()
    for name in names:
        if name in ("x", "y") or ipu.scope.find_var(name) is None:
            continue
        assert_close(ipu.array(name), cpu.array(name), RTOL, f"{what}: {name}")


# ------------------------------------------------------------------ global-norm clipping


@pytest.mark.parametrize("clip_norm", [1e4, 1e-3], ids=["below_threshold", "above_threshold"])
def test_global_norm_clipping_matches_paddle(clip_norm: float) -> None:
    """SGD (the update is linear in the gradient, so any wrong scale shows) with
    ClipGradByGlobalNorm: below the threshold clipping must leave gradients alone."""

    def make() -> Any:
        return P.SGD(0.1, grad_clip=paddle.nn.ClipGradByGlobalNorm(clip_norm))

    ipu, cpu, ipu_losses, cpu_losses = _train_both(make)
    assert_close(ipu_losses, cpu_losses, RTOL, "losses")
    _assert_state_matches(ipu, cpu, "weights")
    # The oracle itself: a large clip norm is a no-op in Paddle, a small one is not.
    plain = train_cpu(build_mlp(lambda: P.SGD(0.1)), mlp_batches(STEPS, seed=5))
    if clip_norm > 1.0:
        np.testing.assert_array_equal(cpu_losses, plain)
    else:
        assert np.abs(cpu_losses[1:] - plain[1:]).max() > 1e-3


# ------------------------------------------------------------------ Adamax epsilon


def test_adamax_with_a_large_epsilon_matches_paddle() -> None:
    """With epsilon 0.1 (not 1e-8) where epsilon enters the update changes the result:
    Paddle's kernel adds it inside the max, u = max(|g|, beta2 * u + eps)."""
    ipu, cpu, ipu_losses, cpu_losses = _train_both(lambda: P.Adamax(0.05, epsilon=0.1))
    assert_close(ipu_losses, cpu_losses, RTOL, "losses")
    _assert_state_matches(ipu, cpu, "weights and state")
    # The oracle itself: epsilon 0.1 moves Paddle's training away from epsilon 1e-8.
    small = train_cpu(build_mlp(lambda: P.Adamax(0.05, epsilon=1e-8)), mlp_batches(STEPS, 5))
    assert np.abs(cpu_losses[1:] - small[1:]).max() > 1e-4


# ------------------------------------------------------------------ popart SGD translation


def _fake_popart() -> Any:
    """The part of PopART's Python API ``to_popart_optimizer`` uses for SGD, recording
    the arguments (names and defaults as in PopART's pybind11 binding of SGD)."""

    class SGDAccumulatorAndMomentum(enum.Enum):
        Combined = 0
        Separate = 1

    class DataType(enum.Enum):
        UNDEFINED = 0
        FLOAT = 1
        FLOAT16 = 2

    class SGD:
        def __init__(
            self,
            pyd: dict[str, tuple[float, bool]],
            clip_norm_settings: list[Any] | None = None,
            accumulatorAndMomentum: Any = SGDAccumulatorAndMomentum.Combined,
            accumType: Any = DataType.UNDEFINED,
            accl1Type: Any = DataType.UNDEFINED,
        ) -> None:
            self.values = dict(pyd)
            self.clip = list(clip_norm_settings or [])
            self.acc_mm = accumulatorAndMomentum
            self.specific: dict[str, Any] = {}

        def insertSpecific(self, weight: str, values: dict[str, Any]) -> None:
            self.specific[weight] = values

    class ClipNormSettings:
        @staticmethod
        def clipAllWeights(norm: float) -> Any:
            return ("all", norm)

    class WeightDecayMode(enum.Enum):
        Decay = 0
        L2Regularization = 1

    class AdamMode(enum.Enum):
        Adam = 0
        AdamNoBias = 1
        Lamb = 2
        LambNoBias = 3
        AdaMax = 4

    class Adam:
        def __init__(self, pyd: dict[str, tuple[float, bool]], **kw: Any) -> None:
            self.values, self.kw = dict(pyd), kw
            self.specific: dict[str, Any] = {}

        def insertSpecific(self, weight: str, values: dict[str, Any]) -> None:
            self.specific[weight] = values

    return SimpleNamespace(
        Adam=Adam,
        AdamMode=AdamMode,
        SGD=SGD,
        SGDAccumulatorAndMomentum=SGDAccumulatorAndMomentum,
        DataType=DataType,
        ClipNormSettings=ClipNormSettings,
        WeightDecayMode=WeightDecayMode,
    )


# PopART's defaults for values the map leaves out (SGD::getUnset*, sgd.hpp).
_POPART_SGD_UNSET = {
    "defaultLearningRate": 0.1,
    "defaultWeightDecay": 0.0,
    "defaultMomentum": 0.0,
    "defaultDampening": 0.0,
    "defaultVelocityScaling": 1.0,
    "lossScaling": 1.0,
}


class PopartSGDModel:
    """PopART's SGD step for one weight, as sgd.hpp documents it (af = rf = 1, no
    Nesterov).  ``state`` holds the optimizer tensors by PopART name."""

    def __init__(self, opt: Any, popart: Any, weight: str, w0: np.ndarray) -> None:
        get = {k: float(opt.values.get(k, (d,))[0]) for k, d in _POPART_SGD_UNSET.items()}
        self.lr, self.wd = get["defaultLearningRate"], get["defaultWeightDecay"]
        self.mm, self.dm = get["defaultMomentum"], get["defaultDampening"]
        self.vs, self.ls = get["defaultVelocityScaling"], get["lossScaling"]
        self.weight = weight
        self.w = w0.astype("float64")
        self.state: dict[str, np.ndarray] = {}
        self.kind = "SGD0"
        if self.mm != 0.0:
            separate = opt.acc_mm == popart.SGDAccumulatorAndMomentum.Separate
            self.kind = "SGD2" if separate else "SGD1"
        if self.kind == "SGD1":
            # "Initial v: v = v_0 * mm + (1 - dm) * wd * vs * w_0", v_0 = 0.
            self.state["Accl___" + weight] = (1 - self.dm) * self.wd * self.vs * self.w
        elif self.kind == "SGD2":
            self.state["Accl1___" + weight] = np.zeros_like(self.w)

    def step(self, g: np.ndarray) -> None:
        """``g`` is the gradient as the backward pass gives it (scaled by ls)."""
        g = g.astype("float64") * self.ls
        lr, wd, mm, dm, vs, ls = self.lr, self.wd, self.mm, self.dm, self.vs, self.ls
        if self.kind == "SGD0":
            # w <- w * (1 - lr * (1 - dm) * wd) - g * (lr * (1 - dm) / ls)
            self.w = self.w * (1 - lr * (1 - dm) * wd) - g * (lr * (1 - dm) / ls)
        elif self.kind == "SGD1":
            name = "Accl___" + self.weight
            v = self.state[name] + (1 - dm) * vs / ls * g
            self.w = self.w - lr / vs * v
            self.state[name] = v * mm + (1 - dm) * wd * vs * self.w
        else:
            name = "Accl1___" + self.weight
            v = self.state[name] * mm + (1 - dm) * vs / ls * g + (1 - dm) * wd * vs * self.w
            self.w = self.w - lr / vs * v
            self.state[name] = v


SGD_CASES: dict[str, Callable[[], Any]] = {
    "sgd_decay": lambda: P.SGD(0.1, weight_decay=0.01),
    "momentum": lambda: P.Momentum(0.05, momentum=0.9),
    "momentum_decay": lambda: P.Momentum(0.05, momentum=0.9, weight_decay=0.02),
}


@pytest.mark.parametrize("case", list(SGD_CASES))
def test_popart_sgd_translation_follows_paddle_under_popart_formula(case: str) -> None:
    """The popart adapter's SGD/Momentum translation, run through PopART's documented
    update, reproduces Paddle's CPU training: the weights, and the velocity in the PopART
    tensor the adapter maps to Paddle's velocity variable (what weights_to_host reads)."""
    net = build_mlp(SGD_CASES[case])
    with paddle.static.scope_guard(net.scope):
        cfg = extract_optimizer(net.main, scope=net.scope, loss_name="loss")
    popart = _fake_popart()
    opt = popart_optimizer.to_popart_optimizer(cfg, popart)
    assert type(opt).__name__ == "SGD"
    models = {s.name: PopartSGDModel(opt, popart, s.name, net.array(s.name)) for s in cfg.params}
    device_to_paddle = cfg.device_names()
    grads = [slot.grad for slot in cfg.params]
    exe = paddle.static.Executor(paddle.CPUPlace())
    for batch in mlp_batches(6, seed=8):
        with paddle.static.scope_guard(net.scope):
            values = exe.run(net.main, feed=batch, fetch_list=grads)
        for slot, g in zip(cfg.params, values):
            models[slot.name].step(np.asarray(g))
        for slot in cfg.params:
            model = models[slot.name]
            np.testing.assert_allclose(
                model.w, net.array(slot.name), rtol=1e-5, atol=1e-6, err_msg=f"{case}: {slot.name}"
            )
            for device, paddle_name in device_to_paddle.items():
                if device == slot.name or not device.endswith("___" + slot.name):
                    continue
                assert device in model.state, (
                    f"{case}: the adapter maps {paddle_name!r} to {device!r}, a tensor "
                    f"PopART's {model.kind} does not have ({sorted(model.state)})"
                )
                np.testing.assert_allclose(
                    model.state[device],
                    net.array(paddle_name),
                    rtol=1e-5,
                    atol=1e-6,
                    err_msg=f"{case}: {device} against {paddle_name}",
                )


def test_popart_lamb_has_no_weight_norm_bound_as_paddle() -> None:
    """Paddle's lamb trust ratio is ||w|| / ||r|| for any ||w||; PopART's Lamb uses
    min(||w||, maxWeightNorm) / ||r||, and maxWeightNorm is 10 when left unset."""
    net = build_mlp(lambda: P.Lamb(0.01))
    with paddle.static.scope_guard(net.scope):
        cfg = extract_optimizer(net.main, scope=net.scope, loss_name="loss")
    popart = _fake_popart()
    opt = popart_optimizer.to_popart_optimizer(cfg, popart)
    assert opt.kw["mode"] == popart.AdamMode.Lamb
    # "defaultMaxWeightNorm" (willow/src/adam.cpp; "maxWeightNorm" is its deprecated alias)
    bound, const = opt.values.get(
        "defaultMaxWeightNorm", opt.values.get("maxWeightNorm", (10.0, True))
    )
    assert const and bound >= float(np.finfo(np.float32).max)


# ------------------------------------------------------------------ fp16 resume


def test_fp16_weights_to_host_and_recompile_resumes_like_an_uninterrupted_run() -> None:
    make = lambda: P.Adam(0.01)  # noqa: E731
    batches = mlp_batches(8, seed=6)
    whole = build_mlp(make)
    _, prog = compile_ipu(whole, fp16=True)
    uninterrupted = train_ipu(whole, prog, batches)

    parted = build_mlp(make)
    first, prog = compile_ipu(parted, fp16=True)
    head = train_ipu(parted, prog, batches[:4])
    first.weights_to_host()
    first.reset()
    _, prog = compile_ipu(parted, fp16=True)  # a new compile from the scope
    tail = train_ipu(parted, prog, batches[4:])
    np.testing.assert_array_equal(np.concatenate([head, tail]), uninterrupted)


# ------------------------------------------------------------------ weights_from_host, save_model


def _inference(built: Any) -> tuple[Any, Any]:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False, micro_batch_size=MBS)
    cp = paddle_ipu.IpuCompiledProgram(built.main, scope=built.scope, ipu_strategy=s)
    return cp, cp.compile(built.feeds, built.fetches)


def _run(built: Any, prog: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    with paddle.static.scope_guard(built.scope):
        return np.asarray(exe.run(prog, feed=feed, fetch_list=prog.fetch_names)[0])


def test_weights_from_host_takes_a_changed_scope_weight() -> None:
    built = build("mlp")
    cp, prog = _inference(built)
    feed = built.random_feed(MBS, np.random.default_rng(0))
    before = _run(built, prog, feed)
    weight = sorted(p.name for p in built.main.global_block().all_parameters())[0]
    tensor = built.scope.find_var(weight).get_tensor()
    changed = np.array(tensor) * -1.5 + 0.25
    tensor.set(changed.astype("float32"), paddle.CPUPlace())
    (want,) = built.run_cpu(feed)
    assert np.abs(want - before).max() > 1e-3  # the change matters to Paddle
    np.testing.assert_array_equal(_run(built, prog, feed), before)  # not yet on the device
    cp.weights_from_host()
    np.testing.assert_allclose(_run(built, prog, feed), want, rtol=1e-5, atol=1e-6)


def test_save_model_writes_onnx_that_onnx_runtime_runs_to_the_same_outputs(
    tmp_path: Path,
) -> None:
    built = build("mlp")
    cp, prog = _inference(built)
    feed = built.random_feed(MBS, np.random.default_rng(1))
    weight = sorted(p.name for p in built.main.global_block().all_parameters())[0]
    tensor = built.scope.find_var(weight).get_tensor()
    tensor.set((np.array(tensor) + 0.5).astype("float32"), paddle.CPUPlace())
    cp.weights_from_host()
    got = _run(built, prog, feed)
    path = tmp_path / "sub" / "model.onnx"
    cp.save_model(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {"x": feed["x"]})
    np.testing.assert_allclose(onnx_out, got, rtol=1e-6, atol=1e-7)
    (want,) = built.run_cpu(feed)
    np.testing.assert_allclose(onnx_out, want, rtol=1e-5, atol=1e-6)


def test_save_model_of_a_training_program_holds_the_trained_weights(tmp_path: Path) -> None:
    """save_model copies the device's weights back first: the saved graph computes the
    loss Paddle computes from the trained weights."""
    net = build_mlp(lambda: P.Adam(0.05))
    cp, prog = compile_ipu(net)
    train_ipu(net, prog, mlp_batches(5, seed=2))
    path = tmp_path / "trained.onnx"
    cp.save_model(str(path))
    (probe,) = mlp_batches(1, seed=11)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    onnx_loss = np.asarray(session.run(None, {n: probe[n] for n in names})[0])
    # Paddle's loss of the trained weights: one CPU training step computes the loss
    # before it updates anything.
    with paddle.static.scope_guard(net.scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        (cpu_loss,) = exe.run(net.main, feed=probe, fetch_list=[net.loss])
    assert_close(onnx_loss.reshape(()), np.asarray(cpu_loss).reshape(()), 1e-5, "loss")
    # Training moved the weights: the initial ones give another loss.
    fresh = build_mlp(lambda: P.Adam(0.05))
    (initial,) = train_cpu(fresh, [probe])
    assert abs(float(initial) - float(onnx_loss.reshape(()))) > 1e-4
