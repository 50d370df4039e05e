"""The Session protocol, checked against every available backend (and the popart
adapter over the PopART double, see conftest.py).

Inference: the graph is y = x @ w + b with w, b as weights, built directly in ONNX so
that the contract does not depend on the compiler.

Training: the same affine layer with a mean-squared-error loss against a target ``t``,
written as a Paddle program and compiled (the host computes gradients with Paddle's
kernels, so it needs the program beside the model: ``SessionConfig.training_source``).
Every expected number comes from :class:`NumpyTrainer`, the model, its gradients, the
gradient reduction and the SGD and Adam updates written out in numpy in this file.

The PopART double computes no gradients and no updates: a training run advances the
Adam step counts and nothing else (tests/contract/popart_double/popart/_core.py).  What
the double runs here is checked on it with the same expectations (step layouts of
training outputs, the Adam step count, snapshots, eval mode, the weights round trip,
reads, tensor info); a test whose expectation needs an update skips on it, naming that
gap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Iterator, Mapping

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.helpers import fresh_programs

from paddle_ipu import backends
from paddle_ipu.backends.base import AnchorReturnType, Session, SessionConfig
from paddle_ipu.backends.layout import StepLayout
from paddle_ipu.compiler.model import CompiledModel, TensorSpec
from paddle_ipu.compiler.training import TrainingSource
from paddle_ipu.errors import BackendError, FeedError, IpuError, OptionError

MB, IN, OUT = 2, 3, 4
W0 = np.arange(IN * OUT, dtype=np.float32).reshape(IN, OUT) / 10
B0 = np.linspace(-1, 1, OUT).astype(np.float32)


def affine_model() -> CompiledModel:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [MB, IN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [MB, OUT])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    inits = [numpy_helper.from_array(W0, "w"), numpy_helper.from_array(B0, "b")]
    graph = helper.make_graph(nodes, "affine", [x], [y], initializer=inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return CompiledModel(
        onnx=proto.SerializeToString(),
        inputs=[TensorSpec("x", "float32", (MB, IN), "x")],
        outputs=[TensorSpec("y", "float32", (MB, OUT), "y")],
        weights={"w": "fc.w_0", "b": "fc.b_0"},
        micro_batch_size=MB,
        opset=13,
    )


def expected(x: np.ndarray, w: np.ndarray = W0, b: np.ndarray = B0) -> np.ndarray:
    return x @ w + b


@pytest.mark.parametrize(
    ("bps", "rf", "kind", "period"),
    [
        (1, 1, "ALL", 1),
        (3, 1, "ALL", 1),
        (3, 2, "ALL", 1),
        (4, 2, "EVERYN", 2),
        (3, 2, "FINAL", 1),
        (3, 2, "SUM", 1),
    ],
)
def test_layout_and_anchor_types(
    backend_name: str, bps: int, rf: int, kind: str, period: int
) -> None:
    layout = StepLayout(bps, 1, rf)
    config = SessionConfig(
        batches_per_step=bps,
        replication_factor=rf,
        anchors={"y": AnchorReturnType(kind, period)},
    )
    x = np.random.default_rng(bps * 10 + rf).standard_normal((bps, rf, MB, IN)).astype(np.float32)
    per_micro = expected(x)  # [bps, rf, MB, OUT]
    want = {
        "ALL": per_micro,
        "EVERYN": per_micro[period - 1 :: period],
        "FINAL": per_micro[-1],
        "SUM": per_micro.sum(axis=0),
    }[kind]
    with backends.create_session(backend_name, affine_model(), config) as session:
        session.prepare_device()
        out = session.run({"x": x.reshape(layout.input_shape((MB, IN)))})
    assert out["y"].shape == layout.anchor_shape((MB, OUT), kind, period)
    np.testing.assert_allclose(out["y"], want.reshape(out["y"].shape), rtol=1e-6, atol=1e-6)


def test_weights_round_trip_and_take_effect(backend_name: str) -> None:
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as session:
        session.prepare_device()
        assert session.has_info("w") and not session.has_info("nope")
        assert session.get_info("w").shape == (IN, OUT)
        read = session.read_weights(["w", "b"])
        np.testing.assert_array_equal(read["w"], W0)
        w1 = -W0
        session.write_weights({"w": w1})
        np.testing.assert_array_equal(session.read_weights(["w"])["w"], w1)
        x = np.ones((MB, IN), np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], expected(x, w1), rtol=1e-6)
        # the session keeps its own copy: changing the caller's array changes nothing
        w1[:] = 0
        assert session.read_weights(["w"])["w"].any()


def test_bad_input_raises_package_errors(backend_name: str) -> None:
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as session:
        session.prepare_device()
        with pytest.raises(FeedError, match="feed 'x'"):
            session.run({"x": np.ones((MB + 1, IN), np.float32)})
        with pytest.raises(IpuError):
            session.write_weights({"w": np.ones((IN + 1, OUT), np.float32)})


def test_fp16_weights_live_in_half_precision(backend_name: str) -> None:
    config = SessionConfig(enable_fp16=True)
    with backends.create_session(backend_name, affine_model(), config) as session:
        session.prepare_device()
        assert session.get_info("w").dtype == "float16"
        x = np.random.default_rng(0).standard_normal((MB, IN)).astype(np.float32)
        y = session.run({"x": x})["y"]
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, expected(x), rtol=1e-2, atol=1e-2)


def test_model_to_host_writes_current_weights(backend_name: str, tmp_path: object) -> None:
    import onnx

    path = str(tmp_path) + "/model.onnx"  # type: ignore[operator]
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as session:
        session.prepare_device()
        session.write_weights({"b": np.zeros(OUT, np.float32)})
        session.model_to_host(path)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    np.testing.assert_array_equal(inits["b"], np.zeros(OUT, np.float32))
    np.testing.assert_array_equal(inits["w"], W0)


# =========================================================================== training

LR = 0.1
# Paddle keeps the optimizers' attributes in float32.
BETA1, BETA2, EPS = (float(np.float32(v)) for v in (0.9, 0.999, 1e-8))
TW0 = (np.arange(IN * OUT, dtype=np.float32).reshape(IN, OUT) - 5) / 10
TB0 = np.linspace(0.5, -0.5, OUT).astype(np.float32)
NO_UPDATES = (
    "the PopART double computes no gradients and updates no weight or moment (a "
    "training run only advances the Adam step counts, tests/contract/popart_double/"
    "popart/_core.py)"
)


def needs_updates(backend_name: str, what: str) -> None:
    """Skip on the PopART double a test whose expectation needs weight updates."""
    popart = sys.modules.get("popart")
    double = popart is not None and str(getattr(popart, "__version__", "")).endswith("-double")
    if backend_name == "popart" and double:
        pytest.skip(f"{what}: {NO_UPDATES}")


@dataclasses.dataclass(frozen=True)
class Trainable:
    """The compiled training model and the device names of its tensors."""

    model: CompiledModel
    source: TrainingSource
    kind: str
    w: str
    b: str

    @property
    def loss(self) -> str:
        assert self.model.loss is not None
        return self.model.loss

    @property
    def y(self) -> str:
        return next(s.name for s in self.model.outputs if s.name != self.loss)

    def state(self, weight: str) -> dict[str, str]:
        """Role -> device name of ``weight``'s optimizer state: PopART's prefixes,
        and Paddle's own name for beta2_pow, which PopART does not keep."""
        if self.kind != "adam":
            return {}
        assert self.model.optimizer is not None
        slot = self.model.optimizer.param(self.model.weights[weight])
        return {
            "m1": "Accl1___" + weight,
            "m2": "Accl2___" + weight,
            "pow1": "Step___" + weight,
            "pow2": slot.state["beta2_pow"],
        }

    def names(self) -> list[str]:
        """Every weight and optimizer-state tensor, by device name."""
        return [self.w, self.b, *self.state(self.w).values(), *self.state(self.b).values()]


