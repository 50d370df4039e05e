"""IpuStrategy: Paddle 2.x's option set and defaults, validation, helpers, accessors."""

from __future__ import annotations

import importlib.util
import inspect
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_ipu import backends
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.backends.popart.options import popart_name, popart_options
from paddle_ipu.errors import (
    NotSupportedError,
    OptionError,
    OptionTypeError,
    UnknownOptionError,
)
from paddle_ipu.options import OPTIONS, CustomOp
from paddle_ipu.strategy import IpuStrategy

# Every option Paddle 2.x's IpuStrategy registered (native, runtime and PopART).
_PADDLE2_NAMES = """
is_training need_avg_shard enable_fp16 use_no_bias_optimizer enable_distribution
scaled_optimizer_state num_ipus batches_per_step micro_batch_size tiles_per_ipu random_seed
available_memory_proportion loss_scaling max_weight_norm onnx_dump_path accl1_type accl2_type
accl3_type weight_decay_mode runtime_options.enable_eval lr is_dynamic
enable_model_runtime_executor num_buffers timeout_ms custom_ops enable_manual_shard
enable_half_partial dot_checks hardware_instrumentations custom_codelets engine_options
report_options convolution_options lstm_options gcl_options
autodiff_settings.stitch_strategy batch_serialization_settings.transform_context
batch_serialization_settings.method batch_serialization_settings.batch_schedule
auto_recomputation merge_var_update virtual_graph_mode synthetic_data_mode
subgraph_copying_strategy accumulation_and_replication_reduction_type
mean_accumulation_and_replication_reduction_strategy
log_dir cache_path partials_type_matmuls custom_codelet_compile_flags
serialized_poprithms_shift_graphs_dir kahn_tie_breaker
execution_phase_settings.phases execution_phase_settings.stages
batch_serialization_settings.factor first_dot_op final_dot_op num_io_tiles
merge_var_update_mem_threshold loose_threshold_at_peak replicated_graph_count
accumulation_factor swap_limit_scheduler global_replication_factor global_replica_offset
default_prefetch_buffering_depth compilation_progress_total
transitive_closure_optimization_threshold
batch_serialization_settings.concat_on_virtual_graph_change
batch_serialization_settings.concat_on_execution_phase_change
batch_serialization_settings.concat_on_pipeline_stage_change strict_op_versions
opx_alias_checking opx_modify_checking dot_op_names export_poplar_computation_graph
export_poplar_vertex_graph separate_call_op_pdfs enable_outlining
enable_outlining_copy_cost_pruning rearrange_anchors_on_host enable_prefetch_datastreams
enable_non_stable_softmax enable_replicated_graphs enable_gradient_accumulation
instrument_with_hardware_cycle_counter enable_pipelining
disable_grad_accumulation_tensor_streams compile_engine constant_weights
enable_engine_caching enable_merge_exchange enable_floating_point_checks
enable_stochastic_rounding explicit_recomputation enable_explicit_main_loops
use_host_copy_ops alias_zero_copy delay_var_updates enable_fully_connected_pass
enable_serialized_matmuls enable_stable_norm decompose_grad_sum
enable_distributed_replicated_graphs group_host_sync
automatic_loss_scaling_settings.enabled enable_supported_data_type_casting
group_norm_strided_channel_grouping schedule_non_weight_update_gradient_consumers_early
create_implicit_pipelining_fwd_only_program outline_sequence_break_cost outline_threshold
time_limit_scheduler automatic_loss_scaling_settings.bin_edge_location
automatic_loss_scaling_settings.threshold_upper_count_proportion
location_activation location_weight location_optimizer location_accumulator
replicated_collectives_settings accumulate_outer_fragment compilation_progress_logger
"""
PADDLE2_OPTIONS = _PADDLE2_NAMES.split()

PRODUCT_OPTIONS = [
    "backend",
    "host_num_threads",
    "host_spin_threads",
    "host_fp16_arithmetic",
    "anchor_return_type",
    "anchor_return_period",
]


@pytest.fixture
def s() -> IpuStrategy:
    return IpuStrategy()


# --- the option set and its defaults ------------------------------------------------


