"""The declaration of every IpuStrategy option (one ``_add`` per option).

Groups follow Paddle 2.x: its native options, then the PopART ``SessionOptions`` it
passed through, by value type (``passthrough``: the popart backend hands them to the
SDK; :mod:`paddle_ipu.backends.popart.options` spells them in PopART's names).  The few
options whose values are not plain bring their own readers, defined here beside them.
"""

from __future__ import annotations

import difflib
from typing import Any

from paddle_ipu.errors import OptionError, UnknownOptionError
from paddle_ipu.options.spec import (
    INT32_MAX,
    INT64_MAX,
    TIMEOUT_MAX_MS,
    CustomOp,
    Derived,
    OptionSpec,
    OptionType,
    as_items,
    as_mapping,
    coerce_uint64,
    declare,
    is_bool,
    is_int,
    to_uint,
    type_error,
)

NATIVE = "native"
RUNTIME = "runtime"
PRODUCT = "product"
ENUM, STRING, UINT64, BOOL = "popart.enum", "popart.string", "popart.uint64", "popart.bool"
DOUBLE, MAP, VECTOR, LOCATION = "popart.double", "popart.map", "popart.vector", "popart.location"

DOT_CHECKS = ("Fwd0", "Fwd1", "Bwd0", "PreAlias", "Final")
#: the keys of a tensor location (Paddle 2.x's names)
LOCATION_KEYS = (
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
#: one of these three is set at a time
SHARDING_KEYS = LOCATION_KEYS[-3:]
LOCATION_DEFAULT: dict[str, int] = {
    "on_chip": 1,
    "use_replicated_tensor_sharding": 0,
    "use_io_tiles_to_load": 0,
    "use_io_tiles_to_store": 0,
    "min_elements_for_off_chip": 2,
    "min_elements_for_replicated_tensor_sharding": 8192,
    "sharding_domain_with_all": 0,
}

# Paddle 2.x's constructor put optimizer state off-chip, with replicated tensor sharding.
OPTIMIZER_LOCATION_DEFAULT = {**LOCATION_DEFAULT, "on_chip": 0, "use_replicated_tensor_sharding": 1}

COLLECTIVES_DEFAULT = {
    "prepare_schedule_for_merging_collectives": False,
    "merge_all_reduce_collectives": False,
}


def _add(name: str, type_: OptionType, default: Any, group: str, *, doc: str, **extra: Any) -> None:
    extra.setdefault("passthrough", group.startswith("popart."))
    declare(OptionSpec(name=name, type=type_, default=default, doc=doc, group=group, **extra))


# --- options whose values are not plain ----------------------------------------------


def _custom_ops(spec: OptionSpec, current: Any, value: Any, key: str) -> list[CustomOp]:
    entries = [value] if key == "custom_op" else as_items(spec.name, value)
    return [*current, *(_custom_op(entry) for entry in entries)]


def _custom_op(value: Any) -> CustomOp:
    if isinstance(value, CustomOp):
        return value
    entry = as_mapping("custom_op", value)
    unknown = set(entry) - {"paddle_op", "popart_op", "domain", "version"}
    if unknown:
        raise OptionError(
            f"custom_op keys must be paddle_op, popart_op, domain or version; got {sorted(unknown)}"
        )
    paddle_op = entry.get("paddle_op")
    if not isinstance(paddle_op, str) or not paddle_op:
        raise type_error("custom_op['paddle_op']", "a non-empty str", paddle_op)
    popart_op = entry.get("popart_op") or paddle_op
    domain = entry.get("domain", "custom.ops")
    if not isinstance(popart_op, str):
        raise type_error("custom_op['popart_op']", "a str", popart_op)
    if not isinstance(domain, str):
        raise type_error("custom_op['domain']", "a str", domain)
    version = entry.get("version", 1)
    if not is_int(version):
        raise type_error("custom_op['version']", "an int", version)
    return CustomOp(paddle_op, popart_op, domain, int(version))


def _dot_checks(spec: OptionSpec, current: Any, value: Any, key: str) -> list[str]:
    items = as_items(spec.name, value)
    for item in items:
        if item not in DOT_CHECKS:
            valid = ", ".join(DOT_CHECKS)
            raise OptionError(f"unknown dot check {item!r} in 'dot_checks'; valid: {valid}")
    return sorted(set(current) | set(items))


def _instrumentations(spec: OptionSpec, current: Any, value: Any, key: str) -> list[int]:
    numbers_: list[int] = []
    for item in as_items(spec.name, value):
        if isinstance(item, str) and item.isdigit():
            item = int(item)
        number = coerce_uint64(spec, item)
        assert number is not None  # not nullable
        numbers_.append(number)
    return sorted(set(current) | set(numbers_))


def _location(spec: OptionSpec, current: Any, value: Any, key: str) -> dict[str, int]:
    updated = dict(current)
    for item_key, item in as_mapping(spec.name, value).items():
        if item_key not in LOCATION_KEYS:
            close = difflib.get_close_matches(str(item_key), LOCATION_KEYS, n=2)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownOptionError(
                f"unknown key {item_key!r} of tensor location {spec.name!r}{hint} "
                f"(valid: {', '.join(LOCATION_KEYS)})"
            )
        number = int(item) if is_bool(item) else to_uint(f"{spec.name}[{item_key!r}]", item)
        if item_key in SHARDING_KEYS:
            for other in SHARDING_KEYS:
                updated.pop(other, None)
        updated[item_key] = number
    return updated


def _collectives(spec: OptionSpec, current: Any, value: Any, key: str) -> dict[str, bool]:
    updated = dict(current)
    for item_key, item in as_mapping(spec.name, value).items():
        if item_key not in updated:
            raise UnknownOptionError(
                f"unknown key {item_key!r} of 'replicated_collectives_settings' "
                f"(valid: {', '.join(updated)})"
            )
        if not is_bool(item):
            raise type_error(f"{spec.name}[{item_key!r}]", "a bool", item)
        updated[item_key] = bool(item)
    return updated


def _outer_fragment(spec: OptionSpec, current: Any, value: Any, key: str) -> dict[int, list[int]]:
    result = dict(current)
    for schedule, excluded in as_mapping(spec.name, value).items():
        number = to_uint(f"{spec.name} schedule", schedule)
        if number > 3:
            raise OptionError(f"accumulate_outer_fragment schedule must be 0..3, got {number}")
        graphs = [to_uint(f"{spec.name}[{number}]", g) for g in as_items(spec.name, excluded)]
        result = {number: graphs}
    return result


def _set_manual_shard(values: dict[str, Any], explicit: set[str], flag: bool) -> None:
    values["virtual_graph_mode"] = 1 if flag else 0
    explicit.add("virtual_graph_mode")


def _set_half_partial(values: dict[str, Any], explicit: set[str], flag: bool) -> None:
    partials = "half" if flag else "float"
    values["partials_type_matmuls"] = partials
    values["convolution_options"] = {**values["convolution_options"], "partialsType": partials}
    explicit.update(("partials_type_matmuls", "convolution_options"))


def _op_names(spec: OptionSpec, current: Any, value: Any, key: str) -> list[str]:
    from paddle_ipu.options.precision import op_keys

    return op_keys(spec.name, [*current, *as_items(spec.name, value)])


def _as_dicts(ops: list[CustomOp]) -> list[dict[str, Any]]:
    return [op.as_dict() for op in ops]


MANUAL_SHARD = Derived(get=lambda v: v["virtual_graph_mode"] == 1, set=_set_manual_shard)
HALF_PARTIAL = Derived(get=lambda v: v["partials_type_matmuls"] == "half", set=_set_half_partial)

# The table: one declaration per option, kept compact on purpose.
# fmt: off

# --- native (Paddle 2.x) options ----------------------------------------------------
_add("is_training", "bool", True, NATIVE,
     doc="Build a training graph (False: inference).")
_add("need_avg_shard", "bool", False, NATIVE,
     doc="Spread ops evenly over the IPUs (a debugging aid for sharding).")
_add("enable_fp16", "bool", False, NATIVE,
     doc="Run the graph in float16 (weights and activations converted from float32).")
_add("use_no_bias_optimizer", "bool", False, NATIVE,
     doc="Use PopART's AdamNoBias / LambNoBias (no bias correction) for adam, adamw, lamb.")
_add("enable_distribution", "bool", False, NATIVE,
     doc="Run as one instance of a multi-host (POD128/POD256) job through popdist.")
_add("scaled_optimizer_state", "bool", False, NATIVE,
     doc="Keep Adam/Lamb optimizer state scaled by the loss scaling (fp16 range).")
_add("num_ipus", "uint64", 1, NATIVE, minimum=1,
     doc="IPUs in total: replicas x IPUs per replica.")
_add("batches_per_step", "uint64", 1, NATIVE, minimum=1,
     doc="Steps (batches) moved by one run; PopART's batchesPerStep.")
_add("micro_batch_size", "uint64", 1, NATIVE, minimum=1,
     doc="Batch size of one micro-batch; replaces a -1 batch dimension of the feeds.")
_add("tiles_per_ipu", "uint64", 4, NATIVE, minimum=1,
     doc="Tiles of each simulated IPU when POPLAR_IPUMODEL is set.")
_add("random_seed", "uint64", None, NATIVE, maximum=INT64_MAX, nullable=True,
     doc="Seed of the device's random ops (dropout, random_*); None leaves it unset.")
_add("available_memory_proportion", "double", 0.0, NATIVE, minimum=0.0, maximum=1.0,
     doc="Share of tile memory for matmul/conv temporaries, in [0, 1]; 0 keeps the default.")
_add("loss_scaling", "double", 1.0, NATIVE, minimum=0.0, minimum_exclusive=True,
     doc="Static loss scaling: the loss is multiplied and the gradients divided by it.")
_add("max_weight_norm", "double", 65504.0, NATIVE, minimum=0.0,
     doc="Upper bound of the weight norm in Lamb's trust ratio.")
_add("onnx_dump_path", "string", "", NATIVE,
     doc="If not empty, write the lowered ONNX model to this path.")
_add("accl1_type", "string", "FLOAT", NATIVE, choices=("FLOAT", "FLOAT16"),
     doc="Data type of the order-1 optimizer state: FLOAT or FLOAT16.")
_add("accl2_type", "string", "FLOAT", NATIVE, choices=("FLOAT", "FLOAT16"),
     doc="Data type of the order-2 optimizer state: FLOAT or FLOAT16.")
_add("accl3_type", "string", "FLOAT", NATIVE, choices=("FLOAT", "FLOAT16"),
     doc="Data type of the order-3 optimizer state: FLOAT or FLOAT16.")
_add("weight_decay_mode", "string", "", NATIVE, choices=("", "decay", "l2_regularization"),
     doc="Override how weight decay is applied: \"decay\" (decoupled), \"l2_regularization\", or "
         "\"\" (chosen from the optimizer).")
_add("lr", "double", 0.0, NATIVE, minimum=0.0,
     doc="Learning rate set from dynamic mode (dy2static).")
_add("is_dynamic", "bool", False, NATIVE,
     doc="The program comes from dynamic mode (dy2static): lr is read from here.")
_add("enable_model_runtime_executor", "bool", False, NATIVE,
     doc="Serve inference through the model runtime (queues, auto-batching).")
_add("num_buffers", "uint64", 10, NATIVE, minimum=1,
     doc="Model runtime: micro-batches in flight before a submit blocks.")
_add("timeout_ms", "double", 0.0, NATIVE, minimum=0.0, maximum=TIMEOUT_MAX_MS,
     doc="Model runtime: flush a partial micro-batch after this many ms; 0: no auto-batching.")
_add("custom_ops", "vector", (), NATIVE, coerce=_custom_ops, present=_as_dicts,
     doc="Paddle ops lowered to PopART custom ops (add_custom_op, {'custom_op': {...}}).")
_add("enable_manual_shard", "bool", False, NATIVE, derived=MANUAL_SHARD,
     doc="Place ops on IPUs by ipu_index (virtual_graph_mode Manual); needs num_ipus > 1.")
_add("enable_half_partial", "bool", False, NATIVE, derived=HALF_PARTIAL,
     doc="Accumulate matmul and conv partials in float16 (sets partials_type_matmuls and "
         "convolution_options[\"partialsType\"]).")
_add("compilation_progress_logger", "callable", None, NATIVE, passthrough=True, copy=False,
     doc="Called as logger(progress, total) while compiling; None logs at debug level.")

# --- runtime options ----------------------------------------------------------------
_add("runtime_options.enable_eval", "bool", False, RUNTIME,
     doc="Run a training graph without updating weights (lr and weight decay 0).")

# --- options of paddle-ipu ----------------------------------------------------------
_add("backend", "string", "auto", PRODUCT, choices=("auto", "host", "popart"),
     doc="\"popart\" (Poplar SDK), \"host\" (emulated IPU on the CPU) or \"auto\" (popart when the "
         "SDK is importable, else host).")
_add("host_num_threads", "uint64", 0, PRODUCT, maximum=INT32_MAX,
     doc="Threads of the host backend; 0 uses all cores.")
_add("host_spin_threads", "bool", True, PRODUCT,
     doc="Let the host backend's threads spin between runs (ONNX Runtime's allow_spinning): "
         "shorter runs back to back, but the cores they spin on are taken from other threads. "
         "Unset, they do not spin under the model runtime (enable_model_runtime_executor, "
         "`paddle-ipu serve`): its callers' threads need the cores between runs.")
_add("host_fp16_arithmetic", "string", "float16", PRODUCT, choices=("float16", "float32"),
     doc="With enable_fp16, what the host backend computes in: \"float16\" (every operator's "
         "result rounded to float16, partials, stochastic rounding and saturation as the IPU "
         "does: docs/without_ipu.md) or \"float32\" (weights and constants held in float16, "
         "arithmetic in float32: faster serving where the IPU's rounding does not matter; its "
         "speed against float32: docs/ecosystem.md).")
_add("host_engine", "string", "auto", PRODUCT, choices=("auto", "onnxruntime", "openvino"),
     doc="What runs the host backend's inference graphs in float32 or bfloat16: \"onnxruntime\", "
         "\"openvino\" (the openvino extra) or \"auto\" (the faster of the two on each model, "
         "measured once and kept in the compile cache's directory; ONNX Runtime without the "
         "extra). The IPU's float16 arithmetic, the floating-point checks and training run on "
         "ONNX Runtime (docs/performance.md).")
_add("host_precision", "string", "float32", PRODUCT, choices=("float32", "bfloat16"),
     doc="The host backend's precision for inference without enable_fp16: \"float32\" or "
         "\"bfloat16\" (matmuls and convolutions in bfloat16 on OpenVINO, for CPU serving, "
         "where the CPU has AVX512-BF16 or AMX; refused elsewhere). Not the IPU's arithmetic "
         "(the IPU computes float16); its error: docs/performance.md.")
_add("fp16_black_list", "vector", (), PRODUCT, coerce=_op_names,
     doc="With enable_fp16, Paddle operators that compute in float32 (Paddle AMP's black list; "
         "Paddle Inference's exp_disable_mixed_precision_ops): 'softmax', 'pd_op.sigmoid' or a "
         "legacy type ('elementwise_add'). Their float16 operands are widened exactly, their "
         "weights stay float32, and their results are rounded to float16 where an operator "
         "that is not listed reads them (docs/without_ipu.md). Setting adds.")
_add("host_memory_check", "string", "error", PRODUCT, choices=("error", "warning", "off"),
     doc="What the host backend does at compile time with a model that does not fit in an "
         "IPU's memory (paddle_ipu.memory_report): \"error\" refuses it (IpuMemoryError, as "
         "the Poplar compile fails), \"warning\" logs the report, \"off\" skips it.")
_add("anchor_return_type", "string", "ALL", PRODUCT, choices=("ALL", "FINAL", "SUM", "EVERYN"),
     doc="What a run returns per fetch: ALL (every step), FINAL (last step), SUM (sum over "
         "steps) or EVERYN (every anchor_return_period-th step).")
_add("anchor_return_period", "uint64", 1, PRODUCT, minimum=1,
     doc="Return period N of EVERYN; must divide batches_per_step.")

# --- PopART enum options (uint64 holding the enum's index) --------------------------
_add("autodiff_settings.stitch_strategy", "uint64", 1, ENUM,
     doc="How autodiff stitches forward tensors into the backward graph. One of "
         "RecomputeMinimal, RecomputeAllNonInputs, AddFwdOutputs, SafeAddFwdOutputs.",
     enum=("RecomputeMinimal", "RecomputeAllNonInputs", "AddFwdOutputs", "SafeAddFwdOutputs"))
_add("batch_serialization_settings.transform_context", "uint64", 0, ENUM, enum=("Fwd", "Bwd"),
     doc="When batch serialization is applied. One of Fwd, Bwd.")
_add("batch_serialization_settings.method", "uint64", 0, ENUM,
     doc="How batch serialization is applied. One of UnrollDynamic, UnrollStatic, Loop.",
     enum=("UnrollDynamic", "UnrollStatic", "Loop"))
_add("batch_serialization_settings.batch_schedule", "uint64", 1, ENUM,
     doc="How the serialized batches are scheduled. One of Scheduler, Isomorphic, "
         "OverlapOnIo, OverlapOnCompute.",
     enum=("Scheduler", "Isomorphic", "OverlapOnIo", "OverlapOnCompute"))
_add("auto_recomputation", "uint64", 0, ENUM,
     doc="Recompute activations in the backward pass instead of storing them. One of None, "
         "Standard, NormOnly, Pipeline, RecomputeAll.",
     enum=("None", "Standard", "NormOnly", "Pipeline", "RecomputeAll"))
_add("merge_var_update", "uint64", 0, ENUM, enum=("None", "All", "AutoLoose", "AutoTight"),
     doc="Merge weight-update ops into groups. One of None, All, AutoLoose, AutoTight.")
_add("virtual_graph_mode", "uint64", 0, ENUM, enum=("Off", "Manual", "Auto", "ExecutionPhases"),
     doc="How ops are placed on IPUs (enable_manual_shard sets Manual). One of Off, Manual, "
         "Auto, ExecutionPhases.")
_add("synthetic_data_mode", "uint64", 0, ENUM,
     doc="Use synthetic on-device data instead of the feeds (benchmarking). One of Off, "
         "Zeros, RandomNormal, RandomUniform.",
     enum=("Off", "Zeros", "RandomNormal", "RandomUniform"))
_add("subgraph_copying_strategy", "uint64", 0, ENUM, enum=("OnEnterAndExit", "JustInTime"),
     doc="When subgraph inputs and outputs are copied. One of OnEnterAndExit, JustInTime.")
_add("accumulation_and_replication_reduction_type", "uint64", 1, ENUM,
     doc="How gradients are reduced over accumulation and replicas. One of Sum, Mean, "
         "NoReduction.",
     enum=("Sum", "Mean", "NoReduction"))
_add("mean_accumulation_and_replication_reduction_strategy", "uint64", 1, ENUM,
     doc="Mean reduction as a running mean, or one division at the end. One of Running, Post.",
     enum=("Running", "Post"))

# --- PopART string options ----------------------------------------------------------
_add("log_dir", "string", "", STRING,
     doc="Directory for PopART's log and report files.")
_add("cache_path", "string", "session_cache", STRING,
     doc="Directory of the engine cache (with enable_engine_caching).")
_add("partials_type_matmuls", "string", "", STRING, choices=("", "float", "half"),
     doc="Partials type of matmuls: \"float\", \"half\" or \"\" (PopART default).")
_add("custom_codelet_compile_flags", "string", "", STRING,
     doc="Compiler flags for custom codelets.")
_add("serialized_poprithms_shift_graphs_dir", "string", "", STRING,
     doc="Directory to write the scheduler's graphs to.")
_add("kahn_tie_breaker", "string", "greedy", STRING,
     doc="Tie breaker of the initial Kahn schedule (\"greedy\", \"fifo\", ...).")

# --- PopART uint64 options ----------------------------------------------------------
_add("execution_phase_settings.phases", "uint64", 0, UINT64,
     doc="Number of execution phases.")
_add("execution_phase_settings.stages", "uint64", 2, UINT64,
     doc="Stages per execution phase.")
_add("batch_serialization_settings.factor", "uint64", 0, UINT64,
     doc="Serialize the batch into this many parts (0: off).")
_add("first_dot_op", "uint64", 0, UINT64,
     doc="First op written to the .dot files.")
_add("final_dot_op", "uint64", 10000, UINT64,
     doc="Last op written to the .dot files.")
_add("num_io_tiles", "uint64", 0, UINT64,
     doc="Tiles reserved for IO.")
_add("merge_var_update_mem_threshold", "uint64", 1000000, UINT64,
     doc="Bytes per group of merge_var_update AutoTight/AutoLoose.")
_add("loose_threshold_at_peak", "uint64", 8000, UINT64,
     doc="Liveness threshold of merge_var_update AutoLoose.")
_add("replicated_graph_count", "uint64", 1, UINT64, minimum=1,
     doc="Model replicas (data parallel), when enable_replicated_graphs.")
_add("accumulation_factor", "uint64", 1, UINT64, minimum=1,
     doc="Micro-batches per weight update, when enable_gradient_accumulation.")
_add("swap_limit_scheduler", "uint64", 1000000000, UINT64,
     doc="Swap limit of the scheduler.")
_add("global_replication_factor", "uint64", 1, UINT64, minimum=1,
     doc="Replicas over all instances of a distributed job.")
_add("global_replica_offset", "uint64", 0, UINT64,
     doc="Index of this instance's first replica in a distributed job.")
_add("default_prefetch_buffering_depth", "uint64", 1, UINT64, minimum=1,
     doc="Prefetch buffering depth of input streams.")
_add("compilation_progress_total", "uint64", 100, UINT64,
     doc="The total reported to compilation_progress_logger.")
_add("transitive_closure_optimization_threshold", "uint64", 100000, UINT64,
     doc="Op count above which the transitive-closure optimisation is skipped.")

# --- PopART bool options ------------------------------------------------------------
_add("batch_serialization_settings.concat_on_virtual_graph_change", "bool", True, BOOL,
     doc="Concatenate serialized batches when the virtual graph changes.")
_add("batch_serialization_settings.concat_on_execution_phase_change", "bool", True, BOOL,
     doc="Concatenate serialized batches when the execution phase changes.")
_add("batch_serialization_settings.concat_on_pipeline_stage_change", "bool", True, BOOL,
     doc="Concatenate serialized batches when the pipeline stage changes.")
_add("strict_op_versions", "bool", True, BOOL,
     doc="Fail on ONNX ops of an unexpected version.")
_add("opx_alias_checking", "bool", False, BOOL,
     doc="Check op aliasing while lowering.")
_add("opx_modify_checking", "bool", False, BOOL,
     doc="Check op modification while lowering.")
_add("dot_op_names", "bool", False, BOOL,
     doc="Write op names into the .dot files.")
_add("export_poplar_computation_graph", "bool", False, BOOL,
     doc="Export the Poplar compute graph.")
_add("export_poplar_vertex_graph", "bool", False, BOOL,
     doc="Export the Poplar vertex graph.")
_add("separate_call_op_pdfs", "bool", True, BOOL,
     doc="Separate .dot/PDF files for called subgraphs.")
_add("enable_outlining", "bool", True, BOOL,
     doc="Outline repeated code into shared subgraphs.")
_add("enable_outlining_copy_cost_pruning", "bool", True, BOOL,
     doc="Skip outlining where copies would cost more than they save.")
_add("rearrange_anchors_on_host", "bool", True, BOOL,
     doc="Rearrange fetched tensors on the host rather than the IPU.")
_add("enable_prefetch_datastreams", "bool", True, BOOL,
     doc="Prefetch input streams.")
_add("enable_non_stable_softmax", "bool", False, BOOL,
     doc="Faster softmax without subtracting the maximum.")
_add("enable_replicated_graphs", "bool", False, BOOL,
     doc="Replicate the model replicated_graph_count times.")
_add("enable_gradient_accumulation", "bool", False, BOOL,
     doc="Accumulate gradients over accumulation_factor micro-batches.")
_add("instrument_with_hardware_cycle_counter", "bool", False, BOOL,
     doc="Count cycles on the device.")
_add("enable_pipelining", "bool", False, BOOL,
     doc="Pipeline the manual shards (needs enable_manual_shard).")
_add("disable_grad_accumulation_tensor_streams", "bool", False, BOOL,
     doc="Create no streams for the gradient accumulators.")
_add("compile_engine", "bool", True, BOOL,
     doc="Compile the Poplar engine (False: build the IR only).")
_add("constant_weights", "bool", True, BOOL,
     doc="Inference: weights are constants of the graph.")
_add("enable_engine_caching", "bool", False, BOOL,
     doc="Cache compiled engines in cache_path.")
_add("enable_merge_exchange", "bool", True, BOOL,
     doc="Merge host exchanges.")
_add("enable_floating_point_checks", "bool", False, BOOL,
     doc="Trap floating-point overflow, invalid operations and division by zero.")
_add("enable_stochastic_rounding", "bool", False, BOOL,
     doc="Round float16 results stochastically.")
_add("explicit_recomputation", "bool", False, BOOL,
     doc="Recompute with explicit ops.")
_add("enable_explicit_main_loops", "bool", False, BOOL,
     doc="Use explicit main loops in the IR.")
_add("use_host_copy_ops", "bool", False, BOOL,
     doc="Use explicit host copy ops in the IR.")
_add("alias_zero_copy", "bool", False, BOOL,
     doc="Avoid copies by aliasing.")
_add("delay_var_updates", "bool", True, BOOL,
     doc="Schedule weight updates late.")
_add("enable_fully_connected_pass", "bool", True, BOOL,
     doc="Tell Poplar which matmuls are fully connected layers.")
_add("enable_serialized_matmuls", "bool", True, BOOL,
     doc="Allow serialized matmuls.")
_add("enable_stable_norm", "bool", False, BOOL,
     doc="Numerically stable variance in norms.")
_add("decompose_grad_sum", "bool", False, BOOL,
     doc="Decompose gradient sums to save memory.")
_add("enable_distributed_replicated_graphs", "bool", False, BOOL,
     doc="Replicate over the instances of a distributed job.")
_add("group_host_sync", "bool", False, BOOL,
     doc="Group host syncs.")
_add("automatic_loss_scaling_settings.enabled", "bool", False, BOOL,
     doc="Adjust the loss scaling from gradient statistics while training.")
_add("enable_supported_data_type_casting", "bool", True, BOOL,
     doc="Cast unsupported data types (int64 -> int32) on the way in.")
_add("group_norm_strided_channel_grouping", "bool", False, BOOL,
     doc="Group the channels of group_norm with a stride (not ONNX's grouping).")
_add("schedule_non_weight_update_gradient_consumers_early", "bool", False, BOOL,
     doc="Schedule gradient consumers that are not weight updates early.")
_add("create_implicit_pipelining_fwd_only_program", "bool", False, BOOL,
     doc="Also build a forward-only program of a pipelined training graph.")

# --- PopART double options ----------------------------------------------------------
_add("outline_sequence_break_cost", "double", 10000.0, DOUBLE,
     doc="Outlining cost of breaking a sequence.")
_add("outline_threshold", "double", 1.0, DOUBLE,
     doc="Outlining threshold.")
_add("time_limit_scheduler", "double", 1e9, DOUBLE, minimum=0.0,
     doc="Time limit of the scheduler, in seconds.")
_add("automatic_loss_scaling_settings.bin_edge_location", "double", 0.125, DOUBLE,
     doc="Automatic loss scaling: histogram bin edge, in [0, 1].",
     minimum=0.0, maximum=1.0)
_add("automatic_loss_scaling_settings.threshold_upper_count_proportion", "double", 1e-07, DOUBLE,
     doc="Automatic loss scaling: share of values allowed in the top bin, in [0, 1].",
     minimum=0.0, maximum=1.0)

# --- PopART string maps and structured settings -------------------------------------
_add("engine_options", "map", {}, MAP,
     doc="Poplar engine options (str to str). Setting updates the map.")
_add("report_options", "map", {}, MAP,
     doc="Poplar report options (str to str). Setting updates the map.")
_add("convolution_options", "map", {}, MAP,
     doc="poplibs convolution options (str to str). Setting updates the map.")
_add("lstm_options", "map", {}, MAP,
     doc="poplibs LSTM options (str to str). Setting updates the map.")
_add("gcl_options", "map", {}, MAP,
     doc="Graphcore collectives options (str to str). Setting updates the map.")
_add("replicated_collectives_settings", "map", COLLECTIVES_DEFAULT, MAP,
     doc="Merging of replicated collectives: the two flags, as bools.",
     coerce=_collectives)
_add("accumulate_outer_fragment", "map", {1: []}, MAP, coerce=_outer_fragment,
     doc="{schedule: [excluded virtual graphs]}; schedule 0 Scheduler, 1 Serial, 2 "
         "OverlapCycleOptimized, 3 OverlapMemoryOptimized.")

# --- PopART vectors (setting adds) --------------------------------------------------
_add("dot_checks", "vector", (), VECTOR,
     doc="IR stages written as .dot files: any of Fwd0, Fwd1, Bwd0, PreAlias, Final. Setting "
         "adds.",
     choices=("Fwd0", "Fwd1", "Bwd0", "PreAlias", "Final"), coerce=_dot_checks)
_add("hardware_instrumentations", "vector", (0,), VECTOR,
     doc="Cycle-counter instrumentation points: 0 Outer, 1 Inner. Setting adds.",
     enum=("Outer", "Inner"), coerce=_instrumentations)
_add("custom_codelets", "vector", (), VECTOR,
     doc="Source files of custom codelets. Setting adds.")

# --- PopART tensor locations --------------------------------------------------------
_add("location_activation", "map", dict(LOCATION_DEFAULT), LOCATION, coerce=_location,
     doc="Location of activations and gradients: a dict of location keys (see docs) to non-"
         "negative ints; flags are 0/1. Setting updates the given keys.")
_add("location_weight", "map", dict(LOCATION_DEFAULT), LOCATION, coerce=_location,
     doc="Location of weights: a dict of location keys (see docs) to non-negative ints; flags"
         " are 0/1. Setting updates the given keys.")
_add("location_optimizer", "map", OPTIMIZER_LOCATION_DEFAULT, LOCATION,
     doc="Location of optimizer state: a dict of location keys (see docs) to non-negative "
         "ints; flags are 0/1. Setting updates the given keys.",
     coerce=_location)
_add("location_accumulator", "map", dict(LOCATION_DEFAULT), LOCATION, coerce=_location,
     doc="Location of gradient accumulators: a dict of location keys (see docs) to non-"
         "negative ints; flags are 0/1. Setting updates the given keys.")
# fmt: on
