"""Will it fit: the memory a compiled model needs on each IPU, against the IPU's.

An IPU (GC200, Bow) has 900 MB of In-Processor Memory: 1,472 tiles of 624 KiB
(:data:`IPU_MEMORY` bytes).  The Poplar compile of a model that needs more on one IPU
fails; :func:`memory_report` says beforehand, per IPU of a replica (a virtual graph,
one pipeline stage or more), what its parts need:

computed exactly from the graph and the options (always-live):
    weights (float16 with ``enable_fp16``; none on chip when ``location_weight``
    puts them off chip; a replica's share with replicated tensor sharding), optimizer
    state (per the optimizer's state tensors and ``accl*_type``, where
    ``location_optimizer`` puts it: off chip with replicated tensor sharding by
    default, as Paddle 2.x's IpuStrategy sets it), gradient accumulators
    (``accumulation_factor`` > 1 or pipelining: one per weight, of the weight's type,
    where ``location_accumulator`` puts them), the input and output buffers;
computed exactly from the graph, not always live:
    the activations the backward pass reads (every float tensor the forward pass
    makes, on the IPU that makes it; with ``auto_recomputation`` Standard only the
    matmul and convolution results, NormOnly all but the normalisations', Pipeline
    and RecomputeAll only what enters a stage), times the pipeline stashes (PopART's
    ``2 * (stages to the end) + 1`` micro-batches for every stage but the last),
    the gradients at the end of the backward pass (``delay_var_updates``) when they
    are not accumulated, and for inference the largest set of activations live at
    once (liveness in graph order);
estimated (their rule in the report's lines):
    temporaries: the largest matmul or convolution's partials (float32, or float16
    with float16 partials) and a rearranged copy of its activation operands (Poplar
    lays a weight out for the operator that reads it), at most
    ``available_memory_proportion`` of the IPU (poplin's default 0.6 when 0), or the
    largest other operator's operands and result; the optimizer state of the largest
    weight when the state is streamed in for its update; code, vertex state and
    exchange buffers: :data:`CODE_PER_OPERATOR` bytes per operator (three operators
    per forward operator in training: forward, backward, update).

The host backend refuses, at compile time, a model with an IPU that does not fit
(``host_memory_check="error"``, the default; ``"warning"`` logs the report instead,
``"off"`` skips it), as the Poplar compile would fail.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from paddle_ipu.compiler.activations import (
    MATMULS,
    NORMS,
    Graph,
    cuts,
    itemsize,
    needed,
    numel,
    peak_live,
    segments,
    stage_inputs,
)
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import IpuMemoryError

log = logging.getLogger("paddle_ipu")

#: GC200 / Bow In-Processor Memory: 1,472 tiles x 624 KiB
TILES = 1472
TILE_MEMORY = 624 * 1024
IPU_MEMORY = TILES * TILE_MEMORY
#: poplin's availableMemoryProportion when the option is 0 (its default)
DEFAULT_AVAILABLE_MEMORY_PROPORTION = 0.6
#: code, vertex state and exchange buffers per operator of the graph (an estimate)
CODE_PER_OPERATOR = 128 * 1024

_RECOMPUTE = ("None", "Standard", "NormOnly", "Pipeline", "RecomputeAll")


@dataclass(frozen=True)
class Part:
    """One line of an IPU's memory: what, how many bytes, and how it was counted."""

    name: str
    bytes: int
    exact: bool
    how: str