def test_every_paddle2_option_and_product_option_exists(s: IpuStrategy) -> None:
    names = s.get_all_option_names()
    missing = sorted(set(PADDLE2_OPTIONS + PRODUCT_OPTIONS) - set(names))
    assert not missing
    assert names == sorted(names) == sorted(OPTIONS)


def test_native_defaults(s: IpuStrategy) -> None:
    expected: dict[str, Any] = {
        "is_training": True,
        "need_avg_shard": False,
        "enable_fp16": False,
        "use_no_bias_optimizer": False,
        "enable_distribution": False,
        "scaled_optimizer_state": False,
        "num_ipus": 1,
        "batches_per_step": 1,
        "micro_batch_size": 1,
        "tiles_per_ipu": 4,
        "random_seed": None,
        "available_memory_proportion": 0.0,
        "loss_scaling": 1.0,
        "max_weight_norm": 65504.0,
        "onnx_dump_path": "",
        "accl1_type": "FLOAT",
        "accl2_type": "FLOAT",
        "accl3_type": "FLOAT",
        "weight_decay_mode": "",
        "runtime_options.enable_eval": False,
        "lr": 0.0,
        "is_dynamic": False,
        "enable_model_runtime_executor": False,
        "num_buffers": 10,
        "timeout_ms": 0.0,
        "custom_ops": [],
        "enable_manual_shard": False,
        "backend": "auto",
        "host_num_threads": 0,
        "host_spin_threads": True,
        "host_fp16_arithmetic": "float16",
        "anchor_return_type": "ALL",
        "anchor_return_period": 1,
    }
    assert {name: s.get(name) for name in expected} == expected


def test_constructor_defaults_of_paddle2(s: IpuStrategy) -> None:
    location = s.get("location_optimizer")
    assert location["on_chip"] == 0
    assert location["use_replicated_tensor_sharding"] == 1
    assert s.get("location_weight")["on_chip"] == 1
    assert s.get("accumulation_and_replication_reduction_type") == 1  # Mean
    assert s.get("mean_accumulation_and_replication_reduction_strategy") == 1  # Post
    assert s.gradient_reduction == "mean"
    popart = popart_options(s.values(), s.explicit_options())
    assert popart["accumulationAndReplicationReductionType"] == 1
    assert popart["meanAccumulationAndReplicationReductionStrategy"] == 1
    optimizer = popart["optimizerStateTensorLocationSettings"]
    assert optimizer["location.storage"] == "OffChip"
    assert optimizer["location.replicatedTensorSharding"] == "On"


def test_popart_defaults_of_pass_through_options(s: IpuStrategy) -> None:
    assert s.get("cache_path") == "session_cache"
    assert s.get("kahn_tie_breaker") == "greedy"
    assert s.get("final_dot_op") == 10000
    assert s.get("execution_phase_settings.stages") == 2
    assert s.get("enable_outlining") is True
    assert s.get("constant_weights") is True
    assert s.get("hardware_instrumentations") == [0]
    assert s.get("virtual_graph_mode") == 0
    assert s.get("batch_serialization_settings.batch_schedule") == 1  # Isomorphic
    assert s.get("automatic_loss_scaling_settings.bin_edge_location") == 0.125


def test_default_accessors(s: IpuStrategy) -> None:
    assert (s.num_ipus, s.is_training, s.enable_pipelining, s.enable_fp16) == (
        1,
        True,
        False,
        False,
    )
    assert (s.accumulation_factor, s.replication_factor) == (1, 1)
    assert (s.batches_per_step, s.micro_batch_size) == (1, 1)
    assert not s.enable_manual_shard and not s.enable_gradient_accumulation
    assert s.custom_ops == () and not s.has_custom_ops and s.custom_op_names == []
    assert s.random_seed is None
    assert (s.anchor_return_type, s.anchor_return_period) == ("ALL", 1)
    s.validate()


