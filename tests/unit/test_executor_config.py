"""The typed boundaries into the executor and the backends: IpuStrategy.executor_config()
(made and checked once; the executor and the model runtime read nothing else of the
strategy) and SessionConfig's options (every name checked against the option table)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import paddle_ipu
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.errors import OptionError, UnknownOptionError
from paddle_ipu.executor.config import ExecutorConfig, RunTimeOptions

PACKAGE = Path(paddle_ipu.__file__).parent


def test_the_config_is_the_strategys_settings_typed() -> None:
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(num_ipus=2, is_training=True, micro_batch_size=4)
    s.set_pipelining_config(
        enable_pipelining=False, batches_per_step=6, enable_gradient_accumulation=True,
        accumulation_factor=3,
    )  # fmt: skip
    s.set_options({"anchor_return_type": "EVERYN", "anchor_return_period": 3, "random_seed": 7})
    s.set_options({"enable_model_runtime_executor": False, "host_num_threads": 2})
    c = s.executor_config()
    assert isinstance(c, ExecutorConfig)
    assert (c.is_training, c.micro_batch_size, c.random_seed, c.host_num_threads) == (
        True, 4, 7, 2,
    )  # fmt: skip
    assert (c.layout.batches_per_step, c.layout.accumulation_factor) == (6, 3)
    assert (c.anchor.kind, c.anchor.period) == ("EVERYN", 3)
    assert c.options.value("num_ipus") == 2 and "random_seed" in c.explicit
    # inference: one micro-batch per step whatever the accumulation factor says
    s.set_graph_config(is_training=False)
    assert s.executor_config().layout.accumulation_factor == 1


def test_the_config_is_checked_when_it_is_made() -> None:
    s = paddle_ipu.IpuStrategy()
    s.set_pipelining_config(batches_per_step=4)
    s.set_options({"anchor_return_type": "EVERYN", "anchor_return_period": 3})
    with pytest.raises(OptionError, match=r"anchor_return_period.*must divide batches_per_step"):
        s.executor_config()
    with pytest.raises(OptionError, match="batches_per_step must be an integer >= 1"):
        ExecutorConfig(
            backend="host", is_training=False, enable_fp16=False, batches_per_step=0,
            accumulation_factor=1, replication_factor=1, micro_batch_size=1,
            anchor_return_type="ALL", anchor_return_period=1, random_seed=None,
            host_num_threads=0, gradient_reduction="mean",
        )  # fmt: skip


def test_the_options_a_run_reads_follow_the_strategy() -> None:
    """Paddle 2.x changed lr and eval mode on a compiled program's strategy between runs."""
    s = paddle_ipu.IpuStrategy()
    c = s.executor_config()
    assert c.run_time() == RunTimeOptions(lr=None, enable_eval=False)
    s.set_options({"runtime_options.enable_eval": True, "lr": 0.5})
    assert c.run_time() == RunTimeOptions(lr=0.5, enable_eval=True)


def test_session_options_are_checked_against_the_option_table() -> None:
    config = SessionConfig(options={"num_ipus": 2}, explicit=frozenset({"num_ipus"}))
    assert config.option("num_ipus") == 2 and config.changed("num_ipus")
    assert config.option("tiles_per_ipu") == 4 and not config.changed("tiles_per_ipu")
    with pytest.raises(UnknownOptionError, match=r"'num_ipu'.*did you mean 'num_ipus'"):
        SessionConfig(options={"num_ipu": 2})
    with pytest.raises(UnknownOptionError, match="num_ipu"):
        config.options = {"num_ipu": 2}  # type: ignore[assignment]
    with pytest.raises(UnknownOptionError, match="num_ipu"):
        config.option("num_ipu")


def test_the_executor_and_the_model_runtime_read_no_strategy() -> None:
    """They read the ExecutorConfig, not an IpuStrategy's options by name."""
    found = []
    for path in (
        PACKAGE / "executor" / "ipu_executor.py",
        PACKAGE / "serving" / "model_runtime.py",
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "strategy":
                found.append(f"{path.name}: {ast.unparse(node)}")
    assert not found, found
