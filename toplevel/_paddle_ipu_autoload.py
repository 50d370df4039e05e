"""paddle-ipu's import hook, run for every ``import paddle`` on the machine.

Installed beside ``paddle_ipu_autoload.pth``, which imports this module at interpreter
start.  Nothing here imports paddle: the hook only watches for it.  Once ``paddle`` has
been imported it does three things, in this order:

1. Keeps ``import paddle`` as quiet as without paddle-ipu: Paddle logs seven lines (glog,
   INFO) when it loads the ipu plugin; those lines are taken out of what Paddle writes to
   stderr during its import (everything else is passed on, in order).
2. Keeps Paddle's default device what it would be without paddle-ipu.  Paddle makes the
   first registered custom device its default, so the ipu plugin alone would move every
   script on the machine onto the emulated IPU.  Unless ``PADDLE_IPU_DEFAULT_DEVICE`` is
   on, the default goes back to the device Paddle picks when the ipu plugin is absent
   (another custom device if one is registered, else the CPU), through Paddle's public
   ``paddle.set_device``.  ``paddle.set_device("ipu")`` and places still select the IPU.
3. Imports ``paddle_ipu``, so that ``exe.run`` on the "ipu" place compiles programs as
   whole graphs and Paddle's launcher keeps its CPU jobs (see
   ``paddle_ipu._internals.paddle_process.hide_ipu_from_launcher``).  Paddle's logging is
   left as it is: only a user's own ``import paddle_ipu`` or use of the IPU quiets it
   (``paddle_ipu._internals.paddle_logs``).

``PADDLE_IPU_AUTOLOAD=0`` (or false/no/off) turns the whole hook off: Paddle's own rules
apply (the ipu device becomes its default, as any custom-device plugin would).

This hook is the first entry of the registry of what paddle-ipu changes in a Paddle
process (``paddle_ipu/patches.py``, listed by ``paddle-ipu info``).
"""

import contextlib
import os
import re
import sys

#: True while the hook imports paddle_ipu (an import the user did not write: paddle_ipu
#: then leaves Paddle's logging as it is)
loading_paddle_ipu = False
_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")
DEVICE_TYPE = "ipu"
PLUGIN_NAME = "libpaddle-custom-ipu.so"
# What Paddle logs when it loads custom-device plugins (paddle/fluid/platform/init.cc,
# custom_device_load.cc, custom_kernel.cc in Paddle 3.3): lines about the ipu plugin
# always go; the generic ones go when the ipu plugin is the only plugin Paddle loads.
_GLOG = re.compile(rb"^[IWE]\d{4} [0-9:.]+ +\d+ [a-z_]+\.cc:\d+\] ")
_OURS = (PLUGIN_NAME.encode(), b"CustomDevice: ipu,")
_GENERIC = (
    b"ENV [CUSTOM_DEVICE_ROOT]=",
    b"Try loading custom device libs from",
    b"No custom kernel info found in loaded lib(s).",
    b"Finished in LoadCustomDevice with libs_path",
)


def _flag(name, default):
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    import warnings

    warnings.warn(
        f"paddle-ipu: environment variable {name}: expected one of 1/true/yes/on or "
        f"0/false/no/off, received {os.environ.get(name)!r}; using "
        f"{'on' if default else 'off'}",
        RuntimeWarning,
        stacklevel=3,
    )
    return default


class _PaddleWatcher:
    """A meta-path finder that wraps the loader of the ``paddle`` package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "paddle":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("paddle")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def keep_default_device(paddle):
    """Give Paddle back the default device it has without the ipu plugin (see above).

    ``import paddle`` enters dygraph mode under a guard that remembers the device it
    chose (the ipu) and restores it when the guard exits, at ``paddle.enable_static()``.
    So the guard is left, the device set, and dygraph entered again: static and dygraph
    mode both start from the new default, as they do without the plugin."""
    if _flag("PADDLE_IPU_DEFAULT_DEVICE", False):
        return
    if not str(paddle.device.get_device()).startswith(DEVICE_TYPE):
        return  # a GPU build, or another custom device came first
    target = "cpu"
    available = {d.split(":")[0] for d in paddle.device.get_available_custom_device() or []}
    for device_type in paddle.device.get_all_custom_device_type() or []:
        if device_type != DEVICE_TYPE and device_type in available:
            target = device_type
            break
    dygraph = paddle.in_dynamic_mode()
    if dygraph:
        paddle.enable_static()
    paddle.set_device(target)
    if dygraph:
        paddle.disable_static()


class _Loader:
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with _without_plugin_log(self._loader):
            self._loader.exec_module(module)
        sys.modules["paddle"] = module
        try:
            keep_default_device(module)
        except Exception as exc:  # never break `import paddle`
            import warnings

            warnings.warn(
                f"paddle-ipu could not restore Paddle's default device ({exc}); call "
                "paddle.set_device('cpu') to leave the ipu device, or set "
                "PADDLE_IPU_AUTOLOAD=0.",
                RuntimeWarning,
                stacklevel=2,
            )
        global loading_paddle_ipu
        loading_paddle_ipu = True
        try:
            import paddle_ipu  # noqa: F401
        except Exception as exc:  # never break `import paddle`
            import warnings

            warnings.warn(
                f"paddle-ipu could not be loaded ({exc}); the ipu place runs programs op by "
                "op. Import paddle_ipu to see the error, or set PADDLE_IPU_AUTOLOAD=0.",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            loading_paddle_ipu = False


def _only_ipu_plugin(loader):
    root = os.environ.get("CUSTOM_DEVICE_ROOT")
    if root is None:
        origin = getattr(loader, "path", None) or ""
        root = os.path.join(
            os.path.dirname(os.path.dirname(os.path.realpath(origin))), "paddle_custom_device"
        )
    try:
        return [n for n in os.listdir(root) if n.endswith(".so")] == [PLUGIN_NAME]
    except OSError:
        return False


def _plugin_line(line, generic):
    if not _GLOG.match(line):
        return False
    return any(m in line for m in _OURS) or (generic and any(m in line for m in _GENERIC))


@contextlib.contextmanager
def _without_plugin_log(loader):
    """Run Paddle's import with file descriptor 2 going to a temporary file, then pass
    on everything but the plugin-loading lines. Nothing is captured when stderr is no
    real file descriptor."""
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            data = capture.read()
            if not failed:  # on a failed import, every line is passed on
                generic = _only_ipu_plugin(loader)
                data = b"".join(
                    line
                    for line in data.splitlines(keepends=True)
                    if not _plugin_line(line, generic)
                )
            with contextlib.suppress(OSError):
                os.write(2, data)


def install():
    if not _flag("PADDLE_IPU_AUTOLOAD", True):
        return
    if "paddle" in sys.modules or any(isinstance(f, _PaddleWatcher) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PaddleWatcher())


install()
