// The host backend's Adam update in one pass over the parameter.
//
// paddle_ipu.backends.host_optim evaluates Adam in float32 with numpy, one array
// operation at a time: about ten passes over memory per parameter.  This loop does
// the same operations on each element, in the same order, each rounded to float32
// (the file is built with -ffp-contract=off, so no multiply-add is fused): the
// results are bitwise those of the numpy formulas, which tests/test_core_optim.py
// checks against them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace py = pybind11;

namespace paddle_ipu {
namespace {

using F32Array = py::array_t<float, py::array::c_style>;

// Below this many elements the GIL is kept: releasing it costs more than the loop.
constexpr py::ssize_t kReleaseGilElements = 16384;

const float* Input(const py::array& a, const char* role, py::ssize_t size) {
  if (!py::isinstance<F32Array>(a) || !(a.flags() & py::array::c_style)) {
    throw py::type_error(std::string(role) + " must be a C-contiguous float32 array");
  }
  if (a.size() != size) {
    throw py::value_error(std::string(role) + " has " + std::to_string(a.size()) +
                          " elements; expected " + std::to_string(size) +
                          " (the weight's)");
  }
  return static_cast<const float*>(a.data());
}

inline void AdamElement(const float* w, const float* g, const float* m1, const float* m2,
                        float* w_out, float* m1_out, float* m2_out, py::ssize_t i, float b1,
                        float c1, float b2, float c2, float neg_lr_t, float eps_t) {
  const float gi = g[i];
  const float m1n = m1[i] * b1 + gi * c1;
  const float v = (gi * c2) * gi;
  const float m2n = m2[i] * b2 + v;
  const float d = std::sqrt(m2n) + eps_t;
  const float step = (m1n / d) * neg_lr_t;
  m1_out[i] = m1n;
  m2_out[i] = m2n;
  w_out[i] = w[i] + step;
}

// m1' = m1 * b1 + g * c1;  m2' = m2 * b2 + (g * c2) * g
// w'  = w + (m1' / (sqrt(m2') + eps_t)) * neg_lr_t
// (c1 = 1 - b1 and c2 = 1 - b2, as float32, computed by the caller.)
void AdamLoop(const float* w, const float* g, const float* m1, const float* m2, float* w_out,
              float* m1_out, float* m2_out, py::ssize_t n, float b1, float c1, float b2,
              float c2, float neg_lr_t, float eps_t) {
  py::ssize_t i = 0;
#if defined(__SSE2__)
  // The outputs are new arrays nobody reads during the loop: streaming stores write
  // them without first reading each cache line in (a third less memory traffic).  The
  // packed operations round each lane exactly as the scalar ones below.
  const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  for (; i < n && !(aligned(w_out + i) && aligned(m1_out + i) && aligned(m2_out + i)) && i < 4;
       ++i) {
    AdamElement(w, g, m1, m2, w_out, m1_out, m2_out, i, b1, c1, b2, c2, neg_lr_t, eps_t);
  }
  if (aligned(w_out + i) && aligned(m1_out + i) && aligned(m2_out + i)) {
    const __m128 vb1 = _mm_set1_ps(b1), vc1 = _mm_set1_ps(c1), vb2 = _mm_set1_ps(b2),
                 vc2 = _mm_set1_ps(c2), vlr = _mm_set1_ps(neg_lr_t), veps = _mm_set1_ps(eps_t);
    for (; i + 4 <= n; i += 4) {
      const __m128 gi = _mm_loadu_ps(g + i);
      const __m128 m1n =
          _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m1 + i), vb1), _mm_mul_ps(gi, vc1));
      const __m128 v = _mm_mul_ps(_mm_mul_ps(gi, vc2), gi);
      const __m128 m2n = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m2 + i), vb2), v);
      const __m128 d = _mm_add_ps(_mm_sqrt_ps(m2n), veps);
      const __m128 step = _mm_mul_ps(_mm_div_ps(m1n, d), vlr);
      _mm_stream_ps(m1_out + i, m1n);
      _mm_stream_ps(m2_out + i, m2n);
      _mm_stream_ps(w_out + i, _mm_add_ps(_mm_loadu_ps(w + i), step));
    }
    _mm_sfence();
  }
#endif
  for (; i < n; ++i) {
    AdamElement(w, g, m1, m2, w_out, m1_out, m2_out, i, b1, c1, b2, c2, neg_lr_t, eps_t);
  }
}


py::tuple AdamUpdate(const py::array& weight, const py::array& grad, const py::array& moment1,
                     const py::array& moment2, float b1, float c1, float b2, float c2,
                     float neg_lr_t, float eps_t) {
  const py::ssize_t n = weight.size();
  const float* w = Input(weight, "weight", n);
  const float* g = Input(grad, "grad", n);
  const float* m1 = Input(moment1, "moment1", n);
  const float* m2 = Input(moment2, "moment2", n);
  std::vector<py::ssize_t> shape(weight.shape(), weight.shape() + weight.ndim());
  F32Array w_out(shape), m1_out(shape), m2_out(shape);
  float* wo = w_out.mutable_data();
  float* m1o = m1_out.mutable_data();
  float* m2o = m2_out.mutable_data();
  if (n >= kReleaseGilElements) {
    py::gil_scoped_release release;
    AdamLoop(w, g, m1, m2, wo, m1o, m2o, n, b1, c1, b2, c2, neg_lr_t, eps_t);
  } else {
    AdamLoop(w, g, m1, m2, wo, m1o, m2o, n, b1, c1, b2, c2, neg_lr_t, eps_t);
  }
  return py::make_tuple(w_out, m1_out, m2_out);
}

}  // namespace

void RegisterOptim(py::module_& m) {
  m.def("adam_update", &AdamUpdate, py::arg("weight"), py::arg("grad"), py::arg("moment1"),
        py::arg("moment2"), py::arg("b1"), py::arg("c1"), py::arg("b2"), py::arg("c2"),
        py::arg("neg_lr_t"), py::arg("eps_t"),
        "One Adam step over float32 arrays of one shape: returns new (weight, moment1, "
        "moment2), bitwise equal to host_optim's numpy formulas.  The inputs are not "
        "written.");
}

}  // namespace paddle_ipu