def test_get_option_structure(s: IpuStrategy) -> None:
    allowed = {"bool", "uint64", "double", "string", "vector", "map", "callable"}
    for name in s.get_all_option_names():
        option = s.option_info(name)
        assert set(option) == {"name", "type", "value"}
        assert option["name"] == name
        assert option["type"] in allowed
        assert option["type"] == OPTIONS[name].type
    assert s.option_info("num_ipus") == {"name": "num_ipus", "type": "uint64", "value": 1}
    assert s.get_option("num_ipus") == 1  # the value, as Paddle 2.x returned it
    assert s._ipu_strategy.get_option("num_ipus")["value"] == 1


def test_get_returns_copies(s: IpuStrategy) -> None:
    s.get("engine_options")["x"] = "1"
    s.option_info("location_weight")["value"]["on_chip"] = 0
    assert s.get("engine_options") == {}
    assert s.get("location_weight")["on_chip"] == 1


# --- the round trip of Paddle's own test, over every option -------------------------


def _next_value(name: str, option: dict[str, Any]) -> Any:
    value, kind = option["value"], option["type"]
    if kind == "bool":
        return not value
    if kind == "uint64":
        if value is None:  # random_seed starts unset
            return 1
        enum = OPTIONS[name].enum
        return (value + 1) % len(enum) if enum else value + 1
    if kind == "double":
        return value + 0.5
    return None


def test_round_trip_of_every_scalar_option(s: IpuStrategy) -> None:
    checked = 0
    for name in s.get_all_option_names():
        option = s.option_info(name)
        new = _next_value(name, option)
        if new is None:
            continue
        s.set_options({name: new})
        assert s.option_info(name)["value"] == new, name
        assert type(s.get(name)) is type(new), name
        checked += 1
    scalar = [o for o in OPTIONS.values() if o.type in ("bool", "uint64", "double")]
    assert checked == len(scalar) > 90


def _sample(name: str, option: dict[str, Any]) -> Any:
    spec = OPTIONS[name]
    if spec.type == "string":
        if spec.choices:
            return next(c for c in spec.choices if c != option["value"])
        return option["value"] + "_x"
    if spec.type == "callable":
        return lambda progress, total: None
    if name == "custom_ops":
        return [{"paddle_op": "my_op", "popart_op": "MyOp", "domain": "d", "version": 2}]
    if name == "dot_checks":
        return ["Fwd0", "Final"]
    if name == "hardware_instrumentations":
        return [1]
    if name == "custom_codelets":
        return ["codelet.cpp"]
    if name == "fp16_black_list":
        return ["softmax", "layer_norm"]
    if spec.group == "popart.location":
        return {"on_chip": 1 - option["value"]["on_chip"], "min_elements_for_off_chip": 7}
    if name == "replicated_collectives_settings":
        return {"merge_all_reduce_collectives": True}
    if name == "accumulate_outer_fragment":
        return {3: [0, 1]}
    return {"some.key": "value"}


def test_round_trip_of_every_other_option(s: IpuStrategy) -> None:
    for name in s.get_all_option_names():
        option = s.option_info(name)
        if option["type"] in ("bool", "uint64", "double"):
            continue
        new = _sample(name, option)
        s.set_options({name: new})
        got = s.get(name)
        if option["type"] == "vector":
            assert all(item in got for item in new), name
        elif option["type"] == "map":
            assert {k: got[k] for k in new} == new, name
        else:
            assert got == new or got is new, name


# --- set_options dispatch on the value's type ---------------------------------------


def test_dispatch_bool(s: IpuStrategy) -> None:
    s.set_options({"enable_fp16": True, "enable_engine_caching": np.bool_(True)})
    assert s.get("enable_fp16") is True and s.get("enable_engine_caching") is True
    with pytest.raises(OptionTypeError, match="'enable_fp16' expects a bool, got int 1"):
        s.set_options({"enable_fp16": 1})


def test_dispatch_uint64(s: IpuStrategy) -> None:
    s.set_options({"num_ipus": np.int64(4), "replicated_graph_count": 2})
    assert s.get("num_ipus") == 4 and type(s.get("num_ipus")) is int
    with pytest.raises(OptionTypeError, match=r"'num_ipus'.*non-negative int.*bool True"):
        s.set_options({"num_ipus": True})
    with pytest.raises(OptionTypeError, match=r"'num_ipus'.*float 2.0"):
        s.set_options({"num_ipus": 2.0})
    with pytest.raises(OptionError, match=r"'swap_limit_scheduler'.*-1"):
        s.set_options({"swap_limit_scheduler": -1})