@functools.cache
def trainable(kind: str) -> Trainable:
    """y = x @ w + b, loss = mean((y - t)**2), trained with SGD or Adam (lr LR) from
    TW0, TB0; outputs: the loss, then y."""
    import paddle

    from paddle_ipu.compiler import compile_program
    from paddle_ipu.compiler.training import attach_training

    with fresh_programs() as (main, startup, scope):
        x = paddle.static.data("x", [MB, IN], "float32")
        t = paddle.static.data("t", [MB, OUT], "float32")
        layer = paddle.nn.Linear(IN, OUT)
        y = layer(x)
        loss = paddle.mean(paddle.square(y - t))
        if kind == "sgd":
            paddle.optimizer.SGD(learning_rate=LR).minimize(loss)
        else:
            paddle.optimizer.Adam(learning_rate=LR).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        for param, value in ((layer.weight, TW0), (layer.bias, TB0)):
            scope.find_var(param.name).get_tensor().set(value, paddle.CPUPlace())
        model = compile_program(main, [x, t], [loss, y], scope=scope, micro_batch_size=MB)
        model, source = attach_training(model, main, [loss, y], scope=scope)
    onnx_of = {paddle_name: onnx for onnx, paddle_name in model.weights.items()}
    return Trainable(model, source, kind, onnx_of[layer.weight.name], onnx_of[layer.bias.name])


