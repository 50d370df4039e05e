"""float32 <-> float16 conversion for weights and feeds, over ``paddle_ipu._core``.

Results are bit-identical to numpy's ``astype`` (round to nearest even; signed zeros,
subnormals, overflow to inf and NaN payloads as numpy gives them), at memory speed:
the core picks AVX-512, F16C or scalar code for the running CPU, releases the GIL,
and splits very large buffers across threads.

Sources and outputs are C-contiguous buffers: numpy arrays, :mod:`paddle_ipu._tensors.views`
views, ``paddle.Tensor`` and scope tensors (viewed in place, never copied), or any other
buffer-protocol object.  Nothing is converted implicitly: a float64 source or a strided
array is an error, not a hidden copy.

In place, as the seed's ``ConvertWeights`` does with a Paddle weight: a float32 buffer of
n elements is rewritten so that its first 2n bytes hold the n halves
(:func:`to_fp16_inplace`), and back (:func:`to_fp32_inplace`).  The tensor keeps its
float32 dtype and shape throughout; only the bytes change meaning.

``threads=None`` lets the core choose (one thread unless the buffer is tens of MiB);
an int pins the count.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import paddle

from paddle_ipu import _core
from paddle_ipu._tensors import views as tensor_view
from paddle_ipu.errors import ConversionError, TensorViewError

# Anything exporting a C-contiguous buffer is accepted too; these are the usual ones.
Buffer = Union[np.ndarray, tensor_view.TensorView, paddle.Tensor, "tensor_view.DenseTensor"]


def _threads(threads: int | None) -> int:
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConversionError(f"threads must be None (automatic) or an int >= 1, got {threads!r}")
    return threads


def _buffer(obj: object, *, readonly: bool) -> object:
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, (paddle.Tensor, tensor_view.DenseTensor)):
        return tensor_view.view(obj, readonly=readonly)
    return obj


def _call(fn: Any, *args: object) -> Any:
    try:
        return fn(*args)
    except TypeError as e:
        raise TensorViewError(str(e)) from None
    except ValueError as e:
        raise ConversionError(str(e)) from None


def _as_array(result: object) -> np.ndarray:
    return result if isinstance(result, np.ndarray) else np.asarray(result)


def to_fp16(a: Buffer, out: Buffer | None = None, threads: int | None = None) -> np.ndarray:
    """Convert float32 ``a`` to float16.

    Writes into ``out`` (a writable float16 -- or uint16 half-bits -- buffer with as many
    elements, not overlapping ``a``) and returns a numpy array over it, or returns a new
    numpy array shaped like ``a``.
    """
    src = _buffer(a, readonly=True)
    dst = None if out is None else _buffer(out, readonly=False)
    return _as_array(_call(_core.f32_to_f16, src, dst, _threads(threads)))


def to_fp32(a: Buffer, out: Buffer | None = None, threads: int | None = None) -> np.ndarray:
    """Convert float16 (or uint16 half-bits) ``a`` to float32; ``out`` as in :func:`to_fp16`."""
    src = _buffer(a, readonly=True)
    dst = None if out is None else _buffer(out, readonly=False)
    return _as_array(_call(_core.f16_to_f32, src, dst, _threads(threads)))


def to_fp16_inplace(a: Buffer, threads: int | None = None) -> np.ndarray:
    """Convert the float32 buffer ``a`` to float16 in place.

    Afterwards the first half of ``a``'s bytes holds the halves and the second half is
    unspecified. Returns a float16 numpy array of ``a``'s shape over those bytes.
    """
    arr = _as_array(_buffer(a, readonly=False))
    _call(_core.f32_to_f16_inplace, arr, _threads(threads))
    return arr.reshape(-1).view(np.float16)[: arr.size].reshape(arr.shape)


def to_fp32_inplace(a: Buffer, threads: int | None = None) -> np.ndarray:
    """Convert float16 data back to float32 in place: the inverse of :func:`to_fp16_inplace`.

    ``a`` is the float32 buffer itself (n elements, 4n bytes), whose first 2n bytes hold
    the n halves -- the state :func:`to_fp16_inplace` leaves it in. A float16 array has
    no room for the result and is refused; convert it with :func:`to_fp32` instead.
    Returns a float32 numpy array over ``a``.
    """
    arr = _as_array(_buffer(a, readonly=False))
    if arr.dtype != np.float32:
        raise ConversionError(
            "to_fp32_inplace needs the float32 buffer that holds the halves in its first "
            f"half (4 bytes of room per element); got {arr.dtype} data. Pass the float32 "
            "array or tensor given to to_fp16_inplace, or use to_fp32(a, out=...)."
        )
    _call(_core.f16_to_f32_inplace, arr, _threads(threads))
    return arr