def test_dispatch_enum_by_index_or_name(s: IpuStrategy) -> None:
    s.set_options({"virtual_graph_mode": "manual"})
    assert s.get("virtual_graph_mode") == 1 and s.enable_manual_shard
    s.set_options({"auto_recomputation": 3})
    assert s.get("auto_recomputation") == 3
    with pytest.raises(OptionError, match=r"'virtual_graph_mode' got 4, out of range.*3 \("):
        s.set_options({"virtual_graph_mode": 4})
    with pytest.raises(OptionError, match="no member 'Sideways'"):
        s.set_options({"virtual_graph_mode": "Sideways"})
    with pytest.raises(OptionError, match="out of range"):
        s.set_options({"mean_accumulation_and_replication_reduction_strategy": 2})


def test_dispatch_double(s: IpuStrategy) -> None:
    s.set_options({"loss_scaling": 128, "available_memory_proportion": np.float32(0.25)})
    assert s.get("loss_scaling") == 128.0 and type(s.get("loss_scaling")) is float
    assert s.get("available_memory_proportion") == 0.25
    with pytest.raises(OptionTypeError, match="'loss_scaling' expects a float, got str"):
        s.set_options({"loss_scaling": "128"})
    with pytest.raises(OptionError, match="NaN"):
        s.set_options({"outline_threshold": math.nan})


def test_dispatch_string(s: IpuStrategy) -> None:
    s.set_options({"log_dir": "logs", "accl1_type": "float16", "weight_decay_mode": "decay"})
    assert (s.get("log_dir"), s.get("accl1_type")) == ("logs", "FLOAT16")
    with pytest.raises(OptionError, match=r"'accl2_type' got 'FLOAT64'; valid: 'FLOAT', 'FLOAT16'"):
        s.set_options({"accl2_type": "FLOAT64"})
    with pytest.raises(OptionTypeError, match="'log_dir' expects a str"):
        s.set_options({"log_dir": 3})


def test_dispatch_vector_adds(s: IpuStrategy) -> None:
    s.set_options({"dot_checks": ["Fwd0", "Bwd0"]})
    s.set_options({"dot_checks": {"Final", "Fwd0"}})
    assert s.get("dot_checks") == ["Bwd0", "Final", "Fwd0"]
    s.set_options({"hardware_instrumentations": ["1"]})
    assert s.get("hardware_instrumentations") == [0, 1]
    with pytest.raises(OptionError, match="unknown dot check 'Fwd9'"):
        s.set_options({"dot_checks": ["Fwd9"]})
    with pytest.raises(OptionTypeError, match="'custom_codelets' expects a list"):
        s.set_options({"custom_codelets": "codelet.cpp"})


def test_dispatch_map_updates(s: IpuStrategy) -> None:
    s.set_options({"engine_options": {"debug.allowOutOfMemory": True, "opt.x": 3}})
    s.set_options({"engine_options": {"autoReport.directory": "path"}})
    assert s.get("engine_options") == {
        "debug.allowOutOfMemory": "true",
        "opt.x": "3",
        "autoReport.directory": "path",
    }
    with pytest.raises(OptionTypeError, match="'engine_options' expects a dict"):
        s.set_options({"engine_options": ["a"]})


def test_dispatch_tensor_location(s: IpuStrategy) -> None:
    s.set_options({"location_weight": {"on_chip": False, "sharding_domain_with_consecutive": 4}})
    weight = s.get("location_weight")
    assert weight["on_chip"] == 0 and weight["sharding_domain_with_consecutive"] == 4
    assert "sharding_domain_with_all" not in weight
    popart = popart_options(s.values(), s.explicit_options())["weightTensorLocationSettings"]
    assert popart["location.storage"] == "OffChip"
    assert popart["location.shardingDomain"] == {"type": "Consecutive", "size": 4}
    with pytest.raises(UnknownOptionError, match="did you mean on_chip"):
        s.set_options({"location_weight": {"onchip": 1}})