@contextlib.contextmanager
def training_session(
    backend_name: str,
    kind: str = "adam",
    *,
    lr: float | None = None,
    bps: int = 1,
    af: int = 1,
    rf: int = 1,
    anchors: Mapping[str, AnchorReturnType] | None = None,
    fp16: bool = False,
    reduction: str = "mean",
) -> Iterator[tuple[Session, Trainable]]:
    """A prepared training session of :func:`trainable` (``lr`` replaces LR)."""
    tr = trainable(kind)
    model = tr.model
    if lr is not None:
        assert model.optimizer is not None
        model = dataclasses.replace(model, optimizer=dataclasses.replace(model.optimizer, lr=lr))
    config = SessionConfig(
        batches_per_step=bps,
        accumulation_factor=af,
        replication_factor=rf,
        anchors=dict(anchors or {}),
        is_training=True,
        enable_fp16=fp16,
        gradient_reduction=reduction,
        training_source=tr.source,
    )
    with backends.create_session(backend_name, model, config) as session:
        session.prepare_device()
        yield session, tr


class NumpyTrainer:
    """The training model written out in numpy, in float64: y = x @ w + b,
    loss = mean((y - t)**2) over the micro-batch; per step, the gradients of the
    af x rf micro-batches (dL/dy = 2 (y - t) / y.size, dL/dw = x^T dL/dy,
    dL/db = sum over rows of dL/dy) are summed, and divided by af * rf for "mean";
    then one update: SGD ``w -= lr g``, or Adam as Paddle's kernel computes it::

        m1 = beta1 m1 + (1 - beta1) g;  m2 = beta2 m2 + (1 - beta2) g^2
        w -= lr sqrt(1 - pow2) / (1 - pow1) * m1 / (sqrt(m2) + eps sqrt(1 - pow2))
        pow1 *= beta1;  pow2 *= beta2
    """

    def __init__(
        self,
        tr: Trainable,
        values: Mapping[str, np.ndarray] | None = None,
        *,
        lr: float = LR,
        reduction: str = "mean",
    ) -> None:
        self.tr, self.lr, self.reduction = tr, lr, reduction
        start = {tr.w: TW0, tr.b: TB0}
        for weight in (tr.w, tr.b):
            if tr.kind == "adam":
                shape = start[weight].shape
                names = tr.state(weight)
                start.update({names["m1"]: np.zeros(shape), names["m2"]: np.zeros(shape)})
                start.update({names["pow1"]: np.array([BETA1]), names["pow2"]: np.array([BETA2])})
        start.update(values or {})
        self.values = {name: np.array(v, dtype=np.float64) for name, v in start.items()}

    def forward(self, x: np.ndarray, t: np.ndarray) -> tuple[float, np.ndarray]:
        y = x @ self.values[self.tr.w] + self.values[self.tr.b]
        return float(np.mean((y - t) ** 2)), y

    def _grads(self, x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _, y = self.forward(x, t)
        dy = 2.0 * (y - t) / y.size
        return x.T @ dy, dy.sum(axis=0)

    def step(self, x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step over ``x`` [af, rf, MB, IN] and ``t`` [af, rf, MB, OUT]; returns the
        losses [af, rf] and y [af, rf, MB, OUT] (computed before the update)."""
        af, rf = x.shape[:2]
        losses, ys = np.empty((af, rf)), np.empty((af, rf, MB, OUT))
        gw, gb = np.zeros((IN, OUT)), np.zeros(OUT)
        for a in range(af):
            for r in range(rf):
                losses[a, r], ys[a, r] = self.forward(x[a, r], t[a, r])
                dw, db = self._grads(x[a, r], t[a, r])
                gw, gb = gw + dw, gb + db
        if self.reduction == "mean":
            gw, gb = gw / (af * rf), gb / (af * rf)
        self._update(self.tr.w, gw)
        self._update(self.tr.b, gb)
        return losses, ys

    def _update(self, weight: str, g: np.ndarray) -> None:
        v = self.values
        if self.tr.kind == "sgd":
            v[weight] = v[weight] - self.lr * g
            return
        n = self.tr.state(weight)
        m1 = BETA1 * v[n["m1"]] + (1 - BETA1) * g
        m2 = BETA2 * v[n["m2"]] + (1 - BETA2) * g * g
        pow1, pow2 = v[n["pow1"]][0], v[n["pow2"]][0]
        lr_t = self.lr * np.sqrt(1 - pow2) / (1 - pow1)
        v[weight] = v[weight] - lr_t * m1 / (np.sqrt(m2) + EPS * np.sqrt(1 - pow2))
        v[n["m1"]], v[n["m2"]] = m1, m2
        v[n["pow1"]], v[n["pow2"]] = v[n["pow1"]] * BETA1, v[n["pow2"]] * BETA2

    def run(self, x: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
        """One session run over [bps, af, rf, ...] inputs: every micro-batch's outputs,
        [bps, af, rf, *shape], by output name."""
        steps = [self.step(x[b], t[b]) for b in range(x.shape[0])]
        return {
            self.tr.loss: np.stack([losses for losses, _ in steps]),
            self.tr.y: np.stack([ys for _, ys in steps]),
        }


def new_batch(
    rng: np.random.Generator, layout: StepLayout
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """New data for one run: x and t as [bps, af, rf, MB, *], and the session's inputs
    (the same arrays in the step layout)."""
    lead = layout.factors()
    x = rng.standard_normal((*lead, MB, IN)).astype(np.float32)
    t = rng.standard_normal((*lead, MB, OUT)).astype(np.float32)
    inputs = {
        "x": x.reshape(layout.input_shape((MB, IN))),
        "t": t.reshape(layout.input_shape((MB, OUT))),
    }
    return x, t, inputs


def anchor_of(per_micro: np.ndarray, kind: str, period: int = 1) -> np.ndarray:
    """What an anchor returns from every micro-batch's values [bps, af, rf, *shape]
    (PopART's documented return types), before the size-1 factors are removed."""
    if kind == "ALL":
        return per_micro
    if kind == "EVERYN":
        return per_micro[period - 1 :: period]
    if kind == "FINAL":
        return per_micro[-1, -1]  # the last micro-batch of the last step, per replica
    return per_micro.sum(axis=(0, 1))  # SUM: over the steps and micro-batches


def read_all(session: Session, tr: Trainable) -> dict[str, np.ndarray]:
    return session.read_weights(tr.names())


def assert_same(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> None:
    """Bitwise equal, name by name."""
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


# float32 on the device against float64 here: Adam's m1 / sqrt(m2) amplifies the
# rounding of small gradients to about 1e-6 absolute after a few steps.
TOL = 1e-5


def assert_close(got: np.ndarray, want: np.ndarray, tol: float = TOL, name: str = "") -> None:
    """``got`` (a session's array) is ``want`` (the numpy model's, any layout of the
    same elements) to ``tol``, relative and absolute."""
    np.testing.assert_allclose(
        np.asarray(got, np.float64),
        np.reshape(want, np.shape(got)),
        rtol=tol,
        atol=tol,
        err_msg=name,
    )


def assert_follows(got: Mapping[str, np.ndarray], oracle: NumpyTrainer, tol: float = TOL) -> None:
    """The session's weights and state are the numpy model's."""
    for name, value in got.items():
        assert_close(value, oracle.values[name], tol, name)


def test_a_prepared_training_session_holds_the_compiled_weights(backend_name: str) -> None:
    with training_session(backend_name) as (session, tr):
        read = read_all(session, tr)
        assert_follows(read, NumpyTrainer(tr), tol=1e-7)
        np.testing.assert_array_equal(read[tr.w], TW0)
        # names=None: every weight and optimizer-state tensor the session holds
        everything = session.read_weights()
        device_state = [n for n in tr.names() if "___" in n]
        assert {tr.w, tr.b, *device_state} <= set(everything)
        for name in everything.keys() & read.keys():
            np.testing.assert_array_equal(everything[name], read[name], err_msg=name)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_tensor_info_of_a_training_session(backend_name: str, fp16: bool) -> None:
    with training_session(backend_name, fp16=fp16) as (session, tr):
        weight_dtype = "float16" if fp16 else "float32"
        for name, shape in ((tr.w, (IN, OUT)), (tr.b, (OUT,))):
            assert session.has_info(name)
            info = session.get_info(name)
            assert (info.shape, info.dtype) == (shape, weight_dtype)
            state = tr.state(name)
            for role in ("m1", "m2"):
                assert session.has_info(state[role])
                info = session.get_info(state[role])
                assert (info.shape, info.dtype) == (shape, "float32")
            for role in ("pow1", "pow2"):
                # a step count: 0-d on PopART (adamdecompose.cpp), Paddle's [1] on host
                assert session.has_info(state[role])
                info = session.get_info(state[role])
                assert (int(np.prod(info.shape)), info.dtype) == (1, "float32")
            # Adam keeps no third accumulator, and PopART's Combined SGD tensor is unused
            assert not session.has_info("Accl3___" + name)
            assert not session.has_info("Accl___" + name)
        for name, dtype, shape in (
            ("x", "float32", (MB, IN)),
            ("t", "float32", (MB, OUT)),
            (tr.y, "float32", (MB, OUT)),
        ):
            info = session.get_info(name)
            assert (info.dtype, info.shape) == (dtype, shape)
        assert session.has_info(tr.loss) and session.get_info(tr.loss).dtype == "float32"
        assert not session.has_info("nope")
        with pytest.raises(KeyError):
            session.get_info("nope")


@pytest.mark.parametrize("lr", [0.0, LR], ids=["lr0", "sgd"])
@pytest.mark.parametrize(
    ("bps", "af", "rf", "kind", "period"),
    [
        (1, 1, 1, "ALL", 1),
        (2, 2, 2, "ALL", 1),
        (3, 2, 1, "ALL", 1),
        (4, 2, 2, "EVERYN", 2),
        (2, 2, 2, "FINAL", 1),
        (2, 3, 2, "SUM", 1),
    ],
)
def test_training_outputs_in_their_anchor_layouts(
    backend_name: str, bps: int, af: int, rf: int, kind: str, period: int, lr: float
) -> None:
    """Every micro-batch's loss and y, in each anchor type's layout, each computed
    before its step's update.  At learning rate 0 the weights stay TW0, TB0 on every
    backend (the double's too): each micro-batch's outputs are the numpy forward pass
    of its own data."""
    if lr:
        needs_updates(backend_name, "outputs computed from updated weights")
    layout = StepLayout(bps, af, rf)
    tr = trainable("sgd")
    anchors = {tr.loss: AnchorReturnType(kind, period), tr.y: AnchorReturnType(kind, period)}
    rng = np.random.default_rng(bps * 100 + af * 10 + rf)
    oracle = NumpyTrainer(tr, lr=lr)
    with training_session(backend_name, "sgd", lr=lr, bps=bps, af=af, rf=rf, anchors=anchors) as (
        session,
        _,
    ):
        for _ in range(2):  # new data each run
            x, t, inputs = new_batch(rng, layout)
            out = session.run(inputs)
            want = oracle.run(x, t)
            for name, shape in ((tr.loss, ()), (tr.y, (MB, OUT))):
                assert out[name].shape == layout.anchor_shape(shape, kind, period), name
                assert_close(out[name], anchor_of(want[name], kind, period), name=name)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_training_runs_follow_the_numpy_model(backend_name: str, kind: str, reduction: str) -> None:
    """Three runs of two steps of 2 x 2 micro-batches (accumulation x replicas), new
    data each run: every micro-batch's loss and y, then the weights and the optimizer
    state, are the numpy model's, gradients reduced by their mean or their sum."""
    needs_updates(backend_name, "the updates and the gradient reduction")
    layout = StepLayout(2, 2, 2)
    rng = np.random.default_rng(7)
    with training_session(backend_name, kind, bps=2, af=2, rf=2, reduction=reduction) as (
        session,
        tr,
    ):
        oracle = NumpyTrainer(tr, reduction=reduction)
        for _ in range(3):
            x, t, inputs = new_batch(rng, layout)
            out = session.run(inputs)
            want = oracle.run(x, t)
            for name in (tr.loss, tr.y):
                assert_close(out[name], want[name], name=name)
            assert_follows(read_all(session, tr), oracle)


def test_a_sum_reduction_moves_sgd_weights_af_x_rf_times_as_far(backend_name: str) -> None:
    """The gradient reduction reaches the device: one SGD step of 2 x 2 micro-batches
    moves the weights four times as far with "sum" as with "mean"."""
    needs_updates(backend_name, "the gradient reduction")
    layout = StepLayout(1, 2, 2)
    inputs = new_batch(np.random.default_rng(11), layout)[2]
    moved = {}
    for reduction in ("mean", "sum"):
        with training_session(backend_name, "sgd", af=2, rf=2, reduction=reduction) as (
            session,
            tr,
        ):
            session.run(inputs)
            moved[reduction] = session.read_weights([tr.w])[tr.w] - TW0
    assert np.abs(moved["mean"]).max() > 1e-3
    np.testing.assert_allclose(moved["sum"], 4 * moved["mean"], rtol=1e-5, atol=1e-7)


def test_update_optimizer_changes_nothing_until_a_run(backend_name: str) -> None:
    rng = np.random.default_rng(3)
    with training_session(backend_name) as (session, tr):
        session.run(new_batch(rng, StepLayout())[2])
        before = read_all(session, tr)
        assert tr.model.optimizer is not None
        session.update_optimizer(dataclasses.replace(tr.model.optimizer, lr=0.5))
        assert_same(read_all(session, tr), before)
    with backends.create_session(backend_name, affine_model(), SessionConfig()) as inference:
        inference.prepare_device()
        with pytest.raises(OptionError, match="not a training session"):
            inference.update_optimizer(tr.model.optimizer)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_new_learning_rate_takes_effect_on_the_next_run(backend_name: str, kind: str) -> None:
    needs_updates(backend_name, "the effect of a learning rate")
    layout = StepLayout(2)
    rng = np.random.default_rng(5)
    with training_session(backend_name, kind, bps=2) as (session, tr):
        oracle = NumpyTrainer(tr)
        for lr in (LR, 0.02, 0.3):
            assert tr.model.optimizer is not None
            session.update_optimizer(dataclasses.replace(tr.model.optimizer, lr=lr))
            oracle.lr = lr
            x, t, inputs = new_batch(rng, layout)
            out = session.run(inputs)
            assert_close(out[tr.loss], oracle.run(x, t)[tr.loss])
            assert_follows(read_all(session, tr), oracle)


def test_restore_puts_back_the_snapshot_bitwise(backend_name: str) -> None:
    """snapshot() then restore() after two more runs: every weight and state tensor is
    back bit for bit, and the next run repeats the run that followed the snapshot."""
    layout = StepLayout(2)
    rng = np.random.default_rng(9)
    with training_session(backend_name, bps=2) as (session, tr):
        session.run(new_batch(rng, layout)[2])
        saved = session.snapshot()
        before = read_all(session, tr)
        inputs = new_batch(rng, layout)[2]
        first = session.run(inputs)
        after_first = read_all(session, tr)
        session.run(new_batch(rng, layout)[2])
        # the step counts move on every backend
        moved = read_all(session, tr)[tr.state(tr.w)["pow1"]]
        assert not np.array_equal(moved, before[tr.state(tr.w)["pow1"]])
        session.restore(saved)
        assert_same(read_all(session, tr), before)
        again = session.run(inputs)
        assert_same(again, first)
        assert_same(read_all(session, tr), after_first)


def _index_model() -> tuple[Trainable, str]:
    """y = x @ w + b; loss = mean(index_select(y, ids, axis=1)**2), Adam: a model whose
    integer feed can make a run fail inside the device."""
    import paddle

    from paddle_ipu.compiler import compile_program
    from paddle_ipu.compiler.training import attach_training

    with fresh_programs() as (main, startup, scope):
        x = paddle.static.data("x", [MB, IN], "float32")
        ids = paddle.static.data("ids", [MB], "int64")
        layer = paddle.nn.Linear(IN, OUT)
        loss = paddle.mean(paddle.square(paddle.index_select(layer(x), ids, axis=1)))
        paddle.optimizer.Adam(learning_rate=LR).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        model = compile_program(main, [x, ids], [loss], scope=scope, micro_batch_size=MB)
        model, source = attach_training(model, main, [loss], scope=scope)
    onnx_of = {paddle_name: onnx for onnx, paddle_name in model.weights.items()}
    tr = Trainable(model, source, "adam", onnx_of[layer.weight.name], onnx_of[layer.bias.name])
    return tr, next(s.dtype for s in model.inputs if s.name == "ids")


def test_a_run_that_fails_inside_the_device_is_undone_by_restore(backend_name: str) -> None:
    """The second step of a run indexes out of range: the run raises a package error
    after the first step moved the state, and restore() (what the executor does) puts
    every weight and state tensor back bit for bit."""
    tr, ids_dtype = _index_model()
    rng = np.random.default_rng(13)
    config = SessionConfig(batches_per_step=2, is_training=True, training_source=tr.source)

    def inputs(bad: bool) -> dict[str, np.ndarray]:
        ids = rng.integers(0, OUT, size=(2, MB)).astype(ids_dtype)
        if bad:
            ids[1, 0] = 99
        return {"x": rng.standard_normal((2, MB, IN)).astype(np.float32), "ids": ids}

    with backends.create_session(backend_name, tr.model, config) as session:
        session.prepare_device()
        session.run(inputs(bad=False))
        before = read_all(session, tr)
        saved = session.snapshot()
        with pytest.raises(BackendError):
            session.run(inputs(bad=True))
        moved = read_all(session, tr)
        pow1 = tr.state(tr.w)["pow1"]
        np.testing.assert_allclose(moved[pow1], before[pow1] * BETA1, rtol=1e-6)
        session.restore(saved)
        assert_same(read_all(session, tr), before)


def test_eval_mode_changes_nothing_and_off_resumes(backend_name: str) -> None:
    """set_eval(True): training runs return the forward pass of the current weights and
    change no weight and no optimizer state; set_eval(False): the step counts move
    again, by one per step."""
    layout = StepLayout(2, 2)
    rng = np.random.default_rng(17)
    with training_session(backend_name, bps=2, af=2) as (session, tr):
        session.run(new_batch(rng, layout)[2])
        before = read_all(session, tr)
        oracle = NumpyTrainer(tr, before, lr=0.0)  # lr 0: the forward of these weights
        session.set_eval(True)
        for _ in range(2):
            x, t, inputs = new_batch(rng, layout)
            out = session.run(inputs)
            want = oracle.run(x, t)
            for name in (tr.loss, tr.y):
                assert_close(out[name], want[name], name=name)
            assert_same(read_all(session, tr), before)
        session.set_eval(False)
        session.run(new_batch(rng, layout)[2])
        after = read_all(session, tr)
        for weight in (tr.w, tr.b):
            names = tr.state(weight)
            for role, beta in (("pow1", BETA1), ("pow2", BETA2)):
                want_pow = before[names[role]] * beta**2  # two steps
                np.testing.assert_allclose(after[names[role]], want_pow, rtol=1e-6)


def test_training_after_eval_resumes_as_if_eval_never_ran(backend_name: str) -> None:
    needs_updates(backend_name, "resuming the updates after eval mode")
    layout = StepLayout(2, 2)
    rng = np.random.default_rng(19)
    with training_session(backend_name, bps=2, af=2) as (session, tr):
        oracle = NumpyTrainer(tr)
        x, t, inputs = new_batch(rng, layout)
        session.run(inputs)
        oracle.run(x, t)
        session.set_eval(True)
        session.run(new_batch(rng, layout)[2])
        session.set_eval(False)
        x, t, inputs = new_batch(rng, layout)
        out = session.run(inputs)
        assert_close(out[tr.loss], oracle.run(x, t)[tr.loss])
        assert_follows(read_all(session, tr), oracle)


def _written_state(tr: Trainable, rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    """Weights and Adam state as a Paddle scope holds them after ``steps`` updates."""
    values: dict[str, np.ndarray] = {}
    for weight, shape in ((tr.w, (IN, OUT)), (tr.b, (OUT,))):
        names = tr.state(weight)
        values[weight] = rng.standard_normal(shape).astype(np.float32)
        values[names["m1"]] = rng.standard_normal(shape).astype(np.float32) / 10
        values[names["m2"]] = rng.uniform(0.01, 0.1, shape).astype(np.float32)
        values[names["pow1"]] = np.array([BETA1 ** (steps + 1)], np.float32)
        values[names["pow2"]] = np.array([BETA2 ** (steps + 1)], np.float32)
    return values


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_weights_and_optimizer_state_round_trip(backend_name: str, fp16: bool) -> None:
    """write_weights then read_weights by device names: the weights in the device's
    dtype (float16 with enable_fp16, rounded to nearest even), the moments bit for bit,
    the beta powers (PopART: a step count) to float32 precision; and the next run
    counts on from the written step count."""
    rng = np.random.default_rng(23)
    with training_session(backend_name, fp16=fp16) as (session, tr):
        written = _written_state(tr, rng, steps=4)
        session.write_weights(written)
        read = read_all(session, tr)
        for name, value in written.items():
            if name in (tr.w, tr.b):
                device = value.astype(np.float16) if fp16 else value
                assert read[name].dtype == device.dtype, name
                np.testing.assert_array_equal(read[name], device, err_msg=name)
            elif name.startswith(("Accl1___", "Accl2___")):
                assert read[name].dtype == np.float32, name
                np.testing.assert_array_equal(read[name], value, err_msg=name)
            else:
                np.testing.assert_allclose(read[name], value, rtol=1e-6, err_msg=name)
        # a half-precision weight written as float16 comes back as it was
        half = rng.standard_normal((IN, OUT)).astype(np.float16)
        session.write_weights({tr.w: half})
        np.testing.assert_array_equal(
            session.read_weights([tr.w])[tr.w], half if fp16 else half.astype(np.float32)
        )
        session.run(new_batch(rng, StepLayout())[2])
        after = read_all(session, tr)
        for weight in (tr.w, tr.b):
            names = tr.state(weight)
            np.testing.assert_allclose(
                after[names["pow1"]], [BETA1 ** (4 + 2)], rtol=1e-6, err_msg=weight
            )


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_written_optimizer_state_is_what_the_next_update_uses(
    backend_name: str, fp16: bool
) -> None:
    needs_updates(backend_name, "the update from written moments")
    rng = np.random.default_rng(29)
    with training_session(backend_name, fp16=fp16) as (session, tr):
        written = _written_state(tr, rng, steps=4)
        session.write_weights(written)
        start = dict(written)
        if fp16:  # the device holds the weights in float16
            start.update({n: written[n].astype(np.float16) for n in (tr.w, tr.b)})
        oracle = NumpyTrainer(tr, start)
        x, t, inputs = new_batch(rng, StepLayout())
        out = session.run(inputs)
        tol = 2e-3 if fp16 else TOL
        assert_close(out[tr.loss], oracle.run(x, t)[tr.loss], tol)
        assert_follows(read_all(session, tr), oracle, tol)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_read_weights_copies_and_views(backend_name: str, fp16: bool) -> None:
    """copy=False gives the values copy=True gives; a copy=True read is the caller's:
    writing into it changes nothing in the session, and a run does not change it."""
    rng = np.random.default_rng(31)
    with training_session(backend_name, fp16=fp16) as (session, tr):
        session.run(new_batch(rng, StepLayout())[2])
        names = tr.names()
        copies = session.read_weights(names)
        views = session.read_weights(names, copy=False)
        assert_same(views, copies)
        kept = {n: v.copy() for n, v in copies.items()}
        for value in copies.values():
            value[...] = 7
        assert_same(session.read_weights(names), kept)
        mine = session.read_weights(names)
        session.run(new_batch(rng, StepLayout())[2])
        assert_same(mine, kept)
        pow1 = tr.state(tr.w)["pow1"]
        assert not np.array_equal(session.read_weights([pow1])[pow1], kept[pow1])


def test_caller_output_buffers_are_filled_or_refused_before_the_run(backend_name: str) -> None:
    """run(inputs, outputs) fills the caller's buffers in place; a buffer of another
    shape or dtype is refused with FeedError before anything runs (no step moves)."""
    layout = StepLayout(2, 2, 2)
    rng = np.random.default_rng(37)
    # lr 0: the outputs are the forward pass of TW0, TB0 on every backend
    with training_session(backend_name, lr=0.0, bps=2, af=2, rf=2) as (session, tr):
        oracle = NumpyTrainer(tr, lr=0.0)
        buffers = {
            tr.loss: np.empty(layout.anchor_shape(()), np.float32),
            tr.y: np.empty(layout.anchor_shape((MB, OUT)), np.float32),
        }
        x, t, inputs = new_batch(rng, layout)
        out = session.run(inputs, buffers)
        want = oracle.run(x, t)
        for name, buf in buffers.items():
            assert out[name] is buf
            assert_close(buf, want[name], name=name)
        before = read_all(session, tr)
        for bad in (
            np.empty(layout.anchor_shape((MB, OUT + 1)), np.float32),
            np.empty(layout.anchor_shape((MB, OUT)), np.float64),
        ):
            with pytest.raises(FeedError, match=f"output buffer '{tr.y}'"):
                session.run(new_batch(rng, layout)[2], {**buffers, tr.y: bad})
            assert_same(read_all(session, tr), before)
