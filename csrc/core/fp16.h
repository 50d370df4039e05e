// fp32 <-> fp16 conversion over contiguous host buffers.
//
// Results are bit-identical to numpy's astype (round to nearest even, signed
// zeros, subnormals, overflow to inf, NaN payloads kept as numpy keeps them),
// whichever instruction set runs: the SIMD kernels hand the rare blocks where
// the hardware differs from numpy (signalling NaNs) to the scalar code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace paddle_ipu {
namespace fp16 {

enum class Isa { kScalar = 0, kF16c = 1, kAvx512 = 2 };

const char* IsaName(Isa isa);
bool ParseIsa(const char* name, Isa* isa);
bool IsaSupported(Isa isa);
// The best kernel this CPU runs, chosen once at load time.
Isa BestIsa();
Isa ActiveIsa();
// Tests and benchmarks pin a kernel; returns false if the CPU lacks it.
bool SetIsa(Isa isa);

// Thread count used when the caller passes threads <= 0.
int AutoThreads(size_t bytes_touched);
int MaxThreads();

// src and dst must not overlap.
void FloatToHalf(const void* src, void* dst, size_t n, int threads);
void HalfToFloat(const void* src, void* dst, size_t n, int threads);

// buf holds n floats; afterwards its first 2n bytes hold the n halves.
void FloatToHalfInPlace(void* buf, size_t n, int threads);
// buf has room for n floats and its first 2n bytes hold n halves;
// afterwards it holds the n floats.
void HalfToFloatInPlace(void* buf, size_t n, int threads);

uint16_t FloatBitsToHalfBits(uint32_t f);
uint32_t HalfBitsToFloatBits(uint16_t h);

}  // namespace fp16
}  // namespace paddle_ipu
