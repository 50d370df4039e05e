"""What the host backend (the emulated IPU) does with the IpuStrategy options.

An option not listed is honoured: emulated faithfully (the IPU's float16 arithmetic,
stochastic rounding and floating-point checks among them), or read by the memory
report that refuses, at compile time, a model an IPU cannot hold (the placement,
recomputation and tensor-location options).  ``ignored`` options are accepted because
they cannot change results (scheduling, compile caching, logging, the memory options the
report does not model); ``unsupported`` ones would change results and cannot be
emulated, so a strategy that sets one away from its default is refused
(``NotSupportedError`` naming each) before a session is made.  docs/strategy.md shows
this table beside every option.
"""

from __future__ import annotations

from types import MappingProxyType

from paddle_ipu.backends.base import OptionSupport, SessionConfig
from paddle_ipu.errors import NotSupportedError

#: options the host honours, with what it checks
_NOTES: dict[str, str] = {
    "num_ipus": "checked against replication and shard indices",
    "accumulation_and_replication_reduction_type": "NoReduction is unsupported",
    "enable_pipelining": "checked; results equal those of gradient accumulation",
    "enable_distribution": (
        "one process per instance, started by paddle.distributed.launch; gradients "
        "all-reduced over every process's replicas (docs/distributed.md)"
    ),
    "global_replication_factor": (
        "with enable_distribution, checked: processes x local replicas; refused without it"
    ),
    "global_replica_offset": (
        "with enable_distribution, checked: rank x local replicas; refused without it"
    ),
    "enable_distributed_replicated_graphs": (
        "with enable_distribution, what it does; refused without it"
    ),
    "enable_fp16": (
        "every operator's result rounded to float16 as the IPU rounds it, partials and "
        "saturation included: host_fp16_arithmetic, docs/without_ipu.md"
    ),
    "host_fp16_arithmetic": "docs/without_ipu.md",
    "host_engine": (
        "inference in float32 or bfloat16 on ONNX Runtime or OpenVINO (auto: the faster, "
        "measured once per model); float16, the floating-point checks and training run on "
        'ONNX Runtime, and "openvino" is refused with them'
    ),
    "host_precision": (
        "bfloat16 matmuls and convolutions on OpenVINO, in inference without enable_fp16, "
        "on a CPU with AVX512-BF16 or AMX (refused elsewhere, naming what is missing)"
    ),
    "use_no_bias_optimizer": (
        "adam, adamw and lamb update by PopART's AdamNoBias / LambNoBias rule "
        "(willow/include/popart/adam.hpp), Lamb's trust ratio bounded by max_weight_norm"
    ),
    "fp16_black_list": (
        "in inference, the listed operators compute in float32 and their results are "
        "rounded where a float16 operator reads them (docs/without_ipu.md); refused in "
        "training, whose float16 program rounds every operator"
    ),
    "enable_stochastic_rounding": (
        "on every float16 result and weight update, seeded with random_seed, plus the "
        "replica index in the forward and backward passes; it changes nothing without "
        "enable_fp16"
    ),
    "enable_floating_point_checks": (
        "the run stops at the first operator that makes an infinity or NaN from finite "
        "operands, with a FloatingPointCheckError naming it; a float16 overflow stops it "
        "too instead of saturating"
    ),
    "enable_half_partial": (
        "float16 matmul and convolution partials with enable_fp16, in inference; in "
        "training the matmuls' (the backward pass's too), and a model with convolutions is "
        "refused (Paddle's gradient kernels accumulate convolution partials in float32)"
    ),
    "partials_type_matmuls": '"half": as enable_half_partial, for matmuls',
    "convolution_options": (
        "its partialsType, as enable_half_partial for convolutions; its other keys are "
        "Poplar's tuning, without effect on the host"
    ),
    "loss_scaling": (
        "with float16 arithmetic the backward pass starts from the scaled loss gradient "
        "and the update divides by it; in float32 arithmetic it does not change the result"
    ),
    "enable_stable_norm": (
        "the variance of the normalisation operators the graph holds as such: "
        "LayerNormalization, InstanceNormalization, GroupNormalization"
    ),
    "available_memory_proportion": "the bound of the memory report's temporaries",
    "auto_recomputation": "the activations of the memory report",
    "enable_manual_shard": "the memory report places operators on IPUs by ipu_index",
    "virtual_graph_mode": "Manual: the memory report places operators by ipu_index",
    "location_weight": "the memory report: off chip, replicated tensor sharding",
    "location_optimizer": "the memory report: off chip, replicated tensor sharding",
    "location_accumulator": "the memory report: off chip, replicated tensor sharding",
    "host_memory_check": "the memory report of paddle_ipu/compiler/memory.py; docs/without_ipu.md",
}
#: accepted and ignored: they cannot change results
_IGNORED: dict[str, str] = {
    "need_avg_shard": "placement only",
    "scaled_optimizer_state": "the update is the same in exact arithmetic",
    "tiles_per_ipu": "no tiles to simulate",
    "autodiff_settings.stitch_strategy": "scheduling",
    "batch_serialization_settings.transform_context": "memory/scheduling",
    "batch_serialization_settings.method": "memory/scheduling",
    "batch_serialization_settings.batch_schedule": "scheduling",
    "merge_var_update": "scheduling",
    "subgraph_copying_strategy": "scheduling",
    "mean_accumulation_and_replication_reduction_strategy": "the same mean up to rounding",
    "log_dir": "logging",
    "cache_path": "compile caching",
    "custom_codelet_compile_flags": "IPU compile only",
    "serialized_poprithms_shift_graphs_dir": "debugging output",
    "kahn_tie_breaker": "scheduling",
    "execution_phase_settings.phases": "placement/scheduling",
    "execution_phase_settings.stages": "placement/scheduling",
    "batch_serialization_settings.factor": "memory only",
    "first_dot_op": "debugging output",
    "final_dot_op": "debugging output",
    "num_io_tiles": "memory only",
    "merge_var_update_mem_threshold": "scheduling",
    "loose_threshold_at_peak": "scheduling",
    "swap_limit_scheduler": "scheduling",
    "default_prefetch_buffering_depth": "IO only",
    "compilation_progress_total": "progress reporting",
    "transitive_closure_optimization_threshold": "compile time only",
    "batch_serialization_settings.concat_on_virtual_graph_change": "memory/scheduling",
    "batch_serialization_settings.concat_on_execution_phase_change": "memory/scheduling",
    "batch_serialization_settings.concat_on_pipeline_stage_change": "memory/scheduling",
    "strict_op_versions": "IPU compile check",
    "opx_alias_checking": "debugging",
    "opx_modify_checking": "debugging",
    "dot_op_names": "debugging output",
    "export_poplar_computation_graph": "debugging output",
    "export_poplar_vertex_graph": "debugging output",
    "separate_call_op_pdfs": "debugging output",
    "enable_outlining": "code size only",
    "enable_outlining_copy_cost_pruning": "code size only",
    "rearrange_anchors_on_host": "IO only",
    "enable_prefetch_datastreams": "IO only",
    "enable_non_stable_softmax": "precision hint; the host always uses the stable form",
    "instrument_with_hardware_cycle_counter": "profiling",
    "disable_grad_accumulation_tensor_streams": "IO only",
    "compile_engine": "IPU compile only",
    "constant_weights": "the same values",
    "enable_engine_caching": "compile caching",
    "enable_merge_exchange": "IO only",
    "explicit_recomputation": "memory only",
    "enable_explicit_main_loops": "scheduling",
    "use_host_copy_ops": "IO only",
    "alias_zero_copy": "memory only",
    "delay_var_updates": "scheduling",
    "enable_fully_connected_pass": "planning",
    "enable_serialized_matmuls": "memory only",
    "decompose_grad_sum": "memory only",
    "group_host_sync": "IO only",
    "enable_supported_data_type_casting": "the compiler already feeds int32",
    "schedule_non_weight_update_gradient_consumers_early": "scheduling",
    "create_implicit_pipelining_fwd_only_program": "compile only",
    "outline_sequence_break_cost": "code size only",
    "outline_threshold": "code size only",
    "time_limit_scheduler": "scheduling",
    "automatic_loss_scaling_settings.bin_edge_location": "used only by automatic loss scaling",
    "automatic_loss_scaling_settings.threshold_upper_count_proportion": (
        "used only by automatic loss scaling"
    ),
    "engine_options": "Poplar library tuning",
    "report_options": "Poplar library tuning",
    "lstm_options": "Poplar library tuning",
    "gcl_options": "Poplar library tuning",
    "replicated_collectives_settings": "scheduling",
    "accumulate_outer_fragment": "scheduling",
    "dot_checks": "debugging output",
    "hardware_instrumentations": "profiling",
    "custom_codelets": "IPU compile only",
    "location_activation": "memory placement only",
}
#: they would change results and cannot be emulated
_UNSUPPORTED: dict[str, str] = {
    "max_weight_norm": "the host's Lamb follows Paddle's kernel, which has no such bound",
    "accl1_type": "the host keeps optimizer state in float32",
    "accl2_type": "the host keeps optimizer state in float32",
    "accl3_type": "the host keeps optimizer state in float32",
    "weight_decay_mode": "the host applies weight decay the way the program's optimizer does",
    "custom_ops": "PopART custom ops exist only on the IPU",
    "synthetic_data_mode": "the feeds would be replaced",
    "automatic_loss_scaling_settings.enabled": "the loss scaling would follow device statistics",
    "group_norm_strided_channel_grouping": "changes which channels are normalised together",
}


