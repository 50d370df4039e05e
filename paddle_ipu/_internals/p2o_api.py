"""paddle2onnx's private interfaces, as paddle-ipu uses them (checked on 2.1.0).

- ``paddle2onnx_cpp2py_export.export``: the converter's C++ entry point, called with its
  13 positional arguments.  The public ``paddle2onnx.export`` wraps it, but logs and
  swallows the converter's errors, converts legacy models through temporary files and
  can run an optimiser; it is the fallback when the binding's signature changes.
- ``paddle2onnx_cpp2py_export.get_all_supported_operators_pir``: the converters it has.
- The converter's naming of operator results, ``p2o.<op>.<k>.<j>`` (the j-th result of
  the k-th operator of that type, in program order): the compiler uses it to map ONNX
  nodes back to Paddle operators (shard placement, rewrites).  No public interface
  exposes that mapping; the probe converts a small program and checks the scheme.
"""

from __future__ import annotations

import re
from typing import Any

from paddle_ipu._internals import broken, fallback_used, interface, paddle_api, signature_of

CHECKED_ON = "2.1.0"
_DEP = "paddle2onnx"

# export(model: str, params: str, opset: int, auto_upgrade: bool, verbose: bool,
#        checker: bool, experimental: bool, optimize: bool, custom_ops: dict[str, str],
#        backend: str, calibration: str, external_file: str, fp16: bool) -> bytes
_EXPORT_SIGNATURE = re.compile(
    r"^export\(arg0: str, arg1: str, arg2: int, arg3: bool, arg4: bool, arg5: bool, "
    r"arg6: bool, arg7: bool, arg8: \S*\[str, str\], arg9: str, arg10: str, arg11: str, "
    r"arg12: bool\) -> bytes$",
    re.IGNORECASE,
)
_warned = False


def converter() -> Any:
    """The converter's binding module.  Its package import can call ``sys.exit`` from
    its logger; that becomes a RuntimeError here."""
    try:
        from paddle2onnx import paddle2onnx_cpp2py_export as p2o
    except BaseException as exc:  # SystemExit included
        raise RuntimeError(f"paddle2onnx is not usable: {exc!r}") from None
    return p2o


def export(model: str, params: str, opset: int, auto_upgrade: bool) -> bytes:
    """Convert a saved PIR inference model to ONNX bytes: no verbose output, the ONNX
    checker on, experimental converters allowed, no graph optimisation (every parameter
    stays a Constant the compiler can map back to its name), no fp16."""
    global _warned
    p2o = converter()
    signature = signature_of(getattr(p2o, "export", None))
    if _EXPORT_SIGNATURE.match(signature):
        return bytes(
            p2o.export(
                model,
                params,
                opset,
                auto_upgrade,
                False,  # verbose
                True,  # run the ONNX checker
                True,  # experimental ops
                False,  # graph optimisation
                {},  # custom ops
                "onnxruntime",
                "",  # calibration file
                "",  # external data file
                False,  # fp16 export
            )
        )
    if not _warned:
        _warned = True
        fallback_used(
            _DEP,
            "paddle2onnx_cpp2py_export.export",
            f"has signature {signature!r}",
            "paddle2onnx.export",
        )
    import paddle2onnx

    raw = paddle2onnx.export(
        model,
        params,
        save_file=None,
        opset_version=opset,
        auto_upgrade_opset=auto_upgrade,
        verbose=False,
        enable_onnx_checker=True,
        enable_experimental_op=True,
        enable_optimize=False,
        deploy_backend="onnxruntime",
        export_fp16_model=False,
    )
    if not isinstance(raw, bytes):
        raise RuntimeError("paddle2onnx.export returned no model (its log says why)")
    return raw


def supported_ops() -> frozenset[str]:
    """The converter names paddle2onnx registers for PIR programs."""
    try:
        names = converter().get_all_supported_operators_pir()
    except AttributeError as exc:
        raise broken(
            _DEP, "get_all_supported_operators_pir()", CHECKED_ON, f"is missing ({exc})"
        ) from None
    return frozenset(str(name) for name in names)


def result_name(op_name: str, k: int, j: int) -> str:
    """The ONNX name the converter gives result ``j`` of the ``k``-th ``op_name``
    operator of a program (``op_name`` as PIR spells it: ``pd_op.relu``)."""
    return f"p2o.{op_name}.{k}.{j}"


@interface(_DEP, "paddle2onnx_cpp2py_export.export", "compile", fallback="paddle2onnx.export")
def _probe_export() -> str:
    import os
    import tempfile

    import onnx
    import paddle

    signature = signature_of(converter().export)
    assert _EXPORT_SIGNATURE.match(signature), f"signature changed: {signature}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        paddle_api.probe_mode(static=True),
        paddle.pir_utils.IrGuard(),
    ):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [2, 3], "float32")
            w = paddle.static.create_parameter([3, 3], "float32", name="probe_w")
            y = paddle.nn.functional.relu(paddle.scale(paddle.matmul(x, w), 2.0))
            z = paddle.nn.functional.relu(paddle.scale(y, 3.0))
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        prefix = os.path.join(tmp, "probe")
        paddle.static.save_inference_model(prefix, [x], [z], exe, program=main)
        raw = export(prefix + ".json", prefix + ".pdiparams", 13, True)
    model = onnx.load_model_from_string(raw)
    produced = {out for node in model.graph.node for out in node.output}
    expected = {result_name("pd_op.scale", k, 0) for k in (0, 1)} | {
        result_name("pd_op.matmul", 0, 0),
        result_name("pd_op.relu", 0, 0),
    }
    missing = sorted(expected - produced)
    assert not missing, f"the result naming changed: {missing} not in {sorted(produced)}"
    return f"{signature}; results named p2o.<op>.<k>.<j>"


@interface(_DEP, "paddle2onnx_cpp2py_export.get_all_supported_operators_pir", "op support")
def _probe_supported() -> str:
    names = supported_ops()
    assert {"relu", "matmul_v2", "conv2d"} <= names, sorted(names)[:20]
    return f"{len(names)} converters"
