"""paddle-ipu's import hook: once ``paddle`` has been imported, import ``paddle_ipu``
so that ``exe.run`` on the "ipu" place compiles programs as whole graphs.

Installed beside ``paddle_ipu_autoload.pth``, which imports this module at
interpreter start.  Nothing here imports paddle: the hook only watches for it.
``PADDLE_IPU_AUTOLOAD=0`` (or false/no/off) turns it off.
"""

import contextlib
import os
import sys

_OFF = ("0", "false", "no", "off")


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


class _Loader:
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.modules["paddle"] = module
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


def install():
    if os.environ.get("PADDLE_IPU_AUTOLOAD", "1").strip().lower() in _OFF:
        return
    if "paddle" in sys.modules or any(isinstance(f, _PaddleWatcher) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PaddleWatcher())


install()
