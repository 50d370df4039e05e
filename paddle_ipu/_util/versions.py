"""Check that the installed PaddlePaddle is one paddle-ipu supports and the series (3.x)
it was built for.

The custom-device plugin is built against the C structs in Paddle's headers, whose sizes
change between minor releases (never between patch releases of one series), so a build
works with every patch release of its series and a mismatch is refused at import.  The
plugin itself refuses to register under another series (Paddle then logs "InitPlugin
failed"), so ``import paddle`` keeps working and this check names the fix.
"""

from __future__ import annotations

from paddle_ipu._util.paddle_releases import RANGE, SUPPORTED, describe, series
from paddle_ipu.errors import PaddleVersionError


def check_paddle_version(installed: str, built: str) -> None:
    """Raise PaddleVersionError unless ``installed`` is of the series ``built`` is."""
    have, want = series(installed), series(built)
    supported = f"paddle-ipu supports PaddlePaddle {describe()} ({RANGE}), one series per build"
    if have not in SUPPORTED:
        raise PaddleVersionError(
            f"PaddlePaddle {installed} is installed, but {supported}; this build was made "
            f"against PaddlePaddle {built}: install paddlepaddle=={want[0]}.{want[1]}.*"
        )
    if have != want:
        raise PaddleVersionError(
            f"paddle-ipu was built against PaddlePaddle {built}, but PaddlePaddle "
            f"{installed} is installed; the ipu plugin's ABI depends on the minor release, "
            f"and {supported}. Install paddlepaddle=={want[0]}.{want[1]}.*, or rebuild "
            f"paddle-ipu against {installed}: `pip install --force-reinstall --no-deps .` "
            "in its source tree (from an index: pip install --force-reinstall --no-deps "
            "--no-cache-dir --no-binary paddle-ipu paddle-ipu)."
        )
