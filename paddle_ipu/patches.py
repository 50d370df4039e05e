"""What paddle-ipu changes in a Paddle process: every patch, listed once.

The plugin is loaded into every Paddle process on the machine, so what it changes
there is listed here -- what each patch touches, what it changes and why, when it
takes effect, how to keep it off and how it is undone -- and nowhere else:

- ``import hook``: applied by the ``.pth`` file at interpreter start
  (``toplevel/_paddle_ipu_autoload.py``), before paddle_ipu exists;
- ``import``: applied by :func:`apply_at_import`, which ``import paddle_ipu`` calls
  (the order below is the order they are applied in);
- ``first use``: applied by the module named, the first time a script uses what needs
  it (the IPU, a dy2static Layer, a distributed job ...), never before.

:func:`undo` takes one back (by name, or all of them), :func:`report` is what
``paddle-ipu info`` shows.  No module of paddle_ipu rewrites another's class: where a
lower layer calls a higher one it declares the interface, and this module plugs it in.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from paddle_ipu._util.env import env_flag

if TYPE_CHECKING:  # the modules the patches are applied by (imported when applied)
    from paddle_ipu import compat, device  # noqa: F401
    from paddle_ipu._internals import paddle_logs, paddle_process  # noqa: F401
    from paddle_ipu.backends.host import replica_group  # noqa: F401
    from paddle_ipu.frontends import dy2static, dygraph, run_hook  # noqa: F401

__all__ = ["PATCHES", "Patch", "apply", "apply_at_import", "report", "undo"]

When = Literal["import hook", "import", "first use"]


@dataclass(frozen=True)
class Patch:
    """One change paddle-ipu makes in a Paddle process."""

    name: str
    #: what of Paddle (or of the process) it touches
    target: str
    #: what it changes there
    changes: str
    #: why paddle-ipu makes the change
    why: str
    when: When
    #: how a user keeps it off ("": it cannot be turned off)
    off: str
    #: applies it (None: applied elsewhere: the import hook, or at first use)
    do: Callable[[], None] | None
    #: takes it back (None: it cannot be; ``why`` says so)
    undo: Callable[[], None] | None
    #: whether it is in effect in this process
    active: Callable[[], bool]


def _call(module: str, function: str, *args: Any) -> Callable[[], Any]:
    """``module.function(*args)``, the module imported when it is called."""

    def call() -> Any:
        return getattr(importlib.import_module(module), function)(*args)

    return call


def _loaded(module: str, function: str) -> Callable[[], bool]:
    """``module.function()`` (``function`` may be ``Class.method``) when the module is
    imported already, else False (a report never imports anything)."""

    def check() -> bool:
        found: Any = sys.modules.get(module)
        if found is None:
            return False
        for part in function.split("."):
            found = getattr(found, part)
        return bool(found())

    return check


def _autoload_active() -> bool:
    hook = sys.modules.get("_paddle_ipu_autoload")
    return hook is not None and env_flag("PADDLE_IPU_AUTOLOAD", True)


def _popart_first() -> None:
    # popart refuses to import once onnx is imported (popart/__init__.py.in), and the
    # compiler imports onnx: where the Poplar SDK is installed, load it first.
    import importlib.util

    if "popart" in sys.modules or "onnx" in sys.modules:
        return
    try:
        if importlib.util.find_spec("popart") is not None:
            importlib.import_module("popart")
    except Exception:  # the popart backend's available() reports why
        return


_PROCESS = "paddle_ipu._internals.paddle_process"
_LOGS = "paddle_ipu._internals.paddle_logs"

#: Every change, in the order it is applied.
PATCHES: tuple[Patch, ...] = (
    Patch(
        "import hook",
        "import paddle (site-packages/paddle_ipu_autoload.pth)",
        "takes the plugin's own start-up lines out of what Paddle's import writes to "
        "stderr; gives Paddle back the default device it has without the plugin (the "
        "CPU, or another custom device); imports paddle_ipu",
        "the plugin is in every Paddle process on the machine: a script that never asked "
        "for the IPU runs as without it, and one that runs a program on the ipu place "
        "gets it compiled as one graph without importing paddle_ipu",
        "import hook",
        "PADDLE_IPU_AUTOLOAD=0 (PADDLE_IPU_DEFAULT_DEVICE=1 keeps the ipu the default)",
        None,
        None,
        _autoload_active,
    ),
    Patch(
        "Poplar SDK first",
        "the import of popart",
        "imports popart before anything imports onnx, where the Poplar SDK is installed",
        "popart refuses to import once onnx is imported, and the compiler imports onnx",
        "import",
        "",
        _popart_first,
        None,
        lambda: "popart" in sys.modules,
    ),
    Patch(
        "Paddle's warnings",
        "Python's warnings filter",
        "ignores the warnings raised inside Paddle's modules",
        "Paddle warns about programs that did nothing wrong; applied by a user's own "
        "import paddle_ipu or use of the IPU, never by the import hook's import",
        "import",
        "PADDLE_IPU_PADDLE_LOGS=1 (or python -W / PYTHONWARNINGS)",
        _call(_LOGS, "quiet_paddle_warnings"),
        _call(_LOGS, "restore_paddle_logs"),
        _loaded(_LOGS, "quieted"),
    ),
    Patch(
        "Paddle's log level",
        "glog's FLAGS_minloglevel in libpaddle.so and libphi_core.so",
        "Paddle's INFO and WARNING lines off (ERROR and FATAL still show)",
        "Paddle logs lines such as 'New Executor is Running' for programs that did "
        "nothing wrong; applied by a user's own import paddle_ipu, or at the first use "
        "of the IPU (an IpuStrategy, a compile, exe.run on the ipu place)",
        "import",
        "PADDLE_IPU_PADDLE_LOGS=1 (or GLOG_minloglevel / GLOG_v)",
        _call(_LOGS, "quiet_paddle"),
        _call(_LOGS, "restore_paddle_logs"),
        _loaded(_LOGS, "quieted"),
    ),
    Patch(
        "ipu kernels",
        "Paddle's kernel registry",
        "registers Paddle's CPU kernels on ipu memory for Paddle's eager data transforms "
        "(paddle_ipu/libpaddle-ipu-kernels.so)",
        "tensors on the ipu place must be copied and cast by kernels of that place; "
        "Paddle cannot unregister kernels, and they serve ipu tensors only",
        "import",
        "",
        _call("paddle_ipu.device", "register_kernels"),
        None,
        _loaded("paddle_ipu.device", "kernels_registered"),
    ),
    Patch(
        "lstsq's refusal explained",
        "paddle.linalg.lstsq (every paddle module exporting it)",
        "its refusal of the ipu device becomes a NotSupportedError naming the way out",
        "Paddle checks the device in Python and says only that it supports CPU and CUDA",
        "import",
        "",
        _call(_PROCESS, "explain_ipu_refusals"),
        _call(_PROCESS, "restore_ipu_refusals"),
        _loaded(_PROCESS, "ipu_refusals_explained"),
    ),
    Patch(
        "paddle.static.load onto ipu scopes",
        "paddle.static.pir_io.set_var",
        "a loaded array is written on its tensor's own custom place",
        "Paddle names the place by the default device's type: a scope on the ipu place "
        "could not be loaded while the CPU is the default",
        "import",
        "",
        _call(_PROCESS, "keep_custom_place_on_load"),
        _call(_PROCESS, "restore_custom_place_on_load"),
        _loaded(_PROCESS, "custom_place_kept_on_load"),
    ),
    Patch(
        "launcher's devices",
        "paddle.distributed.launch.context.device (get_all_custom_device_type, "
        "get_available_custom_device), patched when the launcher imports it",
        "the launcher's device detection leaves out the ipu device",
        "the launcher took the one emulated IPU as the job's device and failed CPU jobs "
        "of --nproc_per_node 2",
        "import",
        "PADDLE_IPU_DEFAULT_DEVICE=1",
        _call(_PROCESS, "hide_ipu_from_launcher"),
        _call(_PROCESS, "show_ipu_to_launcher"),
        _loaded(_PROCESS, "ipu_hidden_from_launcher"),
    ),
    Patch(
        "exe.run",
        "paddle.static.Executor.run",
        "a program compiled by IpuCompiledProgram runs on its IPU executor; a plain "
        "program run on the ipu place is compiled as one graph; every other call goes "
        "to Paddle unchanged",
        "Paddle 2.x scripts run compiled programs with exe.run, and a plain program on "
        "the ipu place must not run op by op (fallback kernels update CPU copies)",
        "import",
        "paddle_ipu.uninstall_hooks() (PADDLE_IPU_IMPLICIT_COMPILE=0: no implicit compile)",
        _call("paddle_ipu.frontends.run_hook", "install"),
        _call("paddle_ipu.frontends.run_hook", "uninstall"),
        _loaded("paddle_ipu.frontends.run_hook", "installed"),
    ),
    Patch(
        "Paddle 2.x names",
        "paddle.static / paddle.base IpuStrategy, IpuCompiledProgram, ipu_shard_guard, "
        "set_ipu_shard; paddle.IPUPlace, is_compiled_with_ipu; core.IpuBackend; "
        "paddle.static.amp.cast_model_to_fp16; Program.lr_sheduler; "
        "paddle.inference.Config / create_predictor; pir.Value.name; "
        "pir.Operation._set_attr (IPU hints)",
        "they point at paddle_ipu (Paddle 3's own raise or answer False)",
        "a script written for Paddle 2.x's IPU API runs unchanged (paddle_ipu/compat)",
        "import",
        "PADDLE_IPU_COMPAT=0, or paddle_ipu.compat.disable()",
        _call("paddle_ipu.compat", "install"),
        _call("paddle_ipu.compat", "disable"),
        _loaded("paddle_ipu.compat", "installed"),
    ),
    Patch(
        "dy2static switch",
        "IpuStrategy.register_patch / release_patch, and a strategy made in dynamic mode",
        "they reach Paddle 2.x's dy2static patch (the dygraph front door's)",
        "2.x spelled the switch on IpuStrategy; the options layer declares the interface "
        "(paddle_ipu.strategy.Dy2StaticSwitch) and this plugs the front door in",
        "import",
        "",
        _call("paddle_ipu.frontends.dy2static", "install"),
        _call("paddle_ipu.frontends.dy2static", "uninstall"),
        _loaded("paddle_ipu.frontends.dy2static", "installed"),
    ),
    Patch(
        "dy2static Layers",
        "paddle.jit.dy2static StaticFunction.__call__",
        "a paddle.jit.to_static Layer method runs as an IpuModel of its Layer",
        "Paddle 2.x's dy2static flow on the IPU: applied by IpuStrategy.register_patch() "
        "(or a strategy made in dynamic mode), undone by release_patch()",
        "first use",
        "IpuStrategy.release_patch()",
        None,
        _call("paddle_ipu.frontends.dy2static", "release_patch"),
        _loaded("paddle_ipu.frontends.dy2static", "patch_registered"),
    ),
    Patch(
        "set_state_dict watched",
        "paddle.nn.Layer.set_state_dict / set_dict / load_dict, "
        "paddle.optimizer.Optimizer.set_state_dict",
        "after Paddle's method, the IpuModels fed by that Layer or optimizer learn that "
        "the host is newer than their device copy",
        "a dygraph model on the IPU must not run on weights the script replaced; applied "
        "by the first IpuModel that needs it",
        "first use",
        "",
        None,
        _call("paddle_ipu.frontends.dygraph", "unwatch"),
        _loaded("paddle_ipu.frontends.dygraph", "watching"),
    ),
    Patch(
        "paddle.inference primed",
        "the process's first paddle.inference predictor",
        "one predictor of a one-op model is created before the first Python op exists",
        "Paddle 3.3.1 aborts the process when its first predictor is created after "
        "register_op added a Python op; applied by the first compile of a graph op; "
        "a predictor cannot be taken back",
        "first use",
        "",
        None,
        None,
        _loaded(_PROCESS, "inference_primed"),
    ),
    Patch(
        "distributed job",
        "paddle.distributed (gloo) and the job's store",
        "paddle.distributed.init_parallel_env() when the script did not call it, and a "
        "daemon thread counting this process's heartbeat in the job's store",
        "replicas of the host backend in other processes all-reduce through Paddle's "
        "collectives, and a rank that died is named instead of hanging the job; applied "
        "by the first distributed session or paddle_ipu.distributed.barrier(); it lasts "
        "as long as the job",
        "first use",
        "",
        None,
        None,
        _loaded("paddle_ipu.backends.host.replica_group", "ReplicaGroup.joined"),
    ),
)

_BY_NAME = {p.name: p for p in PATCHES}


def _enabled(patch: Patch, by_user: bool) -> bool:
    if patch.name in ("Paddle's warnings", "Paddle's log level"):
        return by_user  # the import hook's import changes no logging
    if patch.name == "launcher's devices":
        return not env_flag("PADDLE_IPU_DEFAULT_DEVICE", False)
    if patch.name == "Paddle 2.x names":
        return env_flag("PADDLE_IPU_COMPAT", True)
    return True


def apply_at_import(by_user: bool, before_paddle: bool) -> None:
    """Apply the ``import`` patches, in order: those that must come before Paddle is
    imported (``before_paddle``), or the rest.  ``by_user``: the import is the user's
    own (not the import hook's)."""
    early = ("Poplar SDK first", "Paddle's warnings")
    for patch in PATCHES:
        if patch.when != "import" or (patch.name in early) != before_paddle:
            continue
        if _enabled(patch, by_user):
            apply(patch.name)


def apply(name: str) -> None:
    """Apply one patch (idempotent); a NotSupportedError for one applied elsewhere."""
    patch = _patch(name)
    if patch.do is None:
        from paddle_ipu.errors import NotSupportedError

        raise NotSupportedError(f"patch {name!r} is applied {_where(patch)}, not by name")
    patch.do()


def undo(name: str | None = None) -> None:
    """Take back one patch (by name), or every patch that can be (None), newest first."""
    patches = [_patch(name)] if name is not None else list(reversed(PATCHES))
    for patch in patches:
        if patch.undo is None:
            if name is not None:
                from paddle_ipu.errors import NotSupportedError

                raise NotSupportedError(f"patch {name!r} cannot be undone: {patch.why}")
            continue
        patch.undo()


def report() -> list[dict[str, Any]]:
    """Every patch, for ``paddle-ipu info``: its fields and whether it is in effect."""
    return [
        {
            "name": p.name,
            "target": p.target,
            "changes": p.changes,
            "why": p.why,
            "when": p.when,
            "off": p.off,
            "undo": p.undo is not None,
            "active": _active(p),
        }
        for p in PATCHES
    ]


def _active(patch: Patch) -> bool:
    try:
        return bool(patch.active())
    except Exception:  # a report never fails
        return False


def _where(patch: Patch) -> str:
    return "by the import hook" if patch.when == "import hook" else "at its first use"


def _patch(name: str) -> Patch:
    found = _BY_NAME.get(name)
    if found is None:
        from paddle_ipu.errors import OptionError

        raise OptionError(f"no patch {name!r}: the patches are {sorted(_BY_NAME)}")
    return found