def _has_convolutions(config: SessionConfig) -> bool:
    """Whether the training program holds a convolution (None: assume so)."""
    source = config.training_source
    if source is None:
        return True
    return any("conv" in op.name() for op in source.program.global_block().ops)


def _engines(config: SessionConfig) -> list[str]:
    """host_engine and host_precision: what they cannot be combined with, and what
    this machine lacks for them."""
    from paddle_ipu.backends.host import engines

    refused = []
    bf16 = config.option("host_precision") == "bfloat16"
    openvino = config.option("host_engine") == "openvino"
    others = [
        name
        for name, on in (
            ("is_training", config.is_training),
            ("enable_fp16", config.enable_fp16),
            ("enable_floating_point_checks", config.option("enable_floating_point_checks")),
        )
        if on
    ]
    if bf16 and others:
        refused.append(
            f"host_precision='bfloat16' with {', '.join(others)} (bfloat16 is an inference "
            "precision of its own: not with training, the IPU's float16 or its checks)"
        )
    elif openvino and others:
        refused.append(
            f"host_engine='openvino' with {', '.join(others)} (OpenVINO runs inference "
            "graphs in float32 or bfloat16; those run on ONNX Runtime)"
        )
    if bf16 and config.option("host_engine") == "onnxruntime":
        refused.append(
            "host_precision='bfloat16' with host_engine='onnxruntime' (ONNX Runtime's CPU "
            "provider has no bfloat16 matmul or convolution on x86: bfloat16 runs on OpenVINO)"
        )
    if (bf16 or openvino) and not refused:
        try:
            if bf16:
                engines.check_bf16()
            else:
                engines.check_openvino()
        except NotSupportedError as exc:
            refused.append(str(exc))
    return refused


def _refuse(config: SessionConfig) -> list[str]:
    refused = _engines(config)
    if config.option("accumulation_and_replication_reduction_type") == 2:
        refused.append(
            "accumulation_and_replication_reduction_type=2 (NoReduction: the host reduces "
            "gradients by Mean or Sum)"
        )
    if (
        config.is_training
        and config.enable_fp16
        and config.option("host_fp16_arithmetic") == "float16"
    ):
        conv = config.option("convolution_options") or {}
        if str(conv.get("partialsType", "")).lower() == "half" and _has_convolutions(config):
            refused.append(
                "float16 convolution partials (enable_half_partial or "
                "convolution_options['partialsType']) in training of a model with "
                "convolutions: the host's gradient kernels (Paddle's) accumulate convolution "
                "partials in float32; it emulates float16 matmul partials in training, and "
                "both in inference"
            )
    return refused


SUPPORT = OptionSupport(
    ignored=MappingProxyType(_IGNORED),
    unsupported=MappingProxyType(_UNSUPPORTED),
    notes=MappingProxyType(_NOTES),
    refuse=_refuse,
)
