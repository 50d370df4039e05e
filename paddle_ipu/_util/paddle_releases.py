"""The PaddlePaddle releases paddle-ipu supports, by (major, minor) series.

A plain module with no imports: setup.py reads it without importing paddle_ipu (whose
``__init__`` imports paddle), and :mod:`paddle_ipu._util.versions` checks against it.

The device plugin's C ABI (``C_DeviceInterface`` in paddle/phi/backends/device_ext.h)
differs between every two minor releases (920, 976, 1032 and 1128 bytes for 3.0 to 3.3)
and is the same within one: the header is byte for byte the same in 3.2.0, 3.2.1 and
3.2.2, and in 3.3.0 and 3.3.1 (3.1.0 and 3.1.1 differ in comments only).  The ipu
kernels (csrc/kernels) use Paddle's C++ classes, which are not meant to be stable
across minor releases either.  So a build serves every patch release of the series it
was built against, and no other series.
"""

SUPPORTED = ((3, 0), (3, 1), (3, 2), (3, 3))

#: the requirement a build with no PaddlePaddle in reach downloads the newest of
RANGE = "paddlepaddle>=3.0,<3.4"


def series(version: str) -> tuple[int, int]:
    """(major, minor) of a release string: "3.2.2" -> (3, 2); "3.3.0rc1" -> (3, 3)."""
    parts = version.split(".")
    digits = "".join(c for c in parts[1] if c.isdigit()) if len(parts) > 1 else ""
    return int(parts[0]), int(digits or 0)


def describe() -> str:
    """The supported series for a message: "3.0 to 3.3"."""
    first, last = SUPPORTED[0], SUPPORTED[-1]
    return f"{first[0]}.{first[1]} to {last[0]}.{last[1]}"


def requirement(version: str) -> str:
    """The runtime requirement of a build made against ``version``: its series
    ("3.2.2" -> "paddlepaddle>=3.2,<3.3"), whose patch releases share one ABI."""
    major, minor = series(version)
    return f"paddlepaddle>={major}.{minor},<{major}.{minor + 1}"
