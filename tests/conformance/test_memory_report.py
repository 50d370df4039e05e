"""Will it fit: the memory report per IPU (paddle_ipu.memory_report, `paddle-ipu compile
--report`) counts what the graph and the options say exactly, the host backend refuses a
model that does not fit at compile time, and the report agrees with the configurations
Graphcore's public examples trained (tests/conformance/published_models.py): fits
where they ran, does not fit on fewer IPUs where they needed more."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest

import paddle_ipu
from paddle_ipu.compiler import compile_program
from paddle_ipu.compiler.memory import IPU_MEMORY, MemoryReport, memory_report
from paddle_ipu.compiler.training import attach_training
from paddle_ipu.errors import IpuMemoryError

paddle.enable_static()


@pytest.fixture(autouse=True)
def _static() -> Iterator[None]:
    paddle.enable_static()
    yield


def _part(report: MemoryReport, name: str, ipu: int = 0) -> int:
    (part,) = [p for p in report.ipus[ipu].parts if p.name == name]
    return part.bytes


def _mlp(shard: bool = False) -> tuple[Any, Any, Any, int]:
    """x -> 64 -> 32 -> loss, Adam; with ``shard`` each layer a pipeline stage."""
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with (
        paddle.static.program_guard(main, startup),
        paddle.static.scope_guard(scope),
        paddle.utils.unique_name.guard(),
    ):
        x = paddle.static.data("x", [8, 16], "float32")
        with paddle_ipu.ipu_shard_guard(index=0, stage=0) if shard else nullcontext():
            h = paddle.nn.Linear(16, 64)(x)
        with paddle_ipu.ipu_shard_guard(index=1, stage=1) if shard else nullcontext():
            loss = paddle.mean(paddle.nn.Linear(64, 32)(paddle.tanh(h)))
            paddle.optimizer.Adam(0.01).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    params = 16 * 64 + 64 + 64 * 32 + 32
    return main, scope, loss, params


def _compiled(main: Any, scope: Any, loss: Any, **kw: Any) -> Any:
    model = compile_program(main, ["x"], [loss], scope=scope, micro_batch_size=8, **kw)
    return attach_training(model, main, [loss], scope=scope)[0]


def test_weights_optimizer_state_and_accumulators_are_counted_exactly() -> None:
    main, scope, loss, params = _mlp()
    model = _compiled(main, scope, loss)
    base = memory_report(model, {"is_training": True})
    assert base.training and base.fits
    assert _part(base, "weights") == 4 * params
    assert _part(base, "optimizer state") == 0  # off chip: Paddle 2.x's default
    assert _part(base, "gradients") == 4 * params
    half = memory_report(model, {"is_training": True, "enable_fp16": True})
    assert _part(half, "weights") == 2 * params
    on_chip = {"on_chip": 1, "use_replicated_tensor_sharding": 0}
    state = memory_report(model, {"is_training": True, "location_optimizer": on_chip})
    assert _part(state, "optimizer state") == 2 * 4 * params  # Adam: two float32 moments
    sixteen = memory_report(
        model,
        {"is_training": True, "location_optimizer": on_chip, "accl1_type": "FLOAT16"},
    )
    assert _part(sixteen, "optimizer state") == (2 + 4) * params
    sharded = memory_report(
        model,
        {
            "is_training": True,
            "enable_replicated_graphs": True,
            "replicated_graph_count": 2,
            "num_ipus": 2,
            "location_optimizer": {
                "on_chip": 1,
                "use_replicated_tensor_sharding": 1,
                "min_elements_for_replicated_tensor_sharding": 1,
            },
        },
    )
    assert _part(sharded, "optimizer state") == 8 * params // 2
    accumulated = memory_report(
        model,
        {"is_training": True, "enable_gradient_accumulation": True, "accumulation_factor": 4},
    )
    assert _part(accumulated, "gradient accumulators") == 4 * params
    off = memory_report(model, {"is_training": True, "location_weight": {"on_chip": 0}})
    assert _part(off, "weights") == 0


def test_pipeline_stages_have_their_ipus_and_stashes() -> None:
    main, scope, loss, _ = _mlp(shard=True)
    model = _compiled(main, scope, loss, enable_manual_shard=True, enable_pipelining=True)
    options = {
        "is_training": True,
        "num_ipus": 2,
        "enable_manual_shard": True,
        "virtual_graph_mode": 1,
        "enable_pipelining": True,
        "enable_gradient_accumulation": True,
        "accumulation_factor": 4,
    }
    report = memory_report(model, options)
    assert [i.stages for i in report.ipus] == [(0,), (1,)]
    assert _part(report, "weights", 0) == 4 * (16 * 64 + 64)
    assert _part(report, "weights", 1) == 4 * (64 * 32 + 32)
    # stage 0 of 2 stashes 2 * (2 - 1 - 0) + 1 = 3 micro-batches, the last stage none
    assert _part(report, "pipeline stashes", 1) == 0
    stash = _part(report, "pipeline stashes", 0)
    (line,) = [p.how for p in report.ipus[0].parts if p.name == "pipeline stashes"]
    assert line.startswith("3 micro-batches") and stash > 0 and stash % 3 == 0
    assert "IPU 1 (pipeline stage 1)" in report.text()


def _wide_conv(batch: int) -> tuple[Any, Any, Any]:
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with (
        paddle.static.program_guard(main, startup),
        paddle.static.scope_guard(scope),
        paddle.utils.unique_name.guard(),
    ):
        x = paddle.static.data("x", [batch, 3, 512, 512], "float32")
        out = paddle.nn.Conv2D(3, 64, 3, padding=1)(x)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, scope, out


def test_a_model_that_does_not_fit_is_refused_at_compile_time(caplog: Any) -> None:
    """A convolution's result of batch x 64 x 512 x 512 float32: 67 MB at batch 1, 4.3 GB
    at batch 64 -- more than an IPU's 940 MB."""
    for batch, fits in ((1, True), (64, False)):
        main, scope, out = _wide_conv(batch)
        s = paddle_ipu.IpuStrategy()
        s.set_graph_config(is_training=False, micro_batch_size=batch)
        s.set_options({"backend": "host"})
        cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
        if fits:
            cp.compile(["x"], [out])
            report = paddle_ipu.memory_report(cp)
            assert report.fits and _part(report, "activations") >= batch * 64 * 512 * 512 * 4
            continue
        with pytest.raises(IpuMemoryError) as info:
            cp.compile(["x"], [out])
        assert "does not fit in the memory of IPU 0" in str(info.value)
        assert "DOES NOT FIT" in str(info.value) and not info.value.report.fits
        s.set_options({"host_memory_check": "warning"})
        cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
        cp.compile(["x"], [out])  # compiles, with the report in the log
        assert "does not fit" in caplog.text
        assert paddle_ipu.memory_report(cp).ipus[0].total > IPU_MEMORY


