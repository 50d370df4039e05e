// ipu_round_fp16: one Paddle operator that rounds a float32 tensor to float16 values as
// the IPU rounds them (csrc/core/rounding_impl.h: to nearest or stochastically,
// saturating at +-65504 or not), held in float32.
//
// The host's training program (paddle_ipu/backends/host/fp16_program.py) rounds every
// operator's result.  Spelt in Paddle's own operators a rounding took 5 of them (20 for
// stochastic rounding), and Paddle's executor takes a time that grows faster than the
// operator count to prepare a program (its in-place pass): a BERT-base training program
// of 1,214 operators became 5,498.  This operator is one per rounding.
//
// Inputs: X (float32), Seed (int64, one element: the micro-batch's random state, fed by
// the trainer each run).  Attributes: stochastic, saturate, stream (the rounding's own
// stream: its index in the program).  The random bits of element i are a hash of
// (Seed, stream, i), the same as paddle_ipu._core.round_fp16(x, seed=Seed, stream=stream).
// No gradient: it is put into a program whose backward pass is already built.
#include <cstdint>
#include <vector>

#include "../core/rounding_impl.h"
#include "paddle/extension.h"

namespace {

std::vector<paddle::Tensor> RoundFp16(const paddle::Tensor& x, const paddle::Tensor& seed,
                                      bool stochastic, bool saturate, int stream) {
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32, "ipu_round_fp16 takes float32 values");
  PD_CHECK(seed.dtype() == paddle::DataType::INT64 && seed.numel() >= 1,
           "ipu_round_fp16 takes an int64 seed");
  auto cx = x.is_cpu() ? x : x.copy_to(paddle::CPUPlace(), true);
  auto out = paddle::empty(cx.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t state = seed.is_cpu() ? seed.data<int64_t>()[0]
                                      : seed.copy_to(paddle::CPUPlace(), true).data<int64_t>()[0];
  paddle_ipu::rounding::RoundLoop(cx.data<float>(), out.data<float>(), cx.numel(), stochastic,
                                  saturate, static_cast<uint64_t>(state),
                                  static_cast<uint64_t>(stream));
  return {out};
}

std::vector<std::vector<int64_t>> RoundFp16Shape(const std::vector<int64_t>& x,
                                                 const std::vector<int64_t>& /*seed*/) {
  return {x};
}

std::vector<paddle::DataType> RoundFp16Dtype(const paddle::DataType& x,
                                             const paddle::DataType& /*seed*/) {
  return {x};
}

// Float16 partials (AMP passes): S holds, along its first axis, the float32 sums of the
// passes of a matmul's products; the partial starts as the first pass's sum rounded, and
// each next pass's sum is added to it and the result rounded (csrc/../numerics.py:
// the AMP accumulates AMP_PASS products at a time into a float16 partial).  Pass p's
// roundings use the random stream (stream, p).
std::vector<paddle::Tensor> AccumulateFp16(const paddle::Tensor& sums, const paddle::Tensor& seed,
                                           bool stochastic, bool saturate, int stream) {
  PD_CHECK(sums.dtype() == paddle::DataType::FLOAT32, "ipu_accumulate_fp16 takes float32 sums");
  PD_CHECK(sums.shape().size() >= 1 && sums.shape()[0] >= 1,
           "ipu_accumulate_fp16 takes the passes along a first axis");
  auto cs = sums.is_cpu() ? sums : sums.copy_to(paddle::CPUPlace(), true);
  const int64_t state = seed.is_cpu() ? seed.data<int64_t>()[0]
                                      : seed.copy_to(paddle::CPUPlace(), true).data<int64_t>()[0];
  const std::vector<int64_t> full = cs.shape();
  const std::vector<int64_t> shape(full.begin() + 1, full.end());
  auto out = paddle::empty(shape, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const int64_t passes = full[0];
  const int64_t n = passes ? cs.numel() / passes : 0;
  const float* in = cs.data<float>();
  float* acc = out.data<float>();
  std::vector<float> next(static_cast<size_t>(n));
  for (int64_t p = 0; p < passes; ++p) {
    const float* part = in + p * n;
    const float* src = part;
    if (p > 0) {
      for (int64_t i = 0; i < n; ++i) next[i] = acc[i] + part[i];
      src = next.data();
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(stream)) << 32) |
                         static_cast<uint64_t>(p);
    paddle_ipu::rounding::RoundLoop(src, acc, n, stochastic, saturate,
                                    static_cast<uint64_t>(state), key);
  }
  return {out};
}

std::vector<std::vector<int64_t>> AccumulateFp16Shape(const std::vector<int64_t>& sums,
                                                      const std::vector<int64_t>& /*seed*/) {
  return {std::vector<int64_t>(sums.begin() + 1, sums.end())};
}

}  // namespace

PD_BUILD_OP(ipu_accumulate_fp16)
    .Inputs({"Sums", "Seed"})
    .Outputs({"Out"})
    .Attrs({"stochastic: bool", "saturate: bool", "stream: int"})
    .SetKernelFn(PD_KERNEL(AccumulateFp16))
    .SetInferShapeFn(PD_INFER_SHAPE(AccumulateFp16Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RoundFp16Dtype));

PD_BUILD_OP(ipu_round_fp16)
    .Inputs({"X", "Seed"})
    .Outputs({"Out"})
    .Attrs({"stochastic: bool", "saturate: bool", "stream: int"})
    .SetKernelFn(PD_KERNEL(RoundFp16))
    .SetInferShapeFn(PD_INFER_SHAPE(RoundFp16Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RoundFp16Dtype));
