"""PaddlePaddle's private interfaces behind the plugin's process-wide adjustments (checked
on the releases of :data:`paddle_ipu._internals.paddle_api.CHECKED_ON`): Paddle's launcher
kept on CPU jobs (its custom-device detection), Paddle 3's refusals of 2.x IPU names
explained, the custom place kept when a program is loaded, Paddle Inference primed before
the first compiled program.  Each is wrapped here, with its probe, beside
:mod:`paddle_ipu._internals.paddle_api`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from paddle_ipu._internals import Unavailable, interface
from paddle_ipu._internals.paddle_api import _DEP

# -- paddle.distributed.launch's device detection ---------------------------------

#: the launcher module whose device detection sees custom devices
LAUNCHER_DEVICE_MODULE = "paddle.distributed.launch.context.device"
_launcher_originals: dict[str, Any] = {}


def _without_ipu_types(original: Any) -> Any:
    def get_all_custom_device_type() -> Any:
        types = original()
        return [t for t in types or [] if t != "ipu"] if types is not None else types

    get_all_custom_device_type.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
    return get_all_custom_device_type


def _without_ipu_devices(original: Any) -> Any:
    def get_available_custom_device() -> Any:
        devices = original()
        if devices is None:
            return devices
        return [d for d in devices if str(d).split(":")[0] != "ipu"]

    get_available_custom_device.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
    return get_available_custom_device


def _patch_launcher_module(module: Any) -> None:
    for name, wrap in (
        ("get_all_custom_device_type", _without_ipu_types),
        ("get_available_custom_device", _without_ipu_devices),
    ):
        current = getattr(module, name, None)
        if current is None or hasattr(current, "__paddle_ipu_original__"):
            continue
        _launcher_originals[name] = current
        setattr(module, name, wrap(current))


class _LauncherWatcher:
    """Patches the launcher's device module when it is first imported (nothing of the
    launcher is imported otherwise)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != LAUNCHER_DEVICE_MODULE:
            return None
        import importlib.util
        import sys

        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class _Loader:
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                _patch_launcher_module(module)

        spec.loader = _Loader()  # type: ignore[assignment]
        return spec


def hide_ipu_from_launcher() -> None:
    """Keep ``python -m paddle.distributed.launch`` choosing its devices as without the
    ipu plugin.

    The launcher (``launch/context/device.py``, ``Device.parse_device`` and
    ``detect_device``) takes the first registered custom device type as the job's device
    and gives each process one of its devices: with the one emulated IPU, a CPU job of
    ``--nproc_per_node 2`` failed in ``_build_pod_with_master`` (IndexError).  Its two
    imported names ``get_all_custom_device_type`` and ``get_available_custom_device`` are
    replaced, in that module only, by versions that leave out "ipu".  Undone by
    :func:`show_ipu_to_launcher`; not installed when ``PADDLE_IPU_DEFAULT_DEVICE`` is on.
    """
    import sys

    module = sys.modules.get(LAUNCHER_DEVICE_MODULE)
    if module is not None:
        _patch_launcher_module(module)
    elif not any(isinstance(f, _LauncherWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _LauncherWatcher())


def ipu_hidden_from_launcher() -> bool:
    """Whether the launcher's device detection is (or will be, on its import) patched."""
    import sys

    return bool(_launcher_originals) or any(isinstance(f, _LauncherWatcher) for f in sys.meta_path)


def show_ipu_to_launcher() -> None:
    """Undo :func:`hide_ipu_from_launcher`."""
    import sys

    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _LauncherWatcher)]
    module = sys.modules.get(LAUNCHER_DEVICE_MODULE)
    if module is not None:
        for name, original in _launcher_originals.items():
            setattr(module, name, original)
    _launcher_originals.clear()


