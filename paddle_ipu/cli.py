"""The ``paddle-ipu`` command (also ``python -m paddle_ipu``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def collect_info() -> dict[str, Any]:
    """What ``paddle-ipu info`` reports, as a dict."""
    import paddle

    import paddle_ipu
    from paddle_ipu import device
    from paddle_ipu.backends import available_backends

    _core = paddle_ipu._core
    plugin = device.plugin_path()
    return {
        "paddle_ipu": paddle_ipu.__version__,
        "paddle": paddle.__version__,
        "built_against_paddle": _core.paddle_version,
        "plugin": str(plugin) if plugin else None,
        "plugin_root": str(device.plugin_root()),
        "plugin_loaded": device.is_registered(),
        "ipu_device_count": device.device_count(),
        "backends": {
            name: {"available": ok, "detail": detail}
            for name, (ok, detail) in available_backends().items()
        },
        "core": _core.build_info(),
    }


def _print_info(info: dict[str, Any]) -> None:
    rows = [
        ("paddle-ipu", info["paddle_ipu"]),
        ("PaddlePaddle", f"{info['paddle']} (built against {info['built_against_paddle']})"),
        ("ipu plugin", info["plugin"] or f"not found in {info['plugin_root']}"),
        ("plugin loaded by Paddle", "yes" if info["plugin_loaded"] else "no"),
        ("ipu devices", str(info["ipu_device_count"])),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("backends:")
    for name, b in info["backends"].items():
        state = "available" if b["available"] else "unavailable"
        detail = f" ({b['detail']})" if b["detail"] else ""
        print(f"  {name:<8} {state}{detail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="paddle-ipu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="report Paddle, the ipu plugin, devices and backends")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)

    if args.command == "info":
        info = collect_info()
        if args.json:
            json.dump(info, sys.stdout, indent=2)
            print()
        else:
            _print_info(info)
        return 0 if info["plugin_loaded"] else 1
    return 2
