// Registration hooks: each .cc in csrc/core adds its functions to paddle_ipu._core.
#pragma once

#include <pybind11/pybind11.h>

namespace paddle_ipu {

void RegisterFp16(pybind11::module_& m);
void RegisterTensorView(pybind11::module_& m);
void RegisterQueue(pybind11::module_& m);
void RegisterOptim(pybind11::module_& m);
void RegisterRounding(pybind11::module_& m);
namespace serving {
void RegisterServing(pybind11::module_& m);
}

}  // namespace paddle_ipu
