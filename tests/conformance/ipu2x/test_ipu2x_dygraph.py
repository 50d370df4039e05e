"""Dygraph Layers on the IPU: paddle_ipu.inference_model / training_model (PopTorch
style) and Paddle 2.x's set_optimizer + register_patch flow.  The oracle is eager
training of the same Layer on the CPU."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle
import pytest

import paddle_ipu


@pytest.fixture(autouse=True)
def _eager() -> Iterator[None]:
    paddle.disable_static()
    yield
    paddle.enable_static()


class Net(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(8, 16)
        self.fc2 = paddle.nn.Linear(16, 3)

    def forward(self, x: Any, y: Any) -> Any:
        out = self.fc2(paddle.nn.functional.relu(self.fc1(x)))
        return paddle.nn.functional.cross_entropy(out, y, reduction="none").mean()


class Classifier(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(8, 16)
        self.fc2 = paddle.nn.Linear(16, 3)

    def forward(self, x: Any) -> Any:
        return self.fc2(paddle.nn.functional.tanh(self.fc1(x)))


OPTIMIZERS = {
    "sgd": lambda p: paddle.optimizer.SGD(0.1, parameters=p),
    "adam": lambda p: paddle.optimizer.Adam(0.01, parameters=p),
    "momentum": lambda p: paddle.optimizer.Momentum(0.1, 0.9, parameters=p),
    "lamb": lambda p: paddle.optimizer.Lamb(0.01, parameters=p),
}

rng = np.random.default_rng(0)
DATA = [
    (rng.standard_normal([8, 8]).astype(np.float32), rng.integers(0, 3, [8, 1]).astype(np.int64))
    for _ in range(100)
]


def _make(opt: str) -> tuple[Net, Any]:
    paddle.seed(3)
    net = Net()
    return net, OPTIMIZERS[opt](net.parameters())


def _eager_losses(net: Net, optimizer: Any, data: list[Any]) -> list[float]:
    losses = []
    for x, y in data:
        loss = net(paddle.to_tensor(x), paddle.to_tensor(y))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_training_model_equals_eager_100_steps(opt: str) -> None:
    net, optimizer = _make(opt)
    want = _eager_losses(net, optimizer, DATA)
    net2, optimizer2 = _make(opt)
    initial = net2.fc1.weight.numpy().copy()
    model = paddle_ipu.training_model(net2, optimizer2)
    got = [float(np.asarray(model(x, y)).reshape(-1)[0]) for x, y in DATA]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    model.copy_weights_to_host()
    assert np.abs(net2.fc1.weight.numpy() - initial).max() > 1e-3  # it trained
    for a, b in zip(net.parameters(), net2.parameters()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


def test_copy_to_host_then_resume_in_eager_equals_eager() -> None:
    """Weights and Adam's state copied back: eager training continues where the
    device stopped, as if it had trained all along."""
    net, optimizer = _make("adam")
    want = _eager_losses(net, optimizer, DATA[:20])
    net2, optimizer2 = _make("adam")
    model = paddle_ipu.training_model(net2, optimizer2)
    for x, y in DATA[:10]:
        model(x, y)
    model.copy_weights_to_host()
    got = _eager_losses(net2, optimizer2, DATA[10:20])
    np.testing.assert_allclose(got, want[10:], rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip(tmp_path: Any) -> None:
    net, optimizer = _make("sgd")
    model = paddle_ipu.training_model(net, optimizer)
    for x, y in DATA[:5]:
        model(x, y)
    model.copy_weights_to_host()
    path = str(tmp_path / "net.pdparams")
    paddle.save(net.state_dict(), path)
    fresh = Net()
    fresh.set_state_dict(paddle.load(path))
    x, y = DATA[5]
    want = float(fresh(paddle.to_tensor(x), paddle.to_tensor(y)))
    # the loss of the next batch, computed on the device before its update
    got = float(np.asarray(model(x, y)).reshape(-1)[0])
    assert abs(got - want) < 1e-5
    # set_state_dict into the Layer, then to the device
    net.set_state_dict(paddle.load(path))
    model.copy_weights_to_device()
    np.testing.assert_allclose(
        float(np.asarray(model(x, y)).reshape(-1)[0]), want, rtol=1e-5, atol=1e-6
    )


def test_inference_model_recompiles_on_new_shape(caplog: Any) -> None:
    paddle.seed(4)
    layer = Classifier()
    layer.eval()
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=False)
    model = paddle_ipu.inference_model(layer, s)
    for batch in (4, 4, 6):
        x = rng.standard_normal([batch, 8]).astype(np.float32)
        with caplog.at_level(logging.INFO, logger="paddle_ipu"):
            got = model(paddle.to_tensor(x))
        np.testing.assert_allclose(got.numpy(), layer(paddle.to_tensor(x)).numpy(), rtol=1e-5)
    assert any("compiling again" in r.message for r in caplog.records)
    model.detach()
    np.testing.assert_allclose(model(x).numpy(), layer(paddle.to_tensor(x)).numpy(), rtol=1e-5)


@pytest.mark.parametrize(("af", "rf"), [(2, 1), (1, 2), (2, 2)])
def test_accumulation_and_replicas_equal_eager_full_batch(af: int, rf: int) -> None:
    """One call takes af * rf micro-batches; gradients are averaged (the 2.x default),
    which is eager training on the whole batch with the mean loss."""
    net, optimizer = _make("adam")
    want = _eager_losses(net, optimizer, DATA[:10])
    net2, optimizer2 = _make("adam")
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(num_ipus=rf, is_training=True)
    s.set_pipelining_config(enable_gradient_accumulation=af > 1, accumulation_factor=af)
    if rf > 1:
        s.set_options({"enable_replicated_graphs": True, "replicated_graph_count": rf})
    model = paddle_ipu.training_model(net2, optimizer2, s)
    got = [float(np.mean(np.asarray(model(x, y)))) for x, y in DATA[:10]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_2x_flow_register_patch() -> None:
    """Paddle 2.x: set_optimizer, register_patch, to_static Layer trains per call,
    identity_loss marks the loss, IpuBackend.weights_to_host syncs, release_patch."""

    class WithLoss(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def forward(self, x: Any, y: Any) -> Any:
            return paddle.incubate.identity_loss(self.net(x, y), 1)

    paddle.seed(3)
    reference = Net()
    ref_opt = paddle.optimizer.Adam(0.01, parameters=reference.parameters())
    want = _eager_losses(reference, ref_opt, DATA[:10])

    paddle.seed(3)
    model = WithLoss()
    optimizer = paddle.optimizer.Adam(0.01, parameters=model.parameters())
    s = paddle.static.IpuStrategy()
    s.set_graph_config(is_training=True)
    s.set_optimizer(optimizer)
    assert s.get_option("lr") == pytest.approx(0.01)
    s.register_patch()
    try:
        compiled = paddle.jit.to_static(model)
        got = [float(np.asarray(compiled(x, y)).reshape(-1)[0]) for x, y in DATA[:10]]
        paddle.framework.core.IpuBackend.get_instance().weights_to_host()
    finally:
        s.release_patch()
    assert not isinstance(paddle.jit.to_static(Classifier()), paddle_ipu.frontends.dygraph.IpuModel)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(reference.parameters(), model.net.parameters()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)


class WithBatchNorm(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(8, 16)
        self.bn = paddle.nn.BatchNorm1D(16)
        self.out = paddle.nn.Linear(16, 3)

    def forward(self, x: Any, y: Any) -> Any:
        logits = self.out(paddle.nn.functional.relu(self.bn(self.fc(x))))
        return paddle.nn.functional.cross_entropy(logits, y, reduction="none").mean()


def test_batch_norm_statistics_come_back() -> None:
    """BatchNorm's running mean and variance (non-trainable parameters in Paddle 3)
    move on the device and are copied back with the weights."""
    paddle.seed(5)
    net = WithBatchNorm()
    optimizer = paddle.optimizer.Momentum(0.05, 0.9, parameters=net.parameters())
    want = _eager_losses(net, optimizer, DATA[:10])  # type: ignore[arg-type]
    paddle.seed(5)
    net2 = WithBatchNorm()
    model = paddle_ipu.training_model(
        net2, paddle.optimizer.Momentum(0.05, 0.9, parameters=net2.parameters())
    )
    got = [float(np.asarray(model(x, y)).reshape(-1)[0]) for x, y in DATA[:10]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    model.copy_weights_to_host()
    for name in ("_mean", "_variance"):
        np.testing.assert_allclose(
            getattr(net2.bn, name).numpy(), getattr(net.bn, name).numpy(), rtol=1e-5, atol=1e-6
        )


# -- the loss, found the way PopTorch finds it ------------------------------------------


class Forwards(paddle.nn.Layer):
    """One network, several ways of returning its loss."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style
        self.fc1 = paddle.nn.Linear(8, 16)
        self.fc2 = paddle.nn.Linear(16, 3)

    def forward(self, x: Any, y: Any = None, scale: float = 1.0) -> Any:
        logits = self.fc2(paddle.nn.functional.relu(self.fc1(x))) * scale
        if y is None:
            return logits
        loss = paddle.nn.functional.cross_entropy(logits, y)
        accuracy = paddle.metric.accuracy(paddle.nn.functional.softmax(logits), y)
        if self.style == "logits_loss":
            return logits, loss
        if self.style == "loss_accuracy":  # the accuracy has no gradient: not a loss
            return loss, accuracy
        if self.style == "dict":
            return {"logits": logits, "loss": loss}
        if self.style == "parts":  # the cross entropy is part of the returned total
            total = loss + 0.01 * paddle.mean(logits * logits)
            return loss, total
        if self.style == "hidden":  # marked but not returned: trained on all the same
            paddle.incubate.identity_loss(loss, 1)
            return logits
        raise AssertionError(self.style)


