"""IpuStrategy: the typed option registry that configures an IPU compile and run.

The option names, value types and defaults are those of Paddle 2.x's in-tree
``paddle.static.IpuStrategy`` (native options plus the PopART ``SessionOptions``
it passed through), so existing scripts keep working.  On top of that:

* every option is declared once in :data:`OPTIONS` with its type, default, range,
  documentation, PopART name and what the emulated (host) backend does with it;
* values are validated when they are set: a wrong type, a value out of range or an
  unknown name raises at once, naming the option and what would be valid;
* :meth:`IpuStrategy.set_options` is atomic: if any entry is rejected, none applies;
* cross-option rules that depend on the order of calls are checked by
  :meth:`IpuStrategy.validate`, which the compiler calls (and the helpers call too).

Value types use Paddle 2.x's names: ``bool``, ``uint64`` (non-negative int; PopART
enums are uint64 options whose value is the enum's index), ``double``, ``string``,
``vector`` (a list that setting extends), ``map`` (a dict that setting updates) and
``callable``.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import difflib
import importlib.util
import math
import numbers
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu.errors import (
    NotSupportedError,
    OptionError,
    OptionTypeError,
    UnknownOptionError,
)
from paddle_ipu.layout import check_everyn_period

__all__ = [
    "OPTIONS",
    "CustomOp",
    "HostSupport",
    "IpuStrategy",
    "OptionSpec",
    "OptionType",
]

OptionType = Literal["bool", "uint64", "double", "string", "vector", "map", "callable"]
HostSupport = Literal["honoured", "ignored", "unsupported"]

_UINT64_MAX = 2**64 - 1
# Limits of the APIs some options end in: ONNX Runtime's seed is an int64 and its thread
# count a C int; the serving worker waits with threading, which refuses longer waits.
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
_TIMEOUT_MAX_MS = float(threading.TIMEOUT_MAX) * 1000.0


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """The declaration of one IpuStrategy option.

    ``host`` says what the emulated IPU (the ``host`` backend) does with the option:
    ``"honoured"`` -- emulated faithfully; ``"ignored"`` -- accepted and ignored
    because it cannot change results (placement, memory, scheduling, compile
    caching, logging, precision hints the host exceeds); ``"unsupported"`` -- it
    would change results and cannot be emulated, so the host backend refuses a
    strategy in which it differs from its default (see
    :meth:`IpuStrategy.check_host_support`).
    """

    name: str
    type: OptionType
    default: Any
    doc: str
    group: str
    host: HostSupport
    popart_name: str | None = None
    enum: tuple[str, ...] | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    minimum_exclusive: bool = False
    nullable: bool = False
    host_note: str = ""


@dataclasses.dataclass(frozen=True)
class CustomOp:
    """A Paddle operator lowered to a PopART custom operator."""

    paddle_op: str
    popart_op: str
    domain: str = "custom.ops"
    version: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The op as the dict ``set_options({"custom_op": ...})`` accepts."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------

_SPECS: dict[str, OptionSpec] = {}


def _camel(snake: str) -> str:
    """PopART's spelling of a Paddle pass-through name (dots separate structs)."""
    parts = []
    for piece in snake.split("."):
        head, *rest = piece.split("_")
        parts.append(head + "".join(word[:1].upper() + word[1:] for word in rest))
    return ".".join(parts)


_POPART_SPELLING = {
    "num_io_tiles": "numIOTiles",
    "partials_type_matmuls": "partialsTypeMatMuls",
}


def _add(
    name: str,
    type_: OptionType,
    default: Any,
    host: HostSupport,
    doc: str,
    group: str,
    *,
    popart: bool = False,
    **extra: Any,
) -> None:
    popart_name = _POPART_SPELLING.get(name, _camel(name)) if popart else None
    _SPECS[name] = OptionSpec(
        name=name,
        type=type_,
        default=default,
        doc=doc,
        group=group,
        host=host,
        popart_name=extra.pop("popart_name", popart_name),
        **extra,
    )


_E, _U, _B = "popart.enum", "popart.uint64", "popart.bool"
_DOT_CHECKS = ("Fwd0", "Fwd1", "Bwd0", "PreAlias", "Final")
_LOCATION_KEYS = (
    "on_chip",
    "use_replicated_tensor_sharding",
    "use_io_tiles_to_load",
    "use_io_tiles_to_store",
    "min_elements_for_off_chip",
    "min_elements_for_replicated_tensor_sharding",
    "sharding_domain_with_all",
    "sharding_domain_with_consecutive",
    "sharding_domain_with_orthogonal",
)
_SHARDING_KEYS = _LOCATION_KEYS[-3:]
_LOCATION_DEFAULT = {
    "on_chip": 1,
    "use_replicated_tensor_sharding": 0,
    "use_io_tiles_to_load": 0,
    "use_io_tiles_to_store": 0,
    "min_elements_for_off_chip": 2,
    "min_elements_for_replicated_tensor_sharding": 8192,
    "sharding_domain_with_all": 0,
}

# The registry is a table: one declaration per option, kept compact on purpose.
# fmt: off

# --- native (Paddle) options ------------------------------------------------------
_N = "native"
_add("is_training", "bool", True, "honoured",
     "Build a training graph (False: inference).", _N)
_add("need_avg_shard", "bool", False, "ignored",
     "Spread ops evenly over the IPUs (a debugging aid for sharding).", _N,
     host_note="placement only")
_add("enable_fp16", "bool", False, "honoured",
     "Run the graph in float16 (weights and activations converted from float32).", _N)
_add("use_no_bias_optimizer", "bool", False, "unsupported",
     "Use PopART's AdamNoBias / LambNoBias (no bias correction) for adam, adamw, lamb.", _N,
     host_note="the host's optimizers follow Paddle's kernels, which correct the bias")
_add("enable_distribution", "bool", False, "unsupported",
     "Run as one instance of a multi-host (POD128/POD256) job through popdist.", _N,
     host_note="needs the other instances of the job")
_add("scaled_optimizer_state", "bool", False, "ignored",
     "Keep Adam/Lamb optimizer state scaled by the loss scaling (fp16 range).", _N,
     host_note="the update is the same in exact arithmetic")
_add("num_ipus", "uint64", 1, "honoured",
     "IPUs in total: replicas x IPUs per replica.", _N, minimum=1,
     host_note="checked against replication and shard indices")
_add("batches_per_step", "uint64", 1, "honoured",
     "Steps (batches) moved by one run; PopART's batchesPerStep.", _N, minimum=1)
_add("micro_batch_size", "uint64", 1, "honoured",
     "Batch size of one micro-batch; replaces a -1 batch dimension of the feeds.", _N,
     minimum=1)
_add("tiles_per_ipu", "uint64", 4, "ignored",
     "Tiles of each simulated IPU when POPLAR_IPUMODEL is set.", _N, minimum=1,
     host_note="no tiles to simulate")
_add("random_seed", "uint64", None, "honoured",
     "Seed of the device's random ops (dropout, random_*); None leaves it unset.", _N,
     nullable=True, maximum=_INT64_MAX)
_add("available_memory_proportion", "double", 0.0, "ignored",
     "Share of tile memory for matmul/conv temporaries, in [0, 1]; 0 keeps the default.",
     _N, minimum=0.0, maximum=1.0, host_note="memory planning only")
_add("loss_scaling", "double", 1.0, "ignored",
     "Static loss scaling: the loss is multiplied and the gradients divided by it.", _N,
     minimum=0.0, minimum_exclusive=True,
     host_note="the host computes gradients in float32, where the scaling cancels out; "
     "it is not applied")