@interface(
    _DEP,
    "distributed.launch.context.device: get_all_custom_device_type, "
    "get_available_custom_device, Device.detect_device",
    "CPU jobs under paddle.distributed.launch with the ipu plugin installed",
    fallback="none needed before Paddle 3.3, whose launcher takes a custom device only "
    "when PADDLE_XCCL_BACKEND names it",
)
def _probe_launcher() -> str:
    import importlib
    import os

    module = importlib.import_module(LAUNCHER_DEVICE_MODULE)
    if not hasattr(module, "get_all_custom_device_type"):
        # Paddle 3.0 to 3.2 (launch/context/device.py) look at custom devices only under
        # PADDLE_XCCL_BACKEND: the ipu plugin changes nothing for a CPU job.
        detail = "this release's launcher looks for custom devices only under PADDLE_XCCL_BACKEND"
        if "PADDLE_XCCL_BACKEND" not in os.environ:
            device = module.Device.detect_device()
            assert device.dtype == module.DeviceType.CPU, device.dtype
            detail += f" (it detects {device.dtype!r} with the ipu device registered)"
        raise Unavailable(detail)
    for name in ("get_all_custom_device_type", "get_available_custom_device"):
        assert callable(getattr(module, name)), name
    device = module.Device.detect_device()
    if "ipu" in (module.get_all_custom_device_type() or []):
        raise AssertionError("the launcher still sees the ipu device type")
    return f"the launcher's device detection sees {device.dtype!r} without the ipu device"


# -- Paddle APIs that refuse the ipu device in Python --------------------------------

_REFUSALS = {
    # module attribute path -> what to say instead of Paddle's message
    "paddle.tensor.linalg.lstsq": (
        "Only support lstsq api for CPU or CUDA device",
        "paddle.linalg.lstsq checks paddle.get_device() and runs on the CPU and CUDA only "
        "(Paddle's own rule, paddle/tensor/linalg.py); on the ipu device, call it on CPU "
        "tensors under paddle.set_device('cpu'): x.cpu(), y.cpu()",
    ),
}
#: (module, attribute, Paddle's function) for every name explain_ipu_refusals replaced
_refusal_patches: list[tuple[Any, str, Any]] = []


def explain_ipu_refusals() -> None:
    """Make the few Paddle APIs that refuse the ipu device in Python (not in a kernel)
    say how to run them: their error becomes a NotSupportedError naming the API and the
    way out.  Only the error changes; :func:`restore_ipu_refusals` undoes it."""
    import functools
    import importlib
    import sys

    import paddle

    from paddle_ipu.errors import NotSupportedError

    if _refusal_patches:
        return
    for path, (paddle_message, ours) in _REFUSALS.items():
        module_name, name = path.rsplit(".", 1)
        original = getattr(importlib.import_module(module_name), name)

        def wrapper(
            *args: Any,
            __original: Any = original,
            __paddle: str = paddle_message,
            __ours: str = ours,
            **kwargs: Any,
        ) -> Any:
            try:
                return __original(*args, **kwargs)
            except RuntimeError as exc:
                if __paddle in str(exc) and str(paddle.get_device()).startswith("ipu"):
                    raise NotSupportedError(__ours) from exc
                raise

        functools.update_wrapper(wrapper, original)
        wrapper.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
        # Every module of paddle that exports it (paddle.linalg, paddle.tensor, ...).
        for module_path, module in list(sys.modules.items()):
            if module is None or not (module_path == "paddle" or module_path.startswith("paddle.")):
                continue
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, wrapper)
                    _refusal_patches.append((module, attr, original))


def ipu_refusals_explained() -> bool:
    return bool(_refusal_patches)


def restore_ipu_refusals() -> None:
    """Undo :func:`explain_ipu_refusals`."""
    for module, attr, original in _refusal_patches:
        setattr(module, attr, original)
    _refusal_patches.clear()


@interface(
    _DEP,
    "paddle.tensor.linalg.lstsq refusing devices other than CPU and CUDA",
    "a NotSupportedError naming the way out on the ipu device",
    fallback="Paddle's own RuntimeError",
)
def _probe_refusals() -> str:
    import inspect as _inspect

    import paddle

    source = _inspect.getsource(
        getattr(paddle.tensor.linalg.lstsq, "__paddle_ipu_original__", paddle.tensor.linalg.lstsq)
    )
    for path, (message, _) in _REFUSALS.items():
        assert message in source, f"{path} no longer raises {message!r}"
    return "lstsq's device refusal as checked"