def test_the_cli_prints_the_report(tmp_path: Path, capsys: Any) -> None:
    from paddle_ipu import cli

    main, scope, out = _wide_conv(1)
    prefix = str(tmp_path / "conv")
    with paddle.static.scope_guard(scope):
        x = next(op.result(0) for op in main.global_block().ops if op.name() == "pd_op.data")
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.static.save_inference_model(prefix, [x], [out], exe, program=main)
    package = tmp_path / "conv.pdipu"
    assert cli.main(["compile", prefix, "-o", str(package), "--no-cache", "--report"]) == 0
    printed = capsys.readouterr().out
    assert "memory per IPU (inference" in printed and "IPU 0" in printed and "fits" in printed
    assert "weights" in printed and "activations" in printed and "estimate" in printed


# -- the published configurations -----------------------------------------------------


def _published(built: Any, options: dict[str, Any], **compile_kw: Any) -> Any:
    with paddle.static.scope_guard(built.scope):
        model = compile_program(
            built.main,
            built.feeds,
            [built.loss],
            scope=built.scope,
            micro_batch_size=int(options["micro_batch_size"]),
            **compile_kw,
        )
        return attach_training(model, built.main, [built.loss], scope=built.scope)[0]


#: what the published BERT configurations share: float16 with half partials, state
#: off chip (the default), gradient accumulation, 4 replicas with replicated tensor
#: sharding, pipelining with recomputation
BERT_OPTIONS: dict[str, Any] = {
    "is_training": True,
    "enable_fp16": True,
    "partials_type_matmuls": "half",
    "enable_manual_shard": True,
    "virtual_graph_mode": 1,
    "enable_pipelining": True,
    "enable_gradient_accumulation": True,
    "enable_replicated_graphs": True,
    "replicated_graph_count": 4,
    "num_ipus": 16,
    "auto_recomputation": 3,  # Pipeline
}


@pytest.mark.slow
def test_resnet50_fits_on_one_ipu_as_graphcore_trained_it() -> None:
    from support import published_models as P

    built = P.resnet50(18)
    options = {
        "is_training": True,
        "micro_batch_size": 18,
        "enable_fp16": True,
        "partials_type_matmuls": "half",
        "enable_gradient_accumulation": True,
        "accumulation_factor": 57,
        "accl1_type": "FLOAT16",
        "location_optimizer": {"on_chip": 1, "use_replicated_tensor_sharding": 0},
        "auto_recomputation": 1,  # Standard: their recomputation checkpoints
    }
    report = memory_report(_published(built, options), options)
    assert report.fits, report.text()
    # without recomputation it does not (they checkpointed)
    assert not memory_report(_published(built, options), {**options, "auto_recomputation": 0}).fits


@pytest.mark.slow
def test_bert_base_fits_on_the_four_ipus_graphcore_used() -> None:
    from support import published_models as P

    built = P.bert(layers=12, hidden=768, heads=12, batch=32, layers_per_ipu=[0, 4, 4, 4])
    options = {**BERT_OPTIONS, "micro_batch_size": 32, "accumulation_factor": 512}
    model = _published(built, options, enable_manual_shard=True, enable_pipelining=True)
    report = memory_report(model, options)
    assert len(report.ipus) == 4 and report.fits, report.text()


@pytest.mark.slow
def test_bert_large_fits_on_four_ipus_and_not_on_one() -> None:
    from support import published_models as P

    built = P.bert(layers=24, hidden=1024, heads=16, batch=8, layers_per_ipu=[3, 7, 7, 7])
    assert 330e6 < built.params < 345e6  # BERT-Large
    options = {**BERT_OPTIONS, "micro_batch_size": 8, "accumulation_factor": 2048}
    model = _published(built, options, enable_manual_shard=True, enable_pipelining=True)
    report = memory_report(model, options)
    assert len(report.ipus) == 4 and report.fits, report.text()
    one = {**options, "enable_manual_shard": False, "virtual_graph_mode": 0,
           "enable_pipelining": False, "num_ipus": 4}  # fmt: skip
    alone = memory_report(model, one)
    assert len(alone.ipus) == 1 and not alone.fits
    assert np.sum([i.total for i in report.ipus]) < IPU_MEMORY * 4