@dataclass
class IpuMemory:
    """The memory of one IPU of a replica."""

    ipu: int
    stages: tuple[int, ...]
    parts: list[Part] = field(default_factory=list)
    capacity: int = IPU_MEMORY

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass
class MemoryReport:
    """:func:`memory_report`'s answer: one :class:`IpuMemory` per IPU of a replica."""

    ipus: list[IpuMemory]
    replicas: int
    training: bool
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(ipu.fits for ipu in self.ipus)

    def too_big(self) -> list[IpuMemory]:
        return [ipu for ipu in self.ipus if not ipu.fits]

    def text(self) -> str:
        """The report as the CLI prints it."""
        mode = "training" if self.training else "inference"
        lines = [
            f"memory per IPU ({mode}, {len(self.ipus)} IPU(s) per replica, "
            f"{self.replicas} replica(s); an IPU holds {_mb(IPU_MEMORY)}: "
            f"{TILES} tiles x {TILE_MEMORY // 1024} KiB)"
        ]
        for ipu in self.ipus:
            verdict = "fits" if ipu.fits else "DOES NOT FIT"
            stages = ", ".join(str(s) for s in ipu.stages)
            lines.append(
                f"IPU {ipu.ipu} (pipeline stage {stages}): {_mb(ipu.total)} of "
                f"{_mb(ipu.capacity)} ({100 * ipu.total / ipu.capacity:.0f} %): {verdict}"
            )
            for p in ipu.parts:
                kind = "exact" if p.exact else "estimate"
                lines.append(f"  {p.name:<28}{_mb(p.bytes):>12}  {kind}: {p.how}")
        lines.extend(self.notes)
        return "\n".join(lines)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# -- the options -----------------------------------------------------------------------
