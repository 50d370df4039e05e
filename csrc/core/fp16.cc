#include "fp16.h"

// The vector kernels are x86 only; other architectures (aarch64, ...) build the
// scalar path alone, chosen at compile time, as does -DPADDLE_IPU_FP16_SCALAR (the
// serving decoders' fuzz harnesses, csrc/fuzz, which convert one element at a time).
#if (defined(__x86_64__) || defined(__i386__)) && !defined(PADDLE_IPU_FP16_SCALAR)
#define PADDLE_IPU_X86 1
#include <immintrin.h>
#else
#define PADDLE_IPU_X86 0
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

namespace paddle_ipu {
namespace fp16 {
namespace {

#if PADDLE_IPU_X86
// Explicit rounding so a caller's MXCSR rounding mode cannot change results.
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif

// Bytes (read + written) each thread should have before a second one starts.
// The kernels run at memory bandwidth, which the cores share: on the 2-core
// machine bench/fp16.py was tuned on, a second thread lost up to 32 MiB of
// float32 input (thread start ~30 us, and little extra bandwidth) and won ~15%
// at 64 MiB. Callers that know better pass `threads`.
constexpr size_t kMinBytesPerThread = size_t{48} << 20;

// Chunk boundaries for threads are multiples of this many elements, so that
// neither the float side (256 B) nor the half side (128 B) shares a cache line
// between two threads.
constexpr size_t kChunkAlign = 64;

// memcpy keeps the scalar code free of type-punned accesses: the in-place
// conversions read floats and write halves over the same bytes.
inline uint32_t LoadU32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint16_t LoadU16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void StoreU32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }
inline void StoreU16(unsigned char* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

// Scalar kernels walk forward one element at a time, reading element i before
// writing it, which the staged in-place schedules below rely on.
void FloatToHalfScalar(const void* src, void* dst, size_t n) {
  auto s = static_cast<const unsigned char*>(src);
  auto d = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) StoreU16(d + 2 * i, FloatBitsToHalfBits(LoadU32(s + 4 * i)));
}

void HalfToFloatScalar(const void* src, void* dst, size_t n) {
  auto s = static_cast<const unsigned char*>(src);
  auto d = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) StoreU32(d + 4 * i, HalfBitsToFloatBits(LoadU16(s + 2 * i)));
}

#if PADDLE_IPU_X86
// vcvtps2ph sets the quiet bit of a signalling NaN where numpy keeps the
// payload as is; the rare block holding one goes through the scalar code.
__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const void* src, void* dst, size_t n) {
  auto s = static_cast<const float*>(src);
  auto d = static_cast<unsigned char*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(s + i);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0)) {
      FloatToHalfScalar(s + i, d + 2 * i, 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), _mm256_cvtps_ph(v, kRound));
  }
  FloatToHalfScalar(s + i, d + 2 * i, n - i);
}

__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const void* src, void* dst, size_t n) {
  auto s = static_cast<const unsigned char*>(src);
  auto d = static_cast<float*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    __m256 v = _mm256_cvtph_ps(h);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0)) {
      HalfToFloatScalar(s + 2 * i, d + i, 8);
      continue;
    }
    _mm256_storeu_ps(d + i, v);
  }
  HalfToFloatScalar(s + 2 * i, d + i, n - i);
}

__attribute__((target("avx512f"))) void FloatToHalfAvx512(const void* src, void* dst, size_t n) {
  auto s = static_cast<const float*>(src);
  auto d = static_cast<unsigned char*>(dst);
  const __m512i quiet_bit = _mm512_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(s + i);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0)) {
      // Quiet NaNs convert exactly as numpy does; only signalling ones differ.
      __mmask16 quiet = _mm512_mask_test_epi32_mask(nan, _mm512_castps_si512(v), quiet_bit);
      if (quiet != nan) {
        FloatToHalfScalar(s + i, d + 2 * i, 16);
        continue;
      }
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 2 * i), _mm512_cvtps_ph(v, kRound));
  }
  FloatToHalfScalar(s + i, d + 2 * i, n - i);
}

