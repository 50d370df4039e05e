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

#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "rounding_impl.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace {

using F32Array = py::array_t<float, py::array::c_style>;
using rounding::RoundLoop;

constexpr py::ssize_t kReleaseGilElements = 16384;

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
