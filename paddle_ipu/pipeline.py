"""The one pipeline entry: every compile of a Paddle program goes through here.

``compile_executor(program, scope, strategy, feeds, fetches)`` turns a Paddle program
into a prepared :class:`~paddle_ipu.executor.IpuExecutor`: the legacy IR translated to
PIR, the compile (:func:`paddle_ipu.compiler.compile_program`), the training part
(loss, optimizer, the program the host backend builds its gradients from), then the
executor over a backend session (:func:`paddle_ipu.executor.executor_for`, which a
model compiled earlier -- a package -- reaches directly).  :func:`compile_model` is the
compile alone, for a saved inference model that is packaged rather than run.  Compiles
are serialised process-wide by :data:`compile_lock` (Paddle's static-graph state is not
thread-safe) and report progress as a percentage.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from paddle_ipu._internals import paddle_logs
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.executor.ipu_executor import IpuExecutor, executor_for

#: serialises compiles process-wide (Paddle's static-graph state is not thread-safe)
compile_lock = threading.RLock()


def compile_executor(
    program: Any,
    scope: Any,
    strategy: Any,
    feed_list: list[Any],
    fetch_list: list[Any],
    progress: Callable[[int], None] | None = None,
) -> IpuExecutor:
    """Compile ``program`` for ``strategy`` and prepare an executor over it (the
    part of a compile that IpuCompiledProgram and implicit compiles share)."""
    from paddle_ipu.compiler.legacy_reader import is_legacy, pir_mode

    paddle_logs.quiet_paddle()
    if is_legacy(program):
        # A legacy-IR program is translated to PIR by Paddle's own translator and
        # compiled as PIR (paddle_ipu.compiler.legacy_reader); Paddle's static APIs
        # must be in PIR mode meanwhile (a process-wide switch: compiles are
        # serialised by the compile lock).
        from paddle_ipu.compiler.legacy_reader import translate

        with compile_lock, pir_mode():
            t = translate(program, feed_list, fetch_list)
            return _compile_executor(
                t.program, scope, strategy, t.feed_list, t.fetch_list, progress, t.fetch_names
            )
    return _compile_executor(program, scope, strategy, feed_list, fetch_list, progress)


def _compile_executor(
    program: Any,
    scope: Any,
    strategy: Any,
    feed_list: list[Any],
    fetch_list: list[Any],
    progress: Callable[[int], None] | None = None,
    fetch_names: list[str] | None = None,
) -> IpuExecutor:
    from paddle_ipu.compiler import compile_program

    report = progress or (lambda _percent: None)
    s = strategy
    with compile_lock:
        report(0)
        model = compile_program(
            program,
            feed_list,
            fetch_list,
            scope=scope,
            micro_batch_size=int(s.micro_batch_size),
            enable_manual_shard=bool(s.enable_manual_shard),
            enable_pipelining=bool(s.enable_pipelining),
            onnx_dump_path=str(s.get("onnx_dump_path") or ""),
        )
        if fetch_names:
            # Outputs the user named (legacy variable names) are fetched by them.
            model = dataclasses.replace(
                model,
                outputs=[
                    dataclasses.replace(spec, paddle_name=name) if name else spec
                    for spec, name in zip(model.outputs, fetch_names)
                ],
            )
        report(40)
        source = None
        if s.is_training:
            from paddle_ipu.compiler.training import attach_training

            model, source = attach_training(
                model,
                program,
                fetch_list,
                scope=scope,
                loss_scaling=float(s.get("loss_scaling")),
            )
        executor = executor_for(
            model,
            s,
            scope,
            lr_scheduler=getattr(program, "lr_scheduler", None),
            training_source=source,
            prepare=False,
        )
        report(60)
        executor.prepare()
        report(90)
        return executor


def compile_model(
    program: Any, feed_list: Sequence[Any], fetch_list: Sequence[Any], **options: Any
) -> CompiledModel:
    """:func:`paddle_ipu.compiler.compile_program` under the compile lock (the compile
    of a saved inference model into a package: no executor)."""
    from paddle_ipu.compiler import compile_program

    paddle_logs.quiet_paddle()
    with compile_lock:
        return compile_program(program, list(feed_list), list(fetch_list), **options)


def progress_reporter(logger: Any, total: int) -> Any:
    """Compile progress as ``logger(progress, total)`` (the strategy's
    compilation_progress_logger and compilation_progress_total), or debug log
    lines without a logger.  ``report`` takes a percentage."""
    import logging

    log = logging.getLogger("paddle_ipu")

    def report(percent: int) -> None:
        progress = total * percent // 100
        if logger is None:
            log.debug("compiling: %d/%d", progress, total)
        else:
            logger(progress, total)

    return report
