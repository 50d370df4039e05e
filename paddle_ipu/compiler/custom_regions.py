"""Custom operators in the compiled ONNX graph (:mod:`.custom_ops` builds them).

A custom operator is a region of Paddle operators that compute its semantics.  The
compiler marks the region's nodes (:func:`mark`): every node gets ``__ipu_custom_op``
(the region), the Identity of the k-th operand ``__ipu_custom_in`` = k, the node of the
k-th result ``__ipu_custom_out`` = k, and the first result's node the PopART node the
region stands for (``__ipu_custom_spec``, JSON).  The marks are PopART-style
attributes: the host backend drops them with the others and runs the region's nodes;
:func:`fuse` (the popart backend) replaces each region with its one PopART node.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import onnx
from onnx import helper

from paddle_ipu.compiler.custom_ops import INPUT_ATTR, OUTPUT_ATTR, REGION_ATTR, SPEC_ATTR
from paddle_ipu.compiler.reader import OpInfo
from paddle_ipu.errors import CompileError

#: the position of the operand among the inputs of the node marked with INPUT_ATTR
INPUT_AT_ATTR = "__ipu_custom_in_at"
#: PopART's placement attributes, carried from a region onto its node
_PLACEMENT = ("__ipu_number", "__pipeline_stage")


def marked(node: onnx.NodeProto) -> bool:
    """Whether ``node`` belongs to a custom operator's region."""
    return any(a.name == REGION_ATTR for a in node.attribute)


def mark(graph: onnx.GraphProto, ops: Sequence[OpInfo], owner: dict[str, int]) -> None:
    """Put each custom-op operator's marks on the nodes converted from it: the region
    on all of them; an operand's mark (with the input position, ``__ipu_custom_in_at``)
    on the first node of its ``assign`` that reads the operand; the result's and the
    spec's on the last node of the ``assign`` that makes the result (the converter may
    spell an ``assign`` in several nodes)."""
    if not any(info.custom for info in ops):
        return
    by_op: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.node:
        idx = owner.get(node.name, -1)
        if idx < 0 or not ops[idx].custom:
            continue
        node.attribute.append(helper.make_attribute(REGION_ATTR, str(ops[idx].custom[REGION_ATTR])))
        by_op.setdefault(idx, []).append(node)
    for idx, nodes in by_op.items():
        custom = ops[idx].custom
        if INPUT_ATTR in custom:
            produced = {o for n in nodes for o in n.output}
            reads = [(n, pos) for n in nodes for pos, name in enumerate(n.input)
                     if name and name not in produced]  # fmt: skip
            if len({n.input[pos] for n, pos in reads}) != 1:
                raise CompileError(
                    f"custom op {custom[REGION_ATTR]}: operand {custom[INPUT_ATTR]} did not "
                    "convert to nodes reading one value"
                )
            node, pos = reads[0]
            node.attribute.append(helper.make_attribute(INPUT_ATTR, int(custom[INPUT_ATTR])))
            node.attribute.append(helper.make_attribute(INPUT_AT_ATTR, pos))
        if OUTPUT_ATTR in custom:
            nodes[-1].attribute.append(helper.make_attribute(OUTPUT_ATTR, int(custom[OUTPUT_ATTR])))
        if SPEC_ATTR in custom:
            nodes[-1].attribute.append(helper.make_attribute(SPEC_ATTR, str(custom[SPEC_ATTR])))


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def fuse(model: onnx.ModelProto) -> list[str]:
    """Replace every custom operator's region of ``model`` with its PopART node (in
    place), where the region's last node was; returns the regions fused, in graph
    order.  CompileError for a region whose marks are incomplete, or one of whose inner
    values is read outside it."""
    graph = model.graph
    nodes = list(graph.node)
    regions: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        attrs = _attrs(node)
        if REGION_ATTR in attrs:
            regions.setdefault(_text(attrs[REGION_ATTR]), []).append(i)
    if not regions:
        return []
    graph_outputs = {o.name for o in graph.output}
    replacement: dict[int, onnx.NodeProto] = {}
    members: set[int] = set()
    versions: dict[str, int] = {}
    for region, where in regions.items():
        ins: dict[int, str] = {}
        outs: dict[int, str] = {}
        spec: dict[str, Any] | None = None
        placement: list[onnx.AttributeProto] = []
        for i in where:
            attrs = _attrs(nodes[i])
            if INPUT_ATTR in attrs:
                ins[int(attrs[INPUT_ATTR])] = nodes[i].input[int(attrs[INPUT_AT_ATTR])]
            if OUTPUT_ATTR in attrs:
                outs[int(attrs[OUTPUT_ATTR])] = nodes[i].output[0]
            if SPEC_ATTR in attrs:
                spec = json.loads(_text(attrs[SPEC_ATTR]))
                placement = [a for a in nodes[i].attribute if a.name in _PLACEMENT]
        if spec is None or not outs or sorted(outs) != list(range(len(outs))):
            raise CompileError(f"custom op {region}: its result's node is missing from the graph")
        if sorted(ins) != list(range(len(ins))):
            raise CompileError(f"custom op {region}: an operand's node is missing from the graph")
        inside = set(where)
        produced = {o for i in where for o in nodes[i].output}
        results = set(outs.values())
        leaks = {
            name
            for j, n in enumerate(nodes)
            if j not in inside
            for name in n.input
            if name in produced and name not in results
        } | ((produced & graph_outputs) - results)
        if leaks:
            raise CompileError(
                f"custom op {region}: values computed inside it are read outside it "
                f"({sorted(leaks)}); only its results can be"
            )
        node = helper.make_node(
            spec["op_type"],
            [ins[k] for k in range(len(ins))],
            [outs[k] for k in range(len(outs))],
            name=region,
            domain=spec["domain"],
            **spec["attrs"],
        )
        node.attribute.extend(placement)
        members |= inside
        replacement[max(where)] = node
        versions.setdefault(node.domain, int(spec.get("version", 1)))
    keep = [
        replacement.get(i, n) for i, n in enumerate(nodes) if i in replacement or i not in members
    ]
    del graph.node[:]
    graph.node.extend(keep)
    known = {o.domain for o in model.opset_import}
    for domain, version in versions.items():
        if domain not in ("", "ai.onnx") and domain not in known:
            model.opset_import.append(helper.make_opsetid(domain, version))
    return list(regions)
