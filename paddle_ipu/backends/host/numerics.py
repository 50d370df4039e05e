"""The IPU's float16 arithmetic on the host: what is rounded, how, and with which seed.

With ``enable_fp16`` the IPU computes every operator on float16 tensors: each result
is rounded to float16 (to nearest, ties to even; or stochastically with
``enable_stochastic_rounding``), and a result beyond float16's range saturates at
+-65504 (Poplar's ``FloatingPointBehaviour``: NaN-on-overflow is off unless
PopART's ``enableFloatingPointChecks`` turns it on, and then the overflow traps).
Inside an operator the IPU keeps some intermediate values in float32 (Poplar's
documented defaults, read from the poplibs headers and sources):

- matmul and convolution partials in float32 (poplin's ``partialsType`` default);
  with ``partials_type_matmuls="half"`` (matmuls) or ``convolution_options
  {"partialsType": "half"}`` (both set by ``enable_half_partial``) the partials are
  float16: the accumulating matrix product unit (AMP) sums :data:`AMP_PASS` products
  of float16 values at a time, and each pass's sum is added to the float16 partial,
  rounded (PopART's partials test: "if the number of accumulations is less than or
  equal to the number of input channels supported by AMP the planner can ignore the
  partial type");
- reductions of float16 values that "benefit from higher precision (for example,
  add)" accumulate in float32 (popops ``reduce``);
- softmax (popnn's stable softmax): the maximum, ``x - max`` rounded, ``exp``
  rounded, the sum in float32, its reciprocal in float32 cast to float16, the
  product rounded;
- normalisations (poplin ``normStatistics`` / ``normWhiten`` / ``normalise``): the
  mean in float16 from a float32 sum, the mean of squares in float32, the inverse
  standard deviation in float16; then ``x - mean``, ``* invStdDev``, ``* gamma``,
  ``+ beta``, each rounded.

The host computes each operator in float32 (from float16 values) and rounds its
result as above; :mod:`.fp16_graph` does it to the ONNX graph ONNX Runtime runs (for
inference), :mod:`.fp16_program` to the Paddle gradient program (training), and the
trainer to the weight update.  docs/without_ipu.md says what this reproduces and
what it cannot.

Seeds (PopART's ``RngStateLowering``): stochastic rounding in the forward and
backward passes uses a random state seeded with ``seed + replica index`` (different
per replica); the weight update uses the replica-identical state seeded with
``seed``, so replicas keep identical weights.  :func:`stream_seed` derives the
host's seeds the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from paddle_ipu import _core
from paddle_ipu.backends.base import SessionConfig

#: float16's largest finite value: where an overflowing result saturates
FP16_MAX = 65504.0
#: float16's smallest positive (subnormal) value, its spacing below 2^-14
FP16_TINY = 2.0**-24
#: products of float16 values the AMP accumulates in one pass before its partial is
#: rounded to the partials type (the AMP's input channels for float16 on GC200)
AMP_PASS = 16

F32 = np.float32


@dataclass(frozen=True)
class Fp16Arithmetic:
    """How the host computes an fp16 graph (:func:`from_config`).

    Attributes:
        rounded: every operator's result is rounded to float16 (the IPU's
            arithmetic); False: float16 weights and constants, float32 arithmetic
            (``host_fp16_arithmetic="float32"``).
        stochastic: stochastic rounding (``enable_stochastic_rounding``).
        saturate: an overflow saturates at +-65504; False with floating-point
            checks, where it is an infinity that the check reports.
        half_partials_matmul: matmul partials in float16.
        half_partials_conv: convolution partials in float16.
        seed: the session's random seed (None: a new one per session, as PopART
            seeds from the clock).
        replica_offset: the index of this process's first replica.
        lazy_saturation: how a graph honours ``saturate`` when it rounds to
            nearest: False clips every rounded result at +-65504; True clips only
            the operands of the operators that could turn an infinity into a finite
            value that differs from what 65504 gives (:data:`.fp16_graph.ABSORBING`),
            so that a run whose outputs are all finite has the saturating graph's
            outputs, and the session runs a micro-batch whose outputs are not on the
            clipping graph (fewer operators on the common path).
    """

    rounded: bool = True
    stochastic: bool = False
    saturate: bool = True
    half_partials_matmul: bool = False
    half_partials_conv: bool = False
    seed: int | None = None
    replica_offset: int = 0
    lazy_saturation: bool = False

    def seed_or_random(self) -> int:
        return self.seed if self.seed is not None else int.from_bytes(os.urandom(8), "little")


def from_config(config: SessionConfig) -> Fp16Arithmetic | None:
    """The fp16 arithmetic ``config`` asks for; None without ``enable_fp16``."""
    if not config.enable_fp16:
        return None
    conv = config.option("convolution_options") or {}
    partials_conv = str(conv.get("partialsType", "")).lower()
    offset = 0
    if config.option("enable_distribution"):
        offset = int(config.option("global_replica_offset"))
    return Fp16Arithmetic(
        rounded=config.option("host_fp16_arithmetic") == "float16",
        stochastic=bool(config.option("enable_stochastic_rounding")),
        saturate=not bool(config.option("enable_floating_point_checks")),
        half_partials_matmul=str(config.option("partials_type_matmuls")).lower() == "half",
        half_partials_conv=partials_conv == "half",
        seed=config.random_seed,
        replica_offset=offset,
    )


def _mix(x: int) -> int:
    """SplitMix64's finaliser (the core's, csrc/core/rounding.cc)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def stream_seed(seed: int, *keys: int) -> int:
    """A 64-bit seed for one stream of random bits: ``seed`` mixed with ``keys`` (a
    pass, a step, a micro-batch, a tensor ...), each in turn."""
    out = _mix(int(seed) & 0xFFFFFFFFFFFFFFFF)
    for key in keys:
        out = _mix(out ^ (int(key) & 0xFFFFFFFFFFFFFFFF))
    return out


#: stream keys: what a stream of random bits is for
FORWARD_BACKWARD = 1
WEIGHT_UPDATE = 2
ACCUMULATION = 3
OPTIMIZER_STATE = 4


def round_fp16(
    value: np.ndarray,
    *,
    stochastic: bool = False,
    saturate: bool = True,
    seed: int = 0,
    stream: int = 0,
) -> np.ndarray:
    """``value`` rounded to float16 as the IPU rounds it, held in a new float32
    array: to nearest even, or stochastically (reproducible for ``seed`` and
    ``stream``); an overflow saturates at +-65504 unless ``saturate`` is False."""
    array = np.ascontiguousarray(value, dtype=F32)
    result: np.ndarray = _core.round_fp16(
        array,
        stochastic=stochastic,
        saturate=saturate,
        seed=int(seed) & 0xFFFFFFFFFFFFFFFF,
        stream=int(stream) & 0xFFFFFFFFFFFFFFFF,
    )
    return result