class _Options:
    """The option values the report reads (their defaults when absent)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        from paddle_ipu.options import OPTIONS, default_of

        self._values = values
        self._default = lambda name: default_of(OPTIONS[name])

    def __getitem__(self, name: str) -> Any:
        return self._values[name] if name in self._values else self._default(name)


def _location(options: _Options, name: str) -> dict[str, int]:
    value = options[name]
    return dict(value) if isinstance(value, Mapping) else {}


def _on_chip_bytes(
    nbytes: int, numel: int, location: Mapping[str, int], replicas: int
) -> tuple[int, str]:
    """What a tensor costs on chip, and why: off chip (streaming memory) costs nothing
    always-live; replicated tensor sharding keeps a replica's share."""
    off_min = int(location.get("min_elements_for_off_chip", 2))
    rts_min = int(location.get("min_elements_for_replicated_tensor_sharding", 8192))
    rts = bool(location.get("use_replicated_tensor_sharding", 0)) and replicas > 1
    if not location.get("on_chip", 1) and numel >= off_min:
        return 0, "off chip"
    if rts and numel >= rts_min:
        return -(-nbytes // replicas), f"sharded over {replicas} replicas"
    return nbytes, "on chip"


# -- the graph -------------------------------------------------------------------------
#: the node attributes of an operator's own hints that the report reads
_HINTS = frozenset({"__available_memory", "__serialize_matmul_factor"})


def _graph(model: CompiledModel) -> Graph:
    """The compiled graph with the static shapes shape inference gives its tensors."""
    from paddle_ipu.compiler.onnx_passes import constants_as_initializers
    from paddle_ipu.compiler.weights import split_weights

    proto, _ = split_weights(model.onnx, model.weights)
    # PopART's attributes (the shards are in model.shards) are not ONNX's: shape
    # inference sees the nodes without them; an operator's hints (_temporaries reads
    # them) are put back after
    hints: dict[str, list[onnx.AttributeProto]] = {}
    for node in proto.graph.node:
        keep = [a for a in node.attribute if not a.name.startswith("__")]
        if len(keep) != len(node.attribute):
            hints[node.name] = [a for a in node.attribute if a.name in _HINTS]
            del node.attribute[:]
            node.attribute.extend(keep)
    # as the compiler infers its outputs' shapes (onnx_passes.infer_outputs): constant
    # operands (Reshape targets, Slice bounds) read from initializers, and the
    # converter's value_info (which can hold shapes of its placeholder weights,
    # compile._placeholders) dropped
    constants_as_initializers(proto.graph)
    del proto.graph.value_info[:]
    for out in proto.graph.output:
        out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # operators shape inference does not know: what is declared
        inferred = proto
    g = inferred.graph
    for node in g.node:
        node.attribute.extend(hints.get(node.name, ()))
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for vi in (*g.input, *g.output, *g.value_info):
        t = vi.type.tensor_type
        types[vi.name] = t.elem_type
        dims = t.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    weights = {}
    for init in g.initializer:
        dims_ = tuple(int(d) for d in init.dims)
        shapes[init.name] = dims_
        types[init.name] = init.data_type
        if init.name in model.weights:
            weights[init.name] = (dims_, init.data_type)
    initializers = {i.name for i in g.initializer}
    return Graph(
        nodes=list(g.node),
        shapes=shapes,
        types=types,
        weights=weights,
        inputs=[i.name for i in g.input if i.name not in initializers],
        outputs=[o.name for o in g.output],
    )


# -- the report ------------------------------------------------------------------------
def memory_report(target: Any, options: Mapping[str, Any] | None = None) -> MemoryReport:
    """The memory a compiled model needs on each IPU of a replica.

    ``target``: a compiled ``IpuCompiledProgram`` (its model and strategy), or a
    :class:`CompiledModel` with ``options``, IpuStrategy option values by name (as
    ``IpuStrategy.values()`` gives them; an option left out has its default).
    ``options`` given with a program override its strategy's values."""
    if isinstance(target, CompiledModel):
        model, values = target, dict(options or {})
    elif getattr(target, "model", None) is not None and getattr(target, "strategy", None):
        model, values = target.model, {**target.strategy.values(), **(options or {})}
    else:
        raise TypeError(
            "memory_report takes a compiled IpuCompiledProgram (call compile first) or a "
            f"CompiledModel with option values; got {type(target).__name__}"
        )
    return _report(model, values)


def _report(model: CompiledModel, values: Mapping[str, Any]) -> MemoryReport:
    opts = _Options(values)
    g = _graph(model)
    training = bool(opts["is_training"]) and model.optimizer is not None
    fp16 = bool(opts["enable_fp16"])
    replicas = int(opts["replicated_graph_count"]) if opts["enable_replicated_graphs"] else 1
    if opts["enable_distribution"]:
        replicas = max(replicas, int(opts["global_replication_factor"]))
    af = int(opts["accumulation_factor"]) if opts["enable_gradient_accumulation"] else 1
    pipelining = bool(opts["enable_pipelining"])
    manual = int(opts["virtual_graph_mode"]) == 1 or bool(opts["enable_manual_shard"])
    recompute = _RECOMPUTE[int(opts["auto_recomputation"])] if training else "None"

    # weights fp16_black_list keeps float32 (those its operators read: float32_ops)
    wide: frozenset[str] = frozenset()
    if fp16 and not training and opts["fp16_black_list"]:
        from paddle_ipu.compiler.float32_ops import float32_nodes, read_by

        listed = float32_nodes(model.node_ops, model.source_ops, opts["fp16_black_list"])
        wide = read_by(g.nodes, listed) & frozenset(g.weights)
    ipu_of, stage_of = _placement(model, g, manual, pipelining)
    per_replica = max(1, int(opts["num_ipus"]) // max(1, replicas)) if manual else 1
    n_ipus = max([per_replica, *(i + 1 for i in ipu_of.values())])
    n_stages = max([1, *(s + 1 for s in stage_of.values())])
    first_use = _first_consumers(g)
    weight_ipu = {w: ipu_of.get(first_use.get(w, ""), 0) for w in g.weights}

    report = MemoryReport([], replicas, training)
    for ipu in range(n_ipus):
        nodes = [n for n in g.nodes if ipu_of.get(n.name, 0) == ipu]
        stages = tuple(sorted({stage_of.get(n.name, 0) for n in nodes})) or (0,)
        mem = IpuMemory(ipu, stages)
        mine = [w for w, i in weight_ipu.items() if i == ipu and w in model.weights]
        mem.parts.append(_weights_part(g, mine, fp16, opts, replicas, wide))
        mem.parts.append(_io_part(g, nodes, fp16))
        if training:
            mem.parts.extend(_training_parts(model, g, mine, fp16, opts, replicas, af, pipelining))
            mem.parts.extend(
                _kept_activations(g, nodes, stage_of, stages, n_stages, fp16, recompute, pipelining)
            )
        else:
            mem.parts.append(_live_activations(g, nodes, fp16))
        mem.parts.append(_temporaries(g, nodes, fp16, opts))
        count = len(nodes) * (3 if training else 1)
        mem.parts.append(
            Part(
                "code and exchange",
                count * CODE_PER_OPERATOR,
                False,
                f"{CODE_PER_OPERATOR // 1024} KiB per operator x {count} operators",
            )
        )
        report.ipus.append(mem)
    unknown = [o for n in g.nodes for o in n.output if o and o not in g.shapes]
    if unknown:
        report.notes.append(
            f"note: shape inference gave no static shape to {len(unknown)} of the graph's "
            f"{sum(len(n.output) for n in g.nodes)} results (such as {unknown[0]!r}): they "
            "are not counted"
        )
    if not manual and int(opts["num_ipus"]) // max(1, replicas) > 1:
        report.notes.append(
            "note: num_ipus is more than one IPU per replica, but without manual sharding "
            "the whole graph is on the first IPU of each replica"
        )
    return report


def _placement(
    model: CompiledModel, g: Graph, manual: bool, pipelining: bool
) -> tuple[dict[str, int], dict[str, int]]:
    """Node name -> its IPU and its pipeline stage (0 without sharding)."""
    ipu_of: dict[str, int] = {}
    stage_of: dict[str, int] = {}
    for node in g.nodes:
        spec = model.shards.get(node.name)
        ipu = spec.ipu_index if manual and spec is not None and spec.ipu_index >= 0 else 0
        stage = spec.ipu_stage if pipelining and spec is not None and spec.ipu_stage >= 0 else ipu
        ipu_of[node.name] = ipu
        stage_of[node.name] = stage if pipelining else 0
    return ipu_of, stage_of


def _first_consumers(g: Graph) -> dict[str, str]:
    first: dict[str, str] = {}
    for node in g.nodes:
        for name in node.input:
            first.setdefault(name, node.name)
    return first


def _weights_part(
    g: Graph,
    names: Sequence[str],
    fp16: bool,
    opts: _Options,
    replicas: int,
    wide: frozenset[str] = frozenset(),
) -> Part:
    """The weights; ``wide``: those an fp16 graph keeps float32 (fp16_black_list)."""
    location = _location(opts, "location_weight")
    total, where = 0, set()
    for name in names:
        shape, elem = g.weights[name]
        nbytes = numel(shape) * itemsize(elem, fp16 and name not in wide)
        cost, how = _on_chip_bytes(nbytes, numel(shape), location, replicas)
        total += cost
        where.add(how)
    dtype = "float16" if fp16 else "float32"
    kept = sum(1 for name in names if name in wide) if fp16 else 0
    if kept:
        dtype += f" ({kept} in float32: fp16_black_list)"
    return Part(
        "weights",
        total,
        True,
        f"{len(names)} tensors in {dtype}, {'/'.join(sorted(where)) or 'none'}",
    )


def _io_part(g: Graph, nodes: Sequence[onnx.NodeProto], fp16: bool) -> Part:
    used = {i for n in nodes for i in n.input} | {o for n in nodes for o in n.output}
    names = [n for n in (*g.inputs, *g.outputs) if n in used]
    total = sum(g.nbytes(n, fp16) for n in names)
    return Part("inputs and outputs", total, True, f"{len(names)} stream buffers, one micro-batch")


def _training_parts(
    model: CompiledModel,
    g: Graph,
    weights: Sequence[str],
    fp16: bool,
    opts: _Options,
    replicas: int,
    af: int,
    pipelining: bool,
) -> list[Part]:
    """Optimizer state, gradient accumulators, gradients."""
    from paddle_ipu.compiler.optimizer import STATE_PREFIXES, state_names

    config = model.optimizer
    parts: list[Part] = []
    entries = [e for e in state_names(config.type) if e.device_prefix.startswith("Accl")]
    sizes = []
    for entry in entries:
        kind = str(opts[STATE_PREFIXES[entry.device_prefix]]).upper()
        if entry.device_prefix == "Accl___" or kind not in ("FLOAT", "FLOAT16"):
            kind = "FLOAT16" if fp16 else "FLOAT"
        sizes.append(2 if kind == "FLOAT16" else 4)
    location = _location(opts, "location_optimizer")
    state_total, largest, where = 0, 0, set()
    for name in weights:
        count = numel(g.weights[name][0])
        nbytes = count * sum(sizes)
        cost, how = _on_chip_bytes(nbytes, count, location, replicas)
        state_total += cost
        where.add(how)
        if cost == 0:  # streamed in for the update: a replica's share with sharding
            rts = location.get("use_replicated_tensor_sharding", 0) and replicas > 1
            largest = max(largest, -(-nbytes // replicas) if rts else nbytes)
    kinds = ", ".join(f"{e.device_prefix.rstrip('_')} {8 * s}-bit"
                      for e, s in zip(entries, sizes)) or "none"  # fmt: skip
    parts.append(
        Part(
            "optimizer state",
            state_total,
            True,
            f"{config.type}: {kinds} per weight, {'/'.join(sorted(where)) or 'none'}",
        )
    )
    if largest:
        parts.append(
            Part(
                "optimizer state streamed in",
                largest,
                False,
                "the largest weight's state, loaded from streaming memory for its update",
            )
        )
    weight_bytes = sum(numel(g.weights[w][0]) * itemsize(g.weights[w][1], fp16) for w in weights)
    if af > 1 or pipelining:
        location = _location(opts, "location_accumulator")
        acc = 0
        for name in weights:
            shape, elem = g.weights[name]
            cost, _ = _on_chip_bytes(numel(shape) * itemsize(elem, fp16), numel(shape),
                                     location, replicas)  # fmt: skip
            acc += cost
        why = f"accumulation_factor {af}" if af > 1 else "pipelining"
        parts.append(Part("gradient accumulators", acc, True, f"one per weight ({why})"))
    else:
        parts.append(
            Part(
                "gradients",
                weight_bytes,
                True,
                "one per weight, live at the end of the backward pass (delay_var_updates)",
            )
        )
    return parts


def _kept_activations(
    g: Graph,
    nodes: Sequence[onnx.NodeProto],
    stage_of: Mapping[str, int],
    stages: Sequence[int],
    n_stages: int,
    fp16: bool,
    recompute: str,
    pipelining: bool,
) -> list[Part]:
    """Training: the activations of one micro-batch at work, and the pipeline
    stashes of the micro-batches in flight (see the module docstring)."""
    working, stashed, depths = 0, 0, []
    for stage in stages:
        mine = [n for n in nodes if stage_of.get(n.name, 0) == stage]
        need = needed(g, mine)
        depth = 2 * (n_stages - 1 - stage) + 1 if pipelining and stage < n_stages - 1 else 0
        depths.append(depth)
        forward = peak_live(g, mine, fp16)
        if recompute in ("None", "NormOnly"):
            if recompute == "NormOnly":
                normed = {o for n in mine if n.op_type in NORMS for o in n.output}
                need -= normed
            kept = sum(g.nbytes(t, fp16) for t in need)
            unit, work = kept, max(kept, forward)
        else:
            cut = cuts(g, mine)
            points = {t for t, _ in cut}
            between = max(
                [sum(g.nbytes(t, fp16) for t in needed(g, part)) for part in segments(mine, cut)]
                or [0]
            )
            at_cuts = sum(g.nbytes(t, fp16) for t in points)
            entering = sum(g.nbytes(t, fp16) for t in stage_inputs(g, mine))
            unit = at_cuts + entering if recompute == "Standard" else entering
            work = max(forward, at_cuts + entering + between)
        working = max(working, work)
        stashed += depth * unit
    rule = {
        "None": "what the backward pass reads (no recomputation)",
        "NormOnly": "what the backward pass reads but the normalisations' results "
        "(auto_recomputation NormOnly)",
        "Standard": "the values at the graph's cut points kept, the values between two "
        "recomputed (auto_recomputation Standard)",
        "Pipeline": "each stage recomputed from its stashed input, keeping the values at "
        "its cut points (auto_recomputation Pipeline)",
        "RecomputeAll": "recomputed from the stage's input, keeping the values at its "
        "cut points (auto_recomputation RecomputeAll)",
    }[recompute]
    parts = [Part("activations", working, True, f"one micro-batch at most: {rule}")]
    if pipelining:
        what = "stage inputs" if recompute in ("Pipeline", "RecomputeAll") else "kept values"
        parts.append(
            Part(
                "pipeline stashes",
                stashed,
                True,
                f"{'/'.join(str(d) for d in depths)} micro-batches of the {what} (PopART: "
                "2 x stages to the end + 1, the last stage none)",
            )
        )
    return parts


def _live_activations(g: Graph, nodes: Sequence[onnx.NodeProto], fp16: bool) -> Part:
    """Inference: the most activations live at once, in graph order."""
    return Part(
        "activations", peak_live(g, nodes, fp16), True, "the most live at once, in graph order"
    )


def _temporaries(g: Graph, nodes: Sequence[onnx.NodeProto], fp16: bool, opts: _Options) -> Part:
    proportion = float(opts["available_memory_proportion"]) or DEFAULT_AVAILABLE_MEMORY_PROPORTION
    half = str(opts["partials_type_matmuls"]).lower() == "half" and fp16
    largest = 0
    hinted = False
    for node in nodes:
        if node.op_type not in MATMULS:
            continue
        # an operator's own hints (op._set_attr, carried to PopART's node attributes):
        # its proportion replaces the session's; a serialised matmul computes 1/factor
        # of its result, and reads 1/factor of its operands, at a time
        hints = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        own = float(hints.get("__available_memory", 0.0) or 0.0)
        factor = max(1, int(hints.get("__serialize_matmul_factor", 1) or 1))
        hinted = hinted or bool(own) or factor > 1
        cap = int((own or proportion) * IPU_MEMORY)
        partials = sum(numel(g.shapes.get(o, ())) for o in node.output) * (2 if half else 4)
        # Poplar lays a weight out for the matmul/convolution that reads it
        # (createMatMulInputRHS, createWeights): only activations are rearranged.
        operands = sum(g.nbytes(i, fp16) for i in node.input if i and i not in g.weights)
        largest = max(largest, min(cap, (partials + operands) // factor))
    own_hints = (
        "; an operator's own __available_memory and serialize_factor where set" if hinted else ""
    )
    return Part(
        "temporaries",
        largest,
        False,
        f"the largest matmul/convolution's partials ({'float16' if half else 'float32'}) and a "
        f"copy of its activation operands, at most {proportion:g} of the IPU "
        f"(available_memory_proportion){own_hints}",
    )


def check(report: MemoryReport, mode: str) -> None:
    """Refuse (``"error"``) or log (``"warning"``) a report with an IPU that does not
    fit; ``"off"``: nothing."""
    if mode == "off" or report.fits:
        return
    names = ", ".join(str(i.ipu) for i in report.too_big())
    message = (
        f"the model does not fit in the memory of IPU {names} (of {len(report.ipus)} per "
        "replica): the Poplar compile would fail. Shard or pipeline it over more IPUs, use "
        "float16, recomputation, off-chip optimizer state or a smaller micro-batch; "
        'host_memory_check="warning" compiles it anyway.\n' + report.text()
    )
    if mode == "warning":
        log.warning("%s", message)
        return
    raise IpuMemoryError(message, report)
