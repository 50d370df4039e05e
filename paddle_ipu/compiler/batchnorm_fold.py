"""Folding inference BatchNorm into the convolution before it, in float32.

``y = BN(Conv(x, W, b))`` with the running statistics is ``Conv(x, W * s, (b - mean) * s +
beta)`` where ``s = gamma / sqrt(var + eps)`` per output channel.  The fold is exact up to
float32 rounding, and it removes tensors whose values a trained model holds far outside
float16's range (PP-OCRv4's detector has BatchNorm variances up to 9.8e7): the fp16 pass
(:mod:`paddle_ipu.compiler.fp16_pass`) runs it before any value is rounded to float16.

Only constants fold: every tensor the fold reads must hold its value in the graph (an
initializer with data, a ``Constant`` node, or a ``Reshape``/``Unsqueeze``/``Squeeze``/
``Identity`` of one).  A weight the executor keeps in sync with a Paddle scope (an
initializer without data, whose value the session supplies) is never folded: a later
``weights_from_host`` would not reach the folded copy.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

_CONVS = ("Conv", "ConvTranspose")
_VIEWS = ("Reshape", "Unsqueeze", "Squeeze", "Identity")


@dataclass(frozen=True)
class Fold:
    """One BatchNorm folded away: its node and the convolution that took it."""

    batch_norm: str
    conv: str

    def describe(self) -> str:
        return f"{self.batch_norm} into {self.conv}"


class _Constants:
    """The values of the graph's constant tensors, computed on demand."""

    def __init__(self, graph: Any, excluded: Collection[str]) -> None:
        self.graph = graph
        self.excluded = set(excluded)
        self.inits = {init.name: init for init in graph.initializer}
        self.producers = {out: node for node in graph.node for out in node.output}
        self._cache: dict[str, np.ndarray | None] = {}

    def value(self, name: str) -> np.ndarray | None:
        if name in self._cache:
            return self._cache[name]
        self._cache[name] = None  # a cycle cannot recurse forever
        found = self._compute(name)
        self._cache[name] = found
        return found

    def _compute(self, name: str) -> np.ndarray | None:
        from onnx import TensorProto, numpy_helper

        if not name or name in self.excluded:
            return None
        init = self.inits.get(name)
        if init is not None:
            if init.data_location == TensorProto.EXTERNAL:
                return None
            if not (init.raw_data or _has_typed_data(init)) and _count(init.dims):
                return None  # a weight without data: the session supplies it
            return numpy_helper.to_array(init)
        node = self.producers.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            return None if attr is None else numpy_helper.to_array(attr.t)
        if node.op_type not in _VIEWS or not node.input:
            return None
        data = self.value(node.input[0])
        if data is None:
            return None
        if node.op_type == "Identity":
            return data
        axes = self._axes(node)
        if node.op_type == "Reshape":
            if axes is None or 0 in axes or axes.count(-1) > 1:
                return None
            try:
                return data.reshape(axes)
            except ValueError:
                return None
        if node.op_type == "Unsqueeze":
            if axes is None:
                return None
            out = data
            for axis in sorted(a % (data.ndim + len(axes)) for a in axes):
                out = np.expand_dims(out, axis)
            return out
        if axes is None:  # Squeeze without axes: every size-1 dimension
            return np.squeeze(data)
        return np.squeeze(data, axis=tuple(axes))

    def _axes(self, node: Any) -> list[int] | None:
        """Reshape's shape, or (Un)Squeeze's axes (an input from opset 13, else an
        attribute)."""
        if len(node.input) > 1 and node.input[1]:
            value = self.value(node.input[1])
            return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]
        attr = next((a for a in node.attribute if a.name == "axes"), None)
        return None if attr is None else [int(v) for v in attr.ints]


def _has_typed_data(init: Any) -> bool:
    return bool(init.float_data or init.int32_data or init.int64_data or init.double_data)


def _count(dims: Any) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64))


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _channel_vector(value: np.ndarray, channels: int, rank: int = 0) -> np.ndarray | None:
    """``value`` as one number per output channel, float64: a ``[C]`` vector (BatchNorm's
    parameters, a convolution's bias), or -- ``rank`` given -- an operand that an
    elementwise op broadcasts along the channel axis of a rank-``rank`` NC... tensor
    (``[C, 1, 1]``, ``[1, C, 1, 1]``)."""
    if value.size != channels:
        return None
    dims = [int(d) for d in value.shape]
    if rank:
        while dims and dims[0] == 1 and len(dims) > rank - 1:
            dims.pop(0)
        if dims != [channels] + [1] * (rank - 2):
            return None
    elif len(dims) != 1:
        return None
    return value.reshape(-1).astype(np.float64)


