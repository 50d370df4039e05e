"""The ``paddle-ipu`` command's options of a model compiled per input shape (an image
model's open height and width): the flags ``compile`` and ``serve`` take, and what they
become for :func:`paddle_ipu.serving.saved_model.compile_model`.  Imports nothing of
Paddle until a command runs (``--help`` answers without it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["add_shape_arguments", "bounded", "shape_argv", "shape_options"]


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """``--specialisation-memory-mb`` and ``--shape-buckets`` (``--input-shapes``,
    ``--max-specialisations`` and ``--pad-value`` are the command's own)."""
    p.add_argument(
        "--specialisation-memory-mb",
        type=float,
        default=None,
        metavar="MB",
        help="the memory such a model's input shapes hold at once (default 1024); the "
        "least recently used leaves beyond, and comes back without a compile",
    )
    p.add_argument(
        "--shape-buckets",
        default=None,
        metavar="auto|JSON|@FILE",
        help="pad such a model's open dimensions up to grids of sizes, e.g. "
        '\'{"x": {"2": [736, 1024], "3": {"min": 736, "max": 4096, "step": 256}}}\' '
        "(auto: from --input-shapes and an inference.yml's ranges; the default on popart); "
        "--pad-value NAME=V sets a feed's padding (0)",
    )


def shape_buckets(text: str | None) -> Any:
    """``--shape-buckets``: ``auto``, a JSON object, or @FILE holding one."""
    from paddle_ipu.errors import OptionError

    if text is None or text == "auto":
        return text
    try:
        if text.startswith("@"):
            with open(text[1:], encoding="utf-8") as f:
                return json.load(f)
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise OptionError(
            f"--shape-buckets must be 'auto', a JSON object or @FILE of one, got {text!r}: {exc}"
        ) from None


def shape_options(
    args: argparse.Namespace, input_shapes: Sequence[dict[str, list[int]]]
) -> dict[str, Any]:
    """compile_model's options of a model compiled per input shape, from ``args``."""
    out: dict[str, Any] = {
        "input_shapes": list(input_shapes),
        "max_specialisations": args.max_specialisations,
        "shape_buckets": shape_buckets(args.shape_buckets),
    }
    if args.specialisation_memory_mb is not None:
        out["memory_mb"] = args.specialisation_memory_mb
    return out


def shape_argv(args: argparse.Namespace) -> list[str]:
    """The flags of :func:`add_shape_arguments` as given, for a ``--workers`` process."""
    out: list[str] = []
    if args.shape_buckets is not None:
        out += ["--shape-buckets", args.shape_buckets]
    if args.specialisation_memory_mb is not None:
        out += ["--specialisation-memory-mb", str(args.specialisation_memory_mb)]
    return out


def bounded(package: Any, count: int | None, memory_mb: float | None) -> Any:
    """A loaded package's specialisations bounded as the command line says."""
    if package.policy is not None and (count is not None or memory_mb is not None):
        changes: dict[str, Any] = {}
        if count is not None:
            changes["max_specialisations"] = count
        if memory_mb is not None:
            changes["memory_mb"] = memory_mb
        package.policy = dataclasses.replace(package.policy, **changes)
    return package