def _loss_of(style: str, out: Any) -> Any:
    if style == "dict":
        return out["loss"]
    if style == "parts":
        return out[1]
    if style == "hidden":
        return None
    return out[0] if style == "loss_accuracy" else out[1]


@pytest.mark.parametrize("style", ["logits_loss", "loss_accuracy", "dict", "parts", "hidden"])
def test_loss_found_as_poptorch_finds_it(style: str) -> None:
    paddle.seed(6)
    net = Forwards(style)
    reference = Forwards(style)
    reference.set_state_dict(net.state_dict())
    ref_opt = paddle.optimizer.Adam(0.01, parameters=reference.parameters())
    model = paddle_ipu.training_model(net, paddle.optimizer.Adam(0.01, parameters=net.parameters()))
    for x, y in DATA[:15]:
        want = reference(paddle.to_tensor(x), paddle.to_tensor(y))
        loss = _loss_of(style, want)
        if loss is None:  # eager: the marked loss is the cross entropy
            loss = paddle.nn.functional.cross_entropy(want, paddle.to_tensor(y))
        loss.backward()
        ref_opt.step()
        ref_opt.clear_grad()
        got = model(x, y=y)
        flat_got = paddle.utils.flatten(got)
        flat_want = paddle.utils.flatten(want)
        assert type(got) is type(want)
        for g, w in zip(flat_got, flat_want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)
    model.copy_weights_to_host()
    for a, b in zip(net.parameters(), reference.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


class TwoIndependentLosses(Forwards):
    def forward(self, x: Any, y: Any = None, scale: float = 1.0) -> Any:
        logits = self.fc2(paddle.nn.functional.relu(self.fc1(x)))
        return paddle.nn.functional.cross_entropy(logits, y), paddle.mean(logits**2)


class NoLoss(Forwards):
    def forward(self, x: Any, y: Any = None, scale: float = 1.0) -> Any:
        return self.fc2(self.fc1(x))


class TwoMarks(Forwards):
    def forward(self, x: Any, y: Any = None, scale: float = 1.0) -> Any:
        logits = self.fc2(self.fc1(x))
        a = paddle.incubate.identity_loss(paddle.nn.functional.cross_entropy(logits, y), 1)
        b = paddle.incubate.identity_loss(paddle.mean(logits**2), 1)
        return a, b


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (TwoIndependentLosses, r"returns 2 values that could each be the loss \(output 0 "),
        (NoLoss, r"none can be the loss"),
        (TwoMarks, r"marks 2 independent losses"),
    ],
)
def test_undetermined_loss_is_refused_before_anything_runs(layer: Any, message: str) -> None:
    paddle.seed(7)
    net = layer("-")
    before = [p.numpy().copy() for p in net.parameters()]
    model = paddle_ipu.training_model(net, paddle.optimizer.SGD(0.1, parameters=net.parameters()))
    x, y = DATA[0]
    with pytest.raises(paddle_ipu.errors.CompileError, match=message):
        model(x, y)
    model.copy_weights_to_host()
    for p, b in zip(net.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


def test_training_model_in_eval_mode_and_constants() -> None:
    """layer.eval(): the forward only, nothing updated; a non-tensor argument is a
    constant of the graph (a new value compiles again); layer.train() trains on."""
    paddle.seed(8)
    net = Forwards("logits_loss")
    reference = Forwards("logits_loss")
    reference.set_state_dict(net.state_dict())
    ref_opt = paddle.optimizer.SGD(0.1, parameters=reference.parameters())
    model = paddle_ipu.training_model(net, paddle.optimizer.SGD(0.1, parameters=net.parameters()))

    def eager_step(x: Any, y: Any, scale: float) -> float:
        _, loss = reference(paddle.to_tensor(x), paddle.to_tensor(y), scale=scale)
        loss.backward()
        ref_opt.step()
        ref_opt.clear_grad()
        return float(loss)

    for x, y in DATA[:5]:
        assert float(model(x, y)[1]) == pytest.approx(eager_step(x, y, 1.0), rel=1e-5)
    net.eval()
    reference.eval()
    probe = DATA[50][0]
    for _ in range(2):
        np.testing.assert_allclose(
            model(probe).numpy(), reference(paddle.to_tensor(probe)).numpy(), rtol=1e-5, atol=1e-6
        )
    net.train()
    reference.train()
    for x, y in DATA[5:10]:
        got = float(model(x, y, scale=0.5)[1])
        assert got == pytest.approx(eager_step(x, y, 0.5), rel=1e-5)


def test_host_changes_reach_the_device() -> None:
    """set_state_dict on the Layer and the optimizer (a checkpoint loaded between
    steps) replaces what the device holds; so does copy_weights_to_device after
    set_value."""
    paddle.seed(9)
    net, optimizer = _make("adam")
    model = paddle_ipu.training_model(net, optimizer)
    for x, y in DATA[:5]:
        model(x, y)
    model.copy_weights_to_host()
    saved_net = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    saved_opt = {
        k: (v.numpy().copy() if hasattr(v, "numpy") else v)
        for k, v in optimizer.state_dict().items()
    }
    for x, y in DATA[5:10]:
        model(x, y)
    net.set_state_dict(saved_net)
    optimizer.set_state_dict(saved_opt)
    got = [float(np.asarray(model(x, y)).reshape(-1)[0]) for x, y in DATA[5:8]]
    # the oracle: eager from the saved weights and optimizer state
    ref, ref_opt = _make("adam")
    ref.set_state_dict(saved_net)
    ref_opt.set_state_dict(saved_opt)
    want = _eager_losses(ref, ref_opt, DATA[5:8])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    model.copy_weights_to_host()
    with paddle.no_grad():
        net.fc1.weight.set_value(np.zeros([8, 16], np.float32))
    model.copy_weights_to_device()
    x, y = DATA[20]
    got_zero = float(np.asarray(model(x, y)).reshape(-1)[0])
    zeroed, _ = _make("adam")
    zeroed.set_state_dict(net.state_dict())
    np.testing.assert_allclose(
        got_zero, float(zeroed(paddle.to_tensor(x), paddle.to_tensor(y))), rtol=1e-5
    )