def test_dispatch_callable_and_none(s: IpuStrategy) -> None:
    calls: list[tuple[int, int]] = []

    def logger(progress: int, total: int) -> None:
        calls.append((progress, total))

    s.set_options({"compilation_progress_logger": logger, "random_seed": 1234})
    assert s.get("compilation_progress_logger") is logger
    assert popart_options(s.values(), s.explicit_options())["compilationProgressLogger"] is logger
    assert s.random_seed == 1234
    s.set_options({"random_seed": None})
    assert s.random_seed is None
    with pytest.raises(OptionTypeError, match="callable"):
        s.set_options({"compilation_progress_logger": "print"})
    with pytest.raises(OptionTypeError, match="'num_ipus'"):
        s.set_options({"num_ipus": None})


# --- errors ---------------------------------------------------------------------------


def test_unknown_option_suggests_closest(s: IpuStrategy) -> None:
    with pytest.raises(UnknownOptionError, match="'num_ipu'; did you mean 'num_ipus'") as info:
        s.set_options({"num_ipu": 2})
    assert isinstance(info.value, KeyError) and isinstance(info.value, OptionError)
    with pytest.raises(UnknownOptionError, match=r"'autodiff_settings.stitch_strategy'"):
        s.set_options({"stitch_strategy": 0})
    with pytest.raises(UnknownOptionError, match="'enable_pipelining'"):
        s.get_option("enable_pipelinig")
    with pytest.raises(UnknownOptionError, match="'no_such_thing'") as info:
        s.get("no_such_thing")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"available_memory_proportion": 1.5},
            r"'available_memory_proportion' must be in \[0, 1\]",
        ),
        ({"available_memory_proportion": -0.1}, r"in \[0, 1\], got -0.1"),
        ({"micro_batch_size": 0}, "'micro_batch_size' must be >= 1, got 0"),
        ({"batches_per_step": 0}, "'batches_per_step' must be >= 1, got 0"),
        ({"num_ipus": 0}, "'num_ipus' must be >= 1"),
        ({"accumulation_factor": 0}, "'accumulation_factor' must be >= 1"),
        ({"anchor_return_period": 0}, "'anchor_return_period' must be >= 1"),
        ({"loss_scaling": 0.0}, "'loss_scaling' must be > 0"),
        ({"timeout_ms": -1.0}, "'timeout_ms' must be >= 0"),
        ({"num_ipus": 2**64}, "'num_ipus'"),
        ({"backend": "gpu"}, "'backend' got 'gpu'; valid: 'auto', 'host', 'popart'"),
        ({"anchor_return_type": "LAST"}, "'anchor_return_type' got 'LAST'"),
    ],
)
def test_out_of_range(s: IpuStrategy, options: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        s.set_options(options)


def test_set_options_is_atomic(s: IpuStrategy) -> None:
    with pytest.raises(OptionError):
        s.set_options({"num_ipus": 4, "engine_options": {"a": "b"}, "micro_batch_size": 0})
    assert s.num_ipus == 1 and s.get("engine_options") == {}
    with pytest.raises(OptionTypeError):
        s.set_options([("num_ipus", 2)])  # type: ignore[arg-type]


# --- cross-option checks --------------------------------------------------------------


def test_manual_shard_with_one_ipu(s: IpuStrategy) -> None:
    with pytest.raises(OptionError, match="enable_manual_shard=True needs num_ipus > 1"):
        s.set_graph_config(num_ipus=1, enable_manual_shard=True)
    assert not s.enable_manual_shard
    s.set_options({"enable_manual_shard": True})  # order-dependent: checked by validate()
    with pytest.raises(OptionError, match="num_ipus > 1"):
        s.validate()
    s.set_options({"num_ipus": 2})
    s.validate()


def test_pipelining_without_manual_shard(s: IpuStrategy) -> None:
    with pytest.raises(OptionError, match="enable_pipelining=True needs enable_manual_shard"):
        s.set_pipelining_config(enable_pipelining=True)
    assert not s.enable_pipelining
    s.set_options({"enable_pipelining": True})
    with pytest.raises(OptionError, match="enable_pipelining needs enable_manual_shard"):
        s.validate()


def test_accumulation_factor_needs_gradient_accumulation(s: IpuStrategy) -> None:
    with pytest.raises(OptionError, match="accumulation_factor=4 needs"):
        s.set_pipelining_config(accumulation_factor=4)
    s.set_options({"accumulation_factor": 4})
    with pytest.raises(OptionError, match="enable_gradient_accumulation is False"):
        s.validate()


def test_replicas_must_divide_num_ipus(s: IpuStrategy) -> None:
    s.set_options({"num_ipus": 3, "enable_replicated_graphs": True, "replicated_graph_count": 2})
    with pytest.raises(OptionError, match=r"num_ipus \(3\) must be a multiple"):
        s.validate()


def test_everyn_period_must_divide_batches_per_step(s: IpuStrategy) -> None:
    with pytest.raises(OptionError, match=r"anchor_return_period \(3\) must divide"):
        s.set_anchor_config("EVERYN", 3)
    assert s.anchor_return_type == "ALL"
    s.set_pipelining_config(batches_per_step=6)
    s.set_anchor_config("everyn", 3)
    assert (s.anchor_return_type, s.anchor_return_period) == ("EVERYN", 3)
    s.set_options({"batches_per_step": 4})
    with pytest.raises(OptionError, match="must divide"):
        s.validate()
    with pytest.raises(OptionError, match="only to EVERYN, not to SUM"):
        s.set_anchor_config("SUM", 2)


# --- helpers and accessors ------------------------------------------------------------


def test_set_graph_config(s: IpuStrategy) -> None:
    s.set_graph_config(num_ipus=4, is_training=False, micro_batch_size=8, enable_manual_shard=True)
    assert (s.num_ipus, s.is_training, s.micro_batch_size) == (4, False, 8)
    assert s.enable_manual_shard and s.get("enable_manual_shard") is True
    assert s.get("virtual_graph_mode") == 1
    assert popart_options(s.values(), s.explicit_options())["virtualGraphMode"] == 1
    s.set_graph_config(num_ipus=4)
    assert s.get("virtual_graph_mode") == 0


def test_set_pipelining_config(s: IpuStrategy) -> None:
    s.set_graph_config(num_ipus=2, enable_manual_shard=True)
    s.set_pipelining_config(
        enable_pipelining=True,
        batches_per_step=4,
        enable_gradient_accumulation=True,
        accumulation_factor=3,
    )
    assert s.enable_pipelining and s.enable_gradient_accumulation
    assert (s.batches_per_step, s.accumulation_factor) == (4, 3)
    popart = popart_options(s.values(), s.explicit_options())
    assert popart["enablePipelining"] is True
    assert popart["enableGradientAccumulation"] is True
    assert popart["accumulationFactor"] == 3
    s.validate()


def test_accumulation_and_replication_factors(s: IpuStrategy) -> None:
    s.set_options({"accumulation_factor": 4, "replicated_graph_count": 2, "num_ipus": 2})
    assert (s.accumulation_factor, s.replication_factor) == (1, 1)  # both switched off
    s.set_options({"enable_gradient_accumulation": True, "enable_replicated_graphs": True})
    assert (s.accumulation_factor, s.replication_factor) == (4, 2)
    popart = popart_options(s.values(), s.explicit_options())
    assert popart["replicatedGraphCount"] == 2 and popart["enableReplicatedGraphs"] is True


def test_gradient_reduction(s: IpuStrategy) -> None:
    s.set_options({"accumulation_and_replication_reduction_type": "Sum"})
    assert s.gradient_reduction == "sum"
    s.set_options({"accumulation_and_replication_reduction_type": 2})
    with pytest.raises(NotSupportedError, match="NoReduction"):
        _ = s.gradient_reduction


def test_set_precision_config_and_half_partial(s: IpuStrategy) -> None:
    s.set_precision_config(enable_fp16=True)
    assert s.enable_fp16
    s.set_options({"enable_half_partial": True})
    assert s.get("partials_type_matmuls") == "half"
    assert s.get("convolution_options")["partialsType"] == "half"
    assert s.get("enable_half_partial") is True
    popart = popart_options(s.values(), s.explicit_options())
    assert popart["partialsTypeMatMuls"] == "half"
    assert popart["convolutionOptions"] == {"partialsType": "half"}


def test_add_custom_op(s: IpuStrategy) -> None:
    s.add_custom_op("custom_relu")
    s.add_custom_op("custom_gelu", "Gelu", domain="my.ops", version=2)
    s.set_options({"custom_op": {"paddle_op": "leaky"}})
    assert s.custom_ops == (
        CustomOp("custom_relu", "custom_relu", "custom.ops", 1),
        CustomOp("custom_gelu", "Gelu", "my.ops", 2),
        CustomOp("leaky", "leaky", "custom.ops", 1),
    )
    assert s.has_custom_ops and s.custom_op_names == ["custom_relu", "custom_gelu", "leaky"]
    assert s.get("custom_ops")[1] == {
        "paddle_op": "custom_gelu",
        "popart_op": "Gelu",
        "domain": "my.ops",
        "version": 2,
    }
    with pytest.raises(OptionError, match="custom_op keys must be"):
        s.set_options({"custom_op": {"paddle_op": "x", "opset": 1}})


def test_patterns(s: IpuStrategy) -> None:
    assert s.is_pattern_enabled("PreUniRepl")
    assert not s.is_pattern_enabled("TiedGather")
    s.disable_pattern("PreUniRepl")
    s.enable_pattern("TiedGather")
    assert not s.is_pattern_enabled("PreUniRepl") and s.is_pattern_enabled("TiedGather")
    assert s.patterns == {"PreUniRepl": False, "TiedGather": True}
    with pytest.raises(OptionTypeError):
        s.enable_pattern("")


def test_popart_options_use_popart_spelling(s: IpuStrategy) -> None:
    s.set_options(
        {
            "enable_engine_caching": True,
            "cache_path": "./cache",
            "num_io_tiles": 32,
            "batch_serialization_settings.factor": 2,
            "accumulate_outer_fragment": {2: [0]},
        }
    )
    popart = popart_options(s.values(), s.explicit_options())
    assert popart["enableEngineCaching"] is True and popart["cachePath"] == "./cache"
    assert popart["numIOTiles"] == 32
    assert popart["batchSerializationSettings.factor"] == 2
    assert popart["accumulateOuterFragmentSettings"] == {
        "schedule": 2,
        "excludedVirtualGraphs": [0],
    }
    assert "is_training" not in popart and "enableFloatingPointChecks" not in popart
    everything = popart_options(s.values(), s.explicit_options(), include_defaults=True)
    assert everything["enableFloatingPointChecks"] is False
    assert everything["timeLimitScheduler"] == 1e9
    assert all("_" not in key for key in everything)
    passed = {popart_name(o) for o in OPTIONS.values() if o.passthrough and o.derived is None}
    assert set(everything) == passed - {"compilationProgressLogger"}


def test_need_compile_follows_paddle2(s: IpuStrategy) -> None:
    s.need_compile = False
    s.set_options({"lr": 0.1})
    assert not s.need_compile
    s.set_options({"lr": 0.1, "num_ipus": 2})
    assert s.need_compile


def test_copy_is_independent(s: IpuStrategy) -> None:
    s.set_options({"engine_options": {"a": "1"}, "num_ipus": 2})
    s.enable_pattern("X")
    clone = s.copy()
    clone.set_options({"engine_options": {"b": "2"}, "num_ipus": 4})
    clone.disable_pattern("X")
    assert s.get("engine_options") == {"a": "1"} and s.num_ipus == 2
    assert s.is_pattern_enabled("X")
    assert clone.get("engine_options") == {"a": "1", "b": "2"} and clone.num_ipus == 4


def test_repr_shows_changed_options(s: IpuStrategy) -> None:
    s.set_options({"enable_fp16": True, "num_ipus": 2})
    text = repr(s)
    assert text.startswith("IpuStrategy(num_ipus=2, is_training=True")
    assert "enable_fp16=True" in text and "tiles_per_ipu" not in text
    assert s.changed_options() == {"enable_fp16": True, "num_ipus": 2}


def test_resolved_backend(s: IpuStrategy, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def fake(found: bool) -> Any:
        return lambda name, *a: (
            (object() if found else None) if name == "popart" else (real_find_spec(name, *a))
        )

    monkeypatch.setattr(importlib.util, "find_spec", fake(False))
    assert s.resolved_backend() == "host"
    monkeypatch.setattr(importlib.util, "find_spec", fake(True))
    assert s.resolved_backend() == "popart"
    s.set_options({"backend": "HOST"})
    assert s.get("backend") == "host" and s.resolved_backend() == "host"


# --- host backend classification -----------------------------------------------------


HOST = backends.support("host")


def _check_host(s: IpuStrategy) -> None:
    backends.check_support("host", SessionConfig(options=s.values(), explicit=s.explicit_options()))


def test_every_option_is_classified_and_documented() -> None:
    for name, spec in OPTIONS.items():
        assert HOST.status(name) in ("honoured", "ignored", "unsupported")
        assert spec.doc.endswith((".", ")")), name
        if HOST.status(name) != "honoured":
            assert HOST.note(name), name
    assert set(HOST.ignored) | set(HOST.unsupported) <= set(OPTIONS)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("is_training", "honoured"),
        ("batches_per_step", "honoured"),
        ("accumulation_factor", "honoured"),
        ("replicated_graph_count", "honoured"),
        ("runtime_options.enable_eval", "honoured"),
        ("timeout_ms", "honoured"),
        ("num_buffers", "honoured"),
        ("enable_model_runtime_executor", "honoured"),
        ("use_no_bias_optimizer", "honoured"),
        ("enable_stochastic_rounding", "honoured"),
        ("enable_floating_point_checks", "honoured"),
        ("enable_half_partial", "honoured"),
        ("anchor_return_type", "honoured"),
        ("tiles_per_ipu", "ignored"),
        ("enable_engine_caching", "ignored"),
        ("cache_path", "ignored"),
        ("log_dir", "ignored"),
        ("available_memory_proportion", "honoured"),
        ("enable_manual_shard", "honoured"),
        ("location_optimizer", "honoured"),
        ("location_activation", "ignored"),
        ("synthetic_data_mode", "unsupported"),
        ("accl1_type", "unsupported"),
        ("custom_ops", "unsupported"),
        ("enable_distribution", "honoured"),
        ("automatic_loss_scaling_settings.enabled", "unsupported"),
    ],
)
def test_host_support(name: str, expected: str) -> None:
    assert HOST.status(name) == expected


