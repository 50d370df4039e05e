// paddle_ipu._core: the hot paths of paddle-ipu, compiled with pybind11.
#include <pybind11/pybind11.h>

#include "bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "paddle-ipu hot paths (fp16 conversion, zero-copy tensor views, serving queue and front ends, Adam update, float16 rounding)";
  m.attr("paddle_version") = PADDLE_IPU_PADDLE_VERSION;
  py::dict info;
  info["paddle_version"] = PADDLE_IPU_PADDLE_VERSION;
  info["build_type"] = PADDLE_IPU_BUILD_TYPE;
  info["boost"] = PADDLE_IPU_BOOST_VERSION;
  info["compiler"] = __VERSION__;
  info["cplusplus"] = static_cast<long>(__cplusplus);
  m.def("build_info", [info]() { return info; }, "How this core was built.");
  paddle_ipu::RegisterFp16(m);
  paddle_ipu::RegisterTensorView(m);
  paddle_ipu::RegisterQueue(m);
  paddle_ipu::RegisterOptim(m);
  paddle_ipu::RegisterRounding(m);
  paddle_ipu::serving::RegisterServing(m);
}
