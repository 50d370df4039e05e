"""CompiledModel: what the compiler hands the executor.

It is backend-neutral and holds no Paddle objects: an ONNX model plus the facts
the executor needs to feed it, fetch from it and keep its weights in sync with the
Paddle scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu._util import dtypes


@dataclass(frozen=True)
class IndexRange:
    """The values an integer feed may take because an operator indexes with it.

    Valid values are ``low <= v < high``, plus the single values in ``allowed``
    (an ``ignore_index`` or ``padding_idx`` outside that range).  ``use`` says
    which operator and operand, for the error message.  ``column``: the range holds
    only for ``feed[..., column]`` (an n-d index, whose last axis gives one
    coordinate per dimension indexed, as in gather_nd); ``None``: for every value.
    """

    low: int
    high: int
    use: str
    allowed: tuple[int, ...] = ()
    column: int | None = None

    def describe(self) -> str:
        extra = "".join(f" or {v}" for v in self.allowed)
        return f"[{self.low}, {self.high}){extra} ({self.use})"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output, for one micro-batch on one replica.

    ``name`` is the tensor's name in the ONNX graph; ``paddle_name`` is the name
    the user knows it by (the feed name, or the fetch name).  ``shape`` is fully
    static: a ``-1`` batch dimension has been set to ``micro_batch_size``.
    ``ranges``: for an integer feed that operators index with (labels, ids,
    gather indices), the ranges its values must lie in; every one must hold.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    paddle_name: str = ""
    ranges: tuple[IndexRange, ...] = ()

    @property
    def numpy_dtype(self) -> np.dtype:
        return dtypes.numpy_of(self.dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.numpy_dtype.itemsize


@dataclass(frozen=True)
class ShardSpec:
    """Where a node runs under manual sharding / pipelining (-1: not set)."""

    ipu_index: int = -1
    ipu_stage: int = -1


@dataclass
class CompiledModel:
    """The result of compiling one Paddle program for the IPU.

    Attributes:
        onnx: the serialized ONNX ModelProto of the forward graph.  Paddle
            parameters are initializers named after the parameters.
        inputs: the feeds, in feed order.
        outputs: the fetches, in fetch order.
        weights: ONNX initializer name -> Paddle variable name, for every
            parameter whose value the executor keeps in sync with the scope.
        micro_batch_size: the batch dimension the graph was compiled for.
        opset: the ONNX opset of ``onnx``.
        loss: the ONNX name of the loss output (training only).
        optimizer: the optimizer configuration (training only).
        shards: ONNX node name -> its ipu_index / ipu_stage, when set.
        source_ops: the Paddle operator names of the forward graph, for reports.
        node_ops: ONNX node name -> the index in ``source_ops`` of the Paddle
            operator it was converted from (for errors that name an operator).
        origin: the open graph (:class:`~paddle_ipu.compiler.open_shapes.OpenGraph`)
            this graph was made static from, when it was: the host backend runs every
            shape made from one open graph on one session of that graph.  Not part of
            what the model is (never compared, stored or shown).
    """

    onnx: bytes
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: dict[str, str] = field(default_factory=dict)
    micro_batch_size: int = 1
    opset: int = 0
    loss: str | None = None
    optimizer: Any = None
    shards: dict[str, ShardSpec] = field(default_factory=dict)
    source_ops: list[str] = field(default_factory=list)
    node_ops: dict[str, int] = field(default_factory=dict)
    origin: Any = field(default=None, compare=False, repr=False)

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name or spec.paddle_name == name:
                return spec
        raise KeyError(name)

    def output(self, name: str) -> TensorSpec:
        for spec in self.outputs:
            if spec.name == name or spec.paddle_name == name:
                return spec
        raise KeyError(name)

    def save_model_proto(self, path: str | Path) -> Path:
        """Write the ONNX model to ``path``; it opens in any ONNX tool."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(self.onnx)
        return out
