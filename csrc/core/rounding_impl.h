// The IPU's float32 -> float16 rounding loops (see rounding.cc for what they do),
// header-only: the compiled core (rounding.cc) and the ipu_round_fp16 operator of the
// host's training program (csrc/ops/round_op.cc) run the same code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fp16.h"

namespace paddle_ipu {
namespace rounding {

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
inline void RoundNearestBlocks(const float* src, float* dst, std::ptrdiff_t n, bool saturate) {
  constexpr std::ptrdiff_t kBlock = 4096;
  uint16_t half[kBlock];
  for (std::ptrdiff_t start = 0; start < n; start += kBlock) {
    const std::ptrdiff_t count = std::min(kBlock, n - start);
    fp16::FloatToHalf(src + start, half, static_cast<size_t>(count), 1);
    fp16::HalfToFloat(half, dst + start, static_cast<size_t>(count), 1);
    if (!saturate) continue;
    for (std::ptrdiff_t i = start; i < start + count; ++i) {
      const uint32_t r = Bits(dst[i]);
      if ((r & kAbsMask) == kInfBits && (Bits(src[i]) & kAbsMask) < kInfBits) {
        dst[i] = Overflowed(r & kSignMask, true);
      }
    }
  }
}

inline void RoundLoop(const float* src, float* dst, std::ptrdiff_t n, bool stochastic, bool saturate,
               uint64_t seed, uint64_t stream) {
  if (!stochastic) {
    RoundNearestBlocks(src, dst, n, saturate);
    return;
  }
  const uint64_t key = Mix(seed ^ Mix(stream));
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    dst[i] = RoundStochastic(src[i], Mix(key + static_cast<uint64_t>(i)), saturate);
  }
}

}  // namespace rounding
}  // namespace paddle_ipu
