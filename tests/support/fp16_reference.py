"""The IPU's float16 arithmetic in numpy, from Graphcore's documented behaviour: the
oracle the host backend's emulation is checked against (tests/unit/test_fp16_arithmetic.py).

Sources (read in graphcore/poplibs, graphcore/popart and Poplar's API documentation):

- every float16 result is rounded to nearest, ties to even (IEEE 754 half precision),
  and a result that overflows saturates at +-65504 unless NaN-on-overflow is on
  (Poplar ``FloatingPointBehaviour.nanoo``: "half precision calculations that have
  overflowed will produce a Not-a-Number result, rather than saturating to the half
  precision max/min value"); an infinity that is not an overflow stays one;
- matmul and convolution partials (poplin ``MatMul.hpp`` / ``Convolution.hpp``:
  ``partialsType (half, float) [=float]``): float32 partials round once; with float16
  partials the AMP accumulates 16 products a pass ("the number of input channels
  supported by AMP", PopART's partials test) and each pass is added to the float16
  partial, rounded;
- reductions (popops ``Reduce.hpp``): "the intermediate type will default to ... float
  if the input is of type half and the reduction operation benefits from higher
  precision (for example, add)": one rounding of a float32 sum;
- softmax (popnn ``NonLinearity.cpp``, the stable algorithm PopART uses): the maximum;
  ``x - max`` rounded; ``exp`` rounded; the sum in float32; its reciprocal in float32,
  cast to half; the product rounded;
- normalisations (poplin ``Norms.cpp``): the mean in the activations' type from a
  float32 sum, the mean of squares in float32 (``powerOutputType = partialsType``),
  the inverse standard deviation in the activations' type; then ``acts - mean``,
  ``* invStdDev``, ``* gamma``, ``+ beta``, each rounded (``normWhiten``, ``normalise``).

Each function takes float16 values (any float dtype) and computes in float64, rounding
where the IPU rounds: exact sums and products are exact here, so what differs from the
emulation is only the host's float32 evaluation of functions like ``exp``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

FP16_MAX = 65504.0
AMP_PASS = 16


def r(x: np.ndarray | float, saturate: bool = True) -> np.ndarray:
    """Rounded to float16 (to nearest even), as float64; finite overflow saturates."""
    x = np.asarray(x, np.float64)
    if saturate:
        x = np.where(np.isinf(x), x, np.clip(x, -FP16_MAX, FP16_MAX))
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float64)


def elementwise(fn: Callable[..., np.ndarray], *args: np.ndarray) -> np.ndarray:
    """One operator on float16 operands: the exact result, rounded once."""
    return r(fn(*(np.asarray(a, np.float64) for a in args)))


def matmul(a: np.ndarray, b: np.ndarray, half_partials: bool = False) -> np.ndarray:
    """``a @ b`` (2-D); float32 partials: rounded once; float16 partials: passes of
    AMP_PASS products, each added to the float16 partial and rounded."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not half_partials or a.shape[1] <= AMP_PASS:
        return r(a @ b)
    acc = None
    for start in range(0, a.shape[1], AMP_PASS):
        part = a[:, start : start + AMP_PASS] @ b[start : start + AMP_PASS]
        acc = r(part) if acc is None else r(acc + part)
    assert acc is not None
    return acc


def conv2d(x: np.ndarray, w: np.ndarray, pad: int = 0, half_partials: bool = False) -> np.ndarray:
    """NCHW convolution, stride 1, group 1; float16 partials: the input channels in
    passes of AMP_PASS (all kernel positions of a pass summed, then rounded into the
    partial)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1

    def partial(c0: int, c1: int) -> np.ndarray:
        out = np.zeros((n, m, oh, ow))
        for i in range(kh):
            for j in range(kw):
                patch = x[:, c0:c1, i : i + oh, j : j + ow]
                out += np.einsum("nchw,mc->nmhw", patch, w[:, c0:c1, i, j])
        return out

    if not half_partials or c <= AMP_PASS:
        return r(partial(0, c))
    acc = None
    for start in range(0, c, AMP_PASS):
        part = partial(start, min(c, start + AMP_PASS))
        acc = r(part) if acc is None else r(acc + part)
    assert acc is not None
    return acc


def reduce_sum(x: np.ndarray, axis: int) -> np.ndarray:
    return r(np.sum(np.asarray(x, np.float64), axis=axis, keepdims=True))


def reduce_mean(x: np.ndarray, axis: int) -> np.ndarray:
    return r(np.mean(np.asarray(x, np.float64), axis=axis, keepdims=True))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, np.float64)
    shifted = r(x - x.max(axis=axis, keepdims=True))
    e = r(np.exp(shifted))
    inverse = r(1.0 / np.float32(e.sum(axis=axis, keepdims=True)))
    return r(e * inverse)


def norm(
    x: np.ndarray,
    axes: tuple[int, ...],
    eps: float,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    stable: bool = False,
) -> np.ndarray:
    """poplin's normStatistics, normWhiten and normalise over ``axes``."""
    x = np.asarray(x, np.float64)
    count = np.prod([x.shape[a] for a in axes])
    mean = r(x.sum(axis=axes, keepdims=True) / count)
    centred = r(x - mean)
    if stable:
        var = (centred * centred).sum(axis=axes, keepdims=True) / count
    else:
        var = (x * x).sum(axis=axes, keepdims=True) / count - mean * mean
    inv = r(1.0 / np.sqrt(var + eps))
    out = r(centred * inv)
    if gamma is not None:
        out = r(out * gamma)
    if beta is not None:
        out = r(out + beta)
    return out


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float16 ulps of ``want`` (both float16 values)."""
    want = np.asarray(want, np.float64)
    spacing = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    return np.abs(np.asarray(got, np.float64) - want) / spacing
