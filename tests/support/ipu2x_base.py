"""A test base in the style of Paddle 2.x's test/ipu, written against the 2.x names.

A case builds its program with ``paddle.static`` and names its feeds and fetches
as 2.x code did (``x.name``, ``out.name``).  ``run_modes`` runs it three ways:

- ``cpu``: Paddle's own executor on the CPU (the oracle), fetching by the names;
- ``ipu``: ``paddle.static.IpuCompiledProgram(...).compile(feed_list, fetch_list)``
  on ``paddle.IPUPlace()``, float32;
- ``ipu_fp16``: the same after the 2.x fp16 flow
  (``paddle.static.amp.cast_model_to_fp16`` + ``cast_parameters_to_fp16``,
  ``set_precision_config(enable_fp16=True)``, float16 feeds).

and ``check`` compares the IPU runs with the CPU run (fp32 rtol 1e-5, fp16 1e-2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle

import paddle_ipu  # noqa: F401  (the 2.x names)
from support.helpers import fresh_programs

SEED = 2021
MODES = ("cpu", "ipu", "ipu_fp16")


@dataclass
class Built:
    feed_list: list[str]
    fetch_list: list[str]
    main: Any
    startup: Any
    scope: Any
    extra: dict[str, Any] = field(default_factory=dict)


def static_graph(build: Callable[..., tuple[list[str], list[str]]], *args: Any) -> Built:
    """Run ``build`` in fresh programs and scope (2.x's ``static_graph`` decorator)."""
    with fresh_programs(SEED) as (main, startup, scope):
        feed_list, fetch_list = build(*args)
    return Built(list(feed_list), list(fetch_list), main, startup, scope)


def cast_model_to_fp16(main: Any) -> None:
    """The 2.x op tests' fp16 cast, spelled as they spelled it."""
    amp_list = paddle.static.amp.CustomOpLists()
    amp_list.unsupported_list = {"scale"}
    names = paddle.static.amp.cast_model_to_fp16(main, amp_list, use_fp16_guard=False)
    paddle.static.amp.cast_parameters_to_fp16(paddle.CPUPlace(), main, to_fp16_var_names=names)


def run_mode(
    mode: str,
    build: Callable[..., tuple[list[str], list[str]]],
    feed: dict[str, np.ndarray],
    *,
    is_training: bool = False,
    steps: int = 1,
    configure: Callable[[Any], None] | None = None,
    args: tuple[Any, ...] = (),
) -> list[list[np.ndarray]]:
    """One mode's results, a list (per step) of the fetched arrays."""
    built = static_graph(build, *args)
    with paddle.static.scope_guard(built.scope):
        place = paddle.CPUPlace() if mode == "cpu" else paddle.IPUPlace()
        exe = paddle.static.Executor(place)
        exe.run(built.startup)
        program: Any = built.main
        run_feed = feed
        if mode != "cpu":
            strategy = paddle.static.IpuStrategy()
            strategy.set_graph_config(is_training=is_training)
            if configure is not None:
                configure(strategy)
            if mode == "ipu_fp16":
                strategy.set_precision_config(enable_fp16=True)
                cast_model_to_fp16(built.main)
                run_feed = {
                    k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feed.items()
                }
            program = paddle.static.IpuCompiledProgram(built.main, ipu_strategy=strategy).compile(
                built.feed_list, built.fetch_list
            )
        results = []
        for _ in range(steps):
            if hasattr(program, "lr_sheduler"):
                program.lr_sheduler.step()
            out = exe.run(program, feed=run_feed, fetch_list=built.fetch_list)
            results.append([np.asarray(o) for o in out])
        if mode != "cpu":
            paddle.framework.core.IpuBackend.get_instance().reset()
    return results


def run_modes(
    build: Callable[..., tuple[list[str], list[str]]],
    feed: dict[str, np.ndarray],
    modes: tuple[str, ...] = MODES,
    **kwargs: Any,
) -> dict[str, list[list[np.ndarray]]]:
    return {mode: run_mode(mode, build, feed, **kwargs) for mode in modes}


def check(
    results: dict[str, list[list[np.ndarray]]],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    rtol_fp16: float = 1e-2,
    atol_fp16: float = 1e-2,
) -> None:
    cpu = results["cpu"]
    for mode, (r, a) in (("ipu", (rtol, atol)), ("ipu_fp16", (rtol_fp16, atol_fp16))):
        if mode not in results:
            continue
        got = results[mode]
        assert len(got) == len(cpu), mode
        for step, (want_step, got_step) in enumerate(zip(cpu, got)):
            assert len(want_step) == len(got_step), (mode, step)
            for k, (want, have) in enumerate(zip(want_step, got_step)):
                np.testing.assert_allclose(
                    np.asarray(have, np.float32).reshape(-1),
                    np.asarray(want, np.float32).reshape(-1),
                    rtol=r,
                    atol=a,
                    err_msg=f"{mode} step {step} fetch {k}",
                )
