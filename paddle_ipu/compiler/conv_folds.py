"""Folding constant per-channel arithmetic into the convolutions around it, in float32.

Trained models as Paddle's libraries export them are chains of small operators around
each convolution: BatchNorm with its running statistics, the bias as an ``Add`` of a
reshaped vector, a learnable scale and shift (PP-LCNetV3's ``x * a + b``, in PP-OCRv4's
detector and recogniser).  Each is a pass over the whole activation; folded into the
convolution's weights and bias they cost nothing:

- after a Conv or ConvTranspose (:func:`fold_into_convolutions`): ``BN``, ``Add``/``Sub``
  of a per-channel or scalar constant, ``Mul``/``Div`` by one: ``y = Conv(x, W * s,
  b * s + t)``;
- before a Conv (:func:`fold_scalars_before_convolutions`): ``Mul``/``Div`` by a scalar
  constant (``Conv(x * c) = Conv(x, c * W)``, zero padding included), ``Add``/``Sub`` of
  one when the convolution does not pad (``Conv(x + d) = Conv(x) + d * sum(W)``).

The folds are exact up to float32 rounding (computed in float64, stored as float32).  A
BatchNorm fold also removes tensors that a trained model holds far outside float16's
range (PP-OCRv4's detector has BatchNorm variances up to 9.8e7): the fp16 pass
(:mod:`paddle_ipu.compiler.fp16_pass`) folds before any value is rounded to float16.

Only constants fold: every tensor a fold reads must hold its value in the graph (an
initializer with data, a ``Constant`` node, or a ``Reshape``/``Unsqueeze``/``Squeeze``/
``Identity`` of one).  A weight the executor keeps in sync with a Paddle scope (an
initializer without data, whose value the session supplies, or one named in
``excluded``) is never folded: a later ``weights_from_host`` would not reach the folded
copy.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_ipu.compiler.onnx_passes import node_reads

_CONVS = ("Conv", "ConvTranspose")
_VIEWS = ("Reshape", "Unsqueeze", "Squeeze", "Identity")
_AFFINE = ("Add", "Sub", "Mul", "Div")


@dataclass(frozen=True)
class Fold:
    """Operators folded into one convolution: their node names and op types."""

    conv: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]

    @property
    def batch_norms(self) -> tuple[str, ...]:
        return tuple(n for n, op in zip(self.nodes, self.ops) if op == "BatchNormalization")

    def describe(self) -> str:
        return f"{'+'.join(self.nodes)} into {self.conv}"


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
    (``[C, 1, 1]``, ``[1, C, 1, 1]``), or a scalar (one element of any rank <= ``rank``)."""
    dims = [int(d) for d in value.shape]
    if rank and value.size == 1 and len(dims) <= rank:
        return np.full(channels, float(value.reshape(-1)[0]))
    if value.size != channels:
        return None
    if rank:
        while dims and dims[0] == 1 and len(dims) > rank - 1:
            dims.pop(0)
        if dims != [channels] + [1] * (rank - 2):
            return None
    elif len(dims) != 1:
        return None
    return value.reshape(-1).astype(np.float64)


