"""Training on the emulated IPU, end to end: ``IpuCompiledProgram.compile`` and Paddle's
``exe.run`` on the "ipu" place, checked against Paddle's own CPU training of the same
program from the same initial weights, or against a reference written out here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from support.helpers import fresh_programs, run_python  # noqa: E402

import paddle_ipu  # noqa: E402
from paddle_ipu.errors import CompileError, NotSupportedError  # noqa: E402

P = paddle.optimizer
MBS = 4  # micro-batch size
IN = 8  # MLP input features
STEPS = 20
LOSS_RTOL = 1e-5
IPU = paddle.CustomPlace("ipu", 0)


# --------------------------------------------------------------------------- models


@dataclass
class Net:
    main: Any
    scope: Any
    loss: Any
    feeds: list[str]

    def persistable_names(self) -> list[str]:
        return sorted(v.name for v in self.main.list_vars() if v.persistable)

    def array(self, name: str) -> np.ndarray:
        return np.array(self.scope.find_var(name).get_tensor())

    @property
    def param_names(self) -> list[str]:
        return sorted(p.name for p in self.main.global_block().all_parameters())


def _attr(name: str) -> Any:
    return paddle.ParamAttr(name=name)


@contextlib.contextmanager
def _building(seed: int) -> Iterator[tuple[Any, Any, Any]]:
    """Fresh programs, scope and names under ``seed``; the startup program runs on exit,
    so the same seed gives the same names and initial weights."""
    with fresh_programs(seed) as (main, startup, scope):
        yield main, startup, scope
        paddle.static.Executor(paddle.CPUPlace()).run(startup)


def build_mlp(make_opt: Callable[[], Any] | None, seed: int = 7) -> Net:
    """A two-layer MLP regression; the same seed gives the same names and weights."""
    with _building(seed) as (main, _, scope):
        x = paddle.static.data("x", [-1, IN], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h = paddle.tanh(paddle.static.nn.fc(x, 16, weight_attr=_attr("w1"), bias_attr=_attr("b1")))
        out = paddle.static.nn.fc(h, 1, weight_attr=_attr("w2"), bias_attr=_attr("b2"))
        loss = paddle.mean((out - y) ** 2)
        if make_opt is not None:
            make_opt().minimize(loss)
    return Net(main, scope, loss, ["x", "y"])


def build_cnn(make_opt: Callable[[], Any] | None, seed: int = 11) -> Net:
    """conv -> BatchNorm (training mode) -> relu -> pool -> fc, cross-entropy loss."""
    with _building(seed) as (main, _, scope):
        x = paddle.static.data("img", [-1, 1, 8, 8], "float32")
        label = paddle.static.data("label", [-1, 1], "int64")
        h = paddle.nn.Conv2D(1, 4, 3, padding=1, weight_attr=_attr("cw"), bias_attr=_attr("cb"))(x)
        bn = paddle.nn.BatchNorm2D(4, momentum=0.8, weight_attr=_attr("bw"), bias_attr=_attr("bb"))
        h = paddle.nn.functional.relu(bn(h))
        h = paddle.nn.functional.max_pool2d(h, 2)
        fc = paddle.nn.Linear(4 * 4 * 4, 3, weight_attr=_attr("fw"), bias_attr=_attr("fb"))
        logits = fc(paddle.flatten(h, 1))
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label, reduction="none"))
        if make_opt is not None:
            make_opt().minimize(loss)
    return Net(main, scope, loss, ["img", "label"])


_TEACHER = np.random.default_rng(99).standard_normal((IN, 1)).astype("float32")


def mlp_batch(rng: np.random.Generator, lead: Sequence[int] = (MBS,)) -> dict[str, np.ndarray]:
    """A batch of shape ``[*lead, IN]`` with a learnable target."""
    x = rng.standard_normal((*lead, IN)).astype("float32")
    return {"x": x, "y": np.tanh(x @ _TEACHER).astype("float32")}


def mlp_batches(n: int, seed: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [mlp_batch(rng) for _ in range(n)]


def cnn_batch(rng: np.random.Generator, lead: Sequence[int]) -> dict[str, np.ndarray]:
    img = rng.standard_normal((*lead, 1, 8, 8)).astype("float32")
    label = (img.reshape(*lead, -1)[..., :3].argmax(-1)[..., None]).astype("int64")
    return {"img": img, "label": label}


# --------------------------------------------------------------------------- running


def compile_ipu(
    net: Net,
    *,
    bps: int = 1,
    af: int = 1,
    rf: int = 1,
    fp16: bool = False,
    anchor: str | None = None,
    fetch: Sequence[Any] | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    st = paddle_ipu.IpuStrategy()
    st.set_graph_config(num_ipus=rf, is_training=True, micro_batch_size=MBS)
    if bps > 1 or af > 1:
        st.set_pipelining_config(
            batches_per_step=bps,
            enable_gradient_accumulation=af > 1,
            accumulation_factor=af,
        )
    if rf > 1:
        st.set_options({"enable_replicated_graphs": True, "replicated_graph_count": rf})
    if fp16:
        st.set_precision_config(enable_fp16=True)
    if anchor is not None:
        st.set_anchor_config(anchor)
    if options:
        st.set_options(options)
    cp = paddle_ipu.IpuCompiledProgram(net.main, scope=net.scope, ipu_strategy=st)
    prog = cp.compile(net.feeds, list(fetch) if fetch is not None else [net.loss])
    return cp, prog


def run_ipu(net: Net, prog: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
    exe = paddle.static.Executor(IPU)
    with paddle.static.scope_guard(net.scope):
        return np.asarray(exe.run(prog, feed=feed, fetch_list=prog.fetch_names)[0])


def train_ipu(net: Net, prog: Any, batches: Sequence[dict[str, np.ndarray]]) -> np.ndarray:
    return np.array([run_ipu(net, prog, b) for b in batches], dtype="float32")


def train_cpu(
    net: Net, batches: Sequence[dict[str, np.ndarray]], scheduler: Any = None
) -> np.ndarray:
    exe = paddle.static.Executor(paddle.CPUPlace())
    losses = []
    with paddle.static.scope_guard(net.scope):
        for batch in batches:
            (loss,) = exe.run(net.main, feed=batch, fetch_list=[net.loss])
            losses.append(float(np.asarray(loss)))
            if scheduler is not None:
                scheduler.step()
    return np.array(losses, dtype="float32")


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> None:
    got, want = np.asarray(got, "float64"), np.asarray(want, "float64")
    err = np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-12))
    assert err <= rtol, f"{what}: max relative error {err:.3g} > {rtol:g}\n{got}\n{want}"


# --------------------------------------------------------------------------- optimizers

# name -> (without weight decay, with weight decay)
OPTIMIZERS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "sgd": (lambda: P.SGD(0.1), lambda: P.SGD(0.1, weight_decay=0.01)),
    "momentum": (
        lambda: P.Momentum(0.05, momentum=0.9),
        lambda: P.Momentum(0.05, momentum=0.9, weight_decay=0.01),
    ),
    "adam": (lambda: P.Adam(0.01), lambda: P.Adam(0.01, weight_decay=0.01)),
    "adamw": (
        lambda: P.AdamW(0.01, weight_decay=0.0),
        lambda: P.AdamW(
            0.01, weight_decay=0.05, apply_decay_param_fun=lambda n: not n.endswith("b_0")
        ),
    ),
    "adamax": (lambda: P.Adamax(0.01), lambda: P.Adamax(0.01, weight_decay=0.01)),
    "lamb": (
        lambda: P.Lamb(0.01, lamb_weight_decay=0.0),
        lambda: P.Lamb(
            0.01,
            lamb_weight_decay=0.02,
            exclude_from_weight_decay_fn=lambda p: p.name.endswith("b_0"),
        ),
    ),
    "adagrad": (lambda: P.Adagrad(0.05), lambda: P.Adagrad(0.05, weight_decay=0.01)),
    "adadelta": (lambda: P.Adadelta(1.0), lambda: P.Adadelta(1.0, weight_decay=0.01)),
    "rmsprop": (
        lambda: P.RMSProp(0.01, momentum=0.5),
        lambda: P.RMSProp(0.01, momentum=0.5, weight_decay=0.01),
    ),
    "centered_rmsprop": (
        lambda: P.RMSProp(0.01, centered=True),
        lambda: P.RMSProp(0.01, centered=True, weight_decay=0.01),
    ),
}


@pytest.mark.parametrize("decay", [False, True], ids=["plain", "decay"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_paddle_cpu(name: str, decay: bool) -> None:
    make_opt = OPTIMIZERS[name][int(decay)]
    batches = mlp_batches(STEPS)
    cpu_net, ipu_net = build_mlp(make_opt), build_mlp(make_opt)
    for p in cpu_net.param_names:  # the same initial weights
        np.testing.assert_array_equal(cpu_net.array(p), ipu_net.array(p))
    want = train_cpu(cpu_net, batches)
    cp, prog = compile_ipu(ipu_net)
    got = train_ipu(ipu_net, prog, batches)
    assert want[-1] != want[0]  # it trained
    assert_close(got, want, LOSS_RTOL, f"{name} losses")
    # Weights and every optimizer state come back under Paddle's names.
    cp.weights_to_host()
    names = [n for n in cpu_net.persistable_names() if not n.startswith("learning_rate")]
    assert len(names) > len(cpu_net.param_names) or name == "sgd"
    for n in names:
        np.testing.assert_allclose(
            ipu_net.array(n), cpu_net.array(n), rtol=1e-4, atol=1e-6, err_msg=n
        )


# --------------------------------------------------------------------------- layout


def _forward_with_grads(net: Net) -> tuple[list[str], list[Any]]:
    """Parameter names and their gradient Values, added to a forward-only program."""
    params = sorted(
        (p for p in net.main.global_block().all_parameters() if not p.stop_gradient),
        key=lambda p: p.name,
    )
    with paddle.static.program_guard(net.main):
        grads = paddle.static.gradients([net.loss], params)
    return [p.name for p in params], grads


def _reference_step(
    net: Net, names: list[str], grads: list[Any], micro: list[dict[str, np.ndarray]]
) -> tuple[list[float], dict[str, np.ndarray]]:
    """Loss and gradient of every micro-batch with the current weights, the gradients
    averaged over the micro-batches (Mean reduction)."""
    exe = paddle.static.Executor(paddle.CPUPlace())
    losses: list[float] = []
    total = {n: np.zeros_like(net.array(n)) for n in names}
    with paddle.static.scope_guard(net.scope):
        for feed in micro:
            out = exe.run(net.main, feed=feed, fetch_list=[net.loss, *grads])
            losses.append(float(np.asarray(out[0])))
            for n, g in zip(names, out[1:]):
                total[n] += np.asarray(g, "float32")
    return losses, {n: (g / np.float32(len(micro))).astype("float32") for n, g in total.items()}


class NumpyAdam:
    """Paddle's Adam in float32: bias correction folded into lr and epsilon."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        f = np.float32
        self.lr, self.b1, self.b2, self.eps = f(lr), f(beta1), f(beta2), f(eps)
        self.m1: dict[str, np.ndarray] = {}
        self.m2: dict[str, np.ndarray] = {}
        self.b1p, self.b2p = f(1), f(1)

    def update(self, weights: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        one = np.float32(1)
        self.b1p, self.b2p = self.b1p * self.b1, self.b2p * self.b2
        lr_t = self.lr * np.sqrt(one - self.b2p) / (one - self.b1p)
        for n, g in grads.items():
            m1 = self.b1 * self.m1.get(n, np.zeros_like(g)) + (one - self.b1) * g
            m2 = self.b2 * self.m2.get(n, np.zeros_like(g)) + (one - self.b2) * g * g
            self.m1[n], self.m2[n] = m1, m2
            eps_t = self.eps * np.sqrt(one - self.b2p)
            weights[n] = (weights[n] - lr_t * m1 / (np.sqrt(m2) + eps_t)).astype("float32")


def _set(net: Net, arrays: dict[str, np.ndarray]) -> None:
    for n, v in arrays.items():
        net.scope.var(n).get_tensor().set(np.ascontiguousarray(v, "float32"), paddle.CPUPlace())


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_batches_accumulation_replicas_match_explicit_reference(opt: str) -> None:
    bps, af, rf, runs, lr = 3, 4, 2, 2, 0.05
    make_opt = (lambda: P.SGD(lr)) if opt == "sgd" else (lambda: P.Adam(lr))
    ipu_net = build_mlp(make_opt)
    ref = build_mlp(None)  # forward only, same names and weights
    names, grads = _forward_with_grads(ref)
    weights = {n: ref.array(n) for n in names}
    adam = NumpyAdam(lr)

    cp, prog = compile_ipu(ipu_net, bps=bps, af=af, rf=rf)
    rng = np.random.default_rng(5)
    for run in range(runs):
        feed = mlp_batch(rng, (bps, af, rf, MBS))  # [bps, af, rf, *micro_batch]
        flat = {k: v.reshape(-1, *v.shape[4:]) for k, v in feed.items()}
        got = run_ipu(ipu_net, prog, feed if run == 0 else flat)
        assert got.shape == (bps, af, rf)
        for b in range(bps):
            _set(ref, weights)
            # replica r of micro-batch a takes feed[b, a, r]
            micro = [{k: v[b, a, r] for k, v in feed.items()} for a in range(af) for r in range(rf)]
            losses, mean_grads = _reference_step(ref, names, grads, micro)
            assert_close(got[b].reshape(-1), np.array(losses), 1e-5, f"run {run} step {b}")
            if opt == "sgd":
                for n in names:
                    weights[n] = (weights[n] - np.float32(lr) * mean_grads[n]).astype("float32")
            else:
                adam.update(weights, mean_grads)
    cp.weights_to_host()
    for n in names:
        np.testing.assert_allclose(ipu_net.array(n), weights[n], rtol=1e-4, atol=2e-6, err_msg=n)


def test_cnn_batchnorm_accumulation_matches_per_micro_batch_reference() -> None:
    af, steps, lr = 2, 4, 0.1
    ipu_net = build_cnn(lambda: P.SGD(lr))
    ref = build_cnn(None)
    names, grads = _forward_with_grads(ref)
    buffers = [n for n in ref.persistable_names() if n not in names]
    assert len(buffers) == 2  # the running mean and variance
    weights = {n: ref.array(n) for n in names}

    cp, prog = compile_ipu(ipu_net, af=af)
    rng = np.random.default_rng(8)
    for step in range(steps):
        feed = cnn_batch(rng, (af, MBS))
        got = run_ipu(ipu_net, prog, feed)
        _set(ref, weights)
        # BatchNorm sees each micro-batch on its own (its statistics too).
        losses, mean_grads = _reference_step(
            ref, names, grads, [{k: v[a] for k, v in feed.items()} for a in range(af)]
        )
        assert_close(got, np.array(losses), 1e-5, f"step {step}")
        weights = {
            n: (weights[n] - np.float32(lr) * mean_grads[n]).astype("float32") for n in names
        }
    cp.weights_to_host()
    for n in names:
        np.testing.assert_allclose(ipu_net.array(n), weights[n], rtol=1e-4, atol=1e-6, err_msg=n)
    for n in buffers:  # the running statistics, updated per micro-batch
        np.testing.assert_allclose(ipu_net.array(n), ref.array(n), rtol=1e-5, atol=1e-6, err_msg=n)


# --------------------------------------------------------------------------- save / resume

_RESUME_CODE = """
import sys
sys.path[:0] = [{conformance!r}, {tests!r}]
import numpy as np
import paddle
paddle.enable_static()
import test_training as T
np.savez({out!r}, **{{name: T.resume_from(name, {directory!r}) for name in {names!r}}})
"""


def _checkpoint(directory: str, name: str) -> str:
    return str(Path(directory) / name / "model")


def resume_from(name: str, directory: str) -> np.ndarray:
    """In a new process: build the program, load the checkpoint, train steps 10..19."""
    net = build_mlp(OPTIMIZERS[name][1])
    with paddle.static.scope_guard(net.scope):
        paddle.static.load(net.main, _checkpoint(directory, name))
    _, prog = compile_ipu(net)
    return train_ipu(net, prog, mlp_batches(STEPS)[10:])


@pytest.mark.slow
def test_save_and_resume_in_a_new_process_is_bitwise(tmp_path: Path) -> None:
    batches = mlp_batches(STEPS)
    uninterrupted: dict[str, np.ndarray] = {}
    for name in OPTIMIZERS:
        net = build_mlp(OPTIMIZERS[name][1])
        _, prog = compile_ipu(net)
        uninterrupted[name] = train_ipu(net, prog, batches)

        net = build_mlp(OPTIMIZERS[name][1])
        cp, prog = compile_ipu(net)
        first = train_ipu(net, prog, batches[:10])
        np.testing.assert_array_equal(first, uninterrupted[name][:10])
        cp.weights_to_host()
        with paddle.static.scope_guard(net.scope):
            paddle.static.save(net.main, _checkpoint(str(tmp_path), name))

    out = tmp_path / "resumed.npz"
    code = _RESUME_CODE.format(
        # this module, and the helpers it imports from the tests' root
        conformance=str(Path(__file__).resolve().parent),
        tests=str(Path(__file__).resolve().parents[1]),
        out=str(out),
        directory=str(tmp_path),
        names=list(OPTIMIZERS),
    )
    proc = run_python(code, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = np.load(out)
    for name in OPTIMIZERS:
        assert resumed[name].dtype == np.float32
        assert np.array_equal(resumed[name], uninterrupted[name][10:]), (
            f"{name}: {resumed[name]} != {uninterrupted[name][10:]}"
        )


def test_cached_gradient_runs_are_bitwise_those_of_executor_run() -> None:
    """The host trainer runs the gradient program through Paddle's executor cache,
    looked up once; Executor.run (a lookup per call) must give the same bits."""
    batches = mlp_batches(6)
    losses = []
    for fast in (True, False):
        net = build_mlp(OPTIMIZERS["adam"][1])
        cp, prog = compile_ipu(net, af=2)
        runner = cp.executor.session._trainer.trainer._runner
        runner.fast = fast
        pairs = [
            {k: np.stack([a[k], b[k]]) for k in a} for a, b in zip(batches[::2], batches[1::2])
        ]
        losses.append(train_ipu(net, prog, pairs))
        assert (len(runner._cache) == 1) == fast
    np.testing.assert_array_equal(losses[0], losses[1])


# --------------------------------------------------------------------------- eval mode


def test_eval_mode_freezes_and_resumes_training() -> None:
    make_opt = OPTIMIZERS["adam"][1]
    batches = mlp_batches(10)
    net = build_mlp(make_opt)
    _, prog = compile_ipu(net)
    straight = train_ipu(net, prog, batches)

    net = build_mlp(make_opt)
    cp, prog = compile_ipu(net)
    before = train_ipu(net, prog, batches[:4])
    cp.strategy.set_options({"runtime_options.enable_eval": True})
    frozen = train_ipu(net, prog, [batches[4]] * 3 + [batches[5]])
    cp.strategy.set_options({"runtime_options.enable_eval": False})
    after = train_ipu(net, prog, batches[4:])

    assert frozen[0] == frozen[1] == frozen[2]  # nothing was updated
    assert frozen[0] == straight[4] and frozen[3] != frozen[0]  # the same weights as step 4
    np.testing.assert_array_equal(np.concatenate([before, after]), straight)


# --------------------------------------------------------------------------- lr scheduler


SCHEDULES: dict[str, Callable[[], Any]] = {
    "step_decay_momentum": lambda: P.Momentum(
        P.lr.StepDecay(0.1, step_size=3, gamma=0.5), momentum=0.9
    ),
    "piecewise_adam": lambda: P.Adam(P.lr.PiecewiseDecay([4, 9], [0.02, 0.005, 0.001])),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_lr_scheduler_stepped_every_run_matches_paddle_cpu(name: str) -> None:
    batches = mlp_batches(12)
    cpu_net, ipu_net = build_mlp(SCHEDULES[name]), build_mlp(SCHEDULES[name])
    want = train_cpu(cpu_net, batches, scheduler=cpu_net.main.lr_scheduler)
    scheduler = ipu_net.main.lr_scheduler
    _, prog = compile_ipu(ipu_net)
    got = []
    for batch in batches:
        got.append(run_ipu(ipu_net, prog, batch))
        scheduler.step()
    assert_close(np.array(got), want, LOSS_RTOL, name)
    # A constant lr (the first value) would not match.
    const_net = build_mlp(SCHEDULES[name])
    _, prog = compile_ipu(const_net)
    assert not np.allclose(train_ipu(const_net, prog, batches), want, rtol=1e-4)


# --------------------------------------------------------------------------- fp16


@pytest.mark.slow
def test_fp16_training_converges_like_fp32() -> None:
    make_opt = lambda: P.Adam(0.01)  # noqa: E731
    batches = mlp_batches(60, seed=4)
    net32 = build_mlp(make_opt)
    _, prog32 = compile_ipu(net32)
    loss32 = train_ipu(net32, prog32, batches)

    net16 = build_mlp(make_opt)
    cp, prog16 = compile_ipu(net16, fp16=True)
    loss16 = train_ipu(net16, prog16, batches)

    assert loss16[-5:].mean() < 0.3 * loss16[:5].mean()  # it converges
    final32, final16 = loss32[-5:].mean(), loss16[-5:].mean()
    assert abs(final16 - final32) <= 0.05 * final32, (final16, final32)

    # fp32 training from the fp16-rounded initial weights: with float32 arithmetic
    # (host_fp16_arithmetic="float32") the same first loss, then the runs part because
    # fp16 training rounds the weights after every update; with the IPU's float16
    # arithmetic (the default) every operator's result is rounded: the first loss
    # moves, by float16's precision.
    rounded = build_mlp(make_opt)
    _set(rounded, {n: rounded.array(n).astype(np.float16) for n in rounded.param_names})
    _, prog = compile_ipu(rounded)
    loss_rounded = train_ipu(rounded, prog, batches)
    storage = build_mlp(make_opt)
    _, prog = compile_ipu(storage, fp16=True, options={"host_fp16_arithmetic": "float32"})
    loss_storage = train_ipu(storage, prog, batches)
    assert loss_storage[0] == loss_rounded[0] and loss32[0] != loss_storage[0]
    assert not np.array_equal(loss_storage[1:], loss_rounded[1:])
    assert loss16[0] != loss_rounded[0]
    assert abs(loss16[0] - loss_rounded[0]) <= 1e-2 * loss_rounded[0]

    # The device holds fp16 weights; the scope gets them back as float32.
    session = cp.executor.session
    device = session.read_weights(list(cp.model.weights))
    assert all(v.dtype == np.float16 for v in device.values())
    cp.weights_to_host()
    for onnx_name, paddle_name in cp.model.weights.items():
        value = net16.array(paddle_name)
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, device[onnx_name].astype(np.float32))


# --------------------------------------------------------------------------- bad input


def _strategy() -> Any:
    st = paddle_ipu.IpuStrategy()
    st.set_graph_config(is_training=True, micro_batch_size=MBS)
    return st


def test_training_a_program_without_optimizer_is_a_compile_error() -> None:
    net = build_mlp(None)
    cp = paddle_ipu.IpuCompiledProgram(net.main, scope=net.scope, ipu_strategy=_strategy())
    with pytest.raises(CompileError, match="no optimizer"):
        cp.compile(net.feeds, [net.loss])


def test_a_loss_that_is_not_a_scalar_is_a_compile_error() -> None:
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, IN], "float32")
        loss = paddle.static.nn.fc(x, 3).mean(axis=0)  # shape [3]
        # minimize() refuses such a loss; append_backward takes it.
        P.SGD(0.1).apply_gradients(paddle.static.append_backward(loss))
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=_strategy())
    with pytest.raises(CompileError, match=r"scalar.*\[3\]"):
        cp.compile(["x"], [loss])


