"""Models nobody here wrote: ``paddle.vision.models`` (``pretrained=False``: no
download) and standard ``paddle.nn`` blocks, built as static programs with their
weights initialised, for the zoo tier (tests/conformance/zoo) and ``bench/zoo.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from support.helpers import fresh_programs

# name -> (builder of the network, input size used by the fast tier, full input size)
VISION: dict[str, tuple[Callable[[], Any], int, int]] = {}


def _vision(name: str, small: int, full: int = 224, **kw: Any) -> None:
    import paddle.vision.models as models

    fn = getattr(models, name)
    VISION[name] = ((lambda: fn(**kw)), small, full)


# Every model of paddle.vision.models that builds in static mode.  Small sizes are the
# least each network accepts (alexnet and googlenet have fixed-size classifier inputs;
# inception_v3 needs 75x75 to keep its last convolutions non-empty).
for _name in (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d", "resnext50_64x4d", "resnext101_32x4d", "resnext101_64x4d",
    "resnext152_32x4d", "resnext152_64x4d", "wide_resnet50_2", "wide_resnet101_2",
    "vgg11", "vgg13", "vgg16", "vgg19",
    "mobilenet_v1", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
    "densenet121", "densenet161", "densenet169", "densenet201", "densenet264",
    "squeezenet1_0", "squeezenet1_1",
    "shufflenet_v2_x0_25", "shufflenet_v2_x0_33", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "shufflenet_v2_swish",
):  # fmt: skip
    _vision(_name, 32, pretrained=False)
_vision("alexnet", 224, pretrained=False)
_vision("googlenet", 224, pretrained=False)
_vision("inception_v3", 299, 299, pretrained=False)
VISION["LeNet"] = ((lambda: __import__("paddle.vision.models", fromlist=["LeNet"]).LeNet()), 28, 28)


class UNet(nn.Layer):
    """A small UNet: strided convolutions down, ``interpolate`` and
    ``conv2d_transpose`` up, ``concat`` skips."""

    def __init__(self, mode: str, how: str) -> None:
        super().__init__()
        self.mode, self.how = mode, how
        self.d1 = nn.Conv2D(3, 8, 3, padding=1)
        self.d2 = nn.Conv2D(8, 16, 3, stride=2, padding=1)
        self.bottom = nn.Conv2D(16, 16, 3, stride=2, padding=1)
        self.up = nn.Conv2DTranspose(32, 8, 2, stride=2)
        self.out = nn.Conv2D(16, 4, 1)

    def forward(self, x: Any) -> Any:
        a = F.relu(self.d1(x))
        b = F.relu(self.d2(a))
        c = F.relu(self.bottom(b))
        if self.how == "size":
            c = F.interpolate(c, size=list(b.shape[2:]), mode=self.mode)  # type: ignore[call-overload]
        else:
            c = F.interpolate(c, scale_factor=2, mode=self.mode)  # type: ignore[call-overload]
        u = self.up(paddle.concat([b, c], axis=1))
        return self.out(paddle.concat([a, u], axis=1))


class RnnClassifier(nn.Layer):
    def __init__(self, kind: str) -> None:
        super().__init__()
        cell = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cell(8, 16, num_layers=2)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class TransformerClassifier(nn.Layer):
    def __init__(self, vocab: int = 50, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.fc = nn.Linear(d, 5)

    def forward(self, x: Any) -> Any:
        return self.fc(self.enc(self.emb(x)).mean(axis=1))


# name -> (builder, input shape without the batch dim, input kind, classes for labels)
BLOCKS: dict[str, tuple[Callable[[], Any], tuple[int, ...], str]] = {
    "lstm": (lambda: RnnClassifier("lstm"), (6, 8), "float32"),
    "gru": (lambda: RnnClassifier("gru"), (6, 8), "float32"),
    "transformer": (TransformerClassifier, (10,), "int64"),
    "unet_bilinear_size": (lambda: UNet("bilinear", "size"), (3, 32, 32), "float32"),
    "unet_nearest_size": (lambda: UNet("nearest", "size"), (3, 32, 32), "float32"),
    "unet_bilinear_scale": (lambda: UNet("bilinear", "scale"), (3, 32, 32), "float32"),
    "unet_nearest_scale": (lambda: UNet("nearest", "scale"), (3, 32, 32), "float32"),
}
CLASSES = {"lstm": 4, "gru": 4, "transformer": 5}


@dataclass
class Model:
    name: str
    main: Any
    scope: Any
    out: Any  # the fetched value (logits, or the loss when training)
    x_shape: tuple[int, ...]
    x_dtype: str
    loss: Any = None
    label_classes: int = 0

    @property
    def feeds(self) -> list[str]:
        return ["x", "label"] if self.loss is not None else ["x"]

    def feed(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        if self.x_dtype == "int64":
            x = rng.integers(0, 50, self.x_shape).astype("int64")
        else:
            x = rng.standard_normal(self.x_shape).astype("float32")
        out = {"x": x}
        if self.loss is not None:
            out["label"] = rng.integers(0, self.label_classes, (self.x_shape[0], 1)).astype("int64")
        return out

    def weight_bytes(self) -> int:
        total = 0
        for p in self.main.global_block().all_parameters():
            var = self.scope.find_var(p.name)
            if var is not None and var.get_tensor()._is_initialized():
                total += int(np.array(var.get_tensor()).nbytes)
        return total


def build(
    name: str,
    *,
    batch: int = 1,
    size: int | None = None,
    train: bool = False,
    lr: float = 1e-3,
    seed: int = 1,
) -> Model:
    """Build model ``name`` (a key of VISION or BLOCKS) with initialised weights.

    ``size``: the image side for vision models (default: the fast tier's).  With
    ``train``, the program also holds a cross-entropy loss and an Adam update; the
    same ``seed`` gives the same parameter names and initial values."""
    np.random.seed(seed)
    with fresh_programs(seed) as (main, startup, scope):
        if name in VISION:
            make, small, _ = VISION[name]
            side = size or small
            channels = 1 if name == "LeNet" else 3
            shape: tuple[int, ...] = (batch, channels, side, side)
            dtype = "float32"
            classes = 10 if name == "LeNet" else 1000
        else:
            make, inner, dtype = BLOCKS[name]
            shape = (batch, *inner)
            classes = CLASSES.get(name, 0)
        net = make()
        if not train:
            net.eval()
        x = paddle.static.data("x", list(shape), dtype)
        out = net(x)
        if isinstance(out, (list, tuple)):
            out = out[0]
        loss = None
        if train:
            label = paddle.static.data("label", [shape[0], 1], "int64")
            loss = F.cross_entropy(out, label)
            paddle.optimizer.Adam(lr).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return Model(name, main, scope, out, shape, dtype, loss, classes)


def run_cpu(model: Model, feed: dict[str, np.ndarray], fetch: Any = None) -> np.ndarray:
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(model.scope):
        default = model.loss if model.loss is not None else model.out
        target = fetch if fetch is not None else default
        return np.asarray(exe.run(model.main, feed=feed, fetch_list=[target])[0])


def compile_ipu(
    model: Model, *, fp16: bool = False, arithmetic: str = "", precision: str = ""
) -> tuple[Any, Any]:
    """(IpuCompiledProgram, runnable program) for ``model`` on the default backend;
    ``arithmetic``: the host's fp16 arithmetic (default: the IPU's float16);
    ``precision``: the host's precision without fp16 (``host_precision``)."""
    import paddle_ipu

    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=model.loss is not None, micro_batch_size=model.x_shape[0])
    s.set_precision_config(enable_fp16=fp16)
    if arithmetic:
        s.set_options({"host_fp16_arithmetic": arithmetic})
    if precision:
        s.set_options({"host_precision": precision})
    cp = paddle_ipu.IpuCompiledProgram(model.main, scope=model.scope, ipu_strategy=s)
    target = model.loss if model.loss is not None else model.out
    return cp, cp.compile(model.feeds, [target])


def run_ipu(model: Model, prog: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    with paddle.static.scope_guard(model.scope):
        return np.asarray(exe.run(prog, feed=feed, fetch_list=prog.fetch_names)[0])


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute difference over the largest reference magnitude."""
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()
    return float(diff / max(float(np.abs(ref).max()), 1e-12))