class _Graph:
    """What the folds need to know of a graph: its constants, who reads what."""

    def __init__(self, model: Any, excluded: Collection[str]) -> None:
        graph = model.graph
        self.graph = graph
        self.excluded = set(excluded)
        self.consts = _Constants(graph, excluded)
        self.readers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node_reads(node):  # a Loop's body reads weights too
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}
        self.taken = {n for node in graph.node for n in (*node.input, *node.output)}
        self.taken |= set(self.consts.inits)
        self.dropped: set[int] = set()

    def only_reader(self, name: str) -> Any:
        """The one node reading ``name`` (None when it is read twice, or is an output)."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or name in self.outputs:
            return None
        return readers[0]

    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def conv_params(self, conv: Any) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(weight, bias, output channels) of a convolution, float64, when constants."""
        weight = self.consts.value(conv.input[1]) if len(conv.input) > 1 else None
        if weight is None or weight.dtype != np.float32 or weight.ndim < 3:
            return None
        group = int(_attr(conv, "group", 1))
        channels = weight.shape[0] if conv.op_type == "Conv" else weight.shape[1] * group
        bias = np.zeros(channels, np.float64)
        if len(conv.input) > 2 and conv.input[2]:
            value = self.consts.value(conv.input[2])
            vector = None if value is None else _channel_vector(value, channels)
            if vector is None:
                return None
            bias = bias + vector
        return weight.astype(np.float64), bias, channels

    def set_params(self, conv: Any, data: str, weight: np.ndarray, bias: np.ndarray) -> None:
        from onnx import numpy_helper

        w_name = self.fresh(f"{conv.input[1]}::folded")
        b_name = self.fresh(f"{conv.name}::folded_bias")
        self.graph.initializer.append(numpy_helper.from_array(weight.astype(np.float32), w_name))
        self.graph.initializer.append(numpy_helper.from_array(bias.astype(np.float32), b_name))
        del conv.input[:]
        conv.input.extend([data, w_name, b_name])

    def finish(self) -> None:
        """Drop the folded nodes, then whatever nothing reads any more."""
        if not self.dropped:
            return
        graph = self.graph
        keep = [node for node in graph.node if id(node) not in self.dropped]
        del graph.node[:]
        graph.node.extend(keep)
        _drop_unread(graph, self.excluded)
        live = {n for node in graph.node for n in (*node.input, *node.output)}
        infos = [vi for vi in graph.value_info if vi.name in live]  # stale shapes out
        del graph.value_info[:]
        graph.value_info.extend(infos)


def _scale_output_channels(conv: Any, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``weight`` with output channel ``o`` multiplied by ``scale[o]``."""
    if conv.op_type == "Conv":  # [C_out, C_in / group, k...]
        return weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    # ConvTranspose: [C_in, C_out / group, k...]; output channel g * (C_out / g) + j
    group = int(_attr(conv, "group", 1))
    per_group = weight.shape[1]
    grouped = weight.reshape((group, weight.shape[0] // group, per_group, *weight.shape[2:]))
    factor = scale.reshape((group, 1, per_group) + (1,) * (weight.ndim - 2))
    return (grouped * factor).reshape(weight.shape)


def _affine_step(
    g: _Graph, node: Any, current: str, channels: int, rank: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``node`` (reading ``current``) as ``y = x * scale + shift`` per output channel,
    when it is one with constant operands."""
    if node.op_type == "BatchNormalization":
        if len(node.input) != 5 or node.input[0] != current or len(node.output) != 1:
            return None
        if int(_attr(node, "training_mode", 0)) != 0:
            return None
        params = [g.consts.value(name) for name in node.input[1:]]
        if any(p is None or p.dtype != np.float32 for p in params):
            return None
        vectors = [_channel_vector(p, channels) for p in params if p is not None]
        if any(v is None for v in vectors):
            return None
        gamma, beta, mean, var = (v for v in vectors if v is not None)
        scale = gamma / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))
        return scale, beta - mean * scale
    if node.op_type not in _AFFINE or len(node.input) != 2 or len(node.output) != 1:
        return None
    if node.input[0] == current:
        other = node.input[1]
    elif node.input[1] == current and node.op_type in ("Add", "Mul"):
        other = node.input[0]  # commutative: the constant may come first
    else:
        return None
    value = g.consts.value(other)
    if value is None or value.dtype != np.float32:
        return None
    vector = _channel_vector(value, channels, rank)
    if vector is None:
        return None
    ones, zeros = np.ones(channels), np.zeros(channels)
    if node.op_type == "Add":
        return ones, vector
    if node.op_type == "Sub":
        return ones, -vector
    if node.op_type == "Mul":
        return vector, zeros
    if np.any(vector == 0):
        return None
    return 1.0 / vector, zeros


