"""A double of the Poplar SDK's ``popef`` Python module, for tests: only what the
popart adapter's PopEF path uses, each behaviour from a public use of the module.

* ``popef.popefTypeToNumpyDType(data_type)``: the numpy dtype of a tensor description's
  ``data_type`` (open-mmlab/mmdeploy, mmdeploy/backend/ipu/wrapper.py, which passes it
  to ``numpy.astype`` and ``numpy.frombuffer``).

``DataType`` stands for ``popef::DataType``: the member names of its Python binding
were not checked, so the double's values are opaque and only
``popefTypeToNumpyDType`` reads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class DataType:
    """An opaque PopEF data type (popef::DataType); see the module docstring."""

    __slots__ = ("_dtype",)

    def __init__(self, dtype: Any) -> None:
        self._dtype = np.dtype(dtype)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataType) and other._dtype == self._dtype

    def __hash__(self) -> int:
        return hash(self._dtype)

    def __repr__(self) -> str:
        return f"<popef.DataType {self._dtype.name}>"


def popefTypeToNumpyDType(data_type: DataType) -> np.dtype:
    # mmdeploy/backend/ipu/wrapper.py: the result is given to astype / frombuffer.
    if not isinstance(data_type, DataType):
        raise TypeError(f"popefTypeToNumpyDType(): incompatible argument {data_type!r}")
    return data_type._dtype


__all__ = ["DataType", "popefTypeToNumpyDType"]
