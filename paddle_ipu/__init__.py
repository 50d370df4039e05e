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

# What paddle-ipu changes in the process is listed, and applied, in one place:
# paddle_ipu.patches (paddle-ipu info shows it).  An import of the user's (not the one
# paddle-ipu's import hook does in every Paddle process) keeps Paddle's log lines and
# warnings from the user (PADDLE_IPU_PADDLE_LOGS=1 shows them).
_patches = importlib.import_module("paddle_ipu.patches")
_hook = _sys.modules.get("_paddle_ipu_autoload")
_BY_USER = not getattr(_hook, "loading_paddle_ipu", False)
_patches.apply_at_import(_BY_USER, before_paddle=True)
_paddle = importlib.import_module("paddle")

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
_patches.apply_at_import(_BY_USER, before_paddle=False)


def uninstall_hooks() -> None:
    """Give ``paddle.static.Executor.run`` back Paddle's own method: compiled programs
    then run through Paddle's executor, and plain programs on the ipu place are no
    longer compiled implicitly.  ``install_hooks()`` puts the routing back."""
    _patches.undo("exe.run")


def install_hooks() -> None:
    """Route ``paddle.static.Executor.run`` through paddle_ipu (done at import)."""
    _patches.apply("exe.run")


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
