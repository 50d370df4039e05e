"""Small array helpers shared by the executor paths."""

from __future__ import annotations

import numpy as np

_WORDS = (np.uint64, np.uint32, np.uint16)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two arrays of one dtype and shape (keeps -0.0 apart from
    0.0, and NaN payloads).  Compared as the widest unsigned words that divide the
    size: twice as fast as bytes on weight-sized arrays."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.nbytes <= 4096:  # one bytes comparison beats numpy's call overhead
        return a.tobytes() == b.tobytes()
    a8 = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    b8 = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    for word in _WORDS:
        size = np.dtype(word).itemsize
        if a8.size % size == 0:
            return bool(np.array_equal(a8.view(word), b8.view(word)))
    return bool(np.array_equal(a8, b8))
