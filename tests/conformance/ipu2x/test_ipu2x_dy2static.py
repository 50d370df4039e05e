"""Paddle 2.x's dy2static flow on the IPU, as Paddle 2.x's test/ipu/test_dy2static_ipu.py
writes it: a Layer whose ``forward`` is decorated with ``@paddle.jit.to_static``,
``paddle.set_device("ipu")``, ``paddle.static.IpuStrategy()`` made in dygraph mode (which
registers the patch), ``set_graph_config(is_training=True)``, ``set_optimizer(opt)``, then
nothing but ``pred, loss = model(x, label)`` per step, ``IpuBackend.get_instance()
.weights_to_host()`` and ``release_patch()``.

Unlike the 2.x file, every step gets new data, the loss is given both ways (a plain
``paddle.mean`` and ``identity_loss`` with each reduction), and the oracle is eager
training of the same Layer on the CPU (same initial weights, same batches): the losses,
the outputs returned beside them and the weights must match at 1e-5.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle
import pytest
from paddle.jit.dy2static.program_translator import ProgramCache, StaticFunction
from paddle.optimizer.lr import LRScheduler

import paddle_ipu
from paddle_ipu.errors import CompileError

STEPS = 12
BATCH = 8


@pytest.fixture(autouse=True)
def _eager_on_cpu() -> Iterator[None]:
    paddle.disable_static()
    paddle.set_device("cpu")
    yield
    paddle_ipu.frontends.dy2static.release_patch()
    paddle.set_device("cpu")
    paddle.enable_static()


def _loss(kind: str, logits: Any, target: Any) -> Any:
    ce = paddle.nn.functional.cross_entropy(logits, target, reduction="none")
    if kind == "mean":  # a plain loss: found as the one scalar a gradient reaches
        return paddle.mean(ce)
    if kind == "id_mean":  # 2.x's own marking
        return paddle.incubate.identity_loss(ce, 1)
    if kind == "id_sum":
        return paddle.incubate.identity_loss(ce, 0)
    if kind == "id_none":  # trains on the sum, as eager backward() of a vector does
        return paddle.incubate.identity_loss(ce, 2)
    raise AssertionError(kind)


def _body(self: Any, x: Any, target: Any = None) -> Any:
    x = self.conv(x)
    x = paddle.flatten(x, 1, -1)
    logits = self.fc(x)
    if target is None:
        return logits
    return logits, _loss(self.loss_kind, logits, target)


class EagerLayer(paddle.nn.Layer):
    """The oracle's Layer: the same computation, run eagerly."""

    def __init__(self, loss_kind: str = "mean") -> None:
        super().__init__()
        self.loss_kind = loss_kind
        self.conv = paddle.nn.Conv2D(3, 4, 3)
        self.fc = paddle.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x: Any, target: Any = None) -> Any:
        return _body(self, x, target)


class SimpleLayer(EagerLayer):
    """2.x's test Layer: the forward under ``@to_static(full_graph=True)``."""

    @paddle.jit.to_static(full_graph=True)
    def forward(self, x: Any, target: Any = None) -> Any:
        return _body(self, x, target)


OPTIMIZERS = {
    "sgd": lambda p, lr: paddle.optimizer.SGD(lr, parameters=p),
    "adam": lambda p, lr: paddle.optimizer.Adam(lr, parameters=p),
    "momentum": lambda p, lr: paddle.optimizer.Momentum(lr, 0.9, parameters=p),
}


def _batches(n: int, seed: int = 7) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal([BATCH, 3, 8, 8]).astype(np.float32),
            rng.integers(0, 10, [BATCH]).astype(np.int64),
        )
        for _ in range(n)
    ]


def _initial_state() -> dict[str, np.ndarray]:
    paddle.seed(2021)
    return {k: v.numpy().copy() for k, v in EagerLayer().state_dict().items()}


def _eager(
    kind: str, opt: str, batches: list[Any], init: dict[str, np.ndarray], lr: Any = 0.01
) -> tuple[list[np.ndarray], list[np.ndarray], EagerLayer, Any]:
    net = EagerLayer(kind)
    net.set_state_dict(init)
    optim = OPTIMIZERS[opt](net.parameters(), lr)
    losses, preds = [], []
    for x, y in batches:
        pred, loss = net(paddle.to_tensor(x), paddle.to_tensor(y))
        loss.backward()
        optim.step()
        optim.clear_grad()
        losses.append(loss.numpy())
        preds.append(pred.numpy())
    return losses, preds, net, optim


