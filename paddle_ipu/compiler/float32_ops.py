"""Paddle operators kept in float32 in a float16 graph (``fp16_black_list``).

Mixed precision as Paddle AMP's black list and Paddle Inference's
``exp_disable_mixed_precision_ops`` give it: with ``enable_fp16`` the listed operators
compute in float32.  One rule for both backends, on the compiled graph:

- the ONNX nodes converted from a listed Paddle operator (the compiled model's
  ``node_ops``) compute in float32; the weights they read stay float32;
- a float16 value they read is widened exactly; a constant of the graph is held in
  float16 as every constant is;
- their results stay float32 for the listed operators and the graph outputs that read
  them, and are rounded to float16 (saturating) for every other reader.

The popart backend gets this from the fp16 conversion's node block list plus
:func:`join_float32` (the converter casts every blocked result to float16 and back,
and leaves a blocked graph output in float16); the host backend rounds as
:mod:`paddle_ipu.backends.host.fp16_graph` says.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from paddle_ipu.errors import NotSupportedError
from paddle_ipu.options.precision import op_key

log = logging.getLogger("paddle_ipu")


def float32_nodes(
    node_ops: dict[str, int], source_ops: Sequence[str], names: Collection[str]
) -> frozenset[str]:
    """The nodes converted from the Paddle operators ``names`` (keys of
    :func:`paddle_ipu.options.precision.op_key`).  A name no operator of the model
    has is said in the log, with the operators it has.

    Raises:
        NotSupportedError: ``names`` is not empty and the model has no map from its
            nodes to Paddle operators (a package written before there was one).
    """
    wanted = {op_key(n) for n in names}
    if not wanted:
        return frozenset()
    if not node_ops or not source_ops:
        raise NotSupportedError(
            f"fp16_black_list {sorted(wanted)}: this compiled model does not say which "
            "Paddle operator each node comes from (a package written by an earlier "
            "paddle-ipu, or a compile cache entry it wrote): compile the model again "
            "(`paddle-ipu cache clear` empties the compile cache)"
        )
    keys = [op_key(op) for op in source_ops]
    missing = sorted(wanted - set(keys))
    if missing:
        log.warning(
            "fp16_black_list: no operator %s in this model (it has %s)",
            ", ".join(repr(m) for m in missing),
            ", ".join(sorted(set(keys))),
        )
    return frozenset(
        node for node, index in node_ops.items() if 0 <= index < len(keys) and keys[index] in wanted
    )


def for_session(model: Any, config: Any) -> frozenset[str]:
    """The nodes of CompiledModel ``model`` that compute in float32 under a backend's
    SessionConfig ``config`` (its ``fp16_black_list``, with ``enable_fp16``).

    Raises:
        NotSupportedError: the list is set for training (the float16 training graphs
            round every operator; a listed one would need its gradient in float32
            too), or the model cannot say which nodes the list names.
    """
    names = list(config.option("fp16_black_list") or ())
    if not names or not config.enable_fp16:
        return frozenset()
    if config.is_training:
        raise NotSupportedError(
            f"fp16_black_list {names} in training is not supported: operators kept in "
            "float32 work in inference; train with every operator in float16 or in float32"
        )
    return float32_nodes(model.node_ops, model.source_ops, names)


def read_by(graph_nodes: Iterable[Any], nodes: Collection[str]) -> frozenset[str]:
    """The tensors the nodes named ``nodes`` among ``graph_nodes`` read."""
    return frozenset(name for node in graph_nodes if node.name in nodes for name in node.input)


def weights_read_by(proto: Any, nodes: Collection[str]) -> frozenset[str]:
    """The float32 initializers the nodes ``nodes`` of ``proto`` read."""
    from onnx import TensorProto

    if not nodes:
        return frozenset()
    floats = {i.name for i in proto.graph.initializer if i.data_type == TensorProto.FLOAT}
    return read_by(proto.graph.node, nodes) & floats


def join_float32(proto: Any, nodes: Collection[str]) -> None:
    """After onnxconverter-common's conversion with ``nodes`` blocked: a listed node's
    result goes to the listed nodes that read it and to a graph output in float32,
    as :mod:`this module <paddle_ipu.compiler.float32_ops>` says.  The converter casts
    each blocked result to float16 and, for a blocked reader, back to float32 (and
    removes the pair only for a tensor with one reader), and a graph output a blocked
    node makes is left in float16 against ``keep_io_types``.  In place."""
    from onnx import TensorProto

    graph = proto.graph
    listed = set(nodes)
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name: o for o in graph.output}
    dropped: set[int] = set()

    def cast_to(node: Any) -> int | None:
        if node.op_type != "Cast":
            return None
        return next((int(a.i) for a in node.attribute if a.name == "to"), None)

    for node in list(graph.node):
        if cast_to(node) != TensorProto.FLOAT16 or not node.input:
            continue
        source = producer.get(node.input[0])
        if source is None or source.name not in listed:
            continue
        wide, half = node.input[0], node.output[0]
        for reader in readers.get(half, []):
            if cast_to(reader) != TensorProto.FLOAT:
                continue
            back = reader.output[0]
            if all(r.name in listed for r in readers.get(back, [])):
                for r in readers.get(back, []):
                    r.input[:] = [wide if n == back else n for n in r.input]
                dropped.add(id(reader))
        if half in outputs:
            # the graph output, in float32 as keep_io_types keeps it
            source.output[:] = [half if n == wide else n for n in source.output]
            for r in readers.get(wide, []):
                r.input[:] = [half if n == wide else n for n in r.input]
            outputs[half].type.tensor_type.elem_type = TensorProto.FLOAT
            for vi in graph.value_info:
                if vi.name == half:
                    vi.type.tensor_type.elem_type = TensorProto.FLOAT
            dropped.add(id(node))
        elif all(id(r) in dropped for r in readers.get(half, [])):
            dropped.add(id(node))
    kept = [node for node in graph.node if id(node) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)


__all__ = ["float32_nodes", "for_session", "join_float32", "read_by", "weights_read_by"]