_add("max_weight_norm", "double", 65504.0, "unsupported",
     "Upper bound of the weight norm in Lamb's trust ratio.", _N, minimum=0.0,
     host_note="the host's Lamb follows Paddle's kernel, which has no such bound")
_add("onnx_dump_path", "string", "", "honoured",
     "If not empty, write the lowered ONNX model to this path.", _N)
for _i in (1, 2, 3):
    _add(f"accl{_i}_type", "string", "FLOAT", "unsupported",
         f"Data type of the order-{_i} optimizer state: FLOAT or FLOAT16.", _N,
         choices=("FLOAT", "FLOAT16"), host_note="the host keeps optimizer state in float32")
_add("weight_decay_mode", "string", "", "unsupported",
     'Override how weight decay is applied: "decay" (decoupled), "l2_regularization", '
     'or "" (chosen from the optimizer).', _N, choices=("", "decay", "l2_regularization"),
     host_note="the host applies weight decay the way the program's optimizer does")
_add("runtime_options.enable_eval", "bool", False, "honoured",
     "Run a training graph without updating weights (lr and weight decay 0).", "runtime")
_add("lr", "double", 0.0, "honoured",
     "Learning rate set from dynamic mode (dy2static).", _N, minimum=0.0)
_add("is_dynamic", "bool", False, "honoured",
     "The program comes from dynamic mode (dy2static): lr is read from here.", _N)
_add("enable_model_runtime_executor", "bool", False, "honoured",
     "Serve inference through the model runtime (queues, auto-batching).", _N)
_add("num_buffers", "uint64", 10, "honoured",
     "Model runtime: micro-batches in flight before a submit blocks.", _N, minimum=1)
_add("timeout_ms", "double", 0.0, "honoured",
     "Model runtime: flush a partial micro-batch after this many ms; 0: no auto-batching.",
     _N, minimum=0.0, maximum=_TIMEOUT_MAX_MS)
_add("custom_ops", "vector", (), "unsupported",
     'Paddle ops lowered to PopART custom ops (add_custom_op, {"custom_op": {...}}).', _N,
     host_note="PopART custom ops exist only on the IPU")
_add("enable_manual_shard", "bool", False, "ignored",
     "Place ops on IPUs by ipu_index (virtual_graph_mode Manual); needs num_ipus > 1.", _N,
     host_note="placement only")
_add("enable_half_partial", "bool", False, "ignored",
     "Accumulate matmul and conv partials in float16 (sets partials_type_matmuls and "
     'convolution_options["partialsType"]).', _N,
     host_note="precision hint; the host accumulates in float32")
_add("compilation_progress_logger", "callable", None, "honoured",
     "Called as logger(progress, total) while compiling; None logs at debug level.", _N,
     popart_name="compilationProgressLogger")

# --- options of this product --------------------------------------------------------
_P = "product"
_add("backend", "string", "auto", "honoured",
     '"popart" (Poplar SDK), "host" (emulated IPU on the CPU) or "auto" (popart when '
     "the SDK is importable, else host).", _P, choices=("auto", "host", "popart"))
_add("host_num_threads", "uint64", 0, "honoured",
     "Threads of the host backend; 0 uses all cores.", _P, maximum=_INT32_MAX)
_add("anchor_return_type", "string", "ALL", "honoured",
     "What a run returns per fetch: ALL (every step), FINAL (last step), SUM (sum over "
     "steps) or EVERYN (every anchor_return_period-th step).", _P,
     choices=("ALL", "FINAL", "SUM", "EVERYN"))
_add("anchor_return_period", "uint64", 1, "honoured",
     "Return period N of EVERYN; must divide batches_per_step.", _P, minimum=1)

# --- PopART enum options (uint64 holding the enum's index) --------------------------
# name, members (index = value), default, host, doc, host note
_ENUMS: list[tuple[str, tuple[str, ...], int, HostSupport, str, str]] = [
    ("autodiff_settings.stitch_strategy",
     ("RecomputeMinimal", "RecomputeAllNonInputs", "AddFwdOutputs", "SafeAddFwdOutputs"),
     1, "ignored", "How autodiff stitches forward tensors into the backward graph.",
     "scheduling"),
    ("batch_serialization_settings.transform_context", ("Fwd", "Bwd"),
     0, "ignored", "When batch serialization is applied.", "memory/scheduling"),
    ("batch_serialization_settings.method", ("UnrollDynamic", "UnrollStatic", "Loop"),
     0, "ignored", "How batch serialization is applied.", "memory/scheduling"),
    ("batch_serialization_settings.batch_schedule",
     ("Scheduler", "Isomorphic", "OverlapOnIo", "OverlapOnCompute"),
     1, "ignored", "How the serialized batches are scheduled.", "scheduling"),
    ("auto_recomputation", ("None", "Standard", "NormOnly", "Pipeline", "RecomputeAll"),
     0, "ignored", "Recompute activations in the backward pass instead of storing them.",
     "memory only"),
    ("merge_var_update", ("None", "All", "AutoLoose", "AutoTight"),
     0, "ignored", "Merge weight-update ops into groups.", "scheduling"),
    ("virtual_graph_mode", ("Off", "Manual", "Auto", "ExecutionPhases"),
     0, "ignored", "How ops are placed on IPUs (enable_manual_shard sets Manual).",
     "placement only"),
    ("synthetic_data_mode", ("Off", "Zeros", "RandomNormal", "RandomUniform"),
     0, "unsupported", "Use synthetic on-device data instead of the feeds (benchmarking).",
     "the feeds would be replaced"),
    ("subgraph_copying_strategy", ("OnEnterAndExit", "JustInTime"),
     0, "ignored", "When subgraph inputs and outputs are copied.", "scheduling"),
    ("accumulation_and_replication_reduction_type", ("Sum", "Mean", "NoReduction"),
     1, "honoured", "How gradients are reduced over accumulation and replicas.",
     "NoReduction is unsupported"),
    ("mean_accumulation_and_replication_reduction_strategy", ("Running", "Post"),
     1, "ignored", "Mean reduction as a running mean, or one division at the end.",
     "the same mean up to rounding"),
]
for _name, _members, _enum_default, _host, _doc, _note in _ENUMS:
    _add(_name, "uint64", _enum_default, _host, f"{_doc} One of {', '.join(_members)}.", _E,
         popart=True, enum=_members, host_note=_note)

# --- PopART string options -----------------------------------------------------------
_S = "popart.string"
_add("log_dir", "string", "", "ignored",
     "Directory for PopART's log and report files.", _S, popart=True, host_note="logging")
_add("cache_path", "string", "session_cache", "ignored",
     "Directory of the engine cache (with enable_engine_caching).", _S, popart=True,
     host_note="compile caching")
_add("partials_type_matmuls", "string", "", "ignored",
     'Partials type of matmuls: "float", "half" or "" (PopART default).', _S, popart=True,
     choices=("", "float", "half"), host_note="precision hint; the host uses float32")
_add("custom_codelet_compile_flags", "string", "", "ignored",
     "Compiler flags for custom codelets.", _S, popart=True, host_note="IPU compile only")
_add("serialized_poprithms_shift_graphs_dir", "string", "", "ignored",
     "Directory to write the scheduler's graphs to.", _S, popart=True,
     host_note="debugging output")
_add("kahn_tie_breaker", "string", "greedy", "ignored",
     'Tie breaker of the initial Kahn schedule ("greedy", "fifo", ...).', _S, popart=True,
     host_note="scheduling")

