"""The one dtype table: Paddle, numpy, ONNX and ONNX Runtime spellings of each dtype.

Every module that turns a dtype from one world into another goes through here:
Paddle's dtype objects (``paddle.float32``, ``VarType.FP32``, ``DataType.FLOAT32``) print
in several ways, numpy has no bfloat16 (Paddle's bfloat16 tensors read as uint16), ONNX
numbers its element types and ONNX Runtime names them differently again.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DType:
    #: Paddle's (and, except bfloat16, numpy's) name
    name: str
    #: the numpy dtype of an array holding it
    numpy: str
    #: ONNX TensorProto element type (the numbers of onnx.proto's DataType; onnx is not
    #: imported here, as popart must be imported before it)
    onnx: int
    #: ONNX Runtime's name, as in ``tensor(<ort>)``
    ort: str

    @property
    def is_float(self) -> bool:
        return self.name in ("float16", "bfloat16", "float32", "float64")

    @property
    def is_integer(self) -> bool:
        return self.name.startswith(("int", "uint"))


TABLE: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float32", "float32", 1, "float"),
        DType("float16", "float16", 10, "float16"),
        DType("bfloat16", "uint16", 16, "bfloat16"),
        DType("float64", "float64", 11, "double"),
        DType("int8", "int8", 3, "int8"),
        DType("int16", "int16", 5, "int16"),
        DType("int32", "int32", 6, "int32"),
        DType("int64", "int64", 7, "int64"),
        DType("uint8", "uint8", 2, "uint8"),
        DType("uint16", "uint16", 4, "uint16"),
        DType("bool", "bool", 9, "bool"),
        DType("complex64", "complex64", 14, "complex64"),
        DType("complex128", "complex128", 15, "complex128"),
    )
}
_BY_ONNX = {d.onnx: d for d in TABLE.values()}
# The legacy IR's VarType spellings (str(VarType.FP32) is "VarType.FP32" in some releases).
_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "bool_": "bool",
}
_NAMES: dict[Any, str] = {}


def name_of(dtype: Any) -> str:
    """The name of a dtype given as a Paddle dtype object, a numpy dtype or a string
    (``paddle.float32``, ``VarType.FP32``, ``np.float32`` and ``"float32"`` all give
    ``"float32"``); an unknown one is returned lower-cased, without its prefix."""
    try:
        cached = _NAMES.get(dtype)
    except TypeError:  # unhashable
        cached = None
    if cached is not None:
        return cached
    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        text = np.dtype(dtype).name
    else:
        text = str(dtype)
    short = text.rsplit(".", 1)[-1].lower()
    name = _ALIASES.get(short, short)
    with contextlib.suppress(TypeError):  # unhashable
        _NAMES[dtype] = name
    return name


def get(dtype: Any) -> DType | None:
    return TABLE.get(name_of(dtype))


def numpy_of(dtype: Any) -> np.dtype:
    """The numpy dtype of an array holding ``dtype`` (bfloat16 -> uint16)."""
    entry = get(dtype)
    return np.dtype(entry.numpy if entry is not None else name_of(dtype))


def ort_type(dtype: Any) -> str | None:
    """ONNX Runtime's ``tensor(...)`` type of ``dtype``, or None."""
    entry = get(dtype)
    return f"tensor({entry.ort})" if entry is not None else None


def onnx_type(dtype: Any) -> int:
    entry = get(dtype)
    if entry is None:
        raise KeyError(f"no ONNX element type for dtype {name_of(dtype)!r}")
    return entry.onnx


def from_onnx(elem_type: int) -> str:
    """The name of an ONNX element type (``TensorProto.FLOAT`` -> ``float32``)."""
    entry = _BY_ONNX.get(int(elem_type))
    if entry is None:
        raise KeyError(f"ONNX element type {elem_type} has no dtype here")
    return entry.name


def is_integer(dtype: Any) -> bool:
    entry = get(dtype)
    return entry is not None and entry.is_integer


def is_float(dtype: Any) -> bool:
    entry = get(dtype)
    return entry is not None and entry.is_float