def test_an_unsupported_optimizer_setting_is_refused_at_compile() -> None:
    net = build_mlp(lambda: P.Momentum(0.1, momentum=0.9, use_nesterov=True))
    cp = paddle_ipu.IpuCompiledProgram(net.main, scope=net.scope, ipu_strategy=_strategy())
    with pytest.raises(NotSupportedError, match="use_nesterov"):
        cp.compile(net.feeds, [net.loss])
    assert cp.executor is None


# --------------------------------------------------------------------------- anchors


def test_training_anchors_final_and_sum() -> None:
    bps, af, rf = 3, 2, 2
    make_opt = OPTIMIZERS["momentum"][0]
    rng = np.random.default_rng(6)
    feeds = [mlp_batch(rng, (bps, af, rf, MBS)) for _ in range(2)]
    results = {}
    for anchor in ("ALL", "FINAL", "SUM"):
        net = build_mlp(make_opt)
        _, prog = compile_ipu(net, bps=bps, af=af, rf=rf, anchor=anchor)
        results[anchor] = [run_ipu(net, prog, f) for f in feeds]
    for run in range(2):
        full = results["ALL"][run]
        assert full.shape == (bps, af, rf)
        final, total = results["FINAL"][run], results["SUM"][run]
        assert final.shape == (rf,) and total.shape == (rf,)
        np.testing.assert_array_equal(final, full[-1, -1])  # last step, last micro-batch
        np.testing.assert_allclose(total, full.sum(axis=(0, 1)), rtol=1e-6)
    # Training went on under every anchor: the second run starts from updated weights.
    assert not np.allclose(results["ALL"][1], results["ALL"][0])