def _ipu_strategy(optim: Any) -> Any:
    ipu_strategy = paddle.static.IpuStrategy()  # dygraph mode: registers the patch
    ipu_strategy.set_graph_config(
        num_ipus=1, is_training=True, micro_batch_size=BATCH, enable_manual_shard=False
    )
    ipu_strategy.set_optimizer(optim)
    return ipu_strategy


def _assert_weights(got: Any, want: Any) -> None:
    for (name, a), b in zip(got.state_dict().items(), want.state_dict().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("kind", ["mean", "id_mean", "id_sum", "id_none"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_2x_flow_trains_as_eager(opt: str, kind: str) -> None:
    batches = _batches(STEPS)
    init = _initial_state()
    want_losses, want_preds, reference, _ = _eager(kind, opt, batches, init)

    model = SimpleLayer(kind)
    model.set_state_dict(init)
    optim = OPTIMIZERS[opt](model.parameters(), 0.01)
    paddle.set_device("ipu")
    ipu_strategy = _ipu_strategy(optim)
    losses, preds = [], []
    for x, y in batches:
        # ipu only needs call model() to do forward/backward/grad_update
        pred, loss = model(paddle.to_tensor(x), paddle.to_tensor(y))
        losses.append(loss.numpy())
        preds.append(pred.numpy())
    paddle.base.core.IpuBackend.get_instance().weights_to_host()
    ipu_strategy.release_patch()

    np.testing.assert_allclose(np.array(losses), np.array(want_losses), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(preds), np.array(want_preds), rtol=1e-5, atol=1e-5)
    assert np.abs(model.fc.weight.numpy() - init["fc.weight"]).max() > 1e-3  # it trained
    _assert_weights(model, reference)


def test_2x_save_load_resume(tmp_path: Any) -> None:
    """2.x's TestSaveLoad: train, weights_to_host, paddle.save the Layer's and the
    optimizer's state_dict, set_state_dict them back, train on.  Then a checkpoint of
    an earlier step loaded into the Layer and the optimizer mid-run replaces what the
    device holds, and a fresh Layer and optimizer resume from the saved files."""
    batches = _batches(3 * STEPS)
    init = _initial_state()
    _, _, ref_mid, _ = _eager("id_mean", "adam", batches[:STEPS], init)
    saved_model = {k: v.numpy().copy() for k, v in ref_mid.state_dict().items()}
    want_losses, _, reference, _ = _eager("id_mean", "adam", batches[: 2 * STEPS], init)

    with paddle.utils.unique_name.guard():  # the names a new process would give
        model = SimpleLayer("id_mean")
    model.set_state_dict(init)
    optim = paddle.optimizer.Adam(0.01, parameters=model.parameters())
    paddle.set_device("ipu")
    ipu_strategy = _ipu_strategy(optim)
    losses = [
        model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy() for x, y in batches[:STEPS]
    ]
    paddle.base.core.IpuBackend.get_instance().weights_to_host()
    model_path, optim_path = str(tmp_path / "model.pdparams"), str(tmp_path / "optim.pdopt")
    paddle.save(model.state_dict(), model_path)
    paddle.save(optim.state_dict(), optim_path)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value.numpy(), saved_model[name], rtol=1e-5, atol=1e-6)
    model.set_state_dict(paddle.load(model_path))
    optim.set_state_dict(paddle.load(optim_path))
    losses += [
        model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy()
        for x, y in batches[STEPS : 2 * STEPS]
    ]
    np.testing.assert_allclose(np.array(losses), np.array(want_losses), rtol=1e-5, atol=1e-6)
    paddle.base.core.IpuBackend.get_instance().weights_to_host()
    _assert_weights(model, reference)

    # The step-12 checkpoint, loaded while the device holds step 24's weights:
    # the next steps start from it (eager does the same from the same state).
    model.set_state_dict(paddle.load(model_path))
    optim.set_state_dict(paddle.load(optim_path))
    again = [
        model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy()
        for x, y in batches[STEPS : STEPS + 3]
    ]
    np.testing.assert_allclose(
        np.array(again), np.array(want_losses[STEPS : STEPS + 3]), rtol=1e-5, atol=1e-6
    )
    ipu_strategy.release_patch()

    # A fresh Layer and optimizer, with the names a new process would give them
    # (the optimizer's state is matched by name), resume from the files.
    paddle.set_device("cpu")
    with paddle.utils.unique_name.guard():
        eager_next = EagerLayer("id_mean")
        eager_next.set_state_dict(paddle.load(model_path))
        eager_optim = paddle.optimizer.Adam(0.01, parameters=eager_next.parameters())
        eager_optim.set_state_dict(paddle.load(optim_path))
        want_next = []
        for x, y in batches[2 * STEPS :]:
            _, loss = eager_next(paddle.to_tensor(x), paddle.to_tensor(y))
            loss.backward()
            eager_optim.step()
            eager_optim.clear_grad()
            want_next.append(loss.numpy())
    paddle.set_device("ipu")
    with paddle.utils.unique_name.guard():
        fresh = SimpleLayer("id_mean")
        fresh.set_state_dict(paddle.load(model_path))
        fresh_optim = paddle.optimizer.Adam(0.01, parameters=fresh.parameters())
        fresh_optim.set_state_dict(paddle.load(optim_path))
        ipu_strategy = _ipu_strategy(fresh_optim)
        got_next = [
            fresh(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy()
            for x, y in batches[2 * STEPS :]
        ]
    ipu_strategy.release_patch()
    np.testing.assert_allclose(np.array(got_next), np.array(want_next), rtol=1e-5, atol=1e-6)
    _assert_weights(fresh, eager_next)


def test_2x_lr_scheduler_is_read_each_step() -> None:
    batches = _batches(STEPS)
    init = _initial_state()
    ref_sched = paddle.optimizer.lr.StepDecay(0.05, step_size=3, gamma=0.5)
    net = EagerLayer("id_mean")
    net.set_state_dict(init)
    ref_opt = paddle.optimizer.Momentum(ref_sched, 0.9, parameters=net.parameters())
    want = []
    for x, y in batches:
        _, loss = net(paddle.to_tensor(x), paddle.to_tensor(y))
        loss.backward()
        ref_opt.step()
        ref_opt.clear_grad()
        ref_sched.step()
        want.append(loss.numpy())

    model = SimpleLayer("id_mean")
    model.set_state_dict(init)
    sched = paddle.optimizer.lr.StepDecay(0.05, step_size=3, gamma=0.5)
    optim = paddle.optimizer.Momentum(sched, 0.9, parameters=model.parameters())
    paddle.set_device("ipu")
    ipu_strategy = _ipu_strategy(optim)
    got = []
    for x, y in batches:
        got.append(model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy())
        sched.step()
    ipu_strategy.release_patch()  # copies the weights back
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
    _assert_weights(model, net)


def test_2x_eval_mode_runs_forward_only() -> None:
    """layer.eval() between training steps: the forward alone, on the trained weights,
    updating nothing; layer.train() trains on from there."""
    batches = _batches(2 * STEPS)
    init = _initial_state()
    want_losses, _, reference, _ = _eager("mean", "momentum", batches, init)
    probe = paddle.to_tensor(batches[0][0])
    half = EagerLayer("mean")
    half.set_state_dict(init)
    half_opt = paddle.optimizer.Momentum(0.01, 0.9, parameters=half.parameters())
    for x, y in batches[:STEPS]:
        half(paddle.to_tensor(x), paddle.to_tensor(y))[1].backward()
        half_opt.step()
        half_opt.clear_grad()
    half.eval()
    want_eval = half(probe).numpy()

    model = SimpleLayer("mean")
    model.set_state_dict(init)
    optim = paddle.optimizer.Momentum(0.01, 0.9, parameters=model.parameters())
    paddle.set_device("ipu")
    ipu_strategy = _ipu_strategy(optim)
    losses = [
        model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy() for x, y in batches[:STEPS]
    ]
    model.eval()
    got_eval = model(probe)
    np.testing.assert_allclose(got_eval.numpy(), want_eval, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model(probe).numpy(), want_eval, rtol=1e-5, atol=1e-5)
    model.train()
    losses += [
        model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy() for x, y in batches[STEPS:]
    ]
    ipu_strategy.release_patch()
    np.testing.assert_allclose(np.array(losses), np.array(want_losses), rtol=1e-5, atol=1e-6)
    _assert_weights(model, reference)


class BNLayer(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        # No bias before BatchNorm: its gradient is rounding noise, which Adam's
        # normalised step turns into updates of full size on either device.
        self.conv = paddle.nn.Conv2D(3, 4, 3, bias_attr=False)
        self.bn = paddle.nn.BatchNorm2D(4)
        self.fc = paddle.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x: Any, target: Any = None) -> Any:
        logits = self.fc(paddle.flatten(paddle.nn.functional.relu(self.bn(self.conv(x))), 1, -1))
        if target is None:
            return logits
        return logits, paddle.nn.functional.cross_entropy(logits, target)


def test_2x_batch_norm_statistics() -> None:
    """BatchNorm's running statistics move on the device at each step and come back
    with the weights; the eval forward uses them."""
    batches = _batches(STEPS)
    paddle.seed(11)
    init = {k: v.numpy().copy() for k, v in BNLayer().state_dict().items()}
    reference = BNLayer()
    reference.set_state_dict(init)
    ref_opt = paddle.optimizer.Adam(0.01, parameters=reference.parameters())
    want = []
    for x, y in batches:
        _, loss = reference(paddle.to_tensor(x), paddle.to_tensor(y))
        loss.backward()
        ref_opt.step()
        ref_opt.clear_grad()
        want.append(loss.numpy())
    reference.eval()
    probe = paddle.to_tensor(batches[0][0])
    want_eval = reference(probe).numpy()

    model = BNLayer()
    model.set_state_dict(init)
    optim = paddle.optimizer.Adam(0.01, parameters=model.parameters())
    paddle.set_device("ipu")
    ipu_strategy = _ipu_strategy(optim)
    model = paddle.jit.to_static(model)  # the other 2.x spelling: to_static(layer)
    got = [model(paddle.to_tensor(x), paddle.to_tensor(y))[1].numpy() for x, y in batches]
    model.eval()
    got_eval = model(probe).numpy()
    ipu_strategy.release_patch()
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_eval, want_eval, rtol=1e-5, atol=1e-5)
    for name in ("_mean", "_variance"):
        np.testing.assert_allclose(
            getattr(model.bn, name).numpy(),
            getattr(reference.bn, name).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )


def test_2x_release_patch_restores_everything() -> None:
    """2.x's TestPatch, and more: release_patch() gives Paddle's functions back, and the
    Layer holds the trained weights (to_static runs it on the CPU again)."""
    old_call = StaticFunction.__call__
    old_getter = ProgramCache.__getitem__
    old_step = LRScheduler.step
    batches = _batches(4)
    init = _initial_state()
    _, _, reference, _ = _eager("mean", "sgd", batches, init)

    model = SimpleLayer("mean")
    model.set_state_dict(init)
    optim = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    paddle.set_device("ipu")
    ipu_strategy = _ipu_strategy(optim)
    assert StaticFunction.__call__ is not old_call
    for x, y in batches:
        model(paddle.to_tensor(x), paddle.to_tensor(y))
    ipu_strategy.release_patch()  # no weights_to_host: release copies them back
    assert StaticFunction.__call__ is old_call
    assert ProgramCache.__getitem__ is old_getter
    assert LRScheduler.step is old_step
    assert not paddle_ipu.frontends.dy2static.patch_registered()
    _assert_weights(model, reference)
    paddle.set_device("cpu")
    x = paddle.to_tensor(batches[0][0])
    model.eval()
    reference.eval()
    np.testing.assert_allclose(model(x).numpy(), reference(x).numpy(), rtol=1e-5, atol=1e-5)


def test_strategy_made_in_static_mode_registers_nothing() -> None:
    paddle.enable_static()
    paddle.static.IpuStrategy()
    assert not paddle_ipu.frontends.dy2static.patch_registered()
    paddle.disable_static()
    paddle.static.IpuStrategy()
    assert paddle_ipu.frontends.dy2static.patch_registered()


class TwoLosses(EagerLayer):
    @paddle.jit.to_static(full_graph=True)
    def forward(self, x: Any, target: Any = None) -> Any:
        logits = self.fc(paddle.flatten(self.conv(x), 1, -1))
        ce = paddle.nn.functional.cross_entropy(logits, target)
        return ce, paddle.mean(logits * logits)


def test_2x_undetermined_loss_is_refused_before_anything_runs() -> None:
    model = TwoLosses()
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    optim = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    paddle.set_device("ipu")
    _ipu_strategy(optim)
    x, y = _batches(1)[0]
    with pytest.raises(
        CompileError, match=r"2 values that could each be the loss .*output 0.*output 1"
    ):
        model(paddle.to_tensor(x), paddle.to_tensor(y))
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k])