__attribute__((target("avx512f"))) void HalfToFloatAvx512(const void* src, void* dst, size_t n) {
  auto s = static_cast<const unsigned char*>(src);
  auto d = static_cast<float*>(dst);
  const __m512i quiet_bit = _mm512_set1_epi32(0x00400000);
  const __m512i half_quiet_bit = _mm512_set1_epi32(0x0200);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i));
    __m512 v = _mm512_cvtph_ps(h);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (__builtin_expect(nan != 0, 0)) {
      // Clear the quiet bit the hardware set on signalling NaNs, as numpy keeps it clear.
      __mmask16 signalling =
          _mm512_mask_testn_epi32_mask(nan, _mm512_cvtepu16_epi32(h), half_quiet_bit);
      __m512i bits = _mm512_castps_si512(v);
      bits = _mm512_mask_andnot_epi32(bits, signalling, quiet_bit, bits);
      v = _mm512_castsi512_ps(bits);
    }
    _mm512_storeu_ps(d + i, v);
  }
  HalfToFloatScalar(s + 2 * i, d + i, n - i);
}

#endif  // PADDLE_IPU_X86

using Kernel = void (*)(const void*, void*, size_t);

struct KernelPair {
  Kernel to_half;
  Kernel to_float;
};

KernelPair KernelsFor(Isa isa) {
#if PADDLE_IPU_X86
  switch (isa) {
    case Isa::kAvx512:
      return {FloatToHalfAvx512, HalfToFloatAvx512};
    case Isa::kF16c:
      return {FloatToHalfF16c, HalfToFloatF16c};
    case Isa::kScalar:
      break;
  }
#else
  (void)isa;
#endif
  return {FloatToHalfScalar, HalfToFloatScalar};
}

Isa DetectBestIsa() {
#if PADDLE_IPU_X86
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers.
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")) return Isa::kF16c;
#endif
  return Isa::kScalar;
}

const Isa g_best = DetectBestIsa();
std::atomic<int> g_active{static_cast<int>(g_best)};

KernelPair ActiveKernels() { return KernelsFor(static_cast<Isa>(g_active.load(std::memory_order_relaxed))); }