# --- PopART uint64 options ----------------------------------------------------------
# name, default, host, doc, host note, minimum
_UINTS: list[tuple[str, int, HostSupport, str, str, int | None]] = [
    ("execution_phase_settings.phases", 0, "ignored",
     "Number of execution phases.", "placement/scheduling", None),
    ("execution_phase_settings.stages", 2, "ignored",
     "Stages per execution phase.", "placement/scheduling", None),
    ("batch_serialization_settings.factor", 0, "ignored",
     "Serialize the batch into this many parts (0: off).", "memory only", None),
    ("first_dot_op", 0, "ignored",
     "First op written to the .dot files.", "debugging output", None),
    ("final_dot_op", 10000, "ignored",
     "Last op written to the .dot files.", "debugging output", None),
    ("num_io_tiles", 0, "ignored",
     "Tiles reserved for IO.", "memory only", None),
    ("merge_var_update_mem_threshold", 1000000, "ignored",
     "Bytes per group of merge_var_update AutoTight/AutoLoose.", "scheduling", None),
    ("loose_threshold_at_peak", 8000, "ignored",
     "Liveness threshold of merge_var_update AutoLoose.", "scheduling", None),
    ("replicated_graph_count", 1, "honoured",
     "Model replicas (data parallel), when enable_replicated_graphs.", "", 1),
    ("accumulation_factor", 1, "honoured",
     "Micro-batches per weight update, when enable_gradient_accumulation.", "", 1),
    ("swap_limit_scheduler", 1000000000, "ignored",
     "Swap limit of the scheduler.", "scheduling", None),
    ("global_replication_factor", 1, "unsupported",
     "Replicas over all instances of a distributed job.",
     "needs the other instances of the job", 1),
    ("global_replica_offset", 0, "unsupported",
     "Index of this instance's first replica in a distributed job.",
     "needs the other instances of the job", None),
    ("default_prefetch_buffering_depth", 1, "ignored",
     "Prefetch buffering depth of input streams.", "IO only", 1),
    ("compilation_progress_total", 100, "ignored",
     "The total reported to compilation_progress_logger.", "progress reporting", None),
    ("transitive_closure_optimization_threshold", 100000, "ignored",
     "Op count above which the transitive-closure optimisation is skipped.",
     "compile time only", None),
]
for _name, _uint_default, _host, _doc, _note, _min in _UINTS:
    _add(_name, "uint64", _uint_default, _host, _doc, _U, popart=True, minimum=_min,
         host_note=_note)

# --- PopART bool options --------------------------------------------------------------
# name, default, host, doc, host note
_BOOLS: list[tuple[str, bool, HostSupport, str, str]] = [
    ("batch_serialization_settings.concat_on_virtual_graph_change", True, "ignored",
     "Concatenate serialized batches when the virtual graph changes.", "memory/scheduling"),
    ("batch_serialization_settings.concat_on_execution_phase_change", True, "ignored",
     "Concatenate serialized batches when the execution phase changes.",
     "memory/scheduling"),
    ("batch_serialization_settings.concat_on_pipeline_stage_change", True, "ignored",
     "Concatenate serialized batches when the pipeline stage changes.", "memory/scheduling"),
    ("strict_op_versions", True, "ignored",
     "Fail on ONNX ops of an unexpected version.", "IPU compile check"),
    ("opx_alias_checking", False, "ignored",
     "Check op aliasing while lowering.", "debugging"),
    ("opx_modify_checking", False, "ignored",
     "Check op modification while lowering.", "debugging"),
    ("dot_op_names", False, "ignored",
     "Write op names into the .dot files.", "debugging output"),
    ("export_poplar_computation_graph", False, "ignored",
     "Export the Poplar compute graph.", "debugging output"),
    ("export_poplar_vertex_graph", False, "ignored",
     "Export the Poplar vertex graph.", "debugging output"),
    ("separate_call_op_pdfs", True, "ignored",
     "Separate .dot/PDF files for called subgraphs.", "debugging output"),
    ("enable_outlining", True, "ignored",
     "Outline repeated code into shared subgraphs.", "code size only"),
    ("enable_outlining_copy_cost_pruning", True, "ignored",
     "Skip outlining where copies would cost more than they save.", "code size only"),
    ("rearrange_anchors_on_host", True, "ignored",
     "Rearrange fetched tensors on the host rather than the IPU.", "IO only"),
    ("enable_prefetch_datastreams", True, "ignored",
     "Prefetch input streams.", "IO only"),
    ("enable_non_stable_softmax", False, "ignored",
     "Faster softmax without subtracting the maximum.",
     "precision hint; the host always uses the stable form"),
    ("enable_replicated_graphs", False, "honoured",
     "Replicate the model replicated_graph_count times.", ""),
    ("enable_gradient_accumulation", False, "honoured",
     "Accumulate gradients over accumulation_factor micro-batches.", ""),
    ("instrument_with_hardware_cycle_counter", False, "ignored",
     "Count cycles on the device.", "profiling"),
    ("enable_pipelining", False, "honoured",
     "Pipeline the manual shards (needs enable_manual_shard).",
     "checked; results equal those of gradient accumulation"),
    ("disable_grad_accumulation_tensor_streams", False, "ignored",
     "Create no streams for the gradient accumulators.", "IO only"),
    ("compile_engine", True, "ignored",
     "Compile the Poplar engine (False: build the IR only).", "IPU compile only"),
    ("constant_weights", True, "ignored",
     "Inference: weights are constants of the graph.", "the same values"),
    ("enable_engine_caching", False, "ignored",
     "Cache compiled engines in cache_path.", "compile caching"),
    ("enable_merge_exchange", True, "ignored",
     "Merge host exchanges.", "IO only"),
    ("enable_floating_point_checks", False, "ignored",
     "Trap floating-point overflow, invalid operations and division by zero.",
     "the host does not trap; non-finite values propagate"),
    ("enable_stochastic_rounding", False, "unsupported",
     "Round float16 results stochastically.", "rounding mode; the host rounds to nearest"),
    ("explicit_recomputation", False, "ignored",
     "Recompute with explicit ops.", "memory only"),
    ("enable_explicit_main_loops", False, "ignored",
     "Use explicit main loops in the IR.", "scheduling"),
    ("use_host_copy_ops", False, "ignored",
     "Use explicit host copy ops in the IR.", "IO only"),
    ("alias_zero_copy", False, "ignored",
     "Avoid copies by aliasing.", "memory only"),
    ("delay_var_updates", True, "ignored",
     "Schedule weight updates late.", "scheduling"),
    ("enable_fully_connected_pass", True, "ignored",
     "Tell Poplar which matmuls are fully connected layers.", "planning"),
    ("enable_serialized_matmuls", True, "ignored",
     "Allow serialized matmuls.", "memory only"),
    ("enable_stable_norm", False, "ignored",
     "Numerically stable variance in norms.", "precision hint; the host uses float32"),
    ("decompose_grad_sum", False, "ignored",
     "Decompose gradient sums to save memory.", "memory only"),
    ("enable_distributed_replicated_graphs", False, "unsupported",
     "Replicate over the instances of a distributed job.",
     "needs the other instances of the job"),
    ("group_host_sync", False, "ignored",
     "Group host syncs.", "IO only"),
    ("automatic_loss_scaling_settings.enabled", False, "unsupported",
     "Adjust the loss scaling from gradient statistics while training.",
     "the loss scaling would follow device statistics"),
    ("enable_supported_data_type_casting", True, "ignored",
     "Cast unsupported data types (int64 -> int32) on the way in.",
     "the compiler already feeds int32"),
    ("group_norm_strided_channel_grouping", False, "unsupported",
     "Group the channels of group_norm with a stride (not ONNX's grouping).",
     "changes which channels are normalised together"),
    ("schedule_non_weight_update_gradient_consumers_early", False, "ignored",
     "Schedule gradient consumers that are not weight updates early.", "scheduling"),
    ("create_implicit_pipelining_fwd_only_program", False, "ignored",
     "Also build a forward-only program of a pipelined training graph.", "compile only"),
]
for _name, _bool_default, _host, _doc, _note in _BOOLS:
    _add(_name, "bool", _bool_default, _host, _doc, _B, popart=True, host_note=_note)

