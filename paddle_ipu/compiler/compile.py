"""compile_program: a Paddle static program -> CompiledModel (forward ONNX + specs)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import onnx

from paddle_ipu.compiler.lowering import check_opset, export_onnx
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.compiler.ops import check_supported
from paddle_ipu.compiler.postprocess import finalize
from paddle_ipu.compiler.reader import reader_for
from paddle_ipu.errors import CompileError, NotSupportedError, OptionError


def _scratch_dir() -> str | None:
    # tmpfs keeps the save/convert round trip in memory.
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def compile_program(
    program: Any,
    feed_list: Sequence[Any],
    fetch_list: Sequence[Any],
    *,
    scope: Any = None,
    micro_batch_size: int = 1,
    opset: int | None = None,
    enable_manual_shard: bool = False,
    enable_pipelining: bool = False,
    onnx_dump_path: str = "",
    enable_fp16: bool = False,
    isolate: bool = True,
) -> CompiledModel:
    """Compile the forward part of ``program`` into one ONNX graph.

    Args:
        program: a PIR ``paddle.static.Program``; it is not modified.
        feed_list: the feeds, as data op names or the ``pir.Value`` of
            ``paddle.static.data``; they become the graph inputs, in this order.
        fetch_list: the fetches, as ``pir.Value`` or names (of data ops,
            parameters, or fetch ops already in the program); they become the
            graph outputs, in this order.  Everything they do not depend on
            (backward, optimizer) is dropped.
        scope: the scope holding the parameter values (default: the global scope).
        micro_batch_size: the size given to a ``-1`` batch dimension.
        opset: the ONNX opset (7..21); None picks 13, raised automatically when
            an operator needs a newer one.
        enable_manual_shard: put ``__ipu_number`` on nodes from the operators'
            ipu_index (see :func:`ipu_shard_guard`).
        enable_pipelining: put ``__pipeline_stage`` on nodes from ipu_stage;
            needs ``enable_manual_shard``.
        onnx_dump_path: when set, the compiled model is also written there.
        enable_fp16: not supported by this compiler; the executor converts.
        isolate: run the converter in a child process (keep True; False is for
            debugging the converter itself).

    Raises:
        UnsupportedOpError: the forward graph uses operators that do not lower;
            the message names all of them and where they are used.
        CompileError: anything else that stops the lowering, including a crash
            of the converter (which never takes the calling process down).
    """
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int):
        raise OptionError(f"micro_batch_size must be an int >= 1, got {micro_batch_size!r}")
    if micro_batch_size < 1:
        raise OptionError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if enable_pipelining and not enable_manual_shard:
        raise OptionError("enable_pipelining needs enable_manual_shard")
    if enable_fp16:
        raise NotSupportedError(
            "compile_program(enable_fp16=True) is not supported: compile in fp32; "
            "the fp16 conversion is done after compiling"
        )
    requested = check_opset(opset)
    with _static_mode():
        return _compile(
            program,
            feed_list,
            fetch_list,
            scope=scope,
            micro_batch_size=micro_batch_size,
            requested=requested,
            auto_upgrade=opset is None,
            enable_manual_shard=enable_manual_shard,
            enable_pipelining=enable_pipelining,
            onnx_dump_path=onnx_dump_path,
            isolate=isolate,
        )


@contextlib.contextmanager
def _static_mode() -> Iterator[None]:
    """Paddle's static-graph APIs refuse to run in dygraph mode; a program can be
    compiled from either."""
    import paddle

    dynamic = paddle.in_dynamic_mode()
    if dynamic:
        paddle.enable_static()
    try:
        yield
    finally:
        if dynamic:
            paddle.disable_static()


def _compile(
    program: Any,
    feed_list: Sequence[Any],
    fetch_list: Sequence[Any],
    *,
    scope: Any,
    micro_batch_size: int,
    requested: int,
    auto_upgrade: bool,
    enable_manual_shard: bool,
    enable_pipelining: bool,
    onnx_dump_path: str,
    isolate: bool,
) -> CompiledModel:
    reader = reader_for(program)
    fg = reader.read(program, list(feed_list), list(fetch_list), scope)
    check_supported(info.use for info in fg.ops)

    with tempfile.TemporaryDirectory(prefix="paddle_ipu_", dir=_scratch_dir()) as tmp:
        model_path, params_path = fg.write_inference_model(tmp)
        raw = export_onnx(
            model_path,
            params_path,
            requested,
            auto_upgrade=auto_upgrade,
            log_path=os.path.join(tmp, "convert.log"),
            isolate=isolate,
        )
    try:
        model = onnx.load_from_string(raw)
    except Exception as exc:
        raise CompileError(f"the converter returned an unreadable ONNX model: {exc}") from exc

    inputs, outputs, weights, shards = finalize(
        model,
        fg,
        micro_batch_size=micro_batch_size,
        manual_shard=enable_manual_shard,
        pipelining=enable_pipelining,
    )
    actual_opset = next(
        (int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), requested
    )
    compiled = CompiledModel(
        onnx=model.SerializeToString(),
        inputs=inputs,
        outputs=outputs,
        weights=weights,
        micro_batch_size=micro_batch_size,
        opset=actual_opset,
        shards=shards,
        source_ops=[info.type for info in fg.ops],
    )
    if onnx_dump_path:
        compiled.save_model_proto(onnx_dump_path)
    return compiled
