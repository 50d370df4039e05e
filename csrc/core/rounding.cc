// float32 -> float16 rounding as the IPU rounds: to nearest (ties to even) or
// stochastically, saturating or not at float16's largest finite value.
//
// The result is a float32 array holding float16 values: the host backend computes in
// float32 and keeps what the IPU would hold in float16 (paddle_ipu.backends.host.numerics).
//
// Stochastic rounding rounds |x| up to the next float16 value with probability
// (|x| - lo) / (hi - lo), where lo <= |x| < hi are the float16 values around it, and
// down otherwise: the mean of many roundings is x.  On float16's normal range this is
// done on the bits (add 13 random bits below float16's last mantissa bit, then drop
// them: a carry into the exponent is the step to the next binade), on its subnormal
// range (a uniform grid of 2^-24) with a floor.  The random bits of element i are a
// hash of (seed, stream, i) (SplitMix64's finaliser), so a rounding is reproducible
// for a seed and independent of how the work is split.
//
// Overflow: the IPU saturates a float16 result that overflows at +-65504 unless its
// NaN-on-overflow mode is on (Poplar's FloatingPointBehaviour.nanoo, which PopART
// turns on with enableFloatingPointChecks); `saturate` chooses.  Infinities and NaN
// in the input are kept.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "fp16.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace {

using F32Array = py::array_t<float, py::array::c_style>;

constexpr py::ssize_t kReleaseGilElements = 16384;
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kInfBits = 0x7f800000u;
// 2^-14: float16's smallest normal value, as float32 bits
constexpr uint32_t kHalfMinNormalBits = 0x38800000u;
// 65504: float16's largest finite value, as float32 bits
constexpr uint32_t kHalfMaxBits = 0x477fe000u;
// float32 mantissa bits below float16's last one
constexpr uint32_t kDroppedBits = 13;
constexpr uint32_t kDroppedMask = (1u << kDroppedBits) - 1u;

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline float Overflowed(uint32_t sign, bool saturate) {
  return FromBits(sign | (saturate ? kHalfMaxBits : kInfBits));
}

inline float RoundStochastic(float x, uint64_t random, bool saturate) {
  const uint32_t u = Bits(x);
  const uint32_t sign = u & kSignMask;
  const uint32_t m = u & kAbsMask;
  if (m >= kInfBits) return x;
  if (m >= kHalfMinNormalBits) {
    const uint32_t up = (m + (static_cast<uint32_t>(random) & kDroppedMask)) & ~kDroppedMask;
    if (up > kHalfMaxBits) return Overflowed(sign, saturate);
    return FromBits(sign | up);
  }
  // float16 subnormals: multiples of 2^-24
  const float q = FromBits(m) * 16777216.0f;  // exact: a power of two
  const float lo = std::floor(q);
  // 24 random bits as a uniform value in [0, 1)
  const float p = static_cast<float>(static_cast<uint32_t>(random >> 40)) * (1.0f / 16777216.0f);
  const float n = (p < q - lo) ? lo + 1.0f : lo;
  return FromBits(sign | Bits(n * (1.0f / 16777216.0f)));
}

// To nearest through the SIMD conversions of fp16.cc, a block at a time (a round trip
// through float16), then the overflows fixed: the same results as RoundNearest.
void RoundNearestBlocks(const float* src, float* dst, py::ssize_t n, bool saturate) {
  constexpr py::ssize_t kBlock = 4096;
  uint16_t half[kBlock];
  for (py::ssize_t start = 0; start < n; start += kBlock) {
    const py::ssize_t count = std::min(kBlock, n - start);
    fp16::FloatToHalf(src + start, half, static_cast<size_t>(count), 1);
    fp16::HalfToFloat(half, dst + start, static_cast<size_t>(count), 1);
    if (!saturate) continue;
    for (py::ssize_t i = start; i < start + count; ++i) {
      const uint32_t r = Bits(dst[i]);
      if ((r & kAbsMask) == kInfBits && (Bits(src[i]) & kAbsMask) < kInfBits) {
        dst[i] = Overflowed(r & kSignMask, true);
      }
    }
  }
}

void RoundLoop(const float* src, float* dst, py::ssize_t n, bool stochastic, bool saturate,
               uint64_t seed, uint64_t stream) {
  if (!stochastic) {
    RoundNearestBlocks(src, dst, n, saturate);
    return;
  }
  const uint64_t key = Mix(seed ^ Mix(stream));
  for (py::ssize_t i = 0; i < n; ++i) {
    dst[i] = RoundStochastic(src[i], Mix(key + static_cast<uint64_t>(i)), saturate);
  }
}

py::array RoundFp16(const py::array& src, bool stochastic, bool saturate, uint64_t seed,
                    uint64_t stream) {
  if (!py::isinstance<F32Array>(src) || !(src.flags() & py::array::c_style)) {
    throw py::type_error("round_fp16 takes a C-contiguous float32 array, got " +
                         std::string(py::str(src.dtype())));
  }
  std::vector<py::ssize_t> shape(src.shape(), src.shape() + src.ndim());
  F32Array out(shape);
  const auto* in = static_cast<const float*>(src.data());
  float* dst = out.mutable_data();
  const py::ssize_t n = src.size();
  if (n >= kReleaseGilElements) {
    py::gil_scoped_release release;
    RoundLoop(in, dst, n, stochastic, saturate, seed, stream);
  } else {
    RoundLoop(in, dst, n, stochastic, saturate, seed, stream);
  }
  return std::move(out);
}

}  // namespace

void RegisterRounding(py::module_& m) {
  m.def("round_fp16", &RoundFp16, py::arg("src"), py::arg("stochastic") = false,
        py::arg("saturate") = true, py::arg("seed") = 0, py::arg("stream") = 0,
        "float32 values rounded to float16 as the IPU rounds them, held in a new float32 "
        "array: to nearest (ties to even) or, with stochastic, up with probability "
        "(|x| - lo) / (hi - lo) between the float16 values lo <= |x| < hi; the random bits "
        "of element i are a hash of (seed, stream, i).  saturate: an overflow gives "
        "+-65504 (the IPU without NaN-on-overflow), else +-inf.");
}

}  // namespace paddle_ipu