# -- paddle.static.load on a scope that lives on the ipu place ------------------------

_load_patch: list[tuple[Any, str, Any]] = []


def keep_custom_place_on_load() -> None:
    """Let ``paddle.static.load`` (PIR) write into tensors on the ipu place whatever the
    default device is.

    ``paddle/static/pir_io.py``'s ``set_var`` writes each loaded array back on its
    tensor's place, but names a custom place by the *default* device's type
    (``paddle.device.get_device().split(':')[0]``): with the CPU as the default (see
    docs/device.md), a scope trained on the ipu place could not be loaded ("Invalid
    CustomPlace(cpu, 0)").  The replacement uses the tensor's own device type and hands
    every other place to Paddle's function; :func:`restore_custom_place_on_load` undoes
    it."""
    import paddle
    from paddle.static import pir_io

    if _load_patch:
        return
    original = pir_io.set_var

    def set_var(name: str, ndarray: Any) -> Any:
        tensor = paddle.static.global_scope().find_var(name).get_tensor()
        place = tensor._place()
        if not place.is_custom_place():
            return original(name, ndarray)
        custom = paddle.base.core.Place()
        custom.set_place(place)
        target = paddle.base.CustomPlace(custom.custom_device_type(), custom.custom_device_id())
        tensor.set(ndarray, target)
        return None

    set_var.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
    pir_io.set_var = set_var
    _load_patch.append((pir_io, "set_var", original))


def custom_place_kept_on_load() -> bool:
    return bool(_load_patch)


def restore_custom_place_on_load() -> None:
    """Undo :func:`keep_custom_place_on_load`."""
    for module, name, original in _load_patch:
        setattr(module, name, original)
    _load_patch.clear()


@interface(
    _DEP,
    "static.pir_io.set_var(name, ndarray), Place.custom_device_type",
    "paddle.static.load into a scope on the ipu place",
    fallback="Paddle's own set_var (needs paddle.set_device('ipu') before loading)",
)
def _probe_load() -> str:
    import inspect as _inspect

    from paddle.static import pir_io

    original = getattr(pir_io.set_var, "__paddle_ipu_original__", pir_io.set_var)
    params = list(_inspect.signature(original).parameters)
    assert params == ["name", "ndarray"], params
    assert "paddle.device.get_device().split(':')[0]" in _inspect.getsource(original)
    return "pir_io.set_var as checked"


# -- paddle.inference after register_op ------------------------------------------------

_inference_primed = False


def inference_primed() -> bool:
    """Whether :func:`prime_paddle_inference` has run in this process."""
    return _inference_primed


def prime_paddle_inference() -> None:
    """Create one Paddle Inference predictor before the first Python op exists.

    In Paddle 3.3.1, once ``register_op`` has added a Python op, creating the
    process's first ``paddle.inference`` predictor aborts the process (a glog
    CHECK on the Python op's unvalidated proto).  Predictor creation validates
    the op registry only once, so doing it first -- with a one-op model in a
    temporary folder, about 40 ms once per process -- keeps later predictors
    working.
    """
    global _inference_primed
    if _inference_primed:
        return
    _inference_primed = True
    import os
    import tempfile
    import warnings

    import paddle

    try:
        import paddle.inference as pi

        scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        # The pid in the name lets a later compile remove it if this process is killed.
        with tempfile.TemporaryDirectory(prefix=f"paddle_ipu_{os.getpid()}_", dir=scratch) as tmp:
            prog, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(prog, startup):
                x = paddle.static.data("x", [1], "float32")
                y = paddle.scale(x, 2.0)
            prefix = os.path.join(tmp, "m")
            exe = paddle.static.Executor(paddle.CPUPlace())
            # The one-op model has no variables, which Paddle warns about: not the
            # user's concern.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                paddle.static.save_inference_model(prefix, [x], [y], exe, program=prog)
            config = pi.Config(prefix + ".json", "")
            config.disable_glog_info()
            pi.create_predictor(config)
    except Exception as exc:  # priming is a precaution, never a reason to fail
        import logging

        logging.getLogger("paddle_ipu").debug("could not prime paddle.inference: %s", exc)
