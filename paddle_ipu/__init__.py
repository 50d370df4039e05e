"""paddle-ipu: Graphcore IPU support for stock PaddlePaddle 3.x wheels.

``import paddle`` alone registers the "ipu" device (Paddle loads the plugin this
package installs).  ``import paddle_ipu`` adds the IPU programming API of Paddle
2.x -- IpuStrategy, IpuCompiledProgram, ipu_shard_guard, set_ipu_shard -- over two
backends: ``popart`` (the Poplar SDK, when importable) and ``host`` (an emulated
IPU on the CPU, the default).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys as _sys
from typing import Any

from paddle_ipu._internals import paddle_logs as _paddle_logs
from paddle_ipu._util.env import env_flag
from paddle_ipu._util.versions import check_paddle_version
from paddle_ipu._version import __version__
from paddle_ipu.errors import (
    BackendError,
    BackendUnavailableError,
    CheckpointError,
    CompileError,
    DeviceError,
    DistributedError,
    FeedError,
    FetchError,
    IpuError,
    NotSupportedError,
    OptionError,
    PaddleVersionError,
    PrivateApiError,
    UnsupportedOpError,
)


def _preload_poplar_sdk() -> None:
    # popart refuses to import once onnx is imported (popart/__init__.py.in), and
    # the compiler imports onnx: where the Poplar SDK is installed, load it first.
    import importlib.util
    import sys

    if "popart" in sys.modules or "onnx" in sys.modules:
        return
    try:
        if importlib.util.find_spec("popart") is not None:
            importlib.import_module("popart")
    except Exception:  # the popart backend's available() reports why
        return


_preload_poplar_sdk()

# An import of the user's (not the one paddle-ipu's import hook does in every Paddle
# process) keeps Paddle's log lines and warnings from the user: see
# paddle_ipu._internals.paddle_logs (PADDLE_IPU_PADDLE_LOGS=1 shows them).
_hook = _sys.modules.get("_paddle_ipu_autoload")
_BY_USER = not getattr(_hook, "loading_paddle_ipu", False)
if _BY_USER:
    _paddle_logs.quiet_paddle_warnings()
_paddle = importlib.import_module("paddle")
if _BY_USER:
    _paddle_logs.quiet_paddle()

# The compiled core records the Paddle it was built with.
try:
    from paddle_ipu import _core
except ImportError as _exc:
    import os as _os

    raise ImportError(
        f"paddle_ipu's compiled core is missing ({_exc}). This happens when paddle_ipu is "
        f"imported from its source tree ({_os.path.dirname(_os.path.dirname(__file__))}) "
        "instead of the installed package: install it with `pip install .` and run Python "
        "from another directory."
    ) from None
check_paddle_version(_paddle.__version__, _core.paddle_version)

# The ipu kernels of Paddle's eager data transforms (paddle_ipu.device.register_kernels),
# and Paddle's launcher kept on its CPU jobs (see paddle_process.hide_ipu_from_launcher).
importlib.import_module("paddle_ipu.device").register_kernels()
_paddle_process = importlib.import_module("paddle_ipu._internals.paddle_process")
_paddle_process.explain_ipu_refusals()
_paddle_process.keep_custom_place_on_load()
if not env_flag("PADDLE_IPU_DEFAULT_DEVICE", False):
    _paddle_process.hide_ipu_from_launcher()

# exe.run of compiled programs, and of plain programs on the ipu place (see
# paddle_ipu.frontends.run_hook; uninstall_hooks() undoes it).
_patch = importlib.import_module("paddle_ipu.frontends.run_hook")
_patch.install()


def uninstall_hooks() -> None:
    """Give ``paddle.static.Executor.run`` back Paddle's own method: compiled programs
    then run through Paddle's executor, and plain programs on the ipu place are no
    longer compiled implicitly.  ``install_hooks()`` puts the routing back."""
    _patch.uninstall()


def install_hooks() -> None:
    """Route ``paddle.static.Executor.run`` through paddle_ipu (done at import)."""
    _patch.install()


# Paddle 2.x's IPU names (paddle.static.IpuStrategy, paddle.IPUPlace, ...; see
# paddle_ipu.compat; paddle_ipu.compat.disable() restores Paddle's own).
if env_flag("PADDLE_IPU_COMPAT", True):
    importlib.import_module("paddle_ipu.compat").install()
# Paddle 2.x's dy2static front door attaches IpuStrategy.register_patch / release_patch.
importlib.import_module("paddle_ipu.frontends.dy2static")

# Public names provided by submodules, imported on first use so that
# `import paddle_ipu` stays cheap.
_LAZY = {
    "IpuStrategy": "paddle_ipu.strategy",
    "IpuCompiledProgram": "paddle_ipu.frontends.program",
    "IpuExecutor": "paddle_ipu.executor.ipu_executor",
    "ModelRuntime": "paddle_ipu.serving.model_runtime",
    "ipu_shard_guard": "paddle_ipu.compiler",
    "set_ipu_shard": "paddle_ipu.compiler",
    "supported_ops": "paddle_ipu.compiler",
    "custom_ops": "paddle_ipu.compiler.custom_ops",
    "register_custom_op": "paddle_ipu.compiler.custom_ops",
    "compile_program": "paddle_ipu.compiler",
    "memory_report": "paddle_ipu.compiler.memory",
    "available_backends": "paddle_ipu.backends",
    "inference_model": "paddle_ipu.frontends.dygraph",
    "training_model": "paddle_ipu.frontends.dygraph",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        # A public submodule (paddle_ipu.inference, paddle_ipu.serving, ...) is an
        # attribute too, imported on first use.
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'paddle_ipu' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "CheckpointError",
    "CompileError",
    "DeviceError",
    "DistributedError",
    "FeedError",
    "FetchError",
    "IpuError",
    "NotSupportedError",
    "OptionError",
    "PaddleVersionError",
    "PrivateApiError",
    "UnsupportedOpError",
    "__version__",
    "install_hooks",
    "uninstall_hooks",
    *_LAZY,
]


def __dir__() -> list[str]:
    # The lazily imported public names are listed before their first use too.
    return sorted(set(globals()) | set(__all__))