# --- PopART double options -----------------------------------------------------------
_D = "popart.double"
_add("outline_sequence_break_cost", "double", 10000.0, "ignored",
     "Outlining cost of breaking a sequence.", _D, popart=True, host_note="code size only")
_add("outline_threshold", "double", 1.0, "ignored",
     "Outlining threshold.", _D, popart=True, host_note="code size only")
_add("time_limit_scheduler", "double", 1e9, "ignored",
     "Time limit of the scheduler, in seconds.", _D, popart=True, minimum=0.0,
     host_note="scheduling")
_add("automatic_loss_scaling_settings.bin_edge_location", "double", 0.125, "ignored",
     "Automatic loss scaling: histogram bin edge, in [0, 1].", _D, popart=True,
     minimum=0.0, maximum=1.0, host_note="used only by automatic loss scaling")
_add("automatic_loss_scaling_settings.threshold_upper_count_proportion", "double", 1e-7,
     "ignored", "Automatic loss scaling: share of values allowed in the top bin, in [0, 1].",
     _D, popart=True, minimum=0.0, maximum=1.0,
     host_note="used only by automatic loss scaling")

# --- PopART string maps, vectors and structured settings ---------------------------
_M = "popart.map"
for _name, _doc in (
    ("engine_options", "Poplar engine options (str to str)."),
    ("report_options", "Poplar report options (str to str)."),
    ("convolution_options", "poplibs convolution options (str to str)."),
    ("lstm_options", "poplibs LSTM options (str to str)."),
    ("gcl_options", "Graphcore collectives options (str to str)."),
):
    _add(_name, "map", {}, "ignored", _doc + " Setting updates the map.", _M, popart=True,
         host_note="Poplar library tuning")
_add("replicated_collectives_settings", "map",
     {"prepare_schedule_for_merging_collectives": False, "merge_all_reduce_collectives": False},
     "ignored", "Merging of replicated collectives: the two flags, as bools.", _M,
     popart=True, host_note="scheduling")
_add("accumulate_outer_fragment", "map", {1: []}, "ignored",
     "{schedule: [excluded virtual graphs]}; schedule 0 Scheduler, 1 Serial, "
     "2 OverlapCycleOptimized, 3 OverlapMemoryOptimized.", _M,
     popart_name="accumulateOuterFragmentSettings", host_note="scheduling")

_V = "popart.vector"
_add("dot_checks", "vector", (), "ignored",
     f"IR stages written as .dot files: any of {', '.join(_DOT_CHECKS)}. Setting adds.", _V,
     popart=True, choices=_DOT_CHECKS, host_note="debugging output")
_add("hardware_instrumentations", "vector", (0,), "ignored",
     "Cycle-counter instrumentation points: 0 Outer, 1 Inner. Setting adds.", _V,
     popart=True, enum=("Outer", "Inner"), host_note="profiling")
_add("custom_codelets", "vector", (), "ignored",
     "Source files of custom codelets. Setting adds.", _V, popart=True,
     host_note="IPU compile only")

_L = "popart.location"
for _name, _popart, _what in (
    ("location_activation", "activationTensorLocationSettings", "activations and gradients"),
    ("location_weight", "weightTensorLocationSettings", "weights"),
    ("location_optimizer", "optimizerStateTensorLocationSettings", "optimizer state"),
    ("location_accumulator", "accumulatorTensorLocationSettings", "gradient accumulators"),
):
    _location = dict(_LOCATION_DEFAULT)
    if _name == "location_optimizer":
        # Paddle 2.x's constructor: optimizer state off-chip, replicated tensor sharding on.
        _location.update(on_chip=0, use_replicated_tensor_sharding=1)
    _add(_name, "map", _location, "ignored",
         f"Location of {_what}: a dict of location keys (see docs) to non-negative ints; "
         "flags are 0/1. Setting updates the given keys.", _L, popart_name=_popart,
         host_note="memory placement only")

# fmt: on

OPTIONS: Mapping[str, OptionSpec] = MappingProxyType(_SPECS)
"""Every option, by name: its type, default, range, documentation and host support."""

# Set by Paddle 2.x's constructor, so passed to PopART even though unchanged here.
_CONSTRUCTOR_SET = (
    "location_optimizer",
    "accumulation_and_replication_reduction_type",
    "mean_accumulation_and_replication_reduction_strategy",
)

# Options whose value lives in other options.
_DERIVED = ("enable_manual_shard", "enable_half_partial")

# Keys set_options accepts besides the option names.
_ALIASES = {"custom_op": "custom_ops"}

# PopART patterns that are off unless enabled (the rest default to on).
_PATTERNS_OFF_BY_DEFAULT = frozenset(
    {"LSTMOp", "Slice2SliceSubsample", "SplitGather", "TiedGather", "TiedGatherAccumulate"}
)

# Keys whose change does not require recompiling (as in Paddle 2.x).
_NO_RECOMPILE = frozenset({"lr"})


# ----------------------------------------------------------------------------------
# Validation of single values
# ----------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _type_error(name: str, expected: str, value: Any) -> OptionTypeError:
    return OptionTypeError(
        f"IpuStrategy option {name!r} expects {expected}, got {_describe(value)}"
    )


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _bound(value: float) -> str:
    # Integer bounds exactly (2**63 - 1 must not read as 9.22337e+18).
    return str(value) if isinstance(value, int) else f"{value:g}"


def _range_text(spec: OptionSpec, prefix: str = "") -> str:
    """The valid range of ``spec`` as text ("in [0, 1]", ">= 1"), or "" without one."""
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        opening = "(" if spec.minimum_exclusive else "["
        return f"{prefix}in {opening}{_bound(low)}, {_bound(high)}]"
    if low is not None:
        return f"{prefix}{'>' if spec.minimum_exclusive else '>='} {_bound(low)}"
    if high is not None:
        return f"{prefix}<= {_bound(high)}"
    return ""


def _check_range(spec: OptionSpec, value: float) -> None:
    low, high = spec.minimum, spec.maximum
    too_low = low is not None and (value <= low if spec.minimum_exclusive else value < low)
    if too_low or (high is not None and value > high):
        valid = _range_text(spec)
        if too_low and low is not None and high is not None:
            # Name the bound that was crossed first, then the whole range.
            valid = f"{'>' if spec.minimum_exclusive else '>='} {_bound(low)}, i.e. {valid}"
        raise OptionError(f"IpuStrategy option {spec.name!r} must be {valid}, got {value!r}")


def _to_uint(name: str, value: Any, *, what: str = "a non-negative int") -> int:
    if not _is_int(value):
        raise _type_error(name, what, value)
    number = int(value)
    if not 0 <= number <= _UINT64_MAX:
        raise OptionError(f"IpuStrategy option {name!r} expects {what}, got {number}")
    return number


def _coerce_uint64(spec: OptionSpec, value: Any) -> int | None:
    if value is None and spec.nullable:
        return None
    if spec.enum is not None:
        members = ", ".join(f"{i} ({m})" for i, m in enumerate(spec.enum))
        if isinstance(value, str):
            by_name = {m.lower(): i for i, m in enumerate(spec.enum)}
            if value.lower() not in by_name:
                raise OptionError(
                    f"IpuStrategy option {spec.name!r} has no member {value!r}; valid: {members}"
                )
            return by_name[value.lower()]
        number = _to_uint(spec.name, value, what=f"an enum index or name ({members})")
        if number >= len(spec.enum):
            raise OptionError(
                f"IpuStrategy option {spec.name!r} got {number}, out of range; valid: {members}"
            )
        return number
    what = "a non-negative int" + (" or None" if spec.nullable else "")
    number = _to_uint(spec.name, value, what=what)
    _check_range(spec, number)
    return number


