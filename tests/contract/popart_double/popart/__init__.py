"""A double of the Poplar SDK's ``popart`` package (PopART 3.0-3.4), for tests.

Importing it behaves as python/popart/__init__.py.in does: it refuses to load after
``onnx``.  Everything else is in :mod:`popart._core` (the tests load that module
directly as ``popart`` when onnx is already imported).
"""

import sys

# python/popart/__init__.py.in (sdk/poplar/3.0.0-3.4.0)
if "onnx" in sys.modules:
    raise ImportError(
        "It looks like onnx has already been imported. Due to an ongoing issue, "
        "popart must be imported before onnx."
    )

from popart._core import *  # noqa: F403
from popart._core import __all__  # noqa: F401