def fold_into_convolutions(model: Any, excluded: Collection[str] = ()) -> list[Fold]:
    """Fold the chain of constant per-channel operators after each Conv and
    ConvTranspose of ``model`` (an ``onnx.ModelProto``, changed in place) into that
    convolution.  ``excluded``: tensors never read as constants (the weights the
    executor keeps in sync).  Returns the folds made."""
    g = _Graph(model, excluded)
    folds: list[Fold] = []
    for conv in list(g.graph.node):
        if conv.op_type not in _CONVS or len(conv.output) != 1 or id(conv) in g.dropped:
            continue
        params = g.conv_params(conv)
        if params is None:
            continue
        weight, bias, channels = params
        current, chain = conv.output[0], []
        scale, shift = np.ones(channels), np.zeros(channels)
        while True:
            node = g.only_reader(current)
            step = None if node is None else _affine_step(g, node, current, channels, weight.ndim)
            if step is None:
                break
            scale, shift = scale * step[0], shift * step[0] + step[1]
            chain.append(node)
            current = node.output[0]
        if not chain:
            continue
        g.set_params(
            conv, conv.input[0], _scale_output_channels(conv, weight, scale), bias * scale + shift
        )
        conv.output[0] = current
        g.dropped.update(id(node) for node in chain)
        folds.append(Fold(conv.name, tuple(n.name for n in chain), tuple(n.op_type for n in chain)))
    g.finish()
    return folds


def _pads_nothing(conv: Any) -> bool:
    auto = _attr(conv, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto not in ("NOTSET", "VALID"):
        return False
    return all(int(p) == 0 for p in _attr(conv, "pads", []))


def fold_scalars_before_convolutions(model: Any, excluded: Collection[str] = ()) -> list[Fold]:
    """Fold the chain of scalar ``Mul``/``Div`` (and, into a convolution that pads
    nothing, ``Add``/``Sub``) by constants that only feed one Conv into it.  Returns the
    folds made."""
    g = _Graph(model, excluded)
    producers = {out: node for node in g.graph.node for out in node.output}
    folds: list[Fold] = []
    for conv in list(g.graph.node):
        if conv.op_type != "Conv" or len(conv.output) != 1:
            continue
        params = g.conv_params(conv)
        if params is None:
            continue
        weight, bias, _ = params
        unpadded = _pads_nothing(conv)
        data, chain = conv.input[0], []
        scale, shift = 1.0, 0.0  # conv input = data' * scale + shift
        while True:
            node = producers.get(data)
            if node is None or node.op_type not in _AFFINE or len(node.input) != 2:
                break
            if g.only_reader(data) is None or id(node) in g.dropped:
                break
            values = [g.consts.value(name) for name in node.input]
            at = 1 if values[1] is not None else 0
            value = values[at]
            if value is None or value.dtype != np.float32 or value.size != 1:
                break
            if at == 0 and node.op_type in ("Sub", "Div"):
                break  # c - x, c / x: not affine in x that way
            c = float(value.reshape(-1)[0])
            if node.op_type in ("Mul", "Div"):
                if node.op_type == "Div" and c == 0.0:
                    break
                # walking up: input = scale * data + shift, data = factor * data'
                scale *= c if node.op_type == "Mul" else 1.0 / c
            else:
                if not unpadded:
                    break
                shift += scale * (c if node.op_type == "Add" else -c)
            chain.append(node)
            data = node.input[1 - at]
        if not chain:
            continue
        # Conv(x * s + t) = Conv(x, s * W) + t * (sum of W over its input window)
        sums = weight.reshape(weight.shape[0], -1).sum(axis=1)
        g.set_params(conv, data, weight * scale, bias + shift * sums)
        g.dropped.update(id(node) for node in chain)
        folds.append(Fold(conv.name, tuple(n.name for n in chain), tuple(n.op_type for n in chain)))
    g.finish()
    return folds


def fold_batch_norms(model: Any, excluded: Collection[str] = ()) -> list[Fold]:
    """Every constant fold of this module (after, then before the convolutions)."""
    return fold_into_convolutions(model, excluded) + fold_scalars_before_convolutions(
        model, excluded
    )


def _drop_unread(graph: Any, excluded: Collection[str]) -> None:
    """Remove the nodes and initializers nothing reads any more (a graph output is
    read); the excluded (synced) weights are left as they are."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {n for node in graph.node for n in node_reads(node)} | outputs
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
    read = {n for node in graph.node for n in node_reads(node)} | outputs
    inits = [i for i in graph.initializer if i.name in read or i.name in excluded]
    del graph.initializer[:]
    graph.initializer.extend(inits)