def _coerce_double(spec: OptionSpec, value: Any) -> float:
    if not isinstance(value, numbers.Real) or _is_bool(value):
        raise _type_error(spec.name, "a float", value)
    number = float(value)
    if not math.isfinite(number):
        # No double option has a meaning for NaN or an infinity: an infinite timeout_ms
        # or lr would only fail later, inside a run or the serving worker.
        received = "NaN" if math.isnan(number) else repr(number)
        raise OptionError(
            f"IpuStrategy option {spec.name!r} expects a finite float"
            f"{_range_text(spec, prefix=' ')}, got {received}"
        )
    _check_range(spec, number)
    return number


def _coerce_string(spec: OptionSpec, value: Any) -> str:
    if not isinstance(value, str):
        raise _type_error(spec.name, "a str", value)
    if spec.choices is None:
        return value
    for choice in spec.choices:
        if value.lower() == choice.lower():
            return choice
    valid = ", ".join(repr(c) for c in spec.choices)
    raise OptionError(f"IpuStrategy option {spec.name!r} got {value!r}; valid: {valid}")


def _as_items(name: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise _type_error(name, "a list, tuple or set", value)
    return list(value)


def _as_mapping(name: str, value: Any) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise _type_error(name, "a dict", value)
    return value


def _map_string(name: str, key: Any, value: Any) -> tuple[str, str]:
    if not isinstance(key, str):
        raise _type_error(f"{name}[{key!r}]", "str keys", key)
    if _is_bool(value):
        return key, "true" if value else "false"
    if _is_int(value) or isinstance(value, str):
        return key, str(value)
    if isinstance(value, numbers.Real):
        return key, repr(float(value))
    raise _type_error(f"{name}[{key!r}]", "a str, int or bool value", value)


def _custom_op(value: Any) -> CustomOp:
    if isinstance(value, CustomOp):
        return value
    entry = _as_mapping("custom_op", value)
    unknown = set(entry) - {"paddle_op", "popart_op", "domain", "version"}
    if unknown:
        raise OptionError(
            f"custom_op keys must be paddle_op, popart_op, domain or version; got {sorted(unknown)}"
        )
    paddle_op = entry.get("paddle_op")
    if not isinstance(paddle_op, str) or not paddle_op:
        raise _type_error("custom_op['paddle_op']", "a non-empty str", paddle_op)
    popart_op = entry.get("popart_op") or paddle_op
    domain = entry.get("domain", "custom.ops")
    if not isinstance(popart_op, str):
        raise _type_error("custom_op['popart_op']", "a str", popart_op)
    if not isinstance(domain, str):
        raise _type_error("custom_op['domain']", "a str", domain)
    version = entry.get("version", 1)
    if not _is_int(version):
        raise _type_error("custom_op['version']", "an int", version)
    return CustomOp(paddle_op, popart_op, domain, int(version))


# ----------------------------------------------------------------------------------
# IpuStrategy
# ----------------------------------------------------------------------------------


class IpuStrategy:
    """How a Paddle program is compiled for, and run on, the IPU.

    The API of Paddle 2.x's ``paddle.static.IpuStrategy``::

        s = IpuStrategy()
        s.set_graph_config(num_ipus=2, is_training=True, micro_batch_size=8,
                           enable_manual_shard=True)
        s.set_pipelining_config(enable_pipelining=True, batches_per_step=4,
                                enable_gradient_accumulation=True, accumulation_factor=4)
        s.set_options({"enable_engine_caching": True, "cache_path": "./cache"})

    Every option is listed in :data:`OPTIONS` (and in docs/strategy.md).
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {
            name: list(spec.default) if spec.type == "vector" else _copy.deepcopy(spec.default)
            for name, spec in _SPECS.items()
            if name not in _DERIVED
        }
        # Names set explicitly (by the caller or by Paddle 2.x's constructor).
        self._explicit: set[str] = set(_CONSTRUCTOR_SET)
        self._patterns: dict[str, bool] = {}
        self.need_compile: bool = True

    # --- generic access -----------------------------------------------------------

    @staticmethod
    def get_all_option_names() -> list[str]:
        """Names of every option, sorted (``get_option`` accepts each)."""
        return sorted(_SPECS)

    @staticmethod
    def option_spec(name: str) -> OptionSpec:
        """The declaration of option ``name``: type, default, range, doc, host support."""
        return _SPECS[IpuStrategy._resolve(name)]

    @staticmethod
    def host_support(name: str) -> HostSupport:
        """What the host backend does with option ``name``.

        ``"honoured"`` (emulated), ``"ignored"`` (cannot change results) or
        ``"unsupported"`` (would change results; refused unless at its default).
        """
        return _SPECS[IpuStrategy._resolve(name)].host

    def get_option(self, name: str) -> dict[str, Any]:
        """``{"name", "type", "value"}`` of option ``name`` (the value is a copy)."""
        spec = _SPECS[self._resolve(name)]
        return {"name": spec.name, "type": spec.type, "value": self.get(spec.name)}

    def get(self, name: str) -> Any:
        """The value of option ``name`` (a copy, for lists and dicts)."""
        name = self._resolve(name)
        if name == "enable_manual_shard":
            return self._values["virtual_graph_mode"] == 1
        if name == "enable_half_partial":
            return self._values["partials_type_matmuls"] == "half"
        value = self._values[name]
        if name == "custom_ops":
            return [op.as_dict() for op in value]
        if name == "compilation_progress_logger":
            return value
        return _copy.deepcopy(value)

    def set_options(self, options: Mapping[str, Any]) -> None:
        """Set several options from a dict of name to value.

        The value's Python type selects how it is read, as in Paddle 2.x: ``bool``
        for bool options, ``int`` for uint64 options (and for PopART enums, whose
        member name is accepted too), ``float`` (or ``int``) for double options,
        ``str`` for string options, a list/tuple/set for vector options (added to
        the current ones), a dict for map and tensor-location options (updating the
        given keys), a callable for ``compilation_progress_logger``; ``None`` unsets
        ``random_seed``.  ``{"custom_op": {...}}`` adds a custom op.

        All entries are checked before any is applied: an unknown name raises
        :class:`UnknownOptionError` (with the closest valid names), a value of the
        wrong type :class:`OptionTypeError`, a value out of range
        :class:`OptionError`; the strategy is then unchanged.
        """
        if not isinstance(options, Mapping):
            raise _type_error("set_options", "a dict of option names to values", options)
        values = dict(self._values)
        for name in self._mutable_names():
            values[name] = _copy.deepcopy(self._values[name])
        explicit = set(self._explicit)
        for key, value in options.items():
            if not isinstance(key, str):
                raise _type_error("set_options", "str option names", key)
            name = _ALIASES.get(key, key)
            self._resolve(name)
            self._apply(values, explicit, key, name, value)
        self._values, self._explicit = values, explicit
        if set(options) - _NO_RECOMPILE:
            self.need_compile = True

    # --- the helpers of Paddle 2.x --------------------------------------------------

    def set_graph_config(
        self,
        num_ipus: int = 1,
        is_training: bool = True,
        micro_batch_size: int = 1,
        enable_manual_shard: bool = False,
    ) -> None:
        """Set the graph: IPU count, training or inference, micro-batch size, sharding.

        Args:
            num_ipus: IPUs in total (replicas x IPUs per replica).
            is_training: True builds a training graph, False an inference graph.
            micro_batch_size: batch size of one micro-batch; a -1 batch dimension
                of the feeds becomes this.
            enable_manual_shard: place ops on IPUs by their ``ipu_index``
                (``ipu_shard_guard``); sets PopART's virtual_graph_mode to Manual.
                Needs ``num_ipus > 1``.

        Raises:
            OptionError: manual sharding with one IPU, or a value out of range.
        """
        if enable_manual_shard and num_ipus == 1:
            raise OptionError(
                "enable_manual_shard=True needs num_ipus > 1 (got num_ipus=1): sharding "
                "places ops on different IPUs"
            )
        self.set_options(
            {
                "num_ipus": num_ipus,
                "is_training": is_training,
                "micro_batch_size": micro_batch_size,
                "enable_manual_shard": enable_manual_shard,
            }
        )

    def set_pipelining_config(
        self,
        enable_pipelining: bool = False,
        batches_per_step: int = 1,
        enable_gradient_accumulation: bool = False,
        accumulation_factor: int = 1,
    ) -> None:
        """Set pipelining, steps per run and gradient accumulation.

        Args:
            enable_pipelining: pipeline the manual shards (PopART enablePipelining).
                Needs ``enable_manual_shard`` (call :meth:`set_graph_config` first).
            batches_per_step: steps moved by one run (PopART batchesPerStep).
            enable_gradient_accumulation: accumulate gradients before each weight
                update (PopART enableGradientAccumulation).
            accumulation_factor: micro-batches per weight update (PopART
                accumulationFactor); above 1 it needs enable_gradient_accumulation.

        Raises:
            OptionError: pipelining without manual sharding, an accumulation factor
                above 1 without gradient accumulation, or a value out of range.
        """
        if enable_pipelining and not self.enable_manual_shard:
            raise OptionError(
                "enable_pipelining=True needs enable_manual_shard=True: call "
                "set_graph_config(num_ipus=..., enable_manual_shard=True) first"
            )
        if (
            _is_int(accumulation_factor)
            and accumulation_factor > 1
            and not enable_gradient_accumulation
        ):
            raise OptionError(
                f"accumulation_factor={accumulation_factor} needs enable_gradient_accumulation=True"
            )
        self.set_options(
            {
                "enable_pipelining": enable_pipelining,
                "batches_per_step": batches_per_step,
                "enable_gradient_accumulation": enable_gradient_accumulation,
                "accumulation_factor": accumulation_factor,
            }
        )

    def set_precision_config(self, enable_fp16: bool = False) -> None:
        """Run the graph in float16 (``enable_fp16``) or float32."""
        self.set_options({"enable_fp16": enable_fp16})

    # --- dynamic-to-static (Paddle 2.x) --------------------------------------------

    def set_optimizer(self, optimizer: Any) -> None:
        """Give the strategy a dygraph optimizer (Paddle 2.x's dy2static flow): its
        learning rate goes into the ``lr`` option and the optimizer is kept for
        :func:`paddle_ipu.training_model`.  As in 2.x, dygraph mode only."""
        import paddle

        if not paddle.in_dynamic_mode():
            raise OptionError(
                "set_optimizer() takes a dygraph optimizer and works in dynamic mode only "
                "(as in Paddle 2.x); a static program brings its optimizer ops with it"
            )
        self.set_options(self.parse_optimizer(optimizer))
        self._optimizer = optimizer

    @property
    def optimizer(self) -> Any:
        """The optimizer given to :meth:`set_optimizer` (None before)."""
        return getattr(self, "_optimizer", None)

    def parse_optimizer(self, optimizer: Any) -> dict[str, Any]:
        """The options Paddle 2.x read off a dygraph optimizer: ``{"lr": value}``
        (a scheduler's current value)."""
        from paddle.optimizer.lr import LRScheduler

        lr = paddle_api.optimizer_attr(optimizer, "learning_rate", None)
        if isinstance(lr, LRScheduler):
            return {"lr": float(lr())}
        if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
            return {"lr": float(lr)}
        raise OptionError(
            f"parse_optimizer: expected a paddle.optimizer.Optimizer with a float or "
            f"LRScheduler learning rate, received {type(optimizer).__name__} "
            f"(learning rate {lr!r})"
        )

    def register_patch(self) -> None:
        """Paddle 2.x's switch that made ``paddle.jit.to_static`` Layers compile for
        the IPU (see :mod:`paddle_ipu.dygraph`); :meth:`release_patch` undoes it."""
        from paddle_ipu.dygraph import register_patch

        register_patch(self)

    def release_patch(self) -> None:
        """Undo :meth:`register_patch`."""
        from paddle_ipu.dygraph import release_patch

        release_patch()

    def add_custom_op(
        self,
        paddle_op: str,
        popart_op: str | None = None,
        domain: str = "custom.ops",
        version: int = 1,
    ) -> None:
        """Lower the Paddle op ``paddle_op`` to the PopART custom op ``popart_op``.

        Args:
            paddle_op: the Paddle operator type.
            popart_op: the PopART operator; defaults to ``paddle_op``.
            domain: the PopART op's domain.
            version: the PopART op's version.
        """
        self.set_options(
            {
                "custom_op": {
                    "paddle_op": paddle_op,
                    "popart_op": paddle_op if popart_op is None else popart_op,
                    "domain": domain,
                    "version": version,
                }
            }
        )

    def set_anchor_config(self, return_type: str = "ALL", period: int = 1) -> None:
        """Choose what each run returns for every fetched tensor.

        Args:
            return_type: ``"ALL"`` (every step: shape ``[bps, af, rf, ...]`` without
                size-1 dims), ``"FINAL"`` (the last step), ``"SUM"`` (summed over
                the steps) or ``"EVERYN"`` (every ``period``-th step).
            period: the N of EVERYN; must divide batches_per_step.  Other return
                types take no period (leave it at 1).

        Raises:
            OptionError: an unknown return type, a period with a type other than
                EVERYN, or a period that does not divide batches_per_step.
        """
        canonical = _coerce_string(_SPECS["anchor_return_type"], return_type)
        if canonical != "EVERYN" and period != 1:
            raise OptionError(f"a return period applies only to EVERYN, not to {canonical}")
        candidate = self.copy()
        candidate.set_options({"anchor_return_type": canonical, "anchor_return_period": period})
        candidate._check_anchor()
        self._values, self._explicit = candidate._values, candidate._explicit
        self.need_compile = True

    # --- patterns -----------------------------------------------------------------

    def enable_pattern(self, pattern: str) -> None:
        """Enable the PopART graph pattern ``pattern``."""
        self._patterns[self._pattern_name(pattern)] = True
        self.need_compile = True

    def disable_pattern(self, pattern: str) -> None:
        """Disable the PopART graph pattern ``pattern``."""
        self._patterns[self._pattern_name(pattern)] = False
        self.need_compile = True

    def is_pattern_enabled(self, pattern: str) -> bool:
        """Whether PopART pattern ``pattern`` is on (set here, else PopART's default)."""
        name = self._pattern_name(pattern)
        if name in self._patterns:
            return self._patterns[name]
        return name not in _PATTERNS_OFF_BY_DEFAULT

    @property
    def patterns(self) -> dict[str, bool]:
        """Patterns enabled (True) or disabled (False) here, by name."""
        return dict(self._patterns)

    # --- cross-option checks --------------------------------------------------------

    def validate(self) -> None:
        """Check the rules that involve several options; the compiler calls this.

        Raises:
            OptionError: manual sharding with one IPU; pipelining without manual
                sharding; an accumulation factor above 1 without gradient
                accumulation; num_ipus not a multiple of the replica count; an
                EVERYN period that does not divide batches_per_step.
        """
        if self.enable_manual_shard and self.num_ipus == 1:
            raise OptionError("enable_manual_shard needs num_ipus > 1 (num_ipus is 1)")
        if self.enable_pipelining and not self.enable_manual_shard:
            raise OptionError(
                "enable_pipelining needs enable_manual_shard "
                "(set_graph_config(..., enable_manual_shard=True))"
            )
        af = self._values["accumulation_factor"]
        if af > 1 and not self.enable_gradient_accumulation:
            raise OptionError(
                f"accumulation_factor is {af} but enable_gradient_accumulation is False: "
                "enable gradient accumulation or set the factor to 1"
            )
        rf = self.replication_factor
        if rf > 1 and self.num_ipus % rf:
            raise OptionError(
                f"num_ipus ({self.num_ipus}) must be a multiple of replicated_graph_count ({rf})"
            )
        self._check_anchor()

    def _check_anchor(self) -> None:
        if self._values["anchor_return_type"] != "EVERYN":
            return
        check_everyn_period(
            self._values["anchor_return_period"], self.batches_per_step, "anchor_return_period"
        )

    # --- host backend support -------------------------------------------------------

    def unsupported_on_host(self) -> list[str]:
        """Options set to values the host backend cannot emulate, with the reason."""
        problems = []
        for name, spec in sorted(_SPECS.items()):
            value = self.get(name)
            default = spec.default
            if name == "custom_ops":
                default = []
            elif spec.type == "vector":
                default = list(default)
            if spec.host == "unsupported" and value != default:
                problems.append(f"{name}={value!r} ({spec.host_note})")
        if self._values["accumulation_and_replication_reduction_type"] == 2:
            problems.append(
                "accumulation_and_replication_reduction_type=2 (NoReduction: the host reduces "
                "gradients by Mean or Sum)"
            )
        return problems

    def check_host_support(self) -> None:
        """Raise :class:`NotSupportedError` if the host backend cannot run this strategy."""
        problems = self.unsupported_on_host()
        if problems:
            raise NotSupportedError(
                "the host backend cannot emulate these IpuStrategy settings (they would "
                "change results); reset them or use the popart backend: " + "; ".join(problems)
            )

    def resolved_backend(self) -> Literal["host", "popart"]:
        """The backend ``backend`` selects: "auto" is popart when importable, else host."""
        choice = self._values["backend"]
        if choice == "host":
            return "host"
        if choice == "popart":
            return "popart"
        try:
            found = importlib.util.find_spec("popart") is not None
        except (ImportError, ValueError):
            found = False
        return "popart" if found else "host"

    # --- typed accessors for the compiler and executor ---------------------------

    @property
    def num_ipus(self) -> int:
        """IPUs in total."""
        return int(self._values["num_ipus"])

    @property
    def is_training(self) -> bool:
        """True for a training graph."""
        return bool(self._values["is_training"])

    @property
    def enable_pipelining(self) -> bool:
        """Whether the shards are pipelined."""
        return bool(self._values["enable_pipelining"])

    @property
    def enable_fp16(self) -> bool:
        """Whether the graph runs in float16."""
        return bool(self._values["enable_fp16"])

    @property
    def enable_manual_shard(self) -> bool:
        """Whether ops are placed by ipu_index (virtual_graph_mode is Manual)."""
        return bool(self._values["virtual_graph_mode"] == 1)

    @property
    def enable_gradient_accumulation(self) -> bool:
        """Whether gradients are accumulated before each weight update."""
        return bool(self._values["enable_gradient_accumulation"])

    @property
    def accumulation_factor(self) -> int:
        """Micro-batches per weight update: accumulation_factor, or 1 when accumulation is off."""
        if not self.enable_gradient_accumulation:
            return 1
        return int(self._values["accumulation_factor"])

    @property
    def replication_factor(self) -> int:
        """Replicas: replicated_graph_count, or 1 when replication is off."""
        if not self._values["enable_replicated_graphs"]:
            return 1
        return int(self._values["replicated_graph_count"])

    @property
    def batches_per_step(self) -> int:
        """Steps moved by one run."""
        return int(self._values["batches_per_step"])

    @property
    def micro_batch_size(self) -> int:
        """Batch size of one micro-batch."""
        return int(self._values["micro_batch_size"])

    @property
    def gradient_reduction(self) -> Literal["mean", "sum"]:
        """How gradients are reduced over accumulation and replicas: "mean" or "sum".

        Raises:
            NotSupportedError: the reduction type is NoReduction.
        """
        kind = self._values["accumulation_and_replication_reduction_type"]
        if kind == 0:
            return "sum"
        if kind == 1:
            return "mean"
        raise NotSupportedError(
            "accumulation_and_replication_reduction_type NoReduction is not supported"
        )

    @property
    def anchor_return_type(self) -> str:
        """ALL, FINAL, SUM or EVERYN."""
        return str(self._values["anchor_return_type"])

    @property
    def anchor_return_period(self) -> int:
        """The N of EVERYN."""
        return int(self._values["anchor_return_period"])

    @property
    def random_seed(self) -> int | None:
        """The device random seed, or None when unset."""
        seed = self._values["random_seed"]
        return None if seed is None else int(seed)

    @property
    def custom_ops(self) -> tuple[CustomOp, ...]:
        """The custom ops added, in order."""
        return tuple(self._values["custom_ops"])

    @property
    def has_custom_ops(self) -> bool:
        """Whether any custom op was added (Paddle 2.x attribute)."""
        return bool(self._values["custom_ops"])

    @property
    def custom_op_names(self) -> list[str]:
        """Paddle op types of the custom ops (Paddle 2.x attribute)."""
        return [op.paddle_op for op in self._values["custom_ops"]]

    def popart_options(self, include_defaults: bool = False) -> dict[str, Any]:
        """PopART ``SessionOptions`` to apply, by PopART's name.

        Names are PopART's camelCase attributes; nested settings are dotted
        (``"batchSerializationSettings.factor"``).  Enums are given as their index
        (:attr:`OptionSpec.enum` names them).  Tensor locations are dicts of
        ``location.storage`` ("OnChip"/"OffChip"), ``location.replicatedTensorSharding``
        ("On"/"Off"), ``location.loadTileSet`` / ``location.storageTileSet``
        ("IO"/"Compute"), ``location.shardingDomain`` ({"type", "size"}),
        ``minElementsForOffChip`` and ``minElementsForReplicatedTensorSharding``.
        ``accumulateOuterFragmentSettings`` is ``{"schedule", "excludedVirtualGraphs"}``.

        Args:
            include_defaults: also return options left at their defaults (by
                default only options set here, or by Paddle 2.x's constructor).
        """
        result: dict[str, Any] = {}
        for name, spec in sorted(_SPECS.items()):
            if spec.popart_name is None or name in _DERIVED:
                continue
            if not include_defaults and name not in self._explicit:
                continue
            value = self._values[name]
            if name == "compilation_progress_logger" and value is None:
                continue
            if spec.group == "popart.location":
                value = _popart_location(value)
            elif name == "accumulate_outer_fragment":
                ((schedule, excluded),) = value.items()
                value = {"schedule": schedule, "excludedVirtualGraphs": list(excluded)}
            elif name == "replicated_collectives_settings":
                value = {_camel(k): v for k, v in value.items()}
            elif name != "compilation_progress_logger":
                value = _copy.deepcopy(value)
            result[spec.popart_name] = value
        return result

    def changed_options(self) -> dict[str, Any]:
        """Options whose value differs from the default, by name."""
        changed = {}
        for name, spec in sorted(_SPECS.items()):
            value = self.get(name)
            default: Any = spec.default
            if name == "custom_ops":
                default = []
            elif spec.type == "vector":
                default = list(default)
            if value != default:
                changed[name] = value
        return changed

    # --- object protocol ----------------------------------------------------------

    def copy(self) -> IpuStrategy:
        """An independent copy (the progress logger callable is shared)."""
        clone = type(self).__new__(type(self))
        clone._values = dict(self._values)
        for name in self._mutable_names():
            clone._values[name] = _copy.deepcopy(self._values[name])
        clone._explicit = set(self._explicit)
        clone._patterns = dict(self._patterns)
        clone.need_compile = self.need_compile
        if hasattr(self, "_optimizer"):
            clone._optimizer = self._optimizer
        return clone

    def __copy__(self) -> IpuStrategy:
        return self.copy()

    def __repr__(self) -> str:
        head = (
            f"num_ipus={self.num_ipus}, is_training={self.is_training}, "
            f"micro_batch_size={self.micro_batch_size}, "
            f"batches_per_step={self.batches_per_step}, "
            f"backend={self._values['backend']!r}"
        )
        shown = {"num_ipus", "is_training", "micro_batch_size", "batches_per_step", "backend"}
        rest = ", ".join(
            f"{name}={value!r}"
            for name, value in self.changed_options().items()
            if name not in shown
        )
        patterns = f", patterns={self._patterns!r}" if self._patterns else ""
        return f"IpuStrategy({head}{', ' + rest if rest else ''}{patterns})"

    # --- internals ----------------------------------------------------------------

    @staticmethod
    def _resolve(name: str) -> str:
        if not isinstance(name, str):
            raise _type_error("option name", "a str", name)
        if name in _SPECS:
            return name
        names = list(_SPECS) + list(_ALIASES)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        # A name given without its struct prefix (stitch_strategy) is close too.
        close += [n for n in _SPECS if n.rsplit(".", 1)[-1] == name and n not in close]
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownOptionError(
            f"unknown IpuStrategy option {name!r}{hint} "
            "(IpuStrategy.get_all_option_names() lists them all)"
        )

    @staticmethod
    def _pattern_name(pattern: Any) -> str:
        if not isinstance(pattern, str) or not pattern:
            raise _type_error("pattern", "a non-empty str (a PopART pattern name)", pattern)
        return pattern

    @staticmethod
    def _mutable_names() -> list[str]:
        return [n for n, s in _SPECS.items() if s.type in ("vector", "map") and n not in _DERIVED]

    @staticmethod
    def _apply(values: dict[str, Any], explicit: set[str], key: str, name: str, value: Any) -> None:
        spec = _SPECS[name]
        if spec.type == "bool":
            if not _is_bool(value):
                raise _type_error(name, "a bool", value)
            flag = bool(value)
            if name == "enable_manual_shard":
                values["virtual_graph_mode"] = 1 if flag else 0
                explicit.add("virtual_graph_mode")
                return
            if name == "enable_half_partial":
                partials = "half" if flag else "float"
                values["partials_type_matmuls"] = partials
                values["convolution_options"]["partialsType"] = partials
                explicit.update(("partials_type_matmuls", "convolution_options"))
                return
            values[name] = flag
        elif spec.type == "uint64":
            values[name] = _coerce_uint64(spec, value)
        elif spec.type == "double":
            values[name] = _coerce_double(spec, value)
        elif spec.type == "string":
            values[name] = _coerce_string(spec, value)
        elif spec.type == "callable":
            if value is not None and not callable(value):
                raise _type_error(name, "a callable logger(progress, total) or None", value)
            values[name] = value
        elif spec.type == "vector":
            IpuStrategy._apply_vector(values, key, name, value)
        else:
            IpuStrategy._apply_map(values, name, value)
        explicit.add(name)

    @staticmethod
    def _apply_vector(values: dict[str, Any], key: str, name: str, value: Any) -> None:
        spec = _SPECS[name]
        if name == "custom_ops":
            entries = [value] if key == "custom_op" else _as_items(name, value)
            values[name] = [*values[name], *(_custom_op(entry) for entry in entries)]
            return
        items = _as_items(name, value)
        if name == "dot_checks":
            for item in items:
                if item not in _DOT_CHECKS:
                    valid = ", ".join(_DOT_CHECKS)
                    raise OptionError(f"unknown dot check {item!r} in 'dot_checks'; valid: {valid}")
            values[name] = sorted(set(values[name]) | set(items))
        elif name == "hardware_instrumentations":
            numbers_ = []
            for item in items:
                if isinstance(item, str) and item.isdigit():
                    item = int(item)
                numbers_.append(_coerce_uint64(spec, item))
            values[name] = sorted(set(values[name]) | set(numbers_))
        else:
            for item in items:
                if not isinstance(item, str):
                    raise _type_error(name, "a list of str", item)
            values[name] = [*values[name], *items]

    @staticmethod
    def _apply_map(values: dict[str, Any], name: str, value: Any) -> None:
        entries = _as_mapping(name, value)
        current = values[name]
        if _SPECS[name].group == "popart.location":
            for key, item in entries.items():
                if key not in _LOCATION_KEYS:
                    close = difflib.get_close_matches(str(key), _LOCATION_KEYS, n=2)
                    hint = f"; did you mean {', '.join(close)}?" if close else ""
                    raise UnknownOptionError(
                        f"unknown key {key!r} of tensor location {name!r}{hint} "
                        f"(valid: {', '.join(_LOCATION_KEYS)})"
                    )
                number = int(item) if _is_bool(item) else _to_uint(f"{name}[{key!r}]", item)
                if key in _SHARDING_KEYS:
                    for other in _SHARDING_KEYS:
                        current.pop(other, None)
                current[key] = number
        elif name == "replicated_collectives_settings":
            for key, item in entries.items():
                if key not in current:
                    raise UnknownOptionError(
                        f"unknown key {key!r} of 'replicated_collectives_settings' "
                        f"(valid: {', '.join(current)})"
                    )
                if not _is_bool(item):
                    raise _type_error(f"{name}[{key!r}]", "a bool", item)
                current[key] = bool(item)
        elif name == "accumulate_outer_fragment":
            for schedule, excluded in entries.items():
                number = _to_uint(f"{name} schedule", schedule)
                if number > 3:
                    raise OptionError(
                        f"accumulate_outer_fragment schedule must be 0..3, got {number}"
                    )
                graphs = [_to_uint(f"{name}[{number}]", g) for g in _as_items(name, excluded)]
                values[name] = {number: graphs}
        else:
            for key, item in entries.items():
                map_key, map_value = _map_string(name, key, item)
                current[map_key] = map_value


def _popart_location(location: Mapping[str, int]) -> dict[str, Any]:
    sharding = next(k for k in _SHARDING_KEYS if k in location)
    return {
        "location.storage": "OnChip" if location["on_chip"] else "OffChip",
        "location.replicatedTensorSharding": (
            "On" if location["use_replicated_tensor_sharding"] else "Off"
        ),
        "location.loadTileSet": "IO" if location["use_io_tiles_to_load"] else "Compute",
        "location.storageTileSet": "IO" if location["use_io_tiles_to_store"] else "Compute",
        "location.shardingDomain": {
            "type": sharding.rsplit("_", 1)[-1].capitalize(),
            "size": location[sharding],
        },
        "minElementsForOffChip": location["min_elements_for_off_chip"],
        "minElementsForReplicatedTensorSharding": location[
            "min_elements_for_replicated_tensor_sharding"
        ],
    }
