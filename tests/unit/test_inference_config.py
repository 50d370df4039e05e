"""paddle_ipu.inference.Config against paddle.inference.Config: every public name has a
decision (works / accepted with one log line / refused with a named error), the table
in docs/inference.md says the same, and the settings Paddle Inference scripts make are
taken as Paddle takes them.  No compile."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import paddle.inference as paddle_inference
import pytest

from paddle_ipu import inference
from paddle_ipu.errors import NotSupportedError, OptionError

ROOT = Path(__file__).resolve().parents[2]
PADDLE_NAMES = sorted(n for n in dir(paddle_inference.Config) if not n.startswith("_"))


def _paddle_config_class() -> Any:
    """Paddle's own Config class (paddle_ipu's compatibility layer subclasses it)."""
    cls = paddle_inference.Config
    return cls.__mro__[1] if cls.__module__.startswith("paddle_ipu") else cls


def test_every_name_of_paddle_inference_config_is_here_with_a_decision() -> None:
    names = sorted(n for n in dir(_paddle_config_class()) if not n.startswith("_"))
    assert len(names) >= 100  # 113 on Paddle 3.3.1
    missing = [n for n in names if not hasattr(inference.Config, n)]
    assert missing == []
    assert sorted(inference.DECISIONS) == names
    assert set(inference.DECISIONS.values()) == {"works", "no effect", "refused"}


def test_the_docs_table_lists_every_decision() -> None:
    text = (ROOT / "docs" / "inference.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (works|no effect|refused) \|", text, re.M))
    assert rows == inference.DECISIONS


@pytest.mark.parametrize("name", sorted(inference.REFUSED))
def test_refused_methods_raise_naming_themselves(name: str) -> None:
    with pytest.raises(NotSupportedError, match=rf"Config\.{name}: "):
        getattr(inference.Config(), name)()


@pytest.mark.parametrize("name", sorted(inference.NO_EFFECT))
def test_no_effect_methods_log_one_line(name: str, caplog: Any) -> None:
    config = inference.Config()
    with caplog.at_level(logging.INFO, logger="paddle_ipu"):
        getattr(config, name)()
        getattr(config, name)()
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1 and "no effect on the IPU" in lines[0]


def test_cpu_script_settings_are_taken_and_read_back(caplog: Any) -> None:
    config = inference.Config()
    assert config.cpu_math_library_num_threads() == 1 and config.ir_optim()
    with caplog.at_level(logging.INFO, logger="paddle_ipu"):
        config.enable_memory_optim()
        config.set_cpu_math_library_num_threads(4)
        config.switch_ir_optim(False)
        config.switch_use_feed_fetch_ops(False)
        config.pass_builder().delete_pass("conv_bn_fuse_pass")
    assert config.cpu_math_library_num_threads() == 4
    assert not config.ir_optim() and not config.use_feed_fetch_ops_enabled()
    assert config.pass_builder().all_passes() == []
    assert len(caplog.records) == 5  # four calls with no effect, the pass builder's edit
    with pytest.raises(OptionError, match=r"set_cpu_math_library_num_threads.*received 0"):
        config.set_cpu_math_library_num_threads(0)
    assert config.use_gpu() is False and config.tensorrt_engine_enabled() is False
    assert config.tensorrt_precision_mode() == inference.Config.Precision.Float32
    assert inference.Config.Half == paddle_inference.Config.Precision.Half


def test_model_paths_as_paddle_reports_them(tmp_path: Path) -> None:
    model, params = tmp_path / "m.json", tmp_path / "m.pdiparams"
    model.write_text("{}")
    params.write_bytes(b"")
    config = inference.Config(str(model), str(params))
    assert (config.prog_file(), config.params_file(), config.model_dir()) == (
        str(model),
        str(params),
        "",
    )
    assert config.model_prefix() == str(tmp_path / "m")
    config = inference.Config(str(tmp_path))
    assert config.model_dir() == str(tmp_path) and config.model_prefix() == str(tmp_path / "m")
    config = inference.Config()
    config.set_prog_file(str(model))
    config.set_params_file(str(params))
    assert config.model_prefix() == str(tmp_path / "m")


def test_an_empty_params_file_is_a_model_without_parameters(tmp_path: Path) -> None:
    """``Config(model_file, "")``: Paddle's Config takes it for a model that has no
    parameters (its predictor runs it); so does this one, running it as Paddle does."""
    import numpy as np
    import paddle

    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 4], "float32")
            y = x * 2.0 + 1.0
            exe = paddle.static.Executor(paddle.CPUPlace())
            paddle.static.save_inference_model(str(tmp_path / "m"), [x], [y], exe, program=main)
    finally:
        paddle.disable_static()
    model = str(tmp_path / "m.json")
    assert not (tmp_path / "m.pdiparams").exists()
    feed = np.arange(8, dtype=np.float32).reshape(2, 4)
    cpu = paddle_inference.create_predictor(paddle_inference.Config(model, ""))
    (want,) = cpu.run([paddle.to_tensor(feed)])
    config = inference.Config(model, "")
    assert (config.prog_file(), config.params_file()) == (model, "")
    config.enable_ipu()
    (got,) = inference.create_predictor(config).run([feed])
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=0)


def test_set_model_buffer_writes_the_model_files() -> None:
    config = inference.Config()
    config.set_model_buffer(b'{"program": 1}', 14, b"\x01\x02\x03", 3)
    assert config.model_from_memory()
    prefix = Path(config.model_prefix() or "")
    assert prefix.with_suffix(".json").read_bytes() == b'{"program": 1}'
    assert prefix.with_suffix(".pdiparams").read_bytes() == b"\x01\x02\x03"
    with pytest.raises(OptionError, match="size 9 for 3 bytes"):
        config.set_model_buffer(b"abc", 9, b"", 0)


def test_load_ipu_config_reads_paddles_format(tmp_path: Path) -> None:
    path = tmp_path / "ipu.txt"
    path.write_text(
        "ipu_device_num, 1\nipu_micro_batch_size,4\nipu_batches_per_step,2\n"
        "ipu_enable_fp16,True\nipu_available_memory_proportion,0.5\n"
        "ipu_enable_model_runtime_executor,1\n"
    )
    config = inference.Config()
    config.load_ipu_config(str(path))
    assert config.use_ipu()
    assert (config.micro_batch_size, config.batches_per_step) == (4, 2)
    assert config.enable_fp16 and config.enable_model_runtime_executor
    assert config.available_memory_proportion == 0.5
    path.write_text("ipu_micro_batch_sise,4\n")
    with pytest.raises(OptionError, match="unknown key 'ipu_micro_batch_sise'"):
        inference.Config().load_ipu_config(str(path))
    path.write_text("ipu_custom_ops_info,[[a,b,c,1]]\n")
    with pytest.raises(NotSupportedError, match="custom ops"):
        inference.Config().load_ipu_config(str(path))


def test_paddles_own_config_enables_the_ipu() -> None:
    """``import paddle_ipu`` lets ``paddle.inference.Config.enable_ipu()`` work (Paddle
    3.x raises "did not have the option -DWITH_IPU"); every other setting stays
    Paddle's own."""
    config = paddle_inference.Config()
    assert not config.use_ipu()
    config.set_cpu_math_library_num_threads(3)
    assert config.cpu_math_library_num_threads() == 3  # Paddle's own setter
    config.enable_ipu(ipu_micro_batch_size=2)
    config.set_ipu_config(ipu_enable_fp16=True)
    assert config.use_ipu()
    with pytest.raises(OptionError, match="ipu_batches_per_step"):
        config.enable_ipu(ipu_batches_per_step=0)


def test_strategy_options_are_checked_when_set_and_kept() -> None:
    config = inference.Config()
    config.set_ipu_strategy_options({"host_fp16_arithmetic": "float32"})
    config.set_ipu_strategy_options({"host_num_threads": 1})
    assert config.strategy_options == {"host_fp16_arithmetic": "float32", "host_num_threads": 1}
    with pytest.raises(OptionError, match="no_such_option"):
        config.set_ipu_strategy_options({"no_such_option": 1})
    with pytest.raises(OptionError, match="host_fp16_arithmetic"):
        config.set_ipu_strategy_options({"host_fp16_arithmetic": "bfloat16"})
    with pytest.raises(OptionError, match="expected a dict"):
        config.set_ipu_strategy_options([("host_num_threads", 1)])  # type: ignore[arg-type]
    assert config.strategy_options == {"host_fp16_arithmetic": "float32", "host_num_threads": 1}