def test_check_host_support(s: IpuStrategy) -> None:
    s.set_options({"tiles_per_ipu": 1216, "enable_engine_caching": True, "enable_fp16": True})
    _check_host(s)  # ignored and honoured options pass
    s.set_options({"accl1_type": "FLOAT16", "accumulation_and_replication_reduction_type": 2})
    s.add_custom_op("my_op")
    with pytest.raises(NotSupportedError) as info:
        _check_host(s)
    message = str(info.value)
    assert "accl1_type='FLOAT16'" in message and "custom_ops=" in message
    assert "NoReduction" in message and "tiles_per_ipu" not in message


# --- docs and API hygiene --------------------------------------------------------------


def test_docs_table_lists_every_option() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "strategy.md").read_text()
    missing = [name for name in OPTIONS if f"`{name}`" not in text]
    assert not missing


def test_public_methods_have_docstrings() -> None:
    for name, member in inspect.getmembers(IpuStrategy):
        if name.startswith("_"):
            continue
        target = member.fget if isinstance(member, property) else member
        assert inspect.getdoc(target), name


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=-(2**65), max_value=2**65))
def test_uint64_range_property(value: int) -> None:
    s = IpuStrategy()
    if 1 <= value <= 2**64 - 1:
        s.set_options({"micro_batch_size": value})
        assert s.micro_batch_size == value
    else:
        with pytest.raises(OptionError):
            s.set_options({"micro_batch_size": value})
        assert s.micro_batch_size == 1
