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

}  // namespace

PD_BUILD_OP(ipu_round_fp16)
    .Inputs({"X", "Seed"})
    .Outputs({"Out"})
    .Attrs({"stochastic: bool", "saturate: bool", "stream: int"})
    .SetKernelFn(PD_KERNEL(RoundFp16))
    .SetInferShapeFn(PD_INFER_SHAPE(RoundFp16Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RoundFp16Dtype));
