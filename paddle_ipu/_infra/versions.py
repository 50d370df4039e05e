"""Check that the installed PaddlePaddle is the release paddle-ipu was built for.

The custom-device plugin is built against the C structs in Paddle's headers,
whose sizes change between releases, so a mismatch is refused at import.
"""

from __future__ import annotations

from paddle_ipu.errors import PaddleVersionError


def check_paddle_version(installed: str, built: str) -> None:
    if installed != built:
        raise PaddleVersionError(
            f"paddle-ipu was built against PaddlePaddle {built}, but PaddlePaddle "
            f"{installed} is installed; the ipu plugin's ABI depends on the exact "
            f"release. Install paddlepaddle=={built}, or rebuild paddle-ipu against "
            f"{installed} (pip install --force-reinstall --no-binary paddle-ipu paddle-ipu)."
        )