def fold_batch_norms(model: Any, excluded: Collection[str] = ()) -> list[Fold]:
    """Fold each inference BatchNormalization of ``model`` (an ``onnx.ModelProto``,
    changed in place) that follows a Conv or ConvTranspose -- directly, or through
    an Add of a per-channel constant bias -- into that convolution, in float32.
    ``excluded``: tensors never read as constants (the weights the executor keeps in
    sync).  Returns the folds made."""
    from onnx import numpy_helper

    graph = model.graph
    consts = _Constants(graph, excluded)
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    taken = {n for node in graph.node for n in (*node.input, *node.output)} | set(consts.inits)
    folds: list[Fold] = []
    dropped: set[int] = set()

    def single_use(name: str) -> bool:
        return consumers.get(name, 0) == 1 and name not in outputs

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    for bn in list(graph.node):
        if bn.op_type != "BatchNormalization" or len(bn.input) != 5:
            continue
        if len(bn.output) != 1 or int(_attr(bn, "training_mode", 0)) != 0:
            continue
        add = None
        conv = consts.producers.get(bn.input[0])
        if conv is not None and conv.op_type == "Add":
            add, conv = conv, None
            for i in (0, 1):
                producer = consts.producers.get(add.input[i])
                if producer is not None and producer.op_type in _CONVS:
                    conv, bias_in = producer, add.input[1 - i]
                    break
        if conv is None or conv.op_type not in _CONVS or len(conv.output) != 1:
            continue
        if not single_use(conv.output[0]) or (add is not None and not single_use(add.output[0])):
            continue
        weight = consts.value(conv.input[1]) if len(conv.input) > 1 else None
        params = [consts.value(name) for name in bn.input[1:]]
        if weight is None or weight.dtype != np.float32 or weight.ndim < 3:
            continue
        if any(p is None or p.dtype != np.float32 for p in params):
            continue
        group = int(_attr(conv, "group", 1))
        out_channels = weight.shape[0] if conv.op_type == "Conv" else weight.shape[1] * group
        vectors = [_channel_vector(p, out_channels) for p in params if p is not None]
        if any(v is None for v in vectors):
            continue
        gamma, beta, mean, var = (v for v in vectors if v is not None)
        bias = np.zeros(out_channels, np.float64)
        if len(conv.input) > 2 and conv.input[2]:
            conv_bias = consts.value(conv.input[2])
            vector = None if conv_bias is None else _channel_vector(conv_bias, out_channels)
            if vector is None:
                continue
            bias += vector
        if add is not None:
            added = consts.value(bias_in)
            vector = None if added is None else _channel_vector(added, out_channels, weight.ndim)
            if vector is None:
                continue
            bias += vector
        eps = float(_attr(bn, "epsilon", 1e-5))
        scale = gamma / np.sqrt(var + eps)
        w64 = weight.astype(np.float64)
        if conv.op_type == "Conv":
            folded_w = w64 * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
        else:  # ConvTranspose: [C_in, C_out / group, k...], output channel g * (C_out/g) + j
            per_group = weight.shape[1]
            grouped = w64.reshape((group, weight.shape[0] // group, per_group, *weight.shape[2:]))
            factor = scale.reshape((group, 1, per_group) + (1,) * (weight.ndim - 2))
            folded_w = (grouped * factor).reshape(weight.shape)
        folded_b = (bias - mean) * scale + beta
        w_name = fresh(f"{conv.input[1]}::bn_folded")
        b_name = fresh(f"{conv.name}::bn_folded_bias")
        graph.initializer.append(numpy_helper.from_array(folded_w.astype(np.float32), w_name))
        graph.initializer.append(numpy_helper.from_array(folded_b.astype(np.float32), b_name))
        data_in = conv.input[0]
        del conv.input[:]
        conv.input.extend([data_in, w_name, b_name])
        conv.output[0] = bn.output[0]
        dropped.add(id(bn))
        if add is not None:
            dropped.add(id(add))
        folds.append(Fold(bn.name, conv.name))
    if not folds:
        return folds
    keep = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(keep)
    _drop_unread(graph, excluded)
    # value_info of the removed intermediate tensors would now be stale
    live = {n for node in graph.node for n in (*node.input, *node.output)}
    infos = [vi for vi in graph.value_info if vi.name in live]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return folds


def _drop_unread(graph: Any, excluded: Collection[str]) -> None:
    """Remove the nodes and initializers nothing reads any more (a graph output is
    read); the excluded (synced) weights are left as they are."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {n for node in graph.node for n in node.input} | outputs
        dead = [
            node
            for node in graph.node
            if node.op_type in ("Constant", *_VIEWS) and all(o not in read for o in node.output)
        ]
        if not dead:
            break
        ids = {id(node) for node in dead}
        keep = [node for node in graph.node if id(node) not in ids]
        del graph.node[:]
        graph.node.extend(keep)
    read = {n for node in graph.node for n in node.input} | outputs
    inits = [i for i in graph.initializer if i.name in read or i.name in excluded]
    del graph.initializer[:]
    graph.initializer.extend(inits)
