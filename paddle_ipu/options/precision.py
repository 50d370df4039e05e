"""Names of the Paddle operators a float16 graph keeps in float32 (``fp16_black_list``).

A user names operators as Paddle does: PIR's ``pd_op.softmax``, the plain ``softmax``
of Paddle Inference's ``exp_disable_mixed_precision_ops`` and of Paddle AMP's
``custom_black_list``, or a legacy program's type (``elementwise_add``,
``matmul_v2``), which names the PIR operator a legacy model is read as.  One key per
operator: :func:`op_key`.
"""

from __future__ import annotations

from collections.abc import Iterable

from paddle_ipu.errors import OptionError

#: legacy operator types -> the PIR operator a legacy program is translated to
LEGACY_NAMES = {
    "elementwise_add": "add",
    "elementwise_sub": "subtract",
    "elementwise_mul": "multiply",
    "elementwise_div": "divide",
    "elementwise_max": "maximum",
    "elementwise_min": "minimum",
    "matmul_v2": "matmul",
    "lookup_table_v2": "embedding",
    "hard_swish": "hardswish",
    "hard_sigmoid": "hardsigmoid",
    "reduce_mean": "mean",
    "reduce_sum": "sum",
    "reduce_max": "max",
    "reduce_min": "min",
    "bilinear_interp_v2": "bilinear_interp",
    "nearest_interp_v2": "nearest_interp",
    "linear_interp_v2": "linear_interp",
    "bicubic_interp_v2": "bicubic_interp",
    "trilinear_interp_v2": "trilinear_interp",
    "softmax_with_cross_entropy": "cross_entropy_with_softmax",
    "transpose2": "transpose",
    "reshape2": "reshape",
    "squeeze2": "squeeze",
    "unsqueeze2": "unsqueeze",
    "flatten_contiguous_range": "flatten",
    "fill_constant": "full",
}


def op_key(name: str) -> str:
    """The key of a Paddle operator's name: without ``pd_op.``, without the trailing
    underscore of an in-place variant (``relu_`` is ``relu``), a legacy type as the PIR
    operator it becomes."""
    key = name.strip()
    if key.startswith("pd_op."):
        key = key[len("pd_op.") :]
    if key.endswith("_") and not key.endswith("__"):
        key = key[:-1]
    return LEGACY_NAMES.get(key, key)


def op_keys(option: str, names: Iterable[object]) -> list[str]:
    """The keys of ``names`` (each a non-empty str), in order, without repeats.

    Raises:
        OptionError: an entry is not a non-empty str (the option and the entry named).
    """
    keys: list[str] = []
    for name in names:
        if not isinstance(name, str) or not op_key(name):
            raise OptionError(
                f"{option}: each entry is a Paddle operator's name (a non-empty str such as "
                f"'softmax' or 'pd_op.softmax'), got {name!r}"
            )
        key = op_key(name)
        if key not in keys:
            keys.append(key)
    return keys


__all__ = ["LEGACY_NAMES", "op_key", "op_keys"]