// Runs kernel over [0, n) split into up to `threads` chunks; the calling thread
// takes the last chunk. Falls back to fewer threads if the OS refuses one.
void ParallelConvert(Kernel kernel, const unsigned char* src, size_t src_size, unsigned char* dst,
                     size_t dst_size, size_t n, int threads) {
  if (threads <= 0) threads = AutoThreads(n * (src_size + dst_size));
  size_t max_useful = (n + kChunkAlign - 1) / kChunkAlign;
  size_t t = std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(max_useful, 1));
  if (t <= 1) {
    kernel(src, dst, n);
    return;
  }
  size_t per = (n + t - 1) / t;
  per = (per + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  std::vector<std::thread> workers;
  workers.reserve(t - 1);
  size_t begin = 0;
  while (begin + per < n) {
    size_t end = begin + per;
    try {
      workers.emplace_back(kernel, src + begin * src_size, dst + begin * dst_size, end - begin);
    } catch (const std::system_error&) {
      kernel(src + begin * src_size, dst + begin * dst_size, end - begin);
    }
    begin = end;
  }
  kernel(src + begin * src_size, dst + begin * dst_size, n - begin);
  for (auto& w : workers) w.join();
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kF16c:
      return "f16c";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

bool ParseIsa(const char* name, Isa* isa) {
  for (Isa candidate : {Isa::kScalar, Isa::kF16c, Isa::kAvx512}) {
    if (std::strcmp(name, IsaName(candidate)) == 0) {
      *isa = candidate;
      return true;
    }
  }
  return false;
}

bool IsaSupported(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(g_best); }
Isa BestIsa() { return g_best; }
Isa ActiveIsa() { return static_cast<Isa>(g_active.load()); }

bool SetIsa(Isa isa) {
  if (!IsaSupported(isa)) return false;
  g_active.store(static_cast<int>(isa));
  return true;
}

int MaxThreads() {
  // hardware_concurrency() reads /sys on every call (several microseconds).
  static const int count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return count;
}

int AutoThreads(size_t bytes_touched) {
  size_t by_size = bytes_touched / kMinBytesPerThread;
  return static_cast<int>(std::clamp<size_t>(by_size, 1, static_cast<size_t>(MaxThreads())));
}

void FloatToHalf(const void* src, void* dst, size_t n, int threads) {
  ParallelConvert(ActiveKernels().to_half, static_cast<const unsigned char*>(src), 4,
                  static_cast<unsigned char*>(dst), 2, n, threads);
}

void HalfToFloat(const void* src, void* dst, size_t n, int threads) {
  ParallelConvert(ActiveKernels().to_float, static_cast<const unsigned char*>(src), 2,
                  static_cast<unsigned char*>(dst), 4, n, threads);
}

// In place, element i reads bytes [4i, 4i+4) and writes [2i, 2i+2). The range
// [a, 2a) reads [4a, 8a) and writes [2a, 4a): disjoint from its own input, and
// the bytes it overwrites belong to elements below a, already converted. So the
// buffer is converted in doubling stages, each an ordinary (threaded) call.
void FloatToHalfInPlace(void* buf, size_t n, int threads) {
  if (n == 0) return;
  auto p = static_cast<unsigned char*>(buf);
  if (threads <= 0) threads = AutoThreads(n * 6);
  Kernel kernel = ActiveKernels().to_half;
  kernel(p, p, 1);
  for (size_t a = 1; a < n; a *= 2) {
    size_t end = std::min(2 * a, n);
    ParallelConvert(kernel, p + 4 * a, 4, p + 2 * a, 2, end - a, threads);
  }
}

// The mirror image: element i reads [2i, 2i+2) and writes [4i, 4i+4). With
// m = ceil(k/2), the range [m, k) reads [2m, 2k) and writes [4m, 4k): disjoint,
// and it overwrites only inputs of elements at or above m, already converted.
void HalfToFloatInPlace(void* buf, size_t n, int threads) {
  if (n == 0) return;
  auto p = static_cast<unsigned char*>(buf);
  if (threads <= 0) threads = AutoThreads(n * 6);
  Kernel kernel = ActiveKernels().to_float;
  for (size_t k = n; k > 1;) {
    size_t m = (k + 1) / 2;
    ParallelConvert(kernel, p + 2 * m, 2, p + 4 * m, 4, k - m, threads);
    k = m;
  }
  kernel(p, p, 1);
}

uint16_t FloatBitsToHalfBits(uint32_t f) {
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t mag = f & 0x7fffffffu;
  if (mag >= 0x7f800000u) {
    if (mag == 0x7f800000u) return sign | 0x7c00u;
    // numpy truncates the NaN payload and keeps it a NaN if that leaves zero.
    uint16_t payload = static_cast<uint16_t>((mag >> 13) & 0x3ffu);
    return sign | 0x7c00u | (payload != 0 ? payload : 1u);
  }
  // 65520 is halfway between the largest half (65504) and 2^16; the tie goes
  // to the even neighbour, which overflows to inf.
  if (mag >= 0x477ff000u) return sign | 0x7c00u;
  if (mag >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15) and round the 13 dropped bits.
    uint32_t r = mag - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  const uint32_t exp = mag >> 23;
  // Below 2^-25 everything rounds to zero (2^-25 itself ties to the even zero).
  if (exp < 102) return sign;
  // Subnormal half: the result counts units of 2^-24.
  const uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

uint32_t HalfBitsToFloatBits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return sign | 0x7f800000u | (mant << 13);
  if (exp != 0) return sign | ((exp + 112) << 23) | (mant << 13);
  if (mant == 0) return sign;
  // Subnormal half mant * 2^-24 is a normal float: its top bit becomes the implicit one.
  const int top = 31 - __builtin_clz(mant);
  return sign | (static_cast<uint32_t>(top + 103) << 23) | ((mant << (23 - top)) & 0x7fffffu);
}

}  // namespace fp16
}  // namespace paddle_ipu