# --------------------------------------------------------------------------- random seed


def _dropout_losses(seed: int, noise: int, steps: int = 5) -> list[float]:
    paddle.enable_static()
    paddle.seed(0)
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, IN], "float32")
        h = paddle.nn.functional.dropout(paddle.static.nn.fc(x, 16), p=0.5)
        loss = paddle.mean(paddle.square(paddle.static.nn.fc(h, 1)))
        P.SGD(0.1).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        paddle.seed(noise)  # whatever ran before, the session's seed decides
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=True, micro_batch_size=MBS)
        s.set_options({"random_seed": seed})
        cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
        prog = cp.compile(["x"], [loss])
        feed = {"x": np.ones((MBS, IN), np.float32)}
        exe = paddle.static.Executor(IPU)
        return [
            float(exe.run(prog, feed=feed, fetch_list=prog.fetch_names)[0]) for _ in range(steps)
        ]


def test_random_seed_makes_dropout_reproducible() -> None:
    first = _dropout_losses(seed=5, noise=1)
    np.testing.assert_array_equal(_dropout_losses(seed=5, noise=2), first)
    assert _dropout_losses(seed=6, noise=1) != first


def test_a_compiled_training_model_holds_no_paddle_objects() -> None:
    """CompiledModel is plain data (ONNX bytes, specs, the optimizer's numbers); the
    Paddle program reaches the host backend beside it, as SessionConfig.training_source."""
    import dataclasses as dc

    net = build_mlp(OPTIMIZERS["adam"][1])
    cp, _ = compile_ipu(net)
    model = cp.executor.model
    assert model.optimizer is not None and model.loss

    seen: set[int] = set()

    def walk(obj: Any, path: str) -> None:
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            return
        seen.add(id(obj))
        module = type(obj).__module__
        assert not module.startswith("paddle.") and module != "paddle", f"{path}: {type(obj)}"
        assert "libpaddle" not in module, f"{path}: {type(obj)}"
        if dc.is_dataclass(obj):
            for f in dc.fields(obj):
                walk(getattr(obj, f.name), f"{path}.{f.name}")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(k, f"{path}[{k!r}]")
                walk(v, f"{path}[{k!r}]")
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")

    walk(model, "model")
    assert cp.executor.session.config.training_source is not None
