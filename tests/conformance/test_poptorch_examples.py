"""PopTorch's documented examples (graphcore/poptorch docs/user_guide/trainingModel.py
and inferenceModel.py), ported to Paddle: ``poptorch.trainingModel`` ->
``paddle_ipu.training_model``, ``inferenceModel`` -> ``inference_model``,
``copyWeightsToHost`` -> ``copy_weights_to_host``, torch -> paddle.

The examples are kept as written (a forward returning ``(fc, loss)`` with the loss not
marked, ``trainingModel(model)`` without an optimizer, a half-precision Linear), with
two changes for a test: every training step gets new data, and each result is checked
against eager Paddle on the CPU (the example's closing ``allclose`` compares the last
step's output with the output after that step's update, which differs in eager too).
"""

from __future__ import annotations

import warnings
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


class ExampleModelWithLoss(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(10, 10)
        self.loss = paddle.nn.MSELoss()

    def forward(self, x: Any, target: Any = None) -> Any:
        fc = self.fc(x)
        if self.training:
            return fc, self.loss(fc, target)
        return fc


def test_training_model_example() -> None:
    rng = np.random.default_rng(0)
    data = [
        (rng.standard_normal([10]).astype(np.float32), rng.standard_normal([10]).astype(np.float32))
        for _ in range(100)
    ]
    paddle.seed(0)
    model = ExampleModelWithLoss()
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}

    # Wrap the model in our PopTorch annotation wrapper.
    poptorch_model = paddle_ipu.training_model(model)  # no optimizer: SGD, lr 0.01
    outs, losses = [], []
    for input, target in data:
        # Each call here executes the forward pass, loss calculation, and backward
        # pass in one step.
        poptorch_out, loss = poptorch_model(paddle.to_tensor(input), paddle.to_tensor(target))
        outs.append(poptorch_out.numpy())
        losses.append(float(loss))
    # Copy the trained weights from the IPU back into the host model.
    poptorch_model.copy_weights_to_host()
    # Execute the trained weights on host.
    model.eval()
    probe = paddle.to_tensor(data[-1][0])
    native_out = model(probe)

    # The oracle: the same steps in eager, with PopTorch's default optimizer.
    reference = ExampleModelWithLoss()
    reference.set_state_dict(initial)
    sgd = paddle.optimizer.SGD(0.01, parameters=reference.parameters())
    want_outs, want_losses = [], []
    for input, target in data:
        fc, loss = reference(paddle.to_tensor(input), paddle.to_tensor(target))
        loss.backward()
        sgd.step()
        sgd.clear_grad()
        want_outs.append(fc.numpy())
        want_losses.append(float(loss))
    reference.eval()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(outs), np.array(want_outs), rtol=1e-5, atol=1e-5)
    assert np.abs(model.fc.weight.numpy() - initial["fc.weight"]).max() > 1e-2  # it trained
    assert paddle.allclose(native_out, reference(probe), rtol=1e-5, atol=1e-6)


class MarkedLoss(ExampleModelWithLoss):
    def __init__(self, reduction: int) -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, x: Any, target: Any = None) -> Any:
        fc = self.fc(x)
        return fc, paddle.incubate.identity_loss((fc - target) ** 2, self.reduction)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("opt", ["sgd", "adam", "momentum"])
def test_training_model_identity_loss_any_reduction(opt: str, reduction: int) -> None:
    """The loss marked by identity_loss, reduced by sum, mean or not at all (a vector
    loss trains on its sum, as eager backward() does), with the three optimizers."""
    make = {
        "sgd": lambda p: paddle.optimizer.SGD(0.01, parameters=p),
        "adam": lambda p: paddle.optimizer.Adam(0.01, parameters=p),
        "momentum": lambda p: paddle.optimizer.Momentum(0.01, 0.9, parameters=p),
    }[opt]
    rng = np.random.default_rng(1)
    data = [rng.standard_normal([2, 4, 10]).astype(np.float32) for _ in range(20)]
    paddle.seed(1)
    model = MarkedLoss(reduction)
    reference = MarkedLoss(reduction)
    reference.set_state_dict(model.state_dict())
    ref_opt = make(reference.parameters())
    want = []
    for xy in data:
        _, loss = reference(paddle.to_tensor(xy[0]), paddle.to_tensor(xy[1]))
        loss.backward()
        ref_opt.step()
        ref_opt.clear_grad()
        want.append(loss.numpy())
    ipu = paddle_ipu.training_model(model, make(model.parameters()))
    got = [ipu(xy[0], xy[1])[1].numpy() for xy in data]
    assert got[0].shape == want[0].shape
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    ipu.copy_weights_to_host()
    for a, b in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_inference_model_example() -> None:
    """inferenceModel.py: mobilenet_v2 (random weights: no download in a test)."""
    paddle.seed(0)
    picture_of_a_cat_here = paddle.randn([1, 3, 224, 224])
    model = paddle.vision.models.mobilenet_v2(pretrained=False)
    model.eval()  # model.train(False)
    inference_model = paddle_ipu.inference_model(model)
    out_tensor = inference_model(picture_of_a_cat_here)
    top_five_classes = paddle.topk(paddle.nn.functional.softmax(out_tensor, 1), 5)
    native_out = model(picture_of_a_cat_here)
    native_top_five_classes = paddle.topk(paddle.nn.functional.softmax(native_out, 1), 5)
    assert bool((top_five_classes[1][0] == native_top_five_classes[1][0]).any())
    np.testing.assert_array_equal(top_five_classes[1].numpy(), native_top_five_classes[1].numpy())
    np.testing.assert_allclose(out_tensor.numpy(), native_out.numpy(), rtol=1e-4, atol=1e-5)


def test_inference_half_example() -> None:
    """inference_half: a Linear made half and a float16 input run in float16 and give
    a float16 result.  (Paddle's CPU build keeps the Linear's weights in float32 --
    ``float16()`` warns that the CPU lacks float16 -- so the oracle is the float32
    Linear, within float16's precision.)"""
    paddle.seed(2)
    model = paddle.nn.Linear(1, 10)
    reference = model(paddle.to_tensor([1.0])).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model.float16()
    t1 = paddle.to_tensor([1.0]).astype("float16")
    inference_model = paddle_ipu.inference_model(model)
    out = inference_model(t1)
    assert out.dtype == paddle.float16
    np.testing.assert_allclose(out.numpy().astype(np.float32), reference, rtol=2e-3, atol=2e-3)
